"""Unit tests of config loading and validation (orchestrator.config, orchestrator.jobs.spec). No torch, no compiling."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.config import (
    DEFAULT_CACHE_ROOT,
    ConfigError,
    apply_overrides,
    cache_root,
    format_buckets,
    load_spec,
    load_spec_with_overrides,
    parse_buckets,
)
from orchestrator.errors import EXIT_USAGE, UserError
from orchestrator.jobs.spec import WarmupSpec

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

MINIMAL = """\
model:
  factory: models.py:mlp
inputs:
  - shape: [batch, 8]
"""


def write(tmp_path: Path, text: str, name: str = "model.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(tmp_path: Path, text: str, name: str = "model.yaml") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message, f"error must be one line: {message!r}"
    assert message.startswith(f"config {path}: "), message
    return message


def spec_of(**changes) -> WarmupSpec:
    data = {"model": {"factory": "models.py:mlp"}, "inputs": [{"shape": ["batch", 8]}]}
    data.update(changes)
    return WarmupSpec.model_validate(data)


# --- loading the shipped examples -------------------------------------------------------------


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"mlp.yaml", "transformer.yaml", "resnet18.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_configs_validate(path):
    spec = load_spec(path)
    assert spec.name == path.stem
    assert spec.base_dir == path.resolve().parent
    assert spec.buckets == [1, 8, 32]
    assert spec.inputs and any(spec.bucket_symbol in item.shape for item in spec.inputs)


def test_mlp_example_fields():
    spec = load_spec(ROOT / "examples" / "mlp.yaml")
    assert spec.model.factory == "models.py:mlp"
    assert spec.model.is_file
    assert spec.model.target == "models.py"
    assert spec.model.attribute == "mlp"
    assert spec.model.kwargs == {"layers": 24, "width": 256}
    assert spec.compile.mode == "reduce-overhead"
    assert spec.compile.dynamic is False
    assert spec.bench.iterations == 100 and spec.bench.warmup == 10
    assert spec.device == "auto"
    # the factory file resolves next to the config, whatever the working directory
    assert (spec.base_dir / spec.model.target).is_file()


def test_module_factory_is_not_a_file():
    spec = load_spec(ROOT / "examples" / "resnet18.yaml")
    assert not spec.model.is_file
    assert spec.model.target == "torchvision.models"
    assert spec.model.attribute == "resnet18"


def test_defaults(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.buckets == [1, 8, 32]
    assert spec.bucket_symbol == "batch"
    assert spec.device == "auto"
    assert spec.compile.mode == "reduce-overhead"
    assert spec.compile.dynamic is False
    assert spec.inputs[0].dtype == "float32"
    assert spec.cache_dir is None
    assert spec.seed == 0


# --- name and base directory ------------------------------------------------------------------


def test_name_defaults_to_file_stem(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL, "my_model.v2.yaml"))
    assert spec.name == "my_model.v2"


def test_name_from_stem_is_made_label_safe(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL, "my model.yaml"))
    assert spec.name == "my-model"


def test_explicit_name_wins_over_stem(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL + "name: custom\n", "other.yaml"))
    assert spec.name == "custom"


def test_invalid_explicit_name_rejected(tmp_path):
    message = load_error(tmp_path, MINIMAL + "name: 'has space'\n")
    assert "name:" in message and "letters, digits" in message


@pytest.mark.parametrize("filename", ["_private.yaml", "modèle.yaml"])
def test_name_from_any_stem_is_label_safe(tmp_path, filename):
    spec = load_spec(write(tmp_path, MINIMAL, filename))
    assert spec.name
    assert WarmupSpec.model_validate({**spec.model_dump(), "name": spec.name}).name == spec.name


def test_relative_factory_resolves_against_config_dir(tmp_path, monkeypatch):
    sub = tmp_path / "configs" / "nested"
    sub.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_spec(write(sub, MINIMAL, "m.yaml"))
    assert spec.base_dir == sub.resolve()
    # loaded through a relative path from another working directory: still the config's directory
    relative = Path("..") / "configs" / "nested" / "m.yaml"
    spec = load_spec(relative)
    assert spec.base_dir == sub.resolve()
    assert spec.base_dir.is_absolute()


def test_spec_without_file_uses_current_dir():
    assert spec_of().base_dir == Path(".")


def test_replaced_keeps_base_dir(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.replaced(seed=3).base_dir == tmp_path.resolve()


# --- unknown keys -----------------------------------------------------------------------------


def test_unknown_top_level_key_lists_allowed_fields(tmp_path):
    message = load_error(tmp_path, MINIMAL + "zzz: 1\n")
    assert "zzz: unknown field" in message
    assert "allowed:" in message and "buckets" in message and "model" in message


def test_unknown_top_level_key_did_you_mean(tmp_path):
    message = load_error(tmp_path, MINIMAL + "bucket: [1, 2]\n")
    assert "bucket: unknown field (did you mean 'buckets'?)" in message


def test_unknown_compile_key(tmp_path):
    message = load_error(tmp_path, MINIMAL + "compile:\n  moed: default\n")
    assert "compile.moed: unknown field (did you mean 'mode'?)" in message


def test_unknown_input_key(tmp_path):
    text = """\
    model: {factory: 'models.py:mlp'}
    inputs:
      - shape: [batch, 8]
        dtyp: float32
    """
    message = load_error(tmp_path, text)
    assert "inputs[0].dtyp: unknown field (did you mean 'dtype'?)" in message


def test_unknown_key_in_second_input(tmp_path):
    text = """\
    model: {factory: 'models.py:mlp'}
    inputs:
      - shape: [batch, 8]
      - shape: [batch, 8]
        shap: [1]
    """
    message = load_error(tmp_path, text)
    assert "inputs[1].shap: unknown field (did you mean 'shape'?)" in message


def test_unknown_model_key(tmp_path):
    text = """\
    model: {factory: 'models.py:mlp', kwarg: {width: 8}}
    inputs:
      - shape: [batch, 8]
    """
    message = load_error(tmp_path, text)
    assert "model.kwarg: unknown field (did you mean 'kwargs'?)" in message


@pytest.mark.parametrize("section, key, hint", [("bench", "iteration", "iterations"), ("check", "atoll", "atol")])
def test_unknown_key_in_other_sections(tmp_path, section, key, hint):
    message = load_error(tmp_path, MINIMAL + f"{section}:\n  {key}: 1\n")
    assert f"{section}.{key}: unknown field (did you mean '{hint}'?)" in message


def test_unknown_key_without_close_match_lists_allowed(tmp_path):
    message = load_error(tmp_path, MINIMAL + "compile:\n  xyzzy: 1\n")
    assert "compile.xyzzy: unknown field (allowed:" in message
    assert "mode" in message and "fullgraph" in message


def test_many_errors_are_summarised_on_one_line(tmp_path):
    message = load_error(tmp_path, MINIMAL + "a1: 1\nb2: 1\nc3: 1\nd4: 1\ne5: 1\n")
    assert "(and 2 more)" in message


# --- YAML shape -------------------------------------------------------------------------------


def test_bad_yaml_reports_line_and_column(tmp_path):
    text = "model:\n  factory: models.py:mlp\ninputs: [\n  - shape: [batch\n"
    message = load_error(tmp_path, text)
    assert "invalid YAML" in message
    assert "line " in message and "column " in message


def test_bad_yaml_exact_position(tmp_path):
    message = load_error(tmp_path, "model: {factory: x:y}\na: b: c\n")
    assert "invalid YAML at line 2, column 5" in message
    assert "mapping values are not allowed here" in message


@pytest.mark.parametrize(
    "text, kind", [("- 1\n- 2\n", "list"), ("just a string\n", "str"), ("", "NoneType"), ("42\n", "int")]
)
def test_non_mapping_yaml(tmp_path, text, kind):
    message = load_error(tmp_path, text)
    assert "expected a mapping" in message and kind in message


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="no such file") as info:
        load_spec(missing)
    assert str(missing) in str(info.value)


def test_config_is_directory(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path)


def test_config_error_is_user_error_with_usage_exit_code():
    assert issubclass(ConfigError, UserError)
    assert ConfigError("x").exit_code == EXIT_USAGE == 2


# --- required fields --------------------------------------------------------------------------


def test_missing_model(tmp_path):
    message = load_error(tmp_path, "inputs:\n  - shape: [batch, 8]\n")
    assert "model: required field is missing" in message


def test_missing_inputs(tmp_path):
    message = load_error(tmp_path, "model: {factory: 'models.py:mlp'}\n")
    assert "inputs: required field is missing" in message


def test_missing_factory(tmp_path):
    message = load_error(tmp_path, "model: {kwargs: {}}\ninputs:\n  - shape: [batch, 8]\n")
    assert "model.factory: required field is missing" in message


def test_empty_inputs(tmp_path):
    message = load_error(tmp_path, "model: {factory: 'models.py:mlp'}\ninputs: []\n")
    assert "inputs:" in message and "at least 1" in message


def test_missing_shape(tmp_path):
    message = load_error(tmp_path, "model: {factory: 'models.py:mlp'}\ninputs:\n  - dtype: float32\n")
    assert "inputs[0].shape: required field is missing" in message


# --- inputs -----------------------------------------------------------------------------------


def test_integer_input_without_range(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [batch, 8]\n    dtype: int64\n"
    message = load_error(tmp_path, text)
    assert "inputs[0]" in message and "needs `range" in message and "int64" in message


@pytest.mark.parametrize("rng", ["[5, 5]", "[9, 3]"])
def test_integer_input_with_empty_range(tmp_path, rng):
    text = f"model: {{factory: 'models.py:mlp'}}\ninputs:\n  - shape: [batch, 8]\n    dtype: int32\n    range: {rng}\n"
    message = load_error(tmp_path, text)
    assert "inputs[0]" in message and "is empty" in message


def test_integer_input_with_range_ok(tmp_path):
    text = (
        "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [batch, 16]\n    dtype: int64\n    range: [0, 32000]\n"
    )
    spec = load_spec(write(tmp_path, text))
    assert spec.inputs[0].range == (0, 32000)


def test_range_on_float_input(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [batch, 8]\n    dtype: float16\n    range: [0, 4]\n"
    message = load_error(tmp_path, text)
    assert "inputs[0]" in message and "integer inputs only" in message and "float16" in message


def test_range_on_bool_input(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [batch, 8]\n    dtype: bool\n    range: [0, 2]\n"
    message = load_error(tmp_path, text)
    assert "inputs[0]" in message and "integer inputs only" in message


def test_unknown_shape_symbol(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [batch, 8]\n  - shape: [batch, seq]\n"
    message = load_error(tmp_path, text)
    assert "inputs[1].shape: unknown symbol 'seq'" in message
    assert "'batch'" in message


def test_custom_bucket_symbol(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\nbucket_symbol: seq\ninputs:\n  - shape: [4, seq]\n"
    spec = load_spec(write(tmp_path, text))
    assert spec.inputs[0].concrete_shape(spec.bucket_symbol, 16) == [4, 16]


def test_no_input_uses_bucket_symbol(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [4, 8]\n"
    message = load_error(tmp_path, text)
    assert "bucket symbol 'batch'" in message


def test_non_positive_dimension(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: [batch, 0]\n"
    message = load_error(tmp_path, text)
    assert "inputs[0].shape" in message and "positive" in message


def test_empty_shape(tmp_path):
    text = "model: {factory: 'models.py:mlp'}\ninputs:\n  - shape: []\n"
    message = load_error(tmp_path, text)
    assert "inputs[0].shape" in message and "at least one dimension" in message


@pytest.mark.parametrize("dtype", ["float33", "int", "torch.float32"])
def test_invalid_input_dtype(tmp_path, dtype):
    text = f"model: {{factory: 'models.py:mlp'}}\ninputs:\n  - shape: [batch, 8]\n    dtype: {dtype}\n"
    message = load_error(tmp_path, text)
    assert "inputs[0].dtype:" in message
    assert "'float32'" in message  # names what is allowed


def test_invalid_model_dtype(tmp_path):
    text = "model: {factory: 'models.py:mlp', dtype: int64}\ninputs:\n  - shape: [batch, 8]\n"
    message = load_error(tmp_path, text)
    assert "model.dtype:" in message


# --- model factory ----------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["models.py", "torchvision.models", "models.py:", ":make", "a:b:c", "m:1x"])
def test_invalid_factory_form(tmp_path, factory):
    text = f"model: {{factory: '{factory}'}}\ninputs:\n  - shape: [batch, 8]\n"
    message = load_error(tmp_path, text)
    assert "model.factory:" in message
    assert "module:callable" in message


@pytest.mark.parametrize(
    "factory, is_file, target, attribute",
    [
        ("models.py:mlp", True, "models.py", "mlp"),
        ("sub/dir/models.py:Net.build", True, "sub/dir/models.py", "Net.build"),
        ("pkg/mod:make", True, "pkg/mod", "make"),
        ("torchvision.models:resnet18", False, "torchvision.models", "resnet18"),
    ],
)
def test_factory_parts(factory, is_file, target, attribute):
    ref = spec_of(model={"factory": factory}).model
    assert (ref.is_file, ref.target, ref.attribute) == (is_file, target, attribute)


# --- other fields -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, where",
    [
        ("device: gpu\n", "device:"),
        ("compile:\n  mode: fast\n", "compile.mode:"),
        ("bench:\n  iterations: 0\n", "bench.iterations:"),
        ("bench:\n  warmup: -1\n", "bench.warmup:"),
        ("check:\n  atol: -1\n", "check.atol:"),
        ("buckets: [0, 8]\n", "buckets[0]:"),
        ("buckets: []\n", "buckets:"),
        ("buckets: [8, 8]\n", "buckets:"),
    ],
)
def test_invalid_field_values(tmp_path, extra, where):
    message = load_error(tmp_path, MINIMAL + extra)
    assert where in message


def test_config_buckets_sorted(tmp_path):
    assert load_spec(write(tmp_path, MINIMAL + "buckets: [32, 1, 8]\n")).buckets == [1, 8, 32]


def test_duplicate_config_buckets_message(tmp_path):
    assert "bucket 8 is listed twice" in load_error(tmp_path, MINIMAL + "buckets: [8, 8]\n")


@pytest.mark.parametrize("buckets", ["[true]", "[8, false]", "[1.0]", "['8']", "[2147483648]"])
def test_a_bucket_is_a_whole_number_of_rows_that_a_tensor_can_hold(tmp_path, buckets):
    """YAML's `true` is no bucket, though pydantic's lax int takes it as 1."""
    message = load_error(tmp_path, MINIMAL + f"buckets: {buckets}\n")
    assert "buckets" in message and "\n" not in message


# --- --buckets --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,8,32", [1, 8, 32]),
        ("32,1,8", [1, 8, 32]),
        ("4", [4]),
        (" 1, 2 ,3 ", [1, 2, 3]),
    ],
)
def test_parse_buckets_ok(text, expected):
    assert parse_buckets(text) == expected


@pytest.mark.parametrize(
    "text, problem",
    [
        ("0", "'0' is not a positive integer"),
        ("-1", "'-1' is not a positive integer"),
        ("a", "'a' is not a positive integer"),
        ("1.5", "'1.5' is not a positive integer"),
        ("8,8", "bucket 8 is listed twice"),
        ("", "is not a positive integer"),
        ("1,,2", "is not a positive integer"),
        ("1,8,", "is not a positive integer"),
        ("99999999999999999999999", "99999999999999999999999 rows is more than a bucket may hold (2147483647)"),
    ],
)
def test_parse_buckets_rejects(text, problem):
    with pytest.raises(ConfigError) as info:
        parse_buckets(text)
    message = str(info.value)
    assert message.startswith("--buckets: ")
    assert problem in message
    assert "\n" not in message


def test_parse_buckets_rejects_non_decimal_digit():
    with pytest.raises(ConfigError, match="--buckets"):
        parse_buckets("²")


# --- apply_overrides --------------------------------------------------------------------------


def test_apply_overrides_nothing_returns_same_spec(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert apply_overrides(spec) is spec


def test_apply_overrides_replaces_fields(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    new = apply_overrides(spec, buckets=[2, 4], device="cpu", cache_dir="/tmp/somewhere")
    assert new.buckets == [2, 4]
    assert new.device == "cpu"
    assert new.cache_dir == "/tmp/somewhere"
    assert new.base_dir == spec.base_dir
    assert new.name == spec.name
    # the original is untouched (frozen)
    assert spec.buckets == [1, 8, 32] and spec.device == "auto" and spec.cache_dir is None


def test_apply_overrides_sorts_buckets(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert apply_overrides(spec, buckets=[32, 2]).buckets == [2, 32]


@pytest.mark.parametrize(
    "changes, where",
    [
        ({"device": "tpu"}, "device:"),
        ({"buckets": [0]}, "buckets[0]:"),
        ({"buckets": [4, 4]}, "buckets:"),
    ],
)
def test_apply_overrides_invalid(tmp_path, changes, where):
    spec = load_spec(write(tmp_path, MINIMAL))
    with pytest.raises(ConfigError) as info:
        apply_overrides(spec, **changes)
    assert where in str(info.value)
    assert "\n" not in str(info.value)


# --- load_spec_with_overrides: the one buckets override of warmup, pull, submit and render ------


def test_without_buckets_the_configs_stand(tmp_path):
    spec = load_spec_with_overrides(write(tmp_path, MINIMAL + "buckets: [4, 2]\n"))
    assert spec.buckets == [2, 4] and spec.device == "auto" and spec.cache_dir is None


@pytest.mark.parametrize("text, expected", [("32,2", [2, 32]), ("4", [4]), (" 1, 2 ", [1, 2])])
def test_buckets_text_replaces_the_configs(tmp_path, text, expected):
    assert load_spec_with_overrides(write(tmp_path, MINIMAL + "buckets: [4, 2]\n"), buckets=text).buckets == expected


def test_the_other_overrides_ride_along(tmp_path):
    spec = load_spec_with_overrides(write(tmp_path, MINIMAL), buckets="2", device="cpu", cache_dir=str(tmp_path / "c"))
    assert (spec.buckets, spec.device, spec.cache_dir) == ([2], "cpu", str((tmp_path / "c").resolve()))
    assert spec.base_dir == tmp_path.resolve()


@pytest.mark.parametrize(
    "text, problem",
    [("", "is not a positive integer"), ("8,8", "bucket 8 is listed twice"), ("0", "'0' is not a positive integer")],
)
def test_a_bad_buckets_text_is_a_one_line_config_error(tmp_path, text, problem):
    with pytest.raises(ConfigError) as info:
        load_spec_with_overrides(write(tmp_path, MINIMAL), buckets=text)
    assert str(info.value).startswith("--buckets: ") and problem in str(info.value)
    assert "\n" not in str(info.value)


def test_a_broken_config_is_reported_before_a_bad_buckets_text(tmp_path):
    with pytest.raises(ConfigError, match="config .*no such file"):
        load_spec_with_overrides(tmp_path / "missing.yaml", buckets="0")


@pytest.mark.parametrize("buckets", [[1], [1, 8, 32], [32, 1, 8]])
def test_format_buckets_is_read_back_by_parse_buckets(buckets):
    assert format_buckets(buckets) == ",".join(map(str, buckets))
    assert parse_buckets(format_buckets(buckets)) == sorted(buckets)


# --- identity ---------------------------------------------------------------------------------


def test_identity_hash_stable(tmp_path):
    a = load_spec(write(tmp_path, MINIMAL, "a.yaml"))
    b = load_spec(write(tmp_path, MINIMAL, "b.yaml"))
    assert a.identity_hash() == a.identity_hash() == b.identity_hash()
    assert len(a.identity_hash()) == 64
    int(a.identity_hash(), 16)


def test_identity_hash_ignores_key_order():
    a = spec_of(model={"factory": "m.py:f", "kwargs": {"x": 1, "y": 2}})
    b = spec_of(model={"factory": "m.py:f", "kwargs": {"y": 2, "x": 1}})
    assert a.identity_hash() == b.identity_hash()


@pytest.mark.parametrize(
    "changes",
    [
        {"buckets": [3, 5]},
        {"bench": {"iterations": 7, "warmup": 0}},
        {"cache_dir": "/somewhere/else"},
        {"name": "renamed"},
        {"device": "cpu"},
        {"seed": 42},
        {"check": {"atol": 0.5}},
        {"check": {"allow_nonfinite": True}},
    ],
)
def test_identity_hash_unaffected_by(changes):
    assert spec_of(**changes).identity_hash() == spec_of().identity_hash()


def test_identity_hash_unaffected_by_base_dir(tmp_path):
    a = spec_of().with_base_dir(tmp_path / "one")
    b = spec_of().with_base_dir(tmp_path / "two")
    assert a.identity_hash() == b.identity_hash()


def test_identity_hash_unaffected_by_overrides(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    overridden = apply_overrides(spec, buckets=[2], device="cpu", cache_dir=str(tmp_path / "c"))
    assert overridden.identity_hash() == spec.identity_hash()


@pytest.mark.parametrize(
    "changes",
    [
        {"compile": {"mode": "default"}},
        {"compile": {"dynamic": True}},
        {"compile": {"fullgraph": True}},
        {"compile": {"backend": "aot_eager"}},
        {"compile": {"options": {"max_autotune": True}}},
        {"model": {"factory": "models.py:mlp", "kwargs": {"width": 16}}},
        {"model": {"factory": "models.py:mlp", "dtype": "float16"}},
        {"model": {"factory": "models.py:transformer"}},
        {"inputs": [{"shape": ["batch", 16]}]},
        {"inputs": [{"shape": ["batch", 8], "dtype": "float16"}]},
    ],
)
def test_identity_hash_changed_by(changes):
    assert spec_of(**changes).identity_hash() != spec_of().identity_hash()


def test_identity_hash_changed_by_kwargs_values():
    a = spec_of(model={"factory": "models.py:mlp", "kwargs": {"layers": 2}})
    b = spec_of(model={"factory": "models.py:mlp", "kwargs": {"layers": 3}})
    assert a.identity_hash() != b.identity_hash()


# --- cache root -------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("ORCHESTRATE_CACHE_DIR", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_cache_root_default_is_home_cache(clean_env):
    assert DEFAULT_CACHE_ROOT == "~/.cache/orchestrate"
    assert cache_root(spec_of()) == clean_env / ".cache" / "orchestrate"


def test_cache_root_env_beats_default(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "env-cache"))
    assert cache_root(spec_of()) == tmp_path / "env-cache"


def test_cache_root_empty_env_falls_back_to_default(clean_env, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", "")
    assert cache_root(spec_of()) == clean_env / ".cache" / "orchestrate"


def test_cache_root_env_tilde_expanded(clean_env, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", "~/envcache")
    assert cache_root(spec_of()) == clean_env / "envcache"


def test_cache_root_relative_env_is_relative_to_cwd(clean_env, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", "rel-cache")
    assert cache_root(spec_of()) == tmp_path.resolve() / "rel-cache"


def test_cache_root_config_beats_env(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "env-cache"))
    spec = spec_of(cache_dir=str(tmp_path / "cfg-cache"))
    assert cache_root(spec) == tmp_path / "cfg-cache"


def test_cache_root_cli_override_beats_config_and_env(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "env-cache"))
    spec = load_spec(write(tmp_path, MINIMAL + f"cache_dir: {tmp_path / 'cfg-cache'}\n"))
    assert cache_root(spec) == tmp_path / "cfg-cache"
    overridden = apply_overrides(spec, cache_dir=str(tmp_path / "cli-cache"))
    assert cache_root(overridden) == tmp_path / "cli-cache"


def test_cache_root_config_tilde_expanded(clean_env):
    assert cache_root(spec_of(cache_dir="~/cfg")) == clean_env / "cfg"


def test_cache_root_relative_config_is_relative_to_config_file(clean_env, monkeypatch, tmp_path):
    confdir = tmp_path / "conf"
    confdir.mkdir()
    monkeypatch.chdir(tmp_path)
    spec = load_spec(write(confdir, MINIMAL + "cache_dir: .cache\n"))
    assert cache_root(spec) == confdir.resolve() / ".cache"


def test_cache_root_relative_cli_dir_is_relative_to_cwd(clean_env, monkeypatch, tmp_path):
    confdir = tmp_path / "conf"
    confdir.mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    spec = apply_overrides(load_spec(write(confdir, MINIMAL)), cache_dir="cli-cache")
    assert cache_root(spec) == workdir.resolve() / "cli-cache"


def test_duplicate_key_is_refused_with_its_line(tmp_path):
    message = load_error(
        tmp_path,
        """\
        model: {factory: models.py:mlp}
        inputs: [{shape: [batch, 4]}]
        compile: {mode: default}
        compile: {mode: reduce-overhead}
    """,
    )
    assert "'compile' appears twice" in message and "line 4" in message
