"""iris_timm: PDE-SSM vision backbones for timm.

``import iris_timm`` registers the ``iris_*`` models, so ``timm.create_model("iris_pdessm_s")`` works.
"""

from . import layers, models
from .models import IrisPDESSM

__version__ = "0.1.0"

__all__ = ["IrisPDESSM", "__version__", "layers", "models"]
