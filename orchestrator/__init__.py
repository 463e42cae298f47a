"""Warm torch.compile caches for a fleet, and start serving replicas from them.

The public API for serving code is this package's top level:

    from orchestrator import runtime            # runtime.load(config): the served, bucketed model
    from orchestrator import prepare_replica    # for servers that keep their own torch.compile

Everything else (`orchestrator.cli`, `orchestrator.jobs`, `orchestrator.cache`, ...) is the tool's
own and may change. Names are loaded on first use: `import orchestrator` alone does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["prepare_replica", "runtime"]

if TYPE_CHECKING:
    from orchestrator import runtime
    from orchestrator.jobs.serving import prepare_replica

# public name -> the module that defines it (None: the name is a module of this package)
_PUBLIC = {"prepare_replica": "orchestrator.jobs.serving", "runtime": None}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    where = _PUBLIC[name]
    value = (
        importlib.import_module(f"orchestrator.{name}")
        if where is None
        else getattr(importlib.import_module(where), name)
    )
    globals()[name] = value  # later lookups skip this function
    return value
