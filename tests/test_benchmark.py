"""The benchmark's table, rounds and target checks on hand-made records (no timing in tests)."""

import math

import pytest

from iris_timm.tools.benchmark import _parse, _sweep, check_targets, default_batch_size, format_table, merge_rounds


def record(model: str, size: int, images_per_s: float, peak_memory_mb: float = 100.0, mode: str = "fp32") -> dict:
    return {
        "model": model,
        "size": size,
        "batch_size": default_batch_size(size),
        "mode": mode,
        "images_per_s": images_per_s,
        "peak_memory_mb": peak_memory_mb,
        "seconds": [default_batch_size(size) / images_per_s],
    }


def test_targets_report_ratios_and_verdicts():
    records = [
        record("iris_pdessm_s", 224, 10.0),
        record("deit_small_patch16_224", 224, 8.0),
        record("convnext_tiny", 224, 11.0),
        record("mambaout_tiny", 224, 8.0),
        record("iris_pdessm_s", 1024, 10.0 / (1024 / 224) ** 2.4, peak_memory_mb=20.0),
        record("deit_small_patch16_224", 1024, 0.01, peak_memory_mb=100.0),
        {"model": "convnext_tiny", "size": 1024, "batch_size": 1, "mode": "fp32", "error": "out of memory"},
        record("convnext_tiny", 224, 1.0, mode="bf16"),  # another mode: not a target's
    ]
    verdicts = {r["target"]: (r["verdict"], r["measured"]) for r in check_targets(records)}
    assert len(verdicts) == 8
    assert verdicts["224²: iris_pdessm_s / deit_small_patch16_224 images/s >= 1.0"] == ("PASS", 1.25)
    verdict, value = verdicts["224²: iris_pdessm_s / convnext_tiny images/s >= 1.0"]
    assert verdict == "FAIL" and math.isclose(value, 10 / 11)
    assert verdicts["224²: iris_pdessm_s / mambaout_tiny images/s >= 1.2"] == ("PASS", 1.25)
    assert verdicts["1024²: iris_pdessm_s / deit_small_patch16_224 peak memory <= 0.3"] == ("PASS", 0.2)
    # A peer that could not run is not a pass.
    assert verdicts["1024²: iris_pdessm_s / convnext_tiny images/s >= 1.2"] == ("NOT MEASURED", None)
    assert verdicts["1024²: iris_pdessm_s / convnext_tiny peak memory <= 1.0"] == ("NOT MEASURED", None)
    verdict, value = verdicts["224²→1024²: iris_pdessm_s time/image ~ (pixels)^p, p <= 1.1"]
    assert verdict == "FAIL" and math.isclose(value, 1.2)


def test_the_table_gives_each_mode_and_model_images_per_s_and_the_ratio_to_the_baseline():
    records = [
        record("iris_pdessm_s", 224, 9.0),
        record("convnext_tiny", 224, 6.0),
        record("iris_pdessm_s", 1024, 0.5),
        {"model": "convnext_tiny", "size": 1024, "batch_size": 1, "mode": "fp32", "error": "RuntimeError: no memory"},
        record("iris_pdessm_s", 224, 4.0, mode="onnxruntime"),
        record("convnext_tiny", 224, 5.0, mode="onnxruntime"),
    ]
    lines = format_table(records).splitlines()
    assert lines[0].split() == [
        *("mode", "model"),
        *("224²", "b8", "img/s", "×", "convnext_tiny"),
        *("1024²", "b1", "img/s", "×", "convnext_tiny"),
    ]
    assert [line.split() for line in lines[1:5]] == [
        ["fp32", "iris_pdessm_s", "9.00", "1.50", "0.50", "-"],
        ["fp32", "convnext_tiny", "6.00", "1.00", "error", "-"],
        ["onnxruntime", "iris_pdessm_s", "4.00", "0.80", "-", "-"],
        ["onnxruntime", "convnext_tiny", "5.00", "1.00", "-", "-"],
    ]
    assert lines[5] == "error: fp32 convnext_tiny 1024²: RuntimeError: no memory"


def test_rounds_merge_into_their_median_and_keep_every_block():
    rounds = [[record("iris_pdessm_s", 224, v), record("convnext_tiny", 224, 1.0)] for v in (8.0, 2.0, 4.0)]
    rounds[1][1] = {**rounds[1][1], "error": "timed out after 1800 s"}
    iris, convnext = merge_rounds(rounds)
    assert iris["images_per_s"] == 4.0 and iris["rounds"] == [8.0, 2.0, 4.0] and len(iris["seconds"]) == 3
    assert convnext["error"] == "timed out after 1800 s"  # a failed round is not hidden by the others


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            [],
            [
                *[(m, 224, "fp32") for m in ("iris_pdessm_t", "iris_pdessm_s", "convnext_tiny")],
                *[(m, 224, "fp32") for m in ("mambaout_tiny", "deit_small_patch16_224")],
                *[(m, 224, "bf16") for m in ("iris_pdessm_t", "iris_pdessm_s", "convnext_tiny")],
                *[(m, 224, "bf16") for m in ("mambaout_tiny", "deit_small_patch16_224")],
                ("iris_pdessm_s", 224, "onnxruntime"),
                ("convnext_tiny", 224, "onnxruntime"),
            ],
        ),
        (
            ["--models", "iris_pdessm_s", "--peers", "resnet50", "--modes", "train", "onnxruntime"],
            [("iris_pdessm_s", 224, "train"), ("resnet50", 224, "train"), ("iris_pdessm_s", 224, "onnxruntime")],
        ),
    ],
    ids=["the table", "chosen"],
)
def test_the_sweep_runs_every_mode_on_its_models(argv, expected):
    sweep = _sweep(_parse(argv))
    assert [case for case in sweep if case[1] == 224] == expected
    assert sorted({case[1] for case in sweep}) == [224, 1024]


def test_default_batch_sizes():
    assert [default_batch_size(s) for s in (224, 384, 1024)] == [8, 1, 1]
