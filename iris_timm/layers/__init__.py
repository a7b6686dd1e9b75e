"""PDE-SSM layers: the convection–diffusion–reaction operator, learned Fourier weights, the token differential,
the mixers and spatial filters of the blocks, and the stand-alone (original-compatible) block."""

from .cdr import (
    BOUNDARIES,
    CDR_METHODS,
    CUTOFF_DAMPING,
    ConvectionDiffusionReaction2d,
    FFTConvectionDiffusionReaction2d,
    ModesConvectionDiffusionReaction2d,
    SeparableConvectionDiffusionReaction2d,
    create_cdr,
)
from .legacy import PDESSMBlock
from .pde_ssm import (
    OPERATORS,
    TOKEN_DIFFS,
    DepthwiseConv,
    GlobalOnly,
    HeatMixer,
    LocalPlusGlobal,
    LocalThenGlobal,
    OperatorSum,
    PDESSMMixer,
    create_fourier_operator,
)
from .spectral import DFT_MAX_POINTS, FourierOperator2d, SpectralConv2d
from .token_diff import TokenDifferential

__all__ = [
    "BOUNDARIES",
    "CDR_METHODS",
    "CUTOFF_DAMPING",
    "DFT_MAX_POINTS",
    "OPERATORS",
    "TOKEN_DIFFS",
    "ConvectionDiffusionReaction2d",
    "DepthwiseConv",
    "FFTConvectionDiffusionReaction2d",
    "FourierOperator2d",
    "GlobalOnly",
    "HeatMixer",
    "LocalPlusGlobal",
    "LocalThenGlobal",
    "ModesConvectionDiffusionReaction2d",
    "OperatorSum",
    "PDESSMBlock",
    "PDESSMMixer",
    "SeparableConvectionDiffusionReaction2d",
    "SpectralConv2d",
    "TokenDifferential",
    "create_cdr",
    "create_fourier_operator",
]
