"""`orchestrate serve` of "mlp" (tests/configs/mlp.yaml), warmed on buckets 1 and 8 and served by a subprocess
on its own local Ray instance, shared by every test module that asks a real server (test_serve.py,
test_serve_v2.py): starting one costs a warmup, a Ray instance and a replica's load. The test that
stops it carries the `stops_server` mark: conftest.py runs it right after the last test that asks
the server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import pytest
import torch

from orchestrator.config import load_spec
from orchestrator.jobs.model import build_model

ROOT = Path(__file__).resolve().parent.parent

CONFIG = "tests/configs/mlp.yaml"  # examples/mlp.yaml, 2 layers deep
RESTRICTED_POD = ROOT / "tests" / "tools" / "restricted-pod"
POD_USER = 1000  # orchestrator.deployment.k8s.RUN_AS
START_SECONDS = 240  # Ray, Serve and a replica that loads both buckets from the cache
STOP_SECONDS = 60
BODY_TIMEOUT = 4  # seconds, `serve --body-timeout`
PORT_RACE_LAUNCHES = 3


class Server:
    """The `orchestrate serve` subprocess: its own session, so that its Ray processes are its
    group and can be ended with it, never anyone else's."""

    def __init__(
        self,
        cache: Path,
        log: Path,
        *,
        as_a_restricted_pod: bool = False,
        sigint_ignored: bool = False,
        config: str = CONFIG,
        buckets: Optional[str] = "1,8",
        name: str = "mlp",
    ) -> None:
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("ORCHESTRATE_CACHE_DIR", None)
        env.pop("RAY_ADDRESS", None)  # its own instance, whatever this shell points at
        self.log, self.stdout = log, log.with_name(f"{log.name}.stdout")
        self.ready = f"orchestrate: serving {name} at "
        self.as_a_restricted_pod = as_a_restricted_pod
        self._launch_args = (cache, config, buckets, env, sigint_ignored)
        self.launches = 0
        self._launch()
        self.url = ""
        self.ready_line = ""

    def _launch(self) -> None:
        cache, config, buckets, env, sigint_ignored = self._launch_args
        with socket.socket() as probe, socket.socket() as metrics:  # free ports, not Serve's default
            probe.bind(("127.0.0.1", 0))
            metrics.bind(("127.0.0.1", 0))
            self.port, self.metrics_port = probe.getsockname()[1], metrics.getsockname()[1]
        self._stderr, self._stdout = self.log.open("w"), self.stdout.open("w")
        command = [sys.executable, "-m", "orchestrator", "serve", "--model", config]
        command += ["--buckets", buckets] if buckets else []
        command += ["--device", "cpu", "--cache-dir", str(cache), "--port", str(self.port)]
        # planned: Serve routes nothing to the replica before every bucket is on warmup's choice
        command += ["--metrics-port", str(self.metrics_port), "--ready", "planned"]
        command += ["--body-timeout", str(BODY_TIMEOUT)]  # a slow client's 408 within a test's patience
        if self.as_a_restricted_pod:  # as the rendered serving container runs it
            command = [str(RESTRICTED_POD), *command, "--require-warm"]
        self.launches += 1
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=self._stdout,
            stderr=self._stderr,
            start_new_session=True,
            # what `orchestrate serve &` in a script gives it: a shell starts background jobs so
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if line.startswith(self.ready):
                    self.url = line[len(self.ready) :].split()[0]
                    self.ready_line = line
                    return
            if self.process.poll() is not None:
                # The free ports are released before serve binds them, so a Ray process started
                # meanwhile by another test worker can take one: that race, and only it, is retried.
                if "Address already in use" in self.log.read_text() and self.launches < PORT_RACE_LAUNCHES:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)  # the Ray instance it started
                    self._stderr.close()
                    self._stdout.close()
                    self._launch()
                    continue
                pytest.fail(f"orchestrate serve exited {self.process.returncode}:\n{self.log.read_text()}")
            time.sleep(0.5)
        pytest.fail(f"orchestrate serve not ready after {START_SECONDS} s:\n{self.log.read_text()}")

    def stop(self, how: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM, as a supervisor stops it, or `how`; the whole group is killed if it does not
        stop in time."""
        if self.process.poll() is None:
            self.process.send_signal(how)
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._stderr.close()
        self._stdout.close()
        return self.process.returncode


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """Served as the rendered pod serves, where this machine can make one (tests/tools/restricted-pod:
    uid 1000, no capabilities, read-only root): the cache lies outside pytest's root-only temporary
    folder and belongs to the pod's user, as fsGroup makes a volume the pod's."""
    restricted = subprocess.run([str(RESTRICTED_POD), "true"], capture_output=True).returncode == 0
    base = Path(tempfile.mkdtemp(prefix="orchestrate-serve-"))
    base.chmod(0o755)
    cache = base / "cache"
    from conftest import orchestrate

    try:
        warm = orchestrate(
            "warmup", "--no-ray", "--model", CONFIG, "--buckets", "1,8", "--device", "cpu", cache_dir=cache
        )
        assert warm.returncode == 0, warm.stderr
        if restricted:
            subprocess.run(["chown", "-R", f"{POD_USER}:{POD_USER}", str(cache)], check=True)
        log = tmp_path_factory.mktemp("serve-log") / "serve.err"
        running = Server(cache, log, as_a_restricted_pod=restricted, sigint_ignored=True)
        try:
            running.wait_ready()
            yield running
        finally:
            running.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def eager():
    model = build_model(load_spec(ROOT / CONFIG), torch.device("cpu"))

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(x)

    return run


def post(url: str, body: bytes | str) -> tuple[int, dict]:
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def predict(server: Server, x: torch.Tensor) -> tuple[int, dict]:
    return post(server.url, json.dumps({"inputs": [x.tolist()]}))


def assert_answers(status: int, answer: dict, x: torch.Tensor, eager) -> None:
    assert status == 200, answer
    outputs = torch.tensor(answer["outputs"])
    expected = eager(x)
    assert outputs.shape == expected.shape
    torch.testing.assert_close(outputs, expected, atol=1e-4, rtol=1e-4)
