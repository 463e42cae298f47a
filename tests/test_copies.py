"""Outputs copied out of replay buffers: equal to the buffers, independent of them, one copy per
tensor however often a tree names it, and the tree's own types rebuilt."""

from collections import OrderedDict
from typing import NamedTuple

import pytest
import torch

from orchestrator.jobs import grid
from orchestrator.jobs.copies import StaticCopy, copier, copy_out, cut_out
from orchestrator.jobs.trees import Cut


class Pair(NamedTuple):
    logits: torch.Tensor
    cache: list


def buffers() -> Pair:
    shared = torch.arange(6.0).reshape(2, 3)
    return Pair(
        logits=torch.randn(2, 5),
        cache=[
            OrderedDict(keys=torch.randn(2, 4), values=torch.randn(2, 4), ids=torch.arange(4)),
            shared,
            shared,  # the same tensor twice
            torch.randn(4, 2).t(),  # not contiguous: copied with its strides
            7,
            None,
        ],
    )


def leaves(tree: Pair) -> list:
    keys = tree.cache[0]
    return [tree.logits, keys["keys"], keys["values"], keys["ids"], *tree.cache[1:4]]


def check_copies(original: Pair, copied: Pair) -> None:
    assert type(copied) is Pair and type(copied.cache[0]) is OrderedDict
    assert copied.cache[4:] == [7, None]
    for a, b in zip(leaves(original), leaves(copied), strict=True):
        assert torch.equal(a, b) and a.dtype == b.dtype and a.stride() == b.stride()
        assert a.data_ptr() != b.data_ptr()
    assert copied.cache[1] is copied.cache[2]
    before = [t.clone() for t in leaves(copied)]
    for t in leaves(original):  # the next replay writes its buffers: the caller's copies keep their values
        t.fill_(-1)
    assert all(torch.equal(a, b) for a, b in zip(before, leaves(copied), strict=True))


def test_a_static_copy_copies_every_tensor_of_the_tree_and_rebuilds_it():
    outputs = buffers()
    copy = StaticCopy(outputs)
    first = copy(outputs)
    second = copy(outputs)
    assert first.logits.data_ptr() != second.logits.data_ptr()  # a new copy at every call
    check_copies(outputs, first)


def test_outputs_that_are_not_the_captured_ones_take_the_general_copy():
    outputs = buffers()
    copy = StaticCopy(outputs)
    sliced = Pair(outputs.logits[:1], outputs.cache)  # a padded request's rows, say
    copied = copy(sliced)
    assert torch.equal(copied.logits, outputs.logits[:1]) and copied.logits.data_ptr() != outputs.logits.data_ptr()
    check_copies(buffers_like := outputs, copy_out(buffers_like))


def first_row(path: str, leaf):
    return leaf.narrow(0, 0, 1) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else leaf


def test_a_cut_of_the_captured_outputs_copies_the_real_part_of_every_replay():
    outputs = buffers()
    copy = StaticCopy(outputs)
    cut = Cut(("rows", 1), first_row)
    expected = copy_out(cut(outputs))
    got = cut_out(outputs, cut, copy, copies=True)
    assert type(got) is Pair and got.cache[4:] == [7, None] and got.cache[1] is got.cache[2]
    for a, b in zip(leaves(expected), leaves(got), strict=True):
        assert torch.equal(a, b) and a.shape == b.shape and a.data_ptr() != b.data_ptr()
    for t in leaves(outputs):  # the next replay: the kept views read it, the copies already made do not
        t.add_(100)
    again = cut_out(outputs, Cut(("rows", 1), lambda *_: pytest.fail("a cut is worked out once")), copy, copies=True)
    for before, after, buffer in zip(leaves(got), leaves(again), leaves(cut(outputs)), strict=True):
        assert torch.equal(after, buffer) and not torch.equal(before, after)
    borrowed = cut_out(outputs, cut, copy, copies=False)  # borrow: views of the buffers themselves
    assert borrowed.logits.data_ptr() == outputs.logits.data_ptr() and borrowed.logits.shape == (1, 5)


def test_cuts_of_other_sizes_or_of_other_outputs_are_their_own(monkeypatch):
    outputs = buffers()
    copy = StaticCopy(outputs)
    monkeypatch.setattr(StaticCopy, "CUTS", 1)  # a full cache answers as right, keeping nothing more
    one = cut_out(outputs, Cut(("rows", 1), first_row), copy, copies=True)
    whole = cut_out(outputs, Cut(("rows", 2), lambda _, leaf: leaf), copy, copies=True)
    assert one.logits.shape == (1, 5) and torch.equal(whole.logits, outputs.logits) and len(copy._cuts) == 1
    other = buffers()  # not the captured outputs (an eager fallback's): cut, then copied as any
    got = cut_out(other, Cut(("rows", 1), first_row), copy, copies=True)
    assert torch.equal(got.logits, other.logits[:1]) and got.logits.data_ptr() != other.logits.data_ptr()
    assert cut_out(other, Cut(("rows", 1), first_row), None, copies=True).logits.data_ptr() == other.logits.data_ptr()


