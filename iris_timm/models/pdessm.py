"""IRIS PDE-SSM backbones.

A hierarchical 4-stage backbone (stride 4/8/16/32) whose blocks pair a learned local filter with a global one:
a learnable convection–diffusion–reaction (CDR) operator (:mod:`iris_timm.layers.cdr`, linear in the number of
tokens, open image edges, any resolution). Each block is gated (MambaOut's design): one norm, one expanding linear
split into gate, identity and spatial channels, a depthwise conv plus the CDR operator on the spatial channels, and
one projecting linear. Its hidden width is ``expansion_ratio * dim`` rounded up to a multiple of ``multiple_of``
(LLaMA's rule), widths the CPU's matrix kernels run at full speed (docs/benchmarks.md). ``spatial_mix`` keeps one
of the two filters for ablations. Features stay channels-last ``(B, H, W, C)`` inside the network;
``forward_intermediates`` returns NCHW by default, like timm's other channels-last models.

Every registered name starts with ``iris_``. Pretrained weights, once published, follow the hub id
scheme ``iris-timm/<model name>.<tag>`` (for example ``iris-timm/iris_pdessm_s.in1k``), set through
``hf_hub_id='iris-timm/'`` in ``default_cfgs``. No weights are published yet, so the configs below
carry no ``hf_hub_id`` and ``pretrained=True`` raises timm's "No pretrained weights exist" error, as timm
does for any model without weights.
"""

import math
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import (
    ClNormMlpClassifierHead,
    DropPath,
    LayerNorm,
    LayerScale,
    calculate_drop_path_rates,
    get_act_layer,
    get_device_dtype,
    trunc_normal_,
)
from timm.models import (
    build_model_with_cfg,
    checkpoint_seq,
    generate_default_cfgs,
    register_model,
    register_notrace_function,
)
from timm.models._features import feature_take_indices
from timm.models._input import update_model_args
from torch import nn

from ..layers import (
    SPATIAL_MIXES,
    ConvectionDiffusionReaction2d,
    DynamicConvectionDiffusionReaction2d,
    create_spatial_filter,
)
from ..weights import check_pretrained_file, check_weights, keys_timm_adapts, weights_source

__all__ = ["GatedBlock", "IrisPDESSM", "hidden_width"]

# The hidden widths are rounded up to a multiple of this (the model argument ``multiple_of``); 1 keeps
# ``int(expansion_ratio * dim)``, the widths of folders saved before the option existed.
MULTIPLE_OF = 8


def _check_shape(x: torch.Tensor, in_chans: int, min_size: int) -> None:
    expected = f"(B, {in_chans}, H, W) with H, W >= {min_size}"
    if x.ndim != 4:
        raise ValueError(f"Expected an image batch of shape {expected}, got a {x.ndim}-D tensor {list(x.shape)}.")
    if x.shape[1] != in_chans:
        layout = (
            " It looks channels-last (B, H, W, C): permute it with x.permute(0, 3, 1, 2)."
            if x.shape[-1] == in_chans
            else f" Create the model with in_chans={x.shape[1]} to accept it."
        )
        raise ValueError(
            f"Expected an image batch of shape {expected}, got {list(x.shape)}: {x.shape[1]} channels instead of "
            f"{in_chans}.{layout}"
        )
    if x.shape[2] < min_size or x.shape[3] < min_size:
        raise ValueError(
            f"Expected an image batch of shape {expected}, got {list(x.shape)}: the input must be at least one "
            f"stem cell ({min_size} pixels) on each side."
        )


