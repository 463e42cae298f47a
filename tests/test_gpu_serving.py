"""On a CUDA machine: the graphed serving variants are built, checked against eager and timed at
warmup, and the runtime replays the variant warmup chose. Skipped where torch sees no GPU (CI);
run on the GPU machine with `pytest tests/test_gpu_serving.py`."""

from __future__ import annotations

import gc
import json

import pytest
import torch
from conftest import ROOT, orchestrate

from orchestrator.jobs import trees

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SYNCING_MODEL = """
import torch

class Syncs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.linear(x)
        if y.sum().item() > 1e9:  # a host sync: nothing can capture this in a CUDA graph
            y = y * 2
        return y

def syncs():
    return Syncs()
"""


def warmup(config: str, cache, *extra: str) -> dict:
    proc = orchestrate("warmup", "--no-ray", "--model", config, "--device", "cuda", "--json", *extra, cache_dir=cache)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_graphed_variants_match_eager_and_the_runtime_replays_the_chosen_one(tmp_path):
    from orchestrator import runtime
    from orchestrator.config import load_spec_with_overrides
    from orchestrator.jobs.model import build_model, make_inputs

    report = warmup("examples/mlp.yaml", tmp_path, "--buckets", "1,8")
    chosen = {}
    for result in report["results"]:
        variants = result["variants"]
        assert list(variants) == ["eager", "compiled", "graphed", "eager-graphed", "aot"]
        # `graphed` is `aot`'s twin (the same code in the same graph, slower to start): built
        # only where aot is not
        assert variants["aot"]["ok"], variants["aot"]["reason"]
        graphed = variants.pop("graphed")
        assert not graphed["ok"] and graphed["reason"].startswith("not built: aot is the same compiled code")
        assert result["variant"] != "graphed"
        for name, measure in variants.items():
            assert measure["ok"], (name, measure["reason"])
            assert measure["ms"] > 0 and measure["p90_ms"] >= measure["ms"] and measure["spread_ms"] >= 0
        assert result["variant"] in variants
        chosen[result["bucket"]] = result["variant"]

    served = runtime.load("examples/mlp.yaml", cache_dir=tmp_path, buckets=[1, 8], device="cuda", ready="planned")
    gc.collect()  # the graphs must keep what they read alive: nothing the loader dropped may be reused
    noise = [torch.randn(1 << 20, device="cuda") for _ in range(64)]  # fresh allocations over freed memory
    info = served.info()
    assert {b: i.variant for b, i in info.buckets.items()} == chosen
    assert all(i.cache_misses == 0 for i in info.buckets.values())
    spec = load_spec_with_overrides("examples/mlp.yaml", device="cuda")
    eager = build_model(spec, torch.device("cuda"))
    for n in (1, 5, 8, 11):  # at a bucket, between buckets, larger than the largest (split)
        args, _ = make_inputs(spec, n, torch.device("cuda"))
        got = served(*args)
        with torch.no_grad():
            want = eager(*args)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    del noise
    (x,), _ = make_inputs(spec, 8, torch.device("cuda"))
    first = served(x)
    kept = first.clone()
    served(x * 2)  # a replay must not reach an earlier output
    torch.cuda.synchronize()
    torch.testing.assert_close(first, kept, atol=0, rtol=0)


def test_a_model_that_syncs_the_host_serves_without_graphs_and_says_why(tmp_path):
    (tmp_path / "models.py").write_text(SYNCING_MODEL)
    (tmp_path / "cfg.yaml").write_text(
        "model: {factory: models.py:syncs}\ninputs: [{shape: [batch, 16]}]\nbuckets: [1, 4]\n"
        "compile: {mode: default}\nbench: {iterations: 20, warmup: 3}\n"
    )
    report = warmup(str(tmp_path / "cfg.yaml"), tmp_path / "cache")
    for result in report["results"]:
        assert result["status"] == "ok", result["error"]
        for name in ("graphed", "eager-graphed"):
            measure = result["variants"][name]
            assert measure["ok"] is False and "CUDA graph" in measure["reason"], measure
        # a host sync: no whole graph for Dynamo, or no capture
        assert result["variants"]["aot"]["ok"] is False and result["variants"]["aot"]["reason"]
        assert result["variant"] in ("eager", "compiled")


