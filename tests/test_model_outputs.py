"""Outputs of real model families: Hugging Face caches through the gate, the request shaper and
the codec; `call.kwargs` and `serve.outputs`; and a Hugging Face decoder with its default config
(its key/value cache on) warmed, checked and served compiled on the CPU."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.jobs import trees
from orchestrator.jobs.copies import copy_out
from orchestrator.jobs.errors import OutputMismatch, SetupError
from orchestrator.jobs.gate import Gate, snapshot
from orchestrator.jobs.model import ConfiguredCall, build_model
from orchestrator.jobs.padding import RequestShaper
from orchestrator.jobs.spec import WarmupSpec
from orchestrator.serving.codec import to_json

transformers = pytest.importorskip("transformers")
cache_utils = pytest.importorskip("transformers.cache_utils")

ROOT = Path(__file__).resolve().parents[1]
TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 101, "n_positions": 32}


def tiny_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY_GPT2)).eval()


def decoder_output(batch: int = 2) -> object:
    with torch.no_grad():
        return tiny_gpt2()(torch.arange(batch * 6).reshape(batch, 6) % 101)


def decoder_spec() -> WarmupSpec:
    """A config taking what decoder_output's model takes: rows of 6 token ids."""
    return WarmupSpec.model_validate(
        {
            "model": {"factory": "x:y"},
            "inputs": [{"name": "input_ids", "shape": ["batch", 6], "dtype": "int64", "range": [0, 101]}],
        }
    )


def cache_name(output: Any) -> str:
    """The output's key that holds the cache: `past_key_values`, or `cache` in newer releases."""
    (name,) = [key for key, value in output.items() if isinstance(value, cache_utils.Cache)]
    return name


def cache_keys(output: Any) -> list[str]:
    return [path for path, _ in trees.leaves(output) if path.startswith(f"output.{cache_name(output)}")]


def test_a_decoders_cache_is_walked_layer_by_layer_in_order():
    output = decoder_output()
    cache = output[cache_name(output)]
    assert type(cache).__name__ == "DynamicCache"  # the library's default for causal LMs
    paths = cache_keys(output)
    assert len(paths) == 2 * TINY_GPT2["n_layer"]
    if hasattr(cache, "layers"):
        prefix = f"output.{cache_name(output)}.layers[0]"
        assert paths[:2] == [f"{prefix}.keys", f"{prefix}.values"]
    leaves = dict(trees.leaves(output))
    assert all(leaves[path].shape[:2] == (2, 2) for path in paths)  # [batch, heads, sequence, head dim]


def test_the_gate_compares_cache_tensors_and_names_the_one_that_differs():
    gate = Gate()
    reference = snapshot(decoder_output())
    verdict = gate.compare(reference, snapshot(decoder_output()), call="compiled first call")
    assert verdict.leaves == len(reference) and verdict.max_abs_error == 0.0

    wrong = decoder_output()
    last = cache_keys(wrong)[-1]
    trees.map_leaves(wrong, lambda path, leaf: leaf.add_(1.0) if path == last else leaf)
    with pytest.raises(OutputMismatch, match=re.escape(f"{last} of the compiled first call differs from eager")):
        gate.compare(reference, snapshot(wrong), call="compiled first call")


def test_an_encoder_decoder_cache_holds_both_caches():
    self_attention, cross_attention = cache_utils.DynamicCache(), cache_utils.DynamicCache()
    keys = torch.randn(1, 2, 3, 4)
    self_attention.update(keys, keys + 1, 0)
    cross_attention.update(keys + 2, keys + 3, 0)
    both = cache_utils.EncoderDecoderCache(self_attention, cross_attention)
    leaves = [leaf for _, leaf in trees.leaves(both) if isinstance(leaf, torch.Tensor)]
    assert [float(leaf[0, 0, 0, 0] - keys[0, 0, 0, 0]) for leaf in leaves] == [0.0, 1.0, 2.0, 3.0]
    Gate().compare(snapshot(both), snapshot(copy_out(both)), call="replay")


def test_a_padded_decoder_output_is_cut_back_cache_included_and_stays_a_cache():
    spec = decoder_spec()
    shaper = RequestShaper(spec, [2, 4], "cpu")
    from orchestrator.jobs.padding import output_bucket_dims

    dims = output_bucket_dims({2: decoder_output(2), 4: decoder_output(4)}, shaper.input_dim)
    cut = shaper.unpad(decoder_output(4), 3, dims)
    cache = cut[cache_name(cut)]
    assert type(cache) is cache_utils.DynamicCache
    assert cut.logits.shape[0] == 3
    assert all(leaf.shape[0] == 3 for _, leaf in trees.leaves(cache) if isinstance(leaf, torch.Tensor))
    assert cache.get_seq_length() == 6  # the library's own methods read the rebuilt cache


