"""`orchestrate serve` for real: examples/mlp.yaml warmed on buckets 1 and 8, served by a subprocess
on its own local Ray instance (tests/served.py), asked over HTTP; every answer is checked against
the model run eagerly on the same input."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from served import BODY_TIMEOUT, POD_USER, Server, assert_answers, post, predict

pytestmark = pytest.mark.slow


def test_the_ready_line_names_both_protocols(server):
    base = server.url.rsplit("/predict", 1)[0]
    assert server.url == f"{base}/predict" and f" and {base}/v2 (" in server.ready_line, server.ready_line
    with urllib.request.urlopen(f"{base}/v2/health/live", timeout=30) as response:
        assert response.status == 200


def test_the_server_reports_what_it_loaded(server):
    with urllib.request.urlopen(server.url.replace("/predict", "/info"), timeout=30) as response:
        info = json.loads(response.read())
    assert info["device"] == "cpu"
    assert sorted(info["buckets"]) == ["1", "8"]
    for row in info["buckets"].values():
        assert row["variant"] in ("eager", "compiled"), row
        assert row["cache_misses"] == 0, row  # loaded what warmup compiled, compiled nothing
        assert row["on_plan"] and not row["loading"] and row["on_plan_seconds"] <= info["ready_seconds"], row
    # --ready planned: the first answer came with every bucket on its plan already
    assert info["ready"] == "planned" and info["on_plan"] and not info["loading"]
    assert info["answering_seconds"] <= info["on_plan_seconds"] <= info["ready_seconds"]


def test_the_server_runs_as_a_restricted_pod_and_starts_warm(server):
    """uid 1000 with no capabilities on a read-only root filesystem, --require-warm: what the
    rendered serving container does; every bucket on warmup's choice, none compiled from scratch."""
    if not server.as_a_restricted_pod:
        pytest.skip("tests/tools/restricted-pod cannot set up here (needs root and util-linux)")
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines())
    assert status["Uid"].split()[:2] == [str(POD_USER)] * 2 and status["CapEff"].strip("0\n") == ""
    assert status["NoNewPrivs"].strip() == "1"
    with urllib.request.urlopen(server.url.replace("/predict", "/info"), timeout=30) as response:
        info = json.loads(response.read())
    assert all(row["cache_misses"] == 0 and row["variant"] == row["planned"] for row in info["buckets"].values())


@pytest.mark.parametrize("size", [1, 5, 8, 13])  # 13: more than the largest bucket, run in chunks of 8
def test_any_request_size_answers_as_eager(server, eager, size):
    x = torch.randn(size, 256, generator=torch.Generator().manual_seed(size))
    assert_answers(*predict(server, x), x, eager)


def test_concurrent_requests_of_mixed_sizes_are_each_answered_right(server, eager):
    generator = torch.Generator().manual_seed(7)
    inputs = [torch.randn(size, 256, generator=generator) for size in [1, 3, 5, 8, 13, 2, 1, 7] * 4]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: predict(server, x), inputs))
    for x, (status, answer) in zip(inputs, answers, strict=True):
        assert_answers(status, answer, x, eager)


ROW = [0.5] * 256
BAD = {
    "invalid JSON": ('{"inputs": [[', "not valid JSON"),
    "no inputs": (json.dumps({"input": [[ROW]]}), 'no "inputs"'),
    "two inputs": (json.dumps({"inputs": [[ROW], [ROW]]}), '"inputs" has 2 arrays, the model takes 1'),
    "inner dimension": (json.dumps({"inputs": [[ROW[:255]]]}), "inputs[0] has size 255 at dim 1, expected 256"),
    "not a number": (json.dumps({"inputs": [[ROW[:100] + ["x"] + ROW[101:]]]}), 'inputs[0][0][100] is "x"'),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_request_is_a_400_with_one_line(server, case):
    body, message = BAD[case]
    status, answer = post(server.url, body)
    assert status == 400, answer
    assert list(answer) == ["error"] and message in answer["error"], answer
    assert "\n" not in answer["error"]


def test_bad_requests_among_good_ones_fail_alone(server, eager):
    """Sent together, so that they share batches: the bad ones get their 400, the good ones their outputs."""
    generator = torch.Generator().manual_seed(11)
    good = [torch.randn(size, 256, generator=generator) for size in (2, 6, 1, 9)]
    bodies = [json.dumps({"inputs": [x.tolist()]}) for x in good] + [body for body, _ in BAD.values()]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: post(server.url, body), bodies))
    for x, (status, answer) in zip(good, answers, strict=False):
        assert_answers(status, answer, x, eager)
    assert [status for status, _ in answers[len(good) :]] == [400] * len(BAD)
    x = torch.randn(4, 256, generator=generator)
    assert_answers(*predict(server, x), x, eager)  # and the replica serves on


