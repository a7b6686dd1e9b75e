"""The GPU study's plan, the Pathfinder packing and unpacking, the Pathfinder runner's deadline, and a smoke run of
every part whose Pathfinder runs train through the Pathfinder study into train.py's run folders."""

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import ROOT

from benchmarks import pack_pathfinder, pathfinder_study
from benchmarks.gpu_study import FULL, SMOKE, main, make_plan, makespan, pathfinder_data
from iris_timm.training.memory_data import load_compact, save_compact
from iris_timm.training.run_folder import (
    CHECKPOINTS,
    METRICS,
    SUMMARY,
    TRAIN_CONFIG,
    checkpoint_dirs,
    read_summary,
    read_train_config,
)

VARIANTS = list(pathfinder_study.VARIANTS)


def test_makespan_gives_each_run_to_the_first_free_worker():
    assert makespan([5.0, 3.0, 3.0, 2.0], jobs=2) == 7.0  # 5 | 3 + 3, then 2 after the 5
    assert makespan([4.0], jobs=3) == 4.0 and makespan([], jobs=2) == 0.0


# Every run 62.5 s (6,250 steps of 0.01 s), five at a time: a group of five runs takes 62.5 s.
EVEN = dataclasses.replace(FULL, step_s=dict.fromkeys(VARIANTS, 0.01), run_overhead_s=0.0, startup_s=0.0, data_s=0.0)
EVEN = dataclasses.replace(EVEN, check_s=0.0, record_s=0.0)


@pytest.mark.parametrize(
    ("budget_s", "groups"),
    [(200, [(9, 0), (9, 1)]), (300, [(9, 0), (9, 1), (6, 0), (14, 0)]), (1000, FULL.groups)],
)
def test_plan_takes_length_9_with_two_seeds_then_further_groups_as_the_budget_allows(budget_s, groups):
    plan = make_plan(EVEN, budget_s, samples=400_000, jobs=5, compile=False)
    assert sorted(plan.runs) == sorted((length, seed, v) for length, seed in groups for v in VARIANTS)
    assert plan.parts[f"pathfinder ({len(plan.runs)} runs, 5 at a time)"] == 62.5 * len(groups)
    assert plan.total_s <= budget_s


def test_plan_refuses_when_two_seeds_at_length_9_exceed_the_budget():
    with pytest.raises(SystemExit, match="exceeds the budget of 130 s"):
        make_plan(EVEN, 130, samples=400_000, jobs=5, compile=False)  # 125 s of runs + 13 s margin
    with pytest.raises(SystemExit, match="exceeds the budget of 540 s"):
        make_plan(FULL, 540, samples=2 * FULL.samples, jobs=FULL.jobs, compile=False)


def test_plan_starts_the_longest_runs_first_and_fits_the_full_study_in_540_s():
    plan = make_plan(FULL, 540, samples=FULL.samples, jobs=FULL.jobs, compile=False)
    assert sorted(plan.runs) == sorted((9, seed, v) for seed in (0, 1) for v in VARIANTS)
    seconds = [plan.run_s[v] for *_, v in plan.runs]
    assert seconds == sorted(seconds, reverse=True) and plan.total_s <= 540


def write_sets(root: Path, rows: int) -> dict[str, np.ndarray]:
    """Pathfinder-like Parquet sets (64x64 greyscale PNGs) under ``root``; the images by split name."""
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["no", "yes"])})
    written = {}
    for i, (length, folder) in enumerate(pack_pathfinder.FOLDERS.items()):
        for split in pack_pathfinder.SPLITS:
            images = np.random.default_rng(i).integers(0, 256, (rows, 64, 64), dtype=np.uint8)
            table = {"image": list(images), "label": [r % 2 for r in range(rows)]}
            (root / folder).mkdir(parents=True, exist_ok=True)
            datasets.Dataset.from_dict(table, features=features).to_parquet(root / folder / f"{split}.parquet")
            written[pack_pathfinder.split_name(length, split)] = images
    return written


def test_pack_keeps_the_first_images_of_every_split(tmp_path):
    written = write_sets(tmp_path / "data", rows=5)
    argv = ["--root", str(tmp_path / "data"), "--out", str(tmp_path / "pf.npz"), "--limit", "3", "--no-wheels"]
    splits, class_names = load_compact(pack_pathfinder.main(argv))
    assert class_names == ["no", "yes"] and splits.keys() == written.keys()
    for name, (images, labels) in splits.items():
        assert torch.equal(images, torch.from_numpy(written[name][:3, None]))
        assert labels.tolist() == [0, 1, 0]


