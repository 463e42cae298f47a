"""Every use of a private or version-sensitive torch API lives here, so drift between torch
releases (2.11 on the GPU fleet, 2.13 in CI) is fixed in one place.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import inspect
import logging
import marshal
import os
import pickle
import platform as host_platform
import py_compile
import sys
import tempfile
import threading
import types
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.cache.files import write_whole
from orchestrator.cache.local import LocalCache
from orchestrator.cache.namespace import Platform
from orchestrator.jobs.platform_probe import triton_version
from orchestrator.jobs.spec import CompileOptions
from orchestrator.jobs.variants import graphed_compile

GRAPH_RECORD_CALLS = 2  # cudagraph trees: call 1 warms up (with the compile), 2 records, 3 replays


def point_caches_at(local: LocalCache) -> None:
    """Inductor's and Triton's on-disk caches in `local`'s namespace. Inductor reads these on every
    cache access and compile workers inherit them, so setting them before the first torch.compile
    call is enough even though torch is imported already."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(local.inductor_dir)
    os.environ["TRITON_CACHE_DIR"] = str(local.triton_dir)


# Inductor logs why it refused CUDA graphs on this artifact logger (off by default: it does
# not propagate, so a handler on it sees the messages without printing them).
_CUDAGRAPH_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"


def current_platform(device: torch.device) -> Platform:
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = f"cpu-{host_platform.machine()}"
    return Platform(
        # plain str: a TorchVersion would make whoever unpickles a report import torch (the driver)
        torch_version=str(torch.__version__),
        torch_git=getattr(torch.version, "git_version", "unknown"),
        triton_version=triton_version(),
        cuda_version=torch.version.cuda,
        gpu_name=gpu,
        python_version=".".join(map(str, sys.version_info[:3])),
    )


def prime_compiler(device: torch.device) -> None:
    """Compile a one-line function once, in a scratch cache that is then deleted, so the one-off
    start of Dynamo, AOTAutograd and Inductor (imports, registrations, the first trace, the first
    kernel load) is paid by a process that is waiting anyway, not by its first real bucket."""
    saved = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="orchestrate-prime-") as scratch:
        os.environ.update(TORCHINDUCTOR_CACHE_DIR=f"{scratch}/inductor", TRITON_CACHE_DIR=f"{scratch}/triton")
        try:
            # in-process compile: a worker pool started now would keep the scratch directory
            with torch._inductor.config.patch(compile_threads=1), torch.no_grad():
                torch.compile(_primer)(torch.ones(8, device=device))
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _primer(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x * 2.0 + 1.0)


def wait_for_compile_workers(timeout: float = 60.0) -> bool:
    """Wait until the pool of compile workers that Inductor starts at a compile with CUDA inputs
    has finished starting, where this process started one: its sidecar process imports torch and
    forks a worker per compile thread, seconds of work on the host's cores that a compile of a
    small model does not wait for and a benchmark would share. True where it waited. Never starts
    a pool, and never raises: a pool that fails to start is Inductor's to report, at its next use."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    ready = getattr(getattr(async_compile, "AsyncCompile", None), "_ready_future", None)
    if ready is None or ready.done() or ready in _pools_given_up_on:
        return False
    try:
        ready.result(timeout=timeout)
    except Exception:  # a timeout or a broken pool: either way, nothing is left to wait for
        if not ready.done():  # a pool that hangs costs one wait per process, not one per bucket
            _pools_given_up_on.add(ready)
    return True


_pools_given_up_on: weakref.WeakSet[Any] = weakref.WeakSet()  # readiness futures a wait timed out on


def import_compiler(*, to_compile: bool) -> None:
    """Import Dynamo and its ahead-of-time loader now, and Inductor's compiler where something will
    be traced and compiled (`to_compile`; a saved function loads without it): seconds of Python
    that a replica pays on its loader thread."""
    import torch._dynamo
    import torch._dynamo.aot_compile  # noqa: F401

    if to_compile:
        import torch._inductor.compile_fx  # noqa: F401


# Library kernels that Inductor's registry of them (`extern_kernels`, filled as its compiler's
# kernel modules import) gives under the name of torch's own function, the same object on torch
# 2.11 to 2.13; the tests hold the installed torch to it.
TORCH_EXTERN_KERNELS = frozenset(
    {
        "_grouped_mm",
        "_int_mm",
        "_scaled_grouped_mm",
        "_scaled_mm",
        "_sparse_semi_structured_mm",
        "_weight_int8pack_mm",
        "addmm",
        "baddbmm",
        "bmm",
        "convolution",
        "mm",
    }
)
_SELECT_ALGORITHM = "torch._inductor.select_algorithm"


class _CompilerStandIn(types.ModuleType):
    """One of Inductor's compiler modules as a saved function's load reads it: the few names the
    load and its generated code take from it, at the values they have in a process that has
    compiled nothing. Any other name, and every name once the real module is imported, is the real
    module's, imported then."""

    def __init__(self, name: str, names: Mapping[str, Any]) -> None:
        super().__init__(name)
        self._stand_in_names = dict(names)

    def __getattr__(self, attr: str) -> Any:
        found = sys.modules.get(self.__name__)
        mine = self.__name__ not in _ONLY_TO_LOADS or getattr(_this_thread, "loads", 0) > 0
        if (found is None or found is self) and attr in self._stand_in_names and mine:
            return self._stand_in_names[attr]
        if attr.startswith("__"):  # what importlib and inspect probe modules for
            raise AttributeError(attr)
        return getattr(_real_module(self.__name__), attr)


