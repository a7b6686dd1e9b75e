"""The plugin stands alone: `pip install iris-timm` without extras gives the models, the Hub folders and export."""

import subprocess
import sys

# What the `train` and `bench` extras add (PyYAML comes with timm): the plugin builds models without them.
EXTRAS = ("accelerate", "datasets", "sklearn", "psutil", "matplotlib")

PLUGIN = f"""
import sys
for name in {EXTRAS!r}:
    sys.modules[name] = None  # as if not installed: importing it raises ImportError
import timm, torch
import iris_timm, iris_timm.export, iris_timm.flops
model = timm.create_model("iris_pdessm_t", num_classes=3).eval()
assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
loaded = [name for name in {EXTRAS!r} if sys.modules.get(name) is not None]
print("loaded:", loaded)
"""


def test_the_plugin_imports_and_builds_models_without_the_extras():
    result = subprocess.run([sys.executable, "-c", PLUGIN], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("loaded: []")
