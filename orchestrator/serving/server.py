"""`orchestrate serve`: the warmed model behind HTTP on Ray Serve.

    POST /predict   {"inputs": [[...], ...]}   ->  200 {"outputs": ...}
                    (Content-Type application/x-npz: numpy.savez arrays in, an .npz out)
                                                    400 {"error": "<one line>"}  (the request's fault)
                                                    413 {"error": "<one line>"}  (more rows than serve.max_rows)
    GET  /info      the replica's load report (orchestrator.runtime.ReplicaInfo)
    /v2/...         the Open Inference Protocol (KServe v2, Triton's HTTP/REST): health, metadata,
                    POST /v2/models/NAME/infer (orchestrator.serving.inference_protocol)
    GET  /metrics   on --metrics-port, from the replica's own process: orchestrator.serving.metrics

A request's body is taken whole (within `--body-timeout`) before it takes one of the model's few
slots: a slow client holds one of the replica's many, never one of the model's. One replica
(`ModelServer`) loads the model with `runtime.load` in its constructor, so Serve sends it nothing
before the load returns: with `--ready answering` once every bucket answers (eager
until its planned variant is swapped in, in the background), with `planned` once every bucket is
on its plan. Requests arriving together are batched (`serve.batch`,
up to the largest bucket's count of requests): their inputs are joined along the bucket
dimension, the model runs once (padded to a bucket, or in chunks of the largest), and the outputs
are cut back per request (orchestrator.serving.codec); the protocol's inference requests join the
same batches. Joining assumes what `serve.oversize: split` assumes: rows along the bucket dimension
do not interact; `max_batch_size=1` runs every request alone for a model where they do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from orchestrator.jobs.errors import brief
from orchestrator.jobs.records import Remote
from orchestrator.jobs.spec import ReadyWhen, WarmupSpec
from orchestrator.jobs.workers import threads_as_a_plain_process

if TYPE_CHECKING:  # torch is imported in the replica, after its thread count is set
    from orchestrator.serving.codec import Answer
    from orchestrator.serving.codec import Request as Decoded

T = TypeVar("T")
# how long a request's body may take to arrive (`serve --body-timeout`), and how many requests a
# replica holds at once, their bodies arriving or waiting for the model
BODY_SECONDS = 30.0
PENDING_REQUESTS = 1024
HEADER_LENGTH = "inference-header-content-length"  # the protocol's binary data: its JSON's length
BATCH_WAIT_SECONDS = 0.005  # how long the first request of a batch waits for others to join it
ROUTES = "POST /predict, GET /info, and the Open Inference Protocol under /v2"
_RAISED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): (?P<message>.*)$")  # a traceback's last line
logger = logging.getLogger("ray.serve")


# A model that fails to load fails the same way again: report it instead of retrying. Serve gives a
# request one of the replica's slots before its body has arrived, so the replica has many
# (PENDING_REQUESTS: requests whose bodies are arriving or that wait for the model; past them, and
# as many queued, Serve answers 503), and the model's own few are a semaphore taken once a body is
# whole: a client sending slowly holds a cheap slot, never one of the model's.
@serve.deployment(
    max_constructor_retry_count=1, max_ongoing_requests=PENDING_REQUESTS, max_queued_requests=PENDING_REQUESTS
)
class ModelServer:
    def __init__(
        self,
        spec: WarmupSpec,
        remote: Optional[Remote],
        require_warm: bool,
        max_batch_size: int,
        batch_wait_seconds: float,
        metrics: Optional[tuple[str, int]] = None,
        ready: ReadyWhen = "answering",
        trusted: tuple[str, ...] = (),
        body_seconds: float = BODY_SECONDS,
        model_slots: int = 16,
    ) -> None:
        """trusted: public keys (PEM) to trust for the store beside the cache, where there is no
        `remote` (whose own trusted keys are these, already). body_seconds: how long a request's
        body may take to arrive (else 408). model_slots: requests decoded or run at once."""
        self._body_seconds = body_seconds
        self._model_slots = asyncio.Semaphore(model_slots)
        # Ray starts a replica with OMP_NUM_THREADS set to its CPU share; the warm cache holds CPU
        # kernels built for the node's default thread count, as a plain process runs them
        threads_as_a_plain_process()
        from orchestrator import runtime
        from orchestrator.cache.manifest import TrustedKeys
        from orchestrator.serving.codec import Answer, OutputError, RequestCodec, RequestError
        from orchestrator.serving.inference_protocol import InferenceProtocol

        self.model = runtime.load(
            spec,
            remote=remote.url if remote else None,
            require_warm=require_warm,
            allow_unsigned=bool(remote and remote.allow_unsigned),
            trust=list(TrustedKeys.from_pems(remote.trusted if remote else trusted)),
            ready=ready,
        )
        # a grid's replica knows its outputs' dimensions: what cuts a joined call's answer back
        grid = self.model if isinstance(self.model, runtime.GridModel) else None
        self.codec = RequestCodec(self.model.spec, self.model.device, grid.dims if grid else None)
        # a batch's outputs are the model's own buffers (`borrow()`) until they are on the host;
        # no other call of the model may replay over them meanwhile, the protocol's own included
        self._calls = threading.Lock()
        self.protocol = InferenceProtocol(
            self.model.spec, self.codec, self._call_model, grid.output_dims if grid else None
        )
        self._answer_type = Answer
        self._request_error = RequestError
        self._client_errors: tuple[type[Exception], ...] = (RequestError, runtime.BadRequest)
        self._output_error = OutputError
        batcher: Any = self._predict  # serve.batch's wrapper, which carries its setters
        batcher.set_max_batch_size(max_batch_size)
        batcher.set_batch_wait_timeout_s(batch_wait_seconds)
        if metrics:
            # in this process: the replica's model is what the collector reads at each scrape (one
            # replica per server, so one port per pod)
            from prometheus_client import start_http_server

            host, port = metrics
            start_http_server(port, addr=host, registry=runtime.metrics_registry(self.model, spec.name))

    def info(self) -> dict[str, Any]:
        """What the replica serves: per bucket the variant serving it now, whether it is on plan and
        since when, cache hits, load seconds; and where its start went."""
        return json.loads(json.dumps(self.model.info().to_dict(), default=str))

    async def __call__(self, request: Request) -> Response:
        body = b""
        if request.method not in ("GET", "HEAD"):
            try:
                body = await asyncio.wait_for(request.body(), self._body_seconds)
            except asyncio.TimeoutError:
                message = f"the request's body did not arrive within {self._body_seconds:g} s; send it whole at once"
                return _error(408, message, headers={"Connection": "close"})
            async with self._model_slots:
                return await self._route(request, body)
        return await self._route(request, body)  # health, metadata, /info: never behind the model's work

    async def _route(self, request: Request, body: bytes) -> Response:
        """One HTTP request, its body whole: its response."""
        path = request.url.path.rstrip("/") or "/"
        if path == "/predict":
            if request.method != "POST":
                return _error(405, "use POST with a JSON body on /predict", headers={"Allow": "POST"})
            wire = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
            loop = asyncio.get_running_loop()
            try:  # in a thread: decoding a large body must not hold up the requests behind it
                decoded = await loop.run_in_executor(None, self.codec.decode, body, wire)
            except self._request_error as exc:  # 400; 413 for more rows than serve.max_rows
                return _error(exc.status, str(exc))
            except Exception as exc:  # the codec's own fault, answered in the same one line
                logger.exception("decoding a request failed")
                return _error(500, f"the request could not be decoded: {brief(exc)}")
            return _response(await self._predict(decoded))
        if path == "/info":
            if request.method != "GET":
                return _error(405, "use GET on /info", headers={"Allow": "GET"})
            return JSONResponse(self.info())
        if path == "/v2" or path.startswith("/v2/"):
            return await self._v2(request, path, body)
        return _error(404, f"no route {request.method} {request.url.path}; this server answers {ROUTES}")

    async def _v2(self, request: Request, path: str, body: bytes) -> Response:
        """The Open Inference Protocol: GETs answered from the protocol, inference requests decoded
        by it and answered through the same batches as /predict's."""
        loop = asyncio.get_running_loop()
        try:
            endpoint = self.protocol.endpoint(request.method, path)
            if endpoint != "infer":  # in a thread: the first model metadata calls the model
                return JSONResponse(await loop.run_in_executor(None, self.protocol.get, endpoint))
            headers = request.headers
            decoded = await loop.run_in_executor(
                None, self.protocol.decode, body, headers.get(HEADER_LENGTH), headers.get("content-encoding")
            )
        except self._request_error as exc:  # 400, 404, 405; 413 for more rows than serve.max_rows
            return _error(exc.status, str(exc), headers=getattr(exc, "headers", None))
        except Exception as exc:  # the protocol's own fault, answered in the same one line
            logger.exception("a v2 request failed before the model")
            return _error(500, f"the request could not be answered: {brief(exc)}")
        return _response(await self._predict(decoded))

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=BATCH_WAIT_SECONDS)
    async def _predict(self, requests: list[Decoded]) -> list[Answer]:
        # in a thread: the event loop keeps reading requests, which then form the next batch
        return await asyncio.get_running_loop().run_in_executor(None, self._answer_all, requests)

    def _answer_all(self, requests: list[Decoded]) -> list[Answer]:
        answers: list[Any] = [None] * len(requests)
        for group in self.codec.groups(requests):
            for i, answer in zip(group, self._answer([requests[i] for i in group]), strict=True):
                answers[i] = answer
        return answers

    def _call_model(self, *args: Any, **kwargs: Any) -> Any:
        with self._calls:
            return self.model(*args, **kwargs)

    def _answer(self, requests: list[Decoded]) -> list[Answer]:
        """One model call for these requests; if it fails, each request alone, so that a failure
        is only the request's own that caused it."""
        try:
            args, kwargs = self.codec.join(requests)
            # read straight out of a CUDA graph's buffers to the host, once for the batch: a copy
            # out of the buffers first (what a call returns) would be a second copy of everything
            with self._calls:
                outputs = self.codec.to_host(self.model.borrow(*args, **kwargs), requests)
            return self.codec.split(outputs, requests)
        except Exception as exc:
            if len(requests) > 1:
                return [answer for request in requests for answer in self._answer([request])]
            if isinstance(exc, self._client_errors):
                return [self._answer_type.error(400, str(exc))]
            if isinstance(exc, self._output_error):  # 422 where the client's format is what cannot carry it
                return [self._answer_type.error(exc.status, f"the model's output cannot be sent: {exc}")]
            logger.exception("predict failed")
            return [self._answer_type.error(500, f"the model failed on this request: {brief(exc)}")]