def _real_module(name: str) -> types.ModuleType:
    if isinstance(sys.modules.get(name), _CompilerStandIn):
        sys.modules.pop(name, None)
    return importlib.import_module(name)


class _ExternKernels:
    """Inductor's registry of the library kernels its generated code calls (`extern_kernels.mm`),
    without the compiler that fills it: a name in TORCH_EXTERN_KERNELS is torch's own function;
    any other is the real registry's, the compiler imported then."""

    def __getattr__(self, name: str) -> Any:
        found = sys.modules.get(_SELECT_ALGORITHM)
        if (found is None or isinstance(found, _CompilerStandIn)) and name in TORCH_EXTERN_KERNELS:
            kernel = getattr(torch, name)
        else:
            kernel = getattr(_real_module(_SELECT_ALGORITHM).extern_kernels, name)
        setattr(self, name, kernel)  # the registry never renames a kernel: looked up once
        return kernel


def _align(*args: Any, **kwargs: Any) -> Any:
    """The memory planner's alignment, imported at its first use: only a graph compiled with
    Inductor's memory planning calls it."""
    return _real_module("torch._inductor.codegen.memory_planning")._align(*args, **kwargs)


class _GraphLowering:
    save_output_code = None  # a hook for tests of torch's own, set by none in a serving process


def _clone_preserve_strides(tensor: torch.Tensor) -> torch.Tensor:
    """What the compiler's module re-exports from Inductor's utilities, which the load imports."""
    from torch._inductor.utils import clone_preserve_strides

    return clone_preserve_strides(tensor)


# What a saved function's load and first calls read from Inductor's compiler (torch 2.11 to
# 2.13): the generated module's imports of `extern_kernels` and `_align`; the loader's check of a
# hook for tests on GraphLowering; the autotuning of a Triton kernel at its first launch, which
# clones the arguments with compile_fx's `clone_preserve_strides` (a reduction kernel gets a
# second config to choose between at every load, its block size scaled to the GPU's registers);
# and, at every call, whether Inductor's debug module records the order of executions (only a
# function of that module turns it on, so in a process that has not imported it, it is off).
_STAND_INS: dict[str, dict[str, Any]] = {
    _SELECT_ALGORITHM: {"extern_kernels": _ExternKernels()},
    "torch._inductor.compile_fx": {"clone_preserve_strides": _clone_preserve_strides},
    "torch._inductor.codegen.memory_planning": {"_align": _align},
    "torch._inductor.graph": {"GraphLowering": _GraphLowering},
    "torch._inductor.debug": {
        "RECORD_GRAPH_EXECUTION": False,
        "GRAPH_EXECUTION_ORDER": None,
        "GRAPH_COMPILE_IDS": None,
    },
}
_READ_AT_EVERY_CALL = {"torch._inductor.debug"}  # stays its package's attribute after the load
# stand-ins no compile could use in the real one's place (a class with a hook and nothing else):
# given only to threads inside compiler_left_out(), while another thread, compiling, gets the real one
_ONLY_TO_LOADS = {"torch._inductor.graph"}
_this_thread = threading.local()  # .loads: how deep this thread is in compiler_left_out()
_stand_ins_lock = threading.Lock()
_stand_ins_placed: list[_CompilerStandIn] = []
_loads_without_the_compiler = 0


@contextlib.contextmanager
def compiler_left_out() -> Iterator[None]:
    """While the block runs, a saved function loads and makes its first calls without importing
    Inductor's compiler.

    Every graph Inductor generates imports its compiler's kernel choices and memory planner,
    torch's loader imports its graph lowering after each graph, and a kernel that autotunes at its
    first launch imports the compiler's entry point: the lowering table, the decompositions and
    every kernel template, the better part of a second of Python that a replica pays between
    answering and its first bucket on plan, for a compiler the load never runs. Those modules
    not yet imported are stood in for by what the load reads from them (_STAND_INS); anything
    else imports the real module. Where the compiler is imported already (a warmup, a replica
    that compiles), nothing changes. Loads on several threads share one set of stand-ins, taken
    away when the last ends; a thread compiling meanwhile gets the real compiler."""
    global _loads_without_the_compiler
    with _stand_ins_lock:
        if _loads_without_the_compiler == 0:
            for name, names in _STAND_INS.items():
                if name in sys.modules:
                    continue
                parent, _, child = name.rpartition(".")
                stand_in = _CompilerStandIn(name, names)
                setattr(importlib.import_module(parent), child, stand_in)
                sys.modules[name] = stand_in
                _stand_ins_placed.append(stand_in)
        _loads_without_the_compiler += 1
    _this_thread.loads = getattr(_this_thread, "loads", 0) + 1
    try:
        yield
    finally:
        _this_thread.loads -= 1
        with _stand_ins_lock:
            _loads_without_the_compiler -= 1
            if _loads_without_the_compiler == 0:
                for stand_in in _stand_ins_placed:
                    name = stand_in.__name__
                    if sys.modules.get(name) is stand_in:
                        del sys.modules[name]
                    parent, _, child = name.rpartition(".")
                    if name not in _READ_AT_EVERY_CALL and getattr(sys.modules[parent], child, None) is stand_in:
                        delattr(sys.modules[parent], child)
                _stand_ins_placed.clear()


