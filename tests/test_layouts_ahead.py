"""A rank sets up its buckets' convolutions in the layout Inductor may give them on a GPU
(channels-last) while the compile wave runs, so that the compiled graph's first call after the
publish does not pay cuDNN's set-up (Session.warm_layouts). The GPU decides whether it happens;
what it does, on a copy of the model, and how its seconds are counted is the same on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from orchestrator.config import load_spec
from orchestrator.jobs import engine
from orchestrator.jobs import torch_internals as ti

MODELS = """
from torch import nn

def convnet():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.Flatten())
"""


def convnet() -> nn.Module:
    """The configs' model, built here."""
    factories: dict = {}
    exec(MODELS, factories)  # noqa: S102  (the test's own source above)
    return factories["convnet"]().eval()


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # a Session points Inductor at its cache through these: restored after the test
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    (tmp_path / "models.py").write_text(MODELS)
    path = tmp_path / "convnet.yaml"
    path.write_text(
        "name: convnet\nmodel: {factory: models.py:convnet}\ninputs: [{shape: [batch, 3, 8, 8]}]\n"
        "buckets: [2]\ndevice: cpu\ncompile: {mode: default}\n"
    )
    return path


def test_only_inductor_on_a_gpu_with_2d_convolutions_may_change_their_layout():
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert ti.may_go_channels_last(convnet(), gpu, "inductor", {})
    assert not ti.may_go_channels_last(convnet(), gpu, "inductor", {"layout_optimization": False})
    assert not ti.may_go_channels_last(convnet(), cpu, "inductor", {})
    assert not ti.may_go_channels_last(convnet(), gpu, "aot_eager", {})
    assert not ti.may_go_channels_last(nn.Sequential(nn.Linear(4, 4), nn.Conv1d(4, 4, 1)), gpu, "inductor", {})


def test_the_channels_last_call_runs_a_copy_and_answers_as_the_model_does():
    torch.manual_seed(0)
    model = convnet()
    weights = {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    x = torch.randn(2, 3, 8, 8)
    twin = ti.channels_last_twin(model)
    (last,), kwargs = ti.channels_last_inputs((x,), {"mask": torch.ones(2, 3, 8, 8, dtype=torch.long)})

    assert last.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(
        memory_format=torch.channels_last
    )
    assert kwargs["mask"].is_contiguous()  # not floating point: left as it is
    assert twin[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert twin[1].running_mean.dim() == 1  # only 4-D tensors change layout
    # the model the compiled graph reads is untouched: same storage, same strides
    assert {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()} == weights
    with torch.no_grad():
        torch.testing.assert_close(twin(last), model(x))


@pytest.mark.slow  # one compile on the CPU
def test_the_layouts_set_up_ahead_count_in_the_buckets_first_call(config, tmp_path, monkeypatch):
    # the decision is the GPU's (above); the rest runs as on the GPU
    monkeypatch.setattr(ti, "may_go_channels_last", lambda *args: True)
    session = engine.Session(load_spec(config), tmp_path / "cache")
    session.warm_layouts([2])
    result = session.warm(2, benchmark=False)
    session.close()

    assert result.status == "ok", result.error_detail
    assert ("layouts set up" in [what for what, _ in session.events]) and result.compile_seconds is not None
    ahead = result.stage_seconds["layouts ahead"]
    assert 0 < ahead <= result.compile_seconds <= ahead + result.stage_seconds["compile"]
    session.warm_layouts([2])  # loaded already: nothing more to set up
    assert result.stage_seconds["layouts ahead"] == ahead


def test_a_failed_set_up_costs_only_the_head_start(config, tmp_path, monkeypatch):
    def no_copy(model: nn.Module) -> nn.Module:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(ti, "may_go_channels_last", lambda *args: True)
    monkeypatch.setattr(ti, "channels_last_twin", no_copy)
    session = engine.Session(load_spec(config), tmp_path / "cache")
    session.warm_layouts([2])
    session.close()

    assert "layouts not set up ahead: RuntimeError: CUDA out of memory" in [what for what, _ in session.events]
    result = session._bucket(2).result
    assert result.status == "ok" and "layouts ahead" not in result.stage_seconds


def test_no_layouts_are_set_up_where_inductor_keeps_them(config, tmp_path):
    session = engine.Session(load_spec(config), tmp_path / "cache")  # the CPU: oneDNN's own layouts
    session.warm_layouts([2])
    session.close()
    assert not [what for what, _ in session.events if "layouts" in what]
    assert "layouts ahead" not in session._bucket(2).result.stage_seconds


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_conv_net_sets_up_its_layouts_and_still_loads_checked(config, tmp_path):
    config.write_text(config.read_text().replace("device: cpu", "device: cuda").replace("default", "reduce-overhead"))
    session = engine.Session(load_spec(config), tmp_path / "cache", trace_ahead=True)
    session.trace(2)
    session.warm_layouts([2])
    result = session.warm(2, benchmark=False)
    session.close()

    assert result.status == "ok", result.error_detail  # the gate compared it with eager
    assert "layouts set up" in [what for what, _ in session.events]
    stages = result.stage_seconds
    assert result.compile_seconds >= stages["trace ahead"] + stages["layouts ahead"]
