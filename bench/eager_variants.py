"""How much of a speedup depends on how eager is run: no_grad vs inference_mode vs autograd on.

    python bench/eager_variants.py [--model examples/resnet18.yaml] [--bucket 1]

Explains gaps between this tool's eager baseline (torch.no_grad) and other harnesses'. Same
timing as `orchestrate warmup` (synchronize, CUDA events, interleaved, medians).
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from orchestrator.config import load_spec
from orchestrator.jobs.model import build_model, make_inputs, resolve_device
from orchestrator.jobs.timing import Clock, median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="examples/resnet18.yaml")
    parser.add_argument("--bucket", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    spec = load_spec(args.model)
    device = resolve_device(spec.device)
    model = build_model(spec, device)
    inputs, kwargs = make_inputs(spec, args.bucket, device)
    modes = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "grad_enabled": contextlib.nullcontext}

    def variant(ctx):
        def run():
            with ctx():
                return model(*inputs, **kwargs)

        return run

    clock = Clock(device)
    latency = clock.interleaved({n: variant(c) for n, c in modes.items()}, args.iterations, warmup=20).samples
    b2b = clock.back_to_back({n: variant(c) for n, c in modes.items()}, rounds=20, calls=10)
    print(f"{spec.name} bucket {args.bucket} on {device}:")
    for name in modes:
        print(
            f"  eager {name:15s} latency {median(latency[name]):.3f} ms   back-to-back {median(b2b[name]):.3f} ms/call"
        )


if __name__ == "__main__":
    main()