_AOT_RESULTS = "torch._functorch._aot_autograd.aot_autograd_result"
_no_copy_lock = threading.Lock()


class NoCopyToSave:
    """What a function loaded to be called keeps in place of the copy torch keeps to save it
    again: nothing, and saving it says why."""

    def __reduce__(self) -> Any:
        raise pickle.PicklingError(
            "this compiled function was loaded to be called, without the copy torch keeps to save it "
            "again; save the function that was compiled, or load it with torch.compiler.load_compiled_function"
        )


def _no_copy(memo: dict[int, Any]) -> NoCopyToSave:
    return NoCopyToSave()


@contextlib.contextmanager
def loaded_without_a_copy_to_save() -> Iterator[None]:
    """While the block runs, a saved function that this thread loads keeps no copy of its compiled
    state to save itself again. torch deep-copies that state at every load (the graph's metadata
    and every kernel's, object by object in Python, on the loading thread) for a save that a
    serving process never makes. Another thread's loads, and compiles that load from Inductor's
    caches, keep theirs."""
    with _no_copy_lock:
        module = importlib.import_module(_AOT_RESULTS)
        deserialize = module.deserialize_bundled_cache_entry
        if not getattr(deserialize, "keeps_no_copy_on_loading_threads", False):
            module.deserialize_bundled_cache_entry = _keeping_no_copy(deserialize)  # type: ignore[attr-defined]
    _this_thread.uncopied = getattr(_this_thread, "uncopied", 0) + 1
    try:
        yield
    finally:
        _this_thread.uncopied -= 1


