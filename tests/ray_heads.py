"""Stopping one Ray cluster that a test started with `ray start`, and nothing else.

`ray stop --force` kills every Ray process on the machine: the local instances of tests running
beside this one in another pytest-xdist worker would die with it. A cluster's processes are its
GCS server, every process whose command line names its GCS address (raylets, monitors, the client
server, the dashboard), and their descendants (workers and agents, whose command lines Ray rewrites
to `ray::...`)."""

from __future__ import annotations

import json
import os
import re
import signal
import time

# A test starts heads with `--include-dashboard false` and still gets a dashboard process on
# 8265, and the client server on 10001: the modules that start heads share this xdist group,
# so two never run at a time (conftest.group_for_workers).
HEADS = "ray-heads"
# For every `ray start --head` of the tests. Ray otherwise starts an idle worker per CPU for each
# new driver, each importing Ray, and none is used (the product's units and ranks are actors, a
# process each, as its own local instance is told with the same setting): on 2 cores their starts
# slow down the job under test.
HEAD_OPTIONS = ("--system-config", json.dumps({"prestart_worker_first_driver": False}))


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every live process (zombies are already gone), from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):  # gone meanwhile
            continue
        if state != "Z":
            found[int(entry)] = (int(parent), command)
    return found


def cluster_pids(address: str, known: frozenset[int] = frozenset()) -> set[int]:
    """Every live process of the cluster whose GCS listens at `address` ("ip:port"), and of `known`."""
    port = address.rsplit(":", 1)[1]
    # the exact address or the GCS server's port flag, never a longer port that starts alike
    names = re.compile(rf"(?<![\d.]){re.escape(address)}(?!\d)|--gcs_server_port={port}(?!\d)")
    processes = _processes()
    members = {pid for pid, (_, command) in processes.items() if pid in known or names.search(command)}
    grown = True
    while grown:
        children = {pid for pid, (parent, _) in processes.items() if parent in members} - members
        members |= children
        grown = bool(children)
    members.discard(os.getpid())
    return members


def stop_cluster(address: str, patience: float = 10.0) -> None:
    """SIGKILL every process of the cluster at `address`, as `ray stop --force` does to all of
    them. The first look's processes stay targeted: a worker whose raylet died first is no
    longer its child, and its command line does not name the cluster."""
    deadline = time.monotonic() + patience
    members = frozenset(cluster_pids(address))
    while pids := cluster_pids(address, members):
        members |= pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray cluster at {address}: processes {sorted(pids)} outlived SIGKILL")
        time.sleep(0.1)
