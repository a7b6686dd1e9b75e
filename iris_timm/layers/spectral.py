"""Fourier-space token mixing operators.

Both operators map a real feature map to a real feature map of the same shape through
``irfft2(multiplier ⊙ rfft2(x))``. The FFT math always runs in float32 with autocast
disabled on the tensor's own device (half-precision FFTs lose accuracy and cuFFT refuses
non-power-of-two sizes in half precision); the result is cast back to the input dtype.

Layout: ``channels_last=False`` takes ``(B, C, H, W)``, ``channels_last=True`` takes
``(B, H, W, C)``. The layout is fixed at construction, so ``forward`` has no branches on it.

* :class:`ConvectionDiffusionReaction2d` evaluates a learnable PDE symbol on the input's own
  frequency grid: its parameters do not depend on resolution.
* :class:`SpectralConv2d` learns free complex weights for a fixed number of low Fourier modes
  (FNO / GFNet style). "Modes" are integer frequencies: ``modes_h`` keeps the row frequencies
  ``-modes_h .. modes_h - 1`` and ``modes_w`` the column frequencies ``0 .. modes_w - 1`` (the
  real FFT stores only non-negative column frequencies). A grid too small to hold every kept
  mode simply uses the modes it has; higher frequencies are set to zero.
"""

import math

import torch
from timm.layers import register_notrace_module
from torch import nn

__all__ = ["ConvectionDiffusionReaction2d", "FourierOperator2d", "SpectralConv2d", "fourier_wavenumbers"]