def _error(status: int, message: str, headers: Optional[dict[str, str]] = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _response(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type=answer.media_type, headers=dict(answer.headers))


class ServeFailed(Exception):
    """The application did not start; `kind` names the replica's exception where Ray reported it."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


def check_port(host: str, port: int, option: str = "--port") -> Optional[str]:
    """Why Serve's proxy (or the replica's metrics server: `option`) could not listen on host:port
    on this machine, or None. The proxy itself only says so in its logs, while the application
    waits for it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"--host {host}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy's server sets it
        try:
            probe.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}); pick another {option}"
    return None


def app_name(spec: WarmupSpec) -> str:
    return f"orchestrate-{spec.label}"


def run_server(
    spec: WarmupSpec,
    *,
    host: str,
    port: int,
    ray_address: Optional[str] = None,
    remote: Optional[Remote] = None,
    require_warm: bool = False,
    ready_when: ReadyWhen = "answering",
    max_batch_size: Optional[int] = None,
    batch_wait_seconds: float = BATCH_WAIT_SECONDS,
    body_seconds: float = BODY_SECONDS,
    trusted: tuple[str, ...] = (),
    metrics_port: Optional[int] = None,
    on_ready: Callable[[str, dict[str, Any]], None] = lambda url, info: None,
    until: Callable[[], None] = lambda: None,
) -> None:
    """Start Ray (a local instance, or join `ray_address`), deploy the model (the caller checked that
    its factory is there: orchestrator.fleet.driver.preflight), call `on_ready` with
    the predict URL and the replica's info, then `until()` (the caller blocks there); on return or
    an exception, remove what this call started. ServeFailed when the application fails."""
    import ray

    from orchestrator.fleet.driver import _join, _probe
    from orchestrator.fleet.job_env import job_env_vars

    env = job_env_vars()
    owns_cluster = not ray.is_initialized() and ray_address is None
    if ray_address and ray_address != "auto":
        _probe(ray_address)
    _join(ray, ray_address, env)
    name = app_name(spec)
    deployed = ready = False
    # From here a SIGTERM (the kubelet stopping a pod that is still loading) unwinds through the
    # cleanup below as Ctrl-C does, in place of the handler Ray's start installed; so does a SIGINT
    # where the process started with it ignored
    with _stop_signals_interrupt():
        try:
            batch = max_batch_size or max(spec.buckets)

            def start() -> dict[str, Any]:
                nonlocal deployed
                serve.start(http_options={"host": host, "port": port})
                deployment: Any = ModelServer  # a serve Deployment; its stubs keep the class's type
                app = deployment.options(
                    ray_actor_options={
                        "num_gpus": _gpus(spec, ray.cluster_resources()),
                        "runtime_env": {"env_vars": env},
                    },
                ).bind(
                    spec,
                    remote,
                    require_warm,
                    batch,
                    batch_wait_seconds,
                    (host, metrics_port) if metrics_port else None,
                    ready_when,
                    trusted,
                    body_seconds,
                    # room for a batch being run, the next one filling, and requests being decoded
                    max(4 * batch, 16),
                )
                deployed = True
                try:
                    handle = serve.run(app, name=name, route_prefix="/", blocking=False)
                except RuntimeError as exc:
                    raise _failure(_deployment_message(name) or str(exc)) from None
                return handle.info.remote().result()

            info = _while_the_node_runs(start, watch=owns_cluster)
            shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            ready = True
            on_ready(f"http://{_bracketed(shown_host)}:{port}/predict", info)
            until()
        finally:
            _shut_down(owns_cluster, name if deployed else None, drain=ready)


