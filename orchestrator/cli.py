"""`orchestrate`: the command line. Parse -> validate -> run -> report; errors are one line.

Exit codes (README.md, "Exit codes"): 0 ok, 1 some bucket failed, 2 usage/config/setup error
(an unwritable --report, a store backend not installed, a missing --signing-key-file included:
all found before anything runs), 3 store unreachable or refusing, 4 untrusted cache data refused,
5 pull found no namespace, 6 Ray cluster unreachable, 130 interrupted.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, cast

import click
from rich.console import Console

from orchestrator import __version__
from orchestrator.cache.manifest import IntegrityError
from orchestrator.cache.store import StoreError, UnsupportedStore, check_url
from orchestrator.config import (
    cache_root,
    check_cache_dir,
    default_cache_root,
    embedded_store,
    format_bucket_dims,
    load_spec_with_overrides,
)
from orchestrator.errors import (
    EXIT_BUCKET_FAILED,
    EXIT_INTERRUPTED,
    EXIT_MISS,
    EXIT_OK,
    EXIT_STORE,
    EXIT_UNTRUSTED,
    EXIT_USAGE,
    UserError,
    exit_code_named,
    exit_code_of,
)
from orchestrator.jobs.spec import READY_WHEN, ReadyWhen


def _publish_options(command):
    """--signing-key-file, for the command that publishes (warmup); it also takes _store_options."""
    return click.option(
        "--signing-key-file",
        metavar="FILE",
        callback=_existing_key_file,
        help="Ed25519 private key that signs what is published (default $ORCHESTRATE_CACHE_SIGNING_KEY_FILE, "
        "then $ORCHESTRATE_CACHE_SIGNING_KEY; make one with `orchestrate keys new DIR`).",
    )(command)


def _store_options(command):
    """--remote, --allow-unsigned and --trust, shared by every command that uses a store."""
    command = click.option(
        "--trust",
        "trust",
        multiple=True,
        metavar="FILE",
        callback=_existing_key_file,
        help="Public key file whose manifests are accepted; repeatable (with $ORCHESTRATE_CACHE_TRUSTED_KEYS, "
        "and the signing key's own public half).",
    )(command)
    command = click.option(
        "--allow-unsigned", is_flag=True, help="Accept and write unsigned manifests (local experiments only)."
    )(command)
    return click.option(
        "--remote",
        metavar="URL",
        envvar="ORCHESTRATE_REMOTE",
        help="Shared store: s3://bucket/prefix, file:///dir or any fsspec URL "
        "(default $ORCHESTRATE_REMOTE, then the config's `remote`).",
    )(command)


def _trusted(trust: tuple[str, ...], signing_key_file: Optional[str] = None):
    """The public keys a command accepts: --trust files, $ORCHESTRATE_CACHE_TRUSTED_KEYS, and the
    public half of the signing key it is configured with. Read here, so a missing or wrong key
    file fails before any work, in one line."""
    from orchestrator.cache.manifest import SigningKey, TrustedKeys

    own = SigningKey.from_env(signing_key_file) if signing_key_file else None
    return TrustedKeys.load(trust).plus(own.public if own else None)


def _existing_key_file(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A key file (--signing-key-file, each --trust) that is not there is a mistyped path (exit 2),
    found before anything runs."""
    for path in value if isinstance(value, tuple) else [value] if value is not None else []:
        if not Path(path).expanduser().is_file():
            problem = "is a directory" if Path(path).expanduser().is_dir() else "does not exist"
            option = "--" + (param.name or "key").replace("_", "-")
            raise UserError(f"{option} {path}: {problem}; pass the path of the key file (e.g. a mounted Secret)")
    return value


def _check_store(url: Optional[str]) -> None:
    """A store whose backend is not installed here fails now, not after Ray and torch have started."""
    if url:
        try:
            check_url(url)
        except UnsupportedStore as exc:
            raise UserError(str(exc)) from None


def _local_store_option(command):
    return click.option(
        "--cache-dir",
        metavar="DIR",
        help="Local cache root: its store is the default one, as for warmup; repair rebuilds shards "
        "from its files (default $ORCHESTRATE_CACHE_DIR, then ~/.cache/orchestrate).",
    )(command)


