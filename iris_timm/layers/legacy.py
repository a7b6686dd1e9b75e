"""``PDESSMBlock``: a stand-alone block compatible with the original ``PDESSMBlock(dim, spatial_size)``.

The original block works on token sequences, with an FNO-style spectral convolution and a global token
differential. This module holds a drop-in replacement for it: the same constructor and call, and it loads the
original's state dicts. Everything here serves that block only; the backbones in :mod:`iris_timm.models` do not use
it.

All modules take and return channels-last maps ``(B, H, W, C)``.
"""

import torch
from timm.layers import register_notrace_module
from torch import nn

from .cdr import create_cdr

__all__ = [
    "LEGACY_OPERATORS",
    "LEGACY_TOKEN_DIFFS",
    "PDESSMBlock",
    "PDESSMMixer",
    "SpectralConv2d",
    "TokenDifferential",
]

LEGACY_OPERATORS = ("pde", "spectral")
LEGACY_TOKEN_DIFFS = ("local", "global", "none")


@register_notrace_module  # the grid size selects the kept modes: a leaf for torch.fx
class SpectralConv2d(nn.Module):
    """The original block's operator, FNO-style: ``irfft2(W ⊙ rfft2(x))`` with a dense ``C x C`` complex matrix per
    kept Fourier mode, on a periodic domain.

    Its "modes" are counts of integer frequencies, as in the original: ``modes_h`` keeps the row frequencies
    ``-modes_h .. modes_h - 1`` and ``modes_w`` the column frequencies ``0 .. modes_w - 1`` (the real FFT stores only
    non-negative column frequencies), whatever the grid; a grid too small to hold them uses those it has, each
    once. Weights are
    real tensors with a trailing ``(real, imag)`` dimension, as the original's. The FFT runs in float32 with
    autocast off: half-precision FFTs lose accuracy, and cuFFT refuses them on non-power-of-two sizes.
    """

    def __init__(self, channels: int, modes_h: int, modes_w: int, device=None, dtype=None):
        super().__init__()
        if modes_h < 1 or modes_w < 1:
            raise ValueError(f"modes_h and modes_w must be >= 1, got {modes_h} and {modes_w}.")
        self.channels, self.modes_h, self.modes_w = channels, modes_h, modes_w
        shape = (channels, channels, modes_h, modes_w, 2)  # (C_in, C_out, rows, columns, real/imag)
        # weight_pos[:, :, i] multiplies row frequency i, weight_neg[:, :, i] row frequency i - modes_h.
        self.weight_pos = nn.Parameter(torch.randn(shape, device=device, dtype=dtype) / channels**2)
        self.weight_neg = nn.Parameter(torch.randn(shape, device=device, dtype=dtype) / channels**2)

    def multiply(self, x_ft: torch.Tensor) -> torch.Tensor:
        """The weights applied to the ``rfft2`` spectrum ``(B, H, W // 2 + 1, C)`` of an ``H``-row input."""
        height = x_ft.shape[1]
        # Row frequencies 0 .. ceil(H/2)-1 are non-negative, the other H // 2 rows negative: disjoint.
        num_pos, num_neg = min(self.modes_h, (height + 1) // 2), min(self.modes_h, height // 2)
        num_cols = min(self.modes_w, x_ft.shape[2])
        weight_pos = torch.view_as_complex(self.weight_pos.float())[:, :, :num_pos, :num_cols]
        weight_neg = torch.view_as_complex(self.weight_neg.float())[:, :, self.modes_h - num_neg :, :num_cols]
        x_ft = x_ft[:, :, :num_cols]
        top = torch.einsum("bxyi,ioxy->bxyo", x_ft[:, :num_pos], weight_pos)
        bottom = torch.einsum("bxyi,ioxy->bxyo", x_ft[:, height - num_neg :], weight_neg)
        middle_shape = list(top.shape)
        middle_shape[1] = height - num_pos - num_neg
        return torch.cat([top, top.new_zeros(middle_shape), bottom], dim=1)  # columns past num_cols: zeros

    def apply_fp32(self, x: torch.Tensor) -> torch.Tensor:
        x_ft = torch.fft.rfft2(x.float(), dim=(1, 2))  # (B, H, W // 2 + 1, C)
        return torch.fft.irfft2(self.multiply(x_ft), s=(x.shape[1], x.shape[2]), dim=(1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript applies no autocast
            return self.apply_fp32(x).to(x.dtype)
        return spectral_conv_fp32(self, x).to(x.dtype)  # (B, H, W, C)

    def extra_repr(self) -> str:
        return f"{self.channels}, modes_h={self.modes_h}, modes_w={self.modes_w}"


def spectral_conv_fp32(conv: SpectralConv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` in float32 with autocast off on the tensor's own device; torch.fx records it as one call (the grid
    size selects the kept modes)."""
    if not torch.amp.is_autocast_available(x.device.type):  # e.g. meta: nothing to disable
        return conv.apply_fp32(x)
    with torch.autocast(x.device.type, enabled=False):
        return conv.apply_fp32(x)


torch.fx.wrap("spectral_conv_fp32")


class TokenDifferential(nn.Module):
    """``x + alpha * (x - mean(x))``, with a learned per-channel ``alpha`` (zero at init): a high-pass residual.

    With ``kernel_size`` (default 3) the mean is over the ``k x k`` neighbourhood (borders average what they
    have), so ``x - mean(x)`` keeps edges a global mixer would blur; ``kernel_size=None`` subtracts the mean of
    the whole map, as the original block does.
    """

    def __init__(self, channels: int, kernel_size: int | None = 3, device=None, dtype=None):
        super().__init__()
        if kernel_size is not None and (kernel_size < 1 or kernel_size % 2 == 0):
            raise ValueError(f"kernel_size must be a positive odd number or None (global mean), got {kernel_size}.")
        self.alpha = nn.Parameter(torch.zeros(channels, device=device, dtype=dtype))
        if kernel_size is None:
            self.mean = nn.AdaptiveAvgPool2d(1)  # (B, C, 1, 1), broadcast over the map
        else:
            self.mean = nn.AvgPool2d(kernel_size, 1, kernel_size // 2, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return x + self.alpha * (x - mean)  # (B, H, W, C)


class PDESSMMixer(nn.Module):
    """The original block's mixer: ``y = operator(x) + W_local x`` (global mixing plus a pointwise path), the token
    differential ``y + alpha (y - mean(y))``, then a self-gate ``y * SiLU(W_gate y)``."""

    def __init__(
        self,
        dim: int,
        operator: str = "pde",
        num_heads: int | None = None,
        spectral_modes: int = 2,
        token_diff: str = "local",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if operator not in LEGACY_OPERATORS:
            raise ValueError(f"Unknown operator {operator!r}; choose one of {LEGACY_OPERATORS}.")
        if token_diff not in LEGACY_TOKEN_DIFFS:
            raise ValueError(f"Unknown token_diff {token_diff!r}; choose one of {LEGACY_TOKEN_DIFFS}.")
        dd = {"device": device, "dtype": dtype}
        if operator == "pde":
            self.operator = create_cdr(dim, num_heads=num_heads, **dd)
        else:
            self.operator = SpectralConv2d(dim, spectral_modes, spectral_modes, **dd)
        self.local = nn.Linear(dim, dim, **dd)
        if token_diff == "none":
            self.token_diff = nn.Identity()
        else:
            self.token_diff = TokenDifferential(dim, 3 if token_diff == "local" else None, **dd)
        self.gate = nn.Linear(dim, dim, **dd)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.operator(x) + self.local(x)  # (B, H, W, C)
        x = self.token_diff(x)
        return x * self.act(self.gate(x))


# Keys of the original block's state dict, and where they live here.
_ORIGINAL_KEYS = {
    "spectral.": "mixer.operator.",
    "local_conv.": "mixer.local.",
    "token_diff.": "mixer.token_diff.",
    "gate.0.": "mixer.gate.",
}


def _load_original_keys(module, state_dict, prefix, *args) -> None:
    """Let a state dict of the original block load: rename its keys and reshape its 1x1-conv weight and
    token-differential alpha to this block's channels-last layout."""
    for old, new in _ORIGINAL_KEYS.items():
        for key in [k for k in state_dict if k.startswith(prefix + old)]:
            value = state_dict.pop(key)
            if key == prefix + "local_conv.weight":
                value = value.flatten(1)  # (D, D, 1, 1) -> (D, D)
            elif key == prefix + "token_diff.alpha":
                value = value.flatten()  # (1, D, 1, 1) -> (D,)
            state_dict[prefix + new + key[len(prefix + old) :]] = value


class PDESSMBlock(nn.Module):
    """Pre-norm residual block on token sequences: ``x + mixer(norm(x))``.

    A drop-in replacement for the original block, with the same constructor and call
    (``PDESSMBlock(dim, spatial_size)(x, H, W)`` on ``(B, N, D)``); it also loads the original block's state dicts.
    By default the operator is the CDR operator, with an open boundary, and the token differential is local; any
    ``H, W >= 1`` runs. ``operator='spectral', token_diff='global'`` computes the original block's function (dense
    ``dim x dim`` weights on ``max(2, spatial_size // 2)`` modes, each mode used once on small grids).

    Args:
        dim: channels ``D``.
        spatial_size: only sets the mode count of the ``'spectral'`` operator; any grid runs.
        operator: ``'pde'`` or ``'spectral'``.
        num_heads: heads of the CDR operator's coefficients (``None``: one per channel).
        token_diff: ``'local'`` (3x3 mean), ``'global'`` (the original) or ``'none'``.
    """

    def __init__(
        self,
        dim: int,
        spatial_size: int = 4,
        operator: str = "pde",
        num_heads: int | None = None,
        token_diff: str = "local",
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(dim, **dd)
        self.mixer = PDESSMMixer(dim, operator, num_heads, max(2, spatial_size // 2), token_diff, **dd)
        self.register_load_state_dict_pre_hook(_load_original_keys)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        if x.ndim != 3 or x.shape[1] != H * W:
            raise ValueError(f"Expected tokens of shape (B, H*W, D) = (B, {H * W}, D), got {list(x.shape)}.")
        B, N, D = x.shape
        mixed = self.mixer(self.norm(x).reshape(B, H, W, D))  # (B, H, W, D)
        return x + mixed.reshape(B, N, D)
