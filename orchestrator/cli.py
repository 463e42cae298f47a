"""`orchestrate`: the command line. Parse -> validate -> run -> report; errors are one line.

Exit codes (docs/cli.md): 0 every bucket ok, 1 some bucket failed, 2 usage/config/setup error,
130 interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Optional

import click
from rich.console import Console

from orchestrator import __version__
from orchestrator.config import apply_overrides, cache_root, load_spec, parse_buckets
from orchestrator.errors import EXIT_BUCKET_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UserError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchestrate")
def cli() -> None:
    """Compile torch.compile models ahead of time, per input bucket, and prove they are warm and fast."""


@cli.command()
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config (see examples/).")
@click.option("--buckets", metavar="1,8,32", help="Bucket sizes; overrides the config's `buckets`.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), help="Overrides the config's `device`.")
@click.option("--cache-dir", metavar="DIR", help="Local cache root (node-local NVMe in production).")
@click.option("--fresh", is_flag=True, help="Delete this model's local cache namespace first: a cold compile.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the JSON report to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report on stdout.")
def warmup(model_path: str, buckets: Optional[str], device: Optional[str], cache_dir: Optional[str], fresh: bool,
           report_path: Optional[Path], as_json: bool) -> None:
    """Compile, warm up CUDA graphs and benchmark every bucket of a model against eager."""
    spec = load_spec(model_path)
    spec = apply_overrides(spec, buckets=None if buckets is None else parse_buckets(buckets), device=device,
                           cache_dir=cache_dir)
    if report_path:
        _check_writable(report_path)
    err = Console(stderr=True)
    started_at = datetime.now(timezone.utc)

    # torch is imported only once the config is known to be good: bad input fails in milliseconds.
    from jobs.engine import run_warmup
    from jobs.errors import SetupError
    from orchestrator.progress import BucketProgress
    from orchestrator.report import build_report, render_table, write_json

    try:
        with _stdout_to_stderr(as_json), BucketProgress(err) as progress:
            run = run_warmup(spec, cache_root(spec), fresh=fresh, progress=progress)
    except SetupError as exc:
        raise UserError(str(exc)) from None
    report = build_report(spec, run, started_at)
    if report_path:
        try:
            write_json(report, report_path)
        except OSError as exc:
            raise UserError(f"--report {report_path}: cannot write it ({exc.strerror or exc})") from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        out = Console()
        render_table(report, out if out.is_terminal else Console(width=160))
    if report["summary"]["buckets_failed"]:
        sys.exit(EXIT_BUCKET_FAILED)


def _check_writable(path: Path) -> None:
    """Fail before the run, not after it: an unwritable --report would lose the results."""
    if path.is_dir():
        raise UserError(f"--report {path}: is a directory; give a file path such as reports/{path.name or 'run'}.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--report {path}: cannot create its directory ({exc.strerror or exc})") from None
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"--report {path}: directory {path.parent} is not writable")


@contextlib.contextmanager
def _stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """With --json, stdout carries the report alone: route anything else that prints there
    (torch, compiler subprocesses writing to fd 1) to stderr for the duration of the run."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help())
        sys.exit(EXIT_OK)
    except click.exceptions.Abort:
        _fail("interrupted", EXIT_INTERRUPTED)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "orchestrate"
        _fail(f"{exc.format_message()} (see '{command} --help')", EXIT_USAGE)
    except UserError as exc:
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", EXIT_INTERRUPTED)
    sys.exit(EXIT_OK)


def _fail(message: str, code: int) -> None:
    click.echo(f"orchestrate: error: {message}", err=True)
    sys.exit(code)
