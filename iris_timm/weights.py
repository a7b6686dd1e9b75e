"""The one check of weights before they are loaded or written: names, shapes and dtypes against a model, and finite
values.

Loading never casts silently and never loads part of a model: ``check_weights`` refuses weights that do not fit the
model (a missing or extra name, another shape), weights in another dtype than the model's, and weights holding NaN
or infinity, naming what is wrong. It takes tensors, or the names, shapes and dtypes that ``safetensors_header``
reads from a file's header without reading the tensors, so a file can be refused before it is read.

timm's own loaders (``timm.create_model(..., pretrained=True)``) read the weights file before any model code sees it;
an iris model names the file they are about to read (:func:`pretrained_weights_file`) and refuses it when truncated
or corrupt (:func:`check_pretrained_file`), then checks the tensors they read in its ``checkpoint_filter_fn``.
"""

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import timm
import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open
from timm.models import get_model_traits, resolve_pretrained_cfg
from torch import nn

__all__ = [
    "TensorInfo",
    "check_pretrained_file",
    "check_weights",
    "check_weights_file",
    "keys_timm_adapts",
    "pretrained_weights_file",
    "safetensors_header",
    "weights_source",
]


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
# The weights file timm's local-dir: and hf-hub: loaders read first.
WEIGHTS_FILE = "model.safetensors"
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


def pretrained_weights_file(
    pretrained_cfg: Mapping[str, Any], cache_dir: str | os.PathLike | None = None
) -> Path | None:
    """The safetensors file timm's loader reads for a model's resolved ``pretrained_cfg``, where it can be named
    before timm reads it: a ``local-dir:`` folder's ``model.safetensors``, a ``file=`` overlay's ``.safetensors``, or
    a Hub repo's ``model.safetensors`` that the Hugging Face cache already holds. None otherwise (another format, or a
    download still to come, which timm then makes whole)."""
    source, file = pretrained_cfg.get("source"), pretrained_cfg.get("file")
    if source == "local-dir" and file:
        path = Path(file) / WEIGHTS_FILE
        return path if path.is_file() else None
    if source == "hf-hub" and pretrained_cfg.get("hf_hub_id"):
        repo_id, _, revision = pretrained_cfg["hf_hub_id"].partition("@")
        cached = try_to_load_from_cache(repo_id, WEIGHTS_FILE, cache_dir=cache_dir, revision=revision or None)
        return Path(cached) if isinstance(cached, str) else None
    if file and not pretrained_cfg.get("state_dict") and str(file).endswith(".safetensors"):
        return Path(file)
    return None


def weights_source(pretrained_cfg: Mapping[str, Any]) -> str:
    """What to call the weights timm loaded for a model with this ``pretrained_cfg``, in an error: the file where
    there is one (a ``local-dir:`` folder's ``model.safetensors``), else the Hub repo or the architecture."""
    if pretrained_cfg.get("source") == "local-dir" and pretrained_cfg.get("file"):
        return str(Path(pretrained_cfg["file"]) / WEIGHTS_FILE)
    named = pretrained_cfg.get("file") or pretrained_cfg.get("hf_hub_id")
    return str(named) if named else f"the weights of {pretrained_cfg.get('architecture', 'the model')}"


def check_pretrained_file(
    variant: str,
    pretrained_cfg: str | Mapping[str, Any] | None = None,
    pretrained_cfg_overlay: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    **model_kwargs: object,
) -> None:
    """Refuse, naming it, a truncated or corrupt safetensors file that ``timm.create_model(..., pretrained=True)`` is
    about to read for the model ``variant``: a model's entry point calls it with the arguments timm passed it (the
    ``model_kwargs`` are not used) before timm's loader runs, which would end in safetensors' error without the
    file's name. Only the header is read."""
    resolved = resolve_pretrained_cfg(variant, pretrained_cfg, dict(pretrained_cfg_overlay or {})).to_dict()
    path = pretrained_weights_file(resolved, cache_dir)
    if path is not None:
        safetensors_header(path)
