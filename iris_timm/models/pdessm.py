"""IRIS PDE-SSM backbones.

A hierarchical 4-stage MetaFormer (stride 4/8/16/32) whose token mixer is the PDE-SSM mixer:
a learnable convection–diffusion–reaction operator applied in Fourier space (O(N log N) in the
number of tokens), plus a pointwise path, a local token differential and a self-gate. Features
stay channels-last ``(B, H, W, C)`` inside the network; ``forward_intermediates`` returns NCHW by
default, like timm's other channels-last models.

Every registered name starts with ``iris_``. Pretrained weights, once published, follow the hub id
scheme ``iris-timm/<model name>.<tag>`` (for example ``iris-timm/iris_pdessm_s.in1k``), set through
``hf_hub_id='iris-timm/'`` in ``default_cfgs``. No weights are published yet, so the configs below
carry no ``hf_hub_id`` and ``pretrained=True`` warns and keeps the random initialisation, as timm does.
"""

from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import (
    ClNormMlpClassifierHead,
    DropPath,
    LayerNorm,
    LayerScale,
    Mlp,
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
from torch import nn

from ..layers import ConvectionDiffusionReaction2d, PDESSMMixer, SpectralConv2d

__all__ = ["IrisPDESSM"]


@register_notrace_function
def check_input(x: torch.Tensor, in_chans: int, min_size: int) -> None:
    """Reject inputs the network cannot run, naming the shape it expects."""
    expected = f"(B, {in_chans}, H, W) with H, W >= {min_size}"
    if x.ndim != 4:
        raise ValueError(f"Expected an image batch of shape {expected}, got a {x.ndim}-D tensor {list(x.shape)}.")
    if x.shape[1] != in_chans:
        raise ValueError(
            f"Expected an image batch of shape {expected}, got {list(x.shape)}: {x.shape[1]} channels instead of "
            f"{in_chans}. Create the model with in_chans={x.shape[1]} to accept it."
        )
    if x.shape[2] < min_size or x.shape[3] < min_size:
        raise ValueError(
            f"Expected an image batch of shape {expected}, got {list(x.shape)}: the input must be at least as "
            f"large as the network's total stride ({min_size})."
        )


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


class IrisBlock(nn.Module):
    """MetaFormer block: ``x + drop_path(ls(mixer(norm(x))))``, then ``x + drop_path(ls(mlp(norm(x))))``."""

    def __init__(
        self,
        dim: int,
        mlp_ratio: float = 4.0,
        operator: str = "pde",
        pde_heads: int | None = None,
        spectral_modes: int = 8,
        token_diff: str = "local",
        ls_init_value: float | None = 1e-6,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.mixer = PDESSMMixer(
            dim,
            operator,
            pde_heads=pde_heads,
            spectral_modes=spectral_modes,
            spectral_depthwise=True,
            token_diff=token_diff,
            **dd,
        )
        self.ls1 = LayerScale(dim, ls_init_value, **dd) if ls_init_value is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, **dd)
        self.ls2 = LayerScale(dim, ls_init_value, **dd) if ls_init_value is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.mixer(self.norm1(x))))  # (B, H, W, C)
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class IrisStage(nn.Module):
    """Optional downsample, then ``depth`` blocks."""

    def __init__(
        self,
        dim: int,
        dim_out: int,
        depth: int,
        downsample: bool,
        drop_path: list[float],
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
                IrisBlock(dim_out, drop_path=drop_path[i], norm_layer=norm_layer, **block_kwargs, **dd)
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)


class IrisPDESSM(nn.Module):
    """IRIS PDE-SSM backbone.

    Args:
        in_chans: input image channels.
        num_classes: classifier outputs; 0 for no classifier.
        global_pool: ``'avg'``, ``'max'``, ``'avgmax'`` or ``''`` (no pooling).
        depths: blocks per stage.
        dims: channels per stage.
        mlp_ratio: MLP hidden width over block width.
        operator: global operator of the mixer: ``'pde'``, ``'spectral'`` (GFNet-style learned weights
            on ``spectral_modes`` low modes per channel) or ``'pde+spectral'``.
        pde_heads: channels share PDE coefficients in this many heads per block; ``None``: per channel.
        spectral_modes: modes kept by the ``'spectral'`` operator (a fixed count, any grid runs).
        token_diff: ``'local'`` (3x3 high-pass), ``'global'`` (minus the global mean) or ``'none'``.
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
        depths: tuple[int, ...] = (2, 2, 6, 2),
        dims: tuple[int, ...] = (64, 128, 320, 512),
        mlp_ratio: float = 4.0,
        operator: str = "pde",
        pde_heads: int | None = None,
        spectral_modes: int = 8,
        token_diff: str = "local",
        stem_stride: int = 4,
        ls_init_value: float | None = 1e-6,
        act_layer: str | type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = LayerNorm,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if len(depths) != len(dims):
            raise ValueError(f"depths {depths} and dims {dims} must have the same length.")
        dd = {"device": device, "dtype": dtype}
        act_layer = get_act_layer(act_layer)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.output_fmt = "NHWC"
        self.min_input_size = stem_stride * 2 ** (len(depths) - 1)  # the total stride

        self.stem = Stem(in_chans, dims[0], stem_stride, act_layer=act_layer, norm_layer=norm_layer, **dd)
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
                    norm_layer=norm_layer,
                    mlp_ratio=mlp_ratio,
                    operator=operator,
                    pde_heads=pde_heads,
                    spectral_modes=spectral_modes,
                    token_diff=token_diff,
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

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """The PDE coefficients and spectral weights define operators, not feature detectors: not decayed."""
        return {
            f"{module_name}.{param_name}"
            for module_name, module in self.named_modules()
            if isinstance(module, (ConvectionDiffusionReaction2d, SpectralConv2d))
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
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
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
        take_indices, max_index = feature_take_indices(len(self.stages), indices)
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
        x = self.stem(x)  # (B, H/4, W/4, C)
        return self.stages(x)  # (B, H/32, W/32, C_last)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(x)
        return self.forward_head(x)


def checkpoint_filter_fn(state_dict: dict[str, torch.Tensor], model: IrisPDESSM) -> dict[str, torch.Tensor]:
    """Accept a bare state dict or a training checkpoint that wraps it under 'model' or 'state_dict'."""
    for key in ("model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], dict):
            return state_dict[key]
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
        "iris_pdessm_test": _cfg(input_size=(3, 64, 64), pool_size=(2, 2)),
    }
)


def _create_iris_pdessm(variant: str, pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    return build_model_with_cfg(
        IrisPDESSM,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter"),
        **kwargs,
    )


@register_model
def iris_pdessm_t(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(2, 2, 6, 2), dims=(64, 128, 320, 512))
    return _create_iris_pdessm("iris_pdessm_t", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_s(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(3, 4, 12, 3), dims=(64, 128, 320, 512))
    return _create_iris_pdessm("iris_pdessm_s", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_b(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(3, 3, 18, 3), dims=(96, 192, 384, 768))
    return _create_iris_pdessm("iris_pdessm_b", pretrained=pretrained, **dict(model_args, **kwargs))


@register_model
def iris_pdessm_test(pretrained: bool = False, **kwargs: Any) -> IrisPDESSM:
    model_args = dict(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), pde_heads=4)
    return _create_iris_pdessm("iris_pdessm_test", pretrained=pretrained, **dict(model_args, **kwargs))