def test_a_compiled_variant_with_graph_trees_serves_from_any_thread(tmp_path):
    """`compiled` under reduce-overhead replays CUDA-graph trees, whose manager Inductor keeps per
    thread: the replica records on its loader thread and every serving thread records and replays its own."""
    import threading

    from orchestrator import runtime
    from orchestrator.config import load_spec_with_overrides
    from orchestrator.jobs.model import build_model, make_inputs

    config = tmp_path / "mlp.yaml"
    models = (ROOT / "examples" / "models.py").resolve()
    config.write_text(
        f"name: mlp-trees\nmodel: {{factory: '{models}:mlp', kwargs: {{layers: 24, width: 256}}}}\n"
        "inputs: [{shape: [batch, 256]}]\nbuckets: [1, 8]\ncompile: {mode: reduce-overhead}\n"
        "serve: {variants: [eager, compiled]}\nbench: {iterations: 40, warmup: 5}\n"
    )
    report = warmup(str(config), tmp_path / "cache")
    # 24 launch-bound layers: one replay beats 72 kernel launches at both buckets
    assert [r["variant"] for r in report["results"]] == ["compiled", "compiled"], report["results"]

    served = runtime.load(str(config), cache_dir=tmp_path / "cache", device="cuda", ready="planned")
    assert {b: i.variant for b, i in served.info().buckets.items()} == {1: "compiled", 8: "compiled"}
    spec = load_spec_with_overrides(str(config), device="cuda")
    eager = build_model(spec, torch.device("cuda"))
    eager.load_state_dict(served.model.state_dict())
    answers: dict[str, list] = {}

    failures: dict[str, BaseException] = {}

    def serve(name: str) -> None:
        answers[name] = []
        try:
            for n in (1, 8, 5):
                args, _ = make_inputs(spec, n, torch.device("cuda"))
                answers[name].append((served(*args), args))
        except BaseException as exc:  # re-raised below, on the test's thread
            failures[name] = exc

    threads = [threading.Thread(target=serve, args=(f"thread {i}",)) for i in range(2)]
    for thread in threads:  # one after the other: each a thread that never saw Inductor before
        thread.start()
        thread.join()
    serve("main")
    assert not failures, failures
    assert sorted(answers) == ["main", "thread 0", "thread 1"]
    with torch.no_grad():
        for name, calls in answers.items():
            for got, args in calls:
                torch.testing.assert_close(got, eager(*args), atol=1e-3, rtol=1e-3, msg=name)
    assert all(i.variant == "compiled" for i in served.info().buckets.values())


LYING_MODEL = """
import torch

class Lies(torch.nn.Module):
    # compiled, it answers twice what eager answers: its check at load refuses it
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.linear(x)
        return y * 2 if torch.compiler.is_compiling() else y

def lies():
    return Lies()
"""


def test_a_graph_refused_at_load_leaves_the_next_buckets_capture_whole(tmp_path):
    """The buckets' graphs share one memory pool. A graph refused by its check at load frees the
    pool it made, so the pool shared is only one that a kept graph holds."""
    from orchestrator import runtime
    from orchestrator.config import load_spec
    from orchestrator.jobs.model import build_model
    from orchestrator.jobs.records import BucketResult, VariantMeasure
    from orchestrator.jobs.variants import write_plan

    (tmp_path / "lies.py").write_text(LYING_MODEL)
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "model: {factory: lies.py:lies}\ninputs: [{shape: [batch, 16]}]\nbuckets: [1, 8]\ndevice: cuda\n"
        "compile: {mode: default}\n"
    )
    spec, cache = load_spec(config), tmp_path / "cache"
    namespace = cache / runtime.load(config, cache_dir=cache).info().namespace
    # the largest bucket loads first: its `graphed` lies and is refused; then bucket 1 captures
    for bucket, variant in ((8, "graphed"), (1, "eager-graphed")):
        measured = {"eager": VariantMeasure(ok=True, ms=1.0), variant: VariantMeasure(ok=True, ms=0.5)}
        write_plan(namespace, spec, BucketResult(bucket=bucket, variant=variant, variants=measured))
    served = runtime.load(config, cache_dir=cache, ready="planned")
    rows = served.info().buckets
    assert rows[8].variant == "eager" and "graphed at load" in str(rows[8].reason)
    assert (rows[1].variant, rows[1].on_plan, rows[1].reason) == ("eager-graphed", True, None)
    model = build_model(spec, torch.device("cuda"))
    for batch in (1, 8):
        x = torch.randn(batch, 16, device="cuda")
        with torch.no_grad():
            torch.testing.assert_close(served(x), model(x))


GRID = """\
name: tiny-grid
model:
  factory: {root}/examples/huggingface.py:bert
  kwargs: {{vocab_size: 100, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,
           intermediate_size: 64, max_position_embeddings: 64}}
inputs:
  - {{name: input_ids, shape: [batch, seq], dtype: int64, range: [1, 100], pad: 0}}
  - {{name: attention_mask, shape: [batch, seq], dtype: int64, range: [1, 2], pad: 0}}
buckets:
  batch: [1, 4]
  seq: [8, 16]
compile: {{mode: default}}
device: cuda
serve: {{variants: [eager, eager-graphed]}}
bench: {{iterations: 20, warmup: 3}}
"""


