"""Many replicas pulling one namespace at once, through a proxy that drops and delays a share of
the requests (numbers go to docs/cache.md and docs/performance.md).

    python bench/fleet_pull.py OUT_DIR [--pullers 64] [--fault-share 0.05] [--stall 1.0]
                               [--files 200] [--megabytes 40] [--from-dir DIR]

1. A moto S3 server on loopback (SigV4 enforced) and the fault proxy of tests/s3fixtures.py in
   front of it; one namespace published through the proxy (no faults yet): the files of
   `--from-dir` (e.g. a warmed cache's namespace directory) or synthetic ones of log-normal sizes.
2. `--pullers` processes start together, each pulling the namespace into an empty directory of
   its own through the proxy, now faulting `--fault-share` of the requests (a 503, a reset or a
   stall, in equal parts).
3. Every puller must end verified (every file's hash is the manifest's) or failed with one clear
   error and no directory at all: anything else is counted as partial and the run exits 1.
   Per pull: seconds, bytes, and the requests the proxy saw per pull. Written to
   OUT_DIR/fleet-pull.json; a summary goes to stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

NAMESPACE = "fleet-bench-torch2-cpu-py3-0123456789abcdef"


def synthetic(directory: Path, files: int, megabytes: float, seed: int) -> None:
    """Files shaped like an Inductor cache's: many small ones, a few large (log-normal sizes)."""
    rng = random.Random(seed)
    sizes = [rng.lognormvariate(0, 1.5) for _ in range(files)]
    scale = megabytes * 1e6 / sum(sizes)
    for i, size in enumerate(sizes):
        path = directory / f"fxgraph/{i % 16:02x}/entry-{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(max(1, int(size * scale))))


def pull_one(args: tuple[str, str, float, str]) -> dict:
    """One replica: pull into an empty directory, then check what is there."""
    url, target, start_at, public_key = args[0], Path(args[1]), args[2], args[3]
    from orchestrator.cache import sync
    from orchestrator.cache.manifest import TrustedKeys
    from orchestrator.cache.store import open_store

    time.sleep(max(0.0, start_at - time.time()))  # every puller starts at the same moment
    started = time.perf_counter()
    outcome: dict = {"target": str(target)}
    try:
        trusted = TrustedKeys.from_pems([public_key])  # a replica holds the public key only
        transfer = sync.pull(open_store(url), NAMESPACE, target, trusted, allow_unsigned=False)
        outcome.update(ok=True, bytes=transfer.bytes if transfer else 0, files=transfer.files if transfer else 0)
    except Exception as exc:  # every failure is recorded; the check below says whether it was clean
        outcome.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def check(outcome: dict, expected: dict[str, str]) -> str:
    """'verified', 'failed cleanly' or what is wrong."""
    target = Path(outcome["target"])
    if not outcome["ok"]:
        return "failed cleanly" if not target.exists() else f"failed, but left {target}"
    for rel, sha in expected.items():
        path = target / rel
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            return f"partial: {rel}"
    return "verified"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--pullers", type=int, default=64)
    parser.add_argument("--fault-share", type=float, default=0.05)
    parser.add_argument("--stall", type=float, default=1.0, help="seconds a stalled request is held")
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--megabytes", type=float, default=40.0)
    parser.add_argument("--from-dir", type=Path, help="publish this directory instead of synthetic files")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from s3fixtures import FaultProxy, MotoServer

    from orchestrator.cache import sync
    from orchestrator.cache.manifest import SigningKey, TrustedKeys
    from orchestrator.cache.store import open_store

    work = Path(tempfile.mkdtemp(prefix="fleet-pull-"))
    source = args.from_dir or work / "source"
    if args.from_dir is None:
        synthetic(source, args.files, args.megabytes, seed=1)
    with MotoServer() as moto, FaultProxy(moto.endpoint) as proxy:
        bucket = moto.make_bucket("fleet")
        os.environ.update(
            AWS_ENDPOINT_URL=proxy.url,
            AWS_ACCESS_KEY_ID=moto.access_key or "",
            AWS_SECRET_ACCESS_KEY=moto.secret_key or "",
            AWS_DEFAULT_REGION=moto.region,
        )
        key = SigningKey.generate()  # this run's publisher
        url = f"s3://{bucket}/cache"
        published = sync.publish(open_store(url), source, NAMESPACE, key, allow_unsigned=False)
        head = sync.newest(open_store(url), NAMESPACE, TrustedKeys([key.public]), allow_unsigned=False)
        assert head is not None
        expected = {rel: entry.sha256 for rel, entry in head.files.items()}
        total_bytes = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        before = proxy.requests
        proxy.fault_share(args.fault_share, seconds=args.stall, seed=7)
        start_at = time.time() + 3.0  # time for every process to import
        jobs = [(url, str(work / f"replica-{i}" / NAMESPACE), start_at, key.public.pem()) for i in range(args.pullers)]
        with multiprocessing.get_context("spawn").Pool(args.pullers) as pool:
            outcomes = pool.map(pull_one, jobs)
        proxy.fault_share(0)
        faults = [h for h in proxy.history[before:] if h[2] != "forwarded"]
        requests = proxy.requests - before
    verdicts = [check(outcome, expected) for outcome in outcomes]
    seconds = sorted(o["seconds"] for o in outcomes if o["ok"])
    result = {
        "pullers": args.pullers,
        "fault_share": args.fault_share,
        "stall_seconds": args.stall,
        "files": len(expected),
        "bytes": total_bytes,
        "shards": published.shards,
        "requests": requests,
        "requests_per_pull": requests / args.pullers,
        "faults_injected": len(faults),
        "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
        "errors": sorted({o["error"] for o in outcomes if not o["ok"]}),
        "pull_seconds": {
            "median": statistics.median(seconds) if seconds else None,
            "max": seconds[-1] if seconds else None,
            "all": seconds,
        },
        "bytes_per_pull": statistics.median([o["bytes"] for o in outcomes if o["ok"]]) if seconds else None,
    }
    (args.out / "fleet-pull.json").write_text(json.dumps(result, indent=2))
    summary = {k: v for k, v in result.items() if k != "pull_seconds"}
    summary["pull_seconds"] = {k: v for k, v in result["pull_seconds"].items() if k != "all"}
    print(json.dumps(summary, indent=2))
    bad = [v for v in verdicts if v not in ("verified", "failed cleanly")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
