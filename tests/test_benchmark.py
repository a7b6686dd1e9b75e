"""The benchmark's target checks on hand-made records (no timing in tests)."""

import math

from iris_timm.tools.benchmark import check_targets, default_batch_size


def record(model: str, size: int, images_per_s: float, peak_memory_mb: float = 100.0) -> dict:
    return {
        "model": model,
        "size": size,
        "mode": "infer",
        "images_per_s": images_per_s,
        "peak_memory_mb": peak_memory_mb,
    }


def test_targets_report_ratios_and_verdicts():
    records = [
        record("iris_pdessm_s", 224, 10.0),
        record("deit_small_patch16_224", 224, 8.0),
        record("convnext_tiny", 224, 11.0),
        record("mambaout_tiny", 224, 8.0),
        record("iris_pdessm_s", 1024, 10.0 / (1024 / 224) ** 2.4, peak_memory_mb=20.0),
        record("deit_small_patch16_224", 1024, 0.01, peak_memory_mb=100.0),
        {"model": "convnext_tiny", "size": 1024, "mode": "infer", "error": "out of memory"},
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


def test_default_batch_sizes():
    assert [default_batch_size(s) for s in (224, 384, 1024)] == [8, 1, 1]