def _keeping_no_copy(deserialize: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """torch's deserializer, which copies the entry it is given with copy.deepcopy before it runs
    it: on a thread inside loaded_without_a_copy_to_save(), that entry's copy is a NoCopyToSave
    (copy.deepcopy takes an object's own __deepcopy__ before its class's way of copying)."""

    @functools.wraps(deserialize)
    def without_a_copy(entry: Any) -> Any:
        own = getattr(entry, "__dict__", None)
        if getattr(_this_thread, "uncopied", 0) == 0 or own is None or "__deepcopy__" in own:
            return deserialize(entry)  # (the last: a wrapper around this one set it already)
        entry.__deepcopy__ = _no_copy
        try:
            return deserialize(entry)
        finally:
            del entry.__deepcopy__

    without_a_copy.keeps_no_copy_on_loading_threads = True  # type: ignore[attr-defined]
    return without_a_copy


def _bytecode_path(source: Path) -> Path:
    """Where a generated module's bytecode lives: beside it, as Python keeps its own without a
    pycache prefix, whatever prefix this process has (it travels with the namespace)."""
    return source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"


def save_generated_bytecode(inductor_dir: Path) -> int:
    """Compile every Python module Inductor generated in its cache directory (`<dir>/<xx>/<key>.py`:
    each graph's code and each Triton kernel's) to bytecode checked against its source's hash,
    so that a replica that loads it reads the bytecode instead of compiling the source: a conv
    net's bucket is a module of thousands of lines and a hundred kernel modules. Returns how many
    it wrote; one it cannot compile stays without (its load compiles it, as always)."""
    written = 0
    for source in sorted(inductor_dir.glob("*/*.py")):
        target = _bytecode_path(source)
        try:
            if _read_bytecode(target, source.read_bytes()) is not None:
                continue
            py_compile.compile(
                str(source),
                cfile=str(target),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
        except (OSError, py_compile.PyCompileError):
            continue
        written += 1
    return written


def _read_bytecode(target: Path, source: bytes) -> Optional[types.CodeType]:
    """The code object saved at `target` for exactly these source bytes by this Python; None where
    there is none, or it is another Python's, or it was compiled from other source."""
    try:
        data = target.read_bytes()
    except OSError:
        return None
    checked_hash = 0b11  # PEP 552: a hash-based pyc whose source hash the reader checks
    if (
        len(data) < 16
        or data[:4] != importlib.util.MAGIC_NUMBER
        or int.from_bytes(data[4:8], "little") != checked_hash
        or data[8:16] != importlib.util.source_hash(source)
    ):
        return None
    try:
        code = marshal.loads(data[16:])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, types.CodeType) else None


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """`code` and every code object inside it as compiled from `filename`: the bytecode was
    compiled where warmup's cache lay, and Triton reads each kernel's source from its function's
    file."""
    if code.co_filename == filename:
        return code
    consts = tuple(
        _renamed(const, filename) if isinstance(const, types.CodeType) else const for const in code.co_consts
    )
    return code.replace(co_filename=filename, co_consts=consts)


def _compile_or_read_bytecode(
    source: Any, filename: Any, mode: str, flags: int = 0, dont_inherit: bool = False, optimize: int = -1
) -> Any:
    """Python's compile() as Inductor's module loader calls it, reading a generated module's saved
    bytecode (save_generated_bytecode) where it was compiled from this very source."""
    if mode == "exec" and not flags and optimize == -1 and isinstance(source, str) and isinstance(filename, str):
        path = Path(filename)
        if path.suffix == ".py":
            code = _read_bytecode(_bytecode_path(path), source.encode("utf-8"))
            if code is not None:
                return _renamed(code, filename)
    return compile(source, filename, mode, flags, dont_inherit, optimize)


def read_generated_bytecode() -> None:
    """From now on, Inductor's loader of its generated modules reads their saved bytecode where
    there is any (save_generated_bytecode), and compiles the source where there is none."""
    from torch._inductor.runtime import compile_tasks

    compile_tasks.compile = _compile_or_read_bytecode  # type: ignore[attr-defined]


TORCH_KEY_FILE = "torch-key"  # in Inductor's cache directory: save_torch_key, take_torch_key


def save_torch_key(inductor_dir: Path) -> None:
    """Write Inductor's key of this torch's sources (`torch_key`: a sha256 over every module file
    of the installed torch, computed once per process at its first kernel or cache lookup, a
    tenth of a second or more of Python) into its cache directory, for a replica of the namespace
    to take instead of hashing them again (take_torch_key). Nothing is written where it cannot
    be had: a replica then computes its own, as always."""
    try:
        from torch._inductor.codecache import torch_key

        text = torch_key().hex()
        target = inductor_dir / TORCH_KEY_FILE
        if target.is_file() and target.read_text() == text:
            return
        write_whole(target, text)  # for a publish or a pull beside it
    except (ImportError, AttributeError, OSError):
        return


def take_torch_key(inductor_dir: Path) -> bool:
    """Give this process the key of torch's sources that warmup saved in the namespace
    (save_torch_key), so that Inductor hashes nothing at the first kernel it loads. torch gives
    its own compile workers their parent's key the same way. The namespace names the torch it
    was warmed with (version, commit, CUDA), and everything in it, graphs and saved functions,
    is taken as that torch's already; its key is one more such file, signed with them. True where
    taken; False where there is none, it is no sha256, or this process has its key already."""
    try:
        with open(inductor_dir / TORCH_KEY_FILE, "rb") as file:
            key = bytes.fromhex(file.read(129).decode("ascii"))
    except (OSError, ValueError):
        return False
    if len(key) != 32:
        return False
    from torch._inductor.codecache import torch_key

    try:
        torch_key.set(key)  # type: ignore[attr-defined]
    except (AssertionError, RuntimeError):  # computed or set already: torch 2.11 asserts, later torch raises
        return False
    return True


_triton_hash_lock = threading.Lock()
_isa_probe_lock = threading.Lock()


def hash_triton_build() -> bool:
    """Compute the hash of Triton's build that Inductor keys every graph it loads from its cache
    by, now, where Triton is installed; True where it did. Inductor computes it once per process,
    at its first cache load: a hash of Triton's sources and of its native library (a third of a
    second on a GPU host), nearly all of it hashing that lets go of the interpreter lock, so a
    replica's loader computes it while the model builds. It calls Triton's own function, which
    Triton memoises and Inductor's hash calls: torch's way to it imports Inductor's package and
    with it Dynamo, on the loader's thread, beside a model's build that imports them too (timm's
    and Hugging Face's do), which deadlocks Python's module locks at times and slows the build at
    all others. Never raises: a hash that fails here fails again at the first load, which reports it."""
    try:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # where earlier Triton releases keep it
            from triton.compiler.compiler import triton_key
        with _triton_hash_lock:  # a grid's slices each load: one hashes, the others find it done
            triton_key()
    except Exception:
        return False
    return True


def cpu_vector_isa_probe() -> Callable[[], None]:
    """Inductor's search for the host's vector instructions, as it runs before its first C++
    kernel for the CPU (a library built for each candidate and loaded in a child Python: a second
    or more, once per process, nearly all of it waiting for the child), to run ahead so that the
    first load finds it done. The modules it needs are imported here, on the caller's thread, so
    that the probe, run on a thread of its own, imports nothing beside the caller's imports
    (torch's modules import each other, and a thread importing them beside another can see one
    half-made).
    Neither raises: a probe that fails here fails again at that load, which reports it."""
    try:
        from torch._inductor import cpp_builder, cpu_vec_isa  # noqa: F401
        from torch.utils import _filelock  # noqa: F401
    except Exception:
        return lambda: None

    def probe() -> None:
        # memoised for the process; a grid's slices each load: one probes, the others find it done
        with _isa_probe_lock, contextlib.suppress(Exception):
            cpu_vec_isa.pick_vec_isa()

    return probe


def set_device_guard_from_this_thread() -> None:
    """Where torch is built for CUDA but no GPU is usable, a fake tensor mode (every Dynamo trace)
    sets a no-op CUDA device guard at its first use. torch 2.11 sets it with the first tracing
    thread's lifetime: once that thread has exited (a replica's loader, after its buckets), the
    next trace with dynamic shapes, in any thread, crashes the process in
    `FakeTensorMode.__enter__`. Set here, from a thread that outlives the loaders (the caller of
    a load), it stays valid. Nothing where CUDA is usable or not built in; harmless on later
    torch, which sets the same guard."""
    if torch.cuda._is_compiled() and not torch.cuda.is_available() and hasattr(torch._C, "_ensureCUDADeviceGuardSet"):
        torch._C._ensureCUDADeviceGuardSet()


def allow_recompiles(n_graphs: int) -> None:
    """Each static bucket is one more Dynamo cache entry for the same frame; past the limit
    (8 by default) Dynamo silently falls back to eager, which would make big bucket lists lie."""
    global _graphs_allowed
    # cumulative: a grid's slices compile the same model's frame, each its own buckets
    _graphs_allowed += n_graphs
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), _graphs_allowed + 8))


