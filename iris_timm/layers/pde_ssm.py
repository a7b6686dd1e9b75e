"""The PDE-SSM token mixer and the stand-alone PDE-SSM block."""

import torch
from torch import nn

from .spectral import ConvectionDiffusionReaction2d, SpectralConv2d
from .token_diff import TokenDifferential

__all__ = ["OPERATORS", "TOKEN_DIFFS", "OperatorSum", "PDESSMBlock", "PDESSMMixer", "create_fourier_operator"]

OPERATORS = ("pde", "spectral", "pde+spectral")
TOKEN_DIFFS = ("local", "global", "none")


class OperatorSum(nn.Module):
    """Sum of several Fourier operators applied to the same input."""

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
    device=None,
    dtype=None,
) -> nn.Module:
    """Build the global operator of a mixer: ``'pde'`` (the convection–diffusion–reaction symbol),
    ``'spectral'`` (learned weights on ``spectral_modes`` low modes) or ``'pde+spectral'`` (their sum)."""
    dd = {"device": device, "dtype": dtype}

    def pde() -> nn.Module:
        return ConvectionDiffusionReaction2d(channels, pde_heads, channels_last=channels_last, **dd)

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
    """PDE-SSM token mixer on ``(B, H, W, C)``.

    ``y = operator(x) + W_local x`` (global Fourier mixing plus a pointwise path), then the token
    differential ``y + alpha (y - mean_3x3(y))``, then a self-gate ``y * SiLU(W_gate y)``.
    Channels mix only in the two pointwise layers; no norm or residual here (the block owns them).
    """

    def __init__(
        self,
        dim: int,
        operator: str = "pde",
        pde_heads: int | None = None,
        spectral_modes: int = 8,
        spectral_depthwise: bool = True,
        token_diff: str = "local",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if token_diff not in TOKEN_DIFFS:
            raise ValueError(f"Unknown token_diff {token_diff!r}; choose one of {TOKEN_DIFFS}.")
        dd = {"device": device, "dtype": dtype}
        self.operator = create_fourier_operator(
            operator, dim, pde_heads, spectral_modes, spectral_depthwise, channels_last=True, **dd
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


# Keys of the original block's state dict, and where they live here.
_ORIGINAL_KEYS = {
    "spectral.": "mixer.operator.",
    "local_conv.": "mixer.local.",
    "token_diff.": "mixer.token_diff.",
    "gate.0.": "mixer.gate.",
}


def _load_original_keys(module, state_dict, prefix, *args) -> None:
    """Let a state dict of the original block load: rename its keys and reshape its 1x1-conv
    weight and token-differential alpha to this block's channels-last layout."""
    for old, new in _ORIGINAL_KEYS.items():
        for key in [k for k in state_dict if k.startswith(prefix + old)]:
            value = state_dict.pop(key)
            if key == prefix + "local_conv.weight":
                value = value.flatten(1)  # (D, D, 1, 1) -> (D, D)
            elif key == prefix + "token_diff.alpha":
                value = value.flatten()  # (1, D, 1, 1) -> (D,)
            state_dict[prefix + new + key[len(prefix + old) :]] = value


class PDESSMBlock(nn.Module):
    """Pre-norm residual PDE-SSM block on token sequences: ``x + mixer(norm(x))``.

    A drop-in replacement for the original block, with the same constructor and call
    (``PDESSMBlock(dim, spatial_size)(x, H, W)`` on ``(B, N, D)``); it also loads the original
    block's state dicts. What changed: the default operator is the convection–diffusion–reaction
    symbol the original docstring promised; runs on any ``H, W >= 1``; the token differential
    is local. ``operator='spectral', token_diff='global'`` gives the original computation
    (dense ``dim x dim`` weights on ``max(2, spatial_size // 2)`` modes), fixed for small grids.

    Args:
        dim: channels ``D``.
        spatial_size: only sets the mode count of the ``'spectral'`` operator; any grid runs.
        operator: ``'pde'``, ``'spectral'`` or ``'pde+spectral'``.
        num_heads: heads of PDE coefficients (``None``: one per channel).
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
        self.mixer = PDESSMMixer(
            dim,
            operator,
            pde_heads=num_heads,
            spectral_modes=max(2, spatial_size // 2),
            spectral_depthwise=False,
            token_diff=token_diff,
            **dd,
        )
        self.register_load_state_dict_pre_hook(_load_original_keys)

    def forward(self, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
        if x.ndim != 3 or x.shape[1] != H * W:
            raise ValueError(f"Expected tokens of shape (B, H*W, D) = (B, {H * W}, D), got {list(x.shape)}.")
        B, N, D = x.shape
        mixed = self.mixer(self.norm(x).reshape(B, H, W, D))  # (B, H, W, D)
        return x + mixed.reshape(B, N, D)
