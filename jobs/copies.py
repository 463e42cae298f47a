"""Outputs a caller may keep, copied out of the CUDA-graph buffers the next replay overwrites.

A copy per output tensor is a kernel launch per tensor and, for a tree of outputs (a Hugging Face
output with its cache: dozens of tensors), a walk of the tree per call. Here the tensors of one
dtype and device are copied together: one `torch.cat` of their flat views, cut into tensors of
their shapes again by one call, so a tree of any size costs a launch per dtype. A variant captured
in a graph of the tool's own returns the same output objects at every replay, so what to copy and
how to rebuild the tree are worked out once (StaticCopy).

Copies of one call share one storage per dtype: a caller that keeps one output keeps that call's
other outputs of its dtype alive with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


class StaticCopy:
    """copy_out for the outputs of one captured graph: the same objects at every replay. Any other
    outputs (a padded call's slices of them, say) are copied by copy_out."""

    def __init__(self, outputs: Any) -> None:
        self.outputs = outputs
        self._leaves = [leaf for _, leaf in trees.leaves(outputs)]
        self._plan = _Plan(self._leaves, static=True)
        self._rebuild = trees.rebuilder(outputs)

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


class _Plan:
    """Which leaves to copy and how: tensors grouped by dtype and device, each group in one
    launch; a tensor that is not contiguous by itself (its strides kept); the same tensor twice
    copied once, and the copy shared as the original was. `static`: the same leaves come at every
    call, so their flat views are taken once."""

    def __init__(self, leaves: Sequence[Any], static: bool = False) -> None:
        first: dict[int, int] = {}  # id of a tensor -> its first position
        self._same: list[tuple[int, int]] = []  # (position, position of its first occurrence)
        groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        self._alone: list[int] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                continue
            if id(leaf) in first:
                self._same.append((i, first[id(leaf)]))
                continue
            first[id(leaf)] = i
            if leaf.is_contiguous():
                groups.setdefault((leaf.dtype, leaf.device), []).append(i)
            else:
                self._alone.append(i)
        for positions in [p for p in groups.values() if len(p) == 1]:
            self._alone += positions
        self._groups = [positions for positions in groups.values() if len(positions) > 1]
        self._views = [[leaves[i].view(-1) for i in positions] for positions in self._groups] if static else None

    def copies(self, leaves: Sequence[Any]) -> list[Any]:
        """`leaves` with each tensor replaced by its copy, other leaves as they are."""
        out = list(leaves)
        for g, positions in enumerate(self._groups):
            tensors = [leaves[i] for i in positions]
            flat = torch.cat(self._views[g] if self._views is not None else [t.view(-1) for t in tensors])
            for i, piece in zip(positions, _unflatten(flat, tensors), strict=True):
                out[i] = piece
        for i in self._alone:
            out[i] = leaves[i].clone()
        for i, original in self._same:
            out[i] = out[original]
        return out


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> Sequence[torch.Tensor]:
    """`flat` cut into views of `like`'s shapes, in one call into torch (the helper its
    distributed code uses to unpack a flattened bucket of gradients)."""
    return torch._C._nn.unflatten_dense_tensors(flat, like)
