"""The serving choice against noise: measurements that once chose wrongly, rebuilt as paired
samples, and the more rounds taken where one run cannot decide. Torch-free and fast."""

from __future__ import annotations

import random
import statistics

import pytest

from orchestrator.jobs.records import VariantMeasure
from orchestrator.jobs.stats import MIN_SAMPLES, PairedBootstrap, paired_scale, ratio_interval
from orchestrator.jobs.variants import Choice, choose, settle, spread


def timings(variants, n=100, load=0.0, seed=0):
    """Paired samples as Clock.interleaved records them. `variants`: name -> (median ms, sigma of
    its per-call lognormal noise); `load`: sigma of a lognormal factor per iteration that every
    variant shares (other tenants, clocks). Each variant's samples are scaled to the median given."""
    rng = random.Random(seed)
    raw: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(n):
        machine = rng.lognormvariate(0, load)
        for name, (_, noise) in variants.items():
            raw[name].append(machine * rng.lognormvariate(0, noise))
    return {name: [variants[name][0] * x / statistics.median(xs) for x in xs] for name, xs in raw.items()}


def measured(samples):
    return {
        name: VariantMeasure(ok=True, ms=statistics.median(s), spread_ms=spread(s), samples_ms=s)
        for name, s in samples.items()
    }


def within_spreads(a: VariantMeasure, b: VariantMeasure) -> bool:
    """Whether the half-IQR of single calls swallows the difference (the rule this one replaced)."""
    return abs(a.ms - b.ms) <= a.spread_ms + b.spread_ms


@pytest.mark.parametrize(
    "bucket, eager_ms, eager_noise, graphed_ms", [(8, 0.077, 0.55, 0.049), (32, 0.097, 0.75, 0.050)]
)
def test_a_one_layer_model_on_an_h200_serves_eager_graphed(bucket, eager_ms, eager_noise, graphed_ms):
    """An H200, one linear layer with two inputs: eager's launches jitter widely, the captured
    graph replays tightly. Eager's half-IQR alone exceeds the difference of the medians, yet a
    hundred paired calls put eager-graphed 1.4x faster and more."""
    samples = timings(
        {"eager": (eager_ms, eager_noise), "compiled": (0.110, 0.05), "eager-graphed": (graphed_ms, 0.03)}, seed=2
    )
    variants = measured(samples)
    assert within_spreads(variants["eager"], variants["eager-graphed"])
    assert ratio_interval(samples["eager"], samples["eager-graphed"])[0] > 1.35
    assert choose(variants) == Choice("eager-graphed")


def test_a_busy_two_core_machine_serves_compiled_where_it_measures_1_84x_faster():
    """Bucket 1 on a busy 2-core machine: every call disturbed by other tenants (the same
    iteration's calls alike) and by its own jitter. Compiled is 1.84x faster, 95% interval
    1.68-2.11: it serves, where the spreads of single calls overlapped."""
    samples = timings({"eager": (1.0, 0.3), "compiled": (0.543, 0.3)}, load=0.4, seed=1)
    variants = measured(samples)
    assert within_spreads(variants["eager"], variants["compiled"])
    low, high = ratio_interval(samples["eager"], samples["compiled"])
    assert (round(low, 2), round(high, 2)) == (1.68, 2.11)
    assert choose(variants) == Choice("compiled")


def test_an_incumbent_survives_a_measurement_that_does_not_exclude_it():
    """The published plan serves graphed; a rerun measures aot 2% faster with an interval down
    to 1: the plan stays, and says why. Without a plan, the tie goes to the one that starts faster."""
    samples = timings({"eager": (1.0, 0.1), "graphed": (0.204, 0.05), "aot": (0.200, 0.05)}, seed=3)
    variants = measured(samples)
    kept = choose(variants, incumbent="graphed")
    assert kept.variant == "graphed"
    assert kept.reason.startswith("aot measured 1.02x faster than graphed (95% interval 1.00-1.04")
    assert kept.reason.endswith("not wholly above 1.02): graphed, the published plan's variant, stays")
    assert choose(variants).variant == "aot"
    # a clear win displaces the plan
    faster = timings({"eager": (1.0, 0.1), "graphed": (0.204, 0.05), "aot": (0.150, 0.05)}, seed=3)
    assert choose(measured(faster), incumbent="graphed") == Choice("aot")


def test_paired_intervals_of_many_pairs_are_those_of_each_pair_alone():
    samples = timings({"a": (1.0, 0.2), "b": (0.8, 0.2), "c": (0.5, 0.4)}, n=60, load=0.2)
    samples["d"] = samples["c"][:25]  # timed in fewer rounds: paired with the first samples of the others
    paired = PairedBootstrap(samples)
    for x in samples:
        for y in samples:
            assert paired.interval(x, y) == ratio_interval(samples[x], samples[y])
    assert paired.pairs("a", "d") == 25
    assert paired.ratio("a", "d") == statistics.median(samples["a"][:25]) / statistics.median(samples["d"])


