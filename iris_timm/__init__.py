"""iris_timm: PDE-SSM vision backbones for timm.

``import iris_timm`` registers the ``iris_*`` models, so ``timm.create_model("iris_pdessm_s")`` works, and so do
``timm.create_model("hf-hub:ORG/NAME")`` and transformers' ``AutoModelForImageClassification`` on saved iris models.
``save_pretrained``, ``push_to_hub`` and ``from_pretrained`` write, publish and read those Hub folders.
"""

from . import layers, models
from .hub import from_pretrained, push_to_hub, save_pretrained
from .models import IrisPDESSM
from .version import __version__

__all__ = ["IrisPDESSM", "__version__", "from_pretrained", "layers", "models", "push_to_hub", "save_pretrained"]
