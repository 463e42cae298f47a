"""A graph's static inputs taking a request shorter than the capture (jobs/graphs.py PaddedInputs):
after every write they hold exactly what padding the request would have made, whatever was
written before; a request they cannot take writes nothing. The graph itself needs CUDA
(tests/test_gpu_serving.py); the writes are plain tensor work, checked here on the CPU."""

from __future__ import annotations

import random

import pytest
import torch

from orchestrator.jobs.graphs import InputPadding, PaddedInputs
from orchestrator.jobs.grid import InputShaper, input_padding, padded_call
from orchestrator.jobs.padding import pad_end
from orchestrator.jobs.spec import WarmupSpec

# two inputs padded in rows and positions (ids by 0, a float feature by -1.5), a third whose last
# dimension is not padded
PADDING = InputPadding(
    names=("mask", "features"),
    dims=(frozenset({0, 1}), frozenset({0, 1}), frozenset({0})),
    pads=(0, 0, -1.5),
)
ROWS, SEQ, WIDTH = 4, 16, 3


def statics() -> list[torch.Tensor]:
    # what a capture leaves: the bucket's own example inputs, nowhere the pad values
    return [
        torch.randint(1, 100, (ROWS, SEQ)),
        torch.ones(ROWS, SEQ, dtype=torch.int64),
        torch.randn(ROWS, WIDTH),
    ]


def request(rows: int, seq: int, generator: torch.Generator) -> list[torch.Tensor]:
    return [
        torch.randint(1, 100, (rows, seq), generator=generator),
        torch.randint(0, 2, (rows, seq), generator=generator),
        torch.randn(rows, WIDTH, generator=generator),
    ]


def padded(values: list[torch.Tensor]) -> list[torch.Tensor]:
    return [
        pad_end(values[0], {0: ROWS, 1: SEQ}, 0),
        pad_end(values[1], {0: ROWS, 1: SEQ}, 0),
        pad_end(values[2], {0: ROWS}, -1.5),
    ]


def assert_holds(buffers: list[torch.Tensor], values: list[torch.Tensor]) -> None:
    for buffer, expected in zip(buffers, padded(values), strict=True):
        assert torch.equal(buffer, expected)


@pytest.mark.parametrize("kept", [PaddedInputs.CORNERS, 1])
def test_every_write_leaves_the_inputs_as_padding_would_whatever_came_before(monkeypatch, kept):
    monkeypatch.setattr(PaddedInputs, "CORNERS", kept)  # 1: a shrinking write finds its last corner not kept
    buffers = statics()
    inputs = PaddedInputs(buffers, PADDING)
    generator = torch.Generator().manual_seed(0)
    order = random.Random(0)
    # growing, shrinking in one dimension or both, the same shape twice, the full shape
    sizes = [(1, 1), (2, 5), (2, 5), (4, 16), (1, 16), (4, 1), (3, 9), (2, 12), (1, 3)]
    sizes += [(order.randint(1, ROWS), order.randint(1, SEQ)) for _ in range(60)]
    for step, (rows, seq) in enumerate(sizes):
        if step % 17 == 16:  # a call of the capture's own shapes overwrites every position
            values = request(ROWS, SEQ, generator)
            for buffer, value in zip(buffers, values, strict=True):
                buffer.copy_(value)
            inputs.written_whole()
            assert_holds(buffers, values)
        values = request(rows, seq, generator)
        assert inputs.write(values), (rows, seq)
        assert_holds(buffers, values)


