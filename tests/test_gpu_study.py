"""The GPU study's plan, schedule and recipe choice, the Pathfinder packing, and a smoke run of every part."""

import json
import math
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import ROOT

from benchmarks import pack_pathfinder
from benchmarks.gpu_study import FULL, cosine_lr, main, make_plan, recipe_path
from iris_timm.training import parse_config
from iris_timm.training.memory_data import load_compact


def test_plan_fills_the_budget_and_refuses_more():
    plan = make_plan(FULL, budget_s=540, train_s=None, compile=False)
    assert plan.total_s == pytest.approx(540)
    assert plan.runs == 12 and plan.train_s >= FULL.min_train_s
    with pytest.raises(SystemExit, match="exceeds the budget"):
        make_plan(FULL, budget_s=540, train_s=plan.train_s + 1, compile=False)


@pytest.mark.parametrize(
    ("step", "fraction", "expected"),
    [(0, 0.0, 0.002 / 50), (49, 0.0, 0.002), (100, 0.5, (0.002 + 1e-5) / 2), (100, 1.0, 1e-5), (100, 1.2, 1e-5)],
)
def test_lr_warms_up_by_step_then_follows_a_cosine_over_the_seconds(step, fraction, expected):
    cfg = parse_config(["--lr", "0.002", "--min-lr", "1e-5", "--warmup-steps", "50"])
    assert cosine_lr(cfg, step, fraction) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("variant", "length", "expected"),
    [
        ("local", 6, "pathfinder64_length6_local.yaml"),
        ("local", 9, "pathfinder64_local.yaml"),
        ("local", 14, "pathfinder64_local.yaml"),
        ("iris", 6, "pathfinder64.yaml"),
    ],
)
def test_a_length_uses_its_own_recipe_where_one_exists(tmp_path, variant, length, expected):
    for name in ("pathfinder64.yaml", "pathfinder64_local.yaml", "pathfinder64_length6_local.yaml"):
        (tmp_path / name).write_text("model: resnet10t\n")
    assert recipe_path(variant, length, tmp_path) == tmp_path / expected


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
    out = pack_pathfinder.main(["--root", str(tmp_path / "data"), "--out", str(tmp_path / "pf.npz"), "--limit", "3"])
    splits, class_names = load_compact(out)
    assert class_names == ["no", "yes"] and splits.keys() == written.keys()
    for name, (images, labels) in splits.items():
        assert torch.equal(images, torch.from_numpy(written[name][:3, None]))
        assert labels.tolist() == [0, 1, 0]


def test_pack_names_the_missing_sets(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        pack_pathfinder.pack(tmp_path)


def finite_numbers(value) -> bool:
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def test_smoke_runs_every_part_into_json_and_markdown(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the recipes are read from configs/
    argv = ["--smoke", "--out", str(tmp_path), "--train-s", "0.2", "--data", str(tmp_path / "absent.npz")]
    main([*argv, "--root", str(tmp_path / "no_sets")])  # synthetic images
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"plan", "took_s", "correctness", "throughput", "pathfinder"} <= results.keys()
    assert finite_numbers(results)
    assert all(r["finite_forward"] and r["finite_backward"] for r in results["correctness"]["models"])
    assert {r["variant"] for r in results["pathfinder"]["runs"]} == {"iris", "local", "global", "resnet"}
    assert all(len(r["curve"]) == 2 and 0 <= r["final_accuracy"] <= 1 for r in results["pathfinder"]["runs"])
    report = (tmp_path / "results.md").read_text()
    for header in ("| model | grid (HxW) |", "| model | size | batch | mode | images/s |", "| variant | model |"):
        assert header in report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_full_study_refuses_without_cuda(tmp_path):
    with pytest.raises(SystemExit, match="CUDA GPU"):
        main(["--out", str(tmp_path)])