def _buckets_option(command):
    """--buckets, the same for every command that runs or renders a warmup (load_spec_with_overrides)."""
    return click.option(
        "--buckets",
        metavar="1,8,32",
        help="Bucket sizes, or a grid's by dimension ('batch=1,8 seq=32,128'); overrides the config's `buckets`.",
    )(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchestrate")
def cli() -> None:
    """Compile torch.compile models ahead of time, per input bucket, and prove they are warm and fast.

    \b
    Example:
      orchestrate warmup --model examples/mlp.yaml --buckets 1,8,32
    Exit codes:
        0  ok
        1  a bucket failed
        2  usage/config/setup error
        3  store unreachable or refusing
        4  untrusted cache data refused
        5  pull found nothing published
        6  Ray cluster unreachable
      130  interrupted
    """


@cli.command()
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config (see examples/).")
@_buckets_option
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), help="Overrides the config's `device`.")
@click.option("--cache-dir", metavar="DIR", help="Local cache root (node-local NVMe in production).")
@click.option("--fresh", is_flag=True, help="Delete this model's local cache namespace first: a cold compile.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the JSON report to this file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report on stdout.")
@click.option(
    "--wide", is_flag=True, help="Table: one row per record (each rank on Ray) with every field, not one per bucket."
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report as one self-contained HTML page with charts (the `report` extra).",
)
@click.option("--ray-address", metavar="ADDR", help="Join this Ray cluster (default: start a local one).")
@click.option(
    "--ranks", type=click.IntRange(min=1), help="Warm this many ranks (default: every GPU; one per node on CPU)."
)
@click.option(
    "--no-ray",
    is_flag=True,
    help="Run everything in this process, no Ray; the same store as on Ray (--remote, else the one beside the cache).",
)
@click.option("--pushgateway", metavar="URL", help="Push metrics here at the end (pushadd; job + model grouping).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), help="Serve /metrics on this port while running.")
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(path_type=Path),
    help="After each bucket's benchmark, profile eager, compiled and the served variant: Chrome traces "
    "into this directory (on Ray: on each rank's node), kernel accounting into the report.",
)
@_store_options
@_publish_options
def warmup(
    model_path: str,
    buckets: Optional[str],
    device: Optional[str],
    cache_dir: Optional[str],
    fresh: bool,
    report_path: Optional[Path],
    as_json: bool,
    wide: bool,
    html_path: Optional[Path],
    ray_address: Optional[str],
    ranks: Optional[int],
    no_ray: bool,
    pushgateway: Optional[str],
    metrics_port: Optional[int],
    profile_dir: Optional[Path],
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
    signing_key_file: Optional[str],
) -> None:
    """Compile, warm up CUDA graphs and benchmark every bucket of a model against eager.

    On Ray (the default; a local instance unless --ray-address): each bucket is compiled once
    per GPU class and published to the store, then every rank pulls, loads and benchmarks.
    The store is --remote (or the config's `remote`), else a directory beside the cache.

    \b
    Example:
      orchestrate warmup --model examples/mlp.yaml --buckets 1,8,32
    Exit codes:
        0  ok
        1  a bucket failed
        2  usage/config/setup error
        3  store unreachable or refusing
        4  untrusted cache data refused
        6  Ray cluster unreachable
      130  interrupted
    """
    spec = load_spec_with_overrides(model_path, buckets=buckets, device=device, cache_dir=cache_dir)
    if report_path:
        _check_writable(report_path)
    if html_path:
        _check_html(html_path)
    if profile_dir:
        profile_dir = _check_profile_dir(profile_dir)
    store_url = remote or spec.remote
    _check_store(store_url)
    started_at = datetime.now(timezone.utc)

    # torch is imported only once the config is known to be good: bad input fails in milliseconds.
    from orchestrator.jobs.errors import SetupError
    from orchestrator.jobs.spec import check_inputs_fit

    try:
        check_inputs_fit(spec)
    except SetupError as exc:
        raise UserError(str(exc)) from None
    from orchestrator.jobs.records import Remote
    from orchestrator.reports.report import render_profile, render_table, write_json

    trusted = _trusted(trust, signing_key_file).pems()
    remote_store = Remote(store_url, allow_unsigned, signing_key_file, trusted) if store_url else None
    metrics = _metrics(spec, metrics_port) if (pushgateway or metrics_port) else None
    observe = metrics.observe if metrics else (lambda record: None)
    report, clock = None, time.perf_counter()
    log = _run_log(spec, "warmup")
    try:
        with log:
            err = Console(file=log.screen)

            def run(part):
                if no_ray:
                    return _in_process(
                        part, fresh, remote_store, allow_unsigned, trust, err, observe, started_at, profile_dir
                    )
                return _on_ray(
                    part,
                    fresh,
                    remote_store,
                    allow_unsigned,
                    trust,
                    ray_address,
                    ranks,
                    err,
                    observe,
                    started_at,
                    profile_dir,
                )

            if spec.grid and no_ray:
                report, publish_errors = _grid(spec, run, err)
            else:  # on Ray, a grid's points fan out at once, as buckets do
                report, publish_errors = run(spec)
    except SetupError as exc:
        raise UserError(_pointing_at(log.kept, str(exc))) from None
    except (UserError, StoreError, IntegrityError) as exc:
        if len(exc.args) == 1 and isinstance(exc.args[0], str):  # still the one line, with where the rest went
            exc.args = (_pointing_at(log.kept, exc.args[0]),)
        raise
    finally:
        # in `finally`: a failed or interrupted run is pushed too, and never moves last-success
        if metrics:
            metrics.finish(report) if report else metrics.fail(time.perf_counter() - clock)
            warning = metrics.push(pushgateway) if pushgateway else None
            if warning:
                click.echo(f"orchestrate: warning: {warning}", err=True)
    if report_path:
        try:
            write_json(report, report_path)
        except OSError as exc:
            raise UserError(f"--report {report_path}: cannot write it ({exc.strerror or exc})") from None
    if html_path:
        _write_html(report, html_path)
    if log.kept:
        from orchestrator.progress import say

        say(f"orchestrate: torch's, Ray's and the compilers' own output is in {log.kept}", sys.stderr)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        console = _table_console(wide)
        render_table(report, console, wide=wide)
        if any(r.get("profile") for r in report["results"]):
            render_profile(report, console)
    if publish_errors:
        _fail(f"publish failed, results above stand: {publish_errors[0]}", EXIT_STORE)
    if report["summary"]["buckets_failed"]:
        sys.exit(EXIT_BUCKET_FAILED)


def _grid(spec, run, err: Console):
    """A grid's warmup in this process: its slices one after another, each as a list-form
    config, their reports as one (reports.report.grid_report)."""
    from orchestrator.reports.report import grid_report

    parts = spec.slices()
    reports, errors = [], []
    for i, part in enumerate(parts, start=1):
        fixed = ", ".join(f"{dim} {size}" for dim, size in part.fixed.items())
        err.print(f"grid: {fixed} ({i}/{len(parts)}): {spec.bucket_symbol} {', '.join(map(str, part.buckets))}")
        report, publish_errors = run(part)
        reports.append(report)
        errors += publish_errors
    return grid_report(spec, reports), errors


def _in_process(
    spec,
    fresh: bool,
    remote_store,
    allow_unsigned: bool,
    trust: tuple[str, ...],
    err: Console,
    observe,
    started_at: datetime,
    profile_dir: Optional[Path] = None,
):
    """Every bucket compiled, warmed and measured in this process. The store defaults to the one
    beside the cache, as on Ray: a Ray warmup's ranks pull into their node's directory, not into
    the namespace directory this process compiles in, so the store is where the two meet (either
    one run after the other hits the cache)."""
    from orchestrator.jobs import aot_builds, fresh_benchmark

    # before torch's import here, which the children then make beside it
    aot_builds.prestart(spec)
    fresh_benchmark.prestart(spec)

    from orchestrator.jobs.engine import run_warmup
    from orchestrator.progress import BucketProgress
    from orchestrator.reports.report import build_report

    remote_store = remote_store or embedded_store(cache_root(spec), allow_unsigned, trust)
    with BucketProgress(err, on_result=observe) as progress:
        run = run_warmup(
            spec, cache_root(spec), fresh=fresh, progress=progress, remote=remote_store, profile_dir=profile_dir
        )
    return build_report(spec, run, started_at), [run.publish_error] if run.publish_error else []


def _on_ray(
    spec,
    fresh: bool,
    remote_store,
    allow_unsigned: bool,
    trust: tuple[str, ...],
    ray_address: Optional[str],
    ranks: Optional[int],
    err: Console,
    observe,
    started_at: datetime,
    profile_dir: Optional[Path] = None,
):
    """Compile wave and warm wave on Ray (a grid's every point at once); the store defaults to a
    signed directory beside the cache."""
    from orchestrator.fleet.driver import run_on_ray
    from orchestrator.progress import FleetProgress
    from orchestrator.reports.report import build_fleet_report, grid_report

    remote_store = remote_store or embedded_store(cache_root(spec), allow_unsigned, trust)
    with FleetProgress(err, on_record=observe) as progress:
        fleets = run_on_ray(
            spec,
            cache_root(spec),
            remote_store,
            address=ray_address,
            ranks=ranks,
            fresh=fresh,
            observer=progress,
            profile_dir=profile_dir,
        )
    reports = [
        build_fleet_report(part, fleet, remote_store.url, started_at)
        for part, fleet in zip(spec.slices(), fleets, strict=True)
    ]
    errors = [error for report in reports for error in report["remote"]["publish_errors"]]
    return (grid_report(spec, reports) if spec.grid else reports[0]), errors


