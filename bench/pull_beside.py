"""What a replica's pull of a namespace it already holds costs the Python work beside it.

    python bench/pull_beside.py [--source NAMESPACE_DIR] [--files 3000] [--rounds 15]

A replica pulls on its loader thread while its own thread builds the model (imports, module
construction: Python under the interpreter lock). A pull that fetches nothing reads no file whose
size, times and inode are what the last pull recorded of it (`.orchestrate-verified.json`),
and hashes every file where there is no such record. Here a fixed pure-Python loop stands for the
build, timed three ways, interleaved round by round (the order rotating):
  - alone;
  - beside a whole `sync.pull` of the unchanged namespace, on a thread (what a replica does);
  - beside the same pull with the record removed first: every file read and hashed (a directory
    filled some other way, or a pull before the record).
The loop is sized to about 60% of a pull that hashes every file, alone, so that it runs inside
that pull; slowed beside it, it may end just after, which understates the ratio. Figures: median
ms ± half the IQR, and the ratio to alone; and each kind of pull alone.

Without --source, a namespace shaped like Inductor's and Triton's caches is generated (`--files`
files of 2-60 KB in folders of 8, and two of 32 MB) and published to a directory store beside it.
With --source, that directory is copied and published the same way.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.cache import sync  # noqa: E402
from orchestrator.cache.store import open_store  # noqa: E402

NAMESPACE = "pull-beside"


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
        size = sum(size for _, size in present.values())

        def pull() -> None:
            transfer = sync.pull(store, NAMESPACE, namespace, None, allow_unsigned=True)
            assert transfer is not None and transfer.files == 0, "the namespace changed under the benchmark"

        def pull_reading_every_file() -> None:
            (namespace / sync.VERIFIED_RECORD).unlink()
            pull()

        time.sleep(0.05)  # past the filesystem's tick of the first pull's record: a replica starts seconds later
        pull()  # the files written in that tick recorded anew
        recorded = sorted(timed(pull) for _ in range(5))
        reading = sorted(timed(pull_reading_every_file) for _ in range(5))
        # about 60% of a pull that reads every file, alone: it starts and mostly ends inside that pull
        steps = 1_000_000
        steps = max(100_000, int(steps * 0.6 * reading[2] / python_work(steps)))
        ways: dict[str, Callable[[], float]] = {
            "alone": lambda: python_work(steps),
            "beside the pull, on a thread": lambda: beside(lambda: python_work(steps), pull)[0],
            "beside a pull reading every file": lambda: beside(lambda: python_work(steps), pull_reading_every_file)[0],
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(ways[name]())
    print(
        f"namespace: {len(present)} files, {size / 1e6:.0f} MB; a pull of it unchanged: {recorded[2] * 1e3:.0f} ms "
        f"[{recorded[0] * 1e3:.0f}-{recorded[-1] * 1e3:.0f}], reading every file {reading[2] * 1e3:.0f} ms "
        f"[{reading[0] * 1e3:.0f}-{reading[-1] * 1e3:.0f}] (medians [range] of 5)"
    )
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
