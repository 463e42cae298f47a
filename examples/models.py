"""Example models that need no downloads: an MLP and a TransformerEncoder of plain PyTorch, and
GPT-2 from Hugging Face transformers built from its config with random weights."""

from typing import Any

from torch import nn


def mlp(layers: int = 24, width: int = 256) -> nn.Module:
    """Many small kernels per call: launch-bound, the case CUDA graphs help most."""
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()) for _ in range(layers))
    )


def transformer(layers: int = 6, d_model: int = 512, heads: int = 8, feedforward: int = 2048) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model, heads, feedforward, batch_first=True)
    # nested tensors would make eager take a different (fast-path) route than the compiled graph
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def gpt2(**config: Any) -> nn.Module:
    """GPT-2 with its LM head (`GPT2Config`'s defaults: 124M parameters), random weights, no
    download. transformers is imported here, so the other examples load without it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**config))
