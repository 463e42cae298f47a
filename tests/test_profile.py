"""`warmup --profile DIR`: the kernel classifier on real kernel names, the accounting, a real
profiler window on the CPU, the rendering, and (slow) a real `--no-ray` warmup of examples/mlp.yaml."""

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
import torch
from conftest import assert_measured, orchestrate
from rich.console import Console

from orchestrator.jobs import profiling
from orchestrator.jobs.profiling import Timed, account, classify, short_name
from orchestrator.reports.report import render_profile
from orchestrator.reports.schemas import report_schema

# Kernel names as the profiler reports them: Inductor's Triton kernels, cuBLAS/cuBLASLt (Hopper's
# xmma and nvjet families, Ampere's sgemm, gemv), CUTLASS, ATen's own CUDA kernels, copies.
GELU = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
    "std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
    "::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"
)
LAYER_NORM = (
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, "
    "float const*, float const*, float*, float*, float*)"
)
CUDA_NAMES = {
    "triton_poi_fused_add_native_layer_norm_0": "inductor",
    "triton_red_fused_native_layer_norm_1": "inductor",
    "triton_per_fused_gelu_native_layer_norm_2": "inductor",
    "triton_tem_fused_addmm_0": "inductor",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": (
        "aten"
    ),
    "nvjet_tst_64x8_64x16_4x1_v_bz_TNT": "aten",
    "ampere_sgemm_32x32_sliced1x4_tn": "aten",
    "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(float)": "aten",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)": "aten",
    GELU: "aten",
    LAYER_NORM: "aten",
    "Memcpy DtoD (Device -> Device)": "other",
    "Memset (Device)": "other",
}
# ... and on the CPU: ATen ops, Inductor's compiled graph call and C++ kernels, Dynamo's wrappers.
CPU_NAMES = {
    "aten::addmm": "aten",
    "aten::gelu": "aten",
    "aten::native_layer_norm": "aten",
    "## Call CompiledFxGraph f7k3ouwe37ns3ivgigip6zeqq4eedsfg3y62 ##": "inductor",
    "cpp_fused_add_native_layer_norm_0": "inductor",
    "TorchDynamo Cache Lookup": "other",
    "Torch-Compiled Region: 0/0": "other",
    "AOTDispatcher Runtime Wrapper Prologue": "other",
}


@pytest.mark.parametrize("name,kind", [*CUDA_NAMES.items(), *CPU_NAMES.items()])
def test_kernels_are_classified_by_the_documented_rule(name, kind):
    assert classify(name) == kind


def test_short_names_drop_arguments_and_inner_namespaces():
    assert short_name("triton_poi_fused_add_native_layer_norm_0") == "triton_poi_fused_add_native_layer_norm_0"
    assert short_name(LAYER_NORM) == "at::native::vectorized_layer_norm_kernel<float, float>"
    gelu = short_name(GELU)
    assert gelu.startswith("at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl")
    assert len(gelu) == profiling.NAME_LIMIT and gelu.endswith("…")
    assert (
        short_name("## Call CompiledFxGraph f7k3ouwe37ns3ivgigip6zeqq4eedsfg3y62 ##") == "CompiledFxGraph f7k3ouwe37ns"
    )
    assert short_name("void gemv2T_kernel_val<int, float, 128>(float)") == "gemv2T_kernel_val<int, float, 128>"
    assert short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"


def test_accounting_sums_by_name_and_kind():
    timed = [
        Timed("triton_poi_fused_gelu_0", 3.0),
        Timed("triton_poi_fused_gelu_0", 3.0),
        Timed("triton_red_fused_native_layer_norm_1", 2.0),
        Timed("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 10.0),
        Timed("Memcpy DtoD (Device -> Device)", 2.0),
    ]
    profile = account(timed, calls=2, time_kind="cuda", trace="t.json.gz")
    assert (profile.total_us, profile.per_call_us) == (20.0, 10.0)
    assert (profile.inductor_kernels, profile.aten_kernels, profile.other_kernels) == (2, 1, 1)
    assert (profile.inductor_share, profile.aten_share, profile.other_share) == (0.4, 0.5, 0.1)
    assert [(k.name, k.kind, k.total_us, k.calls, k.share) for k in profile.top] == [
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "aten", 10.0, 1, 0.5),
        ("triton_poi_fused_gelu_0", "inductor", 6.0, 2, 0.3),
        ("triton_red_fused_native_layer_norm_1", "inductor", 2.0, 1, 0.1),
        ("Memcpy DtoD (Device -> Device)", "other", 2.0, 1, 0.1),
    ]


def test_a_window_without_kernels_is_an_error_not_zeros():
    with pytest.raises(ValueError, match="no GPU kernels"):
        account([], calls=10, time_kind="cuda", trace="t.json.gz")