def post_npz(url: str, data: bytes) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/x-npz"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


@pytest.mark.parametrize("size", [3, 8, 13])
def test_npz_requests_are_answered_in_npz_as_eager(server, eager, size):
    x = torch.randn(size, 256, generator=torch.Generator().manual_seed(100 + size))
    buffer = io.BytesIO()
    np.savez(buffer, x.numpy())
    status, media_type, answer = post_npz(server.url, buffer.getvalue())
    assert status == 200 and media_type == "application/x-npz", answer[:200]
    outputs = np.load(io.BytesIO(answer), allow_pickle=False)
    assert outputs.files == ["output"]
    torch.testing.assert_close(torch.from_numpy(outputs["output"]), eager(x), atol=1e-4, rtol=1e-4)
    status, media_type, answer = post_npz(server.url, b"not an archive")
    assert status == 400 and media_type == "application/json"
    assert "not an .npz" in json.loads(answer)["error"]


def test_malformed_bodies_are_400s_and_too_many_rows_a_413(server, eager):
    """Bodies from the fault campaign's corpus (tests/test_serve_fuzz.py) through the real server:
    each a 400 with its one JSON line, never a 500; more rows than serve.max_rows (unset: four times
    the largest bucket, 8) a 413; and the replica serves on."""
    from test_serve_fuzz import CENTRAL, LOCAL, archive, first_data_byte, flipped, npy, patched

    buffer = io.BytesIO()
    np.savez(buffer, np.zeros((2, 256), np.float32))
    valid = buffer.getvalue()
    archives = {
        "a bad CRC": flipped(valid, first_data_byte(valid) + 3),
        "compression method 99": patched(patched(valid, LOCAL, 8, "<H", 99), CENTRAL, 10, "<H", 99),
        "a member that is not .npy": archive({"arr_0": b"hello"}),
        "a header of 2**40 x 256 floats": archive({"arr_0.npy": npy(b"\0" * 64, shape=(2**40, 256))}),
    }
    for case, data in archives.items():
        status, media_type, answer = post_npz(server.url, data)
        assert status == 400 and media_type == "application/json", (case, answer)
        error = json.loads(answer)
        assert list(error) == ["error"] and "\n" not in error["error"], (case, error)
    status, answer = post(server.url, "[" * 100_000 + "]" * 100_000)
    assert status == 400 and "nests deeper than JSON is parsed here" in answer["error"], answer
    status, answer = post(server.url, json.dumps({"inputs": [[[True, *ROW[1:]]]]}))
    assert status == 400 and "inputs[0] holds true/false; it is float32" in answer["error"], answer
    status, answer = predict(server, torch.zeros(33, 256))
    assert status == 413 and answer == {
        "error": "inputs[0] has 33 at dim 0 (batch), more than serve.max_rows 32; send at most that many a request"
    }
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(32))
    assert_answers(*predict(server, x), x, eager)