def _metrics(spec, port: Optional[int]):
    from orchestrator.reports.metrics import WarmupMetrics

    metrics = WarmupMetrics(spec.name, spec.compile.mode)
    if port:
        try:
            metrics.serve(port)
        except OSError as exc:
            raise UserError(f"--metrics-port {port}: cannot listen ({exc.strerror}); pick a free port") from None
    return metrics


@cli.command()
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config.")
@click.option(
    "--to",
    "to_dir",
    metavar="DIR",
    help="Directory to fill (default: the namespace's directory under --cache-dir, where `orchestrate serve "
    "--cache-dir` loads from); a server of its own sets TORCHINDUCTOR_CACHE_DIR=DIR/inductor, "
    "TRITON_CACHE_DIR=DIR/triton.",
)
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), help="Overrides the config's `device`.")
@click.option("--allow-miss", is_flag=True, help="Exit 0 when the namespace was never published (with a warning).")
@click.option("--json", "as_json", is_flag=True, help="Print what was pulled as JSON on stdout.")
@_local_store_option
@_store_options
def pull(
    model_path: str,
    to_dir: Optional[str],
    device: Optional[str],
    cache_dir: Optional[str],
    allow_miss: bool,
    as_json: bool,
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
) -> None:
    """Fill a serving replica's cache directory from the store (for init containers).

    A namespace never published for this platform exits 5 with one line naming the platforms this
    model's config was published for, if any, beside this one.

    \b
    Example:
      orchestrate pull --model examples/mlp.yaml --cache-dir /nvme/cache --remote s3://bucket/cache
    Exit codes:
        0  pulled (or missed with --allow-miss)
        2  usage/config error
        3  store unreachable or refusing
        4  untrusted cache data refused
        5  never published for this platform
      130  interrupted
    """
    spec = load_spec_with_overrides(model_path, device=device, cache_dir=cache_dir)
    store_url = remote or spec.remote
    _check_store(store_url)
    from orchestrator.cache import sync
    from orchestrator.cache.manifest import TrustedKeys
    from orchestrator.cache.namespace import namespace as namespace_of
    from orchestrator.cache.store import open_store
    from orchestrator.jobs.errors import SetupError
    from orchestrator.jobs.platform_probe import cache_platform  # imports torch only where it must

    try:
        platform = cache_platform(spec)
    except SetupError as exc:
        raise UserError(str(exc)) from None
    if spec.grid and to_dir:
        raise UserError("--to: a grid of buckets pulls one namespace per slice; pass --cache-dir instead")
    if store_url:
        trusted = _trusted(trust)
    else:  # the store warmup publishes to when it is given none, with its own public key
        embedded = embedded_store(cache_root(spec), allow_unsigned, trust)
        store_url, trusted = embedded.url, TrustedKeys.from_pems(embedded.trusted)
    store = open_store(store_url)
    # a grid's slices each have a namespace of their own (WarmupSpec.slices)
    summaries = []
    for part in spec.slices():
        namespace = namespace_of(part.label, platform, part.identity_hash())
        # the directory runtime.load and `orchestrate serve` read for this namespace under the cache root
        target = (Path(to_dir).expanduser() if to_dir else cache_root(spec) / namespace).resolve()
        if target.exists() and not target.is_dir():  # a pull would move it aside and fill a directory in its place
            raise UserError(f"--to {target}: a file, not a directory; name the directory to fill (made where missing)")
        transfer = sync.pull(store, namespace, target, trusted, allow_unsigned=allow_unsigned)
        summary: dict[str, Any] = {
            "namespace": namespace,
            "to": str(target),
            "remote": store_url,
            "hit": transfer is not None,
            **(asdict(transfer) if transfer else {}),
        }
        summaries.append(summary)
        if transfer is None:
            elsewhere = sync.published_elsewhere(
                store, part.label, part.identity_hash(), trusted, allow_unsigned=allow_unsigned
            )
            summary["platform"] = asdict(platform)
            summary["published"] = [asdict(found) for found in elsewhere]
            reason = _miss_reason(namespace, store_url, part.label, platform, elsewhere, allow_miss)
            if not allow_miss:
                if as_json:
                    click.echo(json.dumps(summaries if spec.grid else summary, indent=2))
                _fail(reason, EXIT_MISS)
            click.echo(f"orchestrate: warning: {reason}; starting cold (--allow-miss)", err=True)
        elif not as_json:
            click.echo(
                f"{namespace}: generation {transfer.generation}, {transfer.files} files "
                f"({transfer.bytes / 1e6:.1f} MB in {transfer.shards} shards) in {transfer.seconds:.2f} s -> {target}",
                err=True,
            )
    if as_json:
        click.echo(json.dumps(summaries if spec.grid else summaries[0], indent=2))


MAX_PLATFORMS_NAMED = 3  # in the one line a miss prints; --json lists every one read


def _miss_reason(
    namespace: str, store_url: str, model: str, here: Any, elsewhere: list[Any], allow_miss: bool = False
) -> str:
    """Why a pull missed, in one line: the platforms this model's config was published for and
    this one, by the fields that tell them apart; otherwise that nothing was published for it."""
    from orchestrator.cache.namespace import describe, differing

    missing = f"namespace {namespace} was never published to {store_url}"
    if not elsewhere:
        # with --allow-miss given, the line goes on to say that it starts cold
        return f"{missing}; run `orchestrate warmup --remote` first" + (
            "" if allow_miss else ", or pass --allow-miss to start cold"
        )
    exact = [found for found in elsewhere if found.same_config]
    shown = exact or elsewhere
    subject = (
        "this model's config was warmed"
        if exact
        else f"a model named {model} was warmed (probably this config: its manifests do not record one)"
    )
    fields = differing(here, [found.platform for found in shown])
    platforms = list(dict.fromkeys(describe(found.platform, fields) for found in shown))
    named = " and for ".join(platforms[:MAX_PLATFORMS_NAMED])
    if len(platforms) > MAX_PLATFORMS_NAMED:
        named += f" (and {len(platforms) - MAX_PLATFORMS_NAMED} more)"
    hints = []
    if "gpu_name" in fields:
        hints.append("on a node with that GPU" if len(platforms) == 1 else "on a node with one of those GPUs")
    if any(name != "gpu_name" for name in fields):
        hints.append("with the warmup's image")
    return (
        f"{missing}: {subject} for {named}, but this pod is {describe(asdict(here), fields)}; "
        f"run this pod {' and '.join(hints)}, or warm this platform (`orchestrate warmup --remote` on it)"
    )


