"""Learned Fourier weights on a fixed number of low modes (FNO / GFNet style).

The operator maps a real feature map to a real feature map of the same shape through
``irfft2(multiplier ⊙ rfft2(x))``. The FFT math always runs in float32 with autocast
disabled on the tensor's own device (half-precision FFTs lose accuracy and cuFFT refuses
non-power-of-two sizes in half precision); the result is cast back to the input dtype.

Layout: ``channels_last=False`` takes ``(B, C, H, W)``, ``channels_last=True`` takes
``(B, H, W, C)``. The layout is fixed at construction, so ``forward`` has no branches on it.

:class:`SpectralConv2d` learns free complex weights for a fixed number of low Fourier modes.
"Modes" are integer frequencies: ``modes_h`` keeps the row frequencies ``-modes_h .. modes_h - 1``
and ``modes_w`` the column frequencies ``0 .. modes_w - 1`` (the real FFT stores only non-negative
column frequencies). A grid too small to hold every kept mode simply uses the modes it has; higher
frequencies are set to zero. The domain is periodic (GFNet's); the convection–diffusion–reaction
operator in :mod:`iris_timm.layers.cdr` has an open boundary.
"""

import math

import torch
from timm.layers import register_notrace_module
from torch import nn

__all__ = ["DFT_MAX_POINTS", "FourierOperator2d", "SpectralConv2d"]


