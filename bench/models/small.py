"""Small models whose per-call cost is mostly launch overhead: where the choice between eager and a
captured variant rests on tens of microseconds, and the noise of single calls is of that size."""

from __future__ import annotations

from torch import Tensor, nn


class TwoInputLinear(nn.Module):
    """One linear layer over the sum of two inputs: a handful of kernels per call."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.linear(x + y)


def two_input_linear(width: int = 256) -> nn.Module:
    return TwoInputLinear(width)
