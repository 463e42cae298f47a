"""The fleet's live bars (a terminal is forced; in logs only lines are written): one bar per
bucket, counting compile units, loads and done, complete exactly when every rank is."""

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from conftest import ROOT
from rich.console import Console

from orchestrator.fleet.driver import FleetObserver
from orchestrator.jobs.records import BucketResult
from orchestrator.progress import FleetProgress


def warm(rank, bucket, status="ok"):
    return BucketResult(phase="warm", rank=rank, bucket=bucket, status=status)


def test_a_bar_per_bucket_counts_compiles_loads_and_ranks_done():
    seen = []
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with FleetProgress(console, on_record=seen.append) as progress:
        observer: FleetObserver = progress
        observer.planned(["1", "8"], units_per_point=1, ranks=2)
        observer.record(BucketResult(phase="compile", rank=None, bucket=1, status="ok"))
        observer.loaded(0, "1")
        bars = {task.description.split(" · ")[0]: task for task in progress._bars.tasks}
        assert bars["bucket    1"].description.endswith("compiled 1/1 · loaded 1/2 · done 0/2")
        assert (bars["bucket    1"].completed, bars["bucket    1"].total) == (2, 5)
        observer.loaded(1, "1")
        for rank in (0, 1):
            observer.record(warm(rank, 1))
        # bucket 8 failed to compile: its ranks never load it, yet its bar completes with their records
        observer.record(BucketResult(phase="compile", rank=None, bucket=8, status="failed"))
        for rank in (0, 1):
            observer.record(warm(rank, 8, status="failed"))
        bars = {task.description.split(" · ")[0]: task for task in progress._bars.tasks}
        assert all(task.finished for task in bars.values())
        assert bars["bucket    8"].description.endswith("compiled 1/1 · loaded 0/2 · done 2/2 (2 failed)")
        assert bars["bucket    1"].description.endswith("compiled 1/1 · loaded 2/2 · done 2/2")
    assert len(seen) == 6  # every record still reaches the metrics observer


def test_a_grid_has_a_bar_per_point():
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with FleetProgress(console) as progress:
        progress.planned(["1x8", "2x8"], units_per_point=1, ranks=1)
        progress.record(BucketResult(phase="compile", rank=None, bucket=2, point={"batch": 2, "seq": 8}, status="ok"))
        progress.loaded(0, "2x8")
        bars = {task.description.split(" · ")[0]: task for task in progress._bars.tasks}
        assert sorted(bars) == ["point 1x8", "point 2x8"]
        assert bars["point 2x8"].description.endswith("compiled 1/1 · loaded 1/1 · done 0/1")
        assert bars["point 1x8"].completed == 0  # bucket 2 of the other slice counts nowhere else


def test_in_logs_the_fleet_writes_lines_only():
    out = io.StringIO()
    with FleetProgress(Console(file=out, force_terminal=False, width=200)) as progress:
        progress.planned(["1"], units_per_point=1, ranks=1)
        progress.loaded(0, "1")
        progress.line("rank 0 (127.0.0.1) loaded bucket 1: ok")
    assert out.getvalue() == "rank 0 (127.0.0.1) loaded bucket 1: ok\n"


# What a terminal shows, from what was written to it: escape sequences (colours, cursor moves)
# dropped, each carriage return or newline ending a line
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _through_a_terminal(command: list[str], columns: int, tmp_path: Path) -> str:
    """Run `command` with stdout and stderr on a real pseudo-terminal `columns` wide; all it wrote."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "HOME": str(tmp_path), "TERM": "xterm-256color", "PYTHONPATH": str(ROOT)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    for name in ("COLUMNS", "LINES", "ORCHESTRATE_CACHE_DIR", "NO_COLOR"):
        env.pop(name, None)
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    written = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end closed: the process is done
            break
        if not chunk:
            break
        written += chunk
    os.close(leader)
    assert proc.wait(timeout=600) == 0, written.decode(errors="replace")[-3000:]
    return written.decode(errors="replace")


SMALL_MODEL = """
from torch import nn

def small():
    return nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64))
