"""What a Ray warmup produced, as the driver hands it to the report: the plan it ran, every
bucket record and every answered task. Torch-free and Ray-free."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal, Optional

from orchestrator.fleet.plan import CompileUnit, Node, Target
from orchestrator.jobs.records import BucketResult, ProcessRun


@dataclass
class TaskRun:
    """One answered task: the process's own account, and where the task sat in the waves."""

    process: ProcessRun
    wave: Literal["compile", "warm"]
    rank: Optional[int]  # None: a compile unit
    bucket: Optional[int]  # None: a rank, which answers for all its buckets at once
    answered_at: float  # wall clock


@dataclass
class FleetRun:
    nodes: list[Node]
    targets: list[Target]
    units: list[CompileUnit]
    results: list[BucketResult] = field(default_factory=list)
    runs: list[TaskRun] = field(default_factory=list)
    wall_seconds: float = 0.0
    address: Optional[str] = None
    # "start": until the plan; "compile": until the last compile task ended; "warm": the rest (the
    # ranks' loads that were left, and the benchmarks)
    wave_seconds: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)  # wall clock, the origin of the timeline