_graphs_allowed = 0


def compile_kwargs(
    mode: Optional[str], dynamic: Optional[bool], fullgraph: bool, backend: str, options: dict[str, Any]
) -> dict[str, Any]:
    """torch.compile refuses `mode` and `options` together; fold the mode into the options then."""
    kwargs: dict[str, Any] = {"dynamic": dynamic, "fullgraph": fullgraph, "backend": backend}
    if options and mode and backend == "inductor":
        merged = dict(torch._inductor.list_mode_options(mode, dynamic))
        merged.update(options)
        kwargs["options"] = merged
    elif options:
        kwargs["options"] = dict(options)
    else:
        kwargs["mode"] = mode
    return kwargs


def variant_compile_kwargs(options: CompileOptions, variant: str) -> dict[str, Any]:
    """torch.compile's arguments for the config's compile (`compiled`) or for its `graphed` twin
    (the same without CUDA graphs), spelled once for every process that compiles or loads them: a
    warmup, an aot builder filling the caches for its parent, a replica. Their cache keys follow
    from these arguments, so a difference would turn every load into a compile."""
    mode, extra = (
        (options.mode, options.options) if variant == "compiled" else graphed_compile(options.mode, options.options)
    )
    return compile_kwargs(mode, options.dynamic, options.fullgraph, options.backend, extra)


def compile_model(
    model: torch.nn.Module, kwargs: dict[str, Any], *, trace_ahead: bool = False
) -> tuple[Any, Optional[TraceAhead]]:
    """torch.compile(model, **kwargs) and, when asked and the backend is Inductor, the TraceAhead
    backend that lets the process trace buckets before their artifacts exist (else None)."""
    options = kwargs.get("options") or {}
    match_a_plain_process()
    if not trace_ahead or kwargs["backend"] != "inductor" or {"guard_filter_fn", "use_aoti"} & set(options):
        return torch.compile(model, **kwargs), None
    # the object torch.compile(backend="inductor", mode=..., options=...) builds, so the cache keys
    # are the ones every other process (and a serving replica) computes
    inductor = torch._TorchCompileInductorWrapper(kwargs.get("mode"), kwargs.get("options"), kwargs["dynamic"])
    backend = TraceAhead(inductor)
    return torch.compile(model, backend=backend, dynamic=kwargs["dynamic"], fullgraph=kwargs["fullgraph"]), backend


def match_a_plain_process() -> None:
    """Everything that makes the cache keys this process computes, and where it looks for tuned
    kernel configs, the same as in any other process on the same cache: a compile unit, a rank, a
    serving replica (through orchestrator.prepare_replica). One list, so workers and servers cannot
    drift apart. Idempotent."""
    pickle_torch_names_as_a_plain_process()
    find_tuned_configs_where_loaded()
    sizes_apart_in_dynamic_graphs()


def sizes_apart_in_dynamic_graphs() -> None:
    """With dynamic shapes, Dynamo gives two sizes that are equal in the first call it traces one
    symbol ("duck" shaping), so the graph, and its cache key, depend on which bucket a process
    traced first: a warmup that began at 2 x 64 and a replica that begins with its largest
    bucket, 32 x 32, trace different graphs, and the replica misses the cache. A symbol per size
    makes the first trace the same wherever it starts; static compiles have no symbols to merge."""
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False


def forget_compiled_frames() -> None:
    """Drop what Dynamo compiled in this process so far, where it compiled anything. A grid's
    slices warm one after another in one process, each into a namespace of its own: a graph an
    earlier slice compiled (with `compile.dynamic`, one graph of symbolic sizes serves them all)
    would serve the next slice with no cache lookup, and leave that slice's namespace without the
    artifacts its replica loads."""
    if "torch._dynamo" in sys.modules:  # nothing compiled yet: no import of Dynamo for nothing
        torch._dynamo.reset()