@cli.command()
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config (see examples/).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address Serve's HTTP proxy listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Its port.")
@_buckets_option
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), help="Overrides the config's `device`.")
@click.option("--cache-dir", metavar="DIR", help="Local cache root the replica loads from (as warmup's).")
@click.option("--ray-address", metavar="ADDR", help="Join this Ray cluster (default: start a local one).")
@click.option(
    "--require-warm",
    is_flag=True,
    help="Refuse a compiled bucket that misses the cache, and a bucket never warmed for this platform: it "
    "stays on eager (with --ready planned the server does not start).",
)
@click.option(
    "--ready",
    type=click.Choice(READY_WHEN),
    default="answering",
    show_default=True,
    help="Take requests once every bucket answers (eager until its planned variant is loaded, in the "
    "background), or only once every bucket is on its plan.",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(min=1),
    help="Requests joined into one call (default: the largest bucket); 1 runs each alone.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="The replica serves Prometheus /metrics on this port (on --host): load, variants, padding.",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help='A request whose body has not arrived whole by then is answered 408 (docs/serving.md, "Limits").',
)
@_store_options
def serve(
    model_path: str,
    host: str,
    port: int,
    buckets: Optional[str],
    device: Optional[str],
    cache_dir: Optional[str],
    ray_address: Optional[str],
    require_warm: bool,
    ready: str,
    max_batch_size: Optional[int],
    metrics_port: Optional[int],
    body_timeout: float,
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
) -> None:
    """Serve the warmed model over HTTP on Ray Serve until Ctrl-C: POST /predict {"inputs": [...]}.

    One replica builds the model and takes requests as soon as every bucket answers, eager at first;
    each bucket switches to its planned variant from the cache (pulled from --remote, or the store
    beside the cache, first) as soon as that is loaded (`--ready planned`: take requests only then).
    Requests that arrive together run as one call.

    \b
    Example:
      orchestrate serve --model examples/mlp.yaml --port 8000 --require-warm
    Exit codes:
        0  stopped by Ctrl-C or SIGTERM
        2  usage/config error or a replica that failed to load
        3  store unreachable or refusing
        4  untrusted cache data refused
        6  Ray cluster unreachable
      130  interrupted before ready
    """
    spec = load_spec_with_overrides(model_path, buckets=buckets, device=device, cache_dir=cache_dir)
    _check_serve_installed()
    store_url = remote or spec.remote
    _check_store(store_url)
    trusted = _trusted(trust).pems()
    from orchestrator.fleet.driver import preflight
    from orchestrator.jobs.errors import SetupError
    from orchestrator.jobs.records import Remote
    from orchestrator.serving.server import ServeFailed, block_until_signalled, check_port, run_server

    try:
        preflight(spec)
    except SetupError as exc:
        raise UserError(str(exc)) from None
    if metrics_port is not None and metrics_port == port:
        raise UserError(f"--metrics-port {metrics_port} is also --port; pick another")
    if not ray_address:  # a cluster's proxy and replica run on its nodes, not here
        problem = check_port(host, port) or (metrics_port and check_port(host, metrics_port, "--metrics-port"))
        if problem:
            raise UserError(problem)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its INFO lines would bury the ready line
    where = f"the Ray cluster at {ray_address}" if ray_address else "a local Ray instance"
    log = _run_log(spec, "serve")

    def say(line: str) -> None:
        from orchestrator.progress import say as say_on

        say_on(line, log.screen)

    def on_ready(url: str, info: dict[str, Any]) -> None:
        variants = ", ".join(f"{bucket}: {row['variant']}" for bucket, row in info["buckets"].items())
        loading = [str(bucket) for bucket, row in info["buckets"].items() if row["loading"]]
        state = (
            f"answering in {info['ready_seconds']:.1f} s"
            if ready == "answering"
            else (f"on plan in {info['ready_seconds']:.1f} s")
        )
        if loading:
            state += f"; buckets {', '.join(loading)} switch to their plans as they load (GET /info)"
        v2 = url.rsplit("/predict", 1)[0] + "/v2"  # the Open Inference Protocol, beside /predict
        say(
            f"orchestrate: serving {spec.label} at {url} and {v2} ({info['device']}; {variants}; {state}); Ctrl-C stops"
        )

    try:
        # Ray's and Serve's own lines (a task retried while Serve shuts down, a replica's start)
        # go to the run's log, off a screen that holds this command's lines alone
        with log:
            say(f"orchestrate: loading {spec.label} (buckets {format_bucket_dims(spec)}) on {where}")
            if log.redirected:
                say(f"orchestrate: Ray's, Serve's and torch's own output goes to {log.path}")
            run_server(
                spec,
                host=host,
                port=port,
                ray_address=ray_address,
                remote=Remote(store_url, allow_unsigned, trusted=trusted) if store_url else None,
                require_warm=require_warm,
                ready_when=cast(ReadyWhen, ready),
                max_batch_size=max_batch_size,
                body_seconds=body_timeout,
                trusted=tuple(trusted),
                metrics_port=metrics_port,
                on_ready=on_ready,
                until=block_until_signalled,
            )
    except SetupError as exc:
        raise UserError(_pointing_at(log.kept, str(exc))) from None
    except ServeFailed as exc:
        # the replica's exception crossed Ray as text: its class name says which exit code it means
        _fail(_pointing_at(log.kept, str(exc)), exit_code_named(exc.kind))
    click.echo("orchestrate: stopped", err=True)


