"""The platform facts of a cache namespace (cache.namespace.Platform) without importing torch.

`orchestrate pull` runs in a serving replica's init container, where importing torch is about a
second of its start for four strings. Every fact torch would give is read where torch itself
reads it:

- torch's version, git commit and CUDA version: torch/version.py, a plain module of constants,
  loaded from torch's installed package on its own (importing `torch.version` would run torch's
  __init__);
- whether torch would use a GPU, and the GPU's name: the CUDA driver API (libcuda) that torch's
  CUDA runtime is built on. cuDeviceGetName of device 0 is the name cudaGetDeviceProperties gives
  torch.cuda.get_device_name(0): the same device order (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)
  and the same string.

Where the answer could differ from torch's, probe() returns None and the caller asks torch:
a ROCm or XPU build, PYTORCH_NVML_BASED_CUDA_CHECK, a driver older than the CUDA that torch was
built for (torch would see no GPU), device 'cuda' with no GPU (torch's error names the cause),
or a libcuda that fails in any other way. Its result must be exactly what
torch_internals.current_platform gives, or pull would look for another namespace.
"""

from __future__ import annotations

import ctypes
import importlib.util
import platform as host_platform
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Optional

from orchestrator.cache.namespace import Platform, namespace

if TYPE_CHECKING:
    from orchestrator.jobs.spec import WarmupSpec

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100  # cuInit with no GPU visible (CUDA_VISIBLE_DEVICES="" included)


def triton_version() -> Optional[str]:
    for dist in ("triton", "pytorch-triton"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def torch_version_module() -> Optional[ModuleType]:
    """torch/version.py of the torch that `import torch` would load, run alone; None if absent."""
    if "torch" in sys.modules:  # imported already: its own answer costs nothing
        return sys.modules["torch"].version
    found = importlib.util.find_spec("torch")
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / "version.py"
    spec = importlib.util.spec_from_file_location("_orchestrate_torch_version", path)
    if spec is None or spec.loader is None or not path.is_file():
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_gpu_name(built_for: str) -> Optional[str]:
    """Device 0's name through libcuda; "" where there is no GPU (torch would run on the CPU);
    None where the driver cannot settle it as torch's runtime would (the caller asks torch)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return ""  # no NVIDIA driver: torch.cuda.is_available() is False too
    try:
        status = cuda.cuInit(0)
        if status == CUDA_ERROR_NO_DEVICE:
            return ""
        count, version = ctypes.c_int(0), ctypes.c_int(0)
        if status != CUDA_SUCCESS or cuda.cuDeviceGetCount(ctypes.byref(count)) != CUDA_SUCCESS:
            return None
        if count.value == 0:
            return ""
        if cuda.cuDriverGetVersion(ctypes.byref(version)) != CUDA_SUCCESS:
            return None
        major = int(built_for.split(".")[0])
        if version.value // 1000 < major:  # torch's runtime refuses this driver: it would see no GPU
            return None
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        if cuda.cuDeviceGet(ctypes.byref(device), 0) != CUDA_SUCCESS:
            return None
        if cuda.cuDeviceGetName(name, len(name), device) != CUDA_SUCCESS:
            return None
        return name.value.decode()
    except (AttributeError, ValueError):  # a libcuda without these entry points, an odd version
        return None


def probe(device: str, environ: Optional[dict[str, str]] = None) -> Optional[Platform]:
    """The Platform that torch_internals.current_platform(resolve_device(device)) gives, or None
    where only torch can say."""
    import os

    environ = dict(os.environ) if environ is None else environ
    version = torch_version_module()
    if version is None or getattr(version, "hip", None) or getattr(version, "xpu", None):
        return None
    if environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"):
        return None
    gpu: Optional[str] = ""
    if device != "cpu" and version.cuda:
        gpu = cuda_gpu_name(version.cuda)
    if gpu is None or (device == "cuda" and not gpu):
        return None
    return Platform(
        torch_version=str(version.__version__),
        torch_git=getattr(version, "git_version", "unknown"),
        triton_version=triton_version(),
        cuda_version=version.cuda,
        gpu_name=gpu or f"cpu-{host_platform.machine()}",
        python_version=".".join(map(str, sys.version_info[:3])),
    )


def cache_platform(spec: WarmupSpec) -> Platform:
    """The Platform engine.cache_namespace(spec) names, from the probe where it can answer; torch
    is imported only where it cannot."""
    found = probe(spec.device)
    if found is None:
        from orchestrator.jobs import torch_internals
        from orchestrator.jobs.model import resolve_device

        return torch_internals.current_platform(resolve_device(spec.device))
    return found


def cache_namespace(spec: WarmupSpec) -> str:
    """engine.cache_namespace(spec), without torch where the probe can answer."""
    return namespace(spec.label, cache_platform(spec), spec.identity_hash())
