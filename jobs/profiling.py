"""`warmup --profile DIR`: a short torch.profiler window around each variant of a bucket, after its
benchmark, written as a Chrome trace and summed up as kernels Inductor generated against ATen's.

The window: WARMUP_CALLS calls the profiler records and drops (its own start-up cost falls there),
then PROFILED_CALLS calls it keeps. On a GPU every call is followed by a synchronize, so that each
call's kernels finish inside its step; the time is the device time of the GPU kernels. On the CPU
the time is the self CPU time of each op: Inductor's generated C++ kernels run inside its compiled
graph's call (`## Call CompiledFxGraph <key> ##`), so that call's self time is theirs.

The classification rule (`classify`), on the full kernel or op name:
  inductor  Triton kernels Inductor names `triton_<kind>_...` (poi, red, per, tem, ...), its C++
            kernels `cpp_fused_...` where they are recorded, and its compiled graph's call on CPU
  aten      ATen ops (`aten::...`) and kernels (`at::native::...`), and the vendor libraries ATen
            calls (cuBLAS/cuBLASLt: `...gemm...`, `...gemv...`, `sm90_xmma_...`, `nvjet_...`;
            cuDNN; CUTLASS): in a compiled variant these are its extern fallbacks
  other     everything else: memcpy/memset, Dynamo's and AOTAutograd's wrappers, runtime calls
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import torch

from orchestrator.cache.files import replacing
from orchestrator.jobs.errors import brief
from orchestrator.jobs.records import BucketProfile, KernelTime, VariantProfile

WARMUP_CALLS = 3
PROFILED_CALLS = 10
TOP_KERNELS = 8
NAME_LIMIT = 80  # characters of a shortened kernel name

Kind = Literal["inductor", "aten", "other"]

_INDUCTOR = re.compile(r"^(triton_[a-z]+_|cpp_fused|## Call CompiledFxGraph)")
_ATEN = re.compile(r"^aten::|\bat::|gemm|gemv|xmma|nvjet|cutlass|cublas|cudnn|splitkreduce|^cunn_", re.IGNORECASE)
_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph\s+(\S+)\s*##$")
_QUALIFIER = re.compile(r"(?:\(anonymous namespace\)::|\b[A-Za-z_]\w*::)+")


def classify(name: str) -> Kind:
    """Which code a kernel (GPU) or op (CPU) is: see the module doc for the rule."""
    if _INDUCTOR.search(name):
        return "inductor"
    if _ATEN.search(name):
        return "aten"
    return "other"


def short_name(name: str) -> str:
    """A kernel's name for a table: no `void`, no argument list, no namespaces inside its template
    arguments (`at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl...`), at most
    NAME_LIMIT characters. C++ kernel names run to hundreds of characters; the trace keeps them."""
    graph = _GRAPH_CALL.match(name.strip())
    if graph:
        return f"CompiledFxGraph {graph.group(1)[:12]}"
    name = " ".join(name.split())
    if name.startswith("void ") or "::" in name:  # a C++ signature (not `Memcpy DtoD (Device -> Device)`)
        name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
        depth = 0
        for i, char in enumerate(name):
            if char == "<":
                depth += 1
            elif char == ">":
                depth -= 1
            elif char == "(" and depth == 0 and i > 0:  # the argument list of the function itself
                name = name[:i].rstrip()
                break
    head, bracket, rest = name.partition("<")
    name = head + bracket + _QUALIFIER.sub("", rest)
    return name if len(name) <= NAME_LIMIT else name[: NAME_LIMIT - 1] + "…"


@dataclass(frozen=True)
class Timed:
    """One recorded kernel (or op) execution: its full name and its time in microseconds."""

    name: str
    us: float


def account(timed: Iterable[Timed], *, calls: int, time_kind: Literal["cuda", "cpu"], trace: str) -> VariantProfile:
    """Sum the window's kernels by name and by kind (torch-free: fed from the profiler's events)."""
    by_name: dict[str, list[float]] = {}
    for item in timed:
        by_name.setdefault(item.name, []).append(item.us)
    total = sum(sum(times) for times in by_name.values())
    if not by_name or total <= 0:
        raise ValueError(
            "the profiler recorded no GPU kernels" if time_kind == "cuda" else "the profiler recorded no op time"
        )
    kinds: dict[Kind, list[float]] = {"inductor": [], "aten": [], "other": []}
    kernels: list[KernelTime] = []
    for name, times in by_name.items():
        kind = classify(name)
        kinds[kind].append(sum(times))
        kernels.append(
            KernelTime(short_name(name), kind, round(sum(times), 3), len(times), round(sum(times) / total, 4))
        )
    kernels.sort(key=lambda k: k.total_us, reverse=True)
    return VariantProfile(
        trace=trace,
        time_kind=time_kind,
        calls=calls,
        total_us=round(total, 3),
        per_call_us=round(total / calls, 3),
        inductor_kernels=len(kinds["inductor"]),
        inductor_share=round(sum(kinds["inductor"]) / total, 4),
        aten_kernels=len(kinds["aten"]),
        aten_share=round(sum(kinds["aten"]) / total, 4),
        other_kernels=len(kinds["other"]),
        other_share=round(sum(kinds["other"]) / total, 4),
        top=kernels[:TOP_KERNELS],
    )


def trace_path(directory: Path, prefix: str, bucket: int, variant: str) -> Path:
    """`DIR/<prefix>-b<bucket>-<variant>.json.gz`; the prefix is the model's name, and on Ray the
    rank's too (`<model>-r<rank>`), so ranks sharing a node's directory never overwrite each other."""
    return directory / f"{prefix}-b{bucket}-{variant}.json.gz"


def profile_bucket(
    calls: dict[str, Callable[[], Any]],
    *,
    served: Optional[str],
    directory: Path,
    prefix: str,
    bucket: int,
    device: torch.device,
) -> BucketProfile:
    """Profile each variant in `calls` (name -> a call as the benchmark timed it). A variant whose
    window fails gets a reason in `unavailable`; this never raises for it."""
    profile = BucketProfile(served=served)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        profile.unavailable = {name: f"trace directory {directory}: {brief(exc)}" for name in calls}
        return profile
    for name, call in calls.items():
        try:
            profile.variants[name] = profile_call(call, trace_path(directory, prefix, bucket, name), device)
        except Exception as exc:  # a profile is an extra: its failure is recorded, never the bucket's
            profile.unavailable[name] = brief(exc)
    return profile


def profile_call(call: Callable[[], Any], trace: Path, device: torch.device) -> VariantProfile:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    results: list[VariantProfile] = []

    def ready(prof: Any) -> None:
        # torch names the trace's format by its suffix: the scratch keeps the target's name at its end
        with replacing(trace) as partial:
            prof.export_chrome_trace(str(partial))
        if cuda:  # the kernels themselves: events on the device, timed by CUPTI
            timed = [
                Timed(e.name, e.time_range.elapsed_us())
                for e in prof.events()
                if e.device_type == DeviceType.CUDA and not _annotation(e)
            ]
        else:
            timed = [
                Timed(e.name, e.self_cpu_time_total)
                for e in prof.events()
                if e.device_type == DeviceType.CPU and not e.is_async and not _annotation(e)
            ]
        results.append(account(timed, calls=PROFILED_CALLS, time_kind="cuda" if cuda else "cpu", trace=str(trace)))

    window = schedule(wait=0, warmup=WARMUP_CALLS, active=PROFILED_CALLS, repeat=1)
    with torch.no_grad(), profile(activities=activities, schedule=window, on_trace_ready=ready) as prof:
        for _ in range(WARMUP_CALLS + PROFILED_CALLS):
            call()
            if cuda:
                torch.cuda.synchronize(device)
            prof.step()
    if not results:
        raise RuntimeError("the profiler closed no window")
    return results[0]


def _annotation(event: Any) -> bool:
    """A range the profiler or a user marked (each `ProfilerStep#N`, `record_function`), mirrored
    onto the GPU's timeline over the kernels it spans: counting it would count those kernels twice."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith("ProfilerStep")
