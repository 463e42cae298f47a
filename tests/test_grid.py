"""A grid of buckets over named dimensions (batch x seq): its config, the padding proof, and a
replica that pads and cuts both, against eager at every request's exact size."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from orchestrator.config import (
    ConfigError,
    apply_overrides,
    format_bucket_dims,
    load_spec,
    load_spec_with_overrides,
    parse_bucket_dims,
)
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.spec import WarmupSpec

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
TINY_BERT = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
TINY_GPT2 = {"vocab_size": 100, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 2}
MASKED = """\
  - {name: input_ids, shape: [batch, seq], dtype: int64, range: [1, 100], pad: 0}
  - {name: attention_mask, shape: [batch, seq], dtype: int64, range: [1, 2], pad: 0}
"""


def grid_config(tmp_path: Path, *, inputs: str = MASKED, factory: str = "bert", kwargs=None, extra: str = "") -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: tiny-grid
        model:
          factory: {ROOT / "examples" / "huggingface.py"}:{factory}
          kwargs: {json.dumps(kwargs or TINY_BERT)}
        inputs:
        """)
        + inputs
        + textwrap.dedent("""\
        buckets:
          batch: [1, 4]
          seq: [8, 16]
        compile: {mode: default}
        device: cpu
        bench: {iterations: 10, warmup: 1}
        """)
        + textwrap.dedent(extra)
    )
    return path


def spec_of(**fields) -> WarmupSpec:
    data = {"name": "m", "model": {"factory": "m:f"}, "inputs": [{"shape": ["batch", "seq"]}], **fields}
    return WarmupSpec.model_validate(data)


# -- the config ----------------------------------------------------------------------------------


def test_a_mapping_of_buckets_is_a_grid_whose_points_are_slices_with_namespaces_of_their_own():
    spec = spec_of(buckets={"batch": [1, 8, 32], "seq": [32, 64, 128, 256]}, points={"max_product": 4096})
    assert spec.buckets == [1, 8, 32] and spec.grid == {"seq": [32, 64, 128, 256]}
    assert (32, 256) not in spec.grid_points() and (8, 256) in spec.grid_points() and len(spec.grid_points()) == 11
    slices = spec.slices()
    assert [(s.fixed, s.buckets) for s in slices] == [
        ({"seq": 32}, [1, 8, 32]),
        ({"seq": 64}, [1, 8, 32]),
        ({"seq": 128}, [1, 8, 32]),
        ({"seq": 256}, [1, 8]),
    ]
    assert len({s.identity_hash() for s in slices}) == 4
    assert slices[1].point_label(8) == "8x64" and slices[1].shape_of(slices[1].inputs[0]) == ["batch", 64]


def test_the_list_form_keeps_its_namespace():
    """The hash a list-form config had before grids existed: every namespace published stays found."""
    spec = WarmupSpec.model_validate(
        {
            "name": "m",
            "model": {"factory": "m:f"},
            "inputs": [{"name": "input_ids", "shape": ["batch", 16], "dtype": "int64", "range": [1, 100]}],
            "buckets": [1, 8],
        }
    )
    assert spec.identity_hash() == "13240cfb6569aac825031fe3cfe163b54a6ed6b8f0e7862f105611e92a5cd2cd"
    assert spec.slices() == [spec] and spec.point_label(8) == "8"


def test_points_only_lists_the_points_to_warm():
    spec = spec_of(buckets={"batch": [1, 8], "seq": [32, 64]}, points={"only": [[1, 64], [8, 32]]})
    assert spec.grid_points() == [(1, 64), (8, 32)]
    assert [(s.fixed["seq"], s.buckets) for s in spec.slices()] == [(64, [1]), (32, [8])]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"buckets": {"seq": [8]}}, "a grid needs the bucket dimension 'batch'"),
        ({"buckets": {"batch": [1]}}, "a grid of 'batch' alone is the list form"),
        ({"buckets": {"batch": [1], "seq": [8], "width": [4]}}, "no input shape contains 'width'"),
        ({"buckets": {"batch": [1], "seq": []}}, "seq: list one size or more"),
        ({"buckets": {"batch": [1], "seq": [8, 8]}}, "seq: bucket 8 is listed twice"),
        ({"buckets": [1, 8]}, "unknown symbol 'seq'"),
        ({"buckets": {"batch": [1], "seq": [8]}, "points": {"only": [[1, 9]]}}, "seq 9 is not one of the grid's [8]"),
        ({"buckets": {"batch": [1], "seq": [8]}, "points": {"only": [[1]]}}, "is not one size per dimension"),
        ({"buckets": {"batch": [4], "seq": [8]}, "points": {"max_product": 16}}, "no point of the grid is left"),
        ({"buckets": [1], "points": {"max_product": 16}, "inputs": [{"shape": ["batch"]}]}, "`points` chooses points"),
    ],
)
def test_a_bad_grid_is_refused_with_what_to_write(fields, message):
    with pytest.raises(ValueError) as info:
        spec_of(**fields)
    assert message in str(info.value)


