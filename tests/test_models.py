"""What timm's own tests/test_models.py does not check on the iris_* models (.ci/timm_tests.py runs that suite on
them: forward, backward, default cfgs, TorchScript, features, intermediates, torch.fx): their sizes, the hidden
widths and the gated block against its concatenating form, folders saved before ``multiple_of``, pruning,
compilation, optimizer groups, the ablation switch, any resolution, bad input, autocast and plain torch.fx tracing.
"""

import json
import math

import pytest
import timm
import torch
from conftest import randomize_pde
from timm.models import group_parameters
from timm.optim import param_groups_weight_decay
from torchvision.models.feature_extraction import create_feature_extractor

import iris_timm
from iris_timm.layers import (
    ConvectionDiffusionReaction2d,
    DepthwiseConv,
    DynamicConvectionDiffusionReaction2d,
    LocalPlusGlobal,
)
from iris_timm.models.pdessm import GatedBlock

MODELS = timm.list_models("iris_*")
FEAT_SIZE = 96  # timm: 96


def input_size(model_name: str, target: int) -> tuple[int, int, int]:
    size = timm.get_pretrained_cfg_value(model_name, "input_size")
    return tuple(min(s, target) for s in size)


def assert_all_grads(model: torch.nn.Module) -> None:
    for name, param in model.named_parameters():
        assert param.grad is not None, f"No gradient for {name}"
        assert param.grad.isfinite().all(), f"Non-finite gradient for {name}"


def test_the_family_is_registered():
    assert {"iris_pdessm_t", "iris_pdessm_s", "iris_pdessm_b", "iris_pdessm_atto", "iris_pdessm_test"} <= set(MODELS)
    assert timm.list_models("iris_pdessm*") == MODELS
    assert all(timm.get_pretrained_cfg(name) is not None for name in MODELS)


@pytest.mark.parametrize(
    ("model_name", "params_m", "max_gmacs"),
    [("iris_pdessm_t", (10, 15), None), ("iris_pdessm_s", (20, 35), 5.0), ("iris_pdessm_b", (45, 90), None)],
)
def test_sizes_are_in_range(model_name, params_m, max_gmacs):
    from iris_timm.flops import count_macs, count_params

    model = timm.create_model(model_name)
    assert params_m[0] <= count_params(model) / 1e6 <= params_m[1]
    if max_gmacs is not None:
        assert count_macs(model, (3, 224, 224)) / 1e9 <= max_gmacs


@pytest.mark.parametrize(
    ("multiple_of", "widths"),
    [
        (1, [170, 341, 853, 1365]),  # int(8 / 3 * dim), the widths before the option
        (8, [176, 344, 856, 1368]),
        (32, [192, 352, 864, 1376]),
        (64, [192, 384, 896, 1408]),
    ],
)
def test_hidden_widths_round_up_to_a_multiple(multiple_of, widths):
    model = timm.create_model("iris_pdessm_s", multiple_of=multiple_of, device="meta")  # dims 64, 128, 320, 512
    for stage, width in zip(model.stages, widths, strict=True):
        for block in stage.blocks:
            assert block.fc1.out_features == 2 * width and block.fc2.in_features == width


def concatenating_block(block: GatedBlock, x: torch.Tensor) -> torch.Tensor:
    """The gated block as one ``fc1``, split, the concatenation of identity and filtered channels, one ``fc2``."""
    gate, identity, spatial = torch.split(block.fc1(block.norm(x)), block.split_sizes, dim=3)
    y = block.act(gate) * torch.cat((identity, block.spatial(spatial)), dim=3)
    return x + block.ls(block.fc2(y))


