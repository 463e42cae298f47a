"""Every command's --help shows an example and its exit codes, in one format (cli.py's docstrings):

    \\b
    Example:
      orchestrate warmup --model examples/mlp.yaml --buckets 1,8,32
    Exit codes:
        0  ok
        2  usage/config/setup error

The walk goes through every group, so a command added later is held to it too.
"""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.errors import EXIT_BUCKET_FAILED, EXIT_CLUSTER, EXIT_INTERRUPTED, EXIT_MISS, EXIT_OK, EXIT_USAGE


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = [(path, group)]
    ctx = click.Context(group, info_name="orchestrate")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            found += commands(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


EVERY = commands(cli)


def help_of(path: tuple[str, ...]) -> str:
    return CliRunner().invoke(cli, [*path, "--help"], prog_name="orchestrate").output


def test_the_walk_finds_nested_commands():
    names = {" ".join(path) for path, _ in EVERY}
    assert {"", "warmup", "pull", "serve", "cache", "cache gc", "render k8s", "keys new"} <= names


@pytest.mark.parametrize("path", [path for path, _ in EVERY], ids=lambda path: " ".join(path) or "orchestrate")
def test_help_shows_an_example_and_the_exit_codes(path):
    text = help_of(path)
    example = re.search(r"^  Example:\n    (orchestrate .+)$", text, re.MULTILINE)
    assert example, text
    # the example is a command of this very command (or, for a group, one of its subcommands)
    assert example.group(1).startswith(" ".join(("orchestrate", *path))), example.group(1)
    codes = re.search(r"^  Exit codes:\n((?:\s+\d+  \S.*\n)+)", text, re.MULTILINE)
    assert codes, text
    listed = [int(line.split()[0]) for line in codes.group(1).splitlines()]
    assert listed == sorted(listed) and listed[0] == EXIT_OK, listed
    assert EXIT_USAGE in listed, listed  # every command can be called wrongly


def test_the_exit_codes_are_the_documented_ones():
    """warmup's list is the README's table, less pull's own 5."""
    text = help_of(("warmup",))
    listed = {int(m) for m in re.findall(r"^\s+(\d+)  ", text.split("Exit codes:")[1].split("Options:")[0], re.M)}
    assert listed == {EXIT_OK, EXIT_BUCKET_FAILED, EXIT_USAGE, 3, 4, EXIT_CLUSTER, EXIT_INTERRUPTED}
    assert EXIT_MISS in {int(m) for m in re.findall(r"^\s+(\d+)  ", help_of(("pull",)), re.M)}
