"""train.py end to end on CPU: the embedded default, two processes, kill and resume, fine-tuning, errors.

Runs go through ``train.main`` in this process, as ``python train.py`` does after parsing its command line; only
what needs processes of its own (a kill, a launch of several processes) starts them."""

import collections
import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file

import iris_timm
from iris_timm.training import TrainingError, data, interrupt, trainer
from iris_timm.training.clock import fit_to_budget
from iris_timm.training.data import LOCAL_DATA, ConvertImage
from iris_timm.training.recipes import HELP
from iris_timm.training.run_folder import TrainerState

ROOT = Path(__file__).resolve().parents[1]
CIFAR10 = Path(os.environ[LOCAL_DATA]) / "cifar10"  # the local copies the test suite reads (conftest.py)
RECIPES = sorted((ROOT / "configs").glob("*.yaml"))
import train  # noqa: E402  (the repository root is on the path: conftest.py)

SMOKE = ["--config", str(ROOT / "configs" / "smoke.yaml")]


def train_here(*args: str) -> str:
    """``python train.py *args``, run in this process: what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        train.main(train.parse_config(list(args)))
    return printed.getvalue()


def run_env() -> dict[str, str]:
    # One thread: results are then bitwise reproducible, and two processes fit on a small machine.
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def free_port() -> int:
    """A port no process listens on: each launch of several processes gets its own, so that two launches at once
    do not meet at Accelerate's default port (29500)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(*args: str, log: Path) -> subprocess.Popen:
    """``python train.py *args`` in a process of its own, its output written to ``log``."""
    with open(log, "w") as output:
        command = [sys.executable, "train.py", *args]
        return subprocess.Popen(command, cwd=ROOT, env=run_env(), stdout=output, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path) -> str:
    """Wait for a ``start``-ed run to succeed: what it printed."""
    returncode = process.wait(timeout=600)
    assert returncode == 0, f"train.py failed ({returncode}):\n{log.read_text()[-3000:]}"
    return log.read_text()


def test_embedded_default_matches_its_recipe_file():
    assert train.parse_config([]) == train.parse_config(["--config", "configs/digits.yaml"])


def test_every_recipe_parses():
    import benchmarks.pathfinder_study  # noqa: F401  (registers pathfinder_frame, the study recipe's model)

    for path in RECIPES:
        cfg = train.parse_config(["--config", str(path)])
        assert cfg.model == "iris_pdessm_test" or timm.is_model(cfg.model), path


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_every_recipe_reads_data_a_user_can_get(recipe, tmp_path, monkeypatch):
    """On a fresh clone (no local copies beside it, the Hub unreachable) a recipe reads the digits that ship with
    scikit-learn, asks the Hub for its public dataset, or ends in one line that says how to make its data."""
    monkeypatch.delenv(LOCAL_DATA)
    monkeypatch.chdir(tmp_path)
    asked = []

    def unreachable(path, *args, **kwargs):
        asked.append(path)
        raise ConnectionError("the Hub is unreachable")

    monkeypatch.setattr(data, "load_dataset", unreachable)
    cfg = data.local_copy(train.parse_config(["--config", str(recipe)]))
    if cfg.dataset == "digits":
        assert sum(map(len, data.load_splits(cfg))) == 1797
        return
    with pytest.raises(TrainingError) as refusal:
        data.load_splits(cfg)
    message = str(refusal.value)
    assert "\n" not in message
    if asked:
        assert asked == [cfg.dataset] and "the Hub did not provide it (the Hub is unreachable)" in message
    else:
        assert message == f"dataset: {cfg.dataset} does not exist. {cfg.data_source}"
        assert "github.com/drewlinsley/pathfinder" in message


@pytest.mark.skipif(not CIFAR10.is_dir(), reason=f"no local copies at {CIFAR10.parent}")
def test_the_local_copies_stand_in_for_every_recipes_data_but_imagenet(monkeypatch):
    monkeypatch.chdir(ROOT)
    for recipe in RECIPES:
        cfg = train.parse_config(["--config", str(recipe)])
        copy = data.local_copy(cfg)
        if cfg.dataset in ("digits", "ILSVRC/imagenet-1k"):
            assert copy == cfg, recipe.name
        else:
            assert Path(copy.dataset) == CIFAR10.parent / Path(cfg.dataset).name, recipe.name
            assert data.dataset_kind(copy) == "parquet", recipe.name


