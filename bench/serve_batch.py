"""What `orchestrate serve` does with a batch after the model's call, two ways side by side
(numbers go to docs/performance.md):
  - copied: the call's outputs copied out of the graph's buffers by the runtime, then each
    request's rows copied to the host on their own (`codec.split(model(...))`);
  - borrowed: the graph's buffers read to the host once for the batch, only the outputs some
    request asks for (`codec.split(codec.to_host(model.borrow(...)))`), as the server does.

    python bench/serve_batch.py OUT_DIR [--device cuda] [--batches 1x1,8x1] [--rounds 30]
                                [--block 10] [--no-warm] [CFG.yaml or name ...]
    # names: examples/<name>.yaml or bench/models/<name>.yaml; default: mlp gpt2_cache_bf16

Per model: `orchestrate warmup --no-ray --json` into OUT_DIR/cache/<name> (unless --no-warm),
then in this process `runtime.load(ready="planned")`. Per batch (`KxR`: K requests of R rows,
one request of the config's deterministic inputs decoded by the server's own codec and protocol,
so that it sits on the device as the server's do, and joined K times) and per wire:
  - npz: /predict requests with .npz bodies: every output, each as its raw bytes;
  - v2 first output: Open Inference Protocol requests asking for the model's first output
    alone, in binary (a decoder's cache stays on the GPU).
Both ways' answers are checked byte for byte before anything is timed. Then blocks of `--block`
back-to-back batches (join, call, answers), the two ways interleaved and the order alternating
each round, the first round untimed, a synchronize after each block; per way the median over
rounds of µs per batch ± half the interquartile range, and the saving. Written to
OUT_DIR/serve-batch.json; a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from replica_start import Budget, resolve, warm  # noqa: E402
from runtime_overhead import host_blocks  # noqa: E402

from orchestrator import runtime  # noqa: E402
from orchestrator.jobs import trees  # noqa: E402
from orchestrator.jobs.model import make_inputs  # noqa: E402
from orchestrator.jobs.variants import spread  # noqa: E402
from orchestrator.serving.codec import NPZ, RequestCodec  # noqa: E402
from orchestrator.serving.inference_protocol import DATATYPES, InferenceProtocol  # noqa: E402

MODELS = ["mlp", "gpt2_cache_bf16"]
WIRES = ["npz", "v2 first output"]


def first_output(served: Any) -> str:
    """The path of the model's first tensor output, as the Open Inference Protocol names it."""
    args, kwargs = make_inputs(served.spec, min(served.spec.buckets), served.device)
    return next(path for path, leaf in trees.leaves(served(*args, **kwargs)) if isinstance(leaf, torch.Tensor))


def bodies(protocol: InferenceProtocol, codec: RequestCodec, spec: Any, rows: int, first: str) -> dict[str, Any]:
    """One request of `rows` rows (the config's deterministic inputs) in each wire, decoded."""
    args, kwargs = make_inputs(spec, rows, torch.device("cpu"))
    tensors = [*args, *(kwargs[item.name] for item in spec.inputs if item.name)]
    npz = io.BytesIO()
    np.savez(npz, **{name: t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
                     for name, t in zip(codec.input_names, tensors, strict=True)})  # fmt: skip
    inputs, raw = [], b""
    for name, item, tensor in zip(codec.input_names, spec.inputs, tensors, strict=True):
        data = tensor.contiguous().view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor.contiguous()
        inputs.append({"name": name, "shape": list(tensor.shape), "datatype": DATATYPES[item.dtype],
                       "parameters": {"binary_data_size": data.numel() * data.element_size()}})  # fmt: skip
        raw += data.numpy().tobytes()
    header = json.dumps({"inputs": inputs, "outputs": [{"name": first, "parameters": {"binary_data": True}}]})
    return {
        "npz": codec.decode(npz.getvalue(), NPZ),
        "v2 first output": protocol.decode(header.encode() + raw, str(len(header.encode()))),
    }


