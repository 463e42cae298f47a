"""Which variant serves a bucket: the rule, on recorded timings. Torch-free, so that the driver,
the runtime and the tests apply the same rule to the same numbers.

A variant displaces another only when the 95% interval of their latency ratio lies wholly above
1 + MARGIN. The samples are paired (Clock.interleaved times every variant in blocks of one plan),
and the paired bootstrap of the ratio of medians (orchestrator.jobs.stats) says how far the
measured difference can be trusted; the spread of single calls does not, since a median of a
hundred calls is far tighter than any one call. The base is in place first: the variant of the
published plan where there is one (a rerun's noise must not flip plans back and forth), else
eager (it needs nothing). Every variant that displaces the base contends; the fastest contender
by median leads, and among the contenders it does not displace (tied with it), the one a replica
starts fastest serves: equal latency, less start-up.

A comparison whose point estimate clears the margin while its interval does not is undecided:
`settle` times more interleaved rounds of its variants before the choice is final.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from orchestrator.cache.files import write_whole
from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.spec import GRAPHED_VARIANTS, VARIANTS, VariantName, WarmupSpec
from orchestrator.jobs.stats import MIN_SAMPLES, PairedBootstrap

PLAN_DIR = "serving"  # in the namespace directory, published and pulled with the compiled files
PLAN_FORMAT = 1
# What a replica pays to load each variant, cheapest first: nothing; a CUDA-graph capture; loading a
# saved function (no tracing); then a Dynamo trace and cache load each, the config's own compile
# before its uncaptured twin (the same cost: what the user configured wins the tie)
START_COST: tuple[str, ...] = ("eager", "eager-graphed", "aot", "compiled", "graphed")
# How much faster a variant must be, at 95%, to displace another. A gain under 2% is not worth a
# more complex variant, and biases of about that size do not show in an interval: the copy out
# of CUDA-graph buffers, the order of calls within an iteration, the timer's own overhead. On a
# quiet machine intervals are a few percent wide, so gains of 5% and more decide in one run.
MARGIN = 0.02
# More rounds where a comparison is undecided, per bucket: a GPU's first run takes well under a
# second, a choice serves for as long as its plan does, and a bucket that never settles (two
# variants a few percent apart on a busy machine) costs no more than this.
MORE_ROUNDS_SECONDS = 3.0
# At most this many samples per variant: four times the default iterations halves an interval's
# width (it narrows as 1/sqrt(n)), and keeps the bootstrap of a bucket's variants under a second
# and its records small.
MAX_SAMPLES = 400


@dataclass(frozen=True)
class Comparison:
    """`candidate` against `other` on their paired samples: `ratio`, how many times faster the
    candidate measured (median(other) / median(candidate)), and that ratio's 95% interval."""

    candidate: str
    other: str
    ratio: Optional[float]  # None: no samples to pair, or a median that is not positive
    interval: Optional[tuple[float, float]]  # None also below MIN_SAMPLES pairs: too few to tell
    pairs: int

    @property
    def displaces(self) -> bool:
        """The candidate is faster beyond the margin, at 95%."""
        return self.interval is not None and self.interval[0] > 1 + MARGIN

    @property
    def undecided(self) -> bool:
        """The point estimate says faster beyond the margin; the interval does not (yet)."""
        return not self.displaces and self.ratio is not None and self.ratio > 1 + MARGIN

    def __str__(self) -> str:
        if self.ratio is None:
            return f"{self.candidate} has no samples paired with {self.other}'s"
        how = f"{self.ratio:.2f}x faster" if self.ratio >= 1 else f"{1 / self.ratio:.2f}x slower"
        measured = f"{self.candidate} measured {how} than {self.other}"
        if self.pairs < MIN_SAMPLES:
            return f"{measured} on {self.pairs} paired samples, too few to tell (fewer than {MIN_SAMPLES})"
        if self.interval is None:
            return f"{measured}, with no interval to tell by"
        low, high = self.interval
        above = "wholly above" if self.displaces else "not wholly above"
        return (
            f"{measured} (95% interval {low:.2f}-{high:.2f} on {self.pairs} paired samples, {above} {1 + MARGIN:.2f})"
        )