@pytest.mark.parametrize("spatial_mix", ["both", "local", "global"])
@pytest.mark.parametrize("grid", [(14, 14), (5, 9), (20, 17)])
def test_the_block_equals_its_concatenating_form_with_its_gradients(spatial_mix, grid):
    """Same weights, same outputs, and the same gradients of the input and of every weight."""
    torch.manual_seed(0)
    model = randomize_pde(timm.create_model("iris_pdessm_test", spatial_mix=spatial_mix, ls_init_value=0.5))
    block = model.stages[1].blocks[0]  # dim 32, hidden 96
    x = torch.randn(2, *grid, 32, requires_grad=True)
    grad_out = torch.randn(2, *grid, 32)
    results = []
    for forward in (block, lambda x: concatenating_block(block, x)):
        out = forward(x)
        grads = torch.autograd.grad(out, [x, *block.parameters()], grad_out)
        results.append((out, grads))
    (out, grads), (want, want_grads) = results
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for name, got, expected in zip(["input", *dict(block.named_parameters())], grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("load", ["from_pretrained", "timm local-dir"])
def test_a_folder_saved_before_multiple_of_loads_with_its_widths(tmp_path, load):
    """Such a folder is a save of a model with the unrounded widths whose ``model_args`` lack ``multiple_of``."""
    torch.manual_seed(0)
    model = randomize_pde(timm.create_model("iris_pdessm_test", multiple_of=1, num_classes=5)).eval()
    folder = iris_timm.save_pretrained(model, tmp_path / "old")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_args"].pop("multiple_of") == 1
    (folder / "config.json").write_text(json.dumps(config))
    if load == "from_pretrained":
        loaded = iris_timm.from_pretrained(folder)
    else:
        loaded = timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert loaded.multiple_of == 1
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), model(x), rtol=0, atol=0)
    resaved = iris_timm.save_pretrained(loaded, tmp_path / "new")
    assert json.loads((resaved / "config.json").read_text())["model_args"]["multiple_of"] == 1


@pytest.mark.parametrize(
    ("multiple_of", "damage", "message"),
    [
        (1, None, r"hidden widths \[64, 85, 128, 170\] \(dims \[24, 32, 48, 64\]\) .*multiple_of=1\.$"),
        (64, None, r"hidden widths \[64, 128, 128, 192\] .* those of multiple_of=8: .*multiple_of=64\.$"),
        (8, "stages.3.blocks.0.fc2.weight", r"do not fit .*fc2\.weight has shape \[64, 1\]"),  # no multiple gives it
    ],
    ids=["old widths", "another multiple", "damaged"],
)
def test_weights_of_other_widths_name_the_multiple_of_to_pass(tmp_path, multiple_of, damage, message):
    """Weights whose config cannot tell (a bare state dict) end in one line naming the option."""
    weights = timm.create_model("iris_pdessm_test", multiple_of=multiple_of).state_dict()
    if damage is not None:
        weights[damage] = weights[damage][:, :1]
    torch.save(weights, tmp_path / "weights.pth")
    overlay = dict(file=str(tmp_path / "weights.pth"))
    with pytest.raises(ValueError, match=message):
        timm.create_model("iris_pdessm_test", pretrained=True, pretrained_cfg_overlay=overlay)


@pytest.mark.parametrize("model_name", MODELS)
def test_model_prune_intermediate_layers(model_name):
    model = timm.create_model(model_name).eval()
    x = torch.randn(1, *input_size(model_name, FEAT_SIZE))
    expected = model.forward_intermediates(x, intermediates_only=True)
    kept = model.prune_intermediate_layers(indices=[0, 1])
    assert kept == [0, 1] and len(model.stages) == 2
    assert model.num_classes == 0 and model.num_features == model.feature_info[1]["num_chs"]
    torch.testing.assert_close(model.forward_intermediates(x, indices=[0, 1], intermediates_only=True), expected[:2])
    assert model(x).shape[-1] == model.num_features  # the head is gone: unpooled NHWC features

    getter = timm.create_model(model_name, features_only=True, feature_cls="getter", out_indices=(0, 2)).eval()
    assert len(getter.model.stages) == 3
    assert [o.shape[1] for o in getter(x)] == getter.feature_info.channels()


def test_model_torch_compile():
    model = timm.create_model("iris_pdessm_test").eval()
    x = torch.randn(2, 3, 64, 64)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_name", MODELS)
