"""The one check of weights before they are loaded or written: names, shapes and dtypes against a model, and finite
values.

Loading never casts silently and never loads part of a model: ``check_weights`` refuses weights that do not fit the
model (a missing or extra name, another shape), weights in another dtype than the model's, and weights holding NaN
or infinity, naming what is wrong. It takes tensors, or the names, shapes and dtypes that ``safetensors_header``
reads from a file's header without reading the tensors, so a file can be refused before it is read.
"""

import os
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

import timm
import torch
from safetensors import SafetensorError, safe_open
from timm.models import get_model_traits
from torch import nn

__all__ = ["TensorInfo", "check_weights", "check_weights_file", "keys_timm_adapts", "safetensors_header"]


class TensorInfo(NamedTuple):
    """What a tensor's checks need but its values: the shape, and the dtype (a str for dtypes torch lacks)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | str


# safetensors' dtype names (the header's "dtype" field) as torch dtypes.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# Arguments of timm.create_model that wrap the model into a feature extractor, whose names are not the weights'.
FEATURE_ARGS = ("features_only", "out_indices", "feature_cls", "feature_cfg")

Weights = Mapping[str, torch.Tensor | TensorInfo]


def safetensors_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Each tensor's shape and dtype in the safetensors file ``path``, from its header alone; a truncated or
    corrupt file is refused (``safe_open`` checks that the file covers every tensor)."""
    try:
        with safe_open(path, framework="pt") as f:
            slices = {key: f.get_slice(key) for key in f.keys()}
            header = {key: (tuple(s.get_shape()), s.get_dtype()) for key, s in slices.items()}
    except SafetensorError as e:
        raise ValueError(
            f"{path} is not a readable safetensors file ({e}): it is truncated or corrupt. Download it or save the "
            "model again."
        ) from e
    return {key: TensorInfo(shape, SAFETENSORS_DTYPES.get(dtype, dtype)) for key, (shape, dtype) in header.items()}


def _info(value: torch.Tensor | TensorInfo) -> TensorInfo:
    return TensorInfo(tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else value


def _refuse(problems: Sequence[str], lead: str, advice: str, separator: str = "; ") -> None:
    """Raise "``lead`` <the first three problems> (and N more). ``advice``" if there are ``problems``."""
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(f"{lead} {separator.join(problems[:3])}{more}. {advice}")


def check_weights(
    weights: Weights,
    reference: nn.Module | Weights | None,
    source: str,
    skip: Collection[str] = (),
) -> None:
    """Refuse ``weights`` (tensors, or ``safetensors_header``'s shapes and dtypes) that ``reference`` (a model, its
    state dict, or shapes and dtypes) would not load as they are: names missing or not in the model, other shapes,
    other dtypes (loading would cast them silently), and, for tensors, NaN or infinity. Without ``reference`` only
    the values are checked. ``skip`` names keys whose shape timm's loader changes (``keys_timm_adapts``).
    ``source`` names the weights in the error (a path, or "the weights at step 100")."""
    if reference is not None:
        state = reference.state_dict() if isinstance(reference, nn.Module) else reference
        own = {key: _info(value) for key, value in state.items() if key not in skip}
        found = {key: _info(value) for key, value in weights.items() if key not in skip}
        common = sorted(own.keys() & found.keys())
        misfits = [f"{key} is missing" for key in sorted(own.keys() - found.keys())]
        misfits += [f"{key} is not in the model" for key in sorted(found.keys() - own.keys())]
        misfits += [
            f"{key} has shape {list(found[key].shape)}, the model {list(own[key].shape)}"
            for key in common
            if found[key].shape != own[key].shape
        ]
        architecture = getattr(reference, "pretrained_cfg", {}).get("architecture")
        _refuse(
            misfits,
            f"{source}: the weights do not fit {repr(architecture) if architecture else 'the model'}:",
            "Build the model they were saved from (the architecture and model_args of their config.json), or save "
            "them again with iris_timm.save_pretrained.",
        )
        _refuse(
            [
                f"{key} is {found[key].dtype}, the model's {own[key].dtype}"
                for key in common
                if found[key].dtype != own[key].dtype
            ],
            f"{source}: tensors in another dtype than the model's:",
            "Nothing is cast silently: build the model in the weights' dtype (e.g. "
            "timm.create_model(..., dtype=torch.float16)), or convert the weights.",
        )
    non_finite = [
        key
        for key, value in weights.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not value.isfinite().all()
    ]
    _refuse(
        non_finite,
        f"{source}: NaN or infinity in",
        "The file is corrupt or training diverged: download it again or use an earlier checkpoint.",
        separator=", ",
    )


def keys_timm_adapts(model: nn.Module) -> set[str]:
    """The keys whose saved shapes timm's loader changes to fit ``model``: the classifier's when the model has
    another number of classes than its ``pretrained_cfg`` (a new head), the first convolution's when it has other
    input channels (adapted by ``adapt_input_conv``)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    traits = get_model_traits(model)
    adapted = set()
    classifiers = cfg.get("classifier") or ()
    if traits.get("num_classes", 0) != cfg.get("num_classes", traits.get("num_classes", 0)):
        for name in (classifiers,) if isinstance(classifiers, str) else classifiers:
            adapted |= {f"{name}.weight", f"{name}.bias"}
    first_convs = traits.get("first_conv", cfg.get("first_conv")) or ()
    saved_chans = (cfg.get("input_size") or (3,))[0]
    if traits.get("in_chans", saved_chans) != saved_chans:
        adapted |= {f"{name}.weight" for name in ((first_convs,) if isinstance(first_convs, str) else first_convs)}
    return adapted


def check_weights_file(path: str | os.PathLike, model_name: str, **kwargs: object) -> None:
    """Refuse the safetensors file ``path`` before ``timm.create_model(model_name, pretrained=True, **kwargs)``
    reads it: its header's names, shapes and dtypes are checked against the model these arguments build, on the
    meta device (no memory, no weights read). Values are not read: check the loaded model for NaN or infinity
    with ``check_weights(model.state_dict(), None, source)``."""
    kwargs = {key: value for key, value in kwargs.items() if key not in FEATURE_ARGS}
    reference = timm.create_model(model_name, **{**kwargs, "device": "meta"})
    check_weights(safetensors_header(path), reference, str(path), skip=keys_timm_adapts(reference))
