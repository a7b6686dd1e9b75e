"""The spatial filter of the gated block: a learned local filter and the CDR operator, side by side.

``spatial_mix`` chooses what the filter holds: ``"both"`` (the design), or one of the two ablations, ``"local"``
(the depthwise convolution alone: MambaOut's block) and ``"global"`` (the operator alone). All modules here take
and return channels-last maps ``(B, H, W, C)``.
"""

import torch
from timm.layers import LayerScale
from torch import nn

from .cdr import create_cdr

__all__ = ["SPATIAL_MIXES", "DepthwiseConv", "LocalPlusGlobal", "create_spatial_filter"]

SPATIAL_MIXES = ("both", "local", "global")


class DepthwiseConv(nn.Module):
    """A learned ``k x k`` depthwise convolution on channels-last maps (zero padding, size kept)."""

    def __init__(self, channels: int, kernel_size: int = 7, device=None, dtype=None):
        super().__init__()
        self.conv = nn.Conv2d(
            channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, device=device, dtype=dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # (B, H, W, C)


class LocalPlusGlobal(nn.Module):
    """``dwconv(x) + g * CDR(x)``: the learned depthwise kernel answers to local structure (an oriented edge), the CDR
    operator, band-limited by construction, carries smooth long-range context.

    ``gain_init`` (``None``: no gain, ``g = 1``) adds a learned per-channel gain ``g`` on the operator's path with
    this initial value; at ``0`` the filter starts as its local-only ablation and the operator enters as it learns.
    The operator's output is added without a norm: its reaction gain ``exp(t r)`` sets its scale per channel.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        num_heads: int | None = None,
        modes: int = 6,
        gain_init: float | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.local = DepthwiseConv(channels, kernel_size, **dd)
        self.operator = create_cdr(channels, num_heads=num_heads, modes=modes, **dd)
        self.gain = LayerScale(channels, gain_init, **dd) if gain_init is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(x) + self.gain(self.operator(x))  # (B, H, W, C)


def create_spatial_filter(
    channels: int,
    spatial_mix: str = "both",
    kernel_size: int = 7,
    num_heads: int | None = None,
    modes: int = 6,
    gain_init: float | None = None,
    device=None,
    dtype=None,
) -> nn.Module:
    """The gated block's spatial filter: ``dwconv(x) + CDR(x)`` (``"both"``), ``dwconv(x)`` (``"local"``) or
    ``CDR(x)`` (``"global"``), where ``dwconv`` is a ``kernel_size`` depthwise convolution and ``CDR`` the CDR
    operator with ``num_heads`` sets of coefficients and cut-off ``modes`` (:mod:`iris_timm.layers.cdr`), its path
    scaled by a learned per-channel gain starting at ``gain_init`` in ``"both"`` (``None``: no gain)."""
    dd = {"device": device, "dtype": dtype}
    if spatial_mix == "both":
        return LocalPlusGlobal(channels, kernel_size, num_heads, modes, gain_init, **dd)
    if spatial_mix == "local":
        return DepthwiseConv(channels, kernel_size, **dd)
    if spatial_mix == "global":
        return create_cdr(channels, num_heads=num_heads, modes=modes, **dd)
    raise ValueError(f"Unknown spatial_mix {spatial_mix!r}; choose one of {SPATIAL_MIXES}.")
