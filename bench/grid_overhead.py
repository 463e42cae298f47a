"""What a grid request costs the host beyond its point's graph, measured where no GPU is.

    python bench/grid_overhead.py [--calls 20000] [--block 200] [--json]

A grid of a one-embedding model (batch 1, 4, 16 x seq 8, 16, 64; inputs `ids` and `mask`, output
a dict of one tensor) is loaded with `runtime.load` on the CPU, and every point's runner is
replaced by a stand-in for a graph of the tool's own: `GraphedCall`'s own code (its calls, the
corner writes of a shorter request), with a `replay` that runs the model on the static inputs
and copies the result into the same output tensors, as a replay leaves it. So the runtime's
whole path for a graphed point runs, which a CUDA graph would otherwise need.

Per request size, three ways, timed in blocks of back-to-back calls, interleaved (host µs per
call, median of the blocks ± half their interquartile range):
  - grid: `grid(ids=..., mask=...)`, as served (the request written into the graph's corners);
  - grid, padded: the same with the corner writes off (each input padded into a new tensor, then
    copied into the graph's inputs: the path every variant that replays no graph of the tool's
    own takes);
  - direct: the point's graph called with the request padded ahead of time, its outputs copied
    out whole: what serving the point costs with no runtime at all.
`grid − direct` is the runtime's own cost per request: routing, checks, padding, cutting back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from runtime_overhead import host_blocks  # noqa: E402  (bench/ is not a package)

from orchestrator.jobs import trees  # noqa: E402
from orchestrator.jobs.graphs import GraphedCall  # noqa: E402
from orchestrator.jobs.variants import spread  # noqa: E402

MODEL = """
import torch

class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(100, 8)

    def forward(self, ids, mask):
        return {"hidden": self.embedding(ids) * mask.unsqueeze(-1)}

def embed():
    return Embed()
"""
CONFIG = """
model: {factory: models.py:embed}
inputs:
  - {name: ids, shape: [batch, seq], dtype: int64, range: [1, 100], pad: 0}
  - {name: mask, shape: [batch, seq], dtype: int64, range: [1, 2], pad: 0}
buckets: {batch: [1, 4, 16], seq: [8, 16, 64]}
device: cpu
"""
REQUESTS = [(3, 9), (4, 9), (3, 16), (4, 16)]  # short in both, in seq, in rows; a point's own


class ReplayOnHost(GraphedCall):
    """GraphedCall with a replay that runs `fn` into the captured outputs on the host."""

    def _capture(self, pool: Any) -> tuple[Any, Any]:
        with torch.no_grad():
            outputs = self.fn(*self.args, **self.kwargs)
        call = self

        class Replay:
            def replay(self) -> None:
                with torch.no_grad():
                    fresh = call.fn(*call.args, **call.kwargs)
                for (_, kept), (_, new) in zip(trees.leaves(outputs), trees.leaves(fresh), strict=True):
                    kept.copy_(new)

        return Replay(), outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls of each way per request size")
    parser.add_argument("--block", type=int, default=200, help="back-to-back calls per sample")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args()

    from orchestrator import runtime
    from orchestrator.jobs.grid import input_padding
    from orchestrator.jobs.model import make_inputs
    from orchestrator.jobs.replica import BucketInfo

    torch.set_num_threads(1)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="grid-overhead-") as tmp:
        (Path(tmp) / "models.py").write_text(MODEL)
        (Path(tmp) / "grid.yaml").write_text(CONFIG)
        grid = runtime.load(Path(tmp) / "grid.yaml", cache_dir=Path(tmp) / "cache", ready="planned")
        graphs = {}
        for part, served in grid.slices:
            for bucket in part.buckets:
                inputs, named = make_inputs(part, bucket, grid.device)
                graph = ReplayOnHost(grid.model, inputs, named, padding=input_padding(part))
                served._switch(BucketInfo(bucket, "graphed", "graphed", None), graph, 0)
                graphs[(bucket, part.fixed["seq"])] = (graph, served._routes[bucket].copy)
        generator = torch.Generator().manual_seed(0)
        for rows, seq in REQUESTS:
            ids = torch.randint(1, 100, (rows, seq), generator=generator)
            mask = torch.ones_like(ids)
            index = grid._choose(rows, {"seq": seq})
            part = grid.slices[index][0]
            bucket = next(b for b in part.buckets if b >= rows)
            graph, copy = graphs[(bucket, part.fixed["seq"])]
            padded = {
                name: torch.nn.functional.pad(value, (0, part.fixed["seq"] - seq, 0, bucket - rows))
                for name, value in (("ids", ids), ("mask", mask))
            }
            short = graph.short

            def unpadded(graph: GraphedCall = graph, short: Any = short) -> Any:
                graph.short = short
                return grid(ids=ids, mask=mask)

            def padded_path(graph: GraphedCall = graph) -> Any:
                graph.short = None
                return grid(ids=ids, mask=mask)

            def direct(graph: GraphedCall = graph, copy: Any = copy, padded: Any = padded) -> Any:
                return copy(graph(**padded))

            with torch.no_grad():
                expected = grid.model(ids=ids, mask=mask)["hidden"]
                for way in (unpadded, padded_path):
                    assert torch.equal(way()["hidden"], expected), way.__name__
                ways = {"grid": unpadded, "grid, padded": padded_path, "direct": direct}
                host_blocks(ways, 1, args.block)  # warms up
                samples = host_blocks(ways, max(args.calls // args.block, 4), args.block)
            graph.short = short
            row: dict[str, float] = {}
            for name, values in samples.items():
                row[f"{name} µs"] = statistics.median(values)
                row[f"{name} spread µs"] = spread(values)
            for name in ("grid", "grid, padded"):
                diffs = [a - b for a, b in zip(samples[name], samples["direct"], strict=True)]
                row[f"{name} − direct µs"] = statistics.median(diffs)
                row[f"{name} − direct spread µs"] = spread(diffs)
            point = f"{bucket}x{part.fixed['seq']}"
            results[f"{rows}x{seq} at {point}"] = row
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"torch {torch.__version__}, host µs per call (median ± half IQR); the runtime's own: way − direct")
    print(
        f"{'request':16} {'direct':>14} {'grid':>14} {'grid, padded':>14} {'grid − direct':>15} {'padded − direct':>16}"
    )
    for name, r in results.items():
        print(
            f"{name:16} {r['direct µs']:8.1f} ±{r['direct spread µs']:4.1f} {r['grid µs']:8.1f} ±{r['grid spread µs']:4.1f} "
            f"{r['grid, padded µs']:8.1f} ±{r['grid, padded spread µs']:4.1f} "
            f"{r['grid − direct µs']:9.1f} ±{r['grid − direct spread µs']:4.1f} "
            f"{r['grid, padded − direct µs']:9.1f} ±{r['grid, padded − direct spread µs']:4.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