def test_model_optimizer_groups(model_name):
    model = timm.create_model(model_name)
    no_decay = model.no_weight_decay()
    names = dict(model.named_parameters())
    pde = [n for n, m in model.named_modules() if isinstance(m, ConvectionDiffusionReaction2d)]
    assert pde and all(f"{n}.velocity" in no_decay and f"{n}.log_diffusion" in no_decay for n in pde)
    assert no_decay <= names.keys()
    decay_group, no_decay_group = param_groups_weight_decay(model, 0.05, no_decay)
    assert not any(p is names[f"{pde[0]}.velocity"] for p in decay_group["params"])
    assert sum(p.numel() for p in no_decay_group["params"]) + sum(p.numel() for p in decay_group["params"]) == sum(
        p.numel() for p in model.parameters()
    )
    for coarse in (False, True):
        groups = group_parameters(model, model.group_matcher(coarse=coarse))
        assert sum(len(g) for g in groups.values()) == len(names)


def test_model_options():
    model = timm.create_model("iris_pdessm_test", in_chans=1, drop_rate=0.2, drop_path_rate=0.1, num_classes=5)
    assert model.stem.conv1.in_channels == 1 and model.head.drop.p == 0.2
    assert model.stages[-1].blocks[-1].drop_path.drop_prob == pytest.approx(0.1)
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 5)
    cifar = timm.create_model("iris_pdessm_test", stem_stride=1)
    assert cifar.forward_features(torch.randn(1, 3, 32, 32)).shape == (1, 4, 4, 64)


@pytest.mark.parametrize(
    ("spatial_mix", "spatial_class"),
    [("both", LocalPlusGlobal), ("local", DepthwiseConv), ("global", ConvectionDiffusionReaction2d)],
)
def test_the_ablation_switch_picks_each_blocks_spatial_filter(spatial_mix, spatial_class):
    model = timm.create_model("iris_pdessm_test", spatial_mix=spatial_mix, pde_modes=3)
    filters = [block.spatial for stage in model.stages for block in stage.blocks]
    assert len(filters) == 4 and all(type(f) is spatial_class for f in filters)
    assert all(
        op.modes == 3 and op.num_heads == 4 for op in model.modules() if isinstance(op, ConvectionDiffusionReaction2d)
    )
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (3, 9), (4, 4), (8, 5)])
def test_the_depthwise_conv_on_a_grid_narrower_than_its_kernel_is_the_full_kernels(grid):
    """Its central taps alone on small grids: the output and the gradients of the input, weight and bias that the
    full 7x7 kernel gives, in a model traced for every size too (torch.jit.trace keeps the whole kernel)."""
    torch.manual_seed(0)
    conv = DepthwiseConv(6, kernel_size=7)
    x = torch.randn(2, *grid, 6, requires_grad=True)  # (B, H, W, C)
    projection = torch.randn(2, *grid, 6)
    full = conv.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    want = [full, *torch.autograd.grad(full, (x, *conv.parameters()), projection)]
    for module in (conv, torch.jit.trace(conv, torch.randn(1, 1, 1, 6))):  # traced where it would crop most
        y = module(x)
        got = [y, *torch.autograd.grad(y, (x, *conv.parameters()), projection)]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("gain_init", "num_heads"), [(None, None), (0.5, None), (0.5, 3)])