def _while_the_node_runs(step: Callable[[], T], *, watch: bool, poll_seconds: float = 0.5) -> T:
    """`step()` (the application's start), a Ray node or actor that died under it as
    ClusterUnreachable, in one line. With `watch` (this process started the Ray node), the node's
    raylet is watched meanwhile: its exit ends the wait at once, where Serve's own calls wait for
    the node's heartbeats to time out, or for ever."""
    from ray.exceptions import NodeDiedError, RayActorError

    from orchestrator.errors import ClusterUnreachable

    def died(exc: BaseException) -> ClusterUnreachable:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return ClusterUnreachable(f"the Ray node went away while the model server started: {first}")

    raylet = _local_raylet() if watch else None
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(step())
        except BaseException as exc:  # handed to the waiting thread, which raises it
            done.set_exception(exc)

    threading.Thread(target=run, name="serve-start", daemon=True).start()
    while True:
        try:
            return done.result(timeout=poll_seconds)
        except FutureTimeout:
            if raylet is not None and raylet.poll() is not None:
                raise ClusterUnreachable(
                    f"the local Ray node stopped while the model server started (its raylet exited with code "
                    f"{raylet.poll()}: killed, or out of memory); start the server again"
                ) from None
        except (RayActorError, NodeDiedError) as exc:
            raise died(exc) from None


