"""Outputs a caller may keep, copied out of the CUDA-graph buffers the next replay overwrites.

A copy per output tensor is a kernel launch per tensor and, for a tree of outputs (a Hugging Face
output with its cache: dozens of tensors), a walk of the tree per call. Here the tensors of one
dtype and device are copied together: one new tensor, cut into views of the originals' shapes and
strides (a compiled decoder's cache comes as transposed views, its logits with rows padded for
alignment, which the copies keep), filled by one `torch._foreach_copy_` (a tensor with a few gaps
copied as its whole range of memory), so a tree of any size costs about a launch per dtype. A variant
captured in a graph of the tool's own returns the same output objects at every replay, so what to
copy and how to rebuild the tree are worked out once (StaticCopy), and so are a padded request's
views of them, once per request size (StaticCopy.cut).

Copies of one call share one storage per dtype: a caller that keeps one output keeps that call's
other outputs of its dtype alive with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from orchestrator.jobs import trees

Copier = Callable[[Any], Any]


def copy_out(outputs: Any) -> Any:
    """`outputs` with every tensor copied: what a caller may keep while the next replay overwrites
    the buffers (CUDA graphs) the outputs were read from."""
    if type(outputs) is torch.Tensor:  # the usual single output, without walking a tree
        return outputs.clone()
    found = [leaf for _, leaf in trees.leaves(outputs)]
    copied = iter(_Plan(found).copies(found))
    return trees.map_leaves(outputs, lambda _, leaf: next(copied))


def cut_out(outputs: Any, cut: trees.Cut, copy: Optional[Copier], copies: bool) -> Any:
    """`outputs` of a padded call cut back by `cut`, then copied by `copy` where the caller keeps
    them (`copies`): a captured graph's outputs through the views its StaticCopy keeps."""
    if isinstance(copy, StaticCopy) and outputs is copy.outputs:
        return copy.cut(cut, copies)
    outputs = cut(outputs)
    return copy(outputs) if copy is not None and copies else outputs


class StaticCopy:
    """copy_out for the outputs of one captured graph: the same objects at every replay. Any other
    outputs (a padded call's slices of them, say) are copied by copy_out."""

    # cuts kept, one per request size: every size a point of 32 rows x 128 positions serves
    CUTS = 4096

    def __init__(self, outputs: Any) -> None:
        self.outputs = outputs
        found = list(trees.leaves(outputs))
        self._paths = [path for path, _ in found]
        self._leaves = [leaf for _, leaf in found]
        self._plan = _Plan(self._leaves, static=True)
        self._rebuild = trees.rebuilder(outputs)
        self._cuts: dict[Hashable, _Cut] = {}  # by the cut's key

    def cut(self, cut: trees.Cut, copies: bool) -> Any:
        """The outputs cut back by `cut`: copies, or (not `copies`) views of the graph's buffers.
        The views and their copy plan are worked out at a request size's first call, as the tree
        is walked once: what a padded call adds to a replay is then the copy alone. Callers hold
        the replica's call lock, which guards the cache too."""
        found = self._cuts.get(cut.key)
        if found is None:
            views = self._views(cut)
            # borrowed: the views themselves, the same objects at every call, as an exact-size
            # borrow returns the graph's own outputs
            found = _Cut(views, _Plan(views, static=True), self._rebuild(iter(views)))
            if len(self._cuts) < self.CUTS:
                self._cuts[cut.key] = found
        return self._rebuild(iter(found.plan.copies(found.views))) if copies else found.borrowed

    def _views(self, cut: trees.Cut) -> list[Any]:
        """Each leaf's real part; a tensor the tree names twice and cut alike is one view, so that
        it is copied once and the copy shared, as copy_out shares it."""
        views: list[Any] = []
        first: dict[int, torch.Tensor] = {}
        for path, leaf in zip(self._paths, self._leaves, strict=True):
            view = cut.leaf(path, leaf)
            if isinstance(leaf, torch.Tensor) and isinstance(view, torch.Tensor):
                seen = first.setdefault(id(leaf), view)
                if _layout(seen) == _layout(view):
                    view = seen  # views of one tensor in one layout: the same elements
            views.append(view)
        return views

    def __call__(self, outputs: Any) -> Any:
        if outputs is not self.outputs:
            return copy_out(outputs)
        if type(outputs) is torch.Tensor:
            return outputs.clone()
        return self._rebuild(iter(self._plan.copies(self._leaves)))


def copier(runner: Any, replays: bool) -> Optional[Copier]:
    """How a caller gets outputs of its own from `runner`: None where its outputs are its own
    already (`replays`: they live in buffers its next call overwrites)."""
    if not replays:
        return None
    static = getattr(runner, "outputs", None)  # a graph of the tool's own (jobs/graphs.py)
    return StaticCopy(static) if static is not None else copy_out


def _layout(view: torch.Tensor) -> tuple[Any, ...]:
    return view.shape, view.stride(), view.storage_offset()


@dataclass(frozen=True)
class _Cut:
    views: list[Any]  # each leaf's real part
    plan: _Plan
    borrowed: Any  # the tree of the views


