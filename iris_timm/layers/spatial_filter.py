"""The spatial filter of the gated block: a learned local filter and the CDR operator, side by side.

``spatial_mix`` chooses what the filter holds: ``"both"`` (the design), or one of the two ablations, ``"local"``
(the depthwise convolution alone: MambaOut's block) and ``"global"`` (the operator alone). All modules here take
and return channels-last maps ``(B, H, W, C)``.
"""

import torch
import torch.nn.functional as F
from timm.layers import LayerScale, register_notrace_module
from torch import nn

from .cdr import create_cdr

__all__ = ["SPATIAL_MIXES", "DepthwiseConv", "LocalPlusGlobal", "create_spatial_filter"]

SPATIAL_MIXES = ("both", "local", "global")


@register_notrace_module  # the grid size picks the kernel's taps: a leaf for timm's tracer
class DepthwiseConv(nn.Module):
    """A learned ``k x k`` depthwise convolution on channels-last maps (zero padding, size kept). A contiguous map is
    convolved where it lies: its permuted view is an NCHW tensor in the channels-last memory format, which the
    convolution takes, and returns, without a copy. On a grid narrower than the kernel only the central
    ``(2H - 1) x (2W - 1)`` taps ever meet the map (the others meet the zero padding): those alone are applied, the
    same sums at a fraction of the cost (a 1x1 grid is one multiply per channel, where the full kernel costs 49)."""

    def __init__(self, channels: int, kernel_size: int = 7, device=None, dtype=None):
        super().__init__()
        self.conv = nn.Conv2d(
            channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, device=device, dtype=dtype
        )

    def forward(self, x: torch.Tensor, extra_kernel: torch.Tensor | None = None) -> torch.Tensor:  # (B, H, W, C)
        """The convolution; with ``extra_kernel`` ``(C, 2H - 1, 2W - 1)`` (at most the kernel's size), the convolution
        with the sum of both kernels."""
        H, W = x.shape[1], x.shape[2]
        kh, kw = self.conv.kernel_size
        full_h, full_w = kh, kw
        # A graph recorded for every size (its sizes symbols, or tensors under torch.jit.trace) keeps the whole kernel.
        if isinstance(H, int) and isinstance(W, int):
            kh, kw = min(kh, 2 * H - 1), min(kw, 2 * W - 1)
        top, left = (full_h - kh) // 2, (full_w - kw) // 2
        weight = self.conv.weight[:, :, top : top + kh, left : left + kw]
        if extra_kernel is not None:
            weight = weight + extra_kernel[:, None].to(weight.dtype)
        y = F.conv2d(x.permute(0, 3, 1, 2), weight, self.conv.bias, padding=(kh // 2, kw // 2), groups=self.conv.groups)
        return y.permute(0, 2, 3, 1)

    def covers(self, height: int, width: int) -> bool:
        """Whether a kernel of ``(2 height - 1) x (2 width - 1)`` taps, a whole grid's reach, fits in this one's."""
        return 2 * height - 1 <= self.conv.kernel_size[0] and 2 * width - 1 <= self.conv.kernel_size[1]


class LocalPlusGlobal(nn.Module):
    """``dwconv(x) + g * CDR(x)``: the learned depthwise kernel answers to local structure (an oriented edge), the CDR
    operator, band-limited by construction, carries smooth long-range context.

    ``gain_init`` (``None``: no gain, ``g = 1``) adds a learned per-channel gain ``g`` on the operator's path with
    this initial value; at ``0`` the filter starts as its local-only ablation and the operator enters as it learns.
    The operator's output is added without a norm: its reaction gain ``exp(t r)`` sets its scale per channel.
    ``dynamic`` gives each sample its own operator (:class:`~.cdr.DynamicConvectionDiffusionReaction2d`).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        num_heads: int | None = None,
        modes: int = 6,
        gain_init: float | None = None,
        dynamic: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.local = DepthwiseConv(channels, kernel_size, **dd)
        self.operator = create_cdr(channels, dynamic, num_heads=num_heads, modes=modes, **dd)
        self.gain = LayerScale(channels, gain_init, **dd) if gain_init is not None else nn.Identity()
        self.fuses = not dynamic  # one kernel for the batch: a per-sample operator has one per sample

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C)
        H, W = x.shape[1], x.shape[2]
        if self.fuses and isinstance(H, int) and isinstance(W, int) and self.local.covers(H, W):
            # On a grid this small the operator is a depthwise kernel within the conv's reach (CDR.kernel): one
            # convolution with the sum of both kernels computes both paths.
            kernel = self.operator.kernel(H, W, x.device).permute(1, 2, 0)  # (2H - 1, 2W - 1, C)
            return self.local(x, self.gain(kernel).permute(2, 0, 1))  # the gain, per channel, scales its taps
        return self.local(x) + self.gain(self.operator(x))


def create_spatial_filter(
    channels: int,
    spatial_mix: str = "both",
    kernel_size: int = 7,
    num_heads: int | None = None,
    modes: int = 6,
    gain_init: float | None = None,
    dynamic: bool = False,
    device=None,
    dtype=None,
) -> nn.Module:
    """The gated block's spatial filter: ``dwconv(x) + CDR(x)`` (``"both"``), ``dwconv(x)`` (``"local"``) or
    ``CDR(x)`` (``"global"``), where ``dwconv`` is a ``kernel_size`` depthwise convolution and ``CDR`` the CDR
    operator with ``num_heads`` sets of coefficients and cut-off ``modes`` (:mod:`iris_timm.layers.cdr`), per sample
    with ``dynamic``, its path scaled by a learned per-channel gain starting at ``gain_init`` in ``"both"``
    (``None``: no gain)."""
    dd = {"device": device, "dtype": dtype}
    if spatial_mix == "both":
        return LocalPlusGlobal(channels, kernel_size, num_heads, modes, gain_init, dynamic, **dd)
    if spatial_mix == "local":
        return DepthwiseConv(channels, kernel_size, **dd)
    if spatial_mix == "global":
        return create_cdr(channels, dynamic, num_heads=num_heads, modes=modes, **dd)
    raise ValueError(f"Unknown spatial_mix {spatial_mix!r}; choose one of {SPATIAL_MIXES}.")