def test_buckets_on_the_command_line_set_each_dimension(tmp_path):
    path = grid_config(tmp_path)
    assert parse_bucket_dims("batch=1,2 seq=4,12") == {"batch": [1, 2], "seq": [4, 12]}
    assert parse_bucket_dims("1,8") == {None: [1, 8]}
    spec = load_spec_with_overrides(path, buckets="seq=4,12")
    assert spec.buckets == [1, 4] and spec.grid == {"seq": [4, 12]}
    spec = load_spec_with_overrides(path, buckets="2,3")
    assert spec.buckets == [2, 3] and spec.grid == {"seq": [8, 16]}
    assert parse_bucket_dims(format_bucket_dims(spec)) == {"batch": [2, 3], "seq": [8, 16]}
    with pytest.raises(ConfigError, match="--buckets: seq is given twice"):
        parse_bucket_dims("seq=1 seq=2")
    with pytest.raises(ConfigError, match="'s-q' is not a dimension name"):
        parse_bucket_dims("s-q=1")
    list_form = spec_of(buckets=[1], inputs=[{"shape": ["batch", "seq"]}], grid={"seq": [8]})
    assert apply_overrides(list_form, buckets={None: [4]}).grid == {"seq": [8]}


# -- the padding proof ---------------------------------------------------------------------------


def point_inputs(spec: WarmupSpec, bucket: int):
    from orchestrator.jobs.model import make_inputs

    return make_inputs(spec, bucket, torch.device("cpu"))


def prove(spec: WarmupSpec, bucket: int, model=None):
    from orchestrator.jobs import grid
    from orchestrator.jobs.model import build_model

    model = model if model is not None else build_model(spec, torch.device("cpu"))
    return grid.prove_padding(spec, bucket, point_inputs(spec, bucket), model, model, "eager", Gate())


@pytest.mark.parametrize("bucket", [1, 4])
@pytest.mark.parametrize("seq", [0, 1])
def test_padding_an_encoder_with_its_mask_is_proven_harmless_at_every_point(tmp_path, bucket, seq):
    part = load_spec(grid_config(tmp_path)).slices()[seq]
    proof = prove(part, bucket)
    size = part.fixed["seq"]
    assert proof.request == {"batch": max(bucket - 1, 1), "seq": size - 1} and proof.point == {
        "batch": bucket,
        "seq": size,
    }
    assert proof.output_dims["output.last_hidden_state"]["1"] == "seq"
    assert "seq" not in proof.output_dims.get("output.pooler_output", {}).values()  # follows the batch only
    assert proof.max_abs_error is not None and proof.max_abs_error < 1e-4


def test_a_decoder_padded_on_the_right_keeps_its_logits_and_cache(tmp_path):
    part = load_spec(grid_config(tmp_path, factory="gpt2", kwargs=TINY_GPT2)).slices()[1]
    proof = prove(part, 4)
    assert proof.output_dims["output.logits"] == {"0": "batch", "1": "seq"}
    assert proof.output_dims["output.cache.layers[0].keys"] == {"0": "batch", "2": "seq"}


