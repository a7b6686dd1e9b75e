"""Training support for ``train.py`` and the studies (needs the ``train`` extra: ``pip install 'iris-timm[train]'``).

- :mod:`.config`: ``Config``, every setting of a run, read from a recipe and the command line, and checked;
- :mod:`.data` and :mod:`.memory_data`: the dataset's splits and the loaders that feed them to a model;
- :mod:`.trainer`: ``fit(cfg)``, the training itself, with Accelerate;
- :mod:`.run_folder` and :mod:`.clock`: the files a run leaves, and its seconds of training;
- :mod:`.launch`: how the process was launched, and how a launch that cannot train ends.

Errors a user can fix are :class:`TrainingError`; ``train.py`` turns them into one line and an exit status.
"""

from .config import Config, parse_config, validate
from .errors import Interrupted, TrainingError, WrongLaunch
from .run_folder import Summary
from .trainer import fit

__all__ = ["Config", "Interrupted", "Summary", "TrainingError", "WrongLaunch", "fit", "parse_config", "validate"]
