"""Model families; importing this module registers them with timm."""

from .pdessm import IrisPDESSM

__all__ = ["IrisPDESSM"]