def _cluster_shape_options(image_required: bool):
    """The options that shape the pods, the same for `render k8s` and `submit --k8s`."""

    def decorate(command):
        options = [
            click.option(
                "--image",
                required=image_required,
                metavar="IMAGE",
                help="The one image of warmup and serving pods, pinned (a version tag or @sha256 digest).",
            ),
            click.option("--namespace", default="default", show_default=True, help="Kubernetes namespace."),
            click.option(
                "--workers", type=click.IntRange(min=1), default=1, show_default=True, help="GPU worker pods."
            ),
            click.option("--gpus-per-worker", type=click.IntRange(min=1), default=1, show_default=True),
            click.option(
                "--gpu",
                metavar="NAME",
                help="Pin warmup and serving pods to nodes with this GPU, named as CUDA names it "
                "('NVIDIA H200'; matched on nvidia.com/gpu.product).",
            ),
            click.option(
                "--serving-replicas",
                type=click.IntRange(min=0),
                default=2,
                show_default=True,
                help="Serving pods (0: the warmup alone).",
            ),
            click.option(
                "--ready",
                type=click.Choice(READY_WHEN),
                default="answering",
                show_default=True,
                help="Serving pods turn ready (take traffic) once every bucket answers, eager until its planned "
                "variant is loaded, or once every bucket is on its plan (docs/serving.md).",
            ),
            click.option("--service-account", metavar="NAME", help="The pods' service account."),
            click.option(
                "--cache-volume",
                default="emptyDir",
                show_default=True,
                metavar="emptyDir|pvc:NAME|hostPath:/PATH",
                help="The pods' compile-cache volume; a hostPath (node-local NVMe shared across pods) is outside "
                "the restricted Pod Security profile.",
            ),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@cli.command()
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config.")
@_buckets_option
@click.option("--ray-address", metavar="URL", help="The Ray dashboard (Jobs API), e.g. http://head:8265.")
@click.option("--k8s", "as_k8s", is_flag=True, help="Kubernetes instead: the manifests of `render k8s`.")
@click.option(
    "--apply",
    is_flag=True,
    help="--k8s: server-side apply them to the cluster of the kubeconfig (or the pod's account).",
)
@_cluster_shape_options(image_required=False)
@click.option("--remote", metavar="URL", help="Shared store the job pulls from and publishes to.")
@click.option("--pushgateway", metavar="URL", help="Pushgateway the job pushes its metrics to.")
@click.option("--wait", is_flag=True, help="Follow the job's logs and exit with its outcome.")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --wait: write the job's JSON report here.",
)
def submit(
    model_path: str,
    buckets: Optional[str],
    ray_address: Optional[str],
    as_k8s: bool,
    apply: bool,
    remote: Optional[str],
    pushgateway: Optional[str],
    wait: bool,
    report_path: Optional[Path],
    **shape: Any,
) -> None:
    """Run a warmup on a Ray cluster (Jobs API) or on Kubernetes (a KubeRay RayJob, and the serving
    Deployment that starts from what it publishes).

    \b
    Example:
      orchestrate submit --model examples/mlp.yaml --ray-address http://head:8265 --wait
    Exit codes:
        0  submitted (with --wait: succeeded)
        1  the job failed or was stopped
        2  usage/config error
        3  the Kubernetes API refused --apply
        6  Ray cluster unreachable
      130  interrupted
    """
    spec = load_spec_with_overrides(model_path, buckets=buckets)
    remote = remote or spec.remote
    if as_k8s:
        if not shape["image"]:
            raise UserError("--k8s needs --image (a container image with orchestrate, torch and ray)")
        documents = _k8s_documents(spec, Path(model_path), shape, remote, pushgateway)
        if apply:
            from orchestrator.deployment.k8s import ApplyFailed, apply_manifests

            try:
                apply_manifests(documents, log=lambda line: click.echo(line, err=True))
            except ApplyFailed as exc:
                _fail(str(exc), EXIT_STORE)
        else:
            from orchestrator.deployment.k8s import to_yaml

            click.echo(to_yaml(documents), nl=False)
        return
    if apply:
        raise UserError("--apply goes with --k8s")
    if not ray_address:
        raise UserError("submit needs --ray-address http://head:8265 (the Ray dashboard), or --k8s")
    if report_path:
        _check_writable(report_path)
    from orchestrator.deployment.submit import exit_code_for
    from orchestrator.deployment.submit import submit as submit_job

    extra = (["--remote", remote] if remote else []) + (["--pushgateway", pushgateway] if pushgateway else [])
    outcome = submit_job(
        ray_address,
        spec,
        Path(model_path).resolve(),
        extra_args=extra,
        wait=wait,
        log=lambda line: click.echo(line, err=True),
    )
    if report_path and outcome.report:
        write_report = __import__("orchestrator.reports.report", fromlist=["write_json"]).write_json
        write_report(outcome.report, report_path)
    click.echo(
        json.dumps(
            {
                "submission_id": outcome.submission_id,
                "status": outcome.status,
                "new": outcome.new,
                "message": outcome.message,
            }
        )
    )
    if exit_code_for(outcome):
        _fail(f"job {outcome.submission_id} {outcome.status}: {outcome.message}", exit_code_for(outcome))


@cli.command("report")
@click.argument("report_file", metavar="REPORT.json", type=click.Path(path_type=Path))
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one self-contained HTML page with charts here instead of printing the table.",
)
@click.option(
    "--wide", is_flag=True, help="Table: one row per record (each rank on Ray) with every field, not one per bucket."
)
def report_command(report_file: Path, html_path: Optional[Path], wide: bool) -> None:
    """Show a warmup report (from `warmup --report PATH` or `--json`) as the table, or as an HTML page.

    \b
    Example:
      orchestrate report report.json --html report.html
    Exit codes:
        0  shown or written
        2  not a readable warmup report, or OUT.html cannot be written
    """
    if html_path:
        _check_html(html_path)
    report = _load_report(report_file)
    if html_path:
        _write_html(report, html_path)
        click.echo(f"orchestrate: wrote {html_path}", err=True)
        return
    from orchestrator.reports.report import render_profile, render_table

    console = _table_console(wide)
    try:
        render_table(report, console, wide=wide)
        if any(r.get("profile") for r in report["results"]):
            render_profile(report, console)
    except (KeyError, TypeError) as exc:
        raise UserError(
            f"{report_file}: the table needs a field this report lacks ({exc}); "
            f"`orchestrate report {report_file} --html OUT.html` renders older reports"
        ) from None


@cli.command("plan")
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config.")
@click.option(
    "--traffic",
    required=True,
    metavar="FILE|URL",
    help='Request sizes: a JSONL or CSV file, one request a line keyed by dimension ({"batch": 3, "seq": 71}), '
    "or a Prometheus URL that scrapes the model's replicas.",
)
@click.option("--window", default="1d", show_default=True, help="With a Prometheus URL: the time window read.")
@click.option(
    "--max-points", type=click.IntRange(1, 64), default=4, show_default=True, help="Buckets (grid points) at most."
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A warmup report of this model: costs from its measured latencies instead of padded sizes.",
)
@click.option(
    "--max-compile-seconds",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="A compile budget for the plan (needs --report): at most as many points as the report's "
    "median compile seconds of a point fit in it.",
)
@click.option(
    "--objective",
    type=click.Choice(["mean", "p50", "p99"]),
    default="mean",
    show_default=True,
    help="What the plan minimises: the mean cost of a request, or its median or 99th percentile "
    "(free points, one or two bucketed dimensions: the least quantile within --slack, then the least mean).",
)
@click.option(
    "--slack",
    type=click.FloatRange(min=0),
    default=0.05,
    show_default=True,
    help="With --objective p50 or p99: how far above the least quantile (a fraction) the plan may go for a lower mean.",
)
@click.option(
    "--margin",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=0.2,
    show_default=True,
    help="With --objective p50 or p99: the share of the requests beyond the quantile that the plan also holds "
    "at its level (0.2: a median plan holds 60%), so that the spread of a point's latency moves the quantile less.",
)
@click.option(
    "--align",
    "align",
    multiple=True,
    metavar="DIM=N",
    callback=lambda _ctx, _param, given: _multiples(given),
    help="Plan sizes of dimension DIM that are multiples of N, e.g. --align seq=8: half-precision matrix "
    "products and attention run fastest there, and a warmup report measured at such sizes prices them truly. "
    "Repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan and the comparison as JSON on stdout.")