@dataclass(frozen=True)
class Choice:
    variant: str  # the variant that serves the bucket
    reason: Optional[str] = None  # why the fastest variant by median does not serve; None where it does
    # comparisons that more rounds could decide in favour of a variant faster than `variant`
    undecided: tuple[Comparison, ...] = ()


def spread(samples: Sequence[float]) -> float:
    """Half the interquartile range: how far a typical sample lies from the median."""
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / 2


def compare(paired: PairedBootstrap, candidate: str, other: str) -> Comparison:
    """`candidate` against `other` on their paired samples."""
    pairs = paired.pairs(candidate, other)
    interval = paired.interval(other, candidate) if pairs >= MIN_SAMPLES else None
    low_high = None if interval is None else (interval[0], interval[1])
    return Comparison(candidate, other, paired.ratio(other, candidate), low_high, pairs)


def choose(measured: Mapping[str, VariantMeasure], incumbent: Optional[str] = None) -> Choice:
    """The variant that serves the bucket, among those measured and correct ("eager" must be),
    from their paired samples (`samples_ms`; a variant without any never displaces another).
    `incumbent`, the variant the published plan already serves, is the base in eager's place."""
    usable = {name: m for name, m in measured.items() if _usable(m)}
    if "eager" not in usable:
        raise ValueError("eager must be measured: it is the reference every variant is held to")
    paired = PairedBootstrap({name: m.samples_ms or [] for name, m in usable.items()})

    def speed(name: str) -> tuple[float, int]:  # fastest first; equal medians: the one that starts fastest
        return usable[name].ms or math.inf, _start_cost(name)

    base = incumbent if incumbent in usable else "eager"
    against_base = {name: compare(paired, name, base) for name in usable if name != base}
    contenders = [name for name, comparison in against_base.items() if comparison.displaces]
    served, leader = base, None
    ties: dict[str, Comparison] = {}  # the leader against each other contender
    if contenders:
        leader = min(contenders, key=speed)
        ties = {name: compare(paired, leader, name) for name in contenders if name != leader}
        served = min([leader, *(name for name, c in ties.items() if not c.displaces)], key=_start_cost)

    fastest, reason = min(usable, key=speed), None
    if fastest == leader and served != leader:  # tied with the leader, and starts faster
        reason = f"{ties[served]}: {served} serves, as a replica starts it faster"
    elif fastest != served:  # the fastest does not displace the base (or is the base, displaced)
        verdict = f"{base}, the published plan's variant, stays" if served == incumbent else f"{served} serves"
        reason = f"{against_base[fastest if fastest != base else served]}: {verdict}"
    beyond = (usable[served].ms or math.inf) / (1 + MARGIN)  # a median under it: faster than what serves
    undecided = [c for c in against_base.values() if c.undecided and (usable[c.candidate].ms or math.inf) < beyond]
    if served in ties and ties[served].undecided:
        undecided.append(ties[served])
    return Choice(served, reason, tuple(undecided))