class _Plan:
    """Which leaves to copy and how: the tensors whose memory is one range holding each element once
    and little else (_span: contiguous, a permutation of it as a transposed view, or rows padded
    for alignment) grouped by dtype and device, each group copied by one `torch._foreach_copy_`
    into one new tensor cut into views of their shapes and strides; any other tensor (a slice with
    wide gaps, a broadcast) copied alone; the same tensor twice copied once, and the copy shared as
    the original was. PyTorch's multi-tensor kernel makes one launch of a whole list where both
    sides of every pair hold each element once with the same strides: a dense tensor is copied into
    its view as it is, one with gaps as its range of memory, gaps and all. `static`: the same leaves
    come at every call, so what each group copies from is made once."""

    def __init__(self, leaves: Sequence[Any], static: bool = False) -> None:
        first: dict[int, int] = {}  # id of a tensor -> its first position
        self._same: list[tuple[int, int]] = []  # (position, position of its first occurrence)
        groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        spans: dict[int, int] = {}  # position -> the elements its range of memory holds
        self._alone: list[int] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                continue
            if id(leaf) in first:
                self._same.append((i, first[id(leaf)]))
                continue
            first[id(leaf)] = i
            span = _span(leaf)
            if span is None:
                self._alone.append(i)
            else:
                spans[i] = span
                groups.setdefault((leaf.dtype, leaf.device), []).append(i)
        for positions in [p for p in groups.values() if len(p) == 1]:
            self._alone += positions
        self._groups = [positions for positions in groups.values() if len(positions) > 1]
        self._layouts = [
            _Layout([leaves[i] for i in positions], [spans[i] for i in positions]) for positions in self._groups
        ]
        self._sources: Optional[list[list[torch.Tensor]]] = None
        if static:
            self._sources = [
                layout.sources([leaves[i] for i in positions])
                for layout, positions in zip(self._layouts, self._groups, strict=True)
            ]

    def copies(self, leaves: Sequence[Any]) -> list[Any]:
        """`leaves` with each tensor replaced by its copy, other leaves as they are."""
        out = list(leaves)
        for g, positions in enumerate(self._groups):
            layout = self._layouts[g]
            sources = self._sources[g] if self._sources is not None else layout.sources([leaves[i] for i in positions])
            flat = torch.empty(layout.size, dtype=sources[0].dtype, device=sources[0].device)
            if layout.strided is None:  # all contiguous: the sources are the tensors themselves
                pieces = list(_unflatten(flat, sources))
            else:
                pieces = [flat.as_strided(shape, stride, offset) for shape, stride, offset in layout.strided]
            targets = pieces
            if layout.ranged:
                targets = list(pieces)
                for j, offset, length in layout.ranged:
                    targets[j] = flat.narrow(0, offset, length)
            torch._foreach_copy_(targets, sources)
            for i, piece in zip(positions, pieces, strict=True):
                out[i] = piece
        for i in self._alone:
            out[i] = leaves[i].clone()
        for i, original in self._same:
            out[i] = out[original]
        return out


class _Layout:
    """Where a group's tensors lie in its copy: its size in elements; each piece's shape, strides
    and offset, unless every tensor is contiguous (then cut in one call, _unflatten); and the
    tensors with gaps, copied as ranges: (place in the group, offset, elements)."""

    def __init__(self, tensors: list[torch.Tensor], spans: list[int]) -> None:
        *offsets, self.size = itertools.accumulate(spans, initial=0)
        self.strided: Optional[list[tuple[Any, ...]]] = None
        if not all(t.is_contiguous() for t in tensors):
            self.strided = [(t.shape, t.stride(), offset) for t, offset in zip(tensors, offsets, strict=True)]
        self.ranged = [
            (j, offset, span)
            for j, (t, offset, span) in enumerate(zip(tensors, offsets, spans, strict=True))
            if span != t.numel()
        ]

    def sources(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """What the group copies from: each tensor, or for one with gaps its range of memory."""
        if not self.ranged:
            return tensors
        out = list(tensors)
        for j, _, span in self.ranged:
            out[j] = tensors[j].as_strided((span,), (1,), tensors[j].storage_offset())
        return out


# A tensor whose range of memory holds at most this fraction more elements than the tensor (rows
# a compiler padded for alignment) is copied range and all: one contiguous copy moves those few
# more bytes faster than a strided copy moves the tensor's own; wider gaps (a padded request's
# real part) are copied alone.
SLACK = 1 / 16


def _span(tensor: torch.Tensor) -> Optional[int]:
    """The elements from `tensor`'s first in memory to its last, where no two of its elements
    share a place and that range holds at most SLACK more elements than the tensor; None for any
    other tensor. Dimensions of size 1 are never stepped along, whatever their stride."""
    if tensor.is_contiguous():  # an empty tensor too
        return tensor.numel()
    extent = 1  # the range that the dimensions of smaller strides, taken so far, cover
    for stride, size in sorted((st, sz) for st, sz in zip(tensor.stride(), tensor.shape, strict=True) if sz != 1):
        if stride < extent:  # a step lands inside what the smaller strides cover: elements overlap
            return None
        extent += stride * (size - 1)
    return extent if extent <= tensor.numel() * (1 + SLACK) else None


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> Sequence[torch.Tensor]:
    """`flat` cut into views of `like`'s shapes, in one call into torch (the helper its
    distributed code uses to unpack a flattened bucket of gradients)."""
    return torch._C._nn.unflatten_dense_tensors(flat, like)