@click.option("--write", is_flag=True, help="Write the plan's buckets into CFG.yaml, every other line as it was.")
@click.option(
    "--free-points",
    is_flag=True,
    help="A grid: --write the free-point plan (its sizes as buckets, its points as points.only) "
    "instead of the product plan.",
)
def plan_command(
    model_path: str,
    traffic: str,
    window: str,
    max_points: int,
    report_path: Optional[Path],
    max_compile_seconds: Optional[float],
    objective: str,
    slack: float,
    margin: float,
    align: dict[str, int],
    as_json: bool,
    write: bool,
    free_points: bool,
) -> None:
    """Choose the buckets (a grid's points) that serve a traffic at the least expected cost.

    Beside the plan: the config's buckets and powers of two with as many points, each with the
    mean, median and 99th percentile cost of a request (padded positions, or milliseconds with
    --report), the fraction of computed positions that is padding, and the compile seconds (with
    --report). The plan minimises the mean (what a fleet's throughput follows); --objective p50 or
    p99 plans for a latency target instead, with the plan for the mean beside it.

    \b
    Example:
      orchestrate plan --model examples/mlp.yaml --traffic sizes.jsonl --max-points 3
    Exit codes:
        0  planned
        2  usage/config error, or traffic that cannot be read
        3  the Prometheus URL does not answer
    """
    spec = load_spec_with_overrides(model_path)
    if free_points and not (write and spec.grid):
        raise UserError("--free-points writes a grid's free-point plan: pass it with --write, for a grid config")
    for option in ("slack", "margin"):
        given = click.get_current_context().get_parameter_source(option)
        if objective == "mean" and given is not click.core.ParameterSource.DEFAULT:
            raise UserError(f"--{option} shapes a quantile's plan: pass it with --objective p50 or p99")
    report = _load_report(report_path) if report_path else None
    from orchestrator.planning import advice
    from orchestrator.planning.traffic import read_traffic

    counts = read_traffic(traffic, spec.grid_dims, spec.label, window)
    candidates = advice.compare(spec, counts, max_points, report, max_compile_seconds, objective, slack, margin, align)
    unit = "ms" if report else "positions"
    if as_json:
        click.echo(json.dumps(advice.as_json(spec, candidates, unit), indent=2))
    else:
        advice.render(spec, candidates, unit, _table_console(False))
    if write:
        chosen = next(c for c in candidates if c.points is not None) if free_points else candidates[0]
        advice.write_buckets(Path(model_path), spec, chosen.grid, chosen.points)
        what = "buckets and points" if chosen.points is not None else "buckets"
        click.echo(f"orchestrate: wrote the plan's {what} into {model_path}", err=True)


def _multiples(given: tuple[str, ...]) -> dict[str, int]:
    """`--align`'s DIM=N pairs, each N a whole number of at least 1."""
    out: dict[str, int] = {}
    for pair in given:
        name, _, value = pair.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            raise click.BadParameter(f"{pair!r}: give DIM=N, N a whole number of at least 1 (e.g. seq=8)")
        out[name] = int(value)
    return out


def _table_console(wide: bool) -> Console:
    """The terminal's width on a terminal; a width that cuts nothing where stdout is a file or pipe.
    `--wide` is one line per record whatever the window: a window narrower than the table folds
    whole lines (`| less -RS` scrolls them instead), never a value over several."""
    out = Console()
    if wide:
        return Console(width=max(out.width, 240), force_terminal=out.is_terminal)
    return out if out.is_terminal else Console(width=160)


def _load_report(path: Path) -> dict[str, Any]:
    """A warmup report, or one line saying why the file is not one."""
    hint = "give the JSON that `orchestrate warmup --report PATH` (or --json) wrote"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; {hint}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc}); {hint}") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc}); {hint}") from None
    except RecursionError:
        raise UserError(f"{path}: nests deeper than the JSON parser follows, as no report does; {hint}") from None
    if not isinstance(report, dict) or not {"schema_version", "results", "summary", "executor"} <= report.keys():
        raise UserError(f"{path}: not a warmup report (no schema_version, results, summary and executor); {hint}")
    from orchestrator.reports.records import SCHEMA_VERSION

    if report["schema_version"] != SCHEMA_VERSION:
        raise UserError(
            f"{path}: report schema_version {report['schema_version']}, this orchestrate reads {SCHEMA_VERSION}; "
            "use the orchestrate that wrote it"
        )
    return report


# what Ray Serve's HTTP proxy runs on: installed with ray[serve] (the `serve` extra), not with ray
SERVE_MODULES = ("starlette", "fastapi", "uvicorn")


def _check_serve_installed() -> None:
    import importlib.util

    missing = [name for name in SERVE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"orchestrate serve needs Ray Serve, which is not installed here ({', '.join(missing)} missing): "
            "pip install 'torch-warmup-orchestrator[serve]' (scripts/install.sh installs it)"
        )


