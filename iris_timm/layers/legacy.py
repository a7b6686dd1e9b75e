"""The stand-alone PDE-SSM block, compatible with the original block.

"Original" means the first PDE-SSM block this project grew from (a ``PDESSMBlock(dim, spatial_size)`` on token
sequences, with an FNO-style spectral convolution and a global token differential). This module keeps a drop-in
replacement for it: the same constructor and call, and it loads the original's state dicts. The backbones in
:mod:`iris_timm.models` do not use it.
"""

import torch
from torch import nn

from .pde_ssm import PDESSMMixer

__all__ = ["PDESSMBlock"]

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
    operator the original docstring promised, with an open boundary; it runs on any ``H, W >= 1``; the token
    differential is local. ``operator='spectral', token_diff='global'`` gives the original computation
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
