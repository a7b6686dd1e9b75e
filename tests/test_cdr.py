"""The CDR (convection–diffusion–reaction) operator against independent references: a dense convolution written in
numpy, the continuous Gaussian solution of the PDE, and an exact FFT over the period."""

import math

import numpy as np
import pytest
import torch
from conftest import randomize_pde

from iris_timm.layers import CUTOFF_DAMPING, ConvectionDiffusionReaction2d, create_cdr
from iris_timm.layers.cdr import _cached_grid_taps, _cached_grid_wavenumbers, _Kernel


def nchw(op: ConvectionDiffusionReaction2d, x: torch.Tensor, apply=None) -> torch.Tensor:
    """The operator (channels-last; or ``apply(op, x)``) on a ``(B, C, H, W)`` map, for the numpy references."""
    y = (apply or operator)(op, x.permute(0, 2, 3, 1))
    return y.permute(0, 3, 1, 2)


# Even, odd, non-square and 1-pixel grids, all of them small enough for the dense path (at most DENSE_MAX_SIZE cells a
# side); with modes=0 the larger ones take it too (as many kept coefficients per axis as cells).
GRIDS = [(8, 8), (7, 9), (6, 11), (1, 1), (1, 6), (5, 1), (2, 3), (32, 32), (20, 27)]
# Grids above DENSE_MAX_SIZE on a side, which take the transforms at a cut-off.
TRANSFORM_GRIDS = [(24, 17), (40, 3), (17, 20)]


