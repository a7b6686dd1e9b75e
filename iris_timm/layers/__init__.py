"""PDE-SSM layers: Fourier operators, the token differential, the mixer and the stand-alone block."""

from .pde_ssm import OPERATORS, TOKEN_DIFFS, OperatorSum, PDESSMBlock, PDESSMMixer, create_fourier_operator
from .spectral import (
    DFT_MAX_POINTS,
    ConvectionDiffusionReaction2d,
    FourierOperator2d,
    SpectralConv2d,
    fourier_wavenumbers,
)
from .token_diff import TokenDifferential

__all__ = [
    "DFT_MAX_POINTS",
    "OPERATORS",
    "TOKEN_DIFFS",
    "ConvectionDiffusionReaction2d",
    "FourierOperator2d",
    "OperatorSum",
    "PDESSMBlock",
    "PDESSMMixer",
    "SpectralConv2d",
    "TokenDifferential",
    "create_fourier_operator",
    "fourier_wavenumbers",
]
