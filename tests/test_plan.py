"""Planning is pure: which ranks exist, what compiles where, what the fleet summary says."""

from dataclasses import asdict

import pytest

from orchestrator.fleet.plan import RANK_GPU_SHARE, Node, compile_units, has_spare_cpu, nodes_from_ray, targets
from orchestrator.jobs.records import BucketResult
from orchestrator.reports.report import fleet_stats

RAY_NODES = [
    {
        "NodeID": "b" * 56,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.2",
        "Resources": {"CPU": 16.0, "GPU": 2.0, "accelerator_type:H200": 1.0},
    },
    {"NodeID": "a" * 56, "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}},
    {
        "NodeID": "c" * 56,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.3",
        "Resources": {"CPU": 16.0, "GPU": 1.0, "accelerator_type:A10G": 1.0},
    },
    {"NodeID": "d" * 56, "Alive": False, "NodeManagerAddress": "10.0.0.4", "Resources": {"GPU": 8.0}},
]


def test_nodes_from_ray_reads_gpu_class_and_skips_dead_nodes():
    nodes = nodes_from_ray(RAY_NODES)
    assert [(n.ip, n.gpus, n.gpu_class) for n in nodes] == [
        ("10.0.0.1", 0, "cpu"),
        ("10.0.0.2", 2, "H200"),
        ("10.0.0.3", 1, "A10G"),
    ]


def test_every_gpu_is_a_rank_spread_round_robin():
    ranks = targets(nodes_from_ray(RAY_NODES))
    assert [(t.rank, t.node.ip) for t in ranks] == [(0, "10.0.0.2"), (1, "10.0.0.3"), (2, "10.0.0.2")]
    assert [t.node.ip for t in targets(nodes_from_ray(RAY_NODES), ranks=2)] == ["10.0.0.2", "10.0.0.3"]
    with pytest.raises(ValueError, match="only 3 GPUs"):
        targets(nodes_from_ray(RAY_NODES), ranks=4)


def test_cpu_only_cluster_gets_cpu_workers():
    cpu = [Node("n1", "127.0.0.1", 0, 2, "cpu"), Node("n2", "127.0.0.2", 0, 2, "cpu")]
    assert [t.node.node_id for t in targets(cpu)] == ["n1", "n2"]
    assert [t.node.node_id for t in targets(cpu, ranks=3)] == ["n1", "n2", "n1"]


def test_one_compile_per_class_and_bucket_sharing_gpus_with_the_ranks():
    units = compile_units(targets(nodes_from_ray(RAY_NODES)), [1, 8, 32])
    # A10G: one GPU takes all three buckets; H200: two GPUs, at most two buckets on one
    assert [(u.gpu_class, u.bucket, u.num_gpus) for u in units] == [
        ("A10G", 1, 0.1633),
        ("A10G", 8, 0.1633),
        ("A10G", 32, 0.1633),
        ("H200", 1, 0.245),
        ("H200", 8, 0.245),
        ("H200", 32, 0.245),
    ]
    # every rank and every compile task of a GPU fit on it together, and two ranks never do
    assert RANK_GPU_SHARE + 3 * 0.1633 <= 1 and RANK_GPU_SHARE + 2 * 0.245 <= 1 and 2 * RANK_GPU_SHARE > 1
    # units that share a node split its CPUs for their compile workers: 16 / 3 on the A10G node,
    # 16 / 3 on the H200 node too (two GPUs, three units)
    assert [u.compile_threads for u in units] == [5, 5, 5, 5, 5, 5]
    cpu = targets([Node("n1", "127.0.0.1", 0, 2, "cpu")])
    assert [(u.num_gpus, u.compile_threads) for u in compile_units(cpu, [1, 2])] == [(0.0, 1), (0.0, 1)]
    # a unit alone on its node gets Inductor's default, a compile worker per CPU
    two_nodes = targets([Node(f"n{i}", f"10.0.0.{i}", 1, 16, "H200") for i in (1, 2)])
    assert [u.compile_threads for u in compile_units(two_nodes, [1, 8])] == [16, 16]


def test_compile_units_are_dealt_over_their_class_gpus_no_more_per_gpu_than_their_share_allows():
    planned = targets(nodes_from_ray(RAY_NODES))  # H200: ranks 0 and 2 (one node, two GPUs); A10G: rank 1
    units = compile_units(planned, [1, 8, 32])
    assert [(u.gpu_class, u.bucket, u.home, u.num_cpus) for u in units] == [
        ("A10G", 1, 1, 1.0),
        ("A10G", 8, 1, 1.0),
        ("A10G", 32, 1, 1.0),
        ("H200", 1, 0, 1.0),
        ("H200", 8, 2, 1.0),
        ("H200", 32, 0, 1.0),
    ]
    for target in planned:  # a rank's share plus its units' fit on its GPU
        assert RANK_GPU_SHARE + sum(u.num_gpus for u in units if u.home == target.rank) <= 1
    # a GPU node with fewer CPUs than units: they share its CPUs (all start; none waits for a CPU forever)
    small = targets([Node("n1", "10.0.0.1", 1, 2, "H200")])
    assert [u.num_cpus for u in compile_units(small, [1, 8, 32])] == [0.6666] * 3
    cpu = targets([Node("n1", "127.0.0.1", 0, 2, "cpu")])
    assert [u.home for u in compile_units(cpu, [1, 2])] == [None, None]  # no GPU: Ray spreads them over CPUs


def test_a_grids_points_are_units_of_their_own_dealt_over_the_gpus_together():
    planned = targets(nodes_from_ray(RAY_NODES))  # H200: ranks 0 and 2; A10G: rank 1
    # two slices (seq 64 and seq 128), the second leaving out batch 32 (points.max_product)
    units = [u for u in compile_units(planned, [1, 8, 32], [[1, 8, 32], [1, 8]]) if u.gpu_class == "H200"]
    assert [(u.part, u.bucket, u.home) for u in units] == [(0, 1, 0), (0, 8, 2), (0, 32, 0), (1, 1, 2), (1, 8, 0)]
    for target in planned:  # 3 units on rank 0's GPU: each gets a third of what the rank leaves
        assert RANK_GPU_SHARE + sum(u.num_gpus for u in units if u.home == target.rank) <= 1
    assert {u.num_gpus for u in units} == {0.1633}
    assert [u.part for u in compile_units(planned, [1, 8])] == [0] * 4  # the list form: one part


def test_a_rank_primes_its_compiler_only_with_a_cpu_to_spare():
    planned = targets(nodes_from_ray(RAY_NODES))
    assert all(has_spare_cpu(t, planned, compile_units(planned, [1, 8, 32])) for t in planned)  # 16 CPUs, 3 units
    two, four = (targets([Node("n1", "127.0.0.1", 0, cpus, "cpu")]) for cpus in (2, 4))
    assert not has_spare_cpu(two[0], two, compile_units(two, [1, 8, 32]))  # 3 compile units and 1 rank on 2 CPUs
    assert has_spare_cpu(four[0], four, compile_units(four, [1, 8]))  # 2 compile units and 1 rank on 4 CPUs
    # GPU nodes count the units dealt to their own GPUs: 4 on the 4-GPU node, 1 on the other
    uneven = targets([Node("a", "10.0.0.1", 4, 8, "H200"), Node("b", "10.0.0.2", 1, 3, "H200")])
    dealt = compile_units(uneven, [1, 2, 3, 4, 5])
    assert [sum(1 for u in dealt if u.home in {t.rank for t in uneven if t.node.node_id == n}) for n in "ab"] == [4, 1]
    assert not has_spare_cpu(uneven[0], uneven, dealt)  # 8 CPUs: 4 units + 4 ranks
    assert has_spare_cpu(next(t for t in uneven if t.node.node_id == "b"), uneven, dealt)  # 3 CPUs: 1 unit + 1 rank


def record(phase, rank, bucket, status="ok", speedup=2.0, compile_seconds=1.0, error=None):
    return BucketResult(
        phase=phase,
        rank=rank,
        bucket=bucket,
        status=status,
        speedup=speedup,
        compile_seconds=compile_seconds,
        error=error,
    )


def test_fleet_summary_spreads_and_deviations():
    results = [
        record("compile", None, 8, compile_seconds=12.0),
        record("warm", 0, 8, speedup=4.0, compile_seconds=0.5),
        record("warm", 1, 8, speedup=4.2, compile_seconds=0.7),
        record("warm", 2, 8, speedup=2.0, compile_seconds=0.6),
        record("warm", 3, 8, status="failed", speedup=None, error="warm: OutOfMemoryError"),
    ]
    summary = asdict(fleet_stats(results, []))
    row = summary["buckets"]["8"]
    assert row["cold_compile_seconds"] == 12.0
    assert row["warm_load_seconds"] == {"min": 0.5, "median": 0.6, "max": 0.7}
    assert row["speedup"] == {"min": 2.0, "median": 4.0, "max": 4.2}
    assert (row["ranks_ok"], row["ranks_failed"]) == (3, 1)
    assert [(d["rank"], d["why"]) for d in summary["deviating_ranks"]] == [
        (2, "speedup 2.00x vs median 4.00x"),
        (3, "warm: OutOfMemoryError"),
    ]


def test_the_driver_of_a_ray_run_never_imports_torch():
    """Importing torch costs the driver seconds before the first task could start."""
    import subprocess
    import sys

    code = (
        "import sys, orchestrator.cli, orchestrator.fleet.driver, orchestrator.reports.report, orchestrator.progress, "
        "orchestrator.reports.metrics, orchestrator.jobs.records; print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_a_workers_answer_unpickles_without_torch(tmp_path):
    """What a worker returns holds no torch object: unpickling one (a TorchVersion, say) would
    import torch into the driver, seconds in the middle of the compile wave."""
    import pickle
    import subprocess
    import sys

    from orchestrator.config import apply_overrides, load_spec
    from orchestrator.jobs.engine import Session
    from orchestrator.jobs.workers import Host, answer

    spec = apply_overrides(load_spec("examples/mlp.yaml"), device="cpu")
    answered = answer(Session(spec, tmp_path / "cache").run(), Host("127.0.0.1", []))
    answer_file = tmp_path / "answer.pickle"
    answer_file.write_bytes(pickle.dumps(answered))
    code = f"import pickle, sys; pickle.loads(open({str(answer_file)!r}, 'rb').read()); print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_a_compile_units_publish_that_added_nothing_says_its_generation_stands():
    from orchestrator.cache.sync import Transfer
    from orchestrator.fleet.driver import _published

    assert _published(Transfer(generation=3, files=12)) == ", published generation 3"
    # a warm rerun: the store held it all, as the report's "nothing new to publish" says after it
    assert _published(Transfer(generation=4, files=0)) == ", nothing new to publish (generation 4 stands)"