def fft_reference(op: ConvectionDiffusionReaction2d, x: torch.Tensor) -> torch.Tensor:
    """The operator on ``(B, H, W, C)`` with every mode kept (no cut, the cut-off diffusion still in the symbol):
    ``rfft2`` over the (padded) period, in float32."""
    H, W = x.shape[1], x.shape[2]
    (period_h, cell), (period_w, _) = op.axis_geometry(H, W), op.axis_geometry(W, H)
    index = torch.arange(period_h)
    signed = torch.where(2 * index <= period_h, index, index - period_h)  # FFT order
    coefficients = op.coefficients()
    cos_h, sin_h = op.axis_symbol(signed, period_h, cell, 0, coefficients)  # (Ph, C)
    cos_w, sin_w = op.axis_symbol(torch.arange(period_w // 2 + 1), period_w, cell, 1, coefficients)
    symbol = torch.complex(cos_h, sin_h)[:, None, :] * torch.complex(cos_w, sin_w)[None, :, :]  # (Ph, Pw/2+1, C)
    spectrum = torch.fft.rfft2(x.float(), s=(period_h, period_w), dim=(1, 2))
    return torch.fft.irfft2(spectrum * symbol, s=(period_h, period_w), dim=(1, 2))[:, :H, :W]


def operator(op: ConvectionDiffusionReaction2d, x: torch.Tensor) -> torch.Tensor:
    return op(x)


def randomize(op: ConvectionDiffusionReaction2d, seed: int = 0, log_diffusion=(-8.0, -3.0), shift: float = 0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        op.log_diffusion.copy_(torch.empty(op.num_heads).uniform_(*log_diffusion, generator=g))
        op.velocity.copy_(torch.empty(op.num_heads, 2).uniform_(-shift, shift, generator=g))
        op.reaction.copy_(torch.randn(op.num_heads, generator=g) * 0.3)
        op.log_time.copy_(torch.randn(op.num_heads, generator=g) * 0.3)


def coefficients(op: ConvectionDiffusionReaction2d) -> dict[str, np.ndarray]:
    """Per-channel ``t``, total diffusion rate ``τ₀ + t D``, drift ``t v`` and log-gain ``t r``, float64."""
    per_head = op.channels // op.num_heads

    def channels(p: torch.Tensor) -> np.ndarray:
        return np.repeat(p.detach().double().numpy(), per_head, axis=0)

    t = np.exp(channels(op.log_time))
    return {
        "rate": op.cutoff_diffusion + t * np.exp(channels(op.log_diffusion)),
        "drift": t[:, None] * channels(op.velocity),
        "log_gain": t * channels(op.reaction),
    }


def axis_kernel(n: int, period: int, cell: float, rate: float, drift: float, modes: float) -> np.ndarray:
    """The 1-D kernel of one channel on one axis, indexed by the offset modulo the period: numpy's inverse FFT
    of the symbol over the period, with the frequencies past the first that reaches |k| = π·modes cut."""
    m = np.fft.fftfreq(period, d=1.0 / period)  # signed integer frequencies; Nyquist as -P/2
    k = 2 * np.pi * m / (period * cell)
    k_conv = np.where(2 * np.abs(m) == period, 0.0, k)  # no convection at Nyquist (a real operator)
    keep = np.ceil(modes * period * cell / 2 - 1e-6)  # the first frequency with 2π m / (P cell) >= π·modes
    symbol = np.exp(-rate * k**2 - 1j * drift * k_conv) * (np.abs(m) <= keep)
    kernel = np.fft.ifft(symbol)
    assert np.abs(kernel.imag).max() < 1e-9 * max(1.0, np.abs(kernel.real).max())  # the operator is real
    return kernel.real


def reference(x: np.ndarray, op: ConvectionDiffusionReaction2d, modes: float = math.inf) -> np.ndarray:
    """The operator as an explicit dense convolution: x is (B, C, H, W), float64.

    Open boundary: ``y[i] = Σ_j kernel[i - j] x[j]`` over the image only (zero outside), with the kernel of the
    doubled period. Periodic: the same sum with the offset taken modulo the side.
    """
    _, C, H, W = x.shape
    cell = 1.0 / math.sqrt(H * W)
    scale = 2 if op.boundary == "open" else 1
    c = coefficients(op)
    i = np.arange(H)
    j = np.arange(W)
    y = np.empty_like(x)
    for ch in range(C):
        k_h = axis_kernel(H, scale * H, cell, c["rate"][ch], c["drift"][ch, 0], modes)
        k_w = axis_kernel(W, scale * W, cell, c["rate"][ch], c["drift"][ch, 1], modes)
        dense_h = k_h[np.mod(i[:, None] - i[None, :], scale * H)]  # (H, H): output row, input row
        dense_w = k_w[np.mod(j[:, None] - j[None, :], scale * W)]
        y[:, ch] = np.exp(c["log_gain"][ch]) * np.einsum("ab,nbc,dc->nad", dense_h, x[:, ch], dense_w)
    return y


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("boundary", ["open", "periodic"])
@pytest.mark.parametrize("apply", [operator, fft_reference])
def test_every_mode_kept_is_the_dense_numpy_convolution(grid, boundary, apply):
    """With every mode kept (modes=0), the operator, and the FFT reference, are the dense convolution with the
    operator's kernel."""
    op = create_cdr(4, num_heads=2, boundary=boundary, modes=0)
    randomize(op)
    x = torch.randn(2, 4, *grid)
    y = nchw(op, x, apply).detach().numpy()
    np.testing.assert_allclose(y, reference(x.double().numpy(), op), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grid", [(8, 8), (7, 9), (6, 11), (1, 1), (2, 3), (16, 13), *TRANSFORM_GRIDS])
@pytest.mark.parametrize("boundary", ["open", "periodic"])
@pytest.mark.parametrize("inference", [False, True])
def test_modes_keep_exactly_the_wavenumbers_under_the_cutoff(grid, boundary, inference):
    """Both paths, dense (grids up to DENSE_MAX_SIZE; in inference, depthwise convolutions) and the transforms, are
    the dense convolution with the symbol cut past |k| = π·modes."""
    op = create_cdr(3, boundary=boundary, modes=2)
    randomize(op, seed=1)
    x = torch.randn(2, 3, *grid)
    with torch.inference_mode(inference):
        y = nchw(op, x)
    expected = reference(x.double().numpy(), op, modes=op.modes)
    np.testing.assert_allclose(y.detach().numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("modes", [4, 6, 8])
@pytest.mark.parametrize("grid", [(7, 7), (14, 14), (28, 28), (56, 56), (13, 20)])
def test_cut_modes_are_damped_below_the_cutoff_damping(modes, grid):
    """The operator against every mode kept: the truncation error stays within CUTOFF_DAMPING."""
    op = create_cdr(16, modes=modes)
    randomize(op, seed=2, log_diffusion=(math.log(1e-5), math.log(3e-2)))
    x = torch.randn(2, *grid, 16)
    y_exact = fft_reference(op, x)
    assert (op(x) - y_exact).abs().max() <= CUTOFF_DAMPING * y_exact.abs().max()


def test_open_boundary_solves_the_pde_on_the_plane():
    """On a fine grid the open operator is the PDE's exact solution: a Gaussian of variance 2 (τ₀ + t D),
    centred at t v, scaled by exp(t r), applied as a zero-padded convolution."""
    H, W = 40, 30
    op = create_cdr(2, boundary="open", modes=8)
    randomize(op, seed=3, log_diffusion=(-9.0, -7.0), shift=0.05)  # reach under one side: no wrap of the tails
    x = torch.randn(1, 2, H, W)
    cell = 1.0 / math.sqrt(H * W)
    c = coefficients(op)
    pos_h, pos_w = np.arange(H) * cell, np.arange(W) * cell
    expected = np.empty((1, 2, H, W))
    for ch in range(2):
        variance = 2 * c["rate"][ch]

        def gaussian(offsets, drift, variance=variance):
            return np.exp(-((offsets - drift) ** 2) / (2 * variance)) * cell / math.sqrt(2 * math.pi * variance)

        dense_h = gaussian(pos_h[:, None] - pos_h[None, :], c["drift"][ch, 0])
        dense_w = gaussian(pos_w[:, None] - pos_w[None, :], c["drift"][ch, 1])
        expected[0, ch] = np.exp(c["log_gain"][ch]) * dense_h @ x[0, ch].numpy() @ dense_w.T
    np.testing.assert_allclose(nchw(op, x, fft_reference).detach().numpy(), expected, rtol=1e-4, atol=1e-5)


def bright_pixel_convected_right(boundary: str) -> torch.Tensor:
    """A bright pixel near the right edge, carried right by 0.3 of the width; returns the output map."""
    H = W = 32
    op = create_cdr(1, boundary=boundary, modes=12)
    with torch.no_grad():
        op.log_diffusion.fill_(-30.0)  # only the cut-off diffusion's blur
        op.velocity.copy_(torch.tensor([[0.0, 0.3]]))  # content units: the image is 1 x 1
        op.reaction.zero_()
        op.log_time.zero_()
    x = torch.zeros(1, 1, H, W)
    x[0, 0, H // 2, W - 2] = 1.0
    return nchw(op, x)[0, 0]


def test_open_boundary_does_not_wrap_around():
    open_left = bright_pixel_convected_right("open")[:, :10].abs().max()
    periodic_left = bright_pixel_convected_right("periodic")[:, :10].abs().max()
    assert periodic_left > 1e-2  # the torus carries the pixel onto the left border
    assert open_left < CUTOFF_DAMPING * periodic_left  # float32 rounding of the mode sums, nothing more


def blurred_left_column(boundary: str) -> torch.Tensor:
    """A bright left column under the cut-off diffusion's blur alone (width 0.2 of the image), no convection."""
    op = create_cdr(1, boundary=boundary, modes=6, diffusion_range=(1e-9, 1e-9), max_initial_shift=0.0)
    x = torch.zeros(1, 1, 24, 24)
    x[..., :, 0] = 1.0
    return nchw(op, x)[0, 0]


def test_open_boundary_does_not_blur_across_opposite_borders():
    y = blurred_left_column("open")
    assert y[:, -1].abs().max() < 1e-4 * y[:, 0].abs().max()
    periodic = blurred_left_column("periodic")
    torch.testing.assert_close(periodic[:, -1], periodic[:, 1])  # the torus joins the left and right borders


@pytest.mark.parametrize(("coarse", "fine"), [((24, 24), (72, 72)), ((24, 30), (72, 90))])
@pytest.mark.parametrize("boundary", ["open", "periodic"])
def test_same_content_at_two_resolutions_gives_the_same_output(coarse, fine, boundary):
    """A smooth image sampled at cell centres on a grid and one 3x finer: the fine cell at the centre of each
    coarse cell gets the same output (one set of weights acts on content, not on pixels)."""
    op = create_cdr(3, boundary=boundary)
    randomize(op, seed=4, log_diffusion=(-8.0, -4.0), shift=0.1)

    def sample(grid):
        H, W = grid
        a = (torch.arange(H, dtype=torch.float64)[:, None] + 0.5) / H  # content coordinates of cell centres
        b = (torch.arange(W, dtype=torch.float64)[None, :] + 0.5) / W
        channels = [
            torch.cos(2 * math.pi * (a + 2 * b)),
            torch.sin(2 * math.pi * 3 * a) + 0.5 * torch.cos(2 * math.pi * b),
            torch.cos(2 * math.pi * (2 * a - b) + 0.3),
        ]
        return torch.stack(channels)[None].float()  # (1, 3, H, W)

    y_coarse, y_fine = nchw(op, sample(coarse)), nchw(op, sample(fine))
    torch.testing.assert_close(y_fine[..., 1::3, 1::3], y_coarse, rtol=0, atol=2e-3)


def test_parameters_do_not_depend_on_resolution():
    op = create_cdr(8, num_heads=4)
    assert sum(p.numel() for p in op.parameters()) == 4 * 5  # D, v (2), r, t per head
    for grid in [(1, 1), (7, 7), (64, 48)]:
        assert op(torch.randn(1, *grid, 8)).shape == (1, *grid, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [7, 14, 28, 56])
def test_modes_run_in_the_autocast_dtype(dtype, size):
    """Under autocast the transforms are GEMMs in the low-precision dtype; forward and backward stay finite
    and close to float32 (bf16 keeps 8 bits of mantissa, fp16 11)."""
    op = create_cdr(16)
    randomize(op, seed=6, log_diffusion=(-8.0, -3.0))
    x = torch.randn(2, size, size, 16, requires_grad=True)
    expected = op(x)
    with torch.autocast("cpu", dtype=dtype):
        y = op(x)
    assert y.dtype == dtype
    tolerance = 3e-2 if dtype == torch.bfloat16 else 4e-3
    assert (y.float() - expected).abs().max() <= tolerance * expected.abs().max()
    y.float().square().sum().backward()
    assert x.grad.isfinite().all()
    assert all(p.grad.isfinite().all() for p in op.parameters())


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"boundary": "reflect"}, "Unknown boundary 'reflect'"),
        ({"modes": -1}, "modes must be >= 1, or 0 for every mode"),
        ({"num_heads": 3}, "must be divisible by num_heads"),
    ],
)
def test_bad_arguments_say_what_to_choose(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase):
        create_cdr(4, **kwargs)


def test_torchscript_matches_eager():
    op = create_cdr(4)
    randomize(op)
    x = torch.randn(2, 9, 6, 4)
    torch.testing.assert_close(torch.jit.script(op)(x), op(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("grid", "modes"),
    [((5, 7), 2), ((16, 16), 2), ((9, 12), 2), ((1, 6), 2), ((32, 32), 0), *((grid, 2) for grid in TRANSFORM_GRIDS)],
)
@pytest.mark.parametrize("boundary", ["open", "periodic"])
def test_hand_written_gradients_match_autograd(grid, modes, boundary):
    """The dense path (small grids, and every mode kept) and the transforms each have a hand-written backward;
    TorchScript runs the same forward under autograd: the output and the gradients of the input and of the
    coefficients agree."""
    op = create_cdr(4, num_heads=2, boundary=boundary, modes=modes)
    randomize(op, seed=8)
    x = torch.randn(3, *grid, 4)
    projection = torch.randn(3, *grid, 4)

    def output_and_gradients(module) -> list[torch.Tensor]:
        x_grad = x.clone().requires_grad_()
        y = module(x_grad)
        return [y, *torch.autograd.grad(y, (x_grad, *op.parameters()), projection)]

    for got, want in zip(output_and_gradients(op), output_and_gradients(torch.jit.script(op)), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (4, 4), (5, 2)])
@pytest.mark.parametrize("num_heads", [None, 2])
def test_the_kernels_hand_written_backward_is_its_derivative(grid, num_heads):
    """``kernel``, the operator as a depthwise kernel (the fused spatial filter's), has a hand-written backward:
    against finite differences in float64, and the kernel against the one TorchScript builds, axis by axis."""
    op = create_cdr(4, num_heads=num_heads, modes=2)
    randomize(op, seed=3)
    H, W = grid
    wavenumbers = [t.double() for t in _cached_grid_wavenumbers(H, W, op.period_scale, op.modes, torch.device("cpu"))]
    basis = _cached_grid_taps(H, W, op.period_scale, op.modes, torch.device("cpu")).double()
    coefficients = [c.detach().double().requires_grad_() for c in op.coefficients()]
    assert torch.autograd.gradcheck(lambda *c: _Kernel.apply(*c, *wavenumbers, basis, H), coefficients)

    class Kernel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.op = op

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.op.kernel(x.shape[0], x.shape[1])

    kernel = op.kernel(H, W)
    torch.testing.assert_close(kernel, torch.jit.script(Kernel())(torch.empty(H, W)), rtol=1e-5, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float32 under autocast, and its backward runs
        under_autocast = op.kernel(H, W)
    under_autocast.sum().backward()
    assert under_autocast.dtype == torch.float32 and torch.equal(under_autocast, kernel)


@pytest.mark.parametrize("grid", [(11, 13), (23, 19)])
def test_an_operator_run_in_inference_mode_then_trains_on_the_same_grid(grid):
    """Inference first, then training on the same grid (dense, then transforms): the same output, and the gradient
    that TorchScript's autograd gives."""
    op = create_cdr(4)
    randomize(op, seed=9)
    x = torch.randn(2, *grid, 4)
    with torch.inference_mode():
        expected = op(x)
    x.requires_grad_()
    y = op(x)
    y.sum().backward()
    torch.testing.assert_close(y.detach(), expected, rtol=1e-5, atol=1e-6)
    x_script = x.detach().clone().requires_grad_()
    torch.jit.script(op)(x_script).sum().backward()
    torch.testing.assert_close(x.grad, x_script.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "grid, modes, num_heads",
    [((24, 17), 4, None), ((9, 12), 3, 2), ((20, 20), 0, None), ((2, 1), 6, None), ((1, 1), 6, 2)],
)
def test_per_sample_coefficients_are_each_samples_own_operator(grid, modes, num_heads):
    """Coefficients from per-sample shifts: each sample's output, and the gradients of the input and of its shifts,
    are those of a static operator whose parameters carry that sample's shifts."""
    op = create_cdr(4, num_heads=num_heads, modes=modes)
    randomize(op, seed=10)
    heads = op.num_heads
    x = torch.randn(3, *grid, 4, requires_grad=True)
    shifts = (0.3 * torch.randn(3, 5, heads)).requires_grad_()
    projection = torch.randn(3, *grid, 4)
    y = op.apply_nhwc(x, op.coefficients(shifts))
    grad_x, grad_shifts = torch.autograd.grad(y, (x, shifts), projection)
    for b in range(3):
        static = create_cdr(4, num_heads=num_heads, modes=modes)
        with torch.no_grad():
            static.log_diffusion.copy_(op.log_diffusion + shifts[b, 0])
            static.velocity.copy_(op.velocity + shifts[b, 1:3].t())
            static.reaction.copy_(op.reaction + shifts[b, 3])
            static.log_time.copy_(op.log_time + shifts[b, 4])
        x_b = x[b : b + 1].detach().requires_grad_()
        y_b = static(x_b)
        params = (static.log_diffusion, static.velocity, static.reaction, static.log_time)
        grads = torch.autograd.grad(y_b, (x_b, *params), projection[b : b + 1])
        want_shifts = torch.stack((grads[1], grads[2][:, 0], grads[2][:, 1], grads[3], grads[4]))  # (5, heads)
        torch.testing.assert_close(y[b], y_b[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad_x[b], grads[0][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad_shifts[b], want_shifts, rtol=1e-4, atol=1e-5)


def test_the_dynamic_operator_is_the_operator_with_each_samples_coefficients():
    torch.manual_seed(0)
    dynamic = randomize_pde(create_cdr(6, dynamic=True, modes=3))
    torch.nn.init.normal_(dynamic.to_coefficients.weight, std=0.3)
    x = torch.randn(2, 20, 18, 6)  # (B, H, W, C)
    shifts = dynamic.to_coefficients(x.mean((1, 2))).tanh().view(2, 5, 6).detach()
    for b in range(2):
        static = create_cdr(6, modes=3)
        static.load_state_dict({k: v for k, v in dynamic.state_dict().items() if not k.startswith("to_coeff")})
        with torch.no_grad():
            static.log_diffusion += shifts[b, 0]
            static.velocity += shifts[b, 1:3].t()
            static.reaction += shifts[b, 3]
            static.log_time += shifts[b, 4]
        torch.testing.assert_close(dynamic(x)[b], static(x[b : b + 1])[0], atol=1e-5, rtol=1e-4)


def test_the_dynamic_operators_shifts_are_bounded_so_its_symbol_stays_finite():
    """A block input of the study's size and scale (batch 64, 32x32, 32 channels, channel means near 4, as the
    frame's residual stream reaches) through a coefficient map that has grown: unbounded, its shifts put a sample's
    log-gain t (r + dr) past float32's exp range and the output is not finite; bounded, output and gradients are."""
    torch.manual_seed(0)
    dynamic = create_cdr(32, dynamic=True, modes=6)
    with torch.no_grad():
        dynamic.to_coefficients.weight.fill_(0.04)  # every shift 0.04 * 32 * 4 = 5.1 at a channel mean of 4
    x = (4.0 + torch.randn(64, 32, 32, 32)).requires_grad_()  # (B, H, W, C)
    raw = dynamic.to_coefficients(x.mean((1, 2))).view(64, 5, 32)
    unbounded = create_cdr(32, modes=6).apply_nhwc(x, dynamic.coefficients(raw))  # the same operator, shifts unbounded
    assert not unbounded.isfinite().all()
    y = dynamic(x)
    grads = torch.autograd.grad(y.square().mean(), (x, *dynamic.parameters()))
    assert y.isfinite().all() and all(g.isfinite().all() for g in grads)
