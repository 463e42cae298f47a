"""JSON Schemas of the model config and of the warmup report, generated from their one definition:
the config's pydantic model (orchestrator.jobs.spec.WarmupSpec) and the report's dataclasses
(orchestrator.reports.records). Checked in under docs/schemas/; a test fails when they are stale.

Regenerate: python -m orchestrator.reports.schemas
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from orchestrator.jobs.spec import WarmupSpec
from orchestrator.reports.records import SCHEMA_VERSION, Report

DRAFT = "https://json-schema.org/draft/2020-12/schema"  # the draft pydantic generates
DIRECTORY = Path(__file__).resolve().parents[2] / "docs" / "schemas"
REGENERATE = "python -m orchestrator.reports.schemas"


def config_schema() -> dict[str, Any]:
    """What a model config (YAML, examples/*.yaml) may hold, as WarmupSpec validates it."""
    return {"$schema": DRAFT, **WarmupSpec.model_json_schema()}


def report_schema() -> dict[str, Any]:
    """The JSON report of `orchestrate warmup` (--json, --report): a process report or a Ray fleet report."""
    schema = TypeAdapter(Report).json_schema(mode="serialization")
    for definition in schema.get("$defs", {}).values():
        # every key is always written, defaults or not (new keys may appear within a schema version:
        # additional properties stay allowed)
        if "properties" in definition:
            definition["required"] = list(definition["properties"])
    return {"$schema": DRAFT, "title": f"Warmup report, schema_version {SCHEMA_VERSION}", **schema}


def rendered() -> dict[str, str]:
    """File name under docs/schemas -> its text."""
    schemas = {"config.schema.json": config_schema(), "report.schema.json": report_schema()}
    return {name: json.dumps(schema, indent=2) + "\n" for name, schema in schemas.items()}


def main() -> None:
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (DIRECTORY / name).write_text(text)
        print(DIRECTORY / name)


if __name__ == "__main__":
    main()