def _dft_matrices(size: int, frequencies: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of the DFT angles ``2π k n / size``: two ``(frequencies, size)`` matrices.

    The product ``k n`` is reduced modulo ``size`` in integers first, so the angles stay exact in float32.
    """
    k = torch.arange(frequencies, device=device)[:, None]
    n = torch.arange(size, device=device)[None, :]
    angle = (2 * math.pi / size) * torch.remainder(k * n, size).float()
    return angle.cos(), angle.sin()


def _along(x: torch.Tensor, matrix: torch.Tensor, dim: int) -> torch.Tensor:
    """Apply ``matrix`` (K, N) to dimension ``dim`` (of size N) of ``x``; that dimension becomes K."""
    return torch.matmul(matrix, x.movedim(dim, -2)).movedim(-2, dim)


# Grids with at most this many points (H * W) use the matrix-product DFT; larger ones the FFT. On the CPU
# (pocketfft, 1 thread, the stage grids of the models at batch 1 and 8) the FFT was as fast or faster on every
# grid from 7x7 to 56x56 (README, "Benchmarks"), so by default every grid takes the FFT; the matrix product
# serves export (iris_timm.export) and devices where small FFTs are launch-bound.
DFT_MAX_POINTS = 0


class FourierOperator2d(nn.Module):
    """Base class: ``irfft2(multiply(rfft2(x)))`` in float32, on either layout.

    Two implementations of the transforms compute the same spectrum (same layout, same values to float32
    rounding), so ``multiply`` is shared:

    * the FFT (``torch.fft``), O(N log N): for large grids;
    * the DFT as dense matrix products along each axis, O(N (H + W)): plain ``matmul``, faster than the FFT
      on small grids (few points, large batch of channels) and exportable to ONNX, which has no 2-D real FFT.

    Grids with ``H * W <= dft_max_points`` take the matrix product. The default, :data:`DFT_MAX_POINTS`, is
    measured on the CPU; :func:`iris_timm.export.dft_everywhere` raises it for export.
    """

    def __init__(self, channels_last: bool = False, dft_max_points: int = DFT_MAX_POINTS):
        super().__init__()
        self.channels_last = channels_last
        self.dft_max_points = dft_max_points
        # Spatial dims of the input, and the dim that holds channels in the spectrum.
        self.fft_dims: tuple[int, int] = (1, 2) if channels_last else (2, 3)

    def multiply(self, x_ft: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Apply the multiplier to the ``rfft2`` spectrum of a ``height x width`` input (same layout)."""
        raise NotImplementedError

    def rdft2(self, x: torch.Tensor) -> torch.Tensor:
        """``torch.fft.rfft2(x, dim=self.fft_dims)`` as matrix products."""
        h_dim, w_dim = self.fft_dims
        height, width = x.shape[h_dim], x.shape[w_dim]
        cos_w, sin_w = _dft_matrices(width, width // 2 + 1, x.device)  # (Wr, W)
        cos_h, sin_h = _dft_matrices(height, height, x.device)  # (H, H), symmetric
        real, imag = _along(x, cos_w, w_dim), -_along(x, sin_w, w_dim)  # real input along W
        # Complex DFT along H: (cos - i sin)(real + i imag).
        real, imag = (
            _along(real, cos_h, h_dim) + _along(imag, sin_h, h_dim),
            _along(imag, cos_h, h_dim) - _along(real, sin_h, h_dim),
        )
        return torch.complex(real, imag)

    def irdft2(self, x_ft: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """``torch.fft.irfft2(x_ft, s=(height, width), dim=self.fft_dims)`` as matrix products.

        Like the real inverse FFT, it reads each column ``k`` of the half spectrum as standing for ``k`` and
        ``-k`` (weight 2), except column 0 and, for even widths, the Nyquist column (weight 1, imaginary
        part ignored, since ``sin`` vanishes there). Columns missing from a truncated spectrum count as zero.
        """
        h_dim, w_dim = self.fft_dims
        columns = x_ft.shape[w_dim]  # W // 2 + 1, or fewer
        cos_h, sin_h = _dft_matrices(height, height, x_ft.device)  # (H, H)
        cos_w, sin_w = _dft_matrices(width, columns, x_ft.device)  # (columns, W)
        column = torch.arange(columns, device=x_ft.device)[None, :]
        weight = torch.where((column == 0) | (2 * column == width), 1.0, 2.0) / (height * width)  # (1, columns)
        real, imag = x_ft.real, x_ft.imag
        # Complex inverse DFT along H: (cos + i sin)(real + i imag), unnormalised.
        real, imag = (
            _along(real, cos_h, h_dim) - _along(imag, sin_h, h_dim),
            _along(imag, cos_h, h_dim) + _along(real, sin_h, h_dim),
        )
        return _along(real, cos_w.t() * weight, w_dim) - _along(imag, sin_w.t() * weight, w_dim)  # real part

    def _apply_fp32(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[self.fft_dims[0]], x.shape[self.fft_dims[1]]
        x = x.float()
        if height * width <= self.dft_max_points:
            return self.irdft2(self.multiply(self.rdft2(x), height, width), height, width)
        x_ft = torch.fft.rfft2(x, dim=self.fft_dims)
        return torch.fft.irfft2(self.multiply(x_ft, height, width), s=(height, width), dim=self.fft_dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript applies no autocast
            y = self._apply_fp32(x)
        else:
            y = apply_float32(self, x)
        return y.to(x.dtype)


def apply_float32(operator: FourierOperator2d, x: torch.Tensor) -> torch.Tensor:
    """The operator in float32 with autocast off; torch.fx records it as one call (the grid size drives it)."""
    if not torch.amp.is_autocast_available(x.device.type):  # e.g. meta: nothing to disable
        return operator._apply_fp32(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        return operator._apply_fp32(x)


torch.fx.wrap("apply_float32")


@register_notrace_module  # shapes select the kept modes: a leaf for torch.fx
class SpectralConv2d(FourierOperator2d):
    """Learned complex weights on a fixed number of low Fourier modes (FNO, GFNet).

    ``depthwise=False`` holds a dense ``C x C`` complex matrix per mode (FNO, as the original
    block); ``depthwise=True`` holds one complex weight per channel and mode (GFNet's global
    filter), ``C`` times fewer parameters. Weights are stored as real tensors with a trailing
    ``(real, imag)`` dimension. The mode count is fixed at construction and independent of the
    grid the operator runs on (see the module docstring for what modes mean).
    """

    def __init__(
        self,
        channels: int,
        modes_h: int,
        modes_w: int,
        depthwise: bool = False,
        channels_last: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__(channels_last)
        if modes_h < 1 or modes_w < 1:
            raise ValueError(f"modes_h and modes_w must be >= 1, got {modes_h} and {modes_w}.")
        dd = {"device": device, "dtype": dtype}
        self.channels = channels
        self.modes_h = modes_h
        self.modes_w = modes_w
        self.depthwise = depthwise
        weight_shape = (channels, modes_h, modes_w, 2) if depthwise else (channels, channels, modes_h, modes_w, 2)
        # weight_pos[..., i, j, :] multiplies row frequency i, weight_neg[..., i, j, :] row frequency i - modes_h.
        self.weight_pos = nn.Parameter(torch.empty(weight_shape, **dd))
        self.weight_neg = nn.Parameter(torch.empty(weight_shape, **dd))
        spectrum = "bxyc" if channels_last else "bcxy"
        if depthwise:
            self.equation = f"{spectrum},cxy->{spectrum}"
        else:
            self.equation = f"{spectrum.replace('c', 'i')},ioxy->{spectrum.replace('c', 'o')}"
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Dense: the original block's 1 / C² scale. Depthwise: GFNet's 0.02.
        std = 0.02 if self.depthwise else 1.0 / (self.channels * self.channels)
        nn.init.normal_(self.weight_pos, std=std)
        nn.init.normal_(self.weight_neg, std=std)

    def multiply(self, x_ft: torch.Tensor, height: int, width: int) -> torch.Tensor:
        h_dim, w_dim = self.fft_dims
        # Row frequencies 0 .. ceil(H/2)-1 are non-negative, the other H // 2 rows negative: disjoint.
        num_pos = min(self.modes_h, (height + 1) // 2)
        num_neg = min(self.modes_h, height // 2)
        num_cols = min(self.modes_w, x_ft.shape[w_dim])
        weight_pos = torch.view_as_complex(self.weight_pos.float())[..., :num_pos, :num_cols]
        weight_neg = torch.view_as_complex(self.weight_neg.float())[..., self.modes_h - num_neg :, :num_cols]
        x_ft = x_ft.narrow(w_dim, 0, num_cols)
        top = torch.einsum(self.equation, x_ft.narrow(h_dim, 0, num_pos), weight_pos)
        bottom = torch.einsum(self.equation, x_ft.narrow(h_dim, height - num_neg, num_neg), weight_neg)
        middle_shape = list(top.shape)
        middle_shape[h_dim] = height - num_pos - num_neg
        # Columns past num_cols are zero-filled by irfft2; the skipped rows are zero-filled here.
        return torch.cat([top, top.new_zeros(middle_shape), bottom], dim=h_dim)

    def extra_repr(self) -> str:
        return (
            f"{self.channels}, modes_h={self.modes_h}, modes_w={self.modes_w}, "
            f"depthwise={self.depthwise}, channels_last={self.channels_last}"
        )