def test_an_encoder_called_without_its_mask_fails_the_point_naming_the_output(tmp_path):
    from orchestrator.jobs.grid import PaddingUnsafe

    inputs = "  - {name: input_ids, shape: [batch, seq], dtype: int64, range: [1, 100], pad: 0}\n"
    part = load_spec(grid_config(tmp_path, inputs=inputs)).slices()[0]
    with pytest.raises(PaddingUnsafe) as info:
        prove(part, 4)
    message = str(info.value)
    assert "padding changes the answer: a request of 3x7 padded to 4x8" in message
    assert "output.last_hidden_state" in message and "attention_mask" in message and "\n" not in message


class MeanOverSeq(torch.nn.Module):
    """Averages over the sequence, padding included: wrong under padding whatever the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)

    def forward(self, input_ids, attention_mask):
        return self.embed(input_ids).mean(dim=1)


class DoubledSeq(torch.nn.Module):
    """An output 2 x seq long: it does not follow seq one for one, so it cannot be cut back."""

    def forward(self, input_ids, attention_mask):
        return torch.cat([input_ids, attention_mask], dim=1).float()


@pytest.mark.parametrize(
    "model, message",
    [
        (MeanOverSeq(), "padding changes the answer: a request of 3x7 padded to 4x8: "),
        (DoubledSeq(), "its dim 1 does not follow seq one for one, so it cannot be cut back"),
    ],
)
def test_a_model_wrong_under_padding_is_refused_with_its_reason(tmp_path, model, message):
    from orchestrator.jobs.grid import PaddingUnsafe

    part = load_spec(grid_config(tmp_path)).slices()[0]
    with pytest.raises(PaddingUnsafe) as info:
        prove(part, 4, model)
    assert message in str(info.value)


# -- warmup and the replica ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def warmed_grid(tmp_path_factory):
    """`orchestrate warmup` of a 2 x 2 grid of a tiny BERT, as a user runs it (--no-ray)."""
    tmp_path = tmp_path_factory.mktemp("grid")
    config = grid_config(tmp_path, extra="serve: {variants: [eager, compiled]}\n")
    cache, report = tmp_path / "cache", tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "warmup", "--model", str(config), "--no-ray", "--cache-dir", str(cache),
         "--report", str(report)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return config, cache, json.loads(report.read_text()), done.stdout


@pytest.mark.slow
def test_a_grid_warmup_proves_every_point_and_reports_them(warmed_grid):
    config, _, report, table = warmed_grid
    assert report["grid"] == {"batch": [1, 4], "seq": [8, 16]} and report["points"] == ["1x8", "1x16", "4x8", "4x16"]
    points = {"x".join(map(str, r["point"].values())): r for r in report["results"]}
    assert sorted(points) == sorted(report["points"]) and len(report["namespaces"]) == 2
    for record in points.values():
        assert record["status"] == "ok", record["error"]
        proof = record["padding_proof"]
        assert proof["point"] == record["point"] and proof["variant"] == record["variant"]
        assert proof["request"]["seq"] == record["point"]["seq"] - 1
        assert proof["padded_ms"] > 0  # that request timed as a replica serves it: what `plan` prices
        assert proof["reference"] == "float64" and record["gate_reference"] == "float64"
    assert report["summary"]["buckets_ok"] == 4 and report["summary"]["buckets_failed"] == 0
    assert "tiny-grid at seq 8" in table and "tiny-grid at seq 16" in table


@pytest.mark.slow
def test_a_grid_replica_answers_every_size_as_eager_does_at_that_size(warmed_grid):
    from orchestrator import runtime
    from orchestrator.jobs.model import build_model

    config, cache, report, _ = warmed_grid
    began = time.perf_counter()
    served = runtime.load(config, cache_dir=cache, ready="planned")
    took = time.perf_counter() - began
    info = served.info()
    assert sorted(info.buckets) == sorted(report["points"])
    assert all(row.on_plan and row.point == label for label, row in info.buckets.items())
    # the grid's times count from its own load start, over every slice (each slice's own count
    # from its start, after the model's build and the slices before it)
    events = dict(info.events)  # milestone -> seconds; in order of time
    assert [at for _, at in info.events] == sorted(at for _, at in info.events)
    last_answer = max(at for what, at in info.events if what.endswith(": answering"))
    assert last_answer <= info.answering_seconds <= info.on_plan_seconds <= info.ready_seconds <= took
    assert all(row.on_plan_seconds <= info.on_plan_seconds for row in info.buckets.values())
    assert max(at for what, at in events.items() if what.endswith(": settled")) == pytest.approx(
        info.on_plan_seconds, abs=1e-3
    )
    assert info.answering_seconds_from_spawn == pytest.approx(info.load_started_from_spawn + info.answering_seconds)
    # every slice loads from its own namespace: a point planned compiled is a hit, never a compile
    compiled = {
        label: (row.cache_hits, row.cache_misses) for label, row in info.buckets.items() if row.planned != "eager"
    }
    assert compiled and all(hits and misses == 0 for hits, misses in compiled.values()), compiled
    spec = load_spec(config)
    eager = build_model(spec.slices()[0], torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    for rows, seq in [(1, 1), (1, 8), (2, 5), (3, 9), (4, 16), (9, 11)]:  # 9 rows: split along the batch
        ids = torch.randint(1, 100, (rows, seq), generator=generator)
        mask = torch.ones(rows, seq, dtype=torch.int64)
        mask[0, seq // 2 + 1 :] = 0  # a request padded by its client too
        with torch.no_grad():
            answer = served(input_ids=ids, attention_mask=mask)
            expected = eager(input_ids=ids, attention_mask=mask)
        assert answer.last_hidden_state.shape == (rows, seq, 32)
        Gate().compare(snapshot(expected), snapshot(answer), call=f"{rows}x{seq}")
    usage = served.usage()
    assert sum(u.calls for u in usage.values()) == 8  # 9 rows ran as 4 + 4 + 1
    # every request's size, for `orchestrate plan`
    assert served.info().request_sizes == {"1x1": 1, "1x8": 1, "2x5": 1, "3x9": 1, "4x16": 1, "9x11": 1}
    with pytest.raises(runtime.BadRequest, match="17 at seq, more than the grid's largest seq 16"):
        served(input_ids=torch.ones(1, 17, dtype=torch.int64), attention_mask=torch.ones(1, 17, dtype=torch.int64))
    with pytest.raises(runtime.BadRequest, match="every input needs the same seq"):
        served(input_ids=torch.ones(1, 5, dtype=torch.int64), attention_mask=torch.ones(1, 6, dtype=torch.int64))
    split = runtime.load(config, cache_dir=cache)
    assert split.wait_loaded(300)


@pytest.mark.slow
def test_a_grid_request_padded_in_both_dimensions_counts_its_padding_and_checks_its_dtype(warmed_grid):
    from orchestrator import runtime

    config, cache, _, _ = warmed_grid
    served = runtime.load(config, cache_dir=cache, ready="planned")
    ids = torch.randint(1, 100, (3, 9))
    answer = served(input_ids=ids, attention_mask=torch.ones_like(ids))  # padded to 4 x 16 in one step
    assert answer.last_hidden_state.shape == (3, 9, 32)
    usage = served.usage()["4x16"]
    assert (usage.calls, usage.rows, usage.padded_rows) == (1, 3, 1)
    with pytest.raises(runtime.BadRequest, match="input_ids .* is float32, expected int64"):
        served(input_ids=ids.float(), attention_mask=torch.ones_like(ids))
    assert served.usage()["4x16"].calls == 1


@pytest.mark.slow
def test_a_grid_refuses_more_rows_than_its_largest_batch_where_oversize_is_error(warmed_grid, tmp_path):
    from orchestrator import runtime

    config, cache, _, _ = warmed_grid
    spec = load_spec(config)
    spec = spec.replaced(serve={**spec.serve.model_dump(), "oversize": "error"})
    served = runtime.load(spec, cache_dir=cache)
    with pytest.raises(runtime.BadRequest, match="larger than the largest bucket 4"):
        served(input_ids=torch.ones(5, 3, dtype=torch.int64), attention_mask=torch.ones(5, 3, dtype=torch.int64))


@pytest.mark.slow
def test_orchestrate_serve_answers_a_grid_through_the_inference_protocol(warmed_grid, tmp_path):
    """A grid served as users call it: Triton's own client reads -1 for every bucketed dimension,
    and requests of any batch x seq answer as eager at that size; past the largest seq, 413."""
    import numpy as np
    import requests
    import tritonclient.http as triton
    from served import Server

    from orchestrator.jobs.model import build_model

    config, cache, _, _ = warmed_grid
    server = Server(cache, tmp_path / "serve.err", config=str(config), buckets=None, name="tiny-grid")
    try:
        server.wait_ready()
        base = server.url.rsplit("/predict", 1)[0]
        client = triton.InferenceServerClient(base.removeprefix("http://"))
        metadata = client.get_model_metadata("tiny-grid")
        assert [tuple(i["shape"]) for i in metadata["inputs"]] == [(-1, -1), (-1, -1)]
        outputs = {o["name"]: tuple(o["shape"]) for o in metadata["outputs"]}
        assert outputs == {"output.last_hidden_state": (-1, -1, 32), "output.pooler_output": (-1, 32)}
        eager = build_model(load_spec(config).slices()[0], torch.device("cpu"))
        generator = np.random.default_rng(0)
        for rows, seq in [(1, 3), (3, 11), (6, 16)]:
            ids = generator.integers(1, 100, (rows, seq)).astype(np.int64)
            mask = np.ones((rows, seq), dtype=np.int64)
            inputs = [
                triton.InferInput("input_ids", ids.shape, "INT64"),
                triton.InferInput("attention_mask", mask.shape, "INT64"),
            ]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(mask)
            answer = client.infer("tiny-grid", inputs).as_numpy("output.last_hidden_state")
            with torch.no_grad():
                expected = eager(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            assert answer.shape == (rows, seq, 32)
            np.testing.assert_allclose(answer, expected.last_hidden_state.numpy(), atol=1e-3, rtol=1e-3)
        too_long = {"inputs": {"input_ids": [[1] * 17], "attention_mask": [[1] * 17]}}
        refused = requests.post(server.url, json=too_long, timeout=30)
        assert refused.status_code == 413 and "more than the largest seq bucket 16" in refused.json()["error"]
        info = requests.get(f"{base}/info", timeout=30).json()
        assert sorted(info["buckets"]) == ["1x16", "1x8", "4x16", "4x8"]
    finally:
        server.stop()


@pytest.mark.slow
def test_pull_fills_every_slice_of_a_grid_and_refuses_one_directory_for_all(warmed_grid, tmp_path):
    config, cache, report, _ = warmed_grid
    base = [sys.executable, "-m", "orchestrator", "pull", "--model", str(config), "--cache-dir", str(cache)]
    done = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pulled = json.loads(done.stdout)
    assert sorted(p["namespace"] for p in pulled) == sorted(report["namespaces"]) and all(p["hit"] for p in pulled)
    refused = subprocess.run([*base, "--to", str(tmp_path / "one")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith(
        "--to: a grid of buckets pulls one namespace per slice; pass --cache-dir instead"
    )


@pytest.mark.slow
def test_the_html_report_draws_the_served_speedup_over_the_grid(warmed_grid):
    from orchestrator.reports.html import render_html

    _, _, report, _ = warmed_grid
    page = render_html(report)
    assert page.count('data-chart="grid"') == 1
    for record in report["results"]:
        label = "x".join(map(str, record["point"].values()))
        assert f"bucket {label}" in page  # every point named in the tables and charts
    speedups = {f"{r['eager_ms'] / r['served_ms']:.2f}x" for r in report["results"]}
    grid_chart = page[page.index('data-chart="grid"') : page.index("</svg>", page.index('data-chart="grid"'))]
    assert all(text in grid_chart for text in speedups)  # each point's served speedup, in its cell


@pytest.mark.slow
def test_requests_in_the_same_sequence_bucket_join_one_call_and_each_answers_as_eager(warmed_grid):
    """What `orchestrate serve` does with requests that arrive together: those that fall in the
    same seq of the grid run as one call, each padded to the longest with its inputs' pad values,
    and each answer is cut back to the request's own rows and length."""
    import numpy as np

    from orchestrator import runtime
    from orchestrator.jobs.model import build_model
    from orchestrator.serving.codec import RequestCodec, RequestError

    config, cache, _, _ = warmed_grid
    served = runtime.load(config, cache_dir=cache, ready="planned")
    spec = load_spec(config)
    codec = RequestCodec(spec, "cpu", served.dims)
    eager = build_model(spec.slices()[0], torch.device("cpu"))
    generator = torch.Generator().manual_seed(3)
    shapes = [(1, 5), (1, 12), (2, 7), (3, 16), (1, 8)]  # seq 5-8 in 8, 12 and 16 in 16; 4 rows each
    bodies, expected = [], []
    for rows, seq in shapes:
        ids = torch.randint(1, 100, (rows, seq), generator=generator)
        mask = torch.ones(rows, seq, dtype=torch.int64)  # the config's range for it: [1, 2)
        bodies.append(json.dumps({"inputs": {"input_ids": ids.tolist(), "attention_mask": mask.tolist()}}))
        with torch.no_grad():
            expected.append(eager(input_ids=ids, attention_mask=mask))
    requests = [codec.decode(body) for body in bodies]
    groups = codec.groups(requests)
    assert groups == [[0, 2, 4], [1, 3]]
    answers = [None] * len(requests)
    calls_before = sum(u.calls for u in served.usage().values())
    for group in groups:
        members = [requests[i] for i in group]
        args, kwargs = codec.join(members)
        assert kwargs["input_ids"].shape == (sum(r.size for r in members), max(r.sizes["seq"] for r in members))
        for i, answer in zip(group, codec.split(served(*args, **kwargs), members), strict=True):
            answers[i] = answer
    assert sum(u.calls for u in served.usage().values()) - calls_before == 2  # five requests, two calls
    for (rows, seq), answer, want in zip(shapes, answers, expected, strict=True):
        got = json.loads(answer.body)["outputs"]
        hidden = np.asarray(got["last_hidden_state"])
        assert hidden.shape == (rows, seq, 32)
        np.testing.assert_allclose(hidden, want.last_hidden_state.numpy(), atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(got["pooler_output"]), want.pooler_output.numpy(), atol=2e-5, rtol=1e-4)
    # a request whose inputs disagree on its length is refused before it joins any call
    mismatched = {"inputs": {"input_ids": [[5] * 6], "attention_mask": [[1] * 7]}}
    with pytest.raises(
        RequestError, match=r"attention_mask\) has 7 at dim 1 \(seq\) where inputs\[0\] \(input_ids\) has 6"
    ):
        codec.decode(json.dumps(mismatched))


