"""Publish and pull throughput of the cache protocol against raw copies of the same bytes.

    python bench/store_throughput.py --remote s3://bucket/prefix [--source DIR] [--repeats 3]
    python bench/store_throughput.py --moto            # starts a moto S3 server on loopback

Raw baselines use the same store client: "per file" uploads/downloads every file as its own
object with the same parallelism (what `aws s3 sync` of a cache directory does); "one object"
moves a single object of the same total size (the bandwidth bound). Ratios are medians of
interleaved repeats. Without --source, a synthetic cache shaped like resnet18's on an H200
(925 files, 26 MB: many small code files, some larger kernels) is generated.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.cache import sync  # noqa: E402
from orchestrator.cache.store import open_store  # noqa: E402


def synthetic_cache(root: Path, files: int = 925, total_bytes: int = 26_000_000) -> Path:
    rng = __import__("random").Random(0)
    large = files // 10
    for i in range(files):
        size = total_bytes // 2 // large if i < large else max(200, total_bytes // 2 // (files - large))
        path = root / ("triton" if i < large else "inductor") / f"{i % 97:02x}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
    return root


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    import boto3

    for _ in range(100):
        try:
            boto3.client("s3").create_bucket(Bucket="bench")
            return proc, "s3://bench/store"
        except Exception:
            time.sleep(0.1)
    raise SystemExit("moto server did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote")
    parser.add_argument("--moto", action="store_true")
    parser.add_argument("--source", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    moto = None
    if args.moto:
        moto, args.remote = start_moto()
    try:
        run(args)
    finally:
        if moto:
            moto.terminate()


def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="store-bench-"))
    source = args.source or synthetic_cache(work / "source")
    files = sync.scan(source)
    total = sum(size for _, size in files.values())
    tarball = work / "all.tar"
    sync._write_tar(tarball, {rel: path for rel, (path, _) in files.items()})
    times: dict[str, list[float]] = {
        k: [] for k in ("publish", "pull", "raw_files_up", "raw_files_down", "raw_one_up", "raw_one_down")
    }
    for _ in range(args.repeats):
        url = f"{args.remote.rstrip('/')}/{uuid.uuid4().hex[:8]}"
        if url.startswith("file://"):
            Path(url[len("file://") :]).mkdir(parents=True)
        store = open_store(url)
        ns, dest = "bench", work / f"pull-{uuid.uuid4().hex[:6]}"
        times["publish"].append(timed(lambda: sync.publish(store, source, ns, None, allow_unsigned=True)))
        times["pull"].append(timed(lambda: sync.pull(store, ns, dest, None, allow_unsigned=True)))
        with ThreadPoolExecutor(sync.PARALLEL) as pool:
            times["raw_files_up"].append(
                timed(lambda: list(pool.map(lambda item: store.upload(f"raw/{item[0]}", item[1][0]), files.items())))
            )
            raw_dest = work / f"raw-{uuid.uuid4().hex[:6]}"

            def fetch(rel: str) -> None:
                (raw_dest / rel).parent.mkdir(parents=True, exist_ok=True)
                store.download(f"raw/{rel}", raw_dest / rel)

            times["raw_files_down"].append(timed(lambda: list(pool.map(fetch, files))))
        times["raw_one_up"].append(timed(lambda: store.upload("one/all.tar", tarball)))
        times["raw_one_down"].append(timed(lambda: store.download("one/all.tar", work / "one.tar")))
        shutil.rmtree(dest, ignore_errors=True)
        shutil.rmtree(raw_dest, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mb = total / 1e6
    print(f"store {args.remote}: {len(files)} files, {mb:.1f} MB, median of {args.repeats}\n")
    print(
        "| operation | protocol | raw, one object per file | raw, one object | protocol vs per-file | protocol vs one object |"
    )
    print("|---|---|---|---|---|---|")
    for op, proto, per_file, one in (
        ("upload", "publish", "raw_files_up", "raw_one_up"),
        ("download", "pull", "raw_files_down", "raw_one_down"),
    ):
        print(
            f"| {op} | {med[proto]:.2f} s ({mb / med[proto]:.0f} MB/s) | {med[per_file]:.2f} s "
            f"({mb / med[per_file]:.0f} MB/s) | {med[one]:.2f} s ({mb / med[one]:.0f} MB/s) | "
            f"{med[per_file] / med[proto]:.1f}x faster | {med[one] / med[proto]:.2f}x |"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
