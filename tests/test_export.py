"""Export to ONNX (both exporters, a free batch and image size) and torch.export, against eager PyTorch."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from conftest import randomize_pde, tiny_model

from iris_timm.export import to_onnx
from iris_timm.layers import create_cdr

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

# Square, non-square and odd sizes, each run at another batch than the traced one (2).
SIZES = [(1, 64, 64), (3, 96, 80), (1, 75, 61)]


def relative_error(path: Path, model: torch.nn.Module, x: torch.Tensor) -> float:
    """max |ONNX Runtime − PyTorch| / max |PyTorch| on ``x``."""
    session = ort.InferenceSession(str(path))
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        expected = model(x).numpy()
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def assert_exact_at(path: Path, model: torch.nn.Module, shapes: list[tuple[int, ...]], channels: int = 3) -> None:
    generator = torch.Generator().manual_seed(1)
    for batch, *grid in shapes:
        x = torch.randn(batch, channels, *grid, generator=generator)
        assert relative_error(path, model, x) <= 1e-4, (batch, *grid)


def timm_onnx_export(model: torch.nn.Module, path: Path) -> None:
    from timm.utils.onnx import onnx_export

    onnx_export(model, str(path), input_size=(3, 64, 64), batch_size=2, dynamic_size=True, check=False)


def iris_to_onnx(model: torch.nn.Module, path: Path) -> None:
    to_onnx(model, path, (3, 64, 64), dynamic_size=True)


@pytest.mark.parametrize(
    ("export", "pde_dynamic"), [(iris_to_onnx, False), (timm_onnx_export, False), (iris_to_onnx, True)]
)
def test_onnx_with_a_free_size_matches_pytorch_at_every_size(export, pde_dynamic, tmp_path):
    """Traced at 64², the graph builds the operator's transforms from the input's size: exact at other sizes, so the
    tracer has nothing to warn about (the input checks add nothing to the graph); per-sample operators too."""
    model = randomize_pde(tiny_model(num_classes=10, pde_dynamic=pde_dynamic))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export(model, tmp_path / "model.onnx")
    assert not [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert_exact_at(tmp_path / "model.onnx", model, SIZES)


def test_iris_pdessm_t_onnx_traced_at_64_runs_at_224(tmp_path):
    """The ImageNet model with a free size: its stage grids pass both sides of DENSE_MAX_SIZE between 64² and 224²."""
    torch.manual_seed(0)
    model = randomize_pde(timm.create_model("iris_pdessm_t").eval())
    to_onnx(model, tmp_path / "model.onnx", (3, 64, 64), dynamic_size=True)
    assert_exact_at(tmp_path / "model.onnx", model, [(1, 64, 64), (1, 96, 80), (1, 224, 224)])


def test_dynamo_exporter_with_a_free_size_matches_the_operator(tmp_path):
    """``dynamo=True`` with ``dynamic_shapes``, on the operator alone (torch.export's symbolic sizes cost minutes on a
    whole model): exact at sizes on both sides of DENSE_MAX_SIZE, odd and of other aspect ratios."""
    op = randomize_pde(create_cdr(8, num_heads=4)).eval()
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("height"), 2: torch.export.Dim("width")}
    with torch.no_grad():
        program = torch.onnx.export(op, (torch.randn(2, 20, 20, 8),), dynamo=True, dynamic_shapes=(dims,))
    program.save(str(tmp_path / "operator.onnx"))
    generator = torch.Generator().manual_seed(1)
    for shape in [(1, 20, 20), (3, 33, 7), (1, 5, 40), (1, 64, 48)]:
        x = torch.randn(*shape, 8, generator=generator)
        assert relative_error(tmp_path / "operator.onnx", op, x) <= 1e-4, shape


def test_onnx_at_a_fixed_size_matches_pytorch_at_any_batch(tmp_path):
    model = randomize_pde(tiny_model(num_classes=10))
    to_onnx(model, tmp_path / "model.onnx", (3, 64, 80))
    assert_exact_at(tmp_path / "model.onnx", model, [(1, 64, 80), (3, 64, 80)])


def test_failed_export_writes_no_file(tmp_path):
    with pytest.raises(ValueError, match="channels instead of"):
        to_onnx(tiny_model(num_classes=10), tmp_path / "model.onnx", (4, 64, 64), dynamic_size=True)
    assert not list(tmp_path.iterdir())


def test_torch_export_matches_eager():
    model = randomize_pde(tiny_model(num_classes=10))
    x = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(torch.export.export(model, (x,)).module()(x), model(x), rtol=1e-4, atol=1e-5)
