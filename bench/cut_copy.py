"""What cutting a padded request's outputs back and copying them out costs the host, per call.

    python bench/cut_copy.py [--rounds 7] [--calls 5000]

The outputs are a Hugging Face encoder's (`last_hidden_state` [8, 64, 32] and `pooler_output`
[8, 32], CPU tensors small enough that the walk, not the copy, is what is timed), as a CUDA
graph of the bucket 8 x 64 leaves them in its buffers; the request is 5 rows of 60 positions.
Timed, in rounds of back-to-back calls, the order alternating: the tree walked to cut, then
walked again to copy (`cut_outputs` + `copy_out`), against the views and copy plan kept per
request size by the graph's StaticCopy (`cut_out`), copying and borrowing. Medians of the
rounds' means and their spread (half the interquartile range), µs per call.
"""

from __future__ import annotations

import argparse
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
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions  # noqa: E402

from orchestrator.jobs import grid  # noqa: E402
from orchestrator.jobs.copies import StaticCopy, copy_out, cut_out  # noqa: E402
from orchestrator.jobs.variants import spread  # noqa: E402


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
    ways: dict[str, Callable[[], Any]] = {
        "cut, then copy_out": lambda: copy_out(grid.cut_outputs(outputs, dims, real)),
        "cut_out, copying": lambda: cut_out(outputs, grid.output_cut(dims, real), static, True),
        "cut_out, borrowing": lambda: cut_out(outputs, grid.output_cut(dims, real), static, False),
    }
    expected = ways["cut, then copy_out"]()
    for name, way in ways.items():  # the same answer every way
        got = way()
        assert all(torch.equal(got[key], expected[key]) for key in expected), name
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(args.rounds + 1):
        for name in list(ways) if i % 2 == 0 else list(ways)[::-1]:
            began = time.perf_counter()
            for _ in range(args.calls):
                ways[name]()
            if i:  # the first round warms up
                samples[name].append((time.perf_counter() - began) / args.calls * 1e6)
    for name, values in samples.items():
        print(f"{name:20} {statistics.median(values):7.1f} ±{spread(values):.1f} µs per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