def test_a_real_cpu_window_writes_a_trace_and_counts_aten_ops(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    x = torch.randn(4, 16)
    trace = tmp_path / "m-b4-eager.json.gz"
    profile = profiling.profile_call(lambda: model(x), trace, torch.device("cpu"))
    assert profile.time_kind == "cpu" and profile.calls == profiling.PROFILED_CALLS
    assert profile.aten_kernels > 0 and profile.inductor_kernels == 0
    assert {"aten::addmm", "aten::gelu"} <= {k.name for k in profile.top}
    gelu = next(k for k in profile.top if k.name == "aten::gelu")
    assert gelu.calls == profiling.PROFILED_CALLS  # the warm-up calls are dropped
    assert profile.trace == str(trace)
    assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert [p.name for p in tmp_path.iterdir()] == [trace.name]  # no partial file left behind


def test_a_failing_variant_gets_a_reason_and_the_others_still_profile(tmp_path):
    def broken():
        raise RuntimeError("replay failed\nsecond line")

    calls = {"eager": lambda: torch.ones(4).sum(), "graphed": broken}
    profile = profiling.profile_bucket(
        calls, served="graphed", directory=tmp_path, prefix="m", bucket=4, device=torch.device("cpu")
    )
    assert list(profile.variants) == ["eager"]
    assert profile.unavailable == {"graphed": "RuntimeError: replay failed"}
    assert (tmp_path / "m-b4-eager.json.gz").is_file() and not (tmp_path / "m-b4-graphed.json.gz").exists()


def test_an_unusable_directory_is_every_variant_s_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    profile = profiling.profile_bucket(
        {"eager": lambda: None, "compiled": lambda: None},
        served="eager",
        directory=blocker / "traces",
        prefix="m",
        bucket=1,
        device=torch.device("cpu"),
    )
    assert profile.variants == {} and set(profile.unavailable) == {"eager", "compiled"}
    assert all("trace directory" in reason for reason in profile.unavailable.values())


def test_render_profile_prints_kernel_names_verbatim():
    kernel = {"name": "k[inductor]<1>", "kind": "inductor", "total_us": 50.0, "calls": 10, "share": 0.5}
    variant = {
        "trace": "/traces/m-b1-compiled.json.gz",
        "time_kind": "cuda",
        "calls": 10,
        "total_us": 100.0,
        "per_call_us": 10.0,
        "inductor_kernels": 1,
        "inductor_share": 0.5,
        "aten_kernels": 1,
        "aten_share": 0.5,
        "other_kernels": 0,
        "other_share": 0.0,
        "top": [kernel],
    }
    report = {
        "executor": {"kind": "process"},
        "results": [
            {
                "bucket": 1,
                "rank": 0,
                "profile": {"served": "compiled", "variants": {"compiled": variant}, "unavailable": {"eager": "why"}},
            },
            {"bucket": 8, "rank": 0, "profile": None},  # profiled nothing: left out
        ],
    }
    console = Console(record=True, width=200)
    render_profile(report, console)
    text = console.export_text()
    assert "profile bucket 1: serves compiled; GPU kernel time" in text
    assert "compiled *" in text and "10.0 us/call" in text
    assert "k[inductor]<1>" in text  # brackets are not taken for markup
    assert "eager: no profile: why" in text
    assert "traces (1, " in text and "/traces" in text
    assert "bucket 8" not in text


def test_a_file_as_the_profile_directory_is_a_usage_error(tmp_path):
    blocker = tmp_path / "traces"
    blocker.write_text("")
    run = orchestrate("warmup", "--no-ray", "--model", "examples/mlp.yaml", "--profile", str(blocker))
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"orchestrate: error: --profile {blocker}: is a file; give a directory for the trace files"
    ]


@pytest.mark.slow
def test_a_real_warmup_profiles_eager_and_compiled(profiled_warmup):
    report, traces = profiled_warmup.report, profiled_warmup.traces
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    for record in report["results"]:
        assert_measured(record)
        bucket, profile = record["bucket"], record["profile"]
        assert profile["served"] == record["variant"] and profile["unavailable"] == {}
        # eager, the config's compiled variant, and the served one (on the CPU one of those two)
        assert set(profile["variants"]) == {"eager", "compiled"}
        for name, variant in profile["variants"].items():
            assert variant["time_kind"] == "cpu"
            assert variant["trace"] == str(traces / f"mlp-b{bucket}-{name}.json.gz")
            assert json.loads(gzip.decompress(Path(variant["trace"]).read_bytes()))["traceEvents"]
            assert variant["total_us"] > 0 and variant["top"]
        eager, compiled = profile["variants"]["eager"], profile["variants"]["compiled"]
        assert eager["inductor_kernels"] == 0 and eager["aten_kernels"] > 0
        assert compiled["inductor_kernels"] > 0 and compiled["inductor_share"] > 0
    assert sorted(p.name for p in traces.iterdir()) == [
        f"mlp-b{bucket}-{name}.json.gz" for bucket in (1, 2) for name in ("compiled", "eager")
    ]
    assert "profile bucket 1: serves" in profiled_warmup.run.stdout


@pytest.mark.slow
def test_a_ray_rank_profiles_into_its_own_files(profiled_ray_warmup, tmp_path):
    report, traces = profiled_ray_warmup.report, profiled_ray_warmup.traces
    compile_record, warm_record = sorted(report["results"], key=lambda r: r["phase"] != "compile")
    assert compile_record["profile"] is None  # a compile unit benchmarks nothing, so profiles nothing
    variants = warm_record["profile"]["variants"]
    assert set(variants) == {"eager", "compiled"} and variants["compiled"]["inductor_kernels"] > 0
    assert sorted(p.name for p in traces.iterdir()) == ["mlp-r0-b1-compiled.json.gz", "mlp-r0-b1-eager.json.gz"]
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report))
    shown = orchestrate("report", str(saved))
    assert shown.returncode == 0, shown.stderr
    assert "profile bucket 1 rank 0: serves" in shown.stdout