def pickle_torch_names_as_a_plain_process() -> list[str]:
    """Make this process's cache keys the ones a plain `import torch` process computes.

    Every FX-graph and AOTAutograd key pickles tensor metadata, and pickle writes a constant with
    no `__module__` (torch.contiguous_format) under the first module in sys.modules through which
    its dotted name resolves. In a plain process that is one of torch's own (torch._utils). But a
    module imported before torch whose attribute lookup imports anything resolves `torch.*` too:
    Cython's shadow `cython.cimports.libc`, imported through pydantic.v1 by a Ray worker where
    Cython is installed. It comes first, every key changes, and a serving replica would miss all
    that the fleet publishes. Re-inserting such a module moves it after torch's, as importlib
    itself does when an import completes; nothing is unloaded. Returns the names moved."""
    moved = []
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None:  # pickle skips both
            continue
        try:
            resolves = module.torch is torch
        except Exception:  # a lazy module's __getattr__ may raise anything; pickle passes over it too
            resolves = False
        if not resolves:
            continue
        if name == "torch" or name.startswith("torch."):
            break
        sys.modules[name] = sys.modules.pop(name)
        moved.append(name)
    return moved


def find_tuned_configs_where_loaded() -> None:
    """Make a cache-hit load find its kernels' tuned launch configs in this process's cache.

    Inductor keeps a statically launchable kernel's autotuner inside the FX-graph cache entry,
    with the absolute path of the kernel's source in the process that compiled it. On a hit it
    looks for the kernel's tuned config (`<key>.best_config`, beside that source) at that path
    only. Anywhere else (a rank's pull, a serving replica, a compile unit's deleted private
    directory) it finds nothing: it benchmarks every config of every such kernel again (most of a
    resnet18 bucket's load on a GPU: docs/performance.md, "a rank's loads were re-tuning every
    kernel") and writes the result under the compiler's path, creating its directories. Our copy
    of the kernel sits at the same place relative to the cache directory, and so does the
    published tuned config: look there. Idempotent; a torch without this code path is left alone."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return
    recheck = getattr(CachingAutotuner, "recheck_autotune_cache", None)
    if recheck is None or getattr(recheck, "_finds_tuned_configs_where_loaded", False):
        return

    @functools.wraps(recheck)
    def recheck_here(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.filename:
            here = os.path.join(
                cache_dir(), os.path.basename(os.path.dirname(self.filename)), os.path.basename(self.filename)
            )
            if os.path.exists(here):
                self.filename = here
        return recheck(self, *args, **kwargs)

    recheck_here._finds_tuned_configs_where_loaded = True  # type: ignore[attr-defined]
    CachingAutotuner.recheck_autotune_cache = recheck_here  # type: ignore[method-assign]  # the patch is the point


class TraceAhead:
    """A torch.compile backend for a process that loads what another one compiles: inside
    `tracing_only()`, Dynamo traces a call and the traced graph runs as it is, and Inductor is
    handed that graph only at its next call, once the artifact is in the cache, so loading it
    costs a cache hit instead of a whole Dynamo trace. Outside the block it is plain Inductor."""

    def __init__(self, inductor: Any) -> None:
        self.inductor = inductor
        self._only_trace = False

    @contextlib.contextmanager
    def tracing_only(self) -> Iterator[None]:
        self._only_trace = True
        try:
            yield
        finally:
            self._only_trace = False

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if not self._only_trace:
            return self.inductor(gm, example_inputs)
        # Inductor reads Dynamo's fake tensors and graph-argument sources from the tracing
        # context; keeping it makes the deferred compile compute the same cache keys
        context = torch._guards.TracingContext.try_get()
        compiled: list[Any] = []

        def run(*args: Any) -> Any:
            if not compiled:
                if self._only_trace:
                    # interpreted: calling the lazy GraphModule would generate its code, which
                    # lands in the module's __dict__ and so in AOTAutograd's cache key
                    return torch.fx.Interpreter(gm).run(*args)
                with torch._guards.tracing(context):
                    compiled.append(self.inductor(gm, example_inputs))
            return compiled[0](*args)  # as Dynamo calls what a backend returns

        return run

    def reset(self) -> None:  # torch._dynamo.reset(): drop the CUDA-graph trees as Inductor's would
        self.inductor.reset()


def may_go_channels_last(
    model: torch.nn.Module, device: torch.device, backend: str, options: Mapping[str, Any]
) -> bool:
    """Whether Inductor may give this model's 2-D convolutions the channels-last layout: its layout
    optimization, on by default, decides per graph on a GPU (on the CPU its convolutions are
    oneDNN's own). Where it keeps them as they are, the eager reference call has set them up."""
    if device.type != "cuda" or backend != "inductor":
        return False
    from torch._inductor import config

    if not options.get("layout_optimization", config.layout_optimization):
        return False
    return any(isinstance(module, torch.nn.Conv2d) for module in model.modules())


def channels_last_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose 4-D parameters and buffers are channels-last, as Inductor lays out a
    convolution's weight; the model itself is left as it is (the compiled graph reads it)."""
    twin = copy.deepcopy(model)
    for tensor in [*twin.parameters(), *twin.buffers()]:
        if tensor.dim() == 4:
            tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)
    return twin


def channels_last_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's 4-D floating-point tensors in channels-last layout, everything else as it is."""

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
            return value.contiguous(memory_format=torch.channels_last)
        return value

    return tuple(convert(a) for a in args), {name: convert(v) for name, v in kwargs.items()}