def _signed_frequencies(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer frequencies of an FFT of length ``n`` in FFT order, and the Nyquist mask.

    For even ``n`` the entry at index ``n // 2`` is the Nyquist frequency, reported as ``-n / 2``.
    """
    index = torch.arange(n, device=device, dtype=torch.float32)
    signed = torch.where(2 * index < n, index, index - n)
    return signed, 2 * index == n


def fourier_wavenumbers(
    height: int, width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Angular wavenumbers of an ``rfft2`` of an ``(height, width)`` grid, in content units.

    The grid is read as a domain of unit area with square cells: cell size ``1 / sqrt(H * W)``,
    domain ``sqrt(H / W) x sqrt(W / H)``. The same content sampled on a finer grid therefore has
    the same wavenumbers for the same physical frequencies, and a PDE operator evaluated on
    these wavenumbers acts on the content the same way at every resolution.

    Returns:
        ``k_h`` of shape ``(H, 1)`` and ``k_w`` of shape ``(1, W // 2 + 1)`` for the diffusion
        term, and the same two with the Nyquist frequency of even sizes set to zero for the
        convection term: an odd (imaginary) symbol at Nyquist is not representable by a real
        operator, so zeroing it keeps the operator real and exactly equal to a full complex FFT.
    """
    cell = 1.0 / math.sqrt(height * width)
    m_h, nyquist_h = _signed_frequencies(height, device)
    m_w = torch.arange(width // 2 + 1, device=device, dtype=torch.float32)
    nyquist_w = 2 * m_w == width
    k_h = (2 * math.pi / (height * cell)) * m_h
    k_w = (2 * math.pi / (width * cell)) * m_w
    k_h_conv = torch.where(nyquist_h, torch.zeros_like(k_h), k_h)
    k_w_conv = torch.where(nyquist_w, torch.zeros_like(k_w), k_w)
    return k_h[:, None], k_w[None, :], k_h_conv[:, None], k_w_conv[None, :]


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
        if torch.jit.is_scripting():  # TorchScript applies no autocast (and needs a constant device type)
            y = self._apply_fp32(x)
        else:
            with torch.autocast(device_type=x.device.type, enabled=False):
                y = self._apply_fp32(x)
        return y.to(x.dtype)


@register_notrace_module  # shapes drive the wavenumber grid: a leaf for torch.fx
class ConvectionDiffusionReaction2d(FourierOperator2d):
    """Learnable convection–diffusion–reaction operator, applied as a Fourier symbol.

    Each channel evolves for a learnable time ``t`` under ``∂u/∂t = D ∇²u − v·∇u + r u``,
    whose exact solution in Fourier space is

        û(k) ← exp(t · (−D |k|² − i v·k + r)) · û(k)

    with diffusion ``D ≥ 0``, velocity ``v ∈ R²``, reaction ``r`` and time ``t > 0`` shared by
    the channels of one head. In space this is a Gaussian blur of width ``sqrt(2 t D)``, shifted
    by ``t v`` (periodic boundary), scaled by ``exp(t r)``. The symbol is evaluated on the
    input's own wavenumber grid (see :func:`fourier_wavenumbers`), so the parameter count and
    meaning are independent of resolution and one set of weights runs at any size.
    Channels are not mixed here; that is left to pointwise layers.

    Args:
        channels: number of channels.
        num_heads: groups of channels sharing one set of coefficients; ``None`` = one per channel.
        channels_last: input layout ``(B, H, W, C)`` if True, else ``(B, C, H, W)``.
        diffusion_range: initial ``D`` is log-uniform over heads in this range (content units).
            The defaults put the blur width between about one cell of a 56×56 grid and a
            third of the image, so heads start at many scales.
        max_initial_shift: initial velocities are uniform in ``[-s, s]²`` (content units).
    """

    def __init__(
        self,
        channels: int,
        num_heads: int | None = None,
        channels_last: bool = False,
        diffusion_range: tuple[float, float] = (1e-5, 3e-2),
        max_initial_shift: float = 0.02,
        device=None,
        dtype=None,
    ):
        super().__init__(channels_last)
        num_heads = num_heads or channels
        if channels % num_heads:
            raise ValueError(f"channels ({channels}) must be divisible by num_heads ({num_heads}).")
        dd = {"device": device, "dtype": dtype}
        self.channels = channels
        self.num_heads = num_heads
        self.diffusion_range = diffusion_range
        self.max_initial_shift = max_initial_shift
        self.log_diffusion = nn.Parameter(torch.empty(num_heads, **dd))
        self.velocity = nn.Parameter(torch.empty(num_heads, 2, **dd))
        self.reaction = nn.Parameter(torch.empty(num_heads, **dd))
        self.log_time = nn.Parameter(torch.empty(num_heads, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        low, high = (math.log(d) for d in self.diffusion_range)
        with torch.no_grad():
            self.log_diffusion.copy_(torch.linspace(low, high, self.num_heads))
            self.velocity.uniform_(-self.max_initial_shift, self.max_initial_shift)
            self.reaction.zero_()
            self.log_time.zero_()

    def symbol(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """The complex multiplier on an ``rfft2`` grid: ``(C, H, W // 2 + 1)``, or ``(H, W // 2 + 1, C)``
        when ``channels_last``.

        The symbol factorises, ``exp(t r) · exp(−t D k_h² − i t v_h k_h) · exp(−t D k_w² − i t v_w k_w)``, so
        the exponentials are taken on the ``H + W // 2 + 1`` wavenumbers of each axis and the grid costs one
        complex product per point. Nothing depends on the grid but two short wavenumber vectors, so there
        is nothing worth caching across calls.
        """
        k_h, k_w, k_h_conv, k_w_conv = fourier_wavenumbers(height, width, device)
        time = self.log_time.float().exp()  # (heads,)
        rate = time * self.log_diffusion.float().exp()
        drift = time[:, None] * self.velocity.float()  # (heads, 2)
        row_re, row_im = self._axis_factor(k_h, k_h_conv, rate, drift[:, 0], time * self.reaction.float())  # (H, C)
        col_re, col_im = self._axis_factor(k_w.t(), k_w_conv.t(), rate, drift[:, 1], torch.zeros_like(rate))
        if self.channels_last:  # (H, 1, C) x (1, Wr, C)
            row_re, row_im, col_re, col_im = row_re[:, None], row_im[:, None], col_re[None], col_im[None]
        else:  # (C, H, 1) x (C, 1, Wr)
            row_re, row_im = row_re.t()[:, :, None], row_im.t()[:, :, None]
            col_re, col_im = col_re.t()[:, None, :], col_im.t()[:, None, :]
        # The outer product in real arithmetic (the ONNX exporter broadcasts no complex tensor).
        return torch.complex(row_re * col_re - row_im * col_im, row_re * col_im + row_im * col_re)

    def _axis_factor(
        self, k: torch.Tensor, k_conv: torch.Tensor, rate: torch.Tensor, drift: torch.Tensor, log_gain: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Real and imaginary parts of ``exp(log_gain − rate k² − i drift k_conv)`` on one axis:
        ``(K, 1)`` wavenumbers -> two ``(K, C)``."""
        per_head = self.channels // self.num_heads
        magnitude = (log_gain - rate * k**2).exp().repeat_interleave(per_head, dim=-1)  # (K, C)
        phase = (-drift * k_conv).repeat_interleave(per_head, dim=-1)
        return magnitude * phase.cos(), magnitude * phase.sin()

    def multiply(self, x_ft: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return x_ft * self.symbol(height, width, x_ft.device)

    def extra_repr(self) -> str:
        return f"{self.channels}, num_heads={self.num_heads}, channels_last={self.channels_last}"


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