@pytest.mark.slow
def test_a_dynamic_grid_warmed_in_one_process_loads_warm_at_every_point(tmp_path):
    """With compile.dynamic, one graph of symbolic sizes serves many points. Warmed in one process,
    a later slice reused the first slice's graph and published none of its own; and a replica,
    which traces its largest bucket first (4 x 4, where batch equals seq), made another graph than
    warmup's first trace (2 x 4) under Dynamo's merging of equal sizes, and missed the cache."""
    from orchestrator import runtime

    # 60 pointwise ops: one fused loop compiled, 60 calls eager, so compiled serves every point
    (tmp_path / "rows.py").write_text(
        "import torch\n\nclass Chain(torch.nn.Module):\n    def forward(self, x):\n"
        "        for _ in range(30):\n            x = torch.sin(x) * 1.01\n        return x\n\n"
        "def rows():\n    return Chain()\n"
    )
    config = tmp_path / "grid.yaml"
    config.write_text(
        "model: {factory: rows.py:rows}\ninputs: [{shape: [batch, seq, 8]}]\n"
        "buckets: {batch: [1, 4], seq: [4, 8]}\ncompile: {mode: default, dynamic: true}\ndevice: cpu\n"
        "serve: {variants: [eager, compiled]}\nbench: {iterations: 4, warmup: 1}\n"
    )
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "warmup", "--model", str(config), "--no-ray", "--cache-dir", str(cache),
         "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    by_point = {(r["point"]["batch"], r["point"]["seq"]): r for r in json.loads(done.stdout)["results"]}
    for seq in (4, 8):  # each slice compiled for its own namespace
        assert by_point[(1, seq)]["cache"]["fx_graph_misses"] >= 1, by_point[(1, seq)]["cache"]
    served = runtime.load(config, cache_dir=cache, ready="planned", require_warm=True)
    rows = served.info().buckets
    planned = {label: row for label, row in rows.items() if row.planned == "compiled"}
    assert planned and all(row.variant == "compiled" and not row.cache_misses for row in planned.values()), rows