@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (4, 4), (3, 1), (5, 4)])
def test_the_spatial_filter_is_its_conv_plus_its_operator_on_every_grid(grid, gain_init, num_heads):
    """Where the grid fits the conv's reach both paths are one convolution (the operator's kernel, with its
    hand-written backward, added to the conv's); the output and every gradient are the two paths' sum, computed
    apart."""
    torch.manual_seed(0)
    spatial = randomize_pde(LocalPlusGlobal(6, kernel_size=7, num_heads=num_heads, modes=3, gain_init=gain_init))
    x = torch.randn(2, *grid, 6, requires_grad=True)  # (B, H, W, C)
    projection = torch.randn(2, *grid, 6)
    params = [x, *spatial.parameters()]
    apart = spatial.local(x) + spatial.gain(spatial.operator(x))
    for got, want in zip(
        torch.autograd.grad(spatial(x), params, projection), torch.autograd.grad(apart, params, projection), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(spatial(x), apart, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spatial_mix", ["both", "global"])
def test_the_per_sample_operator_starts_as_the_models_static_one(spatial_mix):
    """``pde_dynamic``: on the static model's weights (its coefficient maps at zero, as built) the same outputs at
    every stage's grid, fused or not; with a map that has learned, each sample's own."""
    torch.manual_seed(0)
    static = timm.create_model("iris_pdessm_test", spatial_mix=spatial_mix).eval()
    dynamic = timm.create_model("iris_pdessm_test", spatial_mix=spatial_mix, pde_dynamic=True).eval()
    maps = [m.to_coefficients for m in dynamic.modules() if isinstance(m, DynamicConvectionDiffusionReaction2d)]
    assert len(maps) == 4 and all(not p.any() for m in maps for p in m.parameters())
    missing = dynamic.load_state_dict(static.state_dict(), strict=False).missing_keys
    assert missing and all(".to_coefficients." in key for key in missing)
    x = torch.randn(2, 3, 64, 64)  # stage grids 16, 8, 4, 2
    torch.testing.assert_close(dynamic.forward_features(x), static.forward_features(x), rtol=1e-4, atol=1e-5)
    for m in maps:
        torch.nn.init.normal_(m.weight, std=2.0)
    features = dynamic.forward_features(x)  # (B, H, W, C)
    assert (features - static.forward_features(x)).abs().max() > 1e-3  # 100 times the tolerance below
    torch.testing.assert_close(features[1:], dynamic.forward_features(x[1:]), rtol=1e-4, atol=1e-5)


def test_an_unknown_spatial_mix_names_the_choices():
    with pytest.raises(ValueError, match=r"choose one of \('both', 'local', 'global'\)"):
        timm.create_model("iris_pdessm_test", spatial_mix="sum")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_model_device_and_dtype_construction(dtype):
    model = timm.create_model("iris_pdessm_test", dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model(torch.randn(1, 3, 64, 64, dtype=dtype)).dtype == dtype
    meta = timm.create_model("iris_pdessm_s", device="meta")
    assert {p.device.type for p in meta.parameters()} == {"meta"}


def test_the_same_weights_run_at_any_resolution():
    model = timm.create_model("iris_pdessm_s").eval()
    num_params = sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        for size in [(224, 224), (256, 320), (97, 131), (1024, 1024), (24, 24), (4, 9)]:
            features = model.forward_features(torch.randn(1, 3, *size))
            assert features.shape == (1, math.ceil(size[0] / 32), math.ceil(size[1] / 32), 512)
            assert features.isfinite().all()
    assert sum(p.numel() for p in model.parameters()) == num_params


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.randn(2, 4, 64, 64), r"\(B, 3, H, W\) with H, W >= 4, got \[2, 4, 64, 64\]"),
        (torch.randn(3, 64, 64), "got a 3-D tensor"),
        (torch.randn(1, 3, 3, 64), r"at least one stem cell \(4 pixels\)"),
        (torch.randn(1, 32, 32, 3), "looks channels-last"),
        (torch.randn(1, 3, 32, 32, dtype=torch.float64), r"model's dtype torch\.float32, got torch\.float64"),
        (torch.randn(1, 3, 32, 32, dtype=torch.float16), r"got torch\.float16\. .*torch\.autocast"),
        (torch.randn(1, 3, 32, 32, dtype=torch.bfloat16), r"got torch\.bfloat16\. .*torch\.autocast"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), r"got torch\.uint8\. .*scaling to \[0, 1\]"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.int64), r"got torch\.int64"),
    ],
    ids=["channels", "rank", "size", "channels-last", "float64", "float16", "bfloat16", "uint8", "int64"],
)
def test_bad_input_raises_a_value_error_saying_what_to_do(x, message):
    model = timm.create_model("iris_pdessm_test")
    with pytest.raises(ValueError, match=message):
        model(x)
    with pytest.raises(ValueError, match=message):
        model.forward_intermediates(x)


def test_float64_images_are_refused_under_autocast_too():
    """Autocast casts float32, float16 and bfloat16 inputs, not float64."""
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match=r"got torch\.float64"):
        timm.create_model("iris_pdessm_test")(torch.randn(1, 3, 32, 32, dtype=torch.float64))


