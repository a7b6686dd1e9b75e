"""The matrix-product DFT path against the FFT path and numpy, and export to ONNX and torch.export."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import randomize_pde, tiny_model

from iris_timm.export import dft_everywhere, to_onnx
from iris_timm.layers import FourierOperator2d, SpectralConv2d

# Even, odd, non-square and degenerate grids.
GRIDS = [(8, 8), (7, 9), (6, 11), (1, 1), (1, 6), (5, 1), (14, 14)]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_dft_transforms_match_numpy(grid, channels_last):
    op = FourierOperator2d(channels_last=channels_last)
    x = torch.randn(2, *grid, 4) if channels_last else torch.randn(2, 4, *grid)
    expected = np.fft.rfft2(x.double().numpy(), axes=op.fft_dims)
    x_ft = op.rdft2(x)
    np.testing.assert_allclose(x_ft.numpy(), expected, rtol=1e-4, atol=1e-4)
    # A spectrum that is not Hermitian in its real columns: the inverse must read it as irfft2 does.
    spectrum = torch.randn(x_ft.shape, dtype=torch.complex64)
    expected = np.fft.irfft2(spectrum.numpy().astype(np.complex128), s=grid, axes=op.fft_dims)
    np.testing.assert_allclose(op.irdft2(spectrum, *grid).numpy(), expected, rtol=1e-4, atol=1e-4)


def _random_operator(kind: str, channels_last: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    op = SpectralConv2d(8, 3, 3, depthwise=kind == "depthwise", channels_last=channels_last)
    with torch.no_grad():
        op.weight_pos.normal_(std=0.5)
        op.weight_neg.normal_(std=0.5)
    return op


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("kind", ["depthwise", "dense"])
def test_dft_path_matches_fft_path_values_and_gradients(grid, channels_last, kind):
    op = _random_operator(kind, channels_last)
    x = torch.randn(2, *grid, 8) if channels_last else torch.randn(2, 8, *grid)
    probe = torch.randn_like(x)  # a loss that, unlike the norm of y, changes when y is translated
    outputs, grads = [], []
    for dft_max_points in (0, grid[0] * grid[1]):  # FFT, then the matrix product
        op.dft_max_points = dft_max_points
        op.zero_grad()
        x_leaf = x.clone().requires_grad_()
        y = op(x_leaf)
        (y * probe).sum().backward()
        outputs.append(y.detach())
        grads.append([x_leaf.grad, *(p.grad for p in op.parameters())])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
    for dft_grad, fft_grad in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(dft_grad, fft_grad, rtol=1e-4, atol=1e-4)


def test_dft_everywhere_switches_and_restores():
    operators = [SpectralConv2d(8, 3, 3), SpectralConv2d(8, 2, 2)]
    operators[0].dft_max_points, operators[1].dft_max_points = 0, 64
    with dft_everywhere(torch.nn.Sequential(*operators)):
        assert all(op.dft_max_points >= 10**9 for op in operators)
    assert [op.dft_max_points for op in operators] == [0, 64]


@pytest.fixture(scope="module")
def tiny_model_and_input():
    model = randomize_pde(tiny_model(num_classes=10))
    return model, torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(0))  # not square


def run_onnx(path: Path, x: torch.Tensor) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path))
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_onnx_runtime_matches_pytorch_at_any_batch(tiny_model_and_input, tmp_path):
    pytest.importorskip("onnxscript")
    model, x = tiny_model_and_input
    to_onnx(model, tmp_path / "model.onnx", x.shape[1:])
    for batch in (1, 3):
        images = torch.randn(batch, *x.shape[1:])
        with torch.no_grad():
            expected = model(images).numpy()
        np.testing.assert_allclose(run_onnx(tmp_path / "model.onnx", images), expected, rtol=1e-4, atol=1e-4)


def test_torchscript_onnx_exporter_with_a_dynamic_batch(tmp_path):
    """timm's and most users' default: the TorchScript-based exporter (``dynamo=False``)."""
    model = randomize_pde(tiny_model(num_classes=10)).eval()
    x = torch.randn(2, 3, 32, 32)
    path = tmp_path / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    for batch in (1, 3):
        images = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = model(images).numpy()
        np.testing.assert_allclose(run_onnx(path, images), expected, rtol=1e-4, atol=1e-4)


def test_torch_export_matches_eager(tiny_model_and_input):
    model, x = tiny_model_and_input
    with dft_everywhere(model), torch.no_grad():
        program = torch.export.export(model, (x,))
        exported = program.module()(x)
    with torch.no_grad():
        torch.testing.assert_close(exported, model(x), rtol=1e-4, atol=1e-5)