def portable_guards(entries: Any) -> list[bool]:
    """A guard filter for a function saved to run in other processes, on a module each process
    builds itself: keep the guards on the call's own tensors (dtype, shape, strides, device) and on
    the global state (grad mode, autocast and the rest); drop every other guard.

    - Those on the model (its submodules' types, attributes, hooks and `training`, its parameters'
      and buffers' metadata): the function is bound at load to the replica's module, built from
      the config the namespace hash pins, and checked against eager before it serves; a replica
      otherwise rebuilds them at each bucket's load, about 3,000 for BERT-base (docs/performance.md).
    - Those on the call's structure (how many arguments, which keywords, constants passed): a
      replica calls every bucket with inputs made the same way.
    - Those no other process could satisfy: an object's identity (ID_MATCH and the like; Dynamo
      refuses to save them, and every Hugging Face model has one), a global, a module's state.
    Built on torch's keep_portable_guards_unsafe (tensors and the global state, the model's tensors
    among them), less the model's tensors and any tensor whose guard also checks an identity or is
    reached through an import. Where every kept guard is one torch calls portable, Dynamo also
    leaves out of the file the key-order guards and the global scope, whose objects would
    otherwise be needed at load."""
    from torch._dynamo.guards import CheckFunctionManager

    unportable = set(getattr(CheckFunctionManager, "UNSUPPORTED_SERIALIZATION_GUARD_TYPES", ()))
    portable = torch.compiler.keep_portable_guards_unsafe(entries)
    return [
        kept
        and not (
            entry.orig_guard.source.is_unspecialized_nn_module()
            or entry.orig_guard.source.is_specialized_nn_module()
            or unportable.intersection(entry.derived_guard_types)
            or _reached_through_an_import(entry.orig_guard.originating_source)
        )
        for kept, entry in zip(portable, entries, strict=True)
    ]


def _reached_through_an_import(source: Any) -> bool:
    """A guard on a module's state (`__import__('torch').utils._pytree.SUPPORTED_NODES`): global in
    effect though not a global name, and its saved source cannot even be unpickled outside a trace."""
    from torch._dynamo.source import ImportSource

    while source is not None:
        if isinstance(source, ImportSource):
            return True
        source = getattr(source, "base", None)
    return False


