"""Hub support: save_pretrained, push_to_hub, from_pretrained, timm's local-dir:/hf-hub: names, transformers and the
model cards, through the real timm, huggingface_hub and transformers code paths and without network.

The Hub side is a Hugging Face cache laid out as a download leaves it, read with HF_HUB_OFFLINE=1; pushing is checked
up to the network boundary (HfApi's methods replaced by recorders).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import timm
import torch
import yaml
from conftest import TINY_MODEL, tiny_model
from huggingface_hub import HfApi, RepoUrl, constants
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform, resolve_input_data_config
from timm.models import adapt_input_conv
from transformers import AutoImageProcessor, AutoModelForImageClassification

import iris_timm
from iris_timm.flops import count_params
from iris_timm.hub import VERSION_KEY
from iris_timm.model_card import PUBLISHED_VARIANTS, main, model_card
from iris_timm.weights import check_weights

REPO_ID = "iris-test/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NUM_CLASSES = 7
LABELS = [f"class_{i}" for i in range(NUM_CLASSES)]
SAVED_FILES = ["README.md", "config.json", "model.safetensors"]
NEVER_UNPICKLES = "never unpickles"  # the advice on pickled weights, whatever else the error says


def create(seed: int = 0, **kwargs) -> torch.nn.Module:
    return tiny_model(seed, num_classes=NUM_CLASSES, **kwargs)


@pytest.fixture
def model() -> torch.nn.Module:
    return create()


@pytest.fixture
def x(images: torch.Tensor) -> torch.Tensor:
    return images


@pytest.fixture
def saved(tmp_path: Path, model: torch.nn.Module) -> Path:
    return iris_timm.save_pretrained(model, tmp_path / "saved", label_names=LABELS)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, with the Hub unreachable (HF_HUB_OFFLINE=1)."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these variables once, at import, into its constants module, which every download consults.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def add_to_cache(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT, ref: str = "main") -> None:
    """Lay out ``folder`` as a download of ``repo_id`` at ``commit`` (the branch or tag ``ref``) leaves it: blobs
    named by content hash, the snapshot's links to them, and ``refs/<ref>``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for path in (repo / "blobs", snapshot, repo / "refs"):
        path.mkdir(parents=True, exist_ok=True)
    for file in folder.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs" / ref).write_text(commit)