@pytest.mark.parametrize("input_dtype", ["float32", "autocast dtype"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_forward_backward_is_finite(dtype, input_dtype):
    """224x224 gives 56, 28, 14 and 7 token grids. Under autocast the model takes float32 images and images in the
    autocast dtype alike."""
    model = timm.create_model("iris_pdessm_test", num_classes=10).train()
    x = torch.randn(2, 3, 224, 224, dtype=torch.float32 if input_dtype == "float32" else dtype)
    with torch.autocast("cpu", dtype=dtype):
        logits = model(x)
    assert logits.dtype == dtype and logits.isfinite().all()
    torch.nn.functional.cross_entropy(logits.float(), torch.tensor([1, 2])).backward()
    assert_all_grads(model)


def test_pretrained_without_published_weights_raises():
    with pytest.raises(RuntimeError, match="No pretrained weights exist"):
        timm.create_model("iris_pdessm_test", pretrained=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(kernel_size=4), "kernel_size must be an odd whole number >= 1"),
        (dict(kernel_size=0), "kernel_size must be an odd whole number >= 1"),
        (dict(pde_modes=2.5), r"pde_modes must be a whole number >= 0.*got 2\.5"),
        (dict(pde_modes=-1), "pde_modes must be a whole number >= 0"),
        (dict(depths=(-1, 1, 1, 1)), "depths must be whole numbers >= 0"),
        (dict(dims=(24, 0, 48, 64)), "dims must be whole numbers >= 1"),
        (dict(multiple_of=0), r"multiple_of must be a whole number >= 1 .*got 0"),
        (dict(multiple_of=2.5), r"multiple_of must be a whole number >= 1 .*got 2\.5"),
        (dict(expansion_ratio=0.5), "expansion_ratio must be at least 1"),
    ],
)
def test_bad_model_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        timm.create_model("iris_pdessm_test", **kwargs)


@pytest.mark.parametrize(
    "select_none",
    [
        pytest.param(lambda: timm.create_model("iris_pdessm_test", features_only=True, out_indices=()), id="features"),
        pytest.param(
            lambda: timm.create_model("iris_pdessm_test").forward_intermediates(torch.randn(1, 3, 32, 32), indices=[]),
            id="intermediates",
        ),
        pytest.param(lambda: timm.create_model("iris_pdessm_test").prune_intermediate_layers(indices=[]), id="prune"),
    ],
)
def test_an_empty_stage_selection_is_refused(select_none):
    with pytest.raises(ValueError, match="No stage selected"):
        select_none()


def test_an_empty_stage_keeps_the_downsample():
    model = timm.create_model("iris_pdessm_test", depths=(1, 0, 1, 1), num_classes=0).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 64)


@pytest.mark.parametrize("feature_cls", ["dict", "list"])
def test_features_only_dict_and_list_match_the_intermediates(feature_cls):
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(0)
    model = timm.create_model("iris_pdessm_test").eval()
    torch.manual_seed(0)  # the same initial weights
    features = timm.create_model("iris_pdessm_test", features_only=True, feature_cls=feature_cls).eval()
    out = features(x)
    out = list(out.values()) if feature_cls == "dict" else out
    # These extractors keep the model's channels-last layout, as for timm's other NHWC models (mambaout).
    for got, want in zip(out, model.forward_intermediates(x, intermediates_only=True, output_fmt="NHWC"), strict=True):
        torch.testing.assert_close(got, want)


def test_plain_torch_fx_traces_the_model_and_the_graph_runs_at_any_size():
    """A bare torch.fx.symbolic_trace and torchvision's create_feature_extractor need no leaf modules."""
    model = timm.create_model("iris_pdessm_test").eval()
    graph = torch.fx.symbolic_trace(model)
    extractor = create_feature_extractor(model, ["stages.1"])
    for size in (32, 48):  # the graph holds no grid size: the operators are single calls
        x = torch.randn(2, 3, size, size)
        torch.testing.assert_close(graph(x), model(x))
        want = model.forward_intermediates(x, indices=[1], intermediates_only=True, output_fmt="NHWC")[0]
        torch.testing.assert_close(extractor(x)["stages.1"], want)