@torch.jit.unused  # TorchScript compiles a stub: a scripted model is never traced
def _check_shape_while_tracing(x: torch.Tensor, in_chans: int, min_size: int) -> None:
    """:func:`_check_shape` on the example input of ``torch.jit.trace`` (the TorchScript-based ONNX exporter), whose
    sizes are tensors. The checks add nothing to the graph, so the graph does not depend on them: the tracer's
    warning that their Python booleans might not generalise to other inputs is silenced, and only it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        _check_shape(x, in_chans, min_size)


@register_notrace_function
def check_input(x: torch.Tensor, in_chans: int, min_size: int) -> None:
    """Reject inputs the network cannot run, naming the shape it expects."""
    if torch.jit.is_tracing():
        _check_shape_while_tracing(x, in_chans, min_size)
    else:
        _check_shape(x, in_chans, min_size)


def _autocast_enabled(x: torch.Tensor) -> bool:
    """Whether autocast is on for ``x``'s device (never for a device without autocast, such as meta). TorchScript
    cannot read it per device: a scripted model assumes it is on, and lets the convolutions judge."""
    if torch.jit.is_scripting():
        return True
    device = x.device.type
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


@register_notrace_function
def check_dtype(x: torch.Tensor, weight: torch.Tensor) -> None:
    """Reject images the model would not take as they are, saying how to convert them: integer images, and
    floating-point images in another dtype than the weights' outside autocast (autocast casts float32, float16 and
    bfloat16 images itself, never float64)."""
    if not x.is_floating_point():
        advice = " uint8 images also need scaling to [0, 1] and normalising (timm's transforms do both)."
    elif x.dtype == weight.dtype or (x.dtype != torch.float64 and _autocast_enabled(x)):
        return
    elif x.dtype == torch.float64:
        advice = ""
    else:
        advice = " Or run the model under torch.autocast, which casts them itself."
    raise ValueError(
        f"Expected floating-point images in the model's dtype {weight.dtype}, got {x.dtype}. Convert them first: "
        f"x.to({weight.dtype}).{advice}"
    )


# Plain torch.fx (torchvision's create_feature_extractor, symbolic_trace) leaves the checks as calls too; timm's
# register_notrace_function covers only timm's own tracer.
torch.fx.wrap("check_input")
torch.fx.wrap("check_dtype")


def select_stages(num_stages: int, indices: int | list[int] | tuple[int, ...] | None) -> tuple[list[int], int]:
    """timm's ``feature_take_indices``, refusing an empty selection with a clear message."""
    if indices is not None and not isinstance(indices, int) and len(indices) == 0:
        raise ValueError(
            f"No stage selected (indices/out_indices is empty): give stage indices in 0..{num_stages - 1}, "
            "e.g. out_indices=(0, 1, 2, 3)."
        )
    return feature_take_indices(num_stages, indices)