def assert_same_logits(a: torch.nn.Module, b: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        assert torch.equal(a.eval()(x), b.eval()(x))


# ----------------------------------------------------------------------------- save


def test_save_writes_safetensors_timm_config_and_card(saved, model):
    assert sorted(os.listdir(saved)) == SAVED_FILES
    config = json.loads((saved / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "pretrained_cfg"} == {
        "architecture": "iris_pdessm_test",
        "num_classes": NUM_CLASSES,
        "num_features": 64,
        "global_pool": "avg",
        "label_names": LABELS,
        "model_args": {"in_chans": 3, "global_pool": "avg", "multiple_of": 8},
        "iris_timm_version": iris_timm.__version__,
    }
    assert config["pretrained_cfg"]["input_size"] == [3, 64, 64]
    assert config["pretrained_cfg"]["classifier"] == "head.fc"
    weights = safetensors.torch.load_file(saved / "model.safetensors")
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    card = (saved / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: timm\nlicense: apache-2.0\n")
    assert f'timm.create_model("local-dir:{saved}", pretrained=True)' in card


def test_save_keeps_the_model_in_training_mode(tmp_path, model):
    model.train()
    iris_timm.save_pretrained(model, tmp_path / "saved")
    assert model.training


def test_save_replaces_a_previous_save_and_keeps_other_files(tmp_path, x):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("{}\n")
    iris_timm.save_pretrained(create(seed=0), folder)
    second = create(seed=1)
    iris_timm.save_pretrained(second, folder)
    assert sorted(os.listdir(folder)) == sorted([*SAVED_FILES, "metrics.jsonl"])
    assert (folder / "metrics.jsonl").read_text() == "{}\n"
    assert_same_logits(iris_timm.from_pretrained(folder), second, x)


def test_a_failed_save_leaves_the_previous_save(tmp_path, model, x, monkeypatch):
    folder = iris_timm.save_pretrained(model, tmp_path / "saved")
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        iris_timm.save_pretrained(create(seed=1), folder)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert_same_logits(iris_timm.from_pretrained(folder), model, x)


def test_an_interrupted_save_is_not_read_as_a_model(saved, monkeypatch):
    replace = os.replace

    def crash_before_config(src, dst):
        if Path(dst).name == "config.json":
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_before_config)
    with pytest.raises(KeyboardInterrupt):
        iris_timm.save_pretrained(create(seed=1), saved)
    with pytest.raises(FileNotFoundError, match="not a complete save"):
        iris_timm.from_pretrained(saved)


def test_save_rejects_wrong_label_names_and_other_models(tmp_path, model):
    with pytest.raises(ValueError, match="2 names for a model with 7 classes"):
        iris_timm.save_pretrained(model, tmp_path / "saved", label_names=["cat", "dog"])
    with pytest.raises(TypeError, match="Unwrap compiled"):
        iris_timm.save_pretrained(torch.compile(model), tmp_path / "saved")
    unregistered = iris_timm.IrisPDESSM(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64))
    with pytest.raises(ValueError, match="has no pretrained_cfg"):
        iris_timm.save_pretrained(unregistered, tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


# ----------------------------------------------------------------------------- load


def test_local_dir_round_trip(saved, model, x):
    loaded = timm.create_model(f"local-dir:{saved}", pretrained=True)
    assert_same_logits(loaded, model, x)
    assert loaded.pretrained_cfg["label_names"] == LABELS
    assert_same_logits(iris_timm.from_pretrained(saved), model, x)
    assert_same_logits(iris_timm.from_pretrained(f"local-dir:{saved}"), model, x)


def test_offline_hub_cache(saved, model, x, offline_cache):
    add_to_cache(offline_cache, REPO_ID, saved)
    assert_same_logits(timm.create_model(f"hf-hub:{REPO_ID}", pretrained=True), model, x)
    loaded = iris_timm.from_pretrained(REPO_ID)
    assert_same_logits(loaded, model, x)
    assert loaded.pretrained_cfg["hf_hub_id"] == f"{REPO_ID}@{COMMIT}"  # pinned to the commit it was checked at
    assert_same_logits(iris_timm.from_pretrained(f"hf-hub:{REPO_ID}@{COMMIT}"), model, x)


def test_revision_and_token_pick_a_commit_of_the_cache(saved, model, x, offline_cache, tmp_path):
    """As huggingface_hub's from_pretrained: revision= a branch, tag or commit; token= passed on (unused offline)."""
    retrained = create(seed=1)
    v2 = iris_timm.save_pretrained(retrained, tmp_path / "v2", label_names=LABELS)
    second = "fedcba9876543210fedcba9876543210fedcba98"
    add_to_cache(offline_cache, REPO_ID, saved)  # main
    add_to_cache(offline_cache, REPO_ID, v2, commit=second, ref="v2")
    assert_same_logits(iris_timm.from_pretrained(REPO_ID, token="hf_not_needed_offline"), model, x)
    for revision in ("v2", second):
        loaded = iris_timm.from_pretrained(REPO_ID, revision=revision, token="hf_not_needed_offline")
        assert_same_logits(loaded, retrained, x)
        assert loaded.pretrained_cfg["hf_hub_id"] == f"{REPO_ID}@{second}"
    assert_same_logits(iris_timm.from_pretrained(REPO_ID, revision="main"), model, x)
    with pytest.raises(ValueError, match="give the revision once"):
        iris_timm.from_pretrained(f"{REPO_ID}@main", revision="v2")
    with pytest.raises(ValueError, match="is a local folder"):
        iris_timm.from_pretrained(saved, revision="v2")


def test_num_classes_replaces_the_head_and_keeps_the_backbone(saved, model):
    loaded = iris_timm.from_pretrained(saved, num_classes=5)
    assert loaded.get_classifier().weight.shape == (5, 64)
    assert loaded(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    original, new = model.state_dict(), loaded.state_dict()
    backbone = [key for key in original if not key.startswith("head.fc.")]
    assert new.keys() == original.keys()
    assert all(torch.equal(new[key], original[key]) for key in backbone)


@pytest.mark.parametrize("num_classes", [0, NUM_CLASSES])
def test_a_feature_backbone_loads_the_saved_stages(saved, model, x, num_classes):
    features = iris_timm.from_pretrained(saved, features_only=True, num_classes=num_classes).eval()
    with torch.no_grad():
        for got, want in zip(features(x), model.forward_intermediates(x, intermediates_only=True), strict=True):
            torch.testing.assert_close(got, want)


def test_in_chans_adapts_the_first_convolution(saved, model):
    loaded = iris_timm.from_pretrained(saved, in_chans=1)
    original, new = model.state_dict(), loaded.state_dict()
    assert torch.equal(new["stem.conv1.weight"], adapt_input_conv(1, original["stem.conv1.weight"]))
    assert all(torch.equal(new[key], original[key]) for key in original if key != "stem.conv1.weight")
    assert loaded(torch.randn(2, 1, 64, 64)).shape == (2, NUM_CLASSES)


def test_model_args_round_trip(tmp_path, x):
    model = create(depths=(1, 1, 2, 1), stem_stride=1)
    folder = iris_timm.save_pretrained(model, tmp_path / "saved")
    args = json.loads((folder / "config.json").read_text())["model_args"]
    assert args == {"depths": [1, 1, 2, 1], "stem_stride": 1, "in_chans": 3, "global_pool": "avg", "multiple_of": 8}
    for loaded in (timm.create_model(f"local-dir:{folder}", pretrained=True), iris_timm.from_pretrained(folder)):
        assert loaded.min_input_size == 1  # one stem cell
        assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
        assert_same_logits(loaded, model, x)


@pytest.mark.parametrize(("version", "written_by"), [(None, "0.1"), ("0.2.0", "0.2.0")])
def test_a_folder_written_by_an_older_version_is_refused_naming_both_versions(saved, tmp_path, version, written_by):
    """0.1 recorded no version; 0.2 normalised the operator's output, so its weights do not fit this block."""
    folder = tmp_path / "old"
    shutil.copytree(saved, folder)
    config = json.loads((folder / "config.json").read_text())
    del config[VERSION_KEY]
    if version is not None:
        config[VERSION_KEY] = version
    (folder / "config.json").write_text(json.dumps(config))
    phrase = rf"written by iris_timm {re.escape(written_by)}; this is iris_timm {re.escape(iris_timm.__version__)}"
    with pytest.raises(ValueError, match=phrase):
        iris_timm.from_pretrained(folder)


# ----------------------------------------------------------------------------- transformers


def test_transformers_loads_a_saved_folder(saved, model, x):
    hf_model = AutoModelForImageClassification.from_pretrained(saved)
    assert type(hf_model).__name__ == "TimmWrapperForImageClassification"
    assert hf_model.config.id2label == dict(enumerate(LABELS))
    with torch.no_grad():
        assert torch.equal(hf_model.eval()(x).logits, model(x))

    processor = AutoImageProcessor.from_pretrained(saved)
    assert processor.data_config == {
        "input_size": (3, 64, 64),
        "interpolation": "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "crop_pct": 0.9,
        "crop_mode": "center",
    }
    image = Image.fromarray(torch.randint(0, 256, (100, 120, 3), dtype=torch.uint8).numpy())
    pixels = processor(image)["pixel_values"]
    assert pixels.shape == (1, 3, 64, 64)
    assert torch.equal(pixels[0], create_transform(**resolve_input_data_config(model))(image))


def test_transformers_loads_from_the_offline_hub_cache(saved, model, x, offline_cache):
    add_to_cache(offline_cache, REPO_ID, saved)
    hf_model = AutoModelForImageClassification.from_pretrained(REPO_ID)
    with torch.no_grad():
        assert torch.equal(hf_model.eval()(x).logits, model(x))


# ----------------------------------------------------------------------------- push


@pytest.mark.parametrize("revision", [None, "v1"])
def test_push_sends_the_saved_folder(tmp_path, model, monkeypatch, revision):
    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["create_repo"] = (self.token, repo_id, kwargs)
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_branch(self, repo_id, **kwargs):
        calls["create_branch"] = (repo_id, kwargs)

    def upload_folder(self, *, folder_path, **kwargs):
        calls["files"] = {path.name: path.read_bytes() for path in Path(folder_path).iterdir()}
        calls["upload_folder"] = kwargs
        return "commit info"

    for name, method in [
        ("create_repo", create_repo),
        ("create_branch", create_branch),
        ("upload_folder", upload_folder),
    ]:
        monkeypatch.setattr(HfApi, name, method)
    commit = iris_timm.push_to_hub(
        model, REPO_ID, commit_message="Add tiny", private=True, revision=revision, token="hf_token", label_names=LABELS
    )

    assert commit == "commit info"
    assert calls.pop("create_repo") == ("hf_token", REPO_ID, {"private": True, "exist_ok": True})
    if revision is not None:
        assert calls.pop("create_branch") == (REPO_ID, {"branch": revision, "exist_ok": True})
    assert calls.pop("upload_folder") == {
        "repo_id": REPO_ID,
        "commit_message": "Add tiny",
        "revision": revision,
        "create_pr": False,
    }
    expected = iris_timm.save_pretrained(model, tmp_path / "expected", repo_id=REPO_ID, label_names=LABELS)
    assert calls.pop("files") == {path.name: path.read_bytes() for path in expected.iterdir()}
    assert not calls
    assert f'timm.create_model("hf-hub:{REPO_ID}", pretrained=True)' in (expected / "README.md").read_text()


# ----------------------------------------------------------------------------- bad input


def _no_weight_reads(*args, **kwargs):
    raise AssertionError("weights were read")


@pytest.fixture
def forbid_weight_reads(monkeypatch):
    """Bad input must be rejected before any weights are read, and pickles never loaded."""
    monkeypatch.setattr(safetensors.torch, "load_file", _no_weight_reads)
    monkeypatch.setattr(torch, "load", _no_weight_reads)


def edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture
def forbid_the_hub(monkeypatch):
    """A name that can only be a local path must be reported as a missing folder without asking the Hub."""

    def snapshot_download(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(iris_timm.hub, "snapshot_download", snapshot_download)


@pytest.mark.parametrize(
    ("name", "missing", "advice"),
    [
        ("no_such_dir", "no_such_dir", "Give the folder"),
        ("not a repo", "not a repo", "Give the folder"),
        ("./runs/model", "runs/model", "Give the folder"),
        ("runs/", "runs", "Give the folder"),
        ("../runs", "../runs", "Give the folder"),
        ("a/b/c", "a/b/c", "Give the folder"),
        ("~/models/iris", "{home}/models/iris", "Give the folder"),
        ("{tmp}/absent", "{tmp}/absent", "Give the folder"),
        (Path("absent"), "absent", "Give the folder"),
        ("output/digts", "output/digts", r"\(did you mean output/digits\?\)"),
    ],
)
def test_a_missing_local_path_is_a_missing_folder_never_a_hub_id(
    tmp_path, monkeypatch, forbid_weight_reads, forbid_the_hub, name, missing, advice
):
    (tmp_path / "output" / "digits").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if isinstance(name, str):
        name = name.format(tmp=tmp_path)
    missing = re.escape(missing.format(home=tmp_path / "home", tmp=tmp_path))
    with pytest.raises(FileNotFoundError, match=f"^No folder at {missing}\\.? {advice}"):
        iris_timm.from_pretrained(name)


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        (REPO_ID, f"^No folder at {REPO_ID}; as a Hub repo: hf-hub:{REPO_ID} is not in the Hugging Face cache"),
        (f"hf-hub:{REPO_ID}", f"^hf-hub:{REPO_ID} is not in the Hugging Face cache"),
    ],
)
def test_a_repo_missing_from_the_offline_cache(offline_cache, forbid_weight_reads, name, phrase):
    """A bare ORG/NAME could have been a folder too: the error says neither exists."""
    with pytest.raises(FileNotFoundError, match=phrase):
        iris_timm.from_pretrained(name)


def test_missing_weights(saved, forbid_weight_reads):
    (saved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors not found"):
        iris_timm.from_pretrained(saved)


def test_a_folder_of_pickled_weights_is_refused(tmp_path, model, forbid_weight_reads):
    folder = tmp_path / "pickled"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    only_pickles = r"holds no model\.safetensors, only pickled weights \['pytorch_model\.bin'\]"
    with pytest.raises(FileNotFoundError, match=f"{only_pickles}.*{NEVER_UNPICKLES}"):
        iris_timm.from_pretrained(folder)
    with pytest.raises(NotADirectoryError, match=f"pytorch_model\\.bin is a file;.*It is a pickle:.*{NEVER_UNPICKLES}"):
        iris_timm.from_pretrained(folder / "pytorch_model.bin")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-100], id="truncated"),
        pytest.param(lambda data: b"\x00" * 8 + data[8:], id="zero header length"),
    ],
)
def test_damaged_weights(saved, forbid_weight_reads, damage):
    weights = saved / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        iris_timm.from_pretrained(saved)


