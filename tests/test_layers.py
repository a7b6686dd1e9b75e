"""The original-compatible block and its parts against independent references (numpy's FFT, explicit loops, the
original block). The CDR operator has its own file, test_cdr.py."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from iris_timm.layers import PDESSMBlock
from iris_timm.layers.legacy import SpectralConv2d, TokenDifferential

# The original block, kept beside the project checkout.
ORIGINAL_FILE = Path(__file__).resolve().parents[2] / "shared" / "seed" / "pde_ssm.py"
# Even, odd, non-square and degenerate grids.
GRIDS = [(8, 8), (7, 9), (6, 11), (1, 1), (1, 6), (5, 1), (2, 3), (3, 4), (4, 5)]


def reference_spectral(x: np.ndarray, conv: SpectralConv2d) -> np.ndarray:
    """Apply the weights frequency by frequency on ``(B, H, W, C)``: row frequency f uses weight_pos[f] if f >= 0,
    else weight_neg[modes_h + f]; each frequency present in the grid is used exactly once."""
    H, W = x.shape[1:3]
    w_pos = torch.view_as_complex(conv.weight_pos.detach()).to(torch.complex128).numpy()
    w_neg = torch.view_as_complex(conv.weight_neg.detach()).to(torch.complex128).numpy()
    x_ft = np.fft.rfft2(x, axes=(1, 2))
    out = np.zeros_like(x_ft)
    for row in range(H):
        f = row if row < (H + 1) // 2 else row - H
        if not -conv.modes_h <= f < conv.modes_h:
            continue
        w = w_pos[:, :, f] if f >= 0 else w_neg[:, :, conv.modes_h + f]
        for col in range(min(conv.modes_w, W // 2 + 1)):
            out[:, row, col] = x_ft[:, row, col] @ w[:, :, col]
    return np.fft.irfft2(out, s=(H, W), axes=(1, 2))


def random_spectral_conv(channels: int, modes_h: int, modes_w: int) -> SpectralConv2d:
    conv = SpectralConv2d(channels, modes_h, modes_w)
    with torch.no_grad():
        conv.weight_pos.normal_()
        conv.weight_neg.normal_()
    return conv


@pytest.mark.parametrize("grid", GRIDS)
def test_spectral_conv_matches_numpy_reference(grid):
    conv = random_spectral_conv(4, 3, 2)
    x = torch.randn(2, *grid, 4)
    np.testing.assert_allclose(conv(x).detach().numpy(), reference_spectral(x.double().numpy(), conv), atol=1e-4)


@pytest.mark.parametrize(("dtype", "bits"), [(torch.bfloat16, 8), (torch.float16, 11)])
def test_spectral_conv_under_autocast_rounds_only_its_output(dtype, bits):
    """On a non-power-of-two grid under autocast, the output is the exact result on the half-precision input, rounded
    once to the autocast dtype: the FFTs do not run in half precision."""
    conv = random_spectral_conv(4, 2, 2)
    x = torch.randn(2, 6, 5, 4).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        y = conv(x)
    assert y.dtype == dtype
    expected = reference_spectral(x.double().numpy(), conv)
    np.testing.assert_allclose(y.detach().double().numpy(), expected, rtol=0, atol=2.0**-bits * np.abs(expected).max())


@pytest.mark.parametrize("operator", ["pde", "spectral"])
def test_block_scripts_traces_and_builds_on_meta(operator):
    torch.manual_seed(0)
    block = PDESSMBlock(8, spatial_size=6, operator=operator, token_diff="global").eval()
    with torch.no_grad():
        block.mixer.token_diff.alpha.normal_()
    x = torch.randn(2, 5 * 7, 8)
    expected = block(x, 5, 7)
    torch.testing.assert_close(torch.jit.script(block)(x, 5, 7), expected)
    traced = torch.fx.symbolic_trace(block.mixer)  # the FFT and the kept modes are one call: any grid runs
    for grid in [(5, 7), (3, 4)]:
        x_map = torch.randn(2, *grid, 8)
        torch.testing.assert_close(traced(x_map), block.mixer(x_map))
    meta = PDESSMBlock(8, spatial_size=6, operator=operator, device="meta")
    assert meta(torch.empty(2, 35, 8, device="meta"), 5, 7).shape == (2, 35, 8)


def test_token_differential_local_matches_explicit_neighbourhood_mean():
    td = TokenDifferential(3, kernel_size=3)
    with torch.no_grad():
        td.alpha.copy_(torch.tensor([0.5, -1.0, 2.0]))
    x = torch.randn(2, 5, 4, 3)
    mean = torch.empty_like(x)
    for i in range(5):
        for j in range(4):
            mean[:, i, j] = x[:, max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2].mean((1, 2))
    torch.testing.assert_close(td(x), x + td.alpha * (x - mean))


def test_token_differential_rejects_even_kernel():
    with pytest.raises(ValueError, match="kernel_size must be a positive odd number or None"):
        TokenDifferential(3, kernel_size=2)


@pytest.mark.parametrize("grid", [(1, 1), (1, 7), (5, 3), (14, 14), (13, 20)])
@pytest.mark.parametrize("operator", ["pde", "spectral"])
def test_block_runs_on_any_grid(grid, operator):
    block = PDESSMBlock(16, spatial_size=8, operator=operator)
    x = torch.randn(2, grid[0] * grid[1], 16, requires_grad=True)
    y = block(x, *grid)
    assert y.shape == x.shape
    y.square().mean().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in block.parameters())


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"operator": "pde+spectral"}, r"Unknown operator 'pde\+spectral'; choose one of \('pde', 'spectral'\)"),
        ({"token_diff": "mean"}, r"Unknown token_diff 'mean'; choose one of \('local', 'global', 'none'\)"),
    ],
)
def test_block_options_name_the_choices(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase):
        PDESSMBlock(8, **kwargs)


def test_block_rejects_mismatched_tokens():
    with pytest.raises(ValueError, match=r"\(B, H\*W, D\) = \(B, 12, D\), got \[2, 10, 8\]"):
        PDESSMBlock(8)(torch.randn(2, 10, 8), 3, 4)


@pytest.fixture(scope="module")
def original_block():
    if not ORIGINAL_FILE.exists():
        pytest.skip(f"the original block is not at {ORIGINAL_FILE}")
    spec = importlib.util.spec_from_file_location("original_pde_ssm", ORIGINAL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nchw(conv: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A channels-last module applied to a ``(B, C, H, W)`` input, as the original's parts take it."""
    return conv(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("grid", [(6, 6), (7, 9), (8, 11), (12, 6)])
def test_spectral_conv_matches_the_original_where_it_was_correct(original_block, grid):
    """The original is correct on grids of at least 2 * modes rows; the weights load unchanged."""
    torch.manual_seed(0)
    original = original_block.SpectralConv2d(5, 3, 3)
    ours = SpectralConv2d(5, 3, 3)
    ours.load_state_dict(original.state_dict())
    x = torch.randn(2, 5, *grid)
    torch.testing.assert_close(nchw(ours, x), original(x), rtol=1e-5, atol=1e-6)


def test_spectral_conv_fixes_overlapping_modes(original_block):
    """On 3 rows with 2 modes the original writes frequency -1 over +1; each mode is now used once."""
    torch.manual_seed(0)
    original = original_block.SpectralConv2d(2, 2, 2)
    ours = SpectralConv2d(2, 2, 2)
    ours.load_state_dict(original.state_dict())
    x = torch.randn(1, 3, 4, 2)
    expected = reference_spectral(x.double().numpy(), ours)
    np.testing.assert_allclose(ours(x).detach().numpy(), expected, rtol=1e-4, atol=1e-5)
    original_out = original(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    assert not np.allclose(original_out.detach().numpy(), expected, atol=1e-3)


@pytest.mark.parametrize(("spatial_size", "grid"), [(4, (4, 4)), (8, (8, 8)), (8, (9, 11)), (6, (7, 6))])
def test_block_matches_the_original_and_loads_its_state_dict(original_block, spatial_size, grid):
    torch.manual_seed(0)
    original = original_block.PDESSMBlock(16, spatial_size)
    with torch.no_grad():
        original.token_diff.alpha.normal_()
    ours = PDESSMBlock(16, spatial_size, operator="spectral", token_diff="global")
    ours.load_state_dict(original.state_dict())
    x = torch.randn(2, grid[0] * grid[1], 16)
    torch.testing.assert_close(ours(x, *grid), original(x, *grid), rtol=1e-5, atol=1e-5)
