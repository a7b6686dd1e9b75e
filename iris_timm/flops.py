"""Multiply-accumulate counts that include the FFT work.

``torch.utils.flop_counter.FlopCounterMode`` counts matrix products and convolutions but not
FFTs, and counts a complex product as if it were real. Here FFTs are counted with the standard
radix-2 estimate (``5 N log2 N`` real flops for a complex transform of ``N`` points, half that for a
real-input or real-output one), complex products at their real cost (a complex multiply-add is four
real ones), and elementwise complex multiplies (a spectral filter's weights) at 6 flops each. Real
elementwise ops are not counted, as in timm's published GMACs. Attention on the CPU (which torch's
counter misses) is counted like attention elsewhere. One MAC is two flops.
"""

import math
from collections.abc import Sequence

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode, bmm_flop, mm_flop, sdpa_flop_count

__all__ = ["count_macs", "count_params", "create_model_for_size"]

aten = torch.ops.aten


def _raw(formula):
    formula._get_raw = True  # FlopCounterMode passes tensors (not only shapes) to such formulas
    return formula


def _fft_flops(signal_shape: Sequence[int], dims: Sequence[int], per_point: float) -> int:
    points = math.prod(signal_shape[d] for d in dims)
    batch = math.prod(signal_shape) // max(points, 1)
    return int(batch * per_point * points * math.log2(max(points, 2)))


@_raw
def _fft_r2c(x, dim, normalization, onesided, *args, out_val=None, **kwargs) -> int:
    return _fft_flops(x.shape, dim, 2.5)


@_raw
def _fft_c2r(x, dim, normalization, last_dim_size, *args, out_val=None, **kwargs) -> int:
    return _fft_flops(out_val.shape, dim, 2.5)


@_raw
def _fft_c2c(x, dim, normalization, forward, *args, out_val=None, **kwargs) -> int:
    return _fft_flops(x.shape, dim, 5.0)


@_raw
def _mul(a, b, *args, out_val=None, **kwargs) -> int:
    is_complex = any(isinstance(t, torch.Tensor) and t.is_complex() for t in (a, b))
    return 6 * out_val.numel() if is_complex else 0


@_raw
def _mm(a, b, *args, out_val=None, **kwargs) -> int:
    return mm_flop(a.shape, b.shape) * (4 if a.is_complex() else 1)


@_raw
def _bmm(a, b, *args, out_val=None, **kwargs) -> int:
    return bmm_flop(a.shape, b.shape) * (4 if a.is_complex() else 1)


@_raw
def _sdpa_cpu(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


_FFT_AWARE_FORMULAS = {
    # The CPU kernel of scaled_dot_product_attention has no formula in torch: attention would count as free.
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
    aten._fft_r2c: _fft_r2c,
    aten._fft_c2r: _fft_c2r,
    aten._fft_c2c: _fft_c2c,
    aten.mul: _mul,
    aten.mm: _mm,
    aten.bmm: _bmm,
}


@torch.no_grad()
def count_macs(model: torch.nn.Module, input_size: Sequence[int], device: str | torch.device | None = None) -> int:
    """Multiply-accumulates of one forward pass in eval mode on one image of ``input_size`` (C, H, W), in the
    model's dtype, on ``device`` (by default the model's); the model is left in the mode it was in."""
    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None else torch.float32
    device = device or (param.device if param is not None else "cpu")
    x = torch.zeros(1, *input_size, device=device, dtype=dtype)
    training = model.training
    try:
        with FlopCounterMode(display=False, custom_mapping=_FFT_AWARE_FORMULAS) as counter:
            model.eval()(x)
    finally:
        model.train(training)
    return counter.get_total_flops() // 2


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def create_model_for_size(name: str, img_size: int) -> torch.nn.Module:
    """``timm.create_model(name)``; models built for one input size (ViTs, Swin) are built for ``img_size``."""
    fixed = timm.get_pretrained_cfg_value(name, "fixed_input_size")
    return timm.create_model(name, **({"img_size": img_size} if fixed else {}))
