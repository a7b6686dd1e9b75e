"""The convection–diffusion–reaction (CDR) operator: a learnable PDE as a global token mixer.

Each channel evolves for a learnable time ``t`` under ``∂u/∂t = D ∇²u − v·∇u + r u``. On an unbounded
domain the exact solution is a convolution with a kernel that is a Gaussian of variance ``2 t D`` per axis,
shifted by ``t v`` and scaled by ``exp(t r)``; in Fourier space it is the symbol

    S(k) = exp(−(τ₀ + t D) |k|² − i t v·k + t r),

where ``τ₀`` is the operator's *cut-off diffusion* (``cutoff_diffusion``, below). Coefficients live in content
units: the image is a domain of unit area with square cells, so one set of weights acts on the same content the
same way at every size.

Boundary
    ``boundary="open"`` (the default) treats the image as lying on an unbounded plane with zeros outside, exactly
    as a zero-padded convolution does: content convected past an edge leaves the image, and blur does not mix
    opposite borders. It is computed on a period of twice the image side per axis (an implicit zero padding,
    which costs nothing in the mode transforms: they only evaluate basis functions on the image's own cells).
    Zero padding, rather than an even reflection, is used because it is the boundary of every convolution in the
    network and makes the operator a plain linear convolution with its kernel, which tests can check directly.
    The open form is exact while the kernel's reach (shift plus about 4 blur widths) stays under one image side;
    past it the kernel's tail wraps once around the doubled period. ``boundary="periodic"`` keeps the wrap-around
    torus (GFNet's and the FFT's natural domain).

Cut-off and modes
    ``modes`` sets a cut-off in content units: the operator keeps the wavenumbers ``|k| ≤ π·modes`` per axis
    (rounded up to the next frequency of the grid), which on a square image's open (doubled) period are the
    integer frequencies ``0 .. modes``; on a non-square image each axis keeps as many as its content length
    holds, and on the periodic domain half as many.
    The cut-off does not depend on the grid, so the cost is linear in pixels. So that the cut modes carry
    nothing, the symbol always includes a fixed diffusion ``τ₀ = ln(1 / CUTOFF_DAMPING) / (π·modes)²``: every
    cut mode is damped below ``CUTOFF_DAMPING`` (times the reaction gain ``exp(t r)``) before it is cut, which
    bounds the truncation error. The operator is therefore a smooth, global mixer (its narrowest blur has width
    ``sqrt(2 τ₀) ≈ 1.18 / modes`` of the image side); detail finer than that is the block's local path's job.

Implementation
    The kept modes as matrix products: a real cosine/sine transform along H, then along W, the symbol as a 2×2
    rotation per mode and channel, and the inverse transforms. Ordinary GEMMs: they run in the autocast dtype with
    float32 accumulation, on tensor cores, on any grid. Cost per pixel and channel about ``4·(modes + 1)``
    multiply-adds on large grids (the two transforms along H; those along W act on the already reduced map); exact
    up to the cut-off damping. Where the kept modes would not reduce the map (grids of at most :data:`DENSE_MAX_SIZE`
    cells a side, or every mode kept) the same modes apply as one dense matrix per channel and axis. Eager PyTorch
    caches the transforms per grid and differentiates through a hand-written backward.

Export
    Where the grid's size is a symbol of a recorded graph (``torch.export`` with dynamic shapes, and so
    ``torch.onnx.export(..., dynamo=True)``; ``torch.jit.trace``, and so ``dynamo=False``), the transforms are built
    inside the graph from the input's size, so a graph exported with a free image size computes the same operator
    at every size: the frequencies up to a bound that holds at every aspect ratio, the ones past the cut-off masked
    out.
"""

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import nn

__all__ = [
    "BOUNDARIES",
    "CUTOFF_DAMPING",
    "DENSE_MAX_SIZE",
    "ConvectionDiffusionReaction2d",
    "DynamicConvectionDiffusionReaction2d",
    "create_cdr",
]

BOUNDARIES = ("open", "periodic")
# The symbol's magnitude, relative to the reaction gain, at the cut-off wavenumber π·modes.
CUTOFF_DAMPING = 1e-3
# On grids with no side longer than this, the kept modes do not reduce the map (2 (modes + 1) real coefficients per
# axis): the operator applies as one dense matrix per channel and axis instead of through the transforms.
DENSE_MAX_SIZE = 16


def _kept(
    frequencies: torch.Tensor, period: torch.Tensor, size: torch.Tensor, other: torch.Tensor, reach: int
) -> torch.Tensor:
    """Which integer ``frequencies`` of a real transform over ``period`` samples the cut-off keeps, on an axis of
    ``size`` cells (the other axis has ``other``): at most ``period // 2``, and up to the first whose wavenumber
    ``2π m / (period · cell)`` reaches ``π·modes`` (so every cut one lies above it). With ``reach = modes · period /
    size`` (``0``: no cut-off) it reaches it where ``4 m² · other >= reach² · size``: exact in integers, and operations
    an exporter records on sizes that are symbols of the graph."""
    keep = 2 * frequencies <= period
    if reach:
        below = frequencies - 1
        keep = keep & ((frequencies == 0) | (4 * below * below * other < reach * reach * size))
    return keep