def test_a_request_the_inputs_cannot_take_writes_nothing():
    buffers = statics()
    inputs = PaddedInputs(buffers, PADDING)
    generator = torch.Generator().manual_seed(1)
    assert inputs.write(request(2, 5, generator))
    before = [buffer.clone() for buffer in buffers]
    ids, mask, features = request(2, 7, generator)
    refused = [
        [ids, mask],  # an input missing
        [torch.ones(ROWS + 1, SEQ, dtype=torch.int64), torch.ones(ROWS + 1, SEQ, dtype=torch.int64), features],
        [ids, mask, torch.randn(2, WIDTH - 1)],  # short in a dimension that is not padded
        [ids, mask, torch.randn(2, WIDTH + 1)],
        [ids[0], mask, features],  # another rank
        [ids.float(), mask, features],  # another dtype
        [ids, mask, features.double()],
        [ids.to("meta"), mask, features],  # another device
    ]
    for values in refused:
        assert not inputs.write(values)
        for buffer, kept in zip(buffers, before, strict=True):
            assert torch.equal(buffer, kept)
    values = request(1, 3, generator)  # and the next request that fits still finds them right
    assert inputs.write(values)
    assert_holds(buffers, values)


def test_a_spec_pads_each_input_in_the_dimensions_that_follow_its_buckets():
    spec = WarmupSpec.model_validate(
        {
            "name": "m",
            "model": {"factory": "m:f"},
            "inputs": [
                {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64", "range": [1, 100], "pad": 0},
                {"name": "scores", "shape": ["batch", "seq", 4], "dtype": "float32", "pad": -1},
            ],
            "buckets": {"batch": [1, 8], "seq": [16, 32]},
        }
    )
    part = spec.slices()[0]
    assert input_padding(part) == InputPadding(
        names=("input_ids", "scores"), dims=(frozenset({0, 1}), frozenset({0, 1})), pads=(0, -1.0)
    )
    # a runner that replays no graph of the tool's own gets the request padded, as the proof pads it
    seen = []
    run = padded_call(lambda **kw: seen.append(kw) or "answer", InputShaper(part), {"batch": 8, "seq": 16})
    ids, scores = torch.ones(3, 5, dtype=torch.int64), torch.zeros(3, 5, 4)
    assert run((), {"input_ids": ids, "scores": scores}) == "answer"
    assert torch.equal(seen[0]["input_ids"], pad_end(ids, {0: 8, 1: 16}, 0))
    assert torch.equal(seen[0]["scores"], pad_end(scores, {0: 8, 1: 16}, -1.0))


def test_a_request_covering_the_last_is_one_copy_a_shorter_one_two_and_views_are_worked_out_once(monkeypatch):
    from orchestrator.jobs import graphs

    copies, corners = [], []
    copy, corner = graphs._copy, PaddedInputs._corner
    monkeypatch.setattr(graphs, "_copy", lambda targets, sources: copies.append(len(targets)) or copy(targets, sources))
    monkeypatch.setattr(PaddedInputs, "_corner", lambda self, shapes: corners.append(shapes) or corner(self, shapes))
    buffers = statics()
    inputs = PaddedInputs(buffers, PADDING)
    generator = torch.Generator().manual_seed(2)
    # (rows, seq) -> copies: the first write also fills what the capture left; then growing, equal
    # in one dimension, the same shape, shorter in one dimension, shorter in the other
    for (rows, seq), expected in [((2, 5), 2), ((2, 9), 1), ((3, 9), 1), ((3, 9), 1), ((3, 4), 2), ((1, 4), 2)]:
        copies.clear()
        values = request(rows, seq, generator)
        assert inputs.write(values)
        assert_holds(buffers, values)
        assert len(copies) == expected, (rows, seq, copies)
    assert len(corners) == len(set(corners)) == 5  # once per request shape, the repeated one reused


def test_a_single_input_is_written_and_restored_alike():
    buffer = torch.arange(ROWS * SEQ).reshape(ROWS, SEQ)
    inputs = PaddedInputs([buffer], InputPadding(names=(), dims=(frozenset({0, 1}),), pads=(7,)))
    for rows, seq in [(3, 9), (1, 2), (4, 16), (2, 3)]:
        value = torch.randint(100, 200, (rows, seq))
        assert inputs.write([value])
        assert torch.equal(buffer, pad_end(value, {0: ROWS, 1: SEQ}, 7))