class Machine:
    """Times more rounds from the same distributions as the first, on a fake clock that each
    round advances by its calls' latency (plus `overhead_s` a round)."""

    def __init__(self, variants, load=0.0, seed=10, overhead_s=0.0):
        self.variants, self.load, self.seed, self.overhead_s = variants, load, seed, overhead_s
        self.now = 0.0
        self.rounds: list[tuple[list[str], int]] = []

    def clock(self) -> float:
        return self.now

    def time_more(self, names, iterations):
        self.rounds.append((list(names), iterations))
        more = timings({n: self.variants[n] for n in names}, iterations, self.load, self.seed + len(self.rounds))
        self.now += sum(sum(s) for s in more.values()) / 1e3 + self.overhead_s
        return more


def test_an_undecided_comparison_takes_more_rounds_of_its_variants_only():
    """Compiled 6% faster than eager in a noise of 25% a call: a hundred pairs cannot tell, four
    hundred can. Graphed is decidedly slower and is not timed again."""
    variants = {"eager": (1.0, 0.25), "compiled": (0.94, 0.25), "graphed": (1.5, 0.05)}
    first = timings(variants, seed=4)
    assert choose(measured(first)).variant == "eager"
    assert [(c.candidate, c.other) for c in choose(measured(first)).undecided] == [("compiled", "eager")]
    machine = Machine(variants)
    samples, choice = settle(first, machine.time_more, clock=machine.clock)
    assert choice == Choice("compiled")
    assert machine.rounds == [(["eager", "compiled"], 100), (["eager", "compiled"], 200)]
    assert {name: len(s) for name, s in samples.items()} == {"eager": 400, "compiled": 400, "graphed": 100}
    assert samples["eager"][:100] == first["eager"]  # the first run's samples stay, in order


def test_a_decided_choice_takes_no_more_rounds():
    for variants in (
        {"eager": (1.0, 0.05), "compiled": (0.5, 0.05)},  # decidedly faster
        {"eager": (1.0, 0.05), "compiled": (0.995, 0.05)},  # within the margin: a tie, nothing to decide
    ):
        machine = Machine(variants)
        settle(timings(variants), machine.time_more, clock=machine.clock)
        assert machine.rounds == []


def test_where_the_budget_runs_out_undecided_the_base_stays_and_says_so():
    """Rounds fit the time left at the variants' pace; after the first, none is left."""
    variants = {"eager": (1.0, 0.6), "compiled": (0.95, 0.6)}
    machine = Machine(variants, overhead_s=2.9)
    samples, choice = settle(timings(variants, seed=5), machine.time_more, budget_s=3.0, clock=machine.clock)
    assert [iterations for _, iterations in machine.rounds] == [100]
    assert choice.variant == "eager" and len(samples["eager"]) == 200
    assert choice.reason.startswith("compiled measured")
    assert choice.reason.endswith(
        "eager serves; still undecided where more rounds stop (at most 400 samples and 3 s a bucket)"
    )
    # a slow model whose first run leaves no room for MIN_SAMPLES more calls takes none
    slow = {"eager": (400.0, 0.6), "compiled": (380.0, 0.6)}
    machine = Machine(slow)
    _, choice = settle(timings(slow, seed=5), machine.time_more, budget_s=3.0, clock=machine.clock)
    assert machine.rounds == [] and choice.variant == "eager" and "still undecided" in choice.reason


def test_rounds_stop_at_the_sample_cap_and_start_from_few_samples():
    variants = {"eager": (1.0, 0.6), "compiled": (0.97, 0.6)}
    machine = Machine(variants)
    samples, _ = settle(timings(variants, n=3), machine.time_more, max_samples=50, clock=machine.clock)
    # three samples cannot tell at all: the first round takes MIN_SAMPLES more, then doubles
    assert machine.rounds[0][1] == MIN_SAMPLES
    assert [iterations for _, iterations in machine.rounds] == [10, 13, 24]
    assert {name: len(s) for name, s in samples.items()} == {"eager": 50, "compiled": 50}


def test_an_undecided_tie_break_takes_more_rounds_of_the_leader_and_the_tied_variant():
    """Graphed and aot both displace eager; graphed leads by 6% in a noise of 20% a call, so aot
    (it starts faster) would serve on a tie. More rounds of the two tell them apart."""
    variants = {"eager": (1.0, 0.05), "graphed": (0.188, 0.2), "aot": (0.200, 0.2)}
    first = timings(variants, seed=6)
    undecided = choose(measured(first)).undecided
    assert [(c.candidate, c.other) for c in undecided] == [("graphed", "aot")]
    machine = Machine(variants)
    _, choice = settle(first, machine.time_more, clock=machine.clock)
    assert {tuple(names) for names, _ in machine.rounds} == {("graphed", "aot")}
    assert choice == Choice("graphed")


def test_a_padded_request_is_priced_on_the_benchmarks_footing_through_its_pairs():
    """A grid point's padded request, timed beside the served call in rounds of which most met a
    slowed host (as on a shared GPU machine: 16 to 20 of 20 rounds): each pair slows alike, so the
    price is the benchmark's served latency times the pairs' ratio, not the slowed median."""
    served = [0.258] * 4 + [0.41] * 6  # ms: 6 of 10 rounds on a slowed host
    padded = [ms * 1.05 for ms in served]  # padding, cut and copy: 5% over the call at the point
    padded[1] = 0.9  # one burst that hit the padded call alone
    assert sorted(padded)[5] > 0.4  # its own median carries the slowdown
    assert paired_scale(0.258, padded, served) == pytest.approx(0.258 * 1.05)