@pytest.fixture(scope="module")
def warm_grid(tmp_path_factory):
    """The tiny encoder's grid, warmed once for the tests that serve it: (config, cache)."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("grid")
    config = root / "grid.yaml"
    config.write_text(GRID.format(root=ROOT))
    report = warmup(str(config), root / "cache")
    for result in report["results"]:
        assert result["status"] == "ok", result["error"]
        assert result["padding_proof"]["variant"] == result["variant"]
    return config, root / "cache"


def test_a_grid_served_from_graphs_takes_short_requests_into_their_inputs_and_answers_as_eager(warm_grid, monkeypatch):
    """A request shorter than its point is written into the corners of the point's graph inputs,
    the rest holding the pad values: every answer, growing and shrinking in both dimensions, is
    eager's at the request's exact size, copied or borrowed."""
    from orchestrator import runtime
    from orchestrator.config import load_spec
    from orchestrator.jobs.gate import Gate, snapshot
    from orchestrator.jobs.graphs import PaddedInputs
    from orchestrator.jobs.model import build_model

    config, cache = warm_grid
    written = []
    write = PaddedInputs.write
    monkeypatch.setattr(PaddedInputs, "write", lambda self, values: written.append(write(self, values)) or written[-1])
    served = runtime.load(config, cache_dir=cache, ready="planned")
    graphed = [label for label, row in served.info().buckets.items() if row.variant == "eager-graphed"]
    assert graphed, served.info().buckets
    eager = build_model(load_spec(config).slices()[0], torch.device("cuda"))
    generator = torch.Generator().manual_seed(0)
    sizes = [(4, 16), (1, 1), (3, 9), (3, 9), (2, 15), (4, 3), (1, 16), (4, 16), (2, 5), (9, 11)]
    for step, (rows, seq) in enumerate(sizes):
        ids = torch.randint(1, 100, (rows, seq), generator=generator).cuda()
        mask = torch.ones(rows, seq, dtype=torch.int64, device="cuda")
        mask[0, seq // 2 + 1 :] = 0  # padded by its client too
        call = served.borrow if step % 2 else served
        with torch.no_grad():
            answer = snapshot(call(input_ids=ids, attention_mask=mask))
            expected = snapshot(eager(input_ids=ids, attention_mask=mask))
        Gate().compare(expected, answer, call=f"{rows}x{seq}")
    assert written and all(written), written  # the short requests went into the graphs' inputs


def test_a_served_batch_is_read_out_of_the_graphs_buffers_to_the_host_once_and_only_what_is_asked(warm_grid):
    """`orchestrate serve`'s path for a batch of Open Inference Protocol requests: joined, run with
    `borrow()`, the outputs some request asks for read to the host once (the rest left on the GPU,
    unread), cut back per request: each answer is eager's at the request's own size."""
    from orchestrator import runtime
    from orchestrator.config import load_spec
    from orchestrator.jobs.gate import Gate, snapshot
    from orchestrator.jobs.model import build_model
    from orchestrator.serving.codec import RequestCodec
    from orchestrator.serving.inference_protocol import InferenceProtocol

    config, cache = warm_grid
    served = runtime.load(config, cache_dir=cache, ready="planned")
    assert any(row.variant == "eager-graphed" for row in served.info().buckets.values()), served.info().buckets
    codec = RequestCodec(served.spec, served.device, served.dims)
    protocol = InferenceProtocol(served.spec, codec, served, served.output_dims)
    eager = build_model(load_spec(config).slices()[0], torch.device("cuda"))
    generator = torch.Generator().manual_seed(0)

    def request(rows, seq, outputs=None):
        ids = torch.randint(1, 100, (rows, seq), generator=generator)
        inputs = [
            {"name": "input_ids", "shape": [rows, seq], "datatype": "INT64", "data": ids.flatten().tolist()},
            {"name": "attention_mask", "shape": [rows, seq], "datatype": "INT64", "data": [1] * (rows * seq)},
        ]
        document = {"inputs": inputs, **({"outputs": [{"name": name} for name in outputs]} if outputs else {})}
        return ids, protocol.decode(json.dumps(document).encode())

    pooled = ["output.pooler_output"]
    for batch, left_on_gpu in (
        ([request(2, 7, pooled), request(1, 7, pooled)], {"output.last_hidden_state"}),
        ([request(1, 12, pooled), request(3, 12)], set()),  # one asks for every output
        ([request(4, 16)], set()),
    ):
        requests = [decoded for _, decoded in batch]
        assert len(codec.groups(requests)) == 1
        args, kwargs = codec.join(requests)
        on_host = codec.to_host(served.borrow(*args, **kwargs), requests)
        devices = {path: leaf.device.type for path, leaf in trees.leaves(on_host)}
        assert {path for path, device in devices.items() if device == "cuda"} == left_on_gpu, devices
        answers = codec.split(on_host, requests)
        for (ids, decoded), answer in zip(batch, answers, strict=True):
            assert answer.status == 200, answer.body
            with torch.no_grad():
                expected = dict(trees.leaves(eager(input_ids=ids.cuda(), attention_mask=torch.ones_like(ids).cuda())))
            got = {entry["name"]: entry for entry in json.loads(answer.body)["outputs"]}
            assert set(got) == ({"output.pooler_output"} if decoded.outputs else set(expected))
            for name, entry in got.items():
                want = expected[name].float().cpu()
                tensor = torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])
                Gate().compare(snapshot(want), snapshot(tensor), call=f"{name} of {ids.shape[0]}x{ids.shape[1]}")