"""


@pytest.mark.slow
@pytest.mark.parametrize("path", [["--no-ray"], []], ids=["one-process", "ray"])
def test_at_80_columns_no_line_is_cut_or_runs_past_the_edge(tmp_path, path):
    """A real warmup, in one process and on a local Ray instance, on an 80-column terminal: the live
    bars, the progress lines, the table and its footer all fit, and nothing is cut with an
    ellipsis. (A small model: what is laid out does not depend on its size.)"""
    (tmp_path / "models.py").write_text(SMALL_MODEL)
    # a long name: the namespace in the footer must fold, not run past the edge
    (tmp_path / "mlp.yaml").write_text(
        "name: sentence-transformers-all-minilm-l12-v2-multilingual-paraphrase-encoder\n"
        "model: {factory: models.py:small}\ninputs: [{shape: [batch, 64]}]\n"
    )
    text = _through_a_terminal(
        [sys.executable, "-m", "orchestrator", "warmup", "--model", str(tmp_path / "mlp.yaml"), "--buckets", "1,2"]
        + ["--device", "cpu", *path, "--cache-dir", str(tmp_path / "cache")],
        80,
        tmp_path,
    )
    lines = [line.rstrip() for line in re.split(r"[\r\n]", _ESCAPE.sub("", text))]
    assert "…" not in text
    # every line fits; only a word longer than the terminal (a path) cannot fold between words
    assert [line for line in lines if len(line) > 80 and " " in line.strip()] == []
    # the footer is there, wrapped (on Ray it starts with the compile wave)
    assert any(line.startswith(("cache cold (", "compile wave cold (")) for line in lines), lines[-40:]
    # and the table's rows (on Ray with the ranks that are ok: "1  1/1 ok")
    assert any(re.match(r"1 +(\d+/\d+ )?ok", line.lstrip()) for line in lines), lines[-40:]


def test_a_line_of_ours_folds_between_words_in_a_terminal_and_stays_whole_in_a_pipe():
    import fcntl
    import os
    import struct
    import termios

    from orchestrator.progress import say

    banner = (
        "orchestrate: serving tiny-grid at http://127.0.0.1:8000/predict and http://127.0.0.1:8000/v2 "
        "(cpu; 1x8: compiled, 4x8: compiled, 1x16: eager, 4x16: compiled; answering in 3.2 s); Ctrl-C stops"
    )
    pipe = io.StringIO()
    say(banner, pipe)
    assert pipe.getvalue() == banner + "\n"  # for whatever reads it: one line, as it is
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with os.fdopen(follower, "w") as terminal:
        say(banner, terminal)
    shown = os.read(leader, 65536).decode().replace("\r", "").splitlines()
    os.close(leader)
    assert len(shown) > 1 and all(len(line) <= 80 for line in shown), shown
    assert " ".join(line.strip() for line in shown) == banner  # folded between words, nothing lost
    assert all(line.startswith("  ") for line in shown[1:])


def test_in_an_80_column_terminal_each_fleet_bar_is_one_line():
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with FleetProgress(console) as progress:
        progress.planned(["1", "32", "8x256", "32x256"], units_per_point=2, ranks=16)
        progress.loaded(3, "32x256")
        shown = Console(file=io.StringIO(), force_terminal=True, width=80, record=True)
        shown.print(progress._bars.get_renderable())
        lines = [line for line in shown.export_text().splitlines() if line.strip()]
    assert len(lines) == 4 and all(len(line) <= 80 for line in lines), lines
    assert lines[3].startswith("point 32x256 · compiled 0/2 · loaded 1/16 · done 0/16"), lines[3]


LOUD_LIBRARY = """
import sys, threading, warnings
from pathlib import Path
from rich.console import Console
from orchestrator.fleet.driver import FleetObserver
from orchestrator.progress import FleetProgress, RunLog

with RunLog(Path(sys.argv[1]), "loud") as log:
    with FleetProgress(Console(file=log.screen)) as progress:
        progress.planned(["1"], units_per_point=1, ranks=1)
        # as Ray's error listener does, from its own thread, while the bars are live
        said = threading.Thread(target=print, args=("(raylet) Task CompileWorker.compile failed",))
        said.start()
        said.join()
        warnings.warn("a library's warning")
        progress.line("rank 0 loaded bucket 1: ok")
print("log", log.kept, file=sys.stderr)
"""


def test_what_libraries_print_while_the_bars_are_live_goes_to_the_run_log(tmp_path):
    """Ray prints a task's failure (on Ctrl-C: every task its actors had running) to sys.stdout, and
    warnings go to sys.stderr: in a terminal, with the bars live, both must reach the run log,
    not the screen, whose only lines are ours."""
    text = _through_a_terminal([sys.executable, "-c", LOUD_LIBRARY, str(tmp_path / "logs")], 80, tmp_path)
    assert "rank 0 loaded bucket 1: ok" in text
    assert "raylet" not in text and "a library's warning" not in text
    (kept,) = (tmp_path / "logs").iterdir()
    assert f"log {kept}" in text
    logged = kept.read_text()
    assert "(raylet) Task CompileWorker.compile failed" in logged and "a library's warning" in logged
