"""Which variant serves a bucket: the rule, on recorded timings. Torch-free, so that the driver,
the runtime and the tests apply the same rule to the same numbers.

A variant displaces the one in place only when it is faster by more than both measurements'
own spread: a difference inside the noise is no reason to serve a more complex variant. Eager
is in place first (it needs nothing); the config's compiled mode displaces it when clearly
faster; then the fastest of the others displaces whichever is in place, when clearly faster.
Last, among the variants tied with the winner (neither clearly faster), the one a replica starts
fastest serves: equal latency, less start-up.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.spec import GRAPHED_VARIANTS, VARIANTS, VariantName, WarmupSpec

PLAN_DIR = "serving"  # in the namespace directory, published and pulled with the compiled files
PLAN_FORMAT = 1
# What a replica pays to load each variant, cheapest first: nothing; a CUDA-graph capture; loading a
# saved function (no tracing); then a Dynamo trace and cache load each, the config's own compile
# before its uncaptured twin (the same cost: what the user configured wins the tie)
START_COST: tuple[str, ...] = ("eager", "eager-graphed", "aot", "compiled", "graphed")


def spread(samples: Sequence[float]) -> float:
    """Half the interquartile range: how far a typical sample lies from the median."""
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / 2


def clearly_faster(candidate: VariantMeasure, incumbent: VariantMeasure) -> bool:
    if candidate.ms is None or incumbent.ms is None:
        return False
    return candidate.ms + (candidate.spread_ms or 0.0) < incumbent.ms - (incumbent.spread_ms or 0.0)


def choose(measured: Mapping[str, VariantMeasure], incumbent: Optional[str] = None) -> str:
    """The variant that serves the bucket, among those measured and correct ("eager" must be).
    `incumbent`, the variant the published plan already serves, stays unless another is clearly
    faster in this measurement: a rerun's noise must not flip plans back and forth."""
    if not _usable(measured.get("eager")):
        raise ValueError("eager must be measured: it is the reference every variant is held to")
    if incumbent is not None and _usable(measured.get(incumbent)):
        held = incumbent
        for name in sorted((n for n, m in measured.items() if _usable(m)), key=lambda n: measured[n].ms or math.inf):
            if clearly_faster(measured[name], measured[held]):
                held = name
        return held
    chosen = "eager"
    compiled = measured.get("compiled")
    if compiled is not None and _usable(compiled) and clearly_faster(compiled, measured["eager"]):
        chosen = "compiled"
    others = sorted(
        (name for name, m in measured.items() if name not in ("eager", "compiled") and _usable(m)),
        key=lambda name: measured[name].ms or math.inf,
    )
    for name in others:
        if clearly_faster(measured[name], measured[chosen]):
            chosen = name
    tied = [
        name
        for name, m in measured.items()
        if _usable(m) and not clearly_faster(measured[chosen], m) and not clearly_faster(m, measured[chosen])
    ]
    return min(tied, key=_start_cost)


def _start_cost(name: str) -> int:
    return START_COST.index(name) if name in START_COST else len(START_COST)


def _usable(measure: VariantMeasure | None) -> bool:
    return measure is not None and measure.ok and measure.ms is not None


def serving_candidates(spec: WarmupSpec, device_type: str) -> tuple[list[VariantName], dict[VariantName, str]]:
    """The variants that may serve a bucket here, and those asked for that cannot (with why).
    Eager is always a candidate: it is the reference, and the fallback."""
    asked = spec.serve.variants
    wanted = list(VARIANTS) if asked is None else ["eager", *asked]
    unavailable: dict[VariantName, str] = {}
    if device_type != "cuda":
        for name in GRAPHED_VARIANTS:
            if asked is not None and name in asked:
                unavailable[name] = "needs CUDA: the model runs on the CPU"
        wanted = [name for name in wanted if name not in GRAPHED_VARIANTS]
        if asked is None:  # a C++ build per bucket: on the CPU only when asked for
            wanted.remove("aot")
    if spec.compile.backend != "inductor" and "graphed" in wanted:
        wanted.remove("graphed")
        unavailable["graphed"] = f"needs the inductor backend to turn CUDA graphs off, not {spec.compile.backend!r}"
    return [name for name in VARIANTS if name in wanted], unavailable


def graphed_compile(mode: Optional[str], options: Mapping[str, Any]) -> tuple[Optional[str], dict[str, Any]]:
    """The config's compile with CUDA graphs off: the mode that does the same without them, and
    the options without `triton.cudagraphs`."""
    without = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
    return without.get(mode or "", mode), {k: v for k, v in options.items() if k != "triton.cudagraphs"}


def replays_into_buffers(variant: str, spec: WarmupSpec, device_type: str) -> bool:
    """Whether a variant's outputs live in CUDA-graph buffers that its next call overwrites: a
    server copies those out before answering, and warmup times the copy with the call. Unknown
    backends are taken to replay (an extra copy is safe, a missing one is not)."""
    if variant in GRAPHED_VARIANTS:
        return True
    if variant == "aot":  # captured in a CUDA graph of the tool's own on CUDA; a plain call on the CPU
        return device_type == "cuda"
    if variant != "compiled":
        return False
    options = spec.compile
    if options.backend == "inductor":
        return bool(options.options.get("triton.cudagraphs", options.mode in ("reduce-overhead", "max-autotune")))
    return options.backend not in ("eager", "aot_eager")


def write_plan(
    directory: Path, spec: WarmupSpec, result: BucketResult, artifacts: Optional[Mapping[str, Any]] = None
) -> Optional[str]:
    """Write the bucket's serving plan into the namespace directory; its path relative to it,
    or None where the newest plan there already chose the same variant from the same artifacts
    (a warm rerun that confirms the choice publishes nothing new). Named by its content:
    published files are never replaced, so a changed choice adds a plan and readers take the
    newest (read_plans). `artifacts`: the files each built variant loads, relative to the
    directory (`aot`: its saved function and the platform it was built for), chosen or not."""
    artifacts = dict(artifacts or {})
    current = read_plans(directory).get(result.bucket)
    if current is not None and current["variant"] == result.variant and current.get("artifacts", {}) == artifacts:
        return None
    plan = {
        "format": PLAN_FORMAT,
        "bucket": result.bucket,
        "variant": result.variant,
        "variants": {name: asdict(m) for name, m in result.variants.items()},
        "artifacts": artifacts,
        "config_hash": spec.identity_hash(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
    }
    body = json.dumps(plan, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    rel = f"{PLAN_DIR}/plan-b{result.bucket}-{digest}.json"
    target = directory / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.tmp")
    scratch.write_text(body)
    os.replace(scratch, target)  # a reader (or a publish) never sees half a plan
    return rel


def read_plans(directory: Path) -> dict[int, dict[str, Any]]:
    """The newest serving plan of every bucket found in a namespace directory."""
    newest: dict[int, dict[str, Any]] = {}
    for path in sorted((directory / PLAN_DIR).glob("plan-b*.json")):
        plan = json.loads(path.read_text())
        if plan.get("format") != PLAN_FORMAT:
            continue
        bucket = int(plan["bucket"])
        if bucket not in newest or plan["measured_at"] > newest[bucket]["measured_at"]:
            newest[bucket] = plan
    return newest
