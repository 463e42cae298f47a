"""Example models that need no downloads, built from plain PyTorch modules: an MLP and a TransformerEncoder."""

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
