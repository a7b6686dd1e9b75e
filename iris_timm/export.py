"""Export iris models to ONNX.

The PDE operator is matrix products, which the exporters take as they are. The exported graph is fixed to the input
size it was traced at (the transform matrices are sized for that grid); the batch size stays free.

    from iris_timm.export import to_onnx
    to_onnx(timm.create_model("iris_pdessm_s").eval(), "iris_pdessm_s.onnx", (3, 224, 224))
"""

from collections.abc import Sequence
from pathlib import Path

import torch

from .files import atomic_write

__all__ = ["to_onnx"]


def to_onnx(model: torch.nn.Module, path: str | Path, input_size: Sequence[int]) -> torch.onnx.ONNXProgram:
    """Export ``model`` (in eval mode) for inputs of ``(batch, *input_size)``, any batch, to the ONNX file ``path``."""
    param = next(model.parameters())
    # Batch 2: torch.export specialises a dimension traced at size 1 to the constant 1.
    example = torch.zeros(2, *input_size, device=param.device, dtype=param.dtype)
    batch = {0: torch.export.Dim("batch")}
    with torch.no_grad():
        program = torch.onnx.export(model.eval(), (example,), dynamo=True, dynamic_shapes=(batch,))
    with atomic_write(path) as partial:  # a crash never leaves a truncated model at `path`
        program.save(str(partial))
    return program
