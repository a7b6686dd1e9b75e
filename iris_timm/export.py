"""Export iris models to ONNX.

The CDR operator is matrix products, which the exporters take as they are. Where an exporter records the graph, the
operator builds its transforms inside it from the input's size, so a graph exported with a free image size computes
the same operator at every size, with either exporter (``torch.onnx.export(..., dynamo=False)`` and
``dynamic_axes``, as timm's ``onnx_export(..., dynamic_size=True)`` calls it, or ``dynamo=True`` and
``dynamic_shapes``).

    from iris_timm.export import to_onnx
    to_onnx(timm.create_model("iris_pdessm_s").eval(), "iris_pdessm_s.onnx", (3, 224, 224))  # 224², any batch
    to_onnx(model, "iris_pdessm_s_any_size.onnx", (3, 224, 224), dynamic_size=True)  # any batch and size
"""

import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from .files import atomic_write

__all__ = ["to_onnx"]


def to_onnx(model: torch.nn.Module, path: str | Path, input_size: Sequence[int], dynamic_size: bool = False) -> Path:
    """Export ``model`` (in eval mode), traced on inputs of ``(batch, *input_size)``, to the ONNX file ``path`` for
    any batch and, with ``dynamic_size``, any height and width. The graph's input is ``images``, its output
    ``logits``. Returns ``path``."""
    param = next(model.parameters())
    # Batch 2: torch.export specialises a dimension traced at size 1 to the constant 1.
    example = torch.zeros(2, *input_size, device=param.device, dtype=param.dtype)
    names = {"input_names": ["images"], "output_names": ["logits"]}
    with torch.no_grad(), atomic_write(path) as partial:  # a crash never leaves a truncated model at `path`
        if dynamic_size:
            # torch.export reasons symbolically about every size of the graph, which takes minutes on a whole
            # model; the TorchScript-based exporter records the same operations in seconds.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                axes = {"images": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
                torch.onnx.export(model.eval(), (example,), str(partial), dynamo=False, dynamic_axes=axes, **names)
        else:
            batch = {0: torch.export.Dim("batch")}
            program = torch.onnx.export(model.eval(), (example,), dynamo=True, dynamic_shapes=(batch,), **names)
            program.save(str(partial))
    return Path(path)
