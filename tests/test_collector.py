"""Python's full collections held off while replicas load, and given back as they were found."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
from conftest import loads_settled

from orchestrator.jobs import collector


@pytest.fixture(autouse=True)
def thresholds():
    assert loads_settled(), "a replica's load in this process never settled"
    found = gc.get_threshold()
    yield found
    gc.set_threshold(*found)


def test_a_hold_defers_only_the_oldest_generation_and_its_release_puts_the_thresholds_back(thresholds):
    release = collector.defer_full_collections()
    held = gc.get_threshold()
    assert held[:2] == thresholds[:2]  # the young generations are collected as before
    assert held[2] >= 1_000_000
    release()
    assert gc.get_threshold() == thresholds


def test_holds_overlap_and_only_the_last_release_gives_the_collector_back(thresholds):
    first, second = collector.defer_full_collections(), collector.defer_full_collections()
    first()
    first()  # a release called twice counts once
    assert gc.get_threshold()[2] >= 1_000_000
    second()
    assert gc.get_threshold() == thresholds


def test_thresholds_set_by_someone_else_during_a_hold_are_kept(thresholds):
    release = collector.defer_full_collections()
    gc.set_threshold(500, 5, 5)
    release()
    assert gc.get_threshold() == (500, 5, 5)


def test_the_last_release_collects_the_old_generations_garbage_at_once():
    class Node:
        pass

    release = collector.defer_full_collections()
    gc.collect()
    node = Node()
    node.itself = node  # a cycle: only the collector frees it
    gc.collect(1)  # survived into the oldest generation
    assert any(type(o) is Node for o in gc.get_objects(generation=2))
    del node
    release()
    assert not any(type(o) is Node for o in gc.get_objects())


def test_a_process_that_turned_the_collector_off_is_not_collected_at_the_release():
    class Node:
        pass

    release = collector.defer_full_collections()
    node = Node()
    node.itself = node
    del node
    gc.disable()
    try:
        release()
        assert any(type(o) is Node for o in gc.get_objects())
    finally:
        gc.enable()
        gc.collect()


def test_imports_run_without_full_collections_and_what_they_made_is_frozen(thresholds):
    full: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    class Module:
        pass

    before = gc.get_freeze_count()
    gc.callbacks.append(count)
    try:
        with collector.imports_frozen():
            assert gc.get_threshold()[2] >= 1_000_000
            made = [Module() for _ in range(200_000)]  # as many objects as a few hundred modules make
    finally:
        gc.callbacks.remove(count)
    assert not full  # none ran while the block made them
    assert gc.get_threshold() == thresholds  # given back
    frozen = gc.get_freeze_count()  # the block's objects, and whatever else was alive then
    walked = sum(type(o) is Module for o in gc.get_objects())
    del made  # frozen, they are still freed by their reference counts
    assert frozen >= before + 200_000 and walked == 0  # out of every later collection's walk
    assert gc.get_freeze_count() <= frozen - 200_000


def test_the_runtimes_imports_leave_no_hold_and_their_objects_frozen():
    probe = (
        "import gc; found = gc.get_threshold()\n"
        "from orchestrator import runtime\n"
        "from orchestrator.jobs import collector\n"
        "import sys; assert 'torch' in sys.modules and 'pydantic' in sys.modules\n"
        "print(gc.get_freeze_count(), gc.get_threshold() == found, collector.deferred())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    frozen, same, held = done.stdout.split()
    assert int(frozen) > 100_000 and same == "True" and held == "False", done.stdout
