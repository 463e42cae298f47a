"""A model zoo on one GPU: what `orchestrate warmup` chooses to serve for public architectures, and
whether a replica then serves it. Run by hand; bench/zoo.sh runs it on a GPU machine without
network access.

    python bench/zoo.py OUT_DIR [--only NAME[,NAME]] [--buckets 1,8] [--device cuda|cpu]
                        [--budget SECONDS] [--set KEY=VALUE ...] [--jobs N] [--cache-root DIR]
                        [--reuse-cache] [--warmup-timeout S] [--replica-timeout S]
    python bench/zoo.py --list                                    # the zoo, and what loads here
    python bench/zoo.py OUT_DIR --merge A/zoo.json B/zoo.json     # one table from runs in parts

The models (ZOO below) come from torchvision, timm and transformers, built with random weights (no
download), one config each in bench/models/. `--only` takes names, families (cnn, vit, encoder,
decoder, enc-dec, multimodal, audio), sources (torchvision, timm, transformers), `half1` or `half2` (the zoo in two
runs, each expected to take under 9 minutes on an H200), or config paths.

Every config runs under the zoo's settings (ZOO_SETTINGS), chosen to keep a model to a minute or
two: buckets 1 and 8, 50 timed calls after 5, compile mode `default` and the variants compiled,
graphed and eager-graphed (eager is always measured: the reference).

Per model, one after the other (`--jobs N`: N models at once, which saves the wall time of
compiling, mostly single-threaded Python, at the cost of benchmarks that may overlap another
model's work: their intervals widen, and the compile seconds grow):
  1. the effective config, OUT_DIR/configs/<name>.yaml: the model's YAML with the zoo's settings,
     --buckets, --device and every --set over it, a file factory's path made absolute; a config
     the parser refuses is the model's row, with the parser's line;
  2. `python -m orchestrator warmup --no-ray` in a process of its own, into the cache
     <cache root>/<name> (emptied first unless --reuse-cache): every bucket compiled, checked and
     benchmarked against eager, the fastest correct variant published as its plan; the report in
     OUT_DIR/warmup-<name>.json, what it printed in OUT_DIR/logs/warmup-<name>.log;
  3. a fresh process: `runtime.load(config, cache_dir=..., ready="planned")`, `info()`, then one call
     per bucket through the runtime at that bucket's inputs; its stderr in OUT_DIR/logs/replica-<name>.log.
A process that fails, or runs past its timeout (--warmup-timeout, --replica-timeout, and what
--budget has left), is killed with everything it started and is the model's row with its reason;
the zoo goes on with the next model. One progress line per model on stderr.

Output: OUT_DIR/zoo.json (rewritten after each model: settings, each model's warmup and replica,
the rows, the summary) and the Markdown in OUT_DIR/zoo.md, also printed: a row per model and
bucket (status, the variant the replica serves, its speedup over eager as warmup measured it with
the 95% interval, reasons), the time each model took, then the share of buckets served by a
compiled variant (anything but eager), the buckets slower than eager beyond noise, and every
failure's and unavailable variant's reason in full.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import ConfigError, load_spec, parse_buckets  # noqa: E402  (no torch)
from orchestrator.jobs.stats import is_noisy  # noqa: E402  (stdlib only)

MODELS_DIR = ROOT / "bench" / "models"


@dataclass(frozen=True)
class Model:
    name: str  # bench/models/<name>.yaml
    family: str
    source: str  # the package that builds it
    half: int  # which of the two runs it belongs to

    @property
    def config(self) -> Path:
        return MODELS_DIR / f"{self.name}.yaml"


# In each half the models that matter most run first, so a budget that runs out skips the others.
ZOO: tuple[Model, ...] = (
    Model("resnet50", "cnn", "torchvision", 1),
    Model("mobilenet_v3_large", "cnn", "torchvision", 1),
    Model("efficientnet_b0", "cnn", "torchvision", 1),
    Model("convnext_tiny_bf16", "cnn", "torchvision", 1),
    Model("mixnet_l", "cnn", "timm", 1),
    Model("swin_t", "vit", "torchvision", 1),
    Model("wav2vec2_base", "audio", "transformers", 1),
    Model("t5_small", "enc-dec", "transformers", 1),
    Model("mixnet_l_nchw", "cnn", "timm", 1),  # mixnet_l with Inductor's layout optimization off
    Model("gpt2_cache_bf16", "decoder", "transformers", 2),
    Model("llama_small_bf16", "decoder", "transformers", 2),
    Model("bert_base", "encoder", "transformers", 2),
    Model("distilbert_fp16", "encoder", "transformers", 2),
    Model("t5_small_encoder", "enc-dec", "transformers", 2),
    Model("clip_b32", "multimodal", "transformers", 2),
    Model("vit_b16_fp16", "vit", "torchvision", 2),
    Model("vit_s16", "vit", "timm", 2),
    Model("deit_s_bf16", "vit", "timm", 2),
)

# Set over every config. Compile mode `default` has no CUDA-graph trees, so the `graphed` variant
# (the config's compile with CUDA graphs off, captured whole) is the very function `compiled` runs
# (jobs/variants.py, graphed_compile): each bucket compiles once. `aot` is left out: its
# ahead-of-time build is a second, slow compile of every bucket.
ZOO_SETTINGS: dict[str, Any] = {
    "buckets": [1, 8],
    "bench": {"iterations": 50, "warmup": 5},
    "compile": {"mode": "default"},
    "serve": {"variants": ["compiled", "graphed", "eager-graphed"]},
}
# The graphed variants need CUDA: on the CPU they would only add "needs CUDA" to every row.
CPU_VARIANTS = ["compiled"]

WARMUP_TIMEOUT = 420  # seconds; well above the minute or two a cold warmup of two buckets is expected to take
REPLICA_TIMEOUT = 180
FIRST_GUESS = 60  # seconds a model is expected to take before one has been measured
ENV = {"PYTHONUNBUFFERED": "1"}
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
CELL = 160  # characters of reasons in a table cell; the summary has them whole

# argv: config, cache dir, device. One JSON line on stdout, then the process ends at once: the zoo
# needs nothing after it, and tearing down graphs and compiler threads would only cost time.
REPLICA = r"""
import json, os, sys, time
from orchestrator import runtime