def _write_config(text: str):
    return lambda folder: (folder / "config.json").write_text(text)


def _edit_config(edit):
    return lambda folder: edit_config(folder, edit)


@pytest.mark.parametrize(
    ("damage", "phrase"),
    [
        pytest.param(_write_config("{'architecture': 'iris_pdessm_test'}"), "not valid JSON", id="not JSON"),
        pytest.param(_write_config("[]"), "holds a JSON list, not timm's config object", id="not an object"),
        pytest.param(
            _edit_config(lambda config: config.update(architecture="iris_pdessm_huge")),
            "'iris_pdessm_huge', which timm does not know",
            id="unknown architecture",
        ),
        pytest.param(
            _edit_config(lambda config: [config.pop("architecture"), config.pop("pretrained_cfg")]),
            r"lacks the key\(s\) \['architecture', 'pretrained_cfg'\]",
            id="missing keys",
        ),
        pytest.param(
            _edit_config(lambda config: config["model_args"].update(depth=3)), "timm cannot build", id="unknown args"
        ),
    ],
)
def test_a_bad_config_is_refused_naming_the_file(saved, forbid_weight_reads, damage, phrase):
    damage(saved)
    with pytest.raises(ValueError, match=f"{re.escape(str(saved / 'config.json'))}.*{phrase}"):
        iris_timm.from_pretrained(saved)


