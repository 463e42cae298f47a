"""The one slug rule (orchestrator.cache.namespace.slug) and the three names made with it: the cache namespace,
the Ray submission id and the Kubernetes object name. Names already in stores and clusters were
made by this rule, so these cases pin it."""

from __future__ import annotations

import pytest

from orchestrator.cache.namespace import Platform, namespace, slug
from orchestrator.deployment.k8s import name_for
from orchestrator.deployment.submit import submission_id
from orchestrator.jobs.spec import WarmupSpec


@pytest.mark.parametrize(
    "text, keep, expected",
    [
        ("mlp", "-", "mlp"),
        ("My_Model.v2", "-", "my-model-v2"),  # lowercased; '_' and '.' are not DNS label characters
        ("My_Model.v2", ".", "my-model.v2"),  # a namespace keeps the '.'
        ("NVIDIA H200 (SXM)", ".", "nvidia-h200-sxm"),  # a run of others is one '-', none at the ends
        ("a--b", "-", "a--b"),  # '-' kept as it is, runs included
        ("a--b", ".", "a-b"),  # '-' not kept: the run becomes one '-'
        ("a-_b", "-", "a--b"),
        ("--a--", "-", "a"),
        ("modèle", "-", "mod-le"),  # ASCII letters only
    ],
)
def test_slug_cases(text, keep, expected):
    assert slug(text, 32, keep=keep) == expected


def test_slug_cuts_after_trimming_the_ends():
    assert slug("-abcdef", 3, keep="-") == "abc"
    assert slug("abc-def", 4, keep="-") == "abc-"  # the cut may end on a '-': names made so stay so


@pytest.mark.parametrize("text", ["", "-", "___", "ü"])
def test_slug_falls_back_only_when_nothing_is_left(text):
    assert slug(text, 24, keep="-", fallback="model") == "model"
    assert slug(text, 32, keep="-") == ""  # no fallback given: empty
    assert slug("a" + text, 24, keep="-", fallback="model") == "a"


def spec(name: str) -> WarmupSpec:
    return WarmupSpec.model_validate({"name": name, "model": {"factory": "m:f"}, "inputs": [{"shape": ["batch", 4]}]})


def test_the_three_names_use_the_rule_with_their_own_characters_and_lengths():
    name = "My_Model.v2-" + "x" * 40
    platform = Platform("2.5.1+cu124", "abc", "3.1.0", "12.4", "NVIDIA H200", "3.12.3")
    assert namespace(name, platform, "hash").startswith(f"{slug(name, 32, keep='.')}-torch2.5.1-nvidia-h200-")
    assert namespace(name, platform, "hash").startswith("my-model.v2-" + "x" * 20 + "-torch")
    assert submission_id(spec(name)).startswith("orchestrate-my-model-v2-" + "x" * 20 + "-")
    assert name_for(spec(name)) == f"warmup-my-model-v2-{'x' * 12}-{spec(name).identity_hash()[:8]}"
