"""Token differential: a learned high-pass residual against over-smoothing."""

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TokenDifferential"]


class LocalMean(nn.Module):
    """Mean over a ``kernel_size x kernel_size`` neighbourhood (borders average what they have)."""

    def __init__(self, kernel_size: int, channels_last: bool = False):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number, got {kernel_size}.")
        self.kernel_size = kernel_size
        # avg_pool2d wants (B, C, H, W); a channels-last input is permuted there and back.
        self.to_nchw: list[int] = [0, 3, 1, 2] if channels_last else [0, 1, 2, 3]
        self.from_nchw: list[int] = [0, 2, 3, 1] if channels_last else [0, 1, 2, 3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(self.to_nchw)
        x = F.avg_pool2d(x, self.kernel_size, 1, self.kernel_size // 2, count_include_pad=False)
        return x.permute(self.from_nchw)


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
