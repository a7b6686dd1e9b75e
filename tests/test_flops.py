"""MAC counting, with the FFT work included."""

import math

import timm
import torch

from iris_timm.flops import count_macs
from iris_timm.layers import ConvectionDiffusionReaction2d


def test_fourier_operator_macs_follow_the_fft_formula():
    C, H, W = 8, 16, 12
    n = H * W
    fft_flops = 2 * C * 2.5 * n * math.log2(n)  # rfft2 and irfft2
    multiply_flops = 6 * C * H * (W // 2 + 1)  # complex symbol times spectrum
    expected = int(fft_flops + multiply_flops) // 2
    assert abs(count_macs(ConvectionDiffusionReaction2d(C), (C, H, W)) - expected) <= C  # rounding per op


def test_linear_and_attention_macs():
    assert count_macs(torch.nn.Linear(10, 7), (3, 10)) == 3 * 10 * 7
    vit = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=0)
    tokens, dim = 197, 192
    linear = tokens * (3 * dim * dim + dim * dim + 8 * dim * dim)
    attention = 2 * tokens * tokens * dim  # q @ k^T and attn @ v, on the CPU kernel too
    patch_embed = 196 * 3 * 16 * 16 * dim
    assert count_macs(vit, (3, 224, 224)) == linear + attention + patch_embed