def finish(row):
    print(json.dumps(row, default=str), flush=True)
    os._exit(0)

def brief(exc):
    return (f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0])[:2000]

started = time.perf_counter()
try:
    served = runtime.load(sys.argv[1], cache_dir=sys.argv[2], device=sys.argv[3], ready="planned")
except Exception as exc:
    finish({"error": "runtime.load: " + brief(exc)})
load_seconds = time.perf_counter() - started
info = served.info()
import torch
from orchestrator.jobs.model import make_inputs

def describe(value, depth=0):
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict) and depth < 1:
        return "{" + ", ".join(f"{k}: {describe(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and depth < 1:
        return f"{type(value).__name__}(" + ", ".join(describe(v, depth + 1) for v in value[:4]) + (", ..." if len(value) > 4 else "") + ")"
    return type(value).__name__

buckets = {}
for bucket, b in info.buckets.items():
    args, kwargs = make_inputs(served.spec, bucket, served.device)
    try:
        out = served(*args, **kwargs)
        if served.device.type == "cuda":
            torch.cuda.synchronize()
        answer = {"ok": True, "outputs": describe(out)}
    except Exception as exc:
        answer = {"ok": False, "error": brief(exc)}
    buckets[bucket] = {
        "variant": b.variant, "planned": b.planned, "reason": b.reason, "on_plan": b.on_plan,
        "load_seconds": b.load_seconds, "capture_seconds": b.capture_seconds,
        "cache_hits": b.cache_hits, "cache_misses": b.cache_misses, "memory_bytes": b.memory_bytes,
        "answer": answer,
    }
finish({"load_seconds": load_seconds, "ready_seconds": info.ready_seconds,
        "ready_seconds_from_spawn": info.ready_seconds_from_spawn,
        "dynamo_frames_compiled": info.dynamo_frames_compiled,
        "events": [list(e) for e in info.events], "buckets": buckets})
"""


class Budget:
    """Seconds left of --budget since the run started (infinite without one), and the longest a
    model has taken so far: a model that would not fit is skipped, not cut off half way."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.started, self.seconds, self.longest = time.monotonic(), seconds, 0.0

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (time.monotonic() - self.started)

    def fits(self) -> bool:
        return self.left() > max(self.longest, FIRST_GUESS)

    def timeout(self, limit: float) -> float:
        return max(1.0, min(limit, self.left()))


# ---------------------------------------------------------------------------------------------
# choosing models and writing their configs


def select(tokens: list[str]) -> list[Model]:
    """The models named by --only, in the zoo's order (config paths last, as given)."""
    if not tokens:
        return list(ZOO)
    chosen: list[Model] = []
    for token in tokens:
        if token.endswith((".yaml", ".yml")):
            path = Path(token).resolve()
            if not path.is_file():
                raise SystemExit(f"zoo: no config {path}")
            chosen.append(_Extra(path.stem, "-", "-", 0, path))
            continue
        matched = [m for m in ZOO if token in (m.name, m.family, m.source, f"half{m.half}", "all")]
        if not matched:
            names = ", ".join(m.name for m in ZOO)
            raise SystemExit(f"zoo: {token!r} names no model, family, source or half; models: {names}")
        chosen += [m for m in matched if m not in chosen]
    order = {m.name: i for i, m in enumerate(ZOO)}
    return sorted(chosen, key=lambda m: order.get(m.name, len(ZOO)))


@dataclass(frozen=True)
class _Extra(Model):
    """A config given by path with --only: not in the zoo, run the same way."""

    path: Path = Path()

    @property
    def config(self) -> Path:
        return self.path


def parse_set(text: str) -> tuple[list[str | int], Any]:
    """`model.kwargs.num_hidden_layers=2` -> (["model", "kwargs", "num_hidden_layers"], 2): the
    value read as YAML, a number in the path an index into a list."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"zoo: --set {text!r} is not KEY=VALUE (e.g. bench.iterations=10)")
    path: list[str | int] = [int(part) if part.isdigit() else part for part in key.split(".")]
    return path, yaml.safe_load(value)


def assign(data: dict, path: list[str | int], value: Any) -> None:
    node: Any = data
    for step, following in zip(path[:-1], path[1:], strict=True):
        if isinstance(node, list):
            node = node[int(step)]
            continue
        if node.get(step) is None:
            node[step] = [] if isinstance(following, int) else {}
        node = node[step]
    if isinstance(node, list):
        node[int(path[-1])] = value
    else:
        node[path[-1]] = value


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def output_folder(path: Path) -> Path:
    """OUT_DIR made ready for a run: absolute, with its logs/ and configs/ folders."""
    out_dir = path.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "configs").mkdir(exist_ok=True)
    return out_dir


def effective_config(model: Model, args: argparse.Namespace, out_dir: Path) -> tuple[Path, dict]:
    """The config this run warms and serves, written to OUT_DIR/configs/ (not yet checked)."""
    data = yaml.safe_load(model.config.read_text())
    factory = str((data.get("model") or {}).get("factory", ""))
    target, sep, attribute = factory.rpartition(":")
    if sep and (target.endswith(".py") or "/" in target):  # relative to the config's own folder
        data["model"]["factory"] = f"{(model.config.parent / target).resolve()}:{attribute}"
    data = merged(data, copy.deepcopy(ZOO_SETTINGS))
    if args.buckets:
        data["buckets"] = args.buckets
    data["device"] = args.device
    if args.device == "cpu":
        data["serve"]["variants"] = list(CPU_VARIANTS)
    for path, value in args.set:
        assign(data, path, value)
    data.setdefault("name", model.name)
    path = out_dir / "configs" / f"{model.name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


# ---------------------------------------------------------------------------------------------
# running a model


LIVE: set[subprocess.Popen] = set()  # the processes running now, each leading its own group


def stop(signum: int, frame: Any) -> None:
    """Told to stop (the driver's timeout, Ctrl-C): end every process the zoo started, which sit in
    sessions of their own and would outlive it, then exit; the files hold every model finished."""
    for child in list(LIVE):
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(128 + signum)


def run(command: list[str], log: Path, timeout: float, capture: bool = False) -> dict[str, Any]:
    """A process in a session of its own, stderr (and stdout unless `capture`) into `log`; past
    `timeout` it is killed with every process it started."""
    started = time.perf_counter()
    with log.open("w") as sink:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE if capture else sink, stderr=sink, text=True, cwd=ROOT,
            env={**os.environ, **ENV}, start_new_session=True,
        )  # fmt: skip
        LIVE.add(child)
        try:
            out, _ = child.communicate(timeout=timeout)
            code: Optional[int] = child.returncode
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the child leads its group: compile workers go with it
            out, _ = child.communicate()
            code = None
        finally:
            LIVE.discard(child)
    return {"exit": code, "seconds": time.perf_counter() - started, "stdout": out or "", "timed_out": code is None}


def last_line(log: Path) -> str:
    """What a failed process said last: its final non-empty line, without a traceback's frames."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:2000] if lines else "(nothing on stderr)"


def warm(
    model: Model, config: Path, cache: Path, out_dir: Path, device: str, timeout: float, label: Optional[str] = None
) -> dict:
    """`warmup --no-ray` of the model into `cache` (cold where the cache is empty); its report and
    log are named after `label` (the model's name by default)."""
    report = out_dir / f"warmup-{label or model.name}.json"
    log = out_dir / "logs" / f"warmup-{label or model.name}.log"
    report.unlink(missing_ok=True)
    command = [sys.executable, "-m", "orchestrator", "warmup", "--no-ray", "--model", str(config),
               "--device", device, "--cache-dir", str(cache), "--report", str(report)]  # fmt: skip
    done = run(command, log, timeout)
    row: dict[str, Any] = {"seconds": done["seconds"], "exit": done["exit"], "log": str(log.relative_to(out_dir))}
    if done["timed_out"]:
        row["error"] = f"warmup timed out after {timeout:.0f} s (killed), at: {last_line(log)[:300]}"
    elif done["exit"] in (0, 1) and report.is_file():  # 1: a bucket failed, the report holds why
        data = json.loads(report.read_text())
        row["report"] = report.name
        row.update({k: data.get(k) for k in ("torch_version", "gpu", "device", "namespace")})
        row["summary"] = data.get("summary")
        row["results"] = [_record(r) for r in data.get("results") or []]
    else:
        row["error"] = f"warmup exit {done['exit']}: {last_line(log)}"
    return row


RECORD_KEYS = (
    "bucket", "status", "stage", "error", "phase", "cache_state", "compile_seconds", "graph_record_seconds",
    "eager_ms", "compiled_ms", "speedup", "speedup_interval", "variant", "served_ms", "served_speedup",
    "served_speedup_interval", "noisy", "graph_breaks", "graph_break_reasons", "recompiles", "max_abs_error",
    "tolerance_used", "gate_reference", "gate_note", "float64_eager_error", "float64_error", "numerics",
    "peak_memory_bytes", "stage_seconds",
)  # fmt: skip


def _record(record: dict) -> dict:
    """The parts of a warmup record the zoo reports (the whole report is in warmup-<name>.json)."""
    out = {key: record.get(key) for key in RECORD_KEYS}
    out["variants"] = {
        name: {k: v.get(k) for k in ("ok", "ms", "spread_ms", "speedup_interval", "build_seconds", "reason")}
        for name, v in (record.get("variants") or {}).items()
    }
    return out


def replica(model: Model, config: Path, cache: Path, out_dir: Path, device: str, timeout: float) -> dict:
    log = out_dir / "logs" / f"replica-{model.name}.log"
    done = run([sys.executable, "-c", REPLICA, str(config), str(cache), device], log, timeout, capture=True)
    row: dict[str, Any] = {"seconds": done["seconds"], "exit": done["exit"], "log": str(log.relative_to(out_dir))}
    answer = next((line for line in reversed(done["stdout"].splitlines()) if line.startswith("{")), None)
    if done["timed_out"]:
        row["error"] = f"replica timed out after {timeout:.0f} s (killed)"
    elif answer is None:
        row["error"] = f"replica exit {done['exit']} without its JSON line: {last_line(log)}"
    else:
        row.update(json.loads(answer))
    return row


def bench_model(model: Model, args: argparse.Namespace, out_dir: Path, cache_root: Path, budget: Budget) -> dict:
    result: dict[str, Any] = {
        "model": model.name, "family": model.family, "source": model.source,
        "config": str(model.config.relative_to(ROOT) if model.config.is_relative_to(ROOT) else model.config),
        "dtype": "float32", "buckets": args.buckets or ZOO_SETTINGS["buckets"],
    }  # fmt: skip
    started = time.perf_counter()
    try:
        config, data = effective_config(model, args, out_dir)
    except (
        OSError,
        yaml.YAMLError,
        LookupError,
        TypeError,
        ValueError,
    ) as exc:  # unreadable, or a --set that does not fit
        result["error"] = f"config: {type(exc).__name__}: {exc}"
        return result
    result.update(effective=str(config.relative_to(out_dir)), dtype=(data.get("model") or {}).get("dtype") or "float32")
    result["buckets"] = sorted(set(data.get("buckets") or []))
    try:
        load_spec(config)
    except ConfigError as exc:  # its message names the file and the field
        result["error"] = str(exc)
        return result
    if not budget.fits():
        result["error"] = (
            f"skipped: {budget.left():.0f} s of the budget left, a model takes up to {max(budget.longest, FIRST_GUESS):.0f} s"
        )
        return result
    cache = cache_root / model.name
    if not args.reuse_cache:
        shutil.rmtree(cache, ignore_errors=True)  # a cold compile, and no plan of an earlier run kept
    cache.mkdir(parents=True, exist_ok=True)
    result["cache"] = str(cache)
    result["warmup"] = warm(model, config, cache, out_dir, args.device, budget.timeout(args.warmup_timeout))
    records = result["warmup"].get("results") or []
    if "error" in result["warmup"]:
        result["error"] = result["warmup"]["error"]
    elif not any(r.get("status") == "ok" for r in records):
        result["replica"] = {"error": "not started: no bucket warmed"}
    elif budget.left() < 5:
        result["replica"] = {"error": "not started: the budget is spent"}
    else:
        result["replica"] = replica(model, config, cache, out_dir, args.device, budget.timeout(args.replica_timeout))
    result["seconds"] = time.perf_counter() - started
    budget.longest = max(budget.longest, result["seconds"])
    return result


# ---------------------------------------------------------------------------------------------
# rows, table and summary: from the results alone, so --merge renders runs done in parts


def rows_of(result: dict) -> list[dict]:
    records = {r["bucket"]: r for r in (result.get("warmup") or {}).get("results") or []}
    replica_row = result.get("replica") or {}
    served_buckets = {int(b): v for b, v in (replica_row.get("buckets") or {}).items()}
    rows = []
    for bucket in result["buckets"]:
        row: dict[str, Any] = {
            "model": result["model"], "family": result["family"], "dtype": result["dtype"], "bucket": bucket,
            "status": "failed", "served": None, "planned": None, "speedup": None, "interval": None,
            "noisy": None, "reasons": [],
        }  # fmt: skip
        rows.append(row)
        if result.get("error"):
            row["reasons"].append(result["error"])
            row["status"] = "skipped" if result["error"].startswith("skipped") else "failed"
            continue
        record = records.get(bucket)
        if record is None:
            row["reasons"].append("warmup: no record of this bucket")
            continue
        row["planned"] = record.get("variant")
        if record.get("status") != "ok":
            row["reasons"].append(record.get("error") or f"failed at {record.get('stage')}")
        for name, measure in (record.get("variants") or {}).items():
            if not measure.get("ok") and measure.get("reason"):
                row["reasons"].append(f"{name} unavailable: {measure['reason']}")
        served = served_buckets.get(bucket)
        if replica_row.get("error"):
            row["reasons"].append(f"replica: {replica_row['error']}")
        elif served is None and record.get("status") == "ok":
            row["reasons"].append("replica: no such bucket in info()")
        if served is not None:
            row["served"] = served["variant"]
            if served.get("reason"):
                row["reasons"].append(
                    f"replica serves {served['variant']} (planned {served.get('planned')}): {served['reason']}"
                )
            answer = served.get("answer") or {}
            if not answer.get("ok"):
                row["reasons"].append(f"replica call: {answer.get('error')}")
            elif record.get("status") == "ok":
                row["status"] = "ok"
            if served["variant"] == "eager" and record.get("status") == "ok":
                row["reasons"].append(_why_eager(record))
        row.update(_speedup(record, row["served"] or row["planned"]))
    return rows


def _why_eager(record: dict) -> str:
    """What the other variants measured, where none was faster than eager beyond noise."""
    measured = [
        f"{name} {_speed(_speedup(record, name))}"
        for name, measure in (record.get("variants") or {}).items()
        if name != "eager" and measure.get("ok")
    ]
    return "eager serves, none faster beyond noise: " + (", ".join(measured) or "no other variant available")


def _speedup(record: dict, variant: Optional[str]) -> dict:
    """Eager over `variant` as warmup measured it, its 95% interval, and whether that is too wide to quote."""
    if variant is None or record.get("eager_ms") is None:
        return {}
    if variant == record.get("variant") and record.get("served_speedup") is not None:
        point, interval = record["served_speedup"], record.get("served_speedup_interval")
        return {"speedup": point, "interval": interval, "noisy": record.get("noisy")}
    measure = (record.get("variants") or {}).get(variant) or {}
    if not measure.get("ms"):
        return {}
    point, interval = record["eager_ms"] / measure["ms"], measure.get("speedup_interval")
    return {"speedup": point, "interval": interval, "noisy": is_noisy(point, interval, None)}


def summarize(rows: list[dict], results: list[dict]) -> dict:
    total = len(rows)
    by_variant: dict[str, int] = {}
    for row in rows:
        if row["status"] == "ok" and row["served"]:
            by_variant[row["served"]] = by_variant.get(row["served"], 0) + 1
    compiled = sum(n for v, n in by_variant.items() if v != "eager")
    slower = [
        f"{r['model']} b{r['bucket']} {r['served']} {_speed(r)}"
        for r in rows
        if r["served"] and r["interval"] and r["interval"][1] < 1.0
    ]
    compile_slower = []  # the config's compile alone, where it lost to eager beyond noise (eager then serves)
    for result in results:
        for record in (result.get("warmup") or {}).get("results") or []:
            interval = record.get("speedup_interval")
            if interval and interval[1] < 1.0:
                compile_slower.append(
                    f"{result['model']} b{record['bucket']} compiled {record['speedup']:.2f}x [{interval[0]:.2f}-{interval[1]:.2f}]"
                )
    # (model, reason) -> its buckets: a reason that every bucket of a model gives is listed once
    reasons: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        for reason in row["reasons"]:
            reasons.setdefault((row["model"], reason), []).append(row["bucket"])
    return {
        "buckets": total,
        "ok": sum(r["status"] == "ok" for r in rows),
        "failed": sum(r["status"] == "failed" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "served_by": by_variant,
        "served_compiled": compiled,
        "served_compiled_percent": 100.0 * compiled / total if total else None,
        "slower_than_eager": slower,
        "compile_slower_than_eager": compile_slower,
        "reasons": [
            {"model": model, "buckets": buckets, "reason": reason} for (model, reason), buckets in reasons.items()
        ],
    }


def _speed(row: dict) -> str:
    if row.get("speedup") is None:
        return "-"
    text = f"{row['speedup']:.2f}x"
    if row.get("interval"):
        low, high = row["interval"]
        text += f" [{low:.2f}-{high:.2f}]"
    return text + (" noisy" if row.get("noisy") else "")


def _cell(text: str, limit: int = CELL) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(results: list[dict], rows: list[dict], summary: dict, head: list[str]) -> str:
    lines = [*head, ""]
    lines += [
        "| model | family | dtype | bucket | status | served | speedup [95%] | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        served = row["served"] or "-"
        if row["served"] and row["planned"] and row["planned"] != row["served"]:
            served += f" (planned {row['planned']})"
        lines.append(
            f"| {row['model']} | {row['family']} | {SHORT_DTYPE.get(row['dtype'], row['dtype'])} | {row['bucket']} | "
            f"{row['status']} | {served} | {_speed(row)} | {_cell('; '.join(row['reasons']))} |"
        )
    lines += ["", "| model | warmup s | compile s per bucket | replica s | load to planned s | spawn to planned s |"]
    lines.append("|---|---|---|---|---|---|")
    for result in results:
        warmup, rep = result.get("warmup") or {}, result.get("replica") or {}
        compiles = " / ".join(
            f"{r['compile_seconds']:.1f}" if r.get("compile_seconds") is not None else "-"
            for r in warmup.get("results") or []
        )
        lines.append(
            f"| {result['model']} | {_num(warmup.get('seconds'))} | {compiles or '-'} | {_num(rep.get('seconds'))} | "
            f"{_num(rep.get('load_seconds'))} | {_num(rep.get('ready_seconds_from_spawn'))} |"
        )
    total = summary["buckets"]
    counts = ", ".join(f"{v} {n}" for v, n in sorted(summary["served_by"].items(), key=lambda item: -item[1]))
    percent = summary["served_compiled_percent"]
    lines += [
        "",
        f"Served by a compiled variant (anything but eager): {summary['served_compiled']} of {total} buckets"
        + (f" ({percent:.0f}%)" if percent is not None else "")
        + f"; served: {counts or 'none'}; failed {summary['failed']}, skipped {summary['skipped']}.",
        "Slower than eager beyond noise (served; the 95% interval below 1): "
        + ("; ".join(summary["slower_than_eager"]) or "none")
        + ".",
        "The config's compile slower than eager beyond noise: "
        + ("; ".join(summary["compile_slower_than_eager"]) or "none")
        + ".",
    ]
    if summary["reasons"]:
        lines += ["", "Reasons (failures, unavailable variants, why eager serves, what a replica serves instead):"]
        for item in summary["reasons"]:
            buckets = ",".join(map(str, item["buckets"]))
            lines.append(f"- {item['model']} b{buckets}: {' '.join(item['reason'].split())[:1500]}")
    return "\n".join(lines) + "\n"


def _num(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def header(results: list[dict], settings: dict) -> list[str]:
    torch_version = next(
        (r["warmup"].get("torch_version") for r in results if r.get("warmup", {}).get("torch_version")), None
    )
    gpu = next((r["warmup"].get("gpu") for r in results if r.get("warmup", {}).get("gpu")), None)
    return [
        "# Model zoo",
        "",
        f"torch {torch_version or '?'}, {gpu or settings.get('device', '?')}; buckets "
        f"{','.join(map(str, settings.get('buckets') or []))}; compile mode {settings['compile']['mode']}; "
        f"variants {', '.join(settings['serve']['variants'])}; {settings['bench']['iterations']} timed calls after "
        f"{settings['bench']['warmup']}. Speedup: eager's median latency over the served variant's, as warmup "
        "measured them interleaved, with its 95% interval (paired bootstrap); `noisy`: too wide to quote."
        + (
            " Set over every config: " + ", ".join(f"{k}={v}" for k, v in settings["set"]) + "."
            if settings.get("set")
            else ""
        ),
    ]


def write_outputs(out_dir: Path, run: dict) -> str:
    rows = [row for result in run["models"] for row in rows_of(result)]
    run["rows"] = rows
    run["summary"] = summarize(rows, run["models"])
    text = render(run["models"], rows, run["summary"], header(run["models"], run["settings"]))
    (out_dir / "zoo.json").write_text(json.dumps(run, indent=2, default=str) + "\n")
    (out_dir / "zoo.md").write_text(text)
    return text


# ---------------------------------------------------------------------------------------------


def list_zoo(args: argparse.Namespace) -> int:
    """The zoo, and for each model whether its config parses and its package imports here."""
    print(f"{'name':20} {'half':4} {'family':9} {'source':13} {'dtype':6} here")
    for model in select(args.only):
        try:
            spec = load_spec(model.config)
            state = "config ok"
            dtype = SHORT_DTYPE.get(spec.model.dtype or "float32", "?")
        except ConfigError as exc:
            state, dtype = f"config refused: {exc}", "?"
        if model.source != "-" and importlib.util.find_spec(model.source) is None:
            state += f"; {model.source} not installed here"
        print(f"{model.name:20} {model.half:<4} {model.family:9} {model.source:13} {dtype:6} {state}")
    settings = json.dumps(ZOO_SETTINGS)
    print(f"\nover every config: {settings} (on --device cpu, variants {CPU_VARIANTS})")
    return 0


def merge(out_dir: Path, files: list[Path]) -> int:
    """One table from runs done in parts: each file's models, a later run's replacing an earlier
    one's of the same name."""
    runs = [json.loads(path.read_text()) for path in files]
    models: dict[str, dict] = {}
    for part in runs:
        for result in part["models"]:
            models[result["model"]] = result
    run = {**runs[0], "merged_from": [str(p) for p in files], "models": list(models.values())}
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.stdout.write(write_outputs(out_dir, run))
    return 0


def progress(result: dict) -> str:
    """One line: how long each step took and what each bucket serves, or why the model failed."""
    line = f"{result['model']} ({result['family']}, {SHORT_DTYPE.get(result['dtype'], result['dtype'])}): "
    if result.get("error") and "warmup" not in result:
        return line + result["error"][:300]
    warmup = result["warmup"]
    if warmup.get("error"):
        return line + f"FAILED {warmup['error'][:300]}"
    records = warmup.get("results") or []
    line += f"warmup {warmup['seconds']:.1f} s, {sum(r['status'] == 'ok' for r in records)}/{len(records)} ok"
    rep = result.get("replica") or {}
    if rep.get("error"):
        line += f"; replica FAILED {rep['error'][:300]}"
    else:
        line += f"; replica {rep.get('seconds', 0):.1f} s, load to planned {rep.get('load_seconds') or 0:.1f} s"
    served = [f"b{r['bucket']} {r['served'] or r['planned'] or '-'} {_speed(r)}" for r in rows_of(result)]
    return line + "; " + ", ".join(served)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, nargs="?")
    parser.add_argument("--list", action="store_true", help="show the zoo and what loads here; run nothing")
    parser.add_argument(
        "--only", type=lambda s: [t for t in s.split(",") if t], default=[], help="names, families, half1/half2, paths"
    )
    parser.add_argument("--buckets", type=parse_buckets, help="instead of the zoo's 1,8")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget", type=float, help="seconds: start no model that would end later")
    parser.add_argument(
        "--set", action="append", type=parse_set, default=[], metavar="KEY=VALUE",
        help="over every selected config, e.g. model.kwargs.num_hidden_layers=2 (value read as YAML)",
    )  # fmt: skip
    parser.add_argument("--cache-root", type=Path, help="a cache per model below it (default OUT_DIR/cache)")
    parser.add_argument(
        "--reuse-cache", action="store_true", help="keep what the caches hold (default: empty each first)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="models in flight at once (default 1: nothing overlaps a benchmark)"
    )
    parser.add_argument("--warmup-timeout", type=float, default=WARMUP_TIMEOUT)
    parser.add_argument("--replica-timeout", type=float, default=REPLICA_TIMEOUT)
    parser.add_argument("--merge", nargs="+", type=Path, metavar="ZOO_JSON", help="render these runs as one")
    args = parser.parse_args()
    if args.list:
        return list_zoo(args)
    if args.out_dir is None:
        parser.error("OUT_DIR is required (or --list)")
    out_dir = args.out_dir.resolve()
    if args.merge:
        return merge(out_dir, args.merge)
    models = select(args.only)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "configs").mkdir(exist_ok=True)
    cache_root = (args.cache_root or out_dir / "cache").resolve()
    settings = copy.deepcopy(merged(ZOO_SETTINGS, {"device": args.device}))
    if args.buckets:
        settings["buckets"] = args.buckets
    if args.device == "cpu":
        settings["serve"] = {"variants": list(CPU_VARIANTS)}
    for path, value in args.set:  # the header states the settings every config ran with
        if path[0] in settings:
            assign(settings, path, value)
    run: dict[str, Any] = {
        "zoo": 1, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv[1:],
        "settings": {**settings, "set": [[".".join(map(str, p)), v] for p, v in args.set]}, "models": [],
    }  # fmt: skip
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    budget = Budget(args.budget)
    done: list[Optional[dict]] = [None] * len(models)
    lock = threading.Lock()

    def one(i: int, model: Model) -> None:
        try:
            result = bench_model(model, args, out_dir, cache_root, budget)
        except Exception as exc:  # one model's fault in the zoo itself must not lose the others' rows
            result = {"model": model.name, "family": model.family, "source": model.source, "dtype": "?"}
            result.update(buckets=args.buckets or ZOO_SETTINGS["buckets"], error=f"zoo: {type(exc).__name__}: {exc}")
        with lock:  # the files always hold every model finished so far, in the zoo's order
            done[i] = result
            run["models"] = [r for r in done if r is not None]
            run["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            write_outputs(out_dir, run)
            print(f"zoo: [{i + 1}/{len(models)}] {progress(result)}", file=sys.stderr, flush=True)

    # the pool starts models in the zoo's order, each when a slot frees: the budget is judged then
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in [pool.submit(one, i, model) for i, model in enumerate(models)]:
            future.result()
    sys.stdout.write(write_outputs(out_dir, run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
