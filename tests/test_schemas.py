"""docs/schemas/*.schema.json: generated from the config's pydantic model and the report's
dataclasses (orchestrator.reports.schemas), checked in, and what real configs and reports satisfy."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.reports.schemas import DIRECTORY, REGENERATE, config_schema, rendered, report_schema

ROOT = Path(__file__).resolve().parents[1]


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("name", sorted(rendered()))
def test_checked_in_schema_is_current(name):
    path = DIRECTORY / name
    assert path.is_file() and path.read_text() == rendered()[name], (
        f"{path.relative_to(ROOT)} is stale: regenerate it with `{REGENERATE}` and commit it"
    )


@pytest.mark.parametrize("config", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_satisfy_the_config_schema(config):
    validator(config_schema()).validate(yaml.safe_load(config.read_text()))


def test_config_schema_rejects_what_the_model_rejects():
    config = yaml.safe_load((ROOT / "examples" / "mlp.yaml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        validator(config_schema()).validate({**config, "compile": {"mode": "fastest"}})


def test_synthetic_reports_satisfy_the_report_schema():
    from test_report_records import STARTED, fleet_run, process_run, spec

    from orchestrator.reports.report import build_fleet_report, build_report

    check = validator(report_schema())
    for report in (
        build_report(spec(), process_run(remote=True), STARTED),
        build_report(spec(), process_run(remote=False), STARTED),
        build_fleet_report(spec(), fleet_run(), "s3://bucket/prefix", STARTED),
    ):
        check.validate(json.loads(json.dumps(report)))
    broken = build_report(spec(), process_run(remote=False), STARTED)
    del broken["summary"]["cache_state"]
    with pytest.raises(jsonschema.ValidationError):
        check.validate(broken)