def test_the_codec_carries_a_cache_as_an_object():
    output = decoder_output(1)
    answer = to_json(output)
    assert set(answer) == {"logits", cache_name(output)}
    layers = answer[cache_name(output)].get("layers") or answer[cache_name(output)]["key_cache"]
    assert len(layers) == TINY_GPT2["n_layer"]


def test_a_served_batch_reads_to_the_host_the_outputs_asked_for_and_leaves_the_cache():
    """The server's read of a batch to the host walks a decoder's output by the paths the Open
    Inference Protocol names outputs by, and rebuilds it, cache included. The cache's tensors are on
    the meta device here, standing for a GPU's buffers: they hold no data, so reading one fails."""
    from orchestrator.serving.codec import Request, RequestCodec

    output = decoder_output(2)
    paths = cache_keys(output)
    output = trees.map_leaves(output, lambda path, leaf: leaf.to("meta") if path in paths else leaf)
    spec = decoder_spec()
    codec = RequestCodec(spec, "meta")

    def asking(*names: str) -> Request:
        return Request((), {}, 1, outputs=frozenset(names))

    on_host = codec.to_host(output, [asking("output.logits"), asking("output.logits")])
    assert type(on_host) is type(output) and on_host.logits is output.logits
    cache = on_host[cache_name(on_host)]
    assert type(cache) is cache_utils.DynamicCache
    kept = dict(trees.leaves(on_host))
    assert all(kept[path] is leaf for path, leaf in trees.leaves(output) if path in paths)  # never read
    with pytest.raises(NotImplementedError, match="meta"):  # a client that names a cache tensor gets it read
        codec.to_host(output, [asking("output.logits"), asking(paths[-1])])


def test_an_object_the_gate_cannot_compare_is_named_with_what_to_set():
    class Opaque:
        pass

    with pytest.raises(
        OutputMismatch,
        match=r"output\.state of the compiled first call is a .*Opaque, which the gate cannot compare.*serve\.outputs",
    ):
        Gate().compare(snapshot({"state": Opaque()}), snapshot({"state": Opaque()}), call="compiled first call")


# -- call.kwargs and serve.outputs ----------------------------------------------------------------


