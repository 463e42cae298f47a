"""`orchestrate serve` under load: concurrent clients sending request sizes uniform in 1..B (B the
largest bucket) for a fixed time, against the same deployment serving eager (numbers go to
docs/performance.md).

    python bench/serve_load.py OUT_DIR [--model examples/mlp.yaml] [--device cuda]
                               [--clients 32] [--seconds 30] [--rounds 2] [--wire json,npz]

1. `orchestrate warmup --no-ray` into a fresh cache: the plan per bucket.
2. Two deployments, one at a time, each `orchestrate serve` on its own local Ray: "planned" on the
   warmed cache (every bucket on its chosen variant) and "eager" on an empty cache directory (no
   plan: every bucket eager). The same load runs against each, alternating for `--rounds` rounds
   so drift hits both.
3. Per round, deployment and wire format (`--wire json,npz`: JSON bodies, and numpy.savez
   bodies with .npz answers), the load in turn: requests answered per second, rows per second,
   p50 and p99 latency (client side: send to full answer), errors. Written to
   OUT_DIR/serve-load.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_SECONDS = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Deployment:
    def __init__(self, model: str, device: str, cache: Path, log: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "serve", "--model", model, "--device", device]
            + ["--cache-dir", str(cache), "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,  # its Ray processes are its group: stopped with it, nobody else's
        )
        self.log = log

    def wait_ready(self) -> str:
        url = f"http://127.0.0.1:{self.port}/predict"
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            if "orchestrate: serving" in self.log.read_text():
                return url
            time.sleep(1)
        raise RuntimeError(f"serve not ready in {READY_SECONDS} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self._log.close()


def bodies_for(wire: str, width: list[int], largest: int, seed: int) -> dict[int, bytes]:
    """One body per size, made before the clock starts: the clients' encoding is not the
    server's time (the clients share one interpreter)."""
    values = random.Random(seed)
    out = {}
    for n in range(1, largest + 1):
        inputs = [[[values.random() for _ in range(w)] for _ in range(n)] for w in width]
        if wire == "json":
            out[n] = json.dumps({"inputs": inputs}).encode()
        else:
            import numpy as np

            buffer = io.BytesIO()
            np.savez(buffer, *(np.asarray(x, dtype=np.float32) for x in inputs))
            out[n] = buffer.getvalue()
    return out


CONTENT_TYPES = {"json": "application/json", "npz": "application/x-npz"}


def load(url: str, wire: str, bodies: dict[int, bytes], clients: int, seconds: float, seed: int) -> dict:
    """`clients` threads, each sending one request at a time, sizes uniform in 1..largest."""
    latencies: list[float] = []
    rows = [0]
    errors = [0]
    lock = threading.Lock()
    largest = max(bodies)

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < stop:
            n = rng.randint(1, largest)
            request = urllib.request.Request(url, bodies[n], {"Content-Type": CONTENT_TYPES[wire]})
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    answer.read()
                ok = True
            except Exception:  # counted, the load goes on
                ok = False
            spent = time.perf_counter() - started
            with lock:
                if ok:
                    latencies.append(spent)
                    rows[0] += n
                else:
                    errors[0] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    begun = time.monotonic()
    stop = begun + seconds
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - begun
    ordered = sorted(latencies)
    return {
        "requests_per_s": len(ordered) / wall,
        "rows_per_s": rows[0] / wall,
        "p50_ms": 1e3 * statistics.median(ordered) if ordered else None,
        "p99_ms": 1e3 * ordered[max(0, int(0.99 * len(ordered)) - 1)] if ordered else None,
        "requests": len(ordered),
        "errors": errors[0],
        "seconds": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="examples/mlp.yaml")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--wire", default="json,npz", help="request formats to load with, in turn")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from orchestrator.config import load_spec

    spec = load_spec(ROOT / args.model)
    if len(spec.inputs) != 1 or spec.inputs[0].shape[0] != spec.bucket_symbol:
        raise SystemExit("this load generator sends one float input shaped [bucket, width...]")
    width = [int(d) for d in spec.inputs[0].shape[1:]]
    if len(width) != 1:
        raise SystemExit("this load generator sends one [bucket, width] input")
    largest = max(spec.buckets)
    warm = Path(tempfile.mkdtemp(prefix="serve-load-warm-"))
    empty = Path(tempfile.mkdtemp(prefix="serve-load-eager-"))
    warmup = subprocess.run(
        [sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", args.model, "--device", args.device]
        + ["--cache-dir", str(warm), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    (args.out / "serve-load-warmup.log").write_text(warmup.stderr)
    plan = {r["bucket"]: r["variant"] for r in json.loads(warmup.stdout)["results"]} if warmup.stdout else {}
    wires = args.wire.split(",")
    results: dict = {"plan": plan, "clients": args.clients, "seconds": args.seconds, "rounds": []}
    for round_ in range(args.rounds):
        row = {}
        for name, cache in (("planned", warm), ("eager", empty)):
            deployment = Deployment(args.model, args.device, cache, args.out / f"serve-{name}-{round_}.log")
            try:
                url = deployment.wait_ready()
                for wire in wires if round_ % 2 == 0 else wires[::-1]:
                    bodies = bodies_for(wire, width, largest, seed=round_)
                    key = f"{name} {wire}"
                    row[key] = load(url, wire, bodies, args.clients, args.seconds, seed=round_)
                    print(f"round {round_} {key}: {json.dumps(row[key])}", flush=True)
            finally:
                deployment.stop()
        results["rounds"].append(row)
    (args.out / "serve-load.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