def test_a_dataset_without_a_validation_split_holds_out_a_tenth_of_train_by_class(tmp_path, monkeypatch):
    """CIFAR-10 on the Hub: train and test splits, images in `img`. The recipes validate on a tenth of train, each
    class its share and the same rows for every seed; the test split is left alone."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
    from datasets import Image as ImageFeature
    from PIL import Image

    features = Features({"img": ImageFeature(), "label": ClassLabel(num_classes=10), "row": Value("int64")})

    def split(rows: range) -> Dataset:
        images = [Image.new("RGB", (4, 4), (row % 256, 0, 0)) for row in rows]
        return Dataset.from_dict({"img": images, "label": [row % 10 for row in rows], "row": list(rows)}, features)

    hub = DatasetDict(train=split(range(200)), test=split(range(1000, 1050)))
    monkeypatch.setattr(data, "load_dataset", lambda *args, **kwargs: hub)
    monkeypatch.delenv(LOCAL_DATA)
    monkeypatch.chdir(tmp_path)
    held_out = []
    for seed in (0, 1):
        train_data, val_data = data.load_splits(
            train.parse_config(["--config", str(ROOT / "configs" / "cifar10_cpu.yaml"), "--seed", str(seed)])
        )
        assert (len(train_data), len(val_data)) == (180, 20)
        assert collections.Counter(val_data["label"]) == {label: 2 for label in range(10)}
        held_out.append(sorted(val_data["row"]))
    assert held_out[0] == held_out[1] and max(held_out[0]) < 200


def test_command_line_overrides_the_recipe():
    cfg = train.parse_config([*SMOKE, "--batch-size", "8", "--lr", "0.1", "--resume", "--model-kwargs", '{"a": 1}'])
    assert (cfg.batch_size, cfg.lr, cfg.resume, cfg.model_kwargs) == (8, 0.1, "auto", {"a": 1})
    assert cfg.max_steps == 6  # from the recipe
    assert train.parse_config(["--checkpoint-every", "none"]).checkpoint_every is None


def test_a_recipe_overrides_its_base_and_the_command_line_overrides_both(tmp_path):
    (tmp_path / "base.yaml").write_text("batch_size: 8\nlr: 0.1\nmodel_kwargs: {stem_stride: 2}\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nlr: 0.2\nmodel_kwargs: {}\n")
    cfg = train.parse_config(["--config", str(tmp_path / "child.yaml")])
    assert (cfg.batch_size, cfg.lr, cfg.model_kwargs) == (8, 0.2, {})
    assert train.parse_config(["--config", str(tmp_path / "child.yaml"), "--lr", "0.3"]).lr == 0.3


def test_a_recipe_that_is_its_own_base_fails(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(TrainingError, match=r"name each other as base in a cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        train.parse_config(["--config", str(tmp_path / "a.yaml")])


def test_a_variant_gives_only_the_model_arguments_it_changes(tmp_path):
    (tmp_path / "base.yaml").write_text("model: iris_pdessm_t\nmodel_kwargs: {stem_stride: 2, pde_heads: 4}\n")
    (tmp_path / "variant.yaml").write_text("base: base.yaml\nmodel_kwargs: {pde_heads: 1, spatial_mix: local}\n")
    (tmp_path / "peer.yaml").write_text("base: base.yaml\nmodel: resnet10t\n")
    (tmp_path / "peer_args.yaml").write_text("base: base.yaml\nmodel: resnet10t\nmodel_kwargs: {stem_width: 16}\n")
    (tmp_path / "of_variant.yaml").write_text("base: variant.yaml\nmodel_kwargs: {stem_stride: 1}\n")

    def model_kwargs(name: str, *argv: str) -> dict:
        return train.parse_config(["--config", str(tmp_path / name), *argv]).model_kwargs

    assert model_kwargs("variant.yaml") == {"stem_stride": 2, "pde_heads": 1, "spatial_mix": "local"}
    assert model_kwargs("of_variant.yaml") == {"stem_stride": 1, "pde_heads": 1, "spatial_mix": "local"}
    assert model_kwargs("peer.yaml") == {}  # another model's arguments are not the base model's
    assert model_kwargs("peer_args.yaml") == {"stem_width": 16}
    assert model_kwargs("variant.yaml", "--model-kwargs", '{"dims": [8, 16, 24, 32]}') == {"dims": [8, 16, 24, 32]}


def test_fit_to_budget_counts_the_steps_left_at_the_measured_pace():
    state = TrainerState(total_steps=1000, step=40, train_time_s=10.0)
    assert fit_to_budget(100.0, state, 0.5) == 220
    assert fit_to_budget(100.0, dataclasses.replace(state, total_steps=100), 0.5) == 100  # never beyond it
    assert fit_to_budget(5.0, state, 0.5) == 40  # the budget is already spent
    refit = TrainerState(total_steps=150, recipe_steps=1000, budget_fitted=True, step=100, train_time_s=40.0)
    assert fit_to_budget(100.0, refit, 0.5) == 220  # a later fit may lengthen an earlier one
    assert fit_to_budget(100.0, dataclasses.replace(refit, recipe_steps=200), 0.5) == 200  # not the recipe


@pytest.mark.parametrize(
    ("argv", "yaml_text", "message"),
    [
        (
            [],
            "batchsize: 4\n",
            r"Unknown config key 'batchsize' in .*\. Did you mean 'batch_size'\? Valid keys: model,",
        ),
        (["--learning-rate", "1"], None, r"Unknown config key 'learning_rate' in the command line\. Valid keys:"),
        (["--batch-size", "many"], None, r"Config key 'batch_size' expects <class 'int'>, got 'many'"),
        (["--channels-last", "maybe"], None, r"Config key 'channels_last' expects <class 'bool'>, got 'maybe'"),
        (["--config", "configs/missing.yaml"], None, r"Config file configs/missing.yaml does not exist"),
        (["--batch_size", "8"], None, r"Unknown flag --batch_size: flags use dashes, write --batch-size\."),
        ([], "model: [unclosed\n", r"Config file .*bad\.yaml is not valid YAML: "),
    ],
)
def test_config_errors_name_the_key(tmp_path, argv, yaml_text, message):
    if yaml_text is not None:
        (tmp_path / "bad.yaml").write_text(yaml_text)
        argv = ["--config", str(tmp_path / "bad.yaml"), *argv]
    with pytest.raises(TrainingError, match=message):
        train.parse_config(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "iris_pdessm_x"], r"timm does not know the model 'iris_pdessm_x'\. Close names: \["),
        (["--dataset", "./no/such/folder"], r"dataset: \./no/such/folder does not exist"),
        (["--mixed-precision", "fp8"], r"mixed_precision must be one of no, bf16, fp16, got 'fp8'"),
        (["--lr", "0"], r"lr must be a finite number > 0"),
        (["--lr", "inf"], r"lr must be a finite number > 0, got inf"),
        (["--lr", "nan"], r"lr must be a finite number > 0, got nan"),
        (["--img-size", "0"], r"img_size must be >= 1 pixels"),
        (["--img-size", "-8"], r"img_size must be >= 1 pixels, or none for the model's own size; got -8"),
        pytest.param(
            ["--mixed-precision", "fp16"],
            r"mixed_precision fp16 needs a CUDA GPU, and none is available; on a CPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 runs on this machine's GPU"),
        ),
        (["--resume", "/nonexistent"], r"resume: /nonexistent is not a checkpoint folder"),
        (["--time-budget-s", "0"], r"time_budget_s must be >= 1 or none, got 0\.0"),
        (["--time-budget-s", "60", "--max-steps", "6"], r"max_steps must be larger, or lift the budget with --time"),
        (["--loader", "memory", "--reprob", "0.25"], r"loader memory does not do reprob"),
        (["--hflip", "1.5"], r"hflip is a probability: it must be in \[0, 1\], got 1\.5"),
        (["--vflip", "1.5"], r"vflip is a probability: it must be in \[0, 1\], got 1\.5"),
        (["--transpose", "1.5"], r"transpose is a probability: it must be in \[0, 1\], got 1\.5"),
        (
            ["--model-kwargs", '{"stem_strid": 2}'],
            r"takes no argument 'stem_strid' \(did you mean 'stem_stride'\?\)",
        ),
    ],
)
def test_bad_values_fail_before_training(tmp_path, argv, message):
    cfg = train.parse_config([*SMOKE, "--output-dir", str(tmp_path / "out"), *argv])
    with pytest.raises(SystemExit, match=message):
        train.main(cfg)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_embedded_default_trains_evaluates_and_exports(tmp_path):
    out = tmp_path / "digits"
    stdout = train_here("--max-steps", "12", "--output-dir", str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["best_top1"] is not None
    assert 0 < summary["train_time_s"] < summary["process_wall_time_s"]  # training alone, then the whole process
    assert "summary: " in stdout
    assert stdout.rstrip().endswith(train.next_steps(str(out)))
    load, printed = re.search(r"load it: +python -c (.*)$", stdout, re.M).group(1), io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(shlex.split(load)[0])  # the printed command, as python -c runs it
    assert printed.getvalue().startswith("IrisPDESSM(")
    for name in ("model.safetensors", "config.json", "README.md", "train_config.yaml", "metrics.jsonl"):
        assert (out / name).is_file(), name
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pth"))
    model = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert model.num_classes == 10
    weights = load_file(out / "model.safetensors")
    torch.testing.assert_close(model.state_dict()["head.fc.weight"], weights["head.fc.weight"])
    val_metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "val/top1" in line]
    assert val_metrics and val_metrics[-1]["val/top1"] == summary["best_top1"]


def test_a_time_budget_fixes_the_step_count_and_evaluations_record_the_training_time(tmp_path):
    out = tmp_path / "budget"
    budget = ["--max-steps", "none", "--epochs", "50", "--time-budget-s", "4", "--eval-every-s", "1"]
    stdout = train_here(*SMOKE, *budget, "--output-dir", str(out))
    summary = json.loads((out / "summary.json").read_text())
    fitted = re.findall(r"s per step: (\d+) steps fit the time budget", stdout)
    assert fitted, stdout[-2000:]
    assert summary["steps"] >= trainer.PACE_STEPS[1]
    assert summary["steps"] < 50 * 102  # far fewer than the recipe's 50 epochs of 102 steps
    val = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "val/top1" in line]
    assert len(val) >= 4  # one a second, and one after the last step
    assert all(a["step"] < b["step"] and a["train_time_s"] < b["train_time_s"] for a, b in itertools.pairwise(val))
    assert val[-1]["step"] == summary["steps"] and val[-1]["train_time_s"] == round(summary["train_time_s"], 2)


def test_a_timm_peer_trains_and_exports_a_timm_folder(tmp_path):
    out = tmp_path / "peer"
    train_here(*SMOKE, "--model", "test_convnext", "--model-kwargs", "{}", "--output-dir", str(out))
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".json", ".safetensors", ".md")) == [
        "config.json",
        "model.safetensors",
        "summary.json",
    ]
    assert json.loads((out / "config.json").read_text())["label_names"] == [str(i) for i in range(10)]
    model = timm.create_model(f"local-dir:{out}", pretrained=True)
    assert type(model).__name__ == "ConvNeXt" and model.num_classes == 10
    weights = load_file(out / "model.safetensors")
    torch.testing.assert_close(model.state_dict()["head.fc.weight"], weights["head.fc.weight"])


def test_two_processes_train_and_evaluate(tmp_path):
    """The README's command for several CPU processes (`--cpu` alone would run one)."""
    out = tmp_path / "ddp"
    accelerate = str(Path(sys.executable).with_name("accelerate"))  # the console script beside this Python
    launch = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--main_process_port", str(free_port())]
    result = subprocess.run(
        [*launch, "--mixed_precision", "no", "--dynamo_backend", "no", "train.py", *SMOKE, "--output-dir", str(out)],
        cwd=ROOT,
        env=dict(run_env(), ACCELERATE_USE_CPU="1"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2
    assert summary["steps"] == 6 and summary["best_top1"] is not None
    assert result.stdout.count("summary: ") == 1  # printed by the main process only
    assert (out / "model.safetensors").is_file()


PIL_AUGMENT = ["--loader", "pil", "--auto-augment", "rand-m9-mstd0.5-inc1-mmax9"]  # RandAugment: NumPy's generator
MEMORY_AUGMENT = ["--loader", "memory", "--scale", "[0.6, 1.0]", "--hflip", "0.5", "--transpose", "0.5"]  # on-device


@pytest.mark.parametrize(
    ("augment", "stop"),
    [(PIL_AUGMENT, signal.SIGKILL), (MEMORY_AUGMENT, signal.SIGINT)],
    ids=["pil, SIGKILL at a checkpoint", "memory, Ctrl-C between checkpoints"],
)
def test_a_killed_or_interrupted_run_resumes_to_the_same_weights(tmp_path, augment, stop):
    """SIGKILL right after the checkpoint of step 6 loses the steps after it; SIGINT (Ctrl-C) during step 7 or 8,
    which are no checkpoint steps, makes the run finish that step, write its checkpoint, exit with 130 and print the
    command that resumes it. Either resumes to the weights of an uninterrupted run."""
    # 13 batches an epoch: the run crosses an epoch boundary, and the stop lands mid-epoch. Each loader's
    # augmentation, dropout-like drop path (torch's) and the EMA (exported in place of the weights) must all resume.
    common = [*SMOKE, "--max-steps", "16", "--batch-size", "128", "--checkpoint-every", "3", "--keep-checkpoints", "3"]
    common += [*augment, "--drop-path", "0.1", "--ema-decay", "0.9"]
    whole, interrupted = tmp_path / "whole", tmp_path / "interrupted"
    # The uninterrupted run trains at the same time as the one that is stopped.
    uninterrupted = start(*common, "--output-dir", str(whole), log=tmp_path / "whole.log")
    process = start(*common, "--output-dir", str(interrupted), log=tmp_path / "interrupted.log")
    deadline = time.time() + 300
    while not (interrupted / "checkpoints" / "step_00000006").exists():
        assert process.poll() is None and time.time() < deadline, "the run ended before its second checkpoint"
        time.sleep(0.05)
    process.send_signal(stop)
    returncode = process.wait(timeout=120)
    assert not (interrupted / "model.safetensors").exists()
    resume = [*common, "--output-dir", str(interrupted), "--resume"]
    if stop == signal.SIGINT:
        printed = (tmp_path / "interrupted.log").read_text()
        assert returncode == 130, printed[-3000:]
        step, checkpoint, command = re.search(
            r"^Stopped by SIGINT at step (\d+); checkpoint written: (\S+)\. Continue with: (.+)$", printed, re.M
        ).groups()
        assert int(step) % 3 and Path(checkpoint) == trainer.checkpoint_dirs(interrupted)[-1]
        assert Path(checkpoint).name == f"step_{int(step):08d}" and "Traceback" not in printed
        assert command == "python " + shlex.join(["train.py", *resume])
    finish(uninterrupted, tmp_path / "whole.log")

    resumed = start(*resume, log=tmp_path / "resumed.log")
    assert "Resumed from" in finish(resumed, tmp_path / "resumed.log")
    expected, got = load_file(whole / "model.safetensors"), load_file(interrupted / "model.safetensors")
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert len(list((interrupted / "checkpoints").glob("step_*"))) == 3


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A short digits run with two checkpoints and an exported 10-class model."""
    out = tmp_path_factory.mktemp("base") / "run"
    train_here(*SMOKE, "--max-steps", "4", "--checkpoint-every", "2", "--output-dir", str(out))
    return out


def test_resume_auto_ignores_a_half_written_checkpoint(base_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    half = out / "checkpoints" / ".tmp-step_00000006"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"truncated")
    assert trainer.checkpoint_dirs(out)[-1].name == "step_00000004"
    # What the killed run logged after its last complete checkpoint: the resumed run logs step 6 again.
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 6, "epoch": 0, "train/loss": 123.0}) + "\n")
    stdout = train_here(
        *SMOKE, "--max-steps", "6", "--checkpoint-every", "2", "--output-dir", str(out), "--resume", "auto"
    )
    assert f"Resumed from {out / 'checkpoints' / 'step_00000004'} at step 4" in stdout
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 123.0 not in [r.get("train/loss") for r in records], "the killed run's record after step 4 was kept"
    steps = [(r["step"], "val/top1" in r) for r in records]
    assert len(steps) == len(set(steps)), "a step recorded twice after the resume"
    assert (6, False) in steps


def test_a_resume_without_a_checkpoint_starts_the_records_again(base_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    shutil.rmtree(out / "checkpoints")  # as if killed before its first checkpoint
    before = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert before, "the first run logged nothing"
    stdout = train_here(*SMOKE, "--max-steps", "4", "--checkpoint-every", "2", "--output-dir", str(out), "--resume")
    assert "Resumed from" not in stdout
    starts_again = f"--resume: {out} holds no checkpoint (the run stopped before its first one), so the run starts"
    assert f"{starts_again} again from step 0." in stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == before, "the restarted run's records were added to the killed run's"


def test_non_finite_losses_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path):
    out = tmp_path / "diverge"
    args = [*SMOKE, "--opt", "sgd", "--lr", "1e30", "--clip-grad", "none", "--warmup-steps", "0", "--smoothing", "0"]
    with pytest.raises(SystemExit, match=r"2 non-finite losses in a row at step \d+; stopping\.") as stop:
        train_here(*args, "--checkpoint-every", "1", "--max-bad-steps", "2", "--output-dir", str(out))
    good = trainer.checkpoint_dirs(out)
    assert good, "no checkpoint was written before the loss diverged"
    assert f"Last good checkpoint: {good[-1]}" in str(stop.value)
    assert (good[-1] / "trainer_state.json").is_file()


def make_image_folder(root: Path, classes: int = 3, per_class: int = 12) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8) // (c + 1)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_finetune_a_saved_model_to_a_new_number_of_classes(base_run, tmp_path):
    folder = make_image_folder(tmp_path / "images")
    tuned = tmp_path / "tuned"
    train_here(
        *SMOKE,
        "--pretrained",
        f"local-dir:{base_run}",
        "--dataset",
        str(folder),
        "--img-size",
        "48",  # another input size, same weights
        "--layer-decay",
        "0.75",
        "--max-steps",
        "3",
        "--output-dir",
        str(tuned),
    )
    before, after = load_file(base_run / "model.safetensors"), load_file(tuned / "model.safetensors")
    assert after["head.fc.weight"].shape[0] == 3 and before["head.fc.weight"].shape[0] == 10
    assert before.keys() == after.keys()
    config = json.loads((tuned / "config.json").read_text())
    assert config["model_args"]["stem_stride"] == 2
    assert config["label_names"] == ["class_0", "class_1", "class_2"]
    assert config["pretrained_cfg"]["input_size"] == [3, 48, 48]


def test_linear_probe_trains_only_the_classifier(base_run, tmp_path):
    probe = tmp_path / "probe"
    weights = str(base_run / "model.safetensors")
    train_here(
        *SMOKE, "--pretrained", weights, "--freeze-backbone", "true", "--max-steps", "2", "--output-dir", str(probe)
    )
    before, after = load_file(base_run / "model.safetensors"), load_file(probe / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"head.fc.weight", "head.fc.bias"}


@pytest.mark.skipif(not CIFAR10.is_dir(), reason=f"no CIFAR-10 copy at {CIFAR10}")
def test_finetune_on_a_cifar10_parquet_folder(base_run, tmp_path, monkeypatch):
    """The recipe names the Hub's CIFAR-10 (images in `img`); IRIS_TIMM_DATA names a local copy in train.py's layout
    (`image`, a val split): the real CIFAR-10 Parquet files, cut to 256 + 128 rows to keep the test short."""
    from datasets import Dataset

    subset = tmp_path / "copies" / "cifar10"
    subset.mkdir(parents=True)
    monkeypatch.setenv(LOCAL_DATA, str(subset.parent))
    for name, rows in (("train", 256), ("val", 128)):
        Dataset.from_parquet(str(CIFAR10 / f"{name}.parquet")).select(range(rows)).to_parquet(
            subset / f"{name}.parquet"
        )
    tuned = tmp_path / "cifar"
    args = ["--max-steps", "2", "--batch-size", "32", "--num-workers", "0", "--output-dir", str(tuned)]
    stdout = train_here(
        "--config", str(ROOT / "configs" / "finetune_cifar10.yaml"), "--pretrained", f"local-dir:{base_run}", *args
    )
    assert f"dataset: uoft-cs/cifar10 read from its local copy {subset}" in stdout
    assert yaml.safe_load((tuned / "train_config.yaml").read_text())["dataset"] == str(subset)
    config = json.loads((tuned / "config.json").read_text())
    assert config["num_classes"] == 10
    assert config["label_names"][:3] == ["airplane", "automobile", "bird"]


def test_the_suggested_fine_tuning_says_it_downloads_and_reads_the_local_copy_it_describes(
    base_run, tmp_path, monkeypatch
):
    """The last lines of a run suggest fine-tuning on CIFAR-10, which comes from the Hub. Offline, the copy they
    describe (DIR/cifar10/train.parquet, with the Hub's columns: img and label) is what the command reads."""
    lines = train.next_steps(str(base_run)).splitlines()
    at = next(i for i, line in enumerate(lines) if "fine-tune it:" in line)
    suggested, notes = lines[at].split("fine-tune it:")[1], " ".join(line.strip() for line in lines[at + 1 :])
    assert "It downloads CIFAR-10 from the Hub." in notes
    copy = re.search(r"save CIFAR-10 as (DIR/\S+\.parquet)", notes).group(1)
    assert f"prefix the command with {LOCAL_DATA}=DIR." in notes
    root = tmp_path / "DIR"
    parquet_dataset((tmp_path / copy).parent, list(range(10)) * 10, image_column="img")
    assert (tmp_path / copy).is_file()  # parquet_dataset writes train.parquet
    monkeypatch.setenv(LOCAL_DATA, str(root))

    def offline(cfg):
        raise AssertionError("the Hub was asked for the dataset")

    monkeypatch.setattr(data, "_from_hub", offline)
    out = tmp_path / "tuned"
    argv = shlex.split(suggested.split("train.py", 1)[1])
    stdout = train_here(*argv, "--max-steps", "1", "--batch-size", "8", "--num-workers", "0", "--output-dir", str(out))
    assert f"dataset: uoft-cs/cifar10 read from its local copy {root / 'cifar10'}" in stdout
    assert json.loads((out / "summary.json").read_text())["steps"] == 1


@pytest.mark.parametrize("name", ["single_gpu", "multi_gpu", "multi_node", "fsdp"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
    assert config.num_processes >= 1 and config.mixed_precision == "bf16"
    if name == "fsdp":
        wrapped = config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"].split(",")
        assert set(wrapped) <= set(dir(iris_timm.models.pdessm))


def test_the_default_models_arguments_do_not_leak_into_another_model():
    assert train.parse_config([]).model_kwargs == {"stem_stride": 2}
    assert train.parse_config(["--model", "resnet18"]).model_kwargs == {}
    assert train.parse_config(["--model", "resnet18", "--model-kwargs", '{"drop_rate": 0.1}']).model_kwargs == {
        "drop_rate": 0.1
    }
    model = trainer.create_model(train.parse_config(["--model", "resnet10t"]), num_classes=3)
    assert model.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 3)


def parquet_dataset(
    folder: Path, labels: list[int], image_column: str = "image", label_column: str = "label", metadata: bool = True
) -> Path:
    """A Parquet split of tiny PNGs, with or without datasets' feature metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    folder.mkdir(parents=True)
    pngs = []
    for i in range(len(labels)):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (i * 7 % 256, 0, 0)).save(buffer, format="PNG")
        pngs.append({"bytes": buffer.getvalue(), "path": None})
    table = pa.table({image_column: pngs, label_column: labels})
    if metadata:
        from datasets import Dataset, Image

        Dataset(table).cast_column(image_column, Image()).to_parquet(str(folder / "train.parquet"))
    else:
        pq.write_table(table, folder / "train.parquet")
    return folder


@pytest.mark.parametrize(
    ("labels", "kwargs", "message"),
    [
        (list(range(-1, 9)) * 2, {}, r"holds negative labels \(-1\): labels are class indices 0\.\.N-1"),
        ([0, 100, 200, 300, 400] * 4, {}, r"labels are 5 integers \(0, 100, 200, 300, 400\), not 0\.\.4"),
        (
            [0, 1] * 5,
            {"image_column": "img"},
            r"The dataset has no column 'image'; its columns are \['img', 'label'\]",
        ),
        (
            [0, 1] * 5,
            {"label_column": "class"},
            r"The dataset has no column 'label'; its columns are \['image', 'class'\]\. Set label_column",
        ),
        ([0], {}, r"The dataset has 1 image\(s\) and no validation split: too few"),
    ],
)
def test_bad_datasets_fail_with_what_to_fix(tmp_path, labels, kwargs, message):
    data = parquet_dataset(tmp_path / "data", labels, **kwargs)
    cfg = train.parse_config([*SMOKE, "--dataset", str(data), "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=message):
        train.main(cfg)
    assert not (tmp_path / "out").exists(), "a run that fails validation must write nothing"


def test_parquet_without_datasets_metadata_decodes_its_images(tmp_path):
    data = parquet_dataset(tmp_path / "data", [0, 1, 2] * 8, metadata=False)
    cfg = train.parse_config([*SMOKE, "--dataset", str(data), "--output-dir", str(tmp_path / "out")])
    train_data, _ = trainer.load_splits(cfg)
    assert train_data[0]["image"].size == (8, 8)


def test_a_folder_in_use_by_another_run_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl,sys,time; f=open({str(out / '.lock')!r},'a+'); "
            "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = train.parse_config([*SMOKE, "--output-dir", str(out)])
        with pytest.raises(SystemExit, match=rf"{re.escape(str(out))} is in use by another run \(PID 4242\)"):
            train.main(cfg)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()


def test_overwrite_replaces_a_finished_run_and_keeps_nothing_of_it(base_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    (out / "notes.txt").write_text("left by the earlier run")
    train_here(*SMOKE, "--max-steps", "2", "--output-dir", str(out), "--overwrite", "true")
    assert not (out / "notes.txt").exists(), "--overwrite keeps nothing of the earlier run"
    assert [p.name for p in trainer.checkpoint_dirs(out)] == ["step_00000002"]
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def folder_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder``, by its path there, and the SHA-256 of its bytes."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def careless_input(case: str, tmp_path: Path, run_folder: Path) -> tuple[list[str], Path]:
    """The command line of a careless input, and the run folder it names (``run_folder``: a finished run of 4
    steps)."""
    if case == "--resume, no run to continue":
        (tmp_path / "never").mkdir()
        return ["--output-dir", str(tmp_path / "never"), "--resume"], tmp_path / "never"
    argv = ["--output-dir", str(run_folder)]
    if case == "empty folder":
        (tmp_path / "empty").mkdir()
        return [*argv, "--dataset", str(tmp_path / "empty")], run_folder
    if case == "csv file":
        (tmp_path / "data.csv").write_text("image,label\n")
        return [*argv, "--dataset", str(tmp_path / "data.csv")], run_folder
    if case == "images without class folders":
        return [*argv, "--dataset", str(make_image_folder(tmp_path / "images", 1, 3) / "train" / "class_0")], run_folder
    if case.startswith("empty class folder"):  # images/train/class_9, in a dataset of images/ or of images/train/
        root = make_image_folder(tmp_path / "images", classes=2, per_class=2)
        (root / "train" / "class_9").mkdir()
        return [*argv, "--dataset", str(root if case.endswith("under train/") else root / "train")], run_folder
    flags = {
        "--resume, fewer steps": ["--resume", "--max-steps", "2"],
        "--resume, as many steps": ["--resume", "--max-steps", "4"],
        "--resume, another recipe": ["--resume", "--max-steps", "6", "--seed", "1", "--lr", "1"],
        "a finished run, neither --resume nor --overwrite": ["--max-steps", "6"],
    }
    return [*argv, *flags[case]], run_folder


EMPTY_CLASS_FOLDER = r"Class folder\(s\) without images: \S+/images/train/class_9\. Add images, or remove the folder"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "empty folder",
            r"dataset: \S+empty is an empty folder\. train\.py reads a Parquet file or folder \(one \.parquet",
        ),
        ("csv file", r"dataset: \S+data\.csv is a \.csv file, which train\.py does not read\. It reads a Parquet file"),
        (
            "images without class folders",
            r"holds images but no class subfolders\. An image folder needs one subfolder per",
        ),
        ("empty class folder, under train/", EMPTY_CLASS_FOLDER),
        ("empty class folder, no split folders", EMPTY_CLASS_FOLDER),
        (
            "--resume, no run to continue",
            r"--resume: \S+never holds no run to continue \(no checkpoint, no train_config",
        ),
        (
            "--resume, fewer steps",
            r"holds a finished run of 4 steps, which --resume extends only with more steps\. Give",
        ),
        (
            "--resume, as many steps",
            r"holds a finished run of 4 steps, .* Give a --max-steps above 4 \(or more --epochs\)",
        ),
        (
            "--resume, another recipe",
            r"the recipe differs: lr: saved 0\.\d+, now 1\.0; seed: saved 0, now 1\. Resume",
        ),
        (
            "a finished run, neither --resume nor --overwrite",
            r"already holds a run \(.*\)\. Continue it with --resume, replace it with --overwrite",
        ),
    ],
)
def test_careless_input_ends_in_one_line_and_leaves_the_run_folder_as_it_was(base_run, tmp_path, case, message):
    run_folder = tmp_path / "run"
    shutil.copytree(base_run, run_folder)
    argv, folder = careless_input(case, tmp_path, run_folder)
    before = folder_digest(folder)
    with pytest.raises(SystemExit, match=message) as refusal:
        train.main(train.parse_config([*SMOKE, *argv]))
    assert "\n" not in str(refusal.value)
    assert folder_digest(folder) == before


@pytest.mark.parametrize("mode", [["--multi_gpu"], ["--cpu"]])
def test_a_multi_process_launch_that_runs_one_process_stops_with_the_command_that_works(tmp_path, mode):
    """`accelerate launch --multi_gpu` without GPUs starts processes that Accelerate runs alone; `--cpu` without
    `--multi_gpu` starts one process, whatever --num_processes says. One message says so, once, and the launch ends
    without the launcher's traceback."""
    env = run_env()
    env.pop("ACCELERATE_USE_CPU", None)
    launch = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(free_port())]
    result = subprocess.run(
        [*launch, "train.py", *SMOKE, "--output-dir", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert (
        result.stderr.count("launched as one of 2 (WORLD_SIZE or --num_processes), but Accelerate runs it alone") == 1
    )
    assert "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N train.py" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_non_finite_weights_are_never_written(tmp_path):
    model = timm.create_model("iris_pdessm_test", num_classes=3)
    (tmp_path / "checkpoints" / "step_00000002").mkdir(parents=True)
    run = types.SimpleNamespace(
        plain_model=lambda: model, ema=None, output_dir=tmp_path, state=TrainerState(total_steps=5)
    )
    run.state.step = 3
    trainer.refuse_non_finite_weights(run)  # finite: nothing to say
    with torch.no_grad():
        model.head.fc.weight[0, 0] = float("inf")
    last = re.escape(str(tmp_path / "checkpoints" / "step_00000002"))
    with pytest.raises(TrainingError, match=rf"NaN or infinity.*head\.fc\.weight.*Last good checkpoint: {last}"):
        trainer.refuse_non_finite_weights(run)


def test_a_bare_weights_file_builds_the_recipes_model_and_its_folder_the_saved_one(base_run):
    """A bare .safetensors carries no architecture (README, Fine-tuning): it loads into the model the recipe names,
    here with stem stride 4, though it was trained with stem stride 2; ``local-dir:`` restores stride 2."""
    stride_4 = [*SMOKE, "--model-kwargs", '{"stem_stride": 4}']
    bare = train.parse_config([*stride_4, "--pretrained", str(base_run / "model.safetensors")])
    folder = train.parse_config([*stride_4, "--pretrained", f"local-dir:{base_run}"])
    from_file, from_folder = trainer.create_model(bare, 10), trainer.create_model(folder, 10)
    assert from_file.stem.conv2.stride == (2, 2) and from_folder.stem.conv2.stride == (1, 1)  # stem stride 4, 2
    assert torch.equal(from_file.state_dict()["head.fc.weight"], from_folder.state_dict()["head.fc.weight"])


def test_a_checkpoint_without_its_weights_names_the_missing_file(base_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    last = trainer.checkpoint_dirs(out)[-1]
    (last / "model.safetensors").unlink()
    cfg = train.parse_config([*SMOKE, "--max-steps", "6", "--output-dir", str(out), "--resume"])
    with pytest.raises(
        SystemExit, match=rf"Checkpoint {re.escape(str(last))} is incomplete: model\.safetensors missing"
    ):
        train.main(cfg)


def test_a_one_channel_model_reads_greyscale_images_and_exports_its_preprocessing(tmp_path):
    out = tmp_path / "grey"
    argv = [*SMOKE, "--model-kwargs", '{"stem_stride": 2, "in_chans": 1}', "--max-steps", "3"]
    train_here(*argv, "--output-dir", str(out), "--transpose", "0.5", "--vflip", "0.5", "--hflip", "0.5")
    config = json.loads((out / "config.json").read_text())["pretrained_cfg"]
    assert config["input_size"] == [1, 32, 32]
    assert len(config["mean"]) == len(config["std"]) == 1
    cfg = train.parse_config([*argv, "--output-dir", str(tmp_path / "unused")])
    model = trainer.create_model(cfg, num_classes=10)
    train_data, val_data = trainer.load_splits(cfg)
    _, val_loader, _, val_batches = trainer.make_loaders(cfg, trainer.preprocessing(cfg, model), train_data, val_data)
    images, _ = val_batches(next(iter(val_loader)))
    assert images.shape[1:] == (1, 32, 32)
    assert model(images).shape == (len(images), 10)


def test_transpose_swaps_the_image_axes_and_converts_the_mode():
    from PIL import Image

    pixels = np.arange(12, dtype=np.uint8).reshape(3, 4)
    image = Image.fromarray(pixels).convert("RGB")
    swapped = ConvertImage("L", transpose=1.0)(image)
    np.testing.assert_array_equal(np.asarray(swapped), pixels.T)
    np.testing.assert_array_equal(np.asarray(ConvertImage("L")(image)), pixels)


@pytest.mark.parametrize(
    ("output_dir", "message"),
    [
        ("{file}/sub", r"output_dir: \S+/notes\.txt/sub cannot be made: \S+/notes\.txt is a file, not a folder\."),
        ("{file}", r"output_dir: \S+/notes\.txt cannot be written in: \S+/notes\.txt is a file, not a folder\."),
        # No process may make a folder in /sys, root's included.
        ("/sys/iris-run", r"output_dir: /sys/iris-run cannot be made: you may not write in /sys \(.+\)\. Choose"),
    ],
    ids=["under a file", "a file", "a folder no one may write in"],
)
def test_an_output_dir_that_cannot_be_made_is_refused_before_the_data_load(tmp_path, monkeypatch, output_dir, message):
    (tmp_path / "notes.txt").write_text("a file")

    def no_data(cfg):
        raise AssertionError("the data were loaded before the run folder was checked")

    monkeypatch.setattr(trainer, "load_splits", no_data)
    cfg = train.parse_config([*SMOKE, "--output-dir", output_dir.format(file=tmp_path / "notes.txt")])
    with pytest.raises(SystemExit, match=message) as refusal:
        train.main(cfg)
    assert "\n" not in str(refusal.value) and (tmp_path / "notes.txt").read_text() == "a file"


def broken_folder(damage: str, saved: Path, folder: Path) -> Path:
    """A copy of the saved model folder ``saved``, damaged as ``damage`` says."""
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(saved / name, folder / name)
    if damage == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "config not JSON":
        (folder / "config.json").write_text("{'architecture': 'iris_pdessm_test'}")
    else:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"architecture": "iris_pdessm_huge"}))
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated weights", r"pretrained: \S+/model\.safetensors is not a readable safetensors file \(.*truncated"),
        ("config not JSON", r"pretrained: \S+/config\.json is not valid JSON \(.*\)\. Save the model again"),
        ("unknown architecture", r"pretrained: \S+/config\.json names the architecture 'iris_pdessm_huge', which timm"),
    ],
)
def test_a_broken_pretrained_folder_ends_in_one_line(base_run, tmp_path, damage, message):
    folder = broken_folder(damage, base_run, tmp_path / "broken")
    cfg = train.parse_config([*SMOKE, "--pretrained", f"local-dir:{folder}", "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=message) as refusal:
        train.main(cfg)
    assert "\n" not in str(refusal.value)


def test_help_gives_every_flag_the_line_of_its_config_field(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width
    with pytest.raises(SystemExit) as done:
        train.parse_config(["--help"])
    assert done.value.code == 0
    flags = {}  # each flag's entry: its line, and the lines below it that argparse indents further
    for line in capsys.readouterr().out.split("\noptions:\n")[1].splitlines():
        if line.startswith("  -"):
            flag = line.split()[0]
        flags[flag] = f"{flags.get(flag, '')} {line.strip()}"
    for field in dataclasses.fields(train.Config):
        line = flags["--" + field.name.replace("_", "-")]
        assert f"{field.metadata[HELP]} (default: {getattr(train.Config(), field.name)!r})" in line, field.name
    for form in ("digits", "ORG/NAME", "Parquet", "<class>/*.png", "train/<class>/*.png"):
        assert form in flags["--dataset"], form


def test_a_bare_boolean_flag_means_true():
    config = train.parse_config(["--channels-last", "--overwrite", "false", "--compile"])
    assert (config.channels_last, config.overwrite, config.compile) == (True, False, True)
    assert train.parse_config(["--overwrite"]).overwrite is True
    assert train.parse_config([]).overwrite is False


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_unreadable_image_names_its_file_and_a_rerun_is_accepted(tmp_path, damage):
    root = make_image_folder(tmp_path / "images", classes=2, per_class=4)
    broken = root / "train" / "class_1" / "2.png"
    data = broken.read_bytes()
    broken.write_bytes(b"not an image" if damage == "garbage" else data[: len(data) // 2])
    cfg = train.parse_config([*SMOKE, "--dataset", str(root), "--loader", "pil", "--output-dir", str(tmp_path / "o")])
    for _ in range(2):  # the folder the failed run leaves is taken again without --resume or --overwrite
        with pytest.raises(SystemExit, match=rf"\({re.escape(str(broken))}\) of the dataset cannot be read"):
            train.main(cfg)


def test_a_missing_relative_path_is_named_before_the_hub_is_tried(tmp_path, monkeypatch, capsys):
    def no_hub(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(iris_timm.training.data, "load_dataset", no_hub)
    cfg = train.parse_config([*SMOKE, "--dataset", "data/imgs", "--output-dir", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"data/imgs is no local file or folder, and the Hub did not provide it"):
        train.main(cfg)
    assert "no local file or folder data/imgs; loading the Hub dataset" in capsys.readouterr().out


def signal_at_step(monkeypatch, step: int, signum: signal.Signals) -> None:
    """Send this process ``signum`` once the run's update ``step`` is done, as a user's Ctrl-C or a kill would."""
    after_step = trainer.after_step

    def after_step_then_signal(run, loss):
        after_step(run, loss)
        if run.state.step == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(trainer, "after_step", after_step_then_signal)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_checkpoints_the_step_it_ends_and_names_the_resume_command(
    tmp_path, monkeypatch, capsys, signum, status
):
    signal_at_step(monkeypatch, 3, signum)  # checkpoints every 2 steps: 3 is none
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "run"
    cfg = train.parse_config([*SMOKE, "--checkpoint-every", "2", "--output-dir", str(out)])
    with pytest.raises(SystemExit) as stop:
        train.main(cfg)
    assert stop.value.code == status
    written = out / "checkpoints" / "step_00000003"
    assert re.search(
        rf"^Stopped by {signum.name} at step 3; checkpoint written: {re.escape(str(written))}\. Continue with: "
        r"python .*--resume$",
        capsys.readouterr().err,
        re.M,
    )
    assert trainer.checkpoint_dirs(out) == [out / "checkpoints" / "step_00000002", written]
    assert TrainerState.load(written).step == 3
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # the process's own again, after the run


def test_a_second_ctrl_c_ends_at_once_and_leaves_the_last_checkpoint_whole(tmp_path, monkeypatch, capsys):
    """The first Ctrl-C (after step 3) asks for a checkpoint of step 3; a second, while it is written, ends the run at
    once: the checkpoint of step 2 is the last, whole, and the run resumes from it."""
    signal_at_step(monkeypatch, 3, signal.SIGINT)
    monkeypatch.setattr(interrupt, "REPEAT_AFTER_S", 0.0)  # the second comes at once, and counts
    apply_umask = trainer.apply_umask

    def second_ctrl_c_while_step_3_is_written(path):
        apply_umask(path)
        if path.name == ".tmp-step_00000003":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(trainer, "apply_umask", second_ctrl_c_while_step_3_is_written)
    out = tmp_path / "run"
    argv = [*SMOKE, "--checkpoint-every", "2", "--output-dir", str(out)]
    with pytest.raises(SystemExit) as stop:
        train.main(train.parse_config(argv))
    assert stop.value.code == 130
    last = out / "checkpoints" / "step_00000002"
    assert re.search(
        rf"^Stopped at once by a second SIGINT at step 3, its checkpoint not written\. Last checkpoint: "
        rf"{re.escape(str(last))}\. Continue with: python .*--resume$",
        capsys.readouterr().err,
        re.M,
    )
    assert trainer.checkpoint_dirs(out) == [last] and TrainerState.load(last).step == 2
    monkeypatch.undo()
    assert f"Resumed from {last} at step 2" in train_here(*argv, "--resume")
    assert not list((out / "checkpoints").glob(".tmp-*")), "the interrupted write's folder was left behind"


def test_a_signal_moments_after_the_first_is_the_same_request_and_a_later_one_ends_at_once(monkeypatch):
    """A launcher passes on the Ctrl-C its processes already got from the terminal: that one is the same request."""
    with interrupt.StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the terminal's
        os.kill(os.getpid(), signal.SIGINT)  # the launcher's, passed on
        assert (stop.received, stop.again) == (signal.SIGINT, None)
        monkeypatch.setattr(interrupt, "REPEAT_AFTER_S", 0.0)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    assert stop.again == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
