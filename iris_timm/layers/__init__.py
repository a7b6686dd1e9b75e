"""PDE-SSM layers: the convection–diffusion–reaction operator, the gated block's spatial filter, and the stand-alone
(original-compatible) block."""

from .cdr import (
    BOUNDARIES,
    CUTOFF_DAMPING,
    ConvectionDiffusionReaction2d,
    ModesConvectionDiffusionReaction2d,
    create_cdr,
)
from .legacy import PDESSMBlock
from .pde_ssm import SPATIAL_MIXES, DepthwiseConv, LocalPlusGlobal, create_spatial_filter

__all__ = [
    "BOUNDARIES",
    "CUTOFF_DAMPING",
    "SPATIAL_MIXES",
    "ConvectionDiffusionReaction2d",
    "DepthwiseConv",
    "LocalPlusGlobal",
    "ModesConvectionDiffusionReaction2d",
    "PDESSMBlock",
    "create_cdr",
    "create_spatial_filter",
]