def _bases(
    frequencies: torch.Tensor, period: int, size: int, keep: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real transform of ``size`` cells over ``period`` samples, on the kept ``frequencies`` (``M``):

    * analysis ``(2M, size)``: rows ``cos`` then ``sin`` of ``2π m j / period``, over ``sqrt(period)``;
    * synthesis ``(size, 2M)``: its inverse on the real half spectrum, cropped to the ``size`` cells: a frequency
      ``m`` stands for ``±m`` (weight 2), except 0 and the Nyquist frequency (weight 1), and for nothing where
      ``keep`` is false.

    ``m · j`` is reduced modulo the period in integers first, so the angles stay exact in float32. In a recorded
    graph ``period`` is a tensor and ``size`` a symbol (:func:`_graph_axis_bases`).
    """
    j = torch.arange(size, device=frequencies.device)
    angle = (2 * math.pi / period) * torch.remainder(frequencies[:, None] * j[None, :], period).float()
    analysis = torch.cat([angle.cos(), angle.sin()]) / period**0.5  # (2M, size)
    weight = 2.0 - ((frequencies == 0) | (2 * frequencies == period)).float()
    if keep is not None:
        weight = weight * keep
    # Contiguous: a transposed view sends the batched GEMMs down a path several times slower on the CPU.
    return analysis, (analysis * weight.repeat(2)[:, None]).t().contiguous()


def _axis_bases(
    size: int, other: int, scale: int, modes: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept frequencies and the analysis and synthesis bases of an axis of ``size`` cells (the other has
    ``other``) on a period of ``scale · size`` samples, cut off at ``modes`` (0: none)."""
    period = scale * size
    # Counted on the CPU, whatever the device (the meta device has no values).
    sizes = [torch.tensor(n, device="cpu") for n in (period, size, other)]
    kept = _kept(torch.arange(period // 2 + 1, device="cpu"), sizes[0], sizes[1], sizes[2], scale * modes)
    frequencies = torch.arange(int(kept.sum()), device=device)
    analysis, synthesis = _bases(frequencies, period, size)
    return frequencies, analysis, synthesis


@functools.lru_cache(maxsize=512)
def _cached_axis_bases(
    size: int, other: int, scale: int, modes: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_axis_bases`, built once per grid and device (they hold no parameter). Built outside inference mode,
    so an entry made there still serves training."""
    with torch.inference_mode(False), torch.no_grad():
        return _axis_bases(size, other, scale, modes, device)


def _wavenumbers(
    frequencies: torch.Tensor, period: int, cell: float, axis: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the symbol needs at the integer ``frequencies`` of a ``period``-sample transform along ``axis`` (0: H,
    1: W) on cells of side ``cell``, one row per frequency: ``−k²`` ``(M, 1)``; whether the row carries the reaction
    gain (the H rows do) ``(M, 1)``; the convection's ``−k`` in its axis's column, zero at the Nyquist frequency (see
    :meth:`ConvectionDiffusionReaction2d.axis_symbol`) ``(M, 2)``. Both axes' rows stacked give both axes' symbols
    in one computation (:func:`_grid_wavenumbers`)."""
    k = (2 * math.pi / (period * cell)) * frequencies.float()[:, None]  # (M, 1)
    minus_k = -k * (2 * frequencies.abs()[:, None] != period)
    zero = torch.zeros_like(minus_k)
    convection = torch.cat((minus_k, zero) if axis == 0 else (zero, minus_k), 1)
    return -(k**2), torch.full_like(k, 1.0 if axis == 0 else 0.0), convection


def _axis_geometry(scale: int, size: int, other: int) -> tuple[int, float]:
    """The transform period of an axis of ``size`` cells, ``scale`` times its side (``other`` cells on the other
    axis), and the cell's side in content units: the image, ``size × other`` cells, has unit area."""
    return scale * size, 1.0 / math.sqrt(size * other)


def _grid_wavenumbers(
    frequencies_h: torch.Tensor, frequencies_w: torch.Tensor, height: int, width: int, scale: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_wavenumbers` of a ``height x width`` grid's kept frequencies on periods of ``scale`` times each side,
    the H rows then the W rows."""
    (period_h, cell), (period_w, _) = _axis_geometry(scale, height, width), _axis_geometry(scale, width, height)
    h = _wavenumbers(frequencies_h, period_h, cell, 0)
    w = _wavenumbers(frequencies_w, period_w, cell, 1)
    return torch.cat((h[0], w[0])), torch.cat((h[1], w[1])), torch.cat((h[2], w[2]))


@functools.lru_cache(maxsize=512)
def _cached_grid_wavenumbers(
    height: int, width: int, scale: int, modes: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_grid_wavenumbers` of the cached bases' frequencies: they hold no parameter."""
    with torch.inference_mode(False), torch.no_grad():
        frequencies_h = _cached_axis_bases(height, width, scale, modes, device)[0]
        frequencies_w = _cached_axis_bases(width, height, scale, modes, device)[0]
        return _grid_wavenumbers(frequencies_h, frequencies_w, height, width, scale)


@functools.lru_cache(maxsize=512)
def _cached_grid_taps(height: int, width: int, scale: int, modes: int, device: torch.device) -> torch.Tensor:
    """Both axes' Toeplitz taps of :func:`_mode_matrices` on the cached bases, as one block-diagonal matrix
    ``(2 (Mh + Mw), (2H − 1) + (2W − 1))``: rows the cosines of H's modes and of W's, then their sines (the symbols'
    order in :meth:`ConvectionDiffusionReaction2d.kernel`); columns H's taps, then W's. They hold no parameter."""
    with torch.inference_mode(False), torch.no_grad():
        _, fwd_h, inv_h = _cached_axis_bases(height, width, scale, modes, device)
        _, fwd_w, inv_w = _cached_axis_bases(width, height, scale, modes, device)
        taps_h, taps_w = _toeplitz_taps(_mode_matrices(fwd_h, inv_h)), _toeplitz_taps(_mode_matrices(fwd_w, inv_w))
        mh, mw = taps_h.shape[0] // 2, taps_w.shape[0] // 2
        cosines = torch.block_diag(taps_h[:mh], taps_w[:mw])
        return torch.cat((cosines, torch.block_diag(taps_h[mh:], taps_w[mw:])))


def _symbol(
    wavenumbers: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The symbol's ``ρ cos ψ`` and ``ρ sin ψ`` per head at the rows :func:`_wavenumbers` gives (one axis's, or both
    axes' stacked), from :meth:`ConvectionDiffusionReaction2d.coefficients`: ``(M, heads)``, or ``(B, M, heads)``
    per sample."""
    minus_k_squared, carries_gain, convection = wavenumbers
    rate, log_gain, drift = coefficients  # per head, or (B, 1, heads) per sample
    magnitude = torch.addcmul(rate * minus_k_squared, carries_gain, log_gain).exp()  # (M, heads)
    phase = (drift * convection[:, None, :]).sum(-1)  # each row's axis's drift times its −k
    return magnitude * phase.cos(), magnitude * phase.sin()


class _Kernel(torch.autograd.Function):
    """The operator's depthwise kernel on a grid, ``(heads, 2H − 1, 2W − 1)``, from its coefficients per head, with
    its backward written out: a few products in place of the many small steps autograd would record for them.

    Forward: the symbol at both axes' rows (:func:`_symbol`), the taps of both axes in one product with their
    block-diagonal basis (:func:`_cached_grid_taps`), the outer product of the two axes' taps. Backward: each axis's
    taps get the kernel's gradient contracted with the other's; the symbol's ``(c, s) = ρ (cos ψ, sin ψ)`` get the
    basis times those; ``∂ρ/∂ log ρ = ρ`` and ``∂(c, s)/∂ψ = (−s, c)`` carry them to the log-magnitude and the phase,
    which are linear in the coefficients."""

    @staticmethod
    def forward(ctx, rate, log_gain, drift, minus_k_squared, carries_gain, convection, basis, height):
        cos, sin = _symbol((minus_k_squared, carries_gain, convection), (rate, log_gain, drift))  # (M, heads)
        taps = torch.cat((cos, sin)).t() @ basis  # (heads, (2H - 1) + (2W - 1))
        along_h, along_w = taps.split([2 * height - 1, taps.shape[1] - 2 * height + 1], 1)
        ctx.save_for_backward(cos, sin, along_h, along_w, minus_k_squared, carries_gain, convection, basis)
        return along_h[:, :, None] * along_w[:, None, :]

    @staticmethod
    def backward(ctx, grad):
        cos, sin, along_h, along_w, minus_k_squared, carries_gain, convection, basis = ctx.saved_tensors
        grad_h = torch.bmm(grad, along_w[:, :, None])[:, :, 0]  # (heads, 2H - 1)
        grad_w = torch.bmm(along_h[:, None, :], grad)[:, 0]  # (heads, 2W - 1)
        grad_cos, grad_sin = (basis @ torch.cat((grad_h, grad_w), 1).t()).chunk(2)  # (M, heads) each
        grad_log_magnitude = torch.addcmul(grad_cos * cos, grad_sin, sin)
        grad_phase = torch.addcmul(grad_sin * cos, grad_cos, sin, value=-1.0)
        grad_rate = (grad_log_magnitude * minus_k_squared).sum(0)
        grad_log_gain = (grad_log_magnitude * carries_gain).sum(0)
        grad_drift = grad_phase.t() @ convection  # (heads, 2)
        return grad_rate, grad_log_gain, grad_drift, None, None, None, None, None


def _size_tensor(size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A size (an int, a symbol of torch.export's graph, or a tensor under torch.jit.trace) as a 0-dim tensor that
    the graph computes from the input's shape (``torch.as_tensor`` would record a symbolic size as a constant)."""
    if isinstance(size, torch.Tensor):
        return size.to(device=device, dtype=dtype)
    return torch.scalar_tensor(size, dtype=dtype, device=device)


def _graph_axis_bases(size, other, scale: int, modes: int, device: torch.device):
    """:func:`_axis_bases` for a graph that runs at every size: ``size`` and ``other`` may be symbols of the graph.
    The number of kept frequencies needs a square root of the aspect ratio, which exporters do not record on sizes;
    the graph keeps a bound that is a product of integers (``ceil(reach / 2) · ceil(size / other)``, as
    ``sqrt(size / other) <= ceil(size / other)``; the count itself on square grids) and masks the frequencies past
    the cut-off out of the synthesis. Arithmetic runs on the sizes as tensors, which every exporter records."""
    reach = scale * modes
    bound = (reach + 1) // 2 * ((size + other - 1) // other) if reach else scale * size // 2
    frequencies = torch.arange(bound + 1, device=device)
    period, cells, other = (_size_tensor(n, torch.int64, device) for n in (scale * size, size, other))
    analysis, synthesis = _bases(frequencies, period, size, _kept(frequencies, period, cells, other, reach))
    return frequencies, analysis, synthesis


def _rotate(z: torch.Tensor, dim: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Multiply a spectrum ``a − i b``, stored as ``(a, b)`` along ``dim``, by ``ρ e^{iψ}``, given as
    ``cos = (ρ cos ψ, ρ cos ψ)`` and ``sin = (ρ sin ψ, −ρ sin ψ)`` stacked the same way:
    ``(a, b) -> (a ρcos ψ + b ρsin ψ, b ρcos ψ − a ρsin ψ)``."""
    return torch.addcmul(z * cos, z.flip(dim), sin)


def _rotation(
    analysis: torch.Tensor, synthesis: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One axis's factors for :func:`_apply_modes`: the bases, and the symbol's ``(M, C)`` parts (``(B, M, C)`` per
    sample) stacked as :func:`_rotate` takes them, ``(ρcos, ρcos)`` and ``(ρsin, −ρsin)``, each ``(2, M, C)``
    (``(B, 2, M, C)``)."""
    return analysis, synthesis, torch.stack((cos, cos), -3), torch.stack((sin, -sin), -3)


def _mode_matrices(analysis: torch.Tensor, synthesis: torch.Tensor) -> torch.Tensor:
    """Each kept mode's two fixed matrices of :func:`_axis_matrix`, ``(2M, size, size)``: the ``P_m``, then the
    ``Q_m``."""
    half = analysis.shape[0] // 2
    fwd_cos, fwd_sin = analysis[:half, None, :], analysis[half:, None, :]  # (M, 1, size) each
    inv_cos, inv_sin = synthesis[:, :half].t()[:, :, None], synthesis[:, half:].t()[:, :, None]  # (M, size, 1) each
    return torch.cat((inv_cos * fwd_cos + inv_sin * fwd_sin, inv_cos * fwd_sin - inv_sin * fwd_cos))


def _axis_matrix(analysis: torch.Tensor, synthesis: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One axis of the operator as a dense matrix per channel, ``(C, size, size)`` (``(B, C, size, size)`` for
    per-sample symbols): synthesis · symbol · analysis, from the factors
    :meth:`ConvectionDiffusionReaction2d.grid_operator` returns.

    Per mode ``m`` the rotation of :func:`_rotate` maps ``(a, b) = (fwd_cos x, fwd_sin x)`` to
    ``(a ρcos + b ρsin, b ρcos − a ρsin)``, so the matrix is ``Σ_m ρcos[c, m] P_m + ρsin[c, m] Q_m`` with the fixed
    ``P_m = inv_cos_m ⊗ fwd_cos_m + inv_sin_m ⊗ fwd_sin_m`` and ``Q_m = inv_cos_m ⊗ fwd_sin_m − inv_sin_m ⊗ fwd_cos_m``:
    one ``(C, 2M) @ (2M, size²)`` product."""
    size = analysis.shape[1]
    symbol = torch.cat((cos, sin), -2).transpose(-1, -2)  # (C, 2M), or (B, C, 2M): ρcos, then ρsin
    matrices = symbol @ _mode_matrices(analysis, synthesis).view(-1, size * size)  # (..., C, size²)
    return matrices.unflatten(-1, (size, size))


def _apply_sample_matrices(
    x: torch.Tensor, along_h: torch.Tensor, along_w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_apply_axis_matrices` with matrices of each sample's own, ``(B, C, H, H)`` and ``(B, C, W, W)``: two
    batched products over samples and channels. Returns ``y`` ``(B, H, W, C)`` and the products' inputs, ``x`` and
    ``along_h @ x`` as ``(B, C, H, W)``, which the backward of :class:`_SampleMatrices` reuses."""
    x_c = x.permute(0, 3, 1, 2).contiguous()  # (B, C, H, W)
    u = torch.matmul(along_h, x_c)  # (B, C, H, W)
    return torch.matmul(u, along_w.transpose(-1, -2)).permute(0, 2, 3, 1), x_c, u


class _SampleMatrices(torch.autograd.Function):
    """:func:`_apply_sample_matrices` with its backward written out: the output's gradient, channels-last, is made
    contiguous over (samples, channels) once; autograd's products would take it as a view and, on the CPU, copy it
    one matrix at a time."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, along_h: torch.Tensor, along_w: torch.Tensor) -> torch.Tensor:
        y, x_c, u = _apply_sample_matrices(x, along_h, along_w)
        ctx.save_for_backward(x_c, u, along_h, along_w)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x_c, u, along_h, along_w = ctx.saved_tensors
        grad_y = grad.permute(0, 3, 1, 2).contiguous()  # (B, C, H, W)
        grad_w = torch.matmul(grad_y.transpose(-1, -2), u)  # (B, C, W, W)
        grad_u = torch.matmul(grad_y, along_w)  # (B, C, H, W)
        grad_h = torch.matmul(grad_u, x_c.transpose(-1, -2))  # (B, C, H, H)
        grad_x = torch.matmul(along_h.transpose(-1, -2), grad_u).permute(0, 2, 3, 1)  # (B, H, W, C)
        return grad_x, grad_h, grad_w


def _apply_axis_matrices(
    x: torch.Tensor, along_h: torch.Tensor, along_w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y[b, i, k, c] = Σ_jl along_h[c, i, j] x[b, j, l, c] along_w[c, k, l]``: two batched products over the
    channels; ``x`` is ``(B, H, W, C)``, the matrices ``(C, H, H)`` and ``(C, W, W)``, one dtype. Returns ``y`` and
    the two products' right-hand sides, which the backward of :class:`_AxisMatrices` reuses."""
    B, H, W, C = x.shape
    x_h = x.permute(3, 1, 0, 2).reshape(C, H, B * W)  # (C, H, B*W)
    u_w = torch.bmm(along_h, x_h).view(C, H, B, W).permute(0, 3, 2, 1).reshape(C, W, B * H)  # (C, W, B*H)
    y = torch.bmm(along_w, u_w).view(C, W, B, H).permute(2, 3, 1, 0)  # (B, H, W, C)
    return y, x_h, u_w


def _toeplitz_taps(matrix: torch.Tensor) -> torch.Tensor:
    """The taps of per-channel Toeplitz matrices ``(C, n, n)``, ``A[c, i, j] = k_c(i − j)``, as a depthwise
    cross-correlation over ``2n − 1`` cells (``w[t] = k(n − 1 − t)``): column 0 bottom-up, then row 0 from ``j = 1``."""
    return torch.cat((matrix[:, :, 0].flip(1), matrix[:, 0, 1:]), 1)  # (C, 2n - 1)


def _apply_axis_convolutions(x: torch.Tensor, along_h: torch.Tensor, along_w: torch.Tensor) -> torch.Tensor:
    """:func:`_apply_axis_matrices` for inference, as two depthwise convolutions with zero padding. The operator is a
    convolution, so each axis matrix is Toeplitz (on the open domain, and on the periodic one, whose circulant
    matrices are Toeplitz too); a depthwise convolution reads the channels-last map where it lies, where the batched
    products need two transposed copies. Its backward is slower than theirs, so training keeps the products."""
    H, W, C = x.shape[1], x.shape[2], x.shape[3]
    y = F.conv2d(x.permute(0, 3, 1, 2), _toeplitz_taps(along_h)[:, None, :, None], padding=(H - 1, 0), groups=C)
    y = F.conv2d(y, _toeplitz_taps(along_w)[:, None, None, :], padding=(0, W - 1), groups=C)
    return y.permute(0, 2, 3, 1)  # (B, H, W, C)


class _AxisMatrices(torch.autograd.Function):
    """:func:`_apply_axis_matrices` with its backward written out: autograd would hand the batched products
    gradients whose views merge the batch and grid axes, which the CPU products copy one channel at a time."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, along_h: torch.Tensor, along_w: torch.Tensor) -> torch.Tensor:
        y, x_h, u_w = _apply_axis_matrices(x, along_h, along_w)
        ctx.save_for_backward(x_h, u_w, along_h, along_w)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x_h, u_w, along_h, along_w = ctx.saved_tensors
        C, H, W = along_h.shape[0], along_h.shape[1], along_w.shape[1]
        B = x_h.shape[2] // W
        grad_v = grad.permute(3, 2, 0, 1).contiguous().view(C, W, B * H)
        grad_w = torch.bmm(grad_v, u_w.transpose(1, 2))  # (C, W, W)
        grad_u = torch.bmm(along_w.transpose(1, 2), grad_v).view(C, W, B, H)
        grad_u = grad_u.permute(0, 3, 2, 1).contiguous().view(C, H, B * W)
        grad_h = torch.bmm(grad_u, x_h.transpose(1, 2))  # (C, H, H)
        grad_x = torch.bmm(along_h.transpose(1, 2), grad_u).view(C, H, B, W).permute(2, 1, 3, 0)
        return grad_x, grad_h, grad_w


def _along_h(factor: torch.Tensor) -> torch.Tensor:
    """A factor of the H symbol, ``(2, Mh, C)`` or ``(B, 2, Mh, C)``, as it broadcasts over the ``(B, 2, Mh, 2, Mw, C)``
    spectrum."""
    return factor[..., None, None, :]


def _along_w(factor: torch.Tensor) -> torch.Tensor:
    """A factor of the W symbol, ``(2, Mw, C)`` or ``(B, 2, Mw, C)``, as it broadcasts over the spectrum."""
    return factor[..., None, None, :, :, :]


def _apply_modes(
    x: torch.Tensor,
    fwd_h: torch.Tensor,
    inv_h: torch.Tensor,
    cos_h: torch.Tensor,
    sin_h: torch.Tensor,
    fwd_w: torch.Tensor,
    inv_w: torch.Tensor,
    cos_w: torch.Tensor,
    sin_w: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The operator on ``(B, H, W, C)`` through the kept modes, from the factors of
    :func:`_rotation` (one dtype; the symbols one for the batch or one per sample): transform along H (one GEMM over
    ``W*C`` columns), then along W, apply both factors of the symbol on the reduced ``(2Mh, 2Mw)`` spectrum, where
    they cost least, then the inverse transforms. Returns ``y`` and the spectrum before each rotation, which the
    backward of :class:`_Modes` reuses."""
    B, H, W, C = x.shape
    kh, kw = fwd_h.shape[0], fwd_w.shape[0]
    z = torch.matmul(fwd_h, x.reshape(B, H, W * C))  # (B, 2Mh, W*C)
    spectrum = torch.matmul(fwd_w, z.view(B * kh, W, C)).view(B, 2, kh // 2, 2, kw // 2, C)
    cos_h, sin_h = _along_h(cos_h), _along_h(sin_h)
    rotated_h = _rotate(spectrum, 1, cos_h, sin_h)
    z = _rotate(rotated_h, 3, _along_w(cos_w), _along_w(sin_w))
    y = torch.matmul(inv_w, z.view(B * kh, kw, C))  # (B*2Mh, W, C)
    return torch.matmul(inv_h, y.view(B, kh, W * C)).view(B, H, W, C), spectrum, rotated_h


class _Modes(torch.autograd.Function):
    """:func:`_apply_modes` with its backward written out. The operator is linear, so the input's gradient is the
    adjoint: the transposed transforms around the transposed rotations; the symbol's gradients are sums over the
    reduced ``(B, 2Mh, 2Mw, C)`` spectra (over the batch too where the symbol is one for all samples), the only
    activations kept for backward."""

    @staticmethod
    def forward(ctx, x, fwd_h, inv_h, cos_h, sin_h, fwd_w, inv_w, cos_w, sin_w):
        y, spectrum, rotated_h = _apply_modes(x, fwd_h, inv_h, cos_h, sin_h, fwd_w, inv_w, cos_w, sin_w)
        ctx.save_for_backward(spectrum, rotated_h, fwd_h, inv_h, cos_h, sin_h, fwd_w, inv_w, cos_w, sin_w)
        return y

    @staticmethod
    def backward(ctx, grad):
        spectrum, rotated_h, fwd_h, inv_h, cos_h, sin_h, fwd_w, inv_w, cos_w, sin_w = ctx.saved_tensors
        B, H, W, C = grad.shape
        kh, kw = fwd_h.shape[0], fwd_w.shape[0]
        shape_h, shape_w = cos_h.shape, cos_w.shape  # (2, M, C), or (B, 2, M, C) per sample
        cos_h, sin_h, cos_w, sin_w = _along_h(cos_h), _along_h(sin_h), _along_w(cos_w), _along_w(sin_w)
        g = torch.matmul(inv_h.t(), grad.contiguous().view(B, H, W * C))  # (B, 2Mh, W*C)
        g = torch.matmul(inv_w.t(), g.view(B * kh, W, C)).view(B, 2, kh // 2, 2, kw // 2, C)
        # z -> z cos + flip(z) sin: the adjoint is g cos + flip(g) flip(sin); cos and sin get Σ g z and Σ g flip(z),
        # summed over what they broadcast over.
        grad_cos_w = (g * rotated_h).sum_to_size(cos_w.shape).view(shape_w)
        grad_sin_w = (g * rotated_h.flip(3)).sum_to_size(sin_w.shape).view(shape_w)
        g = torch.addcmul(g * cos_w, g.flip(3), sin_w.flip(-3))
        grad_cos_h = (g * spectrum).sum_to_size(cos_h.shape).view(shape_h)
        grad_sin_h = (g * spectrum.flip(1)).sum_to_size(sin_h.shape).view(shape_h)
        g = torch.addcmul(g * cos_h, g.flip(1), sin_h.flip(-5))
        g = torch.matmul(fwd_w.t(), g.reshape(B * kh, kw, C))  # (B*2Mh, W, C)
        grad_x = torch.matmul(fwd_h.t(), g.view(B, kh, W * C)).view(B, H, W, C)
        return grad_x, None, None, grad_cos_h, grad_sin_h, None, None, grad_cos_w, grad_sin_w


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the operator's products run in: autocast's where it is on (the autograd functions take every
    factor in that one dtype), else the input's."""
    return torch.get_autocast_dtype(x.device.type) if _autocast_on(x.device.type) else x.dtype


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (a device it does not serve, as meta, never has it on)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def apply_operator(operator: "ConvectionDiffusionReaction2d", x: torch.Tensor) -> torch.Tensor:
    """``operator.apply_nhwc(x)``, as a function torch.fx records as one call (it is wrapped below)."""
    return operator.apply_nhwc(x)


torch.fx.wrap("apply_operator")


def _takes_dense_path(
    size_h: int, size_w: int, coefficients_h: int, coefficients_w: int, max_size: int = DENSE_MAX_SIZE
) -> bool:
    """Whether the kept modes would not reduce the map, so that each axis applies as one dense matrix: a grid of at
    most ``max_size`` cells a side, or as many real coefficients per axis as cells (``modes=0``). (``max_size`` is an
    argument because TorchScript reads no global.)"""
    small = size_h <= max_size and size_w <= max_size
    return small or (coefficients_h >= size_h and coefficients_w >= size_w)


@register_notrace_module  # the grid size drives the transforms: a leaf for timm's tracer
class ConvectionDiffusionReaction2d(nn.Module):
    """The CDR operator, learnable, on a channels-last feature map ``(B, H, W, C)``, on the kept modes: transforms on
    large grids, one dense matrix per channel and axis where the modes would not reduce the map; both with a
    hand-written backward. :func:`create_cdr` builds one. See the module docstring for the operator, its
    boundary and its cut-off.

    Args:
        channels: number of channels; the operator does not mix them.
        num_heads: groups of channels sharing one set of coefficients; ``None`` = one set per channel.
        boundary: ``"open"`` (zero outside the image) or ``"periodic"``.
        modes: content-frequency cut-off, ``|k| <= π·modes``; also sets the cut-off diffusion ``τ₀``. ``0`` keeps
            every mode of the grid with no ``τ₀`` (the unlimited operator; its cost grows with the grid).
        diffusion_range: initial ``D`` is log-uniform over heads in this range (content units), on top of ``τ₀``.
        max_initial_shift: initial velocities are uniform in ``[-s, s]²`` (content units).
    """

    def __init__(
        self,
        channels: int,
        num_heads: int | None = None,
        boundary: str = "open",
        modes: int = 6,
        diffusion_range: tuple[float, float] = (1e-5, 3e-2),
        max_initial_shift: float = 0.02,
        device=None,
        dtype=None,
    ):
        super().__init__()
        num_heads = num_heads or channels
        if channels % num_heads:
            raise ValueError(f"channels ({channels}) must be divisible by num_heads ({num_heads}).")
        if boundary not in BOUNDARIES:
            raise ValueError(f"Unknown boundary {boundary!r}; choose one of {BOUNDARIES}.")
        if modes < 0:
            raise ValueError(f"modes must be >= 1, or 0 for every mode of the grid, got {modes}.")
        dd = {"device": device, "dtype": dtype}
        self.channels = channels
        self.num_heads = num_heads
        self.boundary = boundary
        self.period_scale = 2 if boundary == "open" else 1  # the open domain is an implicit zero padding
        self.modes = modes
        self.diffusion_range = diffusion_range
        self.max_initial_shift = max_initial_shift
        # No cut-off (modes=0) keeps every mode of the grid, with no cut-off diffusion τ₀.
        max_wavenumber = math.pi * modes if modes else math.inf
        self.cutoff_diffusion = math.log(1.0 / CUTOFF_DAMPING) / max_wavenumber**2  # τ₀ (0 with no cut-off)

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

    def coefficients(self, shifts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per head, in float32, what both axes' symbols share: the diffusion rate ``τ₀ + t D``, the log-gain
        ``t r`` and the drift ``t v`` (``(heads, 2)``).

        ``shifts`` ``(B, 5, heads)`` gives each sample its own operator: offsets to the log-diffusion, the two
        velocities (H, W), the reaction and the log-time. The coefficients are then ``(B, 1, heads)`` (the drift
        ``(B, 1, heads, 2)``), which :meth:`apply_nhwc` takes."""
        log_diffusion, velocity = self.log_diffusion.float(), self.velocity.float()
        reaction, log_time = self.reaction.float(), self.log_time.float()
        if shifts is not None:
            shifts = shifts.float()[:, :, None]  # (B, 5, 1, heads)
            log_diffusion, reaction, log_time = (
                log_diffusion + shifts[:, 0],
                reaction + shifts[:, 3],
                log_time + shifts[:, 4],
            )
            # permute, not movedim(1, -1): the TorchScript ONNX exporter resolves the -1 to the wrong axis
            velocity = velocity + shifts[:, 1:3].permute(0, 2, 3, 1)  # (B, 1, heads, 2)
        time = log_time.exp()  # (heads,), or (B, 1, heads)
        rate = self.cutoff_diffusion + time * log_diffusion.exp()
        return rate, time * reaction, time[..., None] * velocity

    def axis_geometry(self, size: int, other: int) -> tuple[int, float]:
        """The transform period of an axis of ``size`` cells (twice the side on the open domain, an implicit zero
        padding) and the cell's side in content units (the image, ``size × other`` cells, has unit area)."""
        return _axis_geometry(self.period_scale, size, other)

    def axis_symbol(
        self,
        frequencies: torch.Tensor,
        period: int,
        cell: float,
        axis: int,
        coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The symbol's factor along one axis (0: H, which carries the reaction gain; 1: W) at the integer
        ``frequencies`` (signed) of a ``period``-sample transform, from :meth:`coefficients`: ``ρ cos ψ`` and
        ``ρ sin ψ``, each ``(M, C)``.

        At the Nyquist frequency the convection phase is dropped: an odd symbol there is not representable by a
        real operator (the real FFT ignores it too).
        """
        return self._symbol_at(_wavenumbers(frequencies, period, cell, axis), coefficients)

    def _symbol_at(
        self,
        wavenumbers: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The symbol's factors at the rows :func:`_wavenumbers` gives (one axis's, or both axes' stacked)."""
        cos, sin = _symbol(wavenumbers, coefficients)
        if self.num_heads == self.channels:
            return cos, sin
        per_head = self.channels // self.num_heads
        return cos.repeat_interleave(per_head, dim=-1), sin.repeat_interleave(per_head, dim=-1)

    def grid_operator(
        self,
        height: int,
        width: int,
        device: torch.device,
        coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[
        tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ]:
        """Each axis of a ``height x width`` grid on its kept frequencies: the analysis ``(2M, size)`` and synthesis
        ``(size, 2M)`` bases and the symbol's ``ρ cos ψ`` and ``ρ sin ψ``, each ``(M, C)``; on a grid of known size,
        both axes' symbols in one computation."""
        if torch.jit.is_scripting():  # TorchScript compiles no cache: the bases are rebuilt per call
            freq_h, fwd_h, inv_h = _axis_bases(height, width, self.period_scale, self.modes, device)
            freq_w, fwd_w, inv_w = _axis_bases(width, height, self.period_scale, self.modes, device)
            wavenumbers = _grid_wavenumbers(freq_h, freq_w, height, width, self.period_scale)
        elif not isinstance(height, int) or torch.compiler.is_compiling():
            # A graph's symbol (torch.export, torch.jit.trace), or a trace that must not cache its tensors nor read
            # their values: tensor operations on the sizes, one axis at a time.
            cell = _size_tensor(height * width, torch.float32, device).rsqrt()
            h = self._graph_axis_operator(height, width, 0, cell, device, coefficients)
            return h, self._graph_axis_operator(width, height, 1, cell, device, coefficients)
        else:
            _, fwd_h, inv_h = _cached_axis_bases(height, width, self.period_scale, self.modes, device)
            _, fwd_w, inv_w = _cached_axis_bases(width, height, self.period_scale, self.modes, device)
            wavenumbers = _cached_grid_wavenumbers(height, width, self.period_scale, self.modes, device)
        cos, sin = self._symbol_at(wavenumbers, coefficients)  # (Mh + Mw, C), or (B, Mh + Mw, C)
        mh = fwd_h.shape[0] // 2
        cos_h, cos_w = cos.split([mh, cos.shape[-2] - mh], -2)
        sin_h, sin_w = sin.split([mh, sin.shape[-2] - mh], -2)
        return (fwd_h, inv_h, cos_h, sin_h), (fwd_w, inv_w, cos_w, sin_w)

    def _graph_axis_operator(
        self,
        size,
        other,
        axis: int,
        cell: torch.Tensor,
        device: torch.device,
        coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`grid_operator`'s factors of one axis in a graph that runs at every size."""
        period = _size_tensor(self.period_scale * size, torch.int64, device)
        frequencies, analysis, synthesis = _graph_axis_bases(size, other, self.period_scale, self.modes, device)
        cos, sin = self.axis_symbol(frequencies, period, cell, axis, coefficients)
        return analysis, synthesis, cos, sin

    def apply_nhwc(
        self, x: torch.Tensor, coefficients: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The operator on ``(B, H, W, C)``, with the module's coefficients or the given ones (:meth:`coefficients`;
        per sample, from its ``shifts``). Where the kept modes would not reduce the map (:func:`_takes_dense_path`),
        each axis applies as one dense ``(size, size)`` matrix per channel, built from the same modes and symbol
        (:func:`_apply_axis_matrices`; in inference, as the depthwise convolution those matrices are,
        :func:`_apply_axis_convolutions`; per sample, one per sample and channel, :func:`_apply_sample_matrices`);
        elsewhere the transforms (:func:`_apply_modes`). All compute the same operator."""
        H, W = x.shape[1], x.shape[2]
        if coefficients is None:
            coefficients = self.coefficients()
        h, w = self.grid_operator(H, W, x.device, coefficients)
        per_sample = coefficients[0].dim() > 1
        if torch.jit.is_scripting():  # TorchScript compiles no autograd function: it differentiates the forward
            if _takes_dense_path(H, W, h[0].shape[0], w[0].shape[0]):
                along_h, along_w = _axis_matrix(h[0], h[1], h[2], h[3]), _axis_matrix(w[0], w[1], w[2], w[3])
                if per_sample:
                    return _apply_sample_matrices(x, along_h, along_w)[0]
                return _apply_axis_matrices(x, along_h, along_w)[0]
            h, w = _rotation(h[0], h[1], h[2], h[3]), _rotation(w[0], w[1], w[2], w[3])
            return _apply_modes(x, h[0], h[1], h[2], h[3], w[0], w[1], w[2], w[3])[0]
        dtype = _compute_dtype(x)
        x = x.to(dtype)
        if not isinstance(H, int):  # a graph for every size (see grid_operator): one path, its forward differentiated
            return _apply_modes(x, *(t.to(dtype) for t in (*_rotation(*h), *_rotation(*w))))[0]
        dense = _takes_dense_path(H, W, h[0].shape[0], w[0].shape[0])
        factors = (_axis_matrix(*h), _axis_matrix(*w)) if dense else (*_rotation(*h), *_rotation(*w))
        factors = tuple(t.to(dtype) for t in factors)
        if dense and per_sample:  # matrices of each sample's own: few and small on these grids
            if not torch.is_grad_enabled() or torch.compiler.is_compiling():
                return _apply_sample_matrices(x, *factors)[0]
            return _SampleMatrices.apply(x, *factors)
        if not torch.is_grad_enabled():  # inference keeps nothing for backward
            return _apply_axis_convolutions(x, *factors) if dense else _apply_modes(x, *factors)[0]
        if torch.compiler.is_compiling():  # torch.compile differentiates the plain forward
            return (_apply_axis_matrices if dense else _apply_modes)(x, *factors)[0]
        return (_AxisMatrices if dense else _Modes).apply(x, *factors)

    def kernel(self, height: int, width: int, device: torch.device | None = None) -> torch.Tensor:
        """The operator on a ``height x width`` grid as the depthwise cross-correlation it is (zero padding of
        ``height - 1`` and ``width - 1``): its ``(C, 2 height - 1, 2 width - 1)`` kernel, in float32, differentiable
        in the coefficients. The operator is separable: the outer product of the two axes' taps, each the symbol
        times its kept modes' fixed taps (the Toeplitz taps of :func:`_axis_matrix`); in eager PyTorch both axes in
        one product, with a hand-written backward (:class:`_Kernel`)."""
        device = self.log_time.device if device is None else device
        coefficients = self.coefficients()
        if torch.jit.is_scripting() or torch.compiler.is_compiling():  # no cache: each axis from its factors
            h, w = self.grid_operator(height, width, device, coefficients)
            along_h = torch.cat((h[2], h[3])).t() @ _toeplitz_taps(_mode_matrices(h[0], h[1]))  # (C, 2H - 1)
            along_w = torch.cat((w[2], w[3])).t() @ _toeplitz_taps(_mode_matrices(w[0], w[1]))  # (C, 2W - 1)
        else:
            if _autocast_on(device.type):  # in float32, the dtype its backward computes in: the kernel is small
                with torch.autocast(device.type, enabled=False):
                    return self.kernel(height, width, device)
            wavenumbers = _cached_grid_wavenumbers(height, width, self.period_scale, self.modes, device)
            basis = _cached_grid_taps(height, width, self.period_scale, self.modes, device)
            kernel = _Kernel.apply(*coefficients, *wavenumbers, basis, height)  # (heads, 2H - 1, 2W - 1)
            if self.num_heads == self.channels:
                return kernel
            return kernel.repeat_interleave(self.channels // self.num_heads, dim=0)
        return along_h[:, :, None] * along_w[:, None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C)
        # torch.fx records apply_operator as one call: the grid size, which drives it, is not known when tracing.
        # TorchScript passes no module to a function: it calls the method.
        if torch.jit.is_scripting():
            return self.apply_nhwc(x)
        return apply_operator(self, x)

    def extra_repr(self) -> str:
        return f"{self.channels}, num_heads={self.num_heads}, boundary={self.boundary!r}, modes={self.modes}"


@register_notrace_module  # as its parent: a leaf for timm's tracer
class DynamicConvectionDiffusionReaction2d(ConvectionDiffusionReaction2d):
    """The CDR operator with per-sample coefficients: a linear map of the input's spatial mean shifts each head's
    log-diffusion, velocity (H, W), reaction and log-time, each shift bounded to ``(-1, 1)`` by a tanh, so a
    sample's time stays within a factor e of its head's. For each sample it is still a CDR operator: linear in the
    pixels, diagonal in the Fourier basis, in content units. The map starts at zero (:meth:`start_static`): the
    operator starts as the static one. Unbounded, the shifts grow with the map's weights and a sample's log-gain
    ``t (r + dr)``, with ``t = exp(log_time + dt)``, passes float32's exp range: an infinite symbol, a NaN loss.

    Arguments as :class:`ConvectionDiffusionReaction2d`'s.
    """

    def __init__(self, channels: int, **kwargs: Any):
        super().__init__(channels, **kwargs)
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.to_coefficients = nn.Linear(channels, 5 * self.num_heads, **dd)
        self.start_static()

    def start_static(self) -> None:
        """Zero the coefficient map: every sample gets the module's own coefficients."""
        nn.init.zeros_(self.to_coefficients.weight)
        nn.init.zeros_(self.to_coefficients.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C)
        shifts = self.to_coefficients(x.mean((1, 2))).tanh()  # (B, 5 heads)
        return self.apply_nhwc(x, self.coefficients(shifts.view(x.shape[0], 5, self.num_heads)))


def create_cdr(channels: int, dynamic: bool = False, **kwargs: Any) -> ConvectionDiffusionReaction2d:
    """The CDR operator; with ``dynamic``, its per-sample form (:class:`DynamicConvectionDiffusionReaction2d`);
    other arguments as :class:`ConvectionDiffusionReaction2d`'s."""
    operator = DynamicConvectionDiffusionReaction2d if dynamic else ConvectionDiffusionReaction2d
    return operator(channels, **kwargs)
