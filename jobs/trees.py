"""Model outputs as trees: the one walk that the correctness gate, the request shaper and the wire
codec share, so that they agree on what a leaf is and name it by the same path.

A node is a container when it is one of:
- a mapping: dicts, OrderedDicts and Hugging Face `ModelOutput` (its keys are the fields that
  are not None);
- a dataclass, a named tuple, a list or a tuple;
- a type registered with `torch.utils._pytree` (a user's own output class);
- a Hugging Face cache (`DynamicCache`, `StaticCache`, `EncoderDecoderCache`, ...), which the
  library does not register: its layers' key and value tensors, in layer order.

Anything else is a leaf: a tensor, a number, None, a string. Paths read as Python does:
`output.logits`, `output[0]`, `output.past_key_values.layers[3].keys`.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.utils._pytree as pytree

Key = Any  # a field or mapping key (str, or any hashable a dict may use), or a position (int)


@dataclass(frozen=True)
class Node:
    """A container's children in order, and how to rebuild one of its own type from new ones."""

    items: list[tuple[Key, Any]]
    rebuild: Callable[[list[Any]], Any]
    keyed: bool  # children named by keys (a JSON object), not by position (a JSON array)


def children(node: Any) -> Optional[Node]:
    """`node` as a container, or None for a leaf."""
    if isinstance(node, Mapping):
        return Node([(key, node[key]) for key in node], functools.partial(_rebuild_mapping, node), keyed=True)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        fields = dataclasses.fields(node)
        return Node([(f.name, getattr(node, f.name)) for f in fields], lambda new: _replace(node, fields, new), True)
    if isinstance(node, tuple) and hasattr(node, "_fields"):  # named tuples
        return Node([(name, getattr(node, name)) for name in node._fields], lambda new: type(node)(*new), True)
    if isinstance(node, (list, tuple)):
        return Node(list(enumerate(node)), lambda new: type(node)(new), keyed=False)
    if type(node) in pytree.SUPPORTED_NODES:
        node_def = pytree.SUPPORTED_NODES[type(node)]
        values, context = node_def.flatten_fn(node)
        return Node(list(enumerate(values)), lambda new: node_def.unflatten_fn(new, context), keyed=False)
    attributes = _cache_attributes(node)
    if attributes is not None:
        return Node(
            [(name, _as_list(getattr(node, name))) for name in attributes],
            lambda new: _with_attributes(node, attributes, new),
            keyed=True,
        )
    return None


def path_of(parent: str, key: Key) -> str:
    return f"{parent}.{key}" if isinstance(key, str) and key.isidentifier() else f"{parent}[{key!r}]"


def leaves(node: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of every leaf, in the containers' own order."""
    split = children(node)
    if split is None:
        yield path, node
        return
    for key, child in split.items:
        yield from leaves(child, path_of(path, key))


def map_leaves(node: Any, leaf_fn: Callable[[str, Any], Any], path: str = "output") -> Any:
    """`node` rebuilt with every leaf replaced by leaf_fn(path, leaf), each container of its own type."""
    split = children(node)
    if split is None:
        return leaf_fn(path, node)
    return split.rebuild([map_leaves(child, leaf_fn, path_of(path, key)) for key, child in split.items])


def rebuilder(node: Any) -> Callable[[Iterator[Any]], Any]:
    """A function that rebuilds `node`'s shape from new leaves, taken in `leaves` order from an
    iterator: the walk done once, for a caller that rebuilds one structure on every call."""
    split = children(node)
    if split is None:
        return next
    parts = [rebuilder(child) for _, child in split.items]
    rebuild = split.rebuild
    return lambda new: rebuild([part(new) for part in parts])


@dataclass(frozen=True)
class Cut:
    """A padded call's outputs cut back to a request: `leaf(path, leaf)` is a leaf's real part (a
    view of a tensor, any other leaf as it is). `key` is the same for the same cut, so that the
    outputs a captured graph returns at every replay are cut once per request size
    (copies.StaticCopy.cut)."""

    key: Hashable
    leaf: Callable[[str, Any], Any]

    def __call__(self, outputs: Any) -> Any:
        return map_leaves(outputs, self.leaf)


def type_name(node: Any) -> str:
    return type(node).__qualname__


# -- Hugging Face caches ------------------------------------------------------------------------
# transformers is never imported here: a cache is recognised by its base classes' names and
# module, so a process without transformers pays nothing and any version is read as it is laid out.

_CACHE_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("self_attention_cache", "cross_attention_cache"),  # EncoderDecoderCache: two caches
    ("layers",),  # transformers >= 4.56: one layer object per decoder layer
    ("key_cache", "value_cache"),  # earlier releases: a list of tensors each
)
_LAYER_TENSORS = ("keys", "values")


def _cache_attributes(node: Any) -> Optional[tuple[str, ...]]:
    bases = {(base.__module__.split(".")[0], base.__name__) for base in type(node).__mro__}
    if ("transformers", "Cache") in bases:
        for layout in _CACHE_LAYOUTS:
            if all(hasattr(node, name) for name in layout):
                return layout
    if ("transformers", "CacheLayerMixin") in bases and all(hasattr(node, name) for name in _LAYER_TENSORS):
        return _LAYER_TENSORS
    return None


