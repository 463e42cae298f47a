"""What cuDNN's first call of a conv net costs per batch size, in each memory layout, on a GPU.

    python bench/cudnn_setup.py [--model mixnet_l] [--layout contiguous|channels_last] [--batches 8,1,32]
    TORCH_CUDNN_V8_API_DISABLED=1 python bench/cudnn_setup.py ...   # torch's older cuDNN (v7) API

A timm model (random weights) in float32, eval, no grad, `cudnn.benchmark` off (as a replica
runs). Per batch size, in the order given: the first call's seconds (cuDNN chooses and builds its
plan for every convolution of that size), the median of 60 eager calls after 5 more, the seconds
to capture the model into a CUDA graph on this thread after a call on a side stream, and the
median of 60 replays of that graph (CUDA events around each call after a synchronize). Inductor
lays a conv net's convolutions out channels-last (its layout optimization), so a replica's
capture of a compiled graph pays the channels-last first call. One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from host_speed import event_ms  # noqa: E402  (bench/ is not a package)

CALLS = 60


def median_ms(fn: Callable[[], Any]) -> float:
    return round(statistics.median(event_ms(fn) for _ in range(CALLS)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mixnet_l")
    parser.add_argument("--layout", choices=["contiguous", "channels_last"], default="contiguous")
    parser.add_argument("--batches", default="8,1,32")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = False
    layout = torch.channels_last if args.layout == "channels_last" else torch.contiguous_format
    model = timm.create_model(args.model, pretrained=False).cuda().eval().to(memory_format=layout)
    row: dict[str, Any] = {
        "model": args.model,
        "layout": args.layout,
        "cudnn_api": "v7" if os.environ.get("TORCH_CUDNN_V8_API_DISABLED") == "1" else "v8",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    with torch.no_grad():
        for batch in (int(b) for b in args.batches.split(",")):
            x = torch.randn(batch, 3, 224, 224, device="cuda").contiguous(memory_format=layout)
            torch.cuda.synchronize()
            began = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            first = time.perf_counter() - began
            for _ in range(5):
                model(x)
            eager = median_ms(lambda: model(x))
            graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model(x)
            torch.cuda.current_stream().wait_stream(side)
            began = time.perf_counter()
            with torch.cuda.graph(graph):
                model(x)
            capture = time.perf_counter() - began
            row[str(batch)] = {
                "first_call_s": round(first, 3),
                "eager_ms": eager,
                "capture_s": round(capture, 3),
                "replay_ms": median_ms(graph.replay),
            }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