def bench_model(name: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    config = resolve(name)
    cache = out_dir / "cache" / name
    result: dict[str, Any] = {"model": name, "config": str(config)}
    if not args.no_warm:
        result["warmup"] = warm(config, name, cache, out_dir, args.device, Budget(None))
        if "error" in result["warmup"]:
            return result
    served = runtime.load(config, cache_dir=cache, device=args.device, ready="planned")
    if isinstance(served, runtime.GridModel):
        raise SystemExit(f"serve_batch: {config} is a grid; this benchmark builds list-form requests only")
    result["variants"] = {str(label): row.variant for label, row in served.info().buckets.items()}
    codec = RequestCodec(served.spec, served.device)
    protocol = InferenceProtocol(served.spec, codec, served)
    sync = torch.cuda.synchronize if served.device.type == "cuda" else (lambda: None)
    first = first_output(served)
    result["cases"] = []
    for batch in args.batches:
        count, rows = (int(part) for part in batch.split("x"))
        decoded = bodies(protocol, codec, served.spec, rows, first)  # requests are read, never changed
        for wire in WIRES:
            requests = [decoded[wire]] * count
            joined = codec.join(requests)

            def copied(requests: list[Any] = requests, joined: Any = joined) -> list[Any]:
                return codec.split(served(*joined[0], **joined[1]), requests)

            def borrowed(requests: list[Any] = requests, joined: Any = joined) -> list[Any]:
                return codec.split(codec.to_host(served.borrow(*joined[0], **joined[1]), requests), requests)

            ways = {"copied": copied, "borrowed": borrowed}
            answers = {way: fn() for way, fn in ways.items()}
            bodies_of = {way: [answer.body for answer in given] for way, given in answers.items()}
            same = bodies_of["copied"] == bodies_of["borrowed"]
            statuses = {answer.status for answer in answers["copied"]}
            if statuses != {200}:
                print(
                    f"{name} {batch} {wire}: answered {sorted(statuses)}: {bodies_of['copied'][0][:300]!r}",
                    file=sys.stderr,
                )
            host_blocks(ways, 1, args.block, sync)  # warms up
            samples = host_blocks(ways, args.rounds, args.block, sync)
            row = {"batch": batch, "wire": wire, "same_answers": same, "statuses": sorted(statuses),
                   "answer_bytes": sum(len(body) for body in bodies_of["copied"])}  # fmt: skip
            for way, values in samples.items():
                row[way] = {"us": statistics.median(values), "spread": spread(values), "samples": values}
            row["saving_us"] = row["copied"]["us"] - row["borrowed"]["us"]
            result["cases"].append(row)
            print(f"{name} {batch} {wire}: copied {row['copied']['us']:.1f} ±{row['copied']['spread']:.1f} µs, "
                  f"borrowed {row['borrowed']['us']:.1f} ±{row['borrowed']['spread']:.1f} µs, same answers: {same}",
                  file=sys.stderr)  # fmt: skip
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | batch | wire | copied µs | borrowed µs | saving | same answers |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for result in results:
        for row in result.get("cases", []):
            saving = row["saving_us"] / row["copied"]["us"] * 100 if row["copied"]["us"] else 0.0
            http = "" if row["statuses"] == [200] else f" (HTTP {row['statuses']})"
            lines.append(
                f"| {result['model']} | {row['batch']} | {row['wire']} | {row['copied']['us']:.1f} ±{row['copied']['spread']:.1f} "
                f"| {row['borrowed']['us']:.1f} ±{row['borrowed']['spread']:.1f} | {row['saving_us']:.1f} µs ({saving:.0f}%) "
                f"| {'yes' if row['same_answers'] else 'NO'}{http} |"
            )
        if "cases" not in result:
            lines.append(f"| {result['model']} | | | warmup failed: {result['warmup'].get('error', '')[:200]} | | | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=lambda text: text.split(","), default=["1x1", "8x1"])
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds of each way")
    parser.add_argument("--block", type=int, default=10, help="back-to-back batches per round")
    parser.add_argument("--no-warm", action="store_true", help="the caches under OUT_DIR/cache are warm already")
    args = parser.parse_args()
    (args.out_dir / "logs").mkdir(parents=True, exist_ok=True)
    results = [bench_model(name, args, args.out_dir) for name in args.models]
    (args.out_dir / "serve-batch.json").write_text(json.dumps(results, indent=2, default=str))
    print(table(results))
    cases = [row for result in results for row in result.get("cases", [])]
    return 0 if all(row["same_answers"] and row["statuses"] == [200] for row in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
