"""What a replica's pull of a namespace it already holds costs the Python work beside it.

    python bench/pull_beside.py [--source NAMESPACE_DIR] [--files 3000] [--rounds 15]

A replica pulls on its loader thread while its own thread builds the model (imports, module
construction: Python under the interpreter lock). A pull that fetches nothing still re-hashes
every file against the signed manifest. Here a fixed pure-Python loop stands for the build, timed
three ways, interleaved round by round (the order rotating):
  - alone;
  - beside a whole `sync.pull` of the unchanged namespace, on a thread (what a replica does);
  - beside the same files hashed by a child process running the standard library alone (a way to
    take the hashing off the interpreter: the pull's listing and manifest stay in process).
The loop is sized to about 60% of an unchanged pull, alone, so that it runs inside the pull; slowed
beside it, it may end just after, which understates the ratio. Figures: median ms ± half the IQR,
and the ratio to alone.

Without --source, a namespace shaped like Inductor's and Triton's caches is generated (`--files`
files of 2-60 KB in folders of 8, and two of 32 MB) and published to a directory store beside it.
With --source, that directory is copied and published the same way.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.cache import sync  # noqa: E402
from orchestrator.cache.manifest import sha256_file  # noqa: E402
from orchestrator.cache.store import open_store  # noqa: E402

NAMESPACE = "pull-beside"
# argv: none; stdin: one JSON line per file, [path, sha256]; stdout: the paths that differ
HASHER = r"""
import hashlib, json, sys
differ = []
for line in sys.stdin:
    path, want = json.loads(line)
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        differ.append(path)
        continue
    if digest.hexdigest() != want:
        differ.append(path)
print(json.dumps(differ))
"""


def generate(directory: Path, files: int) -> None:
    rng = random.Random(0)
    for i in range(files):
        folder = directory / "triton" / f"{i // 8:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"kernel-{i}.bin").write_bytes(rng.randbytes(rng.randint(2_000, 60_000)))
    for i in range(2):
        (directory / f"aot-{i}.bin").write_bytes(rng.randbytes(32 << 20))


def python_work(steps: int) -> float:
    """Seconds of a fixed pure-Python loop: what holds the interpreter, as a model's build does."""
    started, total = time.perf_counter(), 0
    for i in range(steps):
        total += i * i % 7
    return time.perf_counter() - started


def beside(work: Callable[[], float], other: Callable[[], object]) -> tuple[float, float]:
    """`work`'s seconds while `other` runs on a thread, and `other`'s own."""
    took: list[float] = []

    def run() -> None:
        started = time.perf_counter()
        other()
        took.append(time.perf_counter() - started)

    thread = threading.Thread(target=run)
    thread.start()
    seconds = work()
    thread.join()
    return seconds, took[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="a namespace directory to copy (default: generated)")
    parser.add_argument("--files", type=int, default=3000, help="small files of the generated namespace")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pull-beside-") as scratch:
        root = Path(scratch)
        namespace = root / "namespace"
        if args.source:
            shutil.copytree(args.source, namespace, symlinks=True)
        else:
            generate(namespace, args.files)
        (root / "store").mkdir()
        store = open_store(f"file://{root / 'store'}")
        sync.publish(store, namespace, NAMESPACE, None, allow_unsigned=True)
        sync.pull(store, NAMESPACE, namespace, None, allow_unsigned=True)  # the applied marker in place
        present = sync.scan(namespace)
        listing = "".join(json.dumps([str(path), sha256_file(path)]) + "\n" for path, _ in present.values())
        size = sum(size for _, size in present.values())

        def pull() -> None:
            transfer = sync.pull(store, NAMESPACE, namespace, None, allow_unsigned=True)
            assert transfer is not None and transfer.files == 0, "the namespace changed under the benchmark"

        def hash_in_child() -> None:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", HASHER], input=listing, capture_output=True, text=True, check=True
            )
            assert json.loads(done.stdout) == [], "a file differs from its recorded hash"

        pulls = sorted(timed(pull) for _ in range(3))
        # about 60% of a pull alone: it starts and mostly ends inside the pull
        steps = 1_000_000
        steps = max(100_000, int(steps * 0.6 * pulls[1] / python_work(steps)))
        ways: dict[str, Callable[[], float]] = {
            "alone": lambda: python_work(steps),
            "beside the pull, on a thread": lambda: beside(lambda: python_work(steps), pull)[0],
            "beside the hashing, in a child process": lambda: beside(lambda: python_work(steps), hash_in_child)[0],
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(ways[name]())
    print(f"namespace: {len(present)} files, {size / 1e6:.0f} MB; a pull of it unchanged: {pulls[1] * 1e3:.0f} ms")
    alone = statistics.median(samples["alone"])
    for name, values in samples.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        median = statistics.median(values)
        print(f"  Python work {name}: {median * 1e3:.0f} ±{(q3 - q1) / 2 * 1e3:.0f} ms ({median / alone:.2f}x)")
    return 0


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
