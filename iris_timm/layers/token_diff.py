"""Token differential: a learned high-pass residual against over-smoothing."""

import torch
from timm.layers import register_notrace_module
from torch import nn

__all__ = ["TokenDifferential"]


def box_sum(x: torch.Tensor, dim: int, radius: int) -> torch.Tensor:
    """Sum over the window ``[i - radius, i + radius]`` along ``dim``, zero beyond the edges; same shape.

    Shifted in-place adds on any layout: cheaper than pooling, which would need ``(B, C, H, W)``.
    """
    size = x.shape[dim]
    out = x.clone()
    for shift in range(1, radius + 1):
        length = max(size - shift, 0)
        out.narrow(dim, shift, length).add_(x.narrow(dim, 0, length))  # the neighbour before
        out.narrow(dim, 0, length).add_(x.narrow(dim, shift, length))  # the neighbour after
    return out


@register_notrace_module  # the window arithmetic reads the grid size: a leaf for torch.fx
class LocalMean(nn.Module):
    """Mean over a ``kernel_size x kernel_size`` neighbourhood (borders average what they have)."""

    def __init__(self, kernel_size: int, channels_last: bool = False):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number, got {kernel_size}.")
        self.radius = kernel_size // 2
        self.h_dim, self.w_dim = (1, 2) if channels_last else (2, 3)
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return self.local_mean(x)
        return local_mean(self, x)

    def local_mean(self, x: torch.Tensor) -> torch.Tensor:
        total = box_sum(box_sum(x, self.h_dim, self.radius), self.w_dim, self.radius)
        rows = box_sum(x.new_ones(x.shape[self.h_dim]), 0, self.radius)  # neighbours inside the grid
        cols = box_sum(x.new_ones(x.shape[self.w_dim]), 0, self.radius)
        count = torch.outer(rows, cols)  # (H, W)
        return total / (count[:, :, None] if self.channels_last else count)


def local_mean(mean: LocalMean, x: torch.Tensor) -> torch.Tensor:
    """``mean.local_mean(x)``; torch.fx records it as one call (the window counts depend on the grid size)."""
    return mean.local_mean(x)


torch.fx.wrap("local_mean")


class GlobalMean(nn.Module):
    """Mean over the whole feature map, as the original block computed it."""

    def __init__(self, channels_last: bool = False):
        super().__init__()
        self.spatial_dims: list[int] = [1, 2] if channels_last else [2, 3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(self.spatial_dims, keepdim=True)


class TokenDifferential(nn.Module):
    """``x + alpha * (x - mean(x))``, with a learned per-channel ``alpha`` (zero at init).

    With ``kernel_size`` (default 3) the mean is local, so ``x - mean(x)`` is a local high-pass
    that keeps edges a global spectral mixer would blur. ``kernel_size=None`` subtracts the
    global mean instead, as the original block did.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int | None = 3,
        channels_last: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        alpha_shape = (channels,) if channels_last else (1, channels, 1, 1)
        self.alpha = nn.Parameter(torch.zeros(alpha_shape, device=device, dtype=dtype))
        self.mean = GlobalMean(channels_last) if kernel_size is None else LocalMean(kernel_size, channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * (x - self.mean(x))
