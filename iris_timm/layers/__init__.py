"""Layers of the iris backbones: the convection–diffusion–reaction (CDR) operator, the gated block's spatial filter,
and the stand-alone block compatible with the original one."""

from .cdr import (
    BOUNDARIES,
    CUTOFF_DAMPING,
    ConvectionDiffusionReaction2d,
    DynamicConvectionDiffusionReaction2d,
    create_cdr,
)
from .legacy import PDESSMBlock
from .spatial_filter import SPATIAL_MIXES, DepthwiseConv, LocalPlusGlobal, create_spatial_filter

__all__ = [
    "BOUNDARIES",
    "CUTOFF_DAMPING",
    "SPATIAL_MIXES",
    "ConvectionDiffusionReaction2d",
    "DepthwiseConv",
    "DynamicConvectionDiffusionReaction2d",
    "LocalPlusGlobal",
    "PDESSMBlock",
    "create_cdr",
    "create_spatial_filter",
]
