"""What several test files share: the test-sized iris model, seeded, PDE coefficients that show in the output, and
a finished run's summary. train.py and benchmarks/ live at the repository root, beside the package: the root goes
on the import path. The recipes' datasets are read from the local copies in ../shared/data (IRIS_TIMM_DATA), unless
the environment names other copies."""

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import timm
import torch
from torch import nn

import iris_timm  # noqa: F401  (registers the iris_* models)
from iris_timm.layers import ConvectionDiffusionReaction2d, DynamicConvectionDiffusionReaction2d
from iris_timm.training.data import LOCAL_DATA
from iris_timm.training.run_folder import Summary

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault(LOCAL_DATA, str(ROOT.parent / "shared" / "data"))  # inherited by the train.py processes too

TINY_MODEL = "iris_pdessm_test"


def tiny_model(seed: int = 0, **kwargs) -> nn.Module:
    """The test-sized iris model in eval mode, its initial weights drawn from ``seed``."""
    torch.manual_seed(seed)
    return timm.create_model(TINY_MODEL, **kwargs).eval()


@torch.no_grad()
def randomize_pde(module: nn.Module, seed: int = 0) -> nn.Module:
    """Draw the velocity, reaction and time of every PDE operator in ``module`` (and the per-sample operators'
    coefficient maps), and set layer scales to 0.5.

    At initialisation velocity and reaction are zero and layer scales tiny, so a test comparing two computations
    of the output would not see convection, reaction or the blocks at all."""
    generator = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, ConvectionDiffusionReaction2d):
            m.velocity.copy_(0.2 * torch.randn(m.velocity.shape, generator=generator))
            m.reaction.copy_(0.3 * torch.randn(m.reaction.shape, generator=generator))
            m.log_time.copy_(0.3 * torch.randn(m.log_time.shape, generator=generator))
        if isinstance(m, DynamicConvectionDiffusionReaction2d):
            weight = m.to_coefficients.weight
            weight.copy_(torch.randn(weight.shape, generator=generator) / weight.shape[1] ** 0.5)
        if isinstance(getattr(m, "gamma", None), nn.Parameter):
            m.gamma.fill_(0.5)
    return module


@pytest.fixture
def images() -> torch.Tensor:
    """Two seeded 64x64 RGB inputs."""
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def run_summary(**changes) -> Summary:
    """A finished run's summary: 100 steps in 300 s of training, its other values as ``changes`` give them."""
    summary = Summary(
        top1=50.0,
        best_top1=50.0,
        best_epoch=3,
        steps=100,
        epochs=4.0,
        skipped_steps=0,
        params=2_500_000,
        train_images_per_s=50.0,
        train_time_s=300.0,
        process_wall_time_s=400.0,
        command="python train.py",
    )
    return dataclasses.replace(summary, **changes)
