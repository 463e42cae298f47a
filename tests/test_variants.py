"""The serving choice on recorded timings, the candidates per device, the graphed compile, and the
serving plans written into a namespace. Torch-free and fast."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from orchestrator.jobs.records import BucketResult, VariantMeasure
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.jobs.stats import PairedBootstrap
from orchestrator.jobs.variants import (
    MARGIN,
    Choice,
    choose,
    compare,
    graphed_compile,
    read_plans,
    replays_into_buffers,
    serving_candidates,
    spread,
    twin_built,
    write_plan,
)


def m(ms, spread_ms=0.01, ok=True, reason=None, n=100):
    """A measured variant: `n` samples whose median is `ms` and whose half-IQR is about
    `spread_ms` (lognormal per-call noise, seeded by the figures: the same every run)."""
    if ms is None:
        return VariantMeasure(ok=ok, reason=reason)
    rng = random.Random(f"{ms} {spread_ms}")
    sigma = spread_ms / (0.674 * ms)  # a lognormal's half-IQR is about 0.674 sigma times its median
    raw = [rng.lognormvariate(0, sigma) for _ in range(n)]
    samples = [ms * x / statistics.median(raw) for x in raw]
    return VariantMeasure(ok=ok, ms=ms, spread_ms=spread(samples), reason=reason, samples_ms=samples)


def spec(**fields):
    return WarmupSpec.model_validate({"model": {"factory": "m:f"}, "inputs": [{"shape": ["batch", 4]}], **fields})


def test_spread_is_half_the_interquartile_range():
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(1.0)  # quartiles 2 and 4
    assert spread([3.0] * 10) == 0.0
    assert spread([1.0, 9.0]) == 0.0  # too few samples to have quartiles


def test_a_variant_displaces_another_only_where_the_ratios_interval_clears_the_margin():
    def against_eager(ms, spread_ms, n=100):
        samples = {"eager": m(1.0, spread_ms, n=n).samples_ms, "variant": m(ms, spread_ms, n=n).samples_ms}
        return compare(PairedBootstrap(samples), "variant", "eager")

    # 10% faster: each median is known to a percent or two, where one call's spread is 10%
    clear = against_eager(0.9, 0.1)
    assert clear.ratio == pytest.approx(1 / 0.9) and clear.interval[0] > 1 + MARGIN and clear.displaces
    assert "wholly above 1.02" in str(clear) and "not" not in str(clear)
    # faster beyond the margin, but the interval also holds 1: undecided, more rounds may tell
    wide = against_eager(0.9, 0.6)
    assert wide.interval[0] < 1 < wide.ratio and not wide.displaces and wide.undecided
    # faster by less than the margin: neither displaces nor is worth more rounds
    close = against_eager(0.995, 0.01)
    assert not close.displaces and not close.undecided
    # too few pairs to tell: no interval, whatever the point estimate
    few = against_eager(0.5, 0.01, n=5)
    assert few.interval is None and not few.displaces and few.undecided
    assert str(few) == "variant measured 2.00x faster than eager on 5 paired samples, too few to tell (fewer than 10)"
    # slower: said so the other way round
    assert str(against_eager(1.25, 0.0)).startswith("variant measured 1.25x slower than eager (95% interval 0.80-0.80")
    # no samples at all (a plan from before samples were kept): no ratio, never displaces
    none = compare(PairedBootstrap({"eager": m(1.0).samples_ms, "variant": []}), "variant", "eager")
    assert none.ratio is None and not none.displaces and not none.undecided


def test_the_fastest_correct_variant_wins():
    measured = {"eager": m(1.4), "compiled": m(1.2), "graphed": m(0.11), "eager-graphed": m(0.17)}
    assert choose(measured) == Choice("graphed")  # the fastest serves: nothing to explain


def test_eager_stays_when_nothing_is_clearly_faster():
    # compiled 4% faster inside a noise of 25% a call, graphed variants broken: eager serves, and says why
    measured = {
        "eager": m(1.0, 0.25),
        "compiled": m(0.96, 0.25),
        "graphed": m(None, ok=False, reason="cannot capture"),
        "eager-graphed": m(0.5, ok=False, reason="wrong output"),
    }
    choice = choose(measured)
    assert choice.variant == "eager"
    assert choice.reason == (
        "compiled measured 1.04x faster than eager (95% interval 0.87-1.22 on 100 paired samples, "
        "not wholly above 1.02): eager serves"
    )
    assert [(c.candidate, c.other) for c in choice.undecided] == [("compiled", "eager")]


def test_a_few_percent_on_a_quiet_machine_is_enough():
    # 5% faster with 5% of spread a call: a hundred paired calls tell, where one call's spread would not
    assert choose({"eager": m(1.0, 0.05), "compiled": m(0.95, 0.05)}).variant == "compiled"


def test_compiled_wins_over_eager_and_holds_against_a_graphed_variant_inside_its_noise():
    measured = {"eager": m(2.0), "compiled": m(1.0, 0.05), "graphed": m(0.99, 0.05)}
    choice = choose(measured)
    assert choice.variant == "compiled" and not choice.undecided
    assert choice.reason.startswith("graphed measured 1.01x faster than compiled (95% interval 0.98-1.05")
    assert choice.reason.endswith("compiled serves, as a replica starts it faster")


def test_a_graphed_variant_may_beat_eager_where_compiled_does_not():
    # small models: every compiled mode slower than eager, the eager module graphed is fastest
    measured = {"eager": m(1.07), "compiled": m(1.64), "graphed": m(0.80), "eager-graphed": m(0.775)}
    assert choose(measured).variant == "eager-graphed"


def test_a_fast_but_wrong_variant_never_wins():
    measured = {"eager": m(1.0), "compiled": m(0.1, ok=False, reason="output mismatch")}
    assert choose(measured) == Choice("eager")  # the fastest correct one serves


def test_eager_must_be_measured():
    with pytest.raises(ValueError, match="eager must be measured"):
        choose({"compiled": m(1.0)})


def test_candidates_per_device_and_backend():
    assert serving_candidates(spec(), "cuda") == (["eager", "compiled", "graphed", "eager-graphed", "aot"], {})
    assert serving_candidates(spec(), "cpu") == (["eager", "compiled"], {})  # aot's C++ build: only when asked
    assert serving_candidates(spec(serve={"variants": ["aot"]}), "cpu") == (["eager", "aot"], {})
    asked = spec(serve={"variants": ["eager-graphed", "compiled"]})
    assert asked.serve.variants == ["compiled", "eager-graphed"]  # one order everywhere
    assert serving_candidates(asked, "cuda") == (["eager", "compiled", "eager-graphed"], {})
    names, unavailable = serving_candidates(asked, "cpu")
    assert names == ["eager", "compiled"] and "needs CUDA" in unavailable["eager-graphed"]
    names, unavailable = serving_candidates(spec(compile={"backend": "aot_eager"}), "cuda")
    assert "graphed" not in names and "inductor" in unavailable["graphed"]


@pytest.mark.parametrize(
    "mode, options, expected",
    [
        ("reduce-overhead", {}, ("default", {})),
        ("max-autotune", {}, ("max-autotune-no-cudagraphs", {})),
        ("default", {"triton.cudagraphs": True, "epilogue_fusion": False}, ("default", {"epilogue_fusion": False})),
        (None, {}, (None, {})),
        ("max-autotune-no-cudagraphs", {}, ("max-autotune-no-cudagraphs", {})),
    ],
)
def test_the_graphed_compile_is_the_configs_without_cuda_graphs(mode, options, expected):
    assert graphed_compile(mode, options) == expected


@pytest.mark.parametrize(
    "serve, message",
    [
        ({"variants": []}, "at least one variant"),
        ({"variants": ["eager", "eager"]}, "listed twice"),
        ({"variants": ["fast"]}, "fast"),
        ({"oversize": "truncate"}, "truncate"),
    ],
)
def test_bad_serve_options_are_refused(serve, message):
    with pytest.raises(ValueError, match=message):
        spec(serve=serve)


def test_pad_values_must_fit_the_input_dtype_and_are_not_part_of_the_namespace():
    with pytest.raises(ValueError, match="whole number"):
        WarmupSpec.model_validate(
            {
                "model": {"factory": "m:f"},
                "inputs": [{"shape": ["batch"], "dtype": "int64", "range": [0, 9], "pad": 0.5}],
            }
        )
    with pytest.raises(ValueError, match="0 or 1"):
        WarmupSpec.model_validate(
            {"model": {"factory": "m:f"}, "inputs": [{"shape": ["batch"], "dtype": "bool", "pad": 2}]}
        )
    padded = WarmupSpec.model_validate({"model": {"factory": "m:f"}, "inputs": [{"shape": ["batch", 4], "pad": -1}]})
    assert padded.identity_hash() == spec().identity_hash()
    assert spec(serve={"variants": ["eager"]}).identity_hash() == spec().identity_hash()


def test_plans_are_named_by_content_and_the_newest_per_bucket_is_read(tmp_path):
    old = BucketResult(bucket=8, variant="compiled", variants={"eager": m(1.0), "compiled": m(0.5)})
    first = write_plan(tmp_path, spec(), old)
    assert first.startswith("serving/plan-b8-") and first.endswith(".json")
    confirmed = BucketResult(bucket=8, variant="compiled", variants={"eager": m(1.1), "compiled": m(0.6)})
    assert write_plan(tmp_path, spec(), confirmed) is None  # the same choice again: nothing new to publish
    new = BucketResult(bucket=8, variant="eager", variants={"eager": m(1.0), "compiled": m(1.5)})
    second = write_plan(tmp_path, spec(), new)
    other = write_plan(tmp_path, spec(), BucketResult(bucket=1, variant="compiled", variants={"eager": m(1.0)}))
    assert first and second and other and len({first, second, other}) == 3
    assert not list(tmp_path.rglob(".*.tmp"))
    plans = read_plans(tmp_path)
    assert sorted(plans) == [1, 8]
    assert plans[8]["variant"] == "eager" and plans[8]["variants"]["compiled"]["ms"] == 1.5
    written = json.loads((tmp_path / second).read_text())
    assert written["config_hash"] == spec().identity_hash()
    assert written["measured_at"].endswith("+00:00")  # UTC: plans from any machine compare by time
    # a plan of another format (a newer tool's) is left alone, and the others are still read
    (tmp_path / "serving" / "plan-b0-aaaa.json").write_text(json.dumps({"format": 99, "bucket": 8}))
    assert read_plans(tmp_path)[8]["variant"] == "eager"


def test_a_plan_names_the_package_its_variant_loads_and_a_new_package_is_a_new_plan(tmp_path):
    chosen = BucketResult(bucket=8, variant="aot", variants={"eager": m(1.0), "aot": m(0.2)})
    package = {"path": "aot/b8-0123456789abcdef.pt2", "platform": {"torch_version": "2.11.0"}}
    first = write_plan(tmp_path, spec(), chosen, {"aot": package})
    assert read_plans(tmp_path)[8]["artifacts"] == {"aot": package}
    assert write_plan(tmp_path, spec(), chosen, {"aot": package}) is None  # confirmed: nothing new
    rebuilt = {**package, "path": "aot/b8-fedcba9876543210.pt2"}
    second = write_plan(tmp_path, spec(), chosen, {"aot": rebuilt})
    assert second and second != first
    assert read_plans(tmp_path)[8]["artifacts"]["aot"]["path"] == rebuilt["path"]
    assert read_plans(tmp_path / "nothing-here") == {}


def test_among_the_others_the_fastest_is_tried_first():
    # both graphed variants clearly beat eager, and graphed clearly beats eager-graphed: it serves,
    # whatever order they were measured in
    measured = {"eager": m(1.0), "graphed": m(0.40, 0.02), "eager-graphed": m(0.50, 0.02)}
    assert choose(measured).variant == "graphed"
    assert choose(dict(reversed(list(measured.items())))).variant == "graphed"


def test_among_variants_tied_within_the_noise_the_one_that_starts_fastest_serves():
    # the transformer on the H200: three captured variants within 0.007 ms of each other; the
    # eager module captured needs no compile at load, a saved function no trace
    measured = {
        "eager": m(2.240, 0.344),
        "compiled": m(1.142, 0.063),
        "graphed": m(0.816, 0.013),
        "eager-graphed": m(0.811, 0.015),
        "aot": m(0.809, 0.016),
    }
    choice = choose(measured)
    assert choice.variant == "eager-graphed"
    assert choice.reason.startswith("aot measured 1.00x faster than eager-graphed (95% interval 0.99-1.01")
    # the MLP: aot and graphed tied, eager-graphed clearly slower: aot (no trace at load)
    measured = {"eager": m(1.858, 0.41), "graphed": m(0.123, 0.009), "eager-graphed": m(0.183, 0.006)}
    assert choose({**measured, "aot": m(0.116, 0.007)}).variant == "aot"
    # a tie never brings back a variant the winner is clearly faster than
    assert choose({"eager": m(1.0, 0.1), "compiled": m(0.5, 0.01), "graphed": m(0.2, 0.01)}).variant == "graphed"


def test_equal_latencies_tie_and_a_variant_without_samples_never_displaces():
    assert choose({"eager": m(1.0, 0.0), "compiled": m(1.0, 0.0)}) == Choice("eager")
    recorded = {"eager": VariantMeasure(ok=True, ms=1.0), "compiled": VariantMeasure(ok=True, ms=0.5)}
    choice = choose(recorded)  # a plan from before samples were kept: medians alone decide nothing
    assert choice.variant == "eager" and choice.reason == "compiled has no samples paired with eager's: eager serves"


@pytest.mark.parametrize(
    "variant, compile_options, replays",
    [
        ("eager", {"mode": "reduce-overhead"}, False),
        ("graphed", {"mode": "default"}, True),
        ("eager-graphed", {}, True),
        ("compiled", {"mode": "reduce-overhead"}, True),
        ("compiled", {"mode": "max-autotune"}, True),
        ("compiled", {"mode": "default"}, False),
        ("compiled", {"mode": "max-autotune-no-cudagraphs"}, False),
        ("compiled", {"mode": "default", "options": {"triton.cudagraphs": True}}, True),
        ("compiled", {"mode": "reduce-overhead", "options": {"triton.cudagraphs": False}}, False),
        ("compiled", {"backend": "aot_eager"}, False),
        ("compiled", {"backend": "cudagraphs"}, True),
        ("compiled", {"backend": "someone_elses"}, True),  # unknown: copied, which is always safe
    ],
)
def test_outputs_are_copied_out_of_exactly_the_variants_that_replay_into_buffers(variant, compile_options, replays):
    assert replays_into_buffers(variant, spec(compile=compile_options), "cuda") is replays


def test_aot_replays_into_buffers_only_where_it_is_captured():
    assert replays_into_buffers("aot", spec(), "cuda") is True
    assert replays_into_buffers("aot", spec(), "cpu") is False


def test_the_published_choice_holds_unless_another_is_clearly_faster_now():
    """A rerun measures eager a little faster than compiled, inside the noise: the published plan
    (compiled) stays. Only a clear win displaces it, and an incumbent that fails now is no incumbent."""
    measured = {"eager": m(1.00, 0.05), "compiled": m(1.02, 0.05), "graphed": m(1.5, 0.05)}
    assert choose(measured) == Choice("eager")
    kept = choose(measured, incumbent="compiled")
    assert kept.variant == "compiled"
    assert kept.reason == (
        "eager measured 1.02x faster than compiled (95% interval 1.00-1.05 on 100 paired samples, "
        "not wholly above 1.02): compiled, the published plan's variant, stays"
    )
    assert choose({**measured, "graphed": m(0.5, 0.05)}, incumbent="compiled") == Choice("graphed")
    failed = {**measured, "compiled": m(None, ok=False, reason="capture")}
    assert choose(failed, incumbent="compiled") == Choice("eager")
    assert choose(measured, incumbent="eager-graphed") == Choice("eager")  # not measured here: the rule decides


def test_graphed_is_not_built_where_aot_its_twin_is_built_and_correct():
    built = {"aot": VariantMeasure(ok=True, build_seconds=4.0)}
    reason = twin_built("graphed", built)
    assert reason is not None and reason.startswith("not built: aot is the same compiled code")
    # aot unavailable or wrong: graphed is the one that captures the config's compile whole
    assert twin_built("graphed", {"aot": VariantMeasure(ok=False, reason="graph break")}) is None
    assert twin_built("graphed", {}) is None
    # no other variant has a twin
    assert all(twin_built(name, built) is None for name in ("eager", "compiled", "eager-graphed", "aot"))