def test_a_hub_repo_without_safetensors_is_refused(saved, offline_cache, forbid_weight_reads):
    (saved / "model.safetensors").unlink()
    torch.save({}, saved / "pytorch_model.bin")
    add_to_cache(offline_cache, REPO_ID, saved)
    with pytest.raises(FileNotFoundError, match=f"hf-hub:{REPO_ID} has no model\\.safetensors\\..*{NEVER_UNPICKLES}"):
        iris_timm.from_pretrained(REPO_ID)


# ----------------------------------------------------------------------------- model cards


def test_committed_cards_are_the_generated_ones(tmp_path):
    root = Path(__file__).parents[1]
    main(["--all", "--out", str(tmp_path)])
    for name, recipe in PUBLISHED_VARIANTS.items():
        card = (tmp_path / f"{name}.md").read_text()
        assert yaml.safe_load((root / recipe).read_text())["model"] == name
        assert f"accelerate launch train.py --config {recipe}\n" in card
        assert "[the studies](../docs/studies.md)" in card
        assert (root / "model_cards" / f"{name}.md").read_text() == card, (
            f"model_cards/{name}.md is stale: run python -m iris_timm.model_card --all --out model_cards/"
        )


def test_card_without_results_says_not_measured(model):
    card = model_card(model, f"hf-hub:{REPO_ID}")
    assert card.data.to_dict() == {
        "library_name": "timm",
        "license": "apache-2.0",
        "pipeline_tag": "image-classification",
        "tags": ["image-classification", "timm", "transformers", "iris_timm"],
    }
    assert f"| Parameters | {count_params(model) / 1e6:.2f} M |" in card.text
    assert "| Top-1 accuracy | not measured |" in card.text
    assert "Command that reproduces these weights: not recorded." in card.text