def settle(
    samples: Mapping[str, Sequence[float]],
    time_more: Callable[[list[str], int], Mapping[str, Sequence[float]]],
    incumbent: Optional[str] = None,
    *,
    budget_s: float = MORE_ROUNDS_SECONDS,
    max_samples: int = MAX_SAMPLES,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, list[float]], Choice]:
    """The choice among variants timed in one interleaved run (`samples`: ms per call, all
    correct, eager among them), after more rounds where it is undecided; and every variant's
    samples, more rounds included. `time_more(names, iterations)` times those variants
    interleaved and returns their new samples.

    A round times the variants of the undecided comparisons, among those timed in every round so
    far (so that sample i of any two variants stays one iteration's pair), doubles their samples
    (at least MIN_SAMPLES more), and fits in what is left of `budget_s` at their medians' pace,
    the choice's own arithmetic counted; rounds stop at `max_samples`. Where they stop undecided,
    the base (the published plan's variant, else eager) stays and the reason says so."""
    deadline = clock() + budget_s
    grown = {name: list(values) for name, values in samples.items()}
    choice = _choose_on(grown, incumbent)
    timing = list(grown)
    while choice.undecided:
        involved = {name for c in choice.undecided for name in (c.candidate, c.other)}
        timing = [name for name in timing if name in involved]
        if len(timing) < 2:
            break
        count = max(len(grown[name]) for name in timing)
        pace_s = sum(statistics.median(grown[name]) for name in timing) / 1e3
        fits = int((deadline - clock()) / pace_s) if pace_s > 0 else max_samples
        iterations = min(max(count, MIN_SAMPLES), max_samples - count, fits)
        if iterations < MIN_SAMPLES:
            break
        for name, more in time_more(timing, iterations).items():
            grown[name].extend(more)
        choice = _choose_on(grown, incumbent)
    if choice.undecided:
        stop = f"at most {max_samples} samples and {budget_s:g} s a bucket"
        choice = replace(choice, reason=f"{choice.reason}; still undecided where more rounds stop ({stop})")
    return grown, choice


def _choose_on(samples: Mapping[str, list[float]], incumbent: Optional[str]) -> Choice:
    measured = {name: VariantMeasure(ok=True, ms=statistics.median(s), samples_ms=s) for name, s in samples.items()}
    return choose(measured, incumbent)


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


# Variants that serve the same compiled code captured the same way: where the first is built, the
# second cannot serve (equal speed, and ties go to the one a replica starts faster), so it is not
# built. `aot` is the config's compile without Inductor's CUDA graphs, saved, in a CUDA graph of
# our own: exactly `graphed`, without the Dynamo trace a replica pays to load `graphed`.
TWINS: dict[str, str] = {"graphed": "aot"}


def twin_built(name: str, built: Mapping[str, VariantMeasure]) -> Optional[str]:
    """Why `name` is not built, where its twin is built and correct; else None."""
    twin = TWINS.get(name)
    measure = built.get(twin) if twin else None
    if measure is None or not measure.ok:
        return None
    return (
        f"not built: {twin} is the same compiled code captured the same way, and a replica starts it "
        f"faster, so {name} cannot serve"
    )


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
    directory: Path,
    spec: WarmupSpec,
    result: BucketResult,
    artifacts: Optional[Mapping[str, Any]] = None,
    load_bounds: Optional[Mapping[str, float]] = None,
) -> Optional[str]:
    """Write the bucket's serving plan into the namespace directory; its path relative to it,
    or None where the newest plan there already chose the same variant from the same artifacts
    (a warm rerun that confirms the choice publishes nothing new). Named by its content:
    published files are never replaced, so a changed choice adds a plan and readers take the
    newest (read_plans). `artifacts`: the files each built variant loads, relative to the
    directory (`aot`: its saved function and the platform it was built for), chosen or not.
    `load_bounds`: per output leaf, the RMS distance from eager the gate lets a variant have at a
    replica's load (Gate.load_bounds); they move with eager's rounding from run to run, so only
    whether a plan has them makes a new one."""
    artifacts = dict(artifacts or {})
    bounds = dict(load_bounds or {})
    current = read_plans(directory).get(result.bucket)
    if (
        current is not None
        and current["variant"] == result.variant
        and current.get("artifacts", {}) == artifacts
        and bool(current.get("load_bounds")) == bool(bounds)
    ):
        return None
    plan = {
        "format": PLAN_FORMAT,
        "bucket": result.bucket,
        "variant": result.variant,
        "variants": {name: asdict(m) for name, m in result.variants.items()},
        "artifacts": artifacts,
        "load_bounds": bounds,
        "config_hash": spec.identity_hash(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
    }
    body = json.dumps(plan, indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    rel = f"{PLAN_DIR}/plan-b{result.bucket}-{digest}.json"
    target = directory / rel
    write_whole(target, body)  # a reader (or a publish) never sees half a plan
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
