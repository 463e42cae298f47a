"""`submit --k8s --apply`: server-side apply as the API server receives it, and its failures.

There is no cluster here: the API server is a recording HTTP server on loopback that answers as
one does (201 on create, 200 on an apply that finds the object, a Status object on refusal). What
is checked is the wire protocol the real client library sends through a real kubeconfig: one
PATCH per object to its own path, the apply-patch content type, the field manager, the whole
object as the body; that a re-run sends the same; and that every failure is one line, exit 3.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from conftest import orchestrate

pytest.importorskip("kubernetes")

SUBMIT = ("submit", "--k8s", "--apply", "--model", "examples/mlp.yaml", "--image", "example.com/orchestrate:1")
TOKEN = "test-token-not-a-secret"


class ApiServer:
    """Records every request; answers 201 for an object it has not seen, 200 after, or the Status
    given in `refuse` for a path."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.objects: dict[str, dict] = {}
        self.refuse: dict[str, tuple[int, str, str]] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:  # noqa: N802 (http.server's naming)
                url = urlsplit(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(
                    {
                        "path": url.path,
                        "query": parse_qs(url.query),
                        "content_type": self.headers["Content-Type"],
                        "authorization": self.headers["Authorization"],
                        "body": body,
                    }
                )
                if url.path in server.refuse:
                    code, reason, message = server.refuse[url.path]
                    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
                    self._answer(code, {**status, "reason": reason, "code": code})
                    return
                code = 200 if url.path in server.objects else 201
                server.objects[url.path] = body
                self._answer(code, body)

            def _answer(self, code: int, document: dict) -> None:
                data = json.dumps(document).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def kubeconfig(server: str) -> str:
    """A kubeconfig whose one context is the API server at `server`, with a bearer token."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": TOKEN}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


@pytest.fixture
def api(tmp_path):
    server = ApiServer()
    (tmp_path / "kubeconfig").write_text(kubeconfig(server.url))
    server.env = {"KUBECONFIG": str(tmp_path / "kubeconfig")}
    yield server
    server.httpd.shutdown()


def test_apply_sends_each_object_whole_as_a_server_side_apply_and_a_rerun_sends_the_same(api):
    args = (*SUBMIT, "--remote", "s3://b/c", "--namespace", "ml", "--workers", "2", "--gpus-per-worker", "4")
    first = orchestrate(*args, env=api.env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""  # applied, not printed
    rendered = list(yaml.safe_load_all(orchestrate("render", "k8s", *args[3:]).stdout))
    paths = [
        "/api/v1/namespaces/ml/configmaps/" + rendered[0]["metadata"]["name"],
        "/apis/ray.io/v1/namespaces/ml/rayjobs/" + rendered[1]["metadata"]["name"],
        "/api/v1/namespaces/ml/configmaps/serve-mlp-config",
        "/apis/apps/v1/namespaces/ml/deployments/serve-mlp",
        "/api/v1/namespaces/ml/services/serve-mlp",
    ]
    assert [r["path"] for r in api.requests] == paths  # config maps before what mounts them
    for request, document in zip(api.requests, rendered, strict=True):
        assert request["content_type"] == "application/apply-patch+yaml"
        assert request["query"]["fieldManager"] == ["orchestrate"]
        assert "force" not in request["query"]  # a field another manager owns is a conflict, not taken
        assert request["authorization"] == f"Bearer {TOKEN}"
        assert request["body"] == document
    assert [line.split()[0] for line in first.stderr.splitlines() if line.split()[0] in ("created", "applied")] == [
        "created"
    ] * 5
    again = orchestrate(*args, env=api.env)
    assert again.returncode == 0, again.stderr
    assert api.requests[5:] == api.requests[:5]  # idempotent: the same objects to the same places
    assert sum(line.startswith("applied ") for line in again.stderr.splitlines()) == 5


@pytest.mark.parametrize(
    ("code", "reason", "message", "hint"),
    [
        (
            409,
            "Conflict",
            'Apply failed with 1 conflict: conflict with "kubectl-edit": .spec.replicas',
            "another field manager",
        ),
        (403, "Forbidden", 'rayjobs.ray.io "x" is forbidden: User "u" cannot patch resource', "RBAC"),
        (404, "NotFound", "the server could not find the requested resource", "KubeRay"),
    ],
)
def test_a_refusal_of_the_api_server_is_one_line_exit_3(api, code, reason, message, hint):
    rendered = list(yaml.safe_load_all(orchestrate("render", "k8s", *SUBMIT[3:]).stdout))
    job = rendered[1]["metadata"]["name"]
    api.refuse[f"/apis/ray.io/v1/namespaces/default/rayjobs/{job}"] = (code, reason, message)
    proc = orchestrate(*SUBMIT, env=api.env)
    assert proc.returncode == 3, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error:")]
    assert len(error) == 1 and "Traceback" not in proc.stderr
    assert error[0].startswith(f"orchestrate: error: RayJob default/{job}: the API server refused it: {code} {message}")
    assert hint in error[0]


def test_no_cluster_and_an_unreachable_one_are_one_line_exit_3(api, tmp_path):
    proc = orchestrate(*SUBMIT, env={"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)})
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[1:] == [
        "orchestrate: error: --apply: no Kubernetes cluster configured (Invalid kube-config file. No configuration "
        "found.); set KUBECONFIG or run inside the cluster, or leave out --apply to print the manifests"
    ]  # after the note that no store means no serving side
    api.httpd.shutdown()
    api.httpd.server_close()
    proc = orchestrate(*SUBMIT, env=api.env)
    assert proc.returncode == 3, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("orchestrate: error:")]
    assert len(error) == 1 and "cannot reach the API server" in error[0] and "Traceback" not in proc.stderr


def test_apply_without_k8s_is_a_usage_error():
    proc = orchestrate("submit", "--apply", "--model", "examples/mlp.yaml", "--ray-address", "http://h:8265")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["orchestrate: error: --apply goes with --k8s"]


def test_apply_without_the_kubernetes_package_says_which_extra_exit_2(tmp_path):
    """The kubernetes package missing is this machine's setup, not an unreachable cluster: exit 2.
    A package of that name that fails to import stands for its absence, earlier on the path."""
    (tmp_path / "kubernetes").mkdir()
    (tmp_path / "kubernetes" / "__init__.py").write_text("raise ImportError('no kubernetes here')\n")
    proc = orchestrate(*SUBMIT, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "orchestrate: error: --apply needs the kubernetes client: pip install 'torch-warmup-orchestrator[k8s]'"
    )
