"""Export to ONNX (both exporters) and torch.export, against eager PyTorch."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import randomize_pde, tiny_model

from iris_timm.export import to_onnx


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
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        exported = program.module()(x)
    with torch.no_grad():
        torch.testing.assert_close(exported, model(x), rtol=1e-4, atol=1e-5)