def _local_raylet() -> Optional[Any]:
    """The raylet process of the Ray node this process started (a Popen), or None where that is not
    to be known (Ray's node bookkeeping is its own, and may move)."""
    try:
        from ray._private import worker

        node: Any = worker._global_node
        return node.all_processes["raylet"][0].process
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


def _gpus(spec: WarmupSpec, resources: dict[str, float]) -> int:
    from orchestrator.jobs.errors import SetupError

    if spec.device == "cpu":
        return 0
    if resources.get("GPU", 0) >= 1:
        return 1  # the replica sees one GPU, as cuda:0: where warmup's artifacts were built
    if spec.device == "cuda":
        raise SetupError("device 'cuda' was requested but the Ray cluster has no GPUs")
    return 0


def _deployment_message(name: str) -> str:
    """Why the application's deployment failed, with the replica's traceback: the application's
    own message only names the deployment."""
    try:
        application = serve.status().applications[name]
    except Exception:  # the message is a better error, not a condition of one
        return ""
    return "\n".join(d.message for d in application.deployments.values() if d.message)


def _failure(message: str) -> ServeFailed:
    """Serve's 'Deploying application ... failed' with the replica's traceback, as one line: the
    exception the constructor raised."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    raised = [match for match in map(_RAISED.match, lines) if match]
    if not raised:
        return ServeFailed(f"the model server did not start: {lines[-1]}")
    kind = raised[-1]["type"].rsplit(".", 1)[-1]
    return ServeFailed(f"the model server did not start: {kind}: {raised[-1]['message']}", kind)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _shut_down(owns_cluster: bool, name: Optional[str], drain: bool) -> None:
    """Remove our application; with our own Ray instance, Ray too, after Serve has let requests
    under way finish (`drain`; a server that never became ready has none)."""
    import ray

    if not ray.is_initialized():
        return
    try:
        if owns_cluster and drain:
            serve.shutdown()
        elif not owns_cluster and name:
            serve.delete(name)
    finally:
        if owns_cluster:
            ray.shutdown()


def block_until_signalled(poll_seconds: float = 1.0) -> None:
    """Sleep until SIGINT (Ctrl-C, or `kill -INT`) or SIGTERM (a supervisor's stop), then return
    normally."""
    with _stop_signals_interrupt():
        try:
            while True:
                time.sleep(poll_seconds)
        except KeyboardInterrupt:
            return


@contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGINT as well as SIGTERM: a server started in the background by a script (`serve &`)
    inherits SIGINT as ignored, and would otherwise only stop on SIGTERM."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, interrupt) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
