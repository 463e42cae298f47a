"""What copying a graph's outputs out costs on the GPU, by the way the copies are launched.

    python bench/copy_kernels.py [--rows 1,8] [--seq 128] [--rounds 15] [--calls 100] [--transposed] [--padded]

The outputs are shaped as GPT-2's with its cache at a bucket of `rows` (bfloat16): logits
[rows, seq, 50257] and 24 key and value tensors [rows, 12, seq, 64], each contiguous, as a
CUDA graph's buffers hold them (`--transposed`: the keys and values are views [rows, seq, 12, 64]
transposed, as attention code often leaves them, so not contiguous; `--padded`: the logits' rows
padded to a multiple of 8 values, as Inductor lays them out, so 7 values of gap after each row of
50,257; both together are a compiled GPT-2's outputs). Four ways to copy all of them out:
  - clone: one copy per tensor (25 launches, each a device-to-device copy);
  - static: what a replica runs for a graph of the tool's own (jobs/copies.StaticCopy), its plan
    made once: one new tensor per dtype, filled by one `torch._foreach_copy_` of each tensor's
    range of memory (a padded row's few gaps included), cut into views of the tensors' shapes and
    strides;
  - copy_out: the same for outputs that differ from call to call, the tree walked and the plan
    made at every call;
  - foreach: one new tensor, split into views of their shapes, filled by `torch._foreach_copy_`
    (one launch per chunk of the list, by PyTorch's multi-tensor kernels).
Per way, rounds of `calls` back-to-back copies, the ways alternating round by round: the device's
time per copy (CUDA events around the round, after a synchronize) and the host's (until the last
copy returned, before the synchronize). Medians of the rounds and their spread (half the
interquartile range), µs per copy. Every way's copies are checked equal to the originals.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from orchestrator.jobs.copies import StaticCopy, copy_out  # noqa: E402
from orchestrator.jobs.variants import spread  # noqa: E402

VOCAB, LAYERS, HEADS, HEAD_DIM = 50257, 12, 12, 64


def outputs(rows: int, seq: int, transposed: bool, padded: bool) -> list[torch.Tensor]:
    width = -(-VOCAB // 8) * 8 if padded else VOCAB
    made = [torch.randn(rows, seq, width, device="cuda", dtype=torch.bfloat16)[..., :VOCAB]]
    for _ in range(2 * LAYERS):
        if transposed:
            made.append(torch.randn(rows, seq, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16).transpose(1, 2))
        else:
            made.append(torch.randn(rows, HEADS, seq, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
    return made


def clone(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def foreach(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    flat = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
    copies = list(torch._C._nn.unflatten_dense_tensors(flat, tensors))
    torch._foreach_copy_(copies, tensors)
    return copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--transposed", action="store_true")
    parser.add_argument("--padded", action="store_true")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| rows | MB | way | device µs per copy | host µs per copy |")
    print("|---:|---:|---|---:|---:|")
    for rows in map(int, args.rows.split(",")):
        tensors = outputs(rows, args.seq, args.transposed, args.padded)
        WAYS: dict[str, Callable[[list[torch.Tensor]], list[torch.Tensor]]] = {
            "clone": clone,
            "static": StaticCopy(tensors),
            "copy_out": copy_out,
            "foreach": foreach,
        }
        megabytes = sum(t.numel() * t.element_size() for t in tensors) / 1e6
        for name, way in WAYS.items():  # checked, and each way's first call (allocations) untimed
            for got, want in zip(way(tensors), tensors, strict=True):
                assert torch.equal(got, want) and got.data_ptr() != want.data_ptr(), name
        device: dict[str, list[float]] = {name: [] for name in WAYS}
        host: dict[str, list[float]] = {name: [] for name in WAYS}
        for r in range(args.rounds):
            for name in list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]:
                way = WAYS[name]
                torch.cuda.synchronize()
                stream = torch.cuda.current_stream()  # looked up outside the sample (jobs/timing.py)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                began = time.perf_counter()
                start.record(stream)
                for _ in range(args.calls):
                    way(tensors)
                returned = time.perf_counter()
                end.record(stream)
                torch.cuda.synchronize()
                device[name].append(start.elapsed_time(end) * 1e3 / args.calls)
                host[name].append((returned - began) * 1e6 / args.calls)
        for name in WAYS:
            print(
                f"| {rows} | {megabytes:.1f} | {name} | {statistics.median(device[name]):.1f} ± {spread(device[name]):.1f} "
                f"| {statistics.median(host[name]):.1f} ± {spread(host[name]):.1f} |"
            )


if __name__ == "__main__":
    main()
