"""Python's full collections held off while replicas load, and given back as they were found."""

from __future__ import annotations

import gc

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
