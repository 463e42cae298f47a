"""The `aot` serving variant: one precompiled function per bucket, built at warmup with Dynamo's
ahead-of-time compile (`torch.compile(model, fullgraph=True).forward.aot_compile`) and saved with
`save_compiled_function`; a replica loads it with `torch.compiler.load_compiled_function`, which
brings back Dynamo's guards and Inductor's compiled code as they were: no tracing, no Inductor
cache lookups, and, in a process that compiles nothing, no import of Inductor's compiler
(torch_internals.compiler_left_out).

The model itself is not in the file: it is named as external data and handed back at load, so the
replica's own module (its weights) is what the function runs on, and a file stays the size of its
code. Files live in the namespace directory as `aot/b<bucket>-<FORMAT>-<sha256 prefix>.bin`, published,
signed and verified with every other cache file. The serving plan names the bucket's file and the
platform it was built for; a replica elsewhere refuses it before loading (`PlatformMismatch`).

AOTInductor (`torch.export` + `aoti_compile_and_package`) was measured against this and not kept:
docs/performance.md has the comparison.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.cache.namespace import Platform
from orchestrator.jobs import torch_internals as ti
from orchestrator.jobs.errors import brief
from orchestrator.jobs.variants import graphed_compile

AOT_DIR = "aot"  # in the namespace directory
MODEL_KEY = "model"  # the external data a saved function is bound to: the replica's module
# What a saved function holds beyond torch's own format, named in its file: a warm namespace
# reuses only functions of this format and builds the others again. "g1": the guards on the call's
# own tensors and on the global state, no others (torch_internals.portable_guards); those saved
# before held the model's guards too, which every load of them rebuilds.
FORMAT = "g1"


class Unexportable(RuntimeError):
    """Dynamo could not compile the model ahead of time for this bucket (a graph break,
    data-dependent control flow, an input it cannot save): the variant is unavailable with torch's
    own reason, and the bucket is served by the next-best variant."""


class PlatformMismatch(RuntimeError):
    """A function built for another torch, CUDA, GPU or Python: never loaded."""


def file_name(bucket: int, path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return f"{current_prefix(bucket)}{digest}.bin"


def current_prefix(bucket: int) -> str:
    """How the name of a bucket's function of the current FORMAT begins, from the namespace directory."""
    return f"{AOT_DIR}/b{bucket}-{FORMAT}-"


def compile_kwargs(mode: Optional[str], options: Mapping[str, Any], backend: str, device_type: str) -> dict[str, Any]:
    """The config's compile, whole-graph, for a function that a replica runs inside the tool's own
    CUDA graph: on CUDA without Inductor's CUDA graphs (as `graphed`); saved with the guards that
    can hold in another process (torch_internals.portable_guards)."""
    if device_type == "cuda":
        mode, options = graphed_compile(mode, options)
    return ti.compile_kwargs(mode, False, True, backend, {**options, "guard_filter_fn": ti.portable_guards})


def build(
    model: torch.nn.Module,
    args: list[Any],
    kwargs: dict[str, Any],
    directory: Path,
    bucket: int,
    compile_options: Mapping[str, Any],
) -> str:
    """Compile the model ahead of time at this bucket's inputs and place the saved function in
    `directory`; its path relative to it. Raises Unexportable with torch's reason."""
    # written beside the namespace directory and moved in whole: a publish never sees half a file
    with tempfile.TemporaryDirectory(prefix=".aot-", dir=directory.parent) as scratch:
        target = Path(scratch) / "function.bin"
        try:
            # torch.compile takes the guard filter out of the options it is given: a copy each time
            options = {**compile_options, "options": dict(compile_options.get("options") or {})}
            with torch.no_grad(), ti.aot_compile_enabled():
                compiled: Any = torch.compile(model, **options)  # an OptimizedModule
                function = compiled.forward.aot_compile((tuple(args), dict(kwargs)))
                unresolved = ti.import_module_globals(function)
                if unresolved:
                    raise Unexportable(f"the compiled code names globals no other process can find: {unresolved}")
                function.save_compiled_function(str(target), external_data={MODEL_KEY: model})
        except Unexportable:
            raise
        except Exception as exc:
            raise Unexportable(f"Dynamo ahead-of-time compile: {brief(exc)}{known_fix(exc)}") from exc
        rel = file_name(bucket, target)
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(target, directory / rel)
    return rel


def known_fix(exc: BaseException) -> str:
    """What to do about a refusal whose cause is known, said after torch's reason; else nothing."""
    text = str(exc)
    if "copy.deepcopy" in text and "cache_utils.py" in text:
        # transformers' caches deep-copy the model's config in their constructor, which Dynamo
        # traces from torch 2.13 on; an encoder-decoder's decoder builds one inside its forward
        return (
            "; the model builds a Hugging Face cache inside its forward, which deep-copies its config "
            "(torch 2.13 compiles that, this torch cannot): where a call needs no cache, set "
            "`call: {kwargs: {use_cache: false}}`"
        )
    return ""


def check_platform(built_for: Mapping[str, Any], here: Platform) -> None:
    """A function runs only where it was built: the same torch, Triton, CUDA, GPU class and Python."""
    differs = [
        f"{name} {built_for.get(name)!r} (this replica: {value!r})"
        for name, value in asdict(here).items()
        if name != "torch_git" and built_for.get(name) != value
    ]
    if differs:
        raise PlatformMismatch(f"aot function built for another platform: {'; '.join(differs)}")


def load(path: Path, model: torch.nn.Module) -> Any:
    """The saved function, bound to `model`: call it as the model's forward (it cannot be saved
    again: torch_internals.loaded_without_a_copy_to_save). Its first calls (on CUDA, the
    autotuning of a kernel or two) read Inductor's compiler as its load does: a caller that
    compiles nothing makes them inside torch_internals.compiler_left_out() too."""
    with (
        open(path, "rb") as file,
        ti.aot_compile_enabled(),
        ti.compiler_left_out(),
        ti.loaded_without_a_copy_to_save(),
    ):
        ti.read_generated_bytecode()
        function = torch.compiler.load_compiled_function(file, external_data={MODEL_KEY: model})
    return functools.partial(function, model) if ti.saved_function_takes_self(function) else function