def _as_list(value: Any) -> Any:
    """A cache's list of layers as a list the walk rebuilds (some releases keep a tuple)."""
    return list(value) if isinstance(value, tuple) else value


def _with_attributes(node: Any, names: tuple[str, ...], values: list[Any]) -> Any:
    """A shallow copy of `node` with new values of these attributes: the copy answers the
    library's own methods (`get_seq_length`, `to_legacy_cache`) as the original does."""
    rebuilt = _shallow_copy(node)
    for name, value in zip(names, values, strict=True):
        setattr(rebuilt, name, value)
    return rebuilt


def _shallow_copy(node: Any) -> Any:
    """copy.copy(node), without its generic protocol where the type leaves copying to `object`:
    a new instance given the same attribute dict, which is what copy.copy then does. A cache of
    a decoder is one object per layer, rebuilt at every call that copies it out; copy.copy's
    reduce protocol costs several times the copy itself."""
    kind: Any = type(node)
    plain = _PLAIN_COPY.get(kind)
    if plain is None:
        plain = _PLAIN_COPY[kind] = _copies_plainly(kind)
    return _with_same_attributes(node) if plain else copy.copy(node)


def _with_same_attributes(node: Any) -> Any:
    """A new instance of `node`'s type, not initialised, holding `node`'s attribute dict."""
    kind: Any = type(node)
    rebuilt = kind.__new__(kind)
    rebuilt.__dict__.update(node.__dict__)
    return rebuilt


_PLAIN_COPY: dict[type, bool] = {}  # by type: copy.copy would take object's default path


def _copies_plainly(kind: type) -> bool:
    """Whether copy.copy copies an instance of `kind` as object's reduce protocol does, by its
    attribute dict alone: no copy hook, reduce or state methods of its own, no named slots."""
    if kind.__module__ == "builtins" or hasattr(kind, "__copy__"):  # builtins: copy.copy's own table
        return False
    if kind.__reduce_ex__ is not object.__reduce_ex__ or kind.__reduce__ is not object.__reduce__:
        return False
    default_state = getattr(object, "__getstate__", None)  # Python 3.11 on
    if hasattr(kind, "__setstate__") or getattr(kind, "__getstate__", default_state) is not default_state:
        return False
    if any(getattr(base, "__slots__", ()) for base in kind.__mro__ if base is not object):
        return False
    return any("__dict__" in vars(base) for base in kind.__mro__)


def _rebuild_mapping(node: Mapping[Any, Any], values: list[Any]) -> Any:
    """A mapping of `node`'s type and keys with new values: through its own constructor, a
    dataclass's (HF ModelOutput: its keys are its fields that are not None) by keyword, except a
    ModelOutput whose items set its fields (_model_output)."""
    kind: Any = type(node)
    pairs = zip(list(node), values, strict=True)
    if dataclasses.is_dataclass(node):
        if _FAST_OUTPUT.get(kind) is None:
            _FAST_OUTPUT[kind] = _fast_output_agrees(node)
        if _FAST_OUTPUT[kind] and not any(value is None for value in values):  # None: the key leaves the output
            return _model_output(node, pairs)
        return kind(**dict(pairs))
    if isinstance(node, collections.defaultdict):
        return kind(node.default_factory, pairs)
    return kind(pairs)


# by type: a Hugging Face ModelOutput whose item assignment sets the field too, checked once
_FAST_OUTPUT: dict[type, bool] = {}


def _model_output(node: Any, pairs: Iterator[tuple[Any, Any]]) -> Any:
    """A ModelOutput like `node` with new values, without its constructor: its __post_init__
    checks and orders the fields again at every call (several times the rest of a rebuild). The
    fields left None stay None; each key's item and attribute take the new value, as the
    library's own item assignment keeps them."""
    rebuilt = _with_same_attributes(node)
    for key, value in pairs:
        rebuilt[key] = value
    return rebuilt


def _fast_output_agrees(node: Any) -> bool:
    """Whether _model_output builds what the constructor builds for this type: a Hugging Face
    ModelOutput (recognised by name, transformers not imported), rebuilt both ways from its own
    values and compared item by item and field by field."""
    if ("transformers", "ModelOutput") not in {(b.__module__.split(".")[0], b.__name__) for b in type(node).__mro__}:
        return False
    # new objects of the same values: a field the item assignment left behind keeps the old one
    values = [value.detach() if isinstance(value, torch.Tensor) else copy.copy(value) for value in node.values()]
    try:
        fast = _model_output(node, zip(list(node), values, strict=True))
        built = type(node)(**dict(zip(list(node), values, strict=True)))
    except Exception:
        return False
    fields = [f.name for f in dataclasses.fields(node)]
    return [(k, id(v)) for k, v in fast.items()] == [(k, id(v)) for k, v in built.items()] and all(
        getattr(fast, name) is getattr(built, name) for name in fields
    )


def _replace(node: Any, fields: tuple[dataclasses.Field[Any], ...], new: list[Any]) -> Any:
    """A dataclass like `node` with new field values: built through its constructor (so its
    __post_init__ runs), then its init=False fields set, as a frozen dataclass's own code would."""
    values = dict(zip((f.name for f in fields), new, strict=True))
    rebuilt = dataclasses.replace(node, **{f.name: values[f.name] for f in fields if f.init})
    for f in fields:
        if not f.init:
            object.__setattr__(rebuilt, f.name, values[f.name])
    return rebuilt