def test_pack_names_the_missing_sets(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        pack_pathfinder.pack(tmp_path)


def test_unpack_writes_back_the_sets_pack_reads(tmp_path):
    write_sets(tmp_path / "data", rows=5)
    splits, class_names = pack_pathfinder.pack(tmp_path / "data")
    save_compact(tmp_path / "pf.npz", splits, class_names)
    pack_pathfinder.unpack(tmp_path / "pf.npz", tmp_path / "one", lengths=[9])
    assert sorted(p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").rglob("*.parquet")) == [
        "pathfinder64_length9/train.parquet",
        "pathfinder64_length9/val.parquet",
    ]
    pack_pathfinder.unpack(tmp_path / "pf.npz", tmp_path / "all", limit=4)
    again, names = pack_pathfinder.pack(tmp_path / "all")
    assert names == ["no", "yes"] and again.keys() == splits.keys()
    for name, (images, labels) in again.items():
        assert torch.equal(images, splits[name][0][:4]) and torch.equal(labels, splits[name][1][:4])


def test_the_runs_read_sets_already_in_root_and_otherwise_need_the_compact_file(tmp_path):
    write_sets(tmp_path / "sets", rows=3)
    args = argparse.Namespace(root=tmp_path / "sets", data=tmp_path / "absent.npz", out=tmp_path, smoke=False)
    data = pathfinder_data(args, FULL, [9])
    assert data["source"] == str(tmp_path / "sets")
    assert data["images"] == {"length9_train": 3, "length9_val": 3}
    args.root = tmp_path / "empty"
    with pytest.raises(SystemExit, match=r"absent\.npz does not exist"):
        pathfinder_data(args, FULL, [9])


def test_the_runner_skips_runs_after_the_deadline_and_stops_the_one_going(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the runs are `python -m benchmarks.pathfinder_study run`
    pathfinder_study.make_smoke_data(tmp_path / "data", 9)
    keys = [(9, 0, "frame"), (9, 1, "frame")]
    late = pathfinder_study.run_all(keys, 128, 64, tmp_path / "data", tmp_path / "late", 1, deadline=time.monotonic())
    assert late == dict.fromkeys(keys) and not (tmp_path / "late").exists()
    begin = time.monotonic()
    args = (keys, 64_000_000, 64_000, tmp_path / "data", tmp_path / "runs", 1)  # 10^6 steps: far past the deadline
    # pytest's workers start their processes with SIGINT ignored: the stop must not depend on it. The deadline is
    # long enough for the run to start training on a loaded machine too (before, SIGTERM ends it at once).
    codes = pathfinder_study.run_all(*args, deadline=begin + 45.0)
    assert time.monotonic() - begin < 150
    assert codes == {keys[0]: 143, keys[1]: None}
    folder = pathfinder_study.run_folder(tmp_path / "runs", "frame", 9, 0)
    assert "Stopped by SIGTERM" in (folder / "study.log").read_text()
    assert checkpoint_dirs(folder)


def finite_numbers(value) -> bool:
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    """The smoke study's --out: every part, tiny, on the CPU, the Pathfinder sets made up."""
    out = tmp_path_factory.mktemp("gpu_study")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the recipes are read from configs/, the runs started as `python -m benchmarks...`
        main(["--smoke", "--out", str(out), "--data", str(out / "absent.npz")])
    return out


def test_smoke_writes_every_part_into_json_and_markdown(smoke):
    results = json.loads((smoke / "results.json").read_text())
    assert {"plan", "took_s", "data", "correctness", "throughput", "pathfinder"} <= results.keys()
    assert finite_numbers(results)
    assert results["data"]["images"] == {"length9_train": SMOKE.limit, "length9_val": SMOKE.limit}
    report = (smoke / "results.md").read_text()
    for line in ("| model | grid (HxW) |", "| model | size | batch | mode | images/s |", "| 9 | frame | 0 |"):
        assert line in report
    assert "| length | variant | seed | 64 | 128 | figure at 128 | samples to 60 % | train s | samples/s |" in report


def test_smoke_models_are_finite_under_autocast(smoke):
    models = json.loads((smoke / "results.json").read_text())["correctness"]["models"]
    assert [(r["autocast"], r["finite_forward"], r["finite_backward"]) for r in models] == [
        ("bf16", True, True),
        ("fp16", True, True),
    ]


def test_smoke_pathfinder_runs_train_through_the_study_into_train_py_run_folders(smoke):
    part = json.loads((smoke / "results.json").read_text())["pathfinder"]
    assert sorted((r["variant"], r["length"], r["seed"], r["exit"]) for r in part["runs"]) == [
        ("cdr", 9, 0, 0),
        ("frame", 9, 0, 0),
    ]
    assert all([e["samples"] for e in r["evaluations"]] == [64, 128] for r in part["runs"])
    for variant in SMOKE.variants:
        folder = pathfinder_study.run_folder(smoke / "pathfinder", variant, 9, 0)
        assert {TRAIN_CONFIG, METRICS, SUMMARY, CHECKPOINTS} <= {p.name for p in folder.iterdir()}
        config = read_train_config(folder)
        assert config["mixed_precision"] == "bf16" and str(config["num_threads"]) == part["options"][-1]
        assert config["model"] == "pathfinder_frame" and config["model_kwargs"] == pathfinder_study.VARIANTS[variant]
        assert config["batch_size"] == 64 and read_summary(folder).steps == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_full_study_refuses_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match="CUDA GPU"):
        main(["--out", str(tmp_path)])
