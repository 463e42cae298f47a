"""What cutting a padded request's outputs back and copying them out costs the host, per call.

    python bench/cut_copy.py [--rounds 7] [--calls 5000]

The outputs are a Hugging Face encoder's (`last_hidden_state` [8, 64, 32] and `pooler_output`
[8, 32], CPU tensors small enough that the walk, not the copy, is what is timed), as a CUDA
graph of the bucket 8 x 64 leaves them in its buffers; the request is 5 rows of 60 positions.
Timed, in rounds of back-to-back calls, the order alternating: the tree walked to cut, then
walked again to copy (`cut_outputs` + `copy_out`), against the views and copy plan kept per
request size by the graph's StaticCopy (`cut_out`), copying and borrowing; and the copying call
again with the output rebuilt by its class's constructor (what jobs/trees.py skips where the
class leaves the constructor nothing to do). Then a GPT-2 output with a cache of GPT-2's 12
layers, copied whole both ways: a decoder's cache is an object per layer, rebuilt at every call.
Medians of the rounds' means and their spread (half the interquartile range), µs per call.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions  # noqa: E402

from orchestrator.jobs import grid, trees  # noqa: E402
from orchestrator.jobs.copies import StaticCopy, copy_out, cut_out  # noqa: E402
from orchestrator.jobs.variants import spread  # noqa: E402


class _Never(dict):  # type: ignore[type-arg]
    """A per-type cache of jobs/trees.py's that answers no for every type and keeps no answer."""

    def get(self, *_: Any) -> bool:  # type: ignore[override]
        return False

    def __getitem__(self, _: Any) -> bool:
        return False

    def __setitem__(self, *_: Any) -> None:
        pass


class Constructors:
    """Within it, outputs and caches are rebuilt through their constructors and copy.copy, as
    they were before jobs/trees.py learnt to skip them: the comparison's other side."""

    def __enter__(self) -> None:
        self.saved = trees._FAST_OUTPUT, trees._PLAIN_COPY
        trees._FAST_OUTPUT, trees._PLAIN_COPY = _Never(), _Never()

    def __exit__(self, *exc: object) -> None:
        trees._FAST_OUTPUT, trees._PLAIN_COPY = self.saved


def decoder_output(layers: int) -> Any:
    """A GPT-2 output with its cache of `layers` layers (GPT-2's own depth: 12), tiny widths."""
    config = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=2, vocab_size=101, n_positions=64)
    torch.manual_seed(0)
    with torch.no_grad():
        return transformers.GPT2LMHeadModel(config).eval()(torch.arange(8 * 6).reshape(8, 6) % 101)


def timed(ways: dict[str, tuple[Callable[[], Any], bool]], rounds: int, calls: int) -> None:
    """Print each way's µs per call: rounds of back-to-back calls, the order alternating, the
    first round a warm-up; a way marked True runs within Constructors."""
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(rounds + 1):
        for name in list(ways) if i % 2 == 0 else list(ways)[::-1]:
            way, old = ways[name]
            with Constructors() if old else contextlib.nullcontext():
                began = time.perf_counter()
                for _ in range(calls):
                    way()
                elapsed = time.perf_counter() - began
            if i:
                samples[name].append(elapsed / calls * 1e6)
    for name, values in samples.items():
        print(f"{name:50} {statistics.median(values):7.1f} ±{spread(values):.1f} µs per call")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5000, help="back-to-back calls per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    outputs = BaseModelOutputWithPoolingAndCrossAttentions(
        last_hidden_state=torch.randn(8, 64, 32), pooler_output=torch.randn(8, 32)
    )
    dims = {"output.last_hidden_state": {0: "batch", 1: "seq"}, "output.pooler_output": {0: "batch"}}
    real = {"batch": 5, "seq": 60}
    static = StaticCopy(outputs)
    ways: dict[str, tuple[Callable[[], Any], bool]] = {
        "cut, then copy_out": (lambda: copy_out(grid.cut_outputs(outputs, dims, real)), False),
        "cut_out, copying": (lambda: cut_out(outputs, grid.output_cut(dims, real), static, True), False),
        "cut_out, copying, outputs built by constructors": (
            lambda: cut_out(outputs, grid.output_cut(dims, real), static, True),
            True,
        ),
        "cut_out, borrowing": (lambda: cut_out(outputs, grid.output_cut(dims, real), static, False), False),
    }
    expected = ways["cut, then copy_out"][0]()
    for name, (way, old) in ways.items():  # the same answer every way
        with Constructors() if old else contextlib.nullcontext():
            got = way()
        assert type(got) is type(expected) and all(torch.equal(got[key], expected[key]) for key in expected), name
    print("an encoder's outputs, 5 x 60 of a point 8 x 64:")
    timed(ways, args.rounds, args.calls)
    decoder = decoder_output(12)
    whole = StaticCopy(decoder)
    print("a decoder's logits and its 12-layer cache (25 tensors), copied whole:")
    timed({"copying": (lambda: whole(decoder), False), "copying, built by constructors": (lambda: whole(decoder), True)},
          args.rounds, args.calls // 5)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
