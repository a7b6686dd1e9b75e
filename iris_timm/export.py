"""Export iris models to ONNX and ``torch.export``.

The default PDE operator is matrix products, which both exporters take as they are. The exporters do not lower
2-D real FFTs, so export switches the Fourier operators that use them (the learned weights of
``operator="spectral"``) to their matrix-product DFT (:meth:`iris_timm.layers.FourierOperator2d.rdft2`), which
computes the same spectrum with ``matmul``. The exported graph is fixed to the input size it was traced at: the
transform matrices are sized for that grid. The batch size stays free.

    from iris_timm.export import to_onnx
    to_onnx(timm.create_model("iris_pdessm_s").eval(), "iris_pdessm_s.onnx", (3, 224, 224))
"""

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from .files import atomic_write
from .layers import FourierOperator2d

__all__ = ["dft_everywhere", "to_onnx"]


@contextmanager
def dft_everywhere(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within the block, every Fourier operator of ``model`` uses the matrix-product DFT on every grid."""
    operators = [m for m in model.modules() if isinstance(m, FourierOperator2d)]
    saved = [op.dft_max_points for op in operators]
    for op in operators:
        op.dft_max_points = sys.maxsize
    try:
        yield model
    finally:
        for op, limit in zip(operators, saved, strict=True):
            op.dft_max_points = limit


def to_onnx(model: torch.nn.Module, path: str | Path, input_size: Sequence[int]) -> torch.onnx.ONNXProgram:
    """Export ``model`` (in eval mode) for inputs of ``(batch, *input_size)``, any batch, to the ONNX file ``path``."""
    param = next(model.parameters())
    # Batch 2: torch.export specialises a dimension traced at size 1 to the constant 1.
    example = torch.zeros(2, *input_size, device=param.device, dtype=param.dtype)
    batch = {0: torch.export.Dim("batch")}
    with dft_everywhere(model.eval()), torch.no_grad():
        program = torch.onnx.export(model, (example,), dynamo=True, dynamic_shapes=(batch,))
    with atomic_write(path) as partial:  # a crash never leaves a truncated model at `path`
        program.save(str(partial))
    return program