def test_card_with_results_reports_them(model):
    results = {"dataset": "uoft-cs/cifar10", "top1": 91.5, "epochs": 100, "command": "python train.py"}
    card = model_card(model, f"hf-hub:{REPO_ID}", results)
    assert card.data.datasets == ["uoft-cs/cifar10"]
    assert card.data.metrics == ["accuracy"]
    assert [(r.dataset_type, r.metric_type, r.metric_value) for r in card.data.eval_results] == [
        ("uoft-cs/cifar10", "accuracy", 91.5)
    ]
    assert "| Dataset | uoft-cs/cifar10 |\n| Epochs | 100 |\n| Top-1 accuracy | 91.5 % |" in card.text
    assert "Command that reproduces these weights:\n\n```bash\npython train.py\n```" in card.text


def test_card_rejects_unknown_or_unfounded_results(model):
    with pytest.raises(ValueError, match=r"Unknown training result keys \['top5'\]"):
        model_card(model, f"hf-hub:{REPO_ID}", {"top5": 99.0})
    with pytest.raises(ValueError, match="needs the 'dataset'"):
        model_card(model, f"hf-hub:{REPO_ID}", {"top1": 80.0})


def test_save_pretrained_writes_any_timm_model_that_timm_loads_back(tmp_path):
    peer = timm.create_model("test_resnet", num_classes=3).eval()
    folder = iris_timm.save_pretrained(peer, tmp_path / "peer", label_names=["a", "b", "c"])  # no card
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    assert loaded.pretrained_cfg["label_names"] == ["a", "b", "c"]
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), peer(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "phrases"),
    [
        (
            {},
            ["`s′ = dwconv(s) + F(s)`", "with an open (zero outside the image) boundary, on wavenumbers |k| ≤ π·6"],
        ),
        ({"spatial_mix": "local"}, ["`s′ = dwconv(s)`: no global operator"]),
        ({"spatial_mix": "global", "pde_modes": 0}, ["`s′ = F(s)`", "on every mode of the grid"]),
    ],
)
def test_card_describes_the_block_and_operator_the_model_has(kwargs, phrases):
    text = model_card(create(**kwargs), f"hf-hub:{REPO_ID}").text
    assert all(phrase in text for phrase in phrases), text