def _check_html(path: Path) -> None:
    """Before the run: a page that cannot be drawn or written fails now, not after the results."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserError("--html needs matplotlib: pip install 'torch-warmup-orchestrator[report]' (or drop --html)")
    _check_writable(path, option="--html")


def _write_html(report: dict[str, Any], path: Path) -> None:
    from orchestrator.reports.html import write_html

    try:
        write_html(report, path)
    except OSError as exc:
        raise UserError(f"--html {path}: cannot write it ({exc.strerror or exc})") from None


@cli.group()
def render() -> None:
    """Render deployment manifests.

    \b
    Example:
      orchestrate render k8s --model examples/mlp.yaml --image IMAGE:TAG --remote s3://bucket/cache > model.yaml
    Exit codes:
        0  ok
        2  usage/config error
    """


@render.command("k8s")
@click.option("--model", "model_path", required=True, metavar="CFG.yaml", help="Model config.")
@_buckets_option
@_cluster_shape_options(image_required=True)
@click.option("--remote", metavar="URL", help="Shared store (s3://bucket/prefix); serving needs one.")
@click.option("--pushgateway", metavar="URL", help="Pushgateway for the job's metrics.")
def render_k8s(
    model_path: str, buckets: Optional[str], remote: Optional[str], pushgateway: Optional[str], **shape: Any
) -> None:
    """The warmup (ConfigMap, KubeRay RayJob) and, with a store, the serving side (ConfigMap,
    Deployment, Service), all on one image, as YAML on stdout.

    \b
    Example:
      orchestrate render k8s --model examples/mlp.yaml --image IMAGE:TAG --remote s3://bucket/cache > model.yaml
    Exit codes:
        0  ok
        2  usage/config error
    """
    spec = load_spec_with_overrides(model_path, buckets=buckets)
    from orchestrator.deployment.k8s import to_yaml

    click.echo(to_yaml(_k8s_documents(spec, Path(model_path), shape, remote or spec.remote, pushgateway)), nl=False)


def _k8s_documents(
    spec, config: Path, shape: dict[str, Any], remote: Optional[str], pushgateway: Optional[str]
) -> list[dict[str, Any]]:
    from orchestrator.deployment.k8s import ClusterShape
    from orchestrator.deployment.k8s import render as render_manifests

    try:
        documents = render_manifests(
            spec, config.read_text(), config.name, ClusterShape(**shape), remote=remote, pushgateway=pushgateway
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if shape["serving_replicas"] and not remote:
        click.echo(
            "orchestrate: note: no serving Deployment: serving pods pull from a shared store; pass --remote",
            err=True,
        )
    elif shape["serving_replicas"] and not shape["gpu"]:
        click.echo(
            "orchestrate: note: no --gpu: serving pods may land on another GPU class than the warmup's, "
            "and their pull then fails (exit 5)",
            err=True,
        )
    return documents


def _store_and_keys(remote: Optional[str], cache_dir: Optional[str], allow_unsigned: bool, trust: tuple[str, ...]):
    """The store a cache command works on, the public keys it trusts, and the private key file of
    the store beside the local cache (None for --remote): --remote, or else that store, which
    warmup uses when it is given none, with its own key pair."""
    from orchestrator.cache.manifest import TrustedKeys
    from orchestrator.cache.store import open_store

    if remote:
        return open_store(remote), _trusted(trust), None
    embedded = embedded_store(
        Path(cache_dir).expanduser() if cache_dir else default_cache_root(), allow_unsigned, trust
    )
    return open_store(embedded.url), TrustedKeys.from_pems(embedded.trusted), embedded.key_file


@cli.group()
def cache() -> None:
    """Inspect and maintain cache stores.

    \b
    Example:
      orchestrate cache verify --remote s3://bucket/cache
    Exit codes:
        0  ok
        2  usage error
        3  store unreachable or refusing
        4  untrusted cache data refused
      130  interrupted
    """


@cache.command("ls")
@click.option("--cache-dir", metavar="DIR", help="List a local cache root instead of a store.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@_store_options
def cache_ls(
    cache_dir: Optional[str],
    as_json: bool,
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
) -> None:
    """Namespaces in a store (--remote) or a local cache root (--cache-dir).

    \b
    Example:
      orchestrate cache ls --remote s3://bucket/cache
    Exit codes:
        0  ok
        2  usage error
        3  store unreachable or refusing
        4  untrusted cache data refused
      130  interrupted
    """
    from orchestrator.cache import sync
    from orchestrator.cache.local import local_namespaces
    from orchestrator.cache.store import open_store

    if remote:
        found: list[Any] = sync.listing(open_store(remote), _trusted(trust), allow_unsigned=allow_unsigned)
    else:
        root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
        check_cache_dir(root)
        found = local_namespaces(root)
    rows = [asdict(row) for row in found]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        detail = row.get("error") or (
            f"gen {row['generation']}, buckets {row['buckets']}, {row['created_at']}" if "generation" in row else ""
        )
        size = f"{row['files']} files, {row['bytes'] / 1e6:.1f} MB" if row.get("files") is not None else ""
        click.echo(f"{row['namespace']}  {size}  {detail}".rstrip())


@cache.command("verify")
@click.option("--namespace", "names", multiple=True, help="Only these namespaces (default: all).")
@_local_store_option
@_store_options
def cache_verify(
    names: tuple[str, ...],
    cache_dir: Optional[str],
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
) -> None:
    """Check every generation's manifest signature and every shard and file hash in a store; a
    namespace that fails is reported and the others are still checked.

    \b
    Example:
      orchestrate cache verify --remote s3://bucket/cache
    Exit codes:
        0  every namespace verifies
        2  usage error
        3  store unreachable or refusing
        4  a namespace failed verification
      130  interrupted
    """
    from orchestrator.cache import sync

    store, key, _ = _store_and_keys(remote, cache_dir, allow_unsigned, trust)
    bad = 0
    for namespace in names or sync.namespaces(store):
        try:
            manifest = sync.verify(store, namespace, key, allow_unsigned=allow_unsigned)
            click.echo(f"ok   {namespace}: generation {manifest.generation}, {len(manifest.files)} files")
        except (IntegrityError, StoreError) as exc:
            bad += 1
            click.echo(f"BAD  {namespace}: {exc}")
    if bad:
        _fail(f"{bad} namespace(s) failed verification", EXIT_UNTRUSTED)


@cache.command("repair")
@click.option("--namespace", "names", multiple=True, help="Only these namespaces (default: all).")
@_local_store_option
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.option(
    "--signing-key-file",
    metavar="FILE",
    callback=_existing_key_file,
    help="Private key to sign the repaired manifests (default $ORCHESTRATE_CACHE_SIGNING_KEY[_FILE]; "
    "the local store's own without --remote).",
)
@_store_options
def cache_repair(
    names: tuple[str, ...],
    cache_dir: Optional[str],
    as_json: bool,
    signing_key_file: Optional[str],
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
) -> None:
    """Make a damaged store verify again: shards that are missing or hold other bytes are uploaded
    again from this node's cache where its files rebuild them; files nothing rebuilds leave the
    manifest (the next warmup compiles and publishes them again); older generations that name a
    damaged shard are deleted. Needs the signing key: it publishes.

    \b
    Example:
      orchestrate cache repair --remote s3://bucket/cache --cache-dir /nvme/cache
    Exit codes:
        0  ok
        2  usage error or no signing key
        3  store unreachable or refusing
        4  untrusted cache data refused
      130  interrupted
    """
    from orchestrator.cache import sync
    from orchestrator.cache.manifest import SigningKey

    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    store, trusted, store_key_file = _store_and_keys(remote, cache_dir, allow_unsigned, trust)
    key = SigningKey.from_env(signing_key_file or store_key_file)
    results = []
    for namespace in names or sync.namespaces(store):
        done = sync.repair(store, namespace, root / namespace, key, allow_unsigned=allow_unsigned, trusted=trusted)
        results.append(asdict(done))
        if not as_json:
            if not done.bad:
                click.echo(f"ok        {namespace}: {done.shards} shards verify")
                continue
            change = f", generation {done.generation} published" if done.generation else ""
            retired = f", generations {', '.join(map(str, done.retired))} deleted" if done.retired else ""
            click.echo(
                f"repaired  {namespace}: {len(done.bad)} of {done.shards} shards damaged; {done.restored} uploaded "
                f"again, {done.moved} files moved, {len(done.dropped)} dropped (compiled again by the next "
                f"warmup){change}{retired}"
            )
    if as_json:
        click.echo(json.dumps(results, indent=2))


@cache.command("gc")
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Generations to keep per namespace (a replica may still be pulling the one before the newest).",
)
@click.option(
    "--unused-days",
    type=click.FloatRange(min=0),
    help="Also delete whole namespaces nothing has published to for this many days.",
)
@click.option(
    "--grace-seconds",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Never delete shards or abort uploads younger than this (a publish may be under way).",
)
@click.option("--dry-run", is_flag=True, help="Say what would go; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@_local_store_option
@_store_options
def cache_gc(
    keep: int,
    unused_days: Optional[float],
    grace_seconds: float,
    dry_run: bool,
    as_json: bool,
    cache_dir: Optional[str],
    remote: Optional[str],
    allow_unsigned: bool,
    trust: tuple[str, ...],
) -> None:
    """Per namespace, delete all but its newest generations; then shards no kept generation names
    and uploads abandoned midway. One namespace is never judged by another.

    \b
    Example:
      orchestrate cache gc --keep 2 --remote s3://bucket/cache --dry-run
    Exit codes:
        0  ok
        2  usage error
        3  store unreachable or refusing
        4  untrusted cache data refused
      130  interrupted
    """
    from orchestrator.cache import sync

    store, trusted, _ = _store_and_keys(remote, cache_dir, allow_unsigned, trust)
    done = sync.gc(
        store,
        keep,
        trusted,
        allow_unsigned=allow_unsigned,
        grace_seconds=grace_seconds,
        unused_days=unused_days,
        dry_run=dry_run,
    )
    if as_json:
        click.echo(json.dumps(asdict(done), indent=2))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{done.namespaces} namespaces: {verb} {len(done.manifests)} old generations"
        + (f" ({len(done.retired_namespaces)} unused namespaces whole)" if done.retired_namespaces else "")
        + f", {len(done.objects)} unreferenced shards ({done.bytes_freed / 1e6:.1f} MB),"
        + f" {'would abort' if dry_run else 'aborted'} {done.uploads_aborted} abandoned uploads"
    )
    for namespace in done.unverified:
        click.echo(f"kept every shard: {namespace}'s kept generations do not verify with this key", err=True)


@cli.group()
def keys() -> None:
    """Make and inspect the Ed25519 keys that sign cache manifests.

    \b
    Example:
      orchestrate keys new ~/keys
    Exit codes:
        0  ok
        2  usage error or an unwritable DIR or unreadable key file
    """


@keys.command("new")
@click.argument("directory", metavar="DIR")
def keys_new(directory: str) -> None:
    """Write a new key pair into DIR: the private key (mode 0600) for publishers, its .pub file
    for everyone who pulls, verifies or serves. Never overwrites a key.

    \b
    Example:
      orchestrate keys new ~/keys
    Exit codes:
        0  ok
        2  usage error, a key already there or an unwritable DIR
    """
    from orchestrator.cache.manifest import PRIVATE_NAME, SigningKey

    folder = Path(directory).expanduser()
    private = folder / PRIVATE_NAME
    public = SigningKey.public_path(private)
    for path in (private, public):
        if path.exists():
            raise UserError(f"{path}: a key is already there; refusing to overwrite it (pick another DIR)")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = SigningKey.create_file(private)
    except OSError as exc:
        raise UserError(f"{folder}: cannot write the key pair ({exc.strerror or exc}); pick a writable DIR") from None
    if not created:
        raise UserError(f"{private}: a key is already there; refusing to overwrite it (pick another DIR)")
    key = SigningKey.load(private)
    click.echo(f"key id {key.key_id}")
    click.echo(f"private key {private} (mode 0600): publishers only, via --signing-key-file", err=True)
    click.echo(f"public key  {public}: readers, via --trust or $ORCHESTRATE_CACHE_TRUSTED_KEYS", err=True)


@keys.command("id")
@click.argument("path", metavar="FILE")
def keys_id(path: str) -> None:
    """Print the key id of a public or private key file (the id manifests and errors name).

    \b
    Example:
      orchestrate keys id ~/keys/cache-signing.key.pub
    Exit codes:
        0  ok
        2  usage error or a key file that cannot be read
    """
    from orchestrator.cache.manifest import PublicKey, SigningKey

    text = Path(path).expanduser()
    try:
        is_private = b"PRIVATE KEY" in text.read_bytes()
    except OSError as exc:
        raise UserError(f"key file {path}: cannot read it ({exc.strerror})") from None
    click.echo((SigningKey.load(text) if is_private else PublicKey.load(text)).key_id)


def _check_writable(path: Path, option: str = "--report") -> None:
    """Fail before the run, not after it: an unwritable --report would lose the results."""
    suffix = ".html" if option == "--html" else ".json"
    if path.is_dir():
        raise UserError(
            f"{option} {path}: is a directory; give a file path such as reports/{path.name or 'run'}{suffix}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"{option} {path}: cannot create its directory ({exc.strerror or exc}); give a path in a writable directory"
        ) from None
    # a file made and removed: os.access says yes to root on a read-only filesystem or in /proc
    try:
        with tempfile.TemporaryFile(dir=path.parent, prefix=".orchestrate-report-"):
            pass
    except OSError as exc:
        raise UserError(
            f"{option} {path}: directory {path.parent} is not writable ({exc.strerror or exc}); "
            "give a path in a writable directory"
        ) from None


def _check_profile_dir(path: Path) -> Path:
    """--profile's directory, made now and proved writable, as an absolute path (Ray ranks on
    other nodes write to the same path on theirs): a run of many minutes must not lose its traces."""
    path = path.expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise UserError(f"--profile {path}: is a file; give a directory for the trace files")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".orchestrate-profile-"):
            pass
    except OSError as exc:
        raise UserError(
            f"--profile {path}: cannot write there ({exc.strerror or exc}); give a writable directory"
        ) from None
    return path


def _run_log(spec, command: str):
    """Where a run's own output goes (orchestrator.progress.RunLog): `<cache root>/logs`."""
    from orchestrator.cache.namespace import slug
    from orchestrator.progress import RunLog

    return RunLog(cache_root(spec) / "logs", f"{command}-{slug(spec.label, 32, keep='.', fallback='model')}")


def _pointing_at(log: Optional[Path], message: str) -> str:
    return f"{message} (the run's other output: {log})" if log else message


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
    except Exception as exc:
        code = exit_code_of(exc)  # a user's problem, a store's or untrusted data: one line each
        if code is None:
            raise
        _fail(str(exc), code)
    except KeyboardInterrupt:
        _fail("interrupted", EXIT_INTERRUPTED)
    sys.exit(EXIT_OK)


def _fail(message: str, code: int) -> None:
    click.echo(f"orchestrate: error: {message}", err=True)
    sys.exit(code)
