"""Who does what: targets (ranks) grouped by GPU class, one compile per (class, bucket) (per
(class, point) of a grid), then every rank warms. Pure data, no Ray: the driver turns it into tasks, tests check it directly."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

ACCELERATOR_PREFIX = "accelerator_type:"
# A rank's process lives through the whole job, beside the compile tasks, so neither may take a
# whole GPU. Over half keeps two ranks off one GPU (Ray packs fractions); compile tasks share the
# rest. Either way Ray makes the process see exactly one GPU, as cuda:0.
RANK_GPU_SHARE = 0.51


@dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    gpus: int
    cpus: int
    gpu_class: str  # Ray's accelerator type ("H200"), "gpu" when undeclared, "cpu" without GPUs


@dataclass(frozen=True)
class Target:
    """One rank: a GPU (or a CPU worker on a machine without GPUs) on one node."""

    rank: int
    node: Node

    @property
    def gpu_class(self) -> str:
        return self.node.gpu_class


@dataclass(frozen=True)
class CompileUnit:
    gpu_class: str
    bucket: int
    num_gpus: float  # a fraction: compiling is mostly CPU work, and the GPU's rank runs beside it
    # Inductor's compile workers for this unit (TORCHINDUCTOR_COMPILE_THREADS). On a GPU node, the
    # node's CPUs split between the units that share it; CPU-only workers get the node's CPUs when
    # alone on it and 1 when sharing it (pools are not measured there). A pool compiles Triton
    # kernels in parallel, which makes resnet-sized compiles faster; for a kernel-light model like
    # the MLP it is within noise (docs/performance.md, Fleet warmup on Ray: "compile threads" and
    # "compile pools"). Ranks only load, so they compile in-process (RankWorker).
    compile_threads: int = 1
    # A CPU each; a node with fewer CPUs than units gives each an equal part, so that all of them
    # still start (the alternative is a unit that never fits in its rank's bundle).
    num_cpus: float = 1.0
    home: Optional[int] = None  # the rank whose GPU it shares; None without GPUs (spread over CPUs)
    part: int = 0  # the slice of a grid the bucket belongs to (WarmupSpec.slices); 0 in the list form


def nodes_from_ray(ray_nodes: list[dict[str, Any]]) -> list[Node]:
    """`ray.nodes()` -> Node list (alive nodes only)."""
    found = []
    for info in ray_nodes:
        if not info.get("Alive"):
            continue
        resources = info.get("Resources", {})
        gpus = int(resources.get("GPU", 0))
        classes = [k[len(ACCELERATOR_PREFIX) :] for k in resources if k.startswith(ACCELERATOR_PREFIX)]
        gpu_class = classes[0] if classes else ("gpu" if gpus else "cpu")
        found.append(
            Node(info["NodeID"], info.get("NodeManagerAddress", ""), gpus, int(resources.get("CPU", 0)), gpu_class)
        )
    return sorted(found, key=lambda n: (n.ip, n.node_id))


def targets(nodes: list[Node], ranks: Optional[int] = None) -> list[Target]:
    """Every GPU of the cluster is a rank; with no GPU anywhere, one CPU worker per node.
    `ranks` caps the count, taken round-robin across nodes so a cap still spans the cluster."""
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    slots = [[n] * n.gpus for n in gpu_nodes] if gpu_nodes else [[n] for n in nodes]
    order: list[Node] = []
    while any(slots):
        for column in slots:
            if column:
                order.append(column.pop())
    if ranks is not None:
        if ranks > len(order) and gpu_nodes:
            raise ValueError(f"--ranks {ranks}: the cluster has only {len(order)} GPUs")
        if ranks > len(order):  # CPU workers: more ranks than nodes share nodes
            order = [order[i % len(order)] for i in range(ranks)]
        order = order[:ranks]
    return [Target(rank, node) for rank, node in enumerate(order)]


def compile_units(
    targets_: list[Target], buckets: list[int], parts: Optional[list[list[int]]] = None
) -> list[CompileUnit]:
    """One unit per (GPU class, bucket), all compiling at once; with `parts` (a grid's slices,
    each its buckets) one per (GPU class, point) of every slice, `part` naming the slice. A
    class's units are dealt round-robin over its GPU ranks (ordered across nodes), so no GPU gets
    more than ceil(units / GPUs) of them; what the rank leaves of its GPU is split among that many."""
    work = [(part, bucket) for part, of_part in enumerate(parts or [buckets]) for bucket in of_part]
    units = []
    for gpu_class in sorted({t.gpu_class for t in targets_}):
        gpu_ranks = [t for t in targets_ if t.gpu_class == gpu_class and t.node.gpus > 0]
        if not gpu_ranks:  # CPU workers: Ray spreads the units over the class's nodes
            nodes = {t.node for t in targets_ if t.gpu_class == gpu_class}
            alone = _units_per_node(targets_, gpu_class, len(work)) == 1
            threads = max(1, min(n.cpus for n in nodes)) if alone else 1
            units += [CompileUnit(gpu_class, bucket, 0.0, threads, part=part) for part, bucket in work]
            continue
        share = _floor((1 - RANK_GPU_SHARE) / math.ceil(len(work) / len(gpu_ranks)))
        homes = [gpu_ranks[i % len(gpu_ranks)] for i in range(len(work))]
        on_node = Counter(home.node for home in homes)
        for (part, bucket), home in zip(work, homes, strict=True):
            here = on_node[home.node]
            units.append(
                CompileUnit(
                    gpu_class,
                    bucket,
                    share,
                    compile_threads=max(1, home.node.cpus // here),
                    num_cpus=min(1.0, _floor(home.node.cpus / here)),
                    home=home.rank,
                    part=part,
                )
            )
    return units


def _floor(fraction: float) -> float:
    """Down to Ray's resource granularity (1e-4), so that parts never add up to more than the whole."""
    return math.floor(fraction * 1e4) / 1e4


def has_spare_cpu(target: Target, targets_: list[Target], units: list[CompileUnit]) -> bool:
    """Whether the target's node has a CPU beyond its compile units and ranks. A rank that waits
    may then trace its buckets and prime its compiler without slowing the compile units down."""
    node_of = {t.rank: t.node for t in targets_}
    of_class = [u for u in units if u.gpu_class == target.gpu_class]
    if any(u.home is not None for u in of_class):
        units_here = sum(1 for u in of_class if u.home is not None and node_of[u.home] == target.node)
    else:  # no GPUs: Ray spreads the units over the class's nodes
        units_here = _units_per_node(targets_, target.gpu_class, len(of_class))
    ranks_here = sum(1 for t in targets_ if t.node == target.node)
    return target.node.cpus > units_here + ranks_here


def _units_per_node(targets_: list[Target], gpu_class: str, buckets: int) -> int:
    """Compile units of the class that run at once on one of its nodes (SPREAD)."""
    return math.ceil(buckets / len({t.node for t in targets_ if t.gpu_class == gpu_class}))