def test_a_grid_cut_is_named_by_its_sizes_alone():
    dims = {"output": {0: "batch", 1: "seq"}}
    assert grid.output_cut(dims, {"batch": 3, "seq": 5}).key == grid.output_cut(dims, {"seq": 5, "batch": 3}).key
    assert grid.output_cut(dims, {"batch": 3, "seq": 5}).key != grid.output_cut(dims, {"batch": 3, "seq": 6}).key
    buffer = torch.randn(4, 8, 2)
    copy = StaticCopy(buffer)
    got = cut_out(buffer, grid.output_cut(dims, {"batch": 3, "seq": 5}), copy, copies=True)
    assert torch.equal(got, buffer[:3, :5]) and got.data_ptr() != buffer.data_ptr()


def test_a_runner_whose_outputs_are_its_own_is_not_copied():
    assert copier(object(), replays=False) is None
    assert copier(object(), replays=True) is copy_out

    class Graph:
        outputs = torch.ones(2)

    assert isinstance(copier(Graph(), replays=True), StaticCopy)


class Replays:
    """A runner that writes its answer into one buffer, as a captured graph does."""

    def __init__(self, linear: torch.nn.Module, x: torch.Tensor) -> None:
        self.linear, self.outputs = linear, linear(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.linear.bias, x, self.linear.weight.t(), out=self.outputs)


def test_borrow_returns_the_buffers_and_a_call_returns_copies(tmp_path):
    from orchestrator import runtime
    from orchestrator.jobs.replica import BucketInfo

    (tmp_path / "models.py").write_text("import torch\n\ndef linear():\n    return torch.nn.Linear(4, 4)\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: {factory: models.py:linear}\ninputs: [{shape: [batch, 4]}]\nbuckets: [2]\ndevice: cpu\n")
    served = runtime.load(cfg, cache_dir=tmp_path / "cache", ready="planned")
    x = torch.randn(2, 4)
    with torch.no_grad():
        runner = Replays(served.model, x)
        served._switch(BucketInfo(2, "graphed", "graphed", None), runner, 0.0)
        borrowed, called = served.borrow(x), served(x)
        expected = served.model(x)
    assert borrowed is runner.outputs
    assert called.data_ptr() != runner.outputs.data_ptr() and torch.allclose(called, expected)
    with torch.no_grad():  # a padded request (1 row of 2) is cut back from the buffers alike
        assert served.borrow(x[:1]).data_ptr() == runner.outputs.data_ptr()
        assert served(x[:1]).data_ptr() != runner.outputs.data_ptr()
        for row in torch.randn(3, 1, 4):  # each padded call its own answer, through the kept views
            assert torch.allclose(served(row), served.model(row))


def test_a_decoders_cache_of_transposed_views_is_copied_as_one_group_with_its_strides():
    """A compiled decoder returns its keys and values as transposed views and its logits with rows
    padded for alignment: each is one range of memory with no or few gaps, so they are copied
    together (one storage, one launch on a GPU), each copy with its original's strides; a slice
    with wide gaps is copied on its own."""
    logits = torch.randn(2, 16, 52)[..., :50]  # rows of 50 values, 52 apart
    cache = [torch.randn(2, 16, 4, 8).transpose(1, 2) for _ in range(4)]  # [batch, heads, seq, dim]
    gapped = torch.randn(2, 16, 50)[:, :5]  # the real positions of a padded request
    outputs = {"logits": logits, "cache": cache, "cut": gapped}
    for copy in (StaticCopy(outputs), copy_out):
        copied = copy(outputs)
        got = [copied["logits"], *copied["cache"]]
        for a, b in zip([logits, *cache], got, strict=True):
            assert torch.equal(a, b) and a.stride() == b.stride() and a.data_ptr() != b.data_ptr()
        assert len({t.untyped_storage().data_ptr() for t in got}) == 1
        assert torch.equal(copied["cut"], gapped)
        assert copied["cut"].untyped_storage().data_ptr() != got[0].untyped_storage().data_ptr()
        for t in [logits, *cache, gapped]:
            t.fill_(-1)  # the next replay: the copies keep their values
        assert all(not torch.equal(t, torch.full_like(t, -1)) for t in [*got, copied["cut"]])
        logits.normal_(), gapped.normal_(), [t.normal_() for t in cache]
        again = copy(outputs)  # the next call copies the new values, through the same plan
        assert all(torch.equal(a, b) for a, b in zip([logits, *cache], [again["logits"], *again["cache"]], strict=True))


@pytest.mark.parametrize(
    "tensor, span",
    [
        (torch.randn(3, 4), 12),
        (torch.randn(3, 4).t(), 12),
        (torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1), 120),
        (torch.randn(1, 4).as_strided((1, 4), (99, 1)), 4),  # a dimension of size 1 is never stepped
        (torch.randn(3, 17)[:, :16], 50),  # rows padded by one: 2 gaps in 50
        (torch.randn(3, 8)[:, :4], None),  # gaps as wide as the rows
        (torch.randn(4)[::2], None),
        (torch.randn(1, 4).expand(3, 4), None),  # every row the same elements
        (torch.randn(4, 4).as_strided((3, 3), (1, 1)), None),  # rows overlapping
        (torch.randn(0, 4).t(), 0),  # nothing to hold: contiguous
    ],
)
def test_which_tensors_are_copied_as_one_range_of_memory(tensor, span):
    from orchestrator.jobs.copies import _span

    assert _span(tensor) == span