def test_a_symlink_loop_is_reported_as_such(tmp_path, forbid_weight_reads):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    with pytest.raises(FileNotFoundError, match="leads nowhere"):
        iris_timm.from_pretrained(str(loop))


def test_a_folder_saved_for_another_timm_model_opens_in_transformers(tmp_path):
    peer = timm.create_model("test_resnet", num_classes=3).eval()
    folder = iris_timm.save_pretrained(peer, tmp_path / "peer", label_names=["a", "b", "c"])
    assert "num_classes" not in json.loads((folder / "config.json").read_text())["model_args"]
    hf_model = AutoModelForImageClassification.from_pretrained(folder).eval()
    assert hf_model.config.id2label == {0: "a", 1: "b", 2: "c"}
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(hf_model(x).logits, peer(x), rtol=0, atol=0)


def test_a_save_removes_a_killed_saves_leftovers_and_stale_weights(tmp_path, model):
    folder = tmp_path / "model"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = folder / f".save_pretrained-{dead.stdout.strip()}-abc123"  # a save whose process is gone
    live = folder / f".save_pretrained-{os.getpid()}-xyz789"  # a save in progress in a live process
    for staging in (killed, live):
        staging.mkdir(parents=True)
        (staging / "model.safetensors").write_bytes(b"partial")
    (folder / "pytorch_model.bin").write_bytes(b"old pickle")
    (folder / "notes.txt").write_text("mine")
    iris_timm.save_pretrained(model, folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["config.json", "model.safetensors", "README.md", "notes.txt", live.name]
    )


def test_an_explicit_dtype_loads_weights_saved_in_it(saved, model, x):
    half = {key: value.half() for key, value in model.state_dict().items()}
    safetensors.torch.save_file(half, saved / "model.safetensors")
    loaded = iris_timm.from_pretrained(saved, dtype=torch.float16)
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    assert torch.equal(loaded.state_dict()["head.fc.weight"], half["head.fc.weight"])