def test_the_replica_serves_its_metrics(server, eager):
    """--metrics-port: the replica's own /metrics, from its process: the variant of each bucket,
    and every model call counted on its bucket with the padding it took."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict[str, dict[tuple, float]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as response:
            page = response.read().decode()
        samples: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return samples

    def per_bucket(samples: dict[str, dict[tuple, float]], name: str) -> dict[str, float]:
        return {dict(labels)["bucket"]: value for labels, value in samples[name].items()}

    with urllib.request.urlopen(server.url.replace("/predict", "/info"), timeout=30) as response:
        info = json.loads(response.read())
    before = scrape()
    variants = {dict(labels)["bucket"]: dict(labels)["variant"] for labels in before["orchestrate_replica_variant"]}
    assert variants == {bucket: row["variant"] for bucket, row in info["buckets"].items()}
    assert list(before["orchestrate_replica_cold_buckets"].values()) == [0]
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3))
    assert_answers(*predict(server, x), x, eager)  # alone: one call on bucket 8, five rows of padding
    after = scrape()
    calls = per_bucket(after, "orchestrate_replica_calls_total")
    rows, padded = (
        per_bucket(after, name) for name in ("orchestrate_replica_rows_total", "orchestrate_replica_padded_rows_total")
    )
    assert calls["8"] - per_bucket(before, "orchestrate_replica_calls_total")["8"] == 1
    assert rows["8"] - per_bucket(before, "orchestrate_replica_rows_total")["8"] == 3
    assert padded["8"] - per_bucket(before, "orchestrate_replica_padded_rows_total")["8"] == 5
    assert all(rows[b] + padded[b] == calls[b] * int(b) for b in calls)


def _slow_clients(server, count: int) -> list[socket.socket]:
    """`count` clients that each send a request's head, promising a megabyte, and 10 bytes of it."""
    host, port = urllib.parse.urlsplit(server.url).hostname, urllib.parse.urlsplit(server.url).port
    held = []
    for _ in range(count):
        client = socket.create_connection((host, port), timeout=10)
        client.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n" + b'{"inputs":'
        )
        held.append(client)
    return held


def test_slow_clients_hold_no_model_slot_and_are_answered_408_past_the_body_timeout(server, eager):
    """A slow client holds one of the replica's many slots, not one of the model's (this one has
    32): two hundred leave readiness and good requests answering, and each is answered 408 once
    --body-timeout has passed without its body."""
    held = _slow_clients(server, 200)
    try:
        base = server.url.rsplit("/predict", 1)[0]
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=BODY_TIMEOUT) as response:
            assert response.status == 200  # answered while every slow body is still awaited
        x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3))
        assert_answers(*predict(server, x), x, eager)
        answers = []
        for client in held:  # the gateway gives up on each body at the timeout
            client.settimeout(BODY_TIMEOUT + 30)
            answers.append(client.recv(4096).split(b"\r\n", 1)[0])
        assert set(answers) == {b"HTTP/1.1 408 Request Timeout"}, set(answers)
    finally:
        for client in held:
            client.close()


def _in_session(session: int, named: str) -> list[int]:
    """The processes of `session` whose command line holds `named`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == session and named in command:
            found.append(int(stat.parent.name))
    return found


def test_a_server_whose_ray_node_dies_at_start_exits_6_in_one_line(tmp_path):
    """The local raylet killed while Serve starts the application: Serve's own calls end only once
    the node's heartbeats time out, if ever; the watched raylet's exit ends the start at once."""
    server = Server(tmp_path / "cache", tmp_path / "serve.err")
    try:
        deadline = time.monotonic() + 120
        while not _in_session(server.process.pid, "ServeController") and time.monotonic() < deadline:
            assert server.process.poll() is None, server.log.read_text()
            time.sleep(0.2)
        for raylet in _in_session(server.process.pid, "/raylet "):
            os.kill(raylet, signal.SIGKILL)
        code = server.process.wait(timeout=120)
    finally:
        server.stop()
    text = server.log.read_text()
    assert code == 6 and "Traceback" not in text, text
    [line] = [line for line in text.splitlines() if line.startswith("orchestrate: error: ")]
    assert "the local Ray node stopped while the model server started" in line


@pytest.mark.stops_server
def test_sigint_stops_a_server_started_in_the_background_cleanly(server):
    """Started as a script's `orchestrate serve &` starts it, with SIGINT ignored: `kill -INT`
    (what a script's Ctrl-C sends its jobs) still stops it as Ctrl-C does."""
    assert server.stop(signal.SIGINT) == 0, server.log.read_text()
    screen = server.log.read_text().splitlines()
    assert screen[-1] == "orchestrate: stopped"
    # Ray's and Serve's own lines (tasks retried while Serve shuts down) are in the run's log, not here
    assert all(line.startswith("orchestrate: ") for line in screen), screen
    assert server.stdout.read_text() == ""
    (named,) = [line for line in screen if "own output goes to" in line]
    assert Path(named.rsplit(" ", 1)[1]).is_file()
