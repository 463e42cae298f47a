"""What giving a graph a request shorter than its point costs the host, per call.

    python bench/pad_inputs.py [--rounds 7] [--calls 5000] [--device cpu]

The inputs are an encoder's (`input_ids` and `attention_mask`, int64), the graph's point 8 x 64.
Requests alternate between 5 x 60 and 7 x 33, so that every other one is shorter in a dimension
than the one before and the corners must first be restored to the pad values. Timed, in rounds
of back-to-back calls, the order alternating: each input padded into a new tensor and copied into
the graph's inputs (InputShaper.pad, then one `_foreach_copy_`, what a replica did), against the
request written straight into the corners of the graph's inputs (PaddedInputs.write). Medians of
the rounds' means and their spread (half the interquartile range), µs per call. On a GPU
(`--device cuda`) each figure is host time to launch the work, synchronized after each round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from runtime_overhead import host_blocks  # noqa: E402  (bench/ is not a package)

from orchestrator.jobs.graphs import PaddedInputs  # noqa: E402
from orchestrator.jobs.grid import InputShaper, input_padding  # noqa: E402
from orchestrator.jobs.spec import WarmupSpec  # noqa: E402
from orchestrator.jobs.variants import spread  # noqa: E402

POINT = {"batch": 8, "seq": 64}
SIZES = [(5, 60), (7, 33)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5000, help="back-to-back calls per round")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    masked = {"shape": ["batch", "seq"], "dtype": "int64", "pad": 0}
    spec = WarmupSpec.model_validate(
        {
            "name": "encoder",
            "model": {"factory": "m:f"},
            "inputs": [
                {"name": "input_ids", "range": [1, 30000], **masked},
                {"name": "attention_mask", "range": [1, 2], **masked},
            ],
            "buckets": {"batch": [POINT["batch"]], "seq": [POINT["seq"]]},
        }
    ).slices()[0]
    shaper = InputShaper(spec)
    statics = [torch.zeros(POINT["batch"], POINT["seq"], dtype=torch.int64, device=device) for _ in range(2)]
    corners = PaddedInputs(statics, input_padding(spec))
    generator = torch.Generator().manual_seed(0)
    requests = [
        {name: torch.randint(1, 100, size, generator=generator).to(device) for name in ("input_ids", "attention_mask")}
        for size in SIZES
    ]
    turn = [0]

    def padded() -> None:
        request = requests[turn[0] % 2]
        turn[0] += 1
        _, kwargs = shaper.pad((), request, POINT)
        torch._foreach_copy_(statics, [kwargs["input_ids"], kwargs["attention_mask"]], non_blocking=True)

    def written() -> None:
        request = requests[turn[0] % 2]
        turn[0] += 1
        corners.write([request["input_ids"], request["attention_mask"]])

    ways: dict[str, Callable[[], Any]] = {"padded, then copied in": padded, "written into the corners": written}
    for request in requests:  # both leave the graph's inputs alike
        _, kwargs = shaper.pad((), request, POINT)
        assert corners.write([request["input_ids"], request["attention_mask"]])
        assert torch.equal(statics[0], kwargs["input_ids"]) and torch.equal(statics[1], kwargs["attention_mask"])
    host_blocks(ways, 1, args.calls, sync)  # warms up
    samples = host_blocks(ways, args.rounds, args.calls, sync)
    print(
        f"host µs per call, {args.device}, torch {torch.__version__}; medians of {args.rounds} rounds of {args.calls}"
    )
    for name, values in samples.items():
        print(f"  {name:28s} {statistics.median(values):7.1f} ± {spread(values):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