class Stem(nn.Module):
    """Two 3x3 convolutions, ``(B, C_in, H, W)`` -> ``(B, H / stride, W / stride, C)``.

    ``stride`` 4 (ImageNet), 2 or 1 (small images such as CIFAR) sets how many of the two convs stride.
    """

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        stride: int = 4,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if stride not in (1, 2, 4):
            raise ValueError(f"stem stride must be 1, 2 or 4, got {stride}.")
        dd = {"device": device, "dtype": dtype}
        self.conv1 = nn.Conv2d(in_chs, out_chs // 2, 3, stride=min(stride, 2), padding=1, **dd)
        self.norm1 = norm_layer(out_chs // 2, **dd)
        self.act = act_layer()
        self.conv2 = nn.Conv2d(out_chs // 2, out_chs, 3, stride=stride // 2 or 1, padding=1, **dd)
        self.norm2 = norm_layer(out_chs, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x).permute(0, 2, 3, 1)  # (B, H/2, W/2, C/2)
        x = self.act(self.norm1(x)).permute(0, 3, 1, 2)
        x = self.conv2(x).permute(0, 2, 3, 1)  # (B, H/4, W/4, C)
        return self.norm2(x)


class Downsample(nn.Module):
    """3x3 stride-2 convolution then norm, channels-last in and out; odd sizes round up."""

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.conv = nn.Conv2d(in_chs, out_chs, 3, stride=2, padding=1, **dd)
        self.norm = norm_layer(out_chs, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # (B, H/2, W/2, C_out)
        return self.norm(x)


def hidden_width(dim: int, expansion_ratio: float, multiple_of: int) -> int:
    """The gated block's hidden width: ``int(expansion_ratio * dim)`` rounded up to a multiple of ``multiple_of``."""
    return multiple_of * math.ceil(int(expansion_ratio * dim) / multiple_of)


class GatedBlock(nn.Module):
    """Gated block (MambaOut's design, with a local and a global spatial filter): one norm, one residual.

    ``norm -> fc1 -> split (gate, identity, spatial) -> spatial filter -> act(gate) * cat(identity, spatial)
    -> fc2``, added to the input. ``fc1`` expands to ``2 * hidden`` channels (``hidden_width``); ``dim`` of them pass
    through the spatial filter (``spatial_layer``: :func:`iris_timm.layers.create_spatial_filter`).

    ``fc1``'s rows are the gate, identity and spatial channels in this order and ``fc2``'s columns the identity and
    spatial ones: each part is its own product, so every part is contiguous (the spatial filter reads its input
    where it lies) and the concatenation is never built: ``fc2`` applies to each gated part and the two are summed.
    """

    def __init__(
        self,
        dim: int,
        spatial_layer: Callable[..., nn.Module],
        expansion_ratio: float = 8 / 3,
        multiple_of: int = MULTIPLE_OF,
        ls_init_value: float | None = None,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if expansion_ratio < 1:
            raise ValueError(
                f"expansion_ratio must be at least 1 (the spatial channels are dim), got {expansion_ratio}."
            )
        hidden = hidden_width(dim, expansion_ratio, multiple_of)
        self.split_sizes = [hidden, hidden - dim, dim]  # gate, identity, spatial
        self.norm = norm_layer(dim, **dd)
        self.fc1 = nn.Linear(dim, 2 * hidden, **dd)
        self.spatial = spatial_layer(dim, **dd)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, dim, **dd)
        self.ls = LayerScale(dim, ls_init_value, **dd) if ls_init_value is not None else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x  # (B, H, W, C)
        x = self.norm(x)
        # Slices of the weights, not a split: exporters fold a slice of a constant into a constant.
        gate_end, identity_end = self.split_sizes[0], self.split_sizes[0] + self.split_sizes[1]
        weight, bias = self.fc1.weight, self.fc1.bias
        gate = self.act(F.linear(x, weight[:gate_end], bias[:gate_end]))  # (B, H, W, hidden)
        identity = F.linear(x, weight[gate_end:identity_end], bias[gate_end:identity_end])  # (B, H, W, hidden - C)
        spatial = self.spatial(F.linear(x, weight[identity_end:], bias[identity_end:]))  # (B, H, W, C)
        # dim=3, not -1: the TorchScript ONNX exporter loses the rank after the operator and resolves -1 wrongly.
        gate_identity, gate_spatial = torch.split(gate, self.split_sizes[1:], dim=3)
        # fc2 of act(gate) * cat(identity, spatial): the sum of its column blocks' products.
        num_identity = self.split_sizes[1]
        x = F.linear(gate_identity * identity, self.fc2.weight[:, :num_identity])
        x = x + F.linear(gate_spatial * spatial, self.fc2.weight[:, num_identity:], self.fc2.bias)  # (B, H, W, C)
        return shortcut + self.drop_path(self.ls(x))


class IrisStage(nn.Module):
    """Optional downsample, then ``depth`` gated blocks."""

    def __init__(
        self,
        dim: int,
        dim_out: int,
        depth: int,
        downsample: bool,
        drop_path: list[float],
        spatial_layer: Callable[..., nn.Module],
        expansion_ratio: float = 8 / 3,
        multiple_of: int = MULTIPLE_OF,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
        **block_kwargs: Any,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.grad_checkpointing = False
        self.downsample = Downsample(dim, dim_out, norm_layer, **dd) if downsample else nn.Identity()
        self.blocks = nn.Sequential(
            *[
                GatedBlock(
                    dim_out,
                    spatial_layer,
                    expansion_ratio,
                    multiple_of,
                    drop_path=drop_path[i],
                    norm_layer=norm_layer,
                    **block_kwargs,
                    **dd,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_architecture(
    depths: tuple[int, ...],
    dims: tuple[int, ...],
    multiple_of: int,
    kernel_size: int,
    spatial_mix: str,
    pde_modes: int,
) -> None:
    """Reject model arguments that would build a model whose forward fails, saying what is accepted."""
    if len(depths) != len(dims):
        raise ValueError(f"depths {depths} and dims {dims} must have the same length.")
    if not depths or not all(_is_int(d) and d >= 0 for d in depths):
        raise ValueError(f"depths must be whole numbers >= 0, one per stage, got {depths}.")
    if not all(_is_int(d) and d >= 1 for d in dims):
        raise ValueError(f"dims must be whole numbers >= 1, one per stage, got {dims}.")
    if not _is_int(multiple_of) or multiple_of < 1:
        raise ValueError(
            f"multiple_of must be a whole number >= 1 (1 keeps int(expansion_ratio * dim)), got {multiple_of!r}."
        )
    if not _is_int(kernel_size) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(
            "kernel_size must be an odd whole number >= 1 (the depthwise conv keeps the grid size), "
            f"got {kernel_size!r}."
        )
    if spatial_mix not in SPATIAL_MIXES:
        raise ValueError(f"Unknown spatial_mix {spatial_mix!r}; choose one of {SPATIAL_MIXES}.")
    if not _is_int(pde_modes) or pde_modes < 0:
        raise ValueError(f"pde_modes must be a whole number >= 0 (0 keeps every mode), got {pde_modes!r}.")


class IrisPDESSM(nn.Module):
    """IRIS PDE-SSM backbone.

    Args:
        in_chans: input image channels.
        num_classes: classifier outputs; 0 for no classifier.
        global_pool: ``'avg'``, ``'max'``, ``'avgmax'`` or ``''`` (no pooling).
        depths: blocks per stage.
        dims: channels per stage.
        expansion_ratio: the gated blocks' hidden width is about ``expansion_ratio * dim``; ``fc1`` expands to
            twice it (gate and value halves).
        multiple_of: the hidden width, ``int(expansion_ratio * dim)``, is rounded up to a multiple of this; ``1``
            keeps it (the widths of folders saved before this option existed).
        kernel_size: the depthwise conv's kernel size.
        spatial_mix: what each block's spatial filter holds: ``'both'`` (``dwconv(x) + CDR(x)``, the design), or the
            ablations ``'local'`` (``dwconv(x)``: MambaOut's block) and ``'global'`` (``CDR(x)``).
        pde_heads: channels share the CDR operator's coefficients in this many heads per block; ``None``: one set
            per channel.
        pde_modes: the CDR operator's content-frequency cut-off (see :mod:`iris_timm.layers.cdr`); ``0`` keeps
            every mode with no resolution floor.
        pde_gain_init: initial value of a learned per-channel gain on the operator's path (``'both'`` only);
            ``None``: no gain. At ``0.0`` each block starts as its local-only ablation.
        pde_dynamic: each sample gets its own operator, its coefficients shifted by a map of the filter input's
            spatial mean (:class:`iris_timm.layers.DynamicConvectionDiffusionReaction2d`), starting at zero.
        stem_stride: 4 for ImageNet-sized inputs; 2 or 1 for small images such as CIFAR's 32x32.
        ls_init_value: initial layer scale; ``None`` disables layer scale.
        drop_rate: dropout before the classifier.
        drop_path_rate: stochastic depth rate, growing linearly to this value over the blocks.
    """

    def __init__(
        self,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        depths: tuple[int, ...] = (3, 4, 15, 3),
        dims: tuple[int, ...] = (64, 128, 320, 512),
        expansion_ratio: float = 8 / 3,
        multiple_of: int = MULTIPLE_OF,
        kernel_size: int = 7,
        spatial_mix: str = "both",
        pde_heads: int | None = None,
        pde_modes: int = 6,
        pde_gain_init: float | None = None,
        pde_dynamic: bool = False,
        stem_stride: int = 4,
        ls_init_value: float | None = None,
        act_layer: str | type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = LayerNorm,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        check_architecture(depths, dims, multiple_of, kernel_size, spatial_mix, pde_modes)
        dd = {"device": device, "dtype": dtype}
        act_layer = get_act_layer(act_layer)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.expansion_ratio, self.multiple_of = expansion_ratio, multiple_of
        self.output_fmt = "NHWC"
        # Every stride-2 conv rounds up, so any input of at least one stem cell gives every stage a grid >= 1x1.
        self.min_input_size = stem_stride

        self.stem = Stem(in_chans, dims[0], stem_stride, act_layer=act_layer, norm_layer=norm_layer, **dd)
        spatial_layer = partial(
            create_spatial_filter,
            spatial_mix=spatial_mix,
            kernel_size=kernel_size,
            num_heads=pde_heads,
            modes=pde_modes,
            gain_init=pde_gain_init,
            dynamic=pde_dynamic,
        )
        drop_path_rates = calculate_drop_path_rates(drop_path_rate, depths, stagewise=True)
        self.stages = nn.Sequential()
        self.feature_info = []
        stride = stem_stride
        for i, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
            stride *= 2 if i > 0 else 1
            self.stages.append(
                IrisStage(
                    dims[max(i - 1, 0)],
                    dim,
                    depth,
                    downsample=i > 0,
                    drop_path=drop_path_rates[i],
                    spatial_layer=spatial_layer,
                    expansion_ratio=expansion_ratio,
                    multiple_of=multiple_of,
                    norm_layer=norm_layer,
                    ls_init_value=ls_init_value,
                    act_layer=act_layer,
                    **dd,
                )
            )
            self.feature_info.append(dict(num_chs=dim, reduction=stride, module=f"stages.{i}"))

        self.num_features = self.head_hidden_size = dims[-1]
        self.head = ClNormMlpClassifierHead(
            self.num_features, num_classes, pool_type=global_pool, drop_rate=drop_rate, norm_layer=norm_layer, **dd
        )
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        if isinstance(module, DynamicConvectionDiffusionReaction2d):  # visited after its map: back to zero
            module.start_static()

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """The CDR operator's coefficients define an operator, not feature detectors: not decayed."""
        return {
            f"{module_name}.{param_name}"
            for module_name, module in self.named_modules()
            if isinstance(module, ConvectionDiffusionReaction2d)
            for param_name, _ in module.named_parameters(recurse=False)
        }

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return dict(
            stem=r"^stem",
            blocks=r"^stages\.(\d+)"
            if coarse
            else [
                (r"^stages\.(\d+)\.downsample", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
            ],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stages:
            stage.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None, reset_other: bool = False) -> None:
        self.num_classes = num_classes
        self.head.reset(
            num_classes, global_pool, reset_other=reset_other, in_features=self.num_features, **get_device_dtype(self)
        )
        self.head_hidden_size = self.head.num_features

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward features that also returns the outputs of the stages in ``indices``.

        Args:
            x: input images ``(B, C, H, W)``.
            indices: last n stages if int, all if None, these stages if a list (negative from the end).
            norm: accepted for timm's interface; stage outputs have no separate norm to apply.
            stop_early: stop after the last stage asked for.
            output_fmt: ``'NCHW'`` or ``'NHWC'`` for the intermediates.
            intermediates_only: return only the intermediates.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}.")
        check_input(x, self.in_chans, self.min_input_size)
        check_dtype(x, self.stem.conv1.weight)
        take_indices, max_index = select_stages(len(self.stages), indices)
        stages = self.stages if torch.jit.is_scripting() or not stop_early else self.stages[: max_index + 1]

        intermediates = []
        x = self.stem(x)  # (B, H/4, W/4, C)
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take_indices:
                intermediates.append(x.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else x)
        if intermediates_only:
            return intermediates
        return x, intermediates

    def prune_intermediate_layers(
        self,
        indices: int | list[int] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop the stages after the last one in ``indices`` (and the head); return the kept indices."""
        take_indices, max_index = select_stages(len(self.stages), indices)
        prune_end = max_index < len(self.stages) - 1
        self.stages = self.stages[: max_index + 1]
        if prune_end:
            # The head was sized for the last stage; the features now end earlier.
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
        if prune_head or prune_end:
            self.reset_classifier(0, "", reset_other=True)
        return take_indices

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.in_chans, self.min_input_size)
        check_dtype(x, self.stem.conv1.weight)
        x = self.stem(x)  # (B, H/4, W/4, C)
        return self.stages(x)  # (B, H/32, W/32, C_last)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        return self.forward_head(x)


def check_hidden_widths(weights: dict[str, Any], model: IrisPDESSM, source: str) -> None:
    """Refuse weights (tensors, or anything with a ``shape``) whose gated blocks have other hidden widths than
    ``model``'s, naming the smallest ``multiple_of`` that gives every block's width, where one does."""
    own = model.state_dict()
    fc2 = [  # (dim, saved hidden width, the model's) of each block the weights hold
        (own[key].shape[0], value.shape[1], own[key].shape[1])
        for key, value in weights.items()
        if key.endswith(".fc2.weight") and key in own and len(value.shape) == 2 and value.shape[0] == own[key].shape[0]
    ]
    if all(saved == ours for _, saved, ours in fc2):
        return
    width = partial(hidden_width, expansion_ratio=model.expansion_ratio)
    widest = max(saved for _, saved, _ in fc2)
    matching = [m for m in range(1, widest + 1) if all(width(d, multiple_of=m) == saved for d, saved, _ in fc2)]
    if matching:
        theirs, ours = sorted({(d, saved) for d, saved, _ in fc2}), sorted({(d, w) for d, _, w in fc2})
        raise ValueError(
            f"{source}: the gated blocks' hidden widths {[w for _, w in theirs]} (dims {[d for d, _ in theirs]}) are "
            f"those of multiple_of={matching[0]}, the model's {[w for _, w in ours]} those of multiple_of="
            f"{model.multiple_of}: create the model with multiple_of={matching[0]}."
        )


def checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: IrisPDESSM) -> dict[str, torch.Tensor]:
    """Accept a bare state dict or a training checkpoint that wraps it under 'model' or 'state_dict'; refuse
    weights saved with other hidden widths (naming the ``multiple_of`` to pass), that do not fit the model, in
    another dtype, or holding NaN or infinity (``iris_timm.weights``). timm's loaders (``pretrained=True`` with
    ``local-dir:``, ``hf-hub:`` or a file) call it on the model they built, so each refusal names what is wrong."""
    for key in ("model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], dict):
            state_dict = state_dict[key]
            break
    source = weights_source(getattr(model, "pretrained_cfg", None) or {})
    check_hidden_widths(state_dict, model, source)
    check_weights(state_dict, model, source, skip=keys_timm_adapts(model))
    return state_dict


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "fixed_input_size": False,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "stem.conv1",
        "classifier": "head.fc",
        "license": "apache-2.0",
        **kwargs,
    }


default_cfgs = generate_default_cfgs(
    {
        "iris_pdessm_t": _cfg(),
        "iris_pdessm_s": _cfg(),
        "iris_pdessm_b": _cfg(),
        "iris_pdessm_atto": _cfg(input_size=(3, 32, 32), pool_size=(1, 1), num_classes=10, crop_pct=1.0),
        "iris_pdessm_test": _cfg(input_size=(3, 64, 64), pool_size=(2, 2)),
    }
)


def _create_iris_pdessm(variant: str, pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    """Build a model; one from a saved folder whose ``model_args`` lack ``multiple_of`` (saved before the option
    existed) gets the widths it was saved with, and ``multiple_of`` is recorded for the folders saved from it."""
    saved_args = kwargs.get("pretrained_model_args")
    if saved_args is not None and "multiple_of" not in saved_args:
        kwargs.setdefault("multiple_of", 1)
    if pretrained:  # a truncated or corrupt weights file is named before timm's loader reads it
        check_pretrained_file(variant, **kwargs)
    model = build_model_with_cfg(
        IrisPDESSM,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter", flatten_sequential=True),
        **kwargs,
    )
    update_model_args(model, multiple_of=kwargs.get("multiple_of", MULTIPLE_OF))
    return model


@register_model
def iris_pdessm_t(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(3, 3, 9, 3), dims=(48, 96, 256, 384))
    return _create_iris_pdessm("iris_pdessm_t", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_s(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(3, 4, 15, 3), dims=(64, 128, 320, 512))
    return _create_iris_pdessm("iris_pdessm_s", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_b(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(3, 4, 27, 3), dims=(96, 192, 384, 768))
    return _create_iris_pdessm("iris_pdessm_b", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_atto(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    """CIFAR-sized (convnext_atto's widths and depths), for 32x32 images and CPU recipes."""
    model_args = dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320))
    return _create_iris_pdessm("iris_pdessm_atto", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_test(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    # The first stage's width (24) differs from its grid at the test size (16x16), so layouts are unambiguous.
    model_args = dict(depths=(1, 1, 1, 1), dims=(24, 32, 48, 64), pde_heads=4)
    return _create_iris_pdessm("iris_pdessm_test", pretrained=pretrained, **dict(model_args, **kwargs))
