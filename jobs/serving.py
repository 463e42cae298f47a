"""The one call a serving replica makes before its own torch.compile, so that its first request
loads what the fleet warmed instead of compiling (docs/cache.md, "What a server must match").

    from orchestrator import prepare_replica
    prepare_replica()
    model = torch.compile(model, mode="reduce-overhead")   # as the warmup config compiles it
"""

from orchestrator.jobs import torch_internals as ti


def prepare_replica() -> None:
    """Compute the cache keys a plain `import torch` process computes, whatever this process
    imported before torch, and find the kernels' tuned launch configs in this process's copy of
    the cache instead of benchmarking them again. Idempotent; cheap enough to call at every start."""
    ti.match_a_plain_process()  # what every warmup worker calls before it compiles