def gpt2_spec(tmp_path: Path, extra: str = "", buckets: str = "[2]") -> WarmupSpec:
    from orchestrator.config import load_spec

    path = tmp_path / "gpt2.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: tiny-gpt2
        model:
          factory: {ROOT / "examples" / "huggingface.py"}:gpt2
          kwargs: {json.dumps(TINY_GPT2)}
        inputs:
          - name: input_ids
            shape: [batch, 6]
            dtype: int64
            range: [0, 101]
        compile:
          mode: default
        buckets: {buckets}
        bench: {{iterations: 12, warmup: 1}}
        """)
        + textwrap.dedent(extra)
    )
    return load_spec(path)


def test_call_kwargs_and_outputs_shape_every_call_and_the_namespace(tmp_path):
    plain = gpt2_spec(tmp_path)
    served = gpt2_spec(tmp_path, "call:\n  kwargs: {use_cache: false}\nserve:\n  outputs: [logits]\n")
    assert plain.identity_hash() != served.identity_hash()
    assert "call" not in plain.identity() and "outputs" not in plain.identity()  # old namespaces stand

    model = build_model(served, torch.device("cpu"))
    assert isinstance(model, ConfiguredCall)
    assert not isinstance(build_model(plain, torch.device("cpu")), ConfiguredCall)
    with torch.no_grad():
        output = model(input_ids=torch.zeros(2, 6, dtype=torch.long))
    assert list(output) == ["logits"] and output["logits"].shape == (2, 6, 101)


def test_an_output_path_the_model_lacks_is_named_with_what_it_has(tmp_path):
    spec = gpt2_spec(tmp_path, "serve:\n  outputs: [logits, 'hidden_states[0]']\n")
    model = build_model(spec, torch.device("cpu"))
    with pytest.raises(
        SetupError,
        match=r"'hidden_states\[0\]' is not in the model's output \(output has keys logits, (past_key_values|cache)\)",
    ):
        model(input_ids=torch.zeros(1, 6, dtype=torch.long))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("serve:\n  outputs: [logits.]\n", "is not names and indices"),
        ("serve:\n  outputs: []\n", "at least one output path"),
        ("serve:\n  outputs: [logits, logits]\n", "listed twice"),
        ("call:\n  kwargs: {input_ids: 1}\n", "call.kwargs.input_ids is also an input's name"),
    ],
)
def test_bad_call_and_output_settings_are_refused(tmp_path, extra, message):
    from orchestrator.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        gpt2_spec(tmp_path, extra)


@pytest.mark.slow
def test_a_decoder_with_its_cache_on_is_served_compiled(tmp_path):
    """GPT-2's default config returns a DynamicCache: the bucket passes the gate compiled, and a
    replica serves a smaller request on it, the cache cut back to the request."""
    from orchestrator import runtime
    from orchestrator.jobs.engine import run_warmup

    spec = gpt2_spec(tmp_path, buckets="[4]")
    spec = spec.replaced(serve={"variants": ["compiled"]})
    run = run_warmup(spec, tmp_path / "cache")
    for result in run.results:
        assert result.status == "ok", result.error
        assert result.variants["compiled"].ok and result.checked_outputs == len(snapshot(decoder_output()))

    served = runtime.load(spec, cache_dir=str(tmp_path / "cache"), device="cpu", ready="planned")
    assert served.info().buckets[4].variant == run.results[0].variant  # the plan, whichever is faster here
    request = torch.arange(18).reshape(3, 6) % 101
    with torch.no_grad():
        answer = served(input_ids=request)
        expected = build_model(spec, torch.device("cpu"))(input_ids=request)
    assert type(answer[cache_name(answer)]) is type(expected[cache_name(expected)])
    Gate().compare(snapshot(expected), snapshot(answer), call="replica")


def test_a_rebuilt_output_and_cache_equal_those_the_constructors_build():
    """A decoder's output is rebuilt at every call that copies it out; the rebuild skips the
    constructors where the type leaves them nothing to do, and must build the same objects."""
    output = decoder_output()
    leaves = [leaf for _, leaf in trees.leaves(output)]
    new = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    rebuilt = trees.rebuilder(output)(iter(new))

    assert type(rebuilt) is type(output) and list(rebuilt) == list(output)
    assert [leaf for _, leaf in trees.leaves(rebuilt)] == new  # the new leaves, in order, by identity
    for key in rebuilt:  # item and field agree, as the constructor keeps them
        assert getattr(rebuilt, key) is rebuilt[key]
    assert rebuilt.to_tuple()[0] is new[0] and rebuilt.attentions is None
    cache, original = rebuilt[cache_name(rebuilt)], output[cache_name(output)]
    assert type(cache) is type(original) and cache is not original
    assert all(layer is not old for layer, old in zip(cache.layers, original.layers, strict=True))
    assert cache.get_seq_length() == original.get_seq_length() == 6
    assert cache.layers[1].keys is new[1 + 2 * 1] and original.layers[1].keys is leaves[1 + 2 * 1]
    import pickle  # as Ray passes an answer between processes

    again = pickle.loads(pickle.dumps(rebuilt))
    assert type(again) is type(output) and list(again) == list(output) and torch.equal(again[0], new[0])


def test_an_output_class_whose_items_do_not_set_its_fields_is_rebuilt_by_its_constructor():
    class Odd(transformers.modeling_outputs.ModelOutput):
        logits: Any = None
        extra: Any = None

        def __setitem__(self, key: Any, value: Any) -> None:  # the item only: the field stays behind
            dict.__setitem__(self, key, value)

    import dataclasses

    Odd = dataclasses.dataclass(Odd)  # noqa: N806  (as transformers' own output classes are made)
    rebuilt = trees.rebuilder(Odd(logits=torch.zeros(1)))(iter([torch.ones(1)]))
    assert type(rebuilt) is Odd and float(rebuilt.logits) == 1.0 and rebuilt["logits"] is rebuilt.logits


def test_a_plain_object_is_copied_as_copy_copies_it_and_one_with_its_own_copy_keeps_it():
    class Plain:
        def __init__(self) -> None:
            self.a, self.b = [1], 2

    class Hooked(Plain):
        def __copy__(self) -> Hooked:
            made = Hooked()
            made.b = "hooked"
            return made

    plain = Plain()
    copied = trees._shallow_copy(plain)
    assert type(copied) is Plain and copied is not plain and vars(copied) == vars(plain) and copied.a is plain.a
    assert trees._shallow_copy(Hooked()).b == "hooked"


def test_an_output_rebuilt_with_a_field_gone_drops_its_key_as_the_constructor_does():
    output = decoder_output()
    rebuilt = trees.map_leaves(output, lambda path, leaf: None if path == "output.logits" else leaf)
    assert "logits" not in rebuilt and rebuilt.logits is None and list(rebuilt) == [cache_name(output)]
