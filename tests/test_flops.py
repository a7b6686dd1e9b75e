"""MAC counting, with the FFT work included."""

import math

import pytest
import timm
import torch
from torch import nn

from iris_timm.flops import count_macs


class FourierFilter(nn.Module):
    """A real FFT, a complex multiplier on the whole spectrum, and the inverse FFT."""

    def __init__(self, channels: int, height: int, width: int):
        super().__init__()
        self.multiplier = nn.Parameter(torch.randn(channels, height, width // 2 + 1, 2))  # real, imaginary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft2(x) * torch.view_as_complex(self.multiplier)
        return torch.fft.irfft2(spectrum, s=x.shape[-2:])


def test_fft_macs_follow_the_fft_formula():
    C, H, W = 8, 16, 12
    n = H * W
    fft_flops = 2 * C * 2.5 * n * math.log2(n)  # rfft2 and irfft2
    multiply_flops = 6 * C * H * (W // 2 + 1)  # complex multiplier times spectrum
    expected = int(fft_flops + multiply_flops) // 2
    assert abs(count_macs(FourierFilter(C, H, W), (C, H, W)) - expected) <= C  # rounding per op


def test_linear_and_attention_macs():
    assert count_macs(torch.nn.Linear(10, 7), (3, 10)) == 3 * 10 * 7
    vit = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=0)
    tokens, dim = 197, 192
    linear = tokens * (3 * dim * dim + dim * dim + 8 * dim * dim)
    attention = 2 * tokens * tokens * dim  # q @ k^T and attn @ v, on the CPU kernel too
    patch_embed = 196 * 3 * 16 * 16 * dim
    assert count_macs(vit, (3, 224, 224)) == linear + attention + patch_embed


@pytest.mark.parametrize("training", [True, False])
def test_counting_leaves_the_model_in_its_mode(training):
    model = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.Dropout()).train(training)
    assert count_macs(model, (3, 10)) == 3 * 10 * 7  # counted in eval mode
    assert all(m.training is training for m in model.modules())
