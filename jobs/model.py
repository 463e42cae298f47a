"""Build the user's model and the inputs of one bucket from a WarmupSpec."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

from orchestrator.jobs.errors import SetupError, brief, install_hint
from orchestrator.jobs.spec import FLOAT_DTYPES, InputSpec, ModelRef, WarmupSpec


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)  # workers see one GPU: artifacts are always for cuda:0
    if requested == "cuda":
        raise SetupError(
            "device 'cuda' was requested but torch sees no CUDA GPU "
            f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES may hide it); use --device cpu or auto"
        )
    return torch.device("cpu")


def factory_source(ref: ModelRef, base_dir: Path) -> tuple[Optional[Path], str]:
    """Where the factory's module comes from: its file (None for an importable module) and the
    name it is imported under. A file's module gets a stable name, which keeps Dynamo's view of
    the code identical across processes."""
    if ref.is_file:
        path = (base_dir / ref.target).resolve()
        return path, f"orchestrate_user_{path.stem}"
    return None, ref.target


def load_factory(ref: ModelRef, base_dir: Path) -> Callable[..., Any]:
    path, module_name = factory_source(ref, base_dir)
    if path is not None:
        if not path.is_file():
            raise SetupError(f"model.factory: file {path} does not exist; paths are relative to the config file")
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise SetupError(f"model.factory: cannot load {path} as Python; name a .py file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[module_name]
            raise SetupError(f"model.factory: importing {path} {_raised(exc)}") from exc
    else:
        try:
            module = importlib.import_module(ref.target)
        except SystemExit as exc:
            raise SetupError(f"model.factory: importing module {ref.target!r} {_raised(exc)}") from exc
        except Exception as exc:
            raise SetupError(
                f"model.factory: cannot import module {ref.target!r}: {brief(exc)}; {install_hint(ref.target)}"
            ) from exc
    target: Any = module
    for part in ref.attribute.split("."):
        if not hasattr(target, part):
            raise SetupError(f"model.factory: {ref.target!r} has no attribute {ref.attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise SetupError(f"model.factory: {ref.factory!r} is not callable")
    return target


def _raised(exc: BaseException) -> str:
    """What the user's code did: raised an exception, or called sys.exit, which would otherwise end
    this process with the factory's code and no word of why."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}); a factory returns the model, it does not end the process"
    return f"raised {brief(exc)}"


def build_model(spec: WarmupSpec, device: torch.device) -> torch.nn.Module:
    factory = load_factory(spec.model, spec.base_dir)
    torch.manual_seed(spec.seed)  # the same weights on every worker
    try:
        model = factory(**spec.model.kwargs)
    except (Exception, SystemExit) as exc:
        raise SetupError(f"model.factory: {spec.model.factory}(**kwargs) {_raised(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise SetupError(f"model.factory: {spec.model.factory} returned {type(model).__name__}, not a torch.nn.Module")
    if spec.model.dtype:
        model = model.to(getattr(torch, spec.model.dtype))
    model = model.to(device).eval()
    if spec.call.kwargs or spec.serve.outputs is not None:
        return ConfiguredCall(model, spec.call.kwargs, spec.serve.outputs)
    return model


class ConfiguredCall(torch.nn.Module):
    """The user's model called as the config says: its constant keyword arguments (`call.kwargs`)
    added to every call, and only the outputs served (`serve.outputs`) returned, as a dict keyed
    by their paths. Everything that runs the model (warmup, the gate, the variants, a replica)
    builds it through `build_model`, so all of them compile and check this same function, and
    an output left out is never part of a compiled graph's outputs."""

    def __init__(self, model: torch.nn.Module, call_kwargs: dict[str, Any], outputs: list[str] | None) -> None:
        super().__init__()
        self.model = model
        self.call_kwargs = dict(call_kwargs)
        self.outputs = None if outputs is None else [(path, _steps(path)) for path in outputs]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.model(*args, **kwargs, **self.call_kwargs)
        if self.outputs is None:
            return output
        return {path: _select(output, path, steps) for path, steps in self.outputs}


def _steps(path: str) -> list[str | int]:
    """`hidden_states[2].x` as ["hidden_states", 2, "x"] (the spec has checked its form)."""
    return [int(index) if index else name for name, index in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]", path)]


def _select(output: Any, path: str, steps: list[str | int]) -> Any:
    node, where = output, "output"
    for step in steps:
        try:
            if isinstance(step, int) or isinstance(node, dict):  # HF ModelOutput is a dict too
                node = node[step]
            else:
                node = getattr(node, step)
        except (KeyError, IndexError, AttributeError, TypeError):
            has = f"keys {', '.join(map(str, node))}" if isinstance(node, dict) else f"type {type(node).__name__}"
            raise SetupError(
                f"serve.outputs: {path!r} is not in the model's output ({where} has {has}); "
                "name an output the model returns"
            ) from None
        where += f"[{step}]" if isinstance(step, int) else f".{step}"
    return node


def make_inputs(
    spec: WarmupSpec, bucket: int, device: torch.device
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Deterministic inputs for one bucket: the same values on every worker and every run."""
    generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + bucket)
    args, kwargs = [], {}
    for item in spec.inputs:
        tensor = _random_tensor(item, item.concrete_shape(spec.bucket_symbol, bucket, spec.fixed), generator).to(device)
        if item.name:
            kwargs[item.name] = tensor
        else:
            args.append(tensor)
    return args, kwargs


def _random_tensor(item: InputSpec, shape: list[int], generator: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, item.dtype)
    if item.dtype in FLOAT_DTYPES:
        return torch.randn(shape, generator=generator).to(dtype)
    if item.dtype == "bool":
        return torch.randint(0, 2, shape, generator=generator).bool()
    assert item.range is not None  # the spec refuses an integer input without one
    low, high = item.range
    return torch.randint(low, high, shape, generator=generator, dtype=dtype)