# ----------------------------------------------------------------------------- the weight check of every load path


def _load_local_dir(folder: Path) -> torch.nn.Module:
    return timm.create_model(f"local-dir:{folder}", pretrained=True)


def _load_file(folder: Path) -> torch.nn.Module:
    file = str(folder / "model.safetensors")
    overlay = dict(file=file, num_classes=NUM_CLASSES)
    return timm.create_model(TINY_MODEL, pretrained=True, num_classes=NUM_CLASSES, pretrained_cfg_overlay=overlay)


# (model name, how it is loaded, a tensor to damage) for each load path.
LOAD_PATHS = {
    "timm local-dir": (TINY_MODEL, _load_local_dir, "stages.3.blocks.0.fc1.weight"),
    "timm file": (TINY_MODEL, _load_file, "stages.3.blocks.0.fc1.weight"),
    "from_pretrained": (TINY_MODEL, iris_timm.from_pretrained, "stages.3.blocks.0.fc1.weight"),
    "from_pretrained, another timm model": ("test_resnet", iris_timm.from_pretrained, "layer1.0.conv1.weight"),
}


def _nan(weights: dict, key: str) -> None:
    weights[key].view(-1)[0] = float("nan")


# (what is wrong with the saved weights, the error's key phrase)
FAULTS = {
    "wrong dtype": (lambda weights, key: weights.update({key: weights[key].half()}), "another dtype"),
    "NaN": (_nan, "NaN or infinity"),
    "missing key": (lambda weights, key: weights.pop(key), "do not fit"),
    "extra key": (lambda weights, key: weights.update(extra=torch.zeros(1)), "do not fit"),
    "wrong shape": (lambda weights, key: weights.update({key: weights[key][:1]}), "do not fit"),
}


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory) -> dict[str, Path]:
    """A saved folder of each model of LOAD_PATHS, written once for all the faults."""
    names = {model_name for model_name, _, _ in LOAD_PATHS.values()}
    models = {name: timm.create_model(name, num_classes=NUM_CLASSES) for name in names}
    return {name: iris_timm.save_pretrained(model, tmp_path_factory.mktemp(name)) for name, model in models.items()}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("path", LOAD_PATHS)
def test_every_load_path_refuses_weights_that_would_not_load_as_they_are(
    tmp_path, monkeypatch, saved_models, path, fault
):
    model_name, load, key = LOAD_PATHS[path]
    damage, phrase = FAULTS[fault]
    folder = shutil.copytree(saved_models[model_name], tmp_path / "saved")
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    damage(weights, key)
    safetensors.torch.save_file(weights, folder / "model.safetensors")
    if load is iris_timm.from_pretrained and fault != "NaN":  # the header tells: refused before the weights are read
        monkeypatch.setattr(safetensors.torch, "load_file", _no_weight_reads)
    with pytest.raises(ValueError, match=f"^{re.escape(str(folder / 'model.safetensors'))}: .*{phrase}"):
        load(folder)


@pytest.mark.parametrize("path", ["timm local-dir", "timm file", "timm hf-hub", "from_pretrained"])
def test_every_load_path_of_an_iris_model_names_a_truncated_weights_file(saved, offline_cache, path):
    """timm's loaders would end in safetensors' "incomplete metadata", naming no file: the model names it first."""
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    if path == "timm hf-hub":
        add_to_cache(offline_cache, REPO_ID, saved)
        weights = offline_cache / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / COMMIT / weights.name
    load = {"timm hf-hub": lambda _: timm.create_model(f"hf-hub:{REPO_ID}", pretrained=True)}.get(path)
    with pytest.raises(ValueError, match=f"^{re.escape(str(weights))} is not a readable safetensors file"):
        (load or LOAD_PATHS[path][1])(saved)


def test_a_refusal_names_three_keys_and_counts_the_rest():
    weights = {f"w{i}": torch.tensor([float("inf")]) for i in range(5)}
    with pytest.raises(ValueError, match=r"NaN or infinity in w0, w1, w2 \(and 2 more\)"):
        check_weights(weights, None, "the weights")
    check_weights({"w": torch.ones(2)}, None, "the weights")  # finite: accepted
