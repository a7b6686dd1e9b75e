"""PDE-SSM token mixers: the global operator, the MetaFormer mixer, and the local/global spatial filters
of the gated and vHeat-style blocks.

All modules here take and return channels-last maps ``(B, H, W, C)``.
"""

import torch
from timm.layers import LayerNorm
from torch import nn

from .cdr import create_cdr
from .spectral import SpectralConv2d
from .token_diff import TokenDifferential

__all__ = [
    "OPERATORS",
    "TOKEN_DIFFS",
    "DepthwiseConv",
    "GlobalOnly",
    "HeatMixer",
    "LocalPlusGlobal",
    "LocalThenGlobal",
    "OperatorSum",
    "PDESSMMixer",
    "create_fourier_operator",
]

OPERATORS = ("pde", "spectral", "pde+spectral")
TOKEN_DIFFS = ("local", "global", "none")


class OperatorSum(nn.Module):
    """Sum of several global operators applied to the same input."""

    def __init__(self, operators: list[nn.Module]):
        super().__init__()
        self.operators = nn.ModuleList(operators)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for operator in self.operators:
            out = out + operator(x)
        return out


def create_fourier_operator(
    kind: str,
    channels: int,
    pde_heads: int | None = None,
    spectral_modes: int = 8,
    spectral_depthwise: bool = True,
    channels_last: bool = True,
    pde_boundary: str = "open",
    pde_modes: int = 6,
    pde_method: str = "modes",
    device=None,
    dtype=None,
) -> nn.Module:
    """Build the global operator of a mixer: ``'pde'`` (the convection–diffusion–reaction operator, see
    :mod:`iris_timm.layers.cdr`), ``'spectral'`` (learned weights on ``spectral_modes`` low modes) or
    ``'pde+spectral'`` (their sum)."""
    dd = {"device": device, "dtype": dtype}

    def pde() -> nn.Module:
        return create_cdr(
            channels,
            pde_method,
            num_heads=pde_heads,
            boundary=pde_boundary,
            modes=pde_modes,
            **dd,
        )

    def spectral() -> nn.Module:
        return SpectralConv2d(
            channels, spectral_modes, spectral_modes, spectral_depthwise, channels_last=channels_last, **dd
        )

    if kind == "pde":
        return pde()
    if kind == "spectral":
        return spectral()
    if kind == "pde+spectral":
        return OperatorSum([pde(), spectral()])
    raise ValueError(f"Unknown operator {kind!r}; choose one of {OPERATORS}.")


class PDESSMMixer(nn.Module):
    """PDE-SSM token mixer of the MetaFormer block.

    ``y = operator(x) + W_local x`` (global mixing plus a pointwise path), then the token differential
    ``y + alpha (y - mean_3x3(y))``, then a self-gate ``y * SiLU(W_gate y)``. Channels mix only in the two
    pointwise layers; no norm or residual here (the block owns them).
    """

    def __init__(
        self,
        dim: int,
        operator: str = "pde",
        pde_heads: int | None = None,
        spectral_modes: int = 8,
        spectral_depthwise: bool = True,
        token_diff: str = "local",
        pde_boundary: str = "open",
        pde_modes: int = 6,
        pde_method: str = "modes",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if token_diff not in TOKEN_DIFFS:
            raise ValueError(f"Unknown token_diff {token_diff!r}; choose one of {TOKEN_DIFFS}.")
        dd = {"device": device, "dtype": dtype}
        self.operator = create_fourier_operator(
            operator,
            dim,
            pde_heads,
            spectral_modes,
            spectral_depthwise,
            channels_last=True,
            pde_boundary=pde_boundary,
            pde_modes=pde_modes,
            pde_method=pde_method,
            **dd,
        )
        self.local = nn.Linear(dim, dim, **dd)
        if token_diff == "none":
            self.token_diff = nn.Identity()
        else:
            kernel_size = 3 if token_diff == "local" else None
            self.token_diff = TokenDifferential(dim, kernel_size, channels_last=True, **dd)
        self.gate = nn.Linear(dim, dim, **dd)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.operator(x) + self.local(x)  # (B, H, W, C)
        x = self.token_diff(x)
        return x * self.act(self.gate(x))


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
    """Spatial filter, in parallel: ``dwconv(x) + norm(operator(x))``.

    The learned depthwise kernel answers to local structure (an oriented edge); the PDE operator, band-limited
    by construction, carries smooth long-range context. The norm puts the operator's output on the scale of the
    convolution's, as vHeat normalises its heat operator's output.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 7,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
        **operator_kwargs,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.local = DepthwiseConv(channels, kernel_size, **dd)
        self.operator = create_fourier_operator("pde", channels, channels_last=True, **operator_kwargs, **dd)
        self.norm = norm_layer(channels, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(x) + self.norm(self.operator(x))  # (B, H, W, C)


class GlobalOnly(nn.Module):
    """Spatial filter, the operator alone: ``norm(operator(x))`` (the ablation without the depthwise conv)."""

    def __init__(
        self,
        channels: int,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
        **operator_kwargs,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.operator = create_fourier_operator("pde", channels, channels_last=True, **operator_kwargs, **dd)
        self.norm = norm_layer(channels, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.operator(x))  # (B, H, W, C)


class LocalThenGlobal(LocalPlusGlobal):
    """Spatial filter, in sequence: ``norm(operator(dwconv(x)))`` (vHeat's order)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.operator(self.local(x)))  # (B, H, W, C)


class HeatMixer(nn.Module):
    """vHeat-style token mixer: ``3x3 dwconv -> linear (x, z) -> operator(x) -> norm -> x * SiLU(z) -> linear``."""

    def __init__(
        self,
        dim: int,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
        **operator_kwargs,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.local = DepthwiseConv(dim, 3, **dd)
        self.in_proj = nn.Linear(dim, 2 * dim, **dd)
        self.operator = create_fourier_operator("pde", dim, channels_last=True, **operator_kwargs, **dd)
        self.norm = norm_layer(dim, **dd)
        self.act = nn.SiLU()
        self.out_proj = nn.Linear(dim, dim, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(self.local(x)).chunk(2, dim=-1)  # (B, H, W, C) each
        x = self.norm(self.operator(x))
        return self.out_proj(x * self.act(z))