def import_module_globals(function: Any) -> list[str]:
    """Make a function compiled ahead of time find, in another process, the globals its code names.

    Dynamo's generated code loads some modules (`collections` where a Hugging Face model builds
    its output) through globals it installed in the tracing process under made-up names
    (`___module_collections_<id>_c0`), and builtins (`type`) that torch 2.11 does not record; the
    saved function carries neither, so a fresh process cannot even load it ("Missing required
    external references"). Each made-up name that held a module here is added to the function's
    import sources, which the loader imports by name, and each builtin to the globals it saves.
    Returns the names it could not resolve (the function then cannot run elsewhere); [] where
    this torch keeps no runtime environment to fix."""
    import builtins
    import dis

    env = getattr(getattr(function, "_artifacts", None), "runtime_env", None)
    sources = getattr(env, "import_sources", None)
    saved = getattr(env, "used_globals", None)
    if not isinstance(sources, dict) or not isinstance(saved, dict):
        return []
    names = set(getattr(env, "external_refs", None) or ())  # what the loader checks, where torch records it
    bytecode = getattr(env, "bytecode", None)
    if isinstance(bytecode, types.CodeType):
        names |= {i.argval for i in dis.get_instructions(bytecode) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    names.discard(getattr(function._artifacts, "backend_id", None))  # the compiled graph: the loader binds it
    unresolved = []
    for name in sorted(n for n in names if isinstance(n, str) and n not in sources and n not in saved):
        if hasattr(builtins, name):
            saved[name] = getattr(builtins, name)
            continue
        value = next((vars(m)[name] for m in list(sys.modules.values()) if m and name in vars(m)), None)
        if name.startswith("___") and isinstance(value, types.ModuleType):
            sources[name] = value.__name__
        else:
            unresolved.append(name)
    return unresolved


@contextlib.contextmanager
def aot_compile_enabled() -> Iterator[None]:
    """torch 2.11 keeps Dynamo's ahead-of-time compile behind a config flag; later versions have it on."""
    save_builtins_with_compiled_code()
    config = torch._dynamo.config
    if not hasattr(config, "enable_aot_compile"):
        yield
        return
    with config.patch(enable_aot_compile=True):
        yield


def save_builtins_with_compiled_code() -> None:
    """Make the runtime environment Dynamo records for a function compiled ahead of time hold the
    builtins its code names, as torch 2.12 and later do. torch 2.11 leaves them out, and the
    function it builds then refuses to exist, in the compiling process already ("Missing required
    external references: ['type']": every Hugging Face model that builds its output names
    `type`). Idempotent; a torch whose capture output keeps no runtime environment is left alone."""
    import builtins

    try:
        from torch._dynamo.convert_frame import GraphCaptureOutput
    except ImportError:
        return
    recorded = getattr(GraphCaptureOutput, "get_runtime_env", None)
    if recorded is None or getattr(recorded, "_saves_builtins", False):
        return

    @functools.wraps(recorded)
    def with_builtins(self: Any) -> Any:
        env = recorded(self)
        saved, sources = getattr(env, "used_globals", None), getattr(env, "import_sources", {})
        if isinstance(saved, dict):
            for name in getattr(env, "external_refs", None) or ():
                if name not in saved and name not in sources and hasattr(builtins, name):
                    saved[name] = getattr(builtins, name)
        return env

    with_builtins._saves_builtins = True  # type: ignore[attr-defined]
    GraphCaptureOutput.get_runtime_env = with_builtins  # type: ignore[method-assign]  # the patch is the point


def saved_function_takes_self(function: Any) -> bool:
    """Whether a function loaded with load_compiled_function wants its module first: Dynamo saves
    the frame it compiled (`Module._wrapped_call_impl(self, *args, **kwargs)` for most modules, a
    bare `(*args, **kwargs)` for some containers) and checks each call against it with guards."""
    signature = getattr(getattr(function, "_artifacts", None), "signature", None)
    if signature is None:  # a torch that keeps it elsewhere: the usual case, a module's method
        return True
    first = next(iter(signature.parameters.values()), None)
    return first is not None and first.name == "self" and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def mark_step() -> None:
    """Tell CUDA-graph trees a new inference step begins, so replays may reuse output memory."""
    torch.compiler.cudagraph_mark_step_begin()


def cudagraph_trees_on_this_thread() -> None:
    """Give this thread its own manager of CUDA-graph trees (`mode="reduce-overhead"`) where it
    has none. Inductor keeps the manager in a thread-local made on the thread that imports its
    module: later releases make one for any other thread on its first call, torch 2.11 fails an
    assertion there instead. A manager shared between threads crashes the process (2.11), so
    each serving thread records its own graphs on its first calls, as later releases do."""
    from torch._inductor import cudagraph_trees as trees

    local = trees.local
    if hasattr(local, "tree_manager_containers") or torch._C._is_key_in_tls("tree_manager_containers"):
        return
    local.tree_manager_containers, local.tree_manager_locks = {}, defaultdict(threading.Lock)


@dataclass
class CompileStats:
    """What Dynamo and Inductor did between two snapshots of torch's global counters."""

    fx_hits: int = 0
    fx_misses: int = 0
    fx_bypasses: int = 0
    aot_hits: int = 0
    aot_misses: int = 0
    frames_compiled: int = 0
    graph_breaks: dict[str, int] = field(default_factory=dict)
    cudagraph_skips: int = 0
    autotuned_kernels: int = 0  # kernels whose launch configs were benchmarked (none on a warm load)

    def __add__(self, other: CompileStats) -> CompileStats:
        """Two windows of one bucket's first call (a trace ahead, then the load) as one."""
        summed = {
            f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "graph_breaks"
        }
        return CompileStats(**summed, graph_breaks=dict(Counter(self.graph_breaks) + Counter(other.graph_breaks)))

    @property
    def cache_hits(self) -> int:
        return self.fx_hits + self.aot_hits

    @property
    def cache_misses(self) -> int:
        return self.fx_misses + self.aot_misses

    @property
    def graph_break_count(self) -> int:
        return sum(self.graph_breaks.values())


class CounterWindow:
    """Snapshot torch's counters now; `.stats()` is what happened since."""

    def __init__(self) -> None:
        self._before = _snapshot()
        self._autotuned_before = _autotuned()

    def stats(self) -> CompileStats:
        after = _snapshot()

        def delta(group: str, key: str) -> int:
            return after.get(group, {}).get(key, 0) - self._before.get(group, {}).get(key, 0)

        breaks = Counter(after.get("graph_break", {}))
        breaks.subtract(self._before.get("graph_break", {}))
        return CompileStats(
            fx_hits=delta("inductor", "fxgraph_cache_hit"),
            fx_misses=delta("inductor", "fxgraph_cache_miss"),
            fx_bypasses=delta("inductor", "fxgraph_cache_bypass"),
            aot_hits=delta("aot_autograd", "autograd_cache_hit"),
            aot_misses=delta("aot_autograd", "autograd_cache_miss"),
            frames_compiled=delta("frames", "total"),
            graph_breaks={reason: n for reason, n in breaks.items() if n > 0},
            cudagraph_skips=delta("inductor", "cudagraph_skips"),
            autotuned_kernels=_autotuned() - self._autotuned_before,
        )


# Dynamo is imported only by what compiles or loads compiled code (seconds of imports): a replica
# whose buckets need neither never pays for it, and a process that never imported it compiled nothing.
def _dynamo_utils() -> Any:
    return sys.modules.get("torch._dynamo.utils")


def _snapshot() -> dict[str, dict[str, int]]:
    utils = _dynamo_utils()
    return {group: dict(values) for group, values in utils.counters.items()} if utils else {}


def _autotuned() -> int:
    # Inductor counts no autotuning in `counters`; its timer keeps one entry per benchmarked kernel
    utils = _dynamo_utils()
    timings = getattr(utils, "compilation_time_metrics", {}) if utils else {}
    return len(timings.get("CachingAutotuner.benchmark_all_configs", ()))


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def cudagraph_skip_reasons() -> Iterator[list[str]]:
    """Collect Inductor's 'skipping cudagraphs due to ...' messages raised inside the block."""
    handler = _Collect()
    logger = logging.getLogger(_CUDAGRAPH_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
