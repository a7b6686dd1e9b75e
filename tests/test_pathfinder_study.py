"""The Pathfinder study: its global paths against references, its runs through the training code train.py runs,
resumed and skipped as their folders say, and its table."""

import shutil

import pytest
import timm
import torch

import iris_timm.training
from benchmarks import pathfinder_study as study
from iris_timm.training.run_folder import (
    CHECKPOINTS,
    METRICS,
    SUMMARY,
    TRAIN_CONFIG,
    Evaluation,
    read_evaluations,
    read_summary,
)


def test_the_spectral_filter_with_unit_weights_is_the_identity():
    spectral = study.SpectralFilter(4, grid=8)
    with torch.no_grad():
        spectral.weight.copy_(torch.tensor([1.0, 0.0]))
    x = torch.randn(2, 8, 8, 4)
    torch.testing.assert_close(spectral(x), x, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", list(study.VARIANTS))
def test_every_variant_starts_as_the_frame_alone(variant):
    torch.manual_seed(0)
    frame = timm.create_model("pathfinder_frame").eval()
    torch.manual_seed(0)
    model = timm.create_model("pathfinder_frame", **study.VARIANTS[variant]).eval()
    shared = {k: v for k, v in model.state_dict().items() if k in frame.state_dict()}
    frame.load_state_dict(shared)  # the same conv, norm and head weights
    x = torch.randn(2, 1, 64, 64)
    torch.testing.assert_close(model(x), frame(x))


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """The smoke study (every variant, 2 steps each on made-up data), run twice: the second finds them finished."""
    out = tmp_path_factory.mktemp("study")
    first = study.smoke(out)
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob(SUMMARY)}
    second = study.smoke(out)
    return out / "runs", first, second, mtimes


def test_smoke_runs_train_through_the_training_code_into_run_folders(smoke_runs):
    runs, first, second, mtimes = smoke_runs
    assert study.fit is iris_timm.training.fit
    folders = sorted(p.parent for p in runs.rglob(SUMMARY))
    assert [f.parent.name for f in folders] == sorted(study.VARIANTS)
    for folder in folders:
        assert {TRAIN_CONFIG, METRICS, SUMMARY, CHECKPOINTS} <= {p.name for p in folder.iterdir()}
        assert read_summary(folder).steps == 2
    assert {p: p.stat().st_mtime_ns for p in runs.rglob(SUMMARY)} == mtimes, "a finished run was trained again"
    assert first == second and "| 9 | cdr_dynamic | 0 |" in first


def test_a_longer_budget_resumes_a_finished_run(smoke_runs, tmp_path):
    runs = smoke_runs[0]
    argv = study.run_argv("frame", 9, 0, samples=256, data_root=tmp_path, out=runs, eval_samples=64)
    assert argv[-1] == "--resume" and argv[argv.index("--max-steps") + 1] == "4"
    argv = study.run_argv("frame", 9, 5, samples=256, data_root=tmp_path, out=runs, eval_samples=64)
    assert "--resume" not in argv  # no such run yet


def result(top1s: list[float], variant: str = "cdr", seed: int = 0) -> study.RunResult:
    evaluations = [Evaluation(625 * (i + 1), 0, {"top1": t}, 100.0 * (i + 1)) for i, t in enumerate(top1s)]
    return study.RunResult(variant, 9, seed, 64, evaluations, finished=True)


def test_the_table_gives_accuracy_by_samples_and_the_samples_to_the_target():
    runs = [result([50.0, 61.0, 58.0]), result([50.0, 52.0, 60.0], seed=1), result([51.0, 53.0, 55.0], "frame")]
    assert runs[0].samples_to(60.0, 40_000) == 80_000 and runs[1].samples_to(60.0, 40_000) == 120_000
    assert runs[2].samples_to(60.0, 40_000) is None and runs[0].top1_at(120_000) == 58.0
    runs[2].evaluations.insert(1, Evaluation(1248, 1, {"top1": 70.0}, 150.0))  # an epoch's end, off the 40k grid
    assert runs[2].samples_to(60.0, 40_000) is None and [e.step for e in runs[2].every(40_000)] == [625, 1250, 1875]
    text = study.table(runs, samples=120_000, eval_samples=40_000)
    # figure: the mean of the evaluations from 40k on (the last 80k samples), the epoch's end included
    assert "| 9 | frame | 0 | 51.0 | 53.0 | 55.0 | 57.2 | – | 300 | 400.0 |" in text
    assert "| 9 | cdr | 1 | 50.0 | 52.0 | 60.0 | 54.0 | 120k | 300 | 400.0 |" in text
    assert "| 9 | cdr | 2 | 55.2 ± 1.6 | 59.0 ± 1.4 | 60.5 ± 0.7 |" in text
    assert "| 9 | frame | 1 | 57.2 | 55.0 | 70.0 |" in text  # best: any evaluation


def test_a_runs_figure_is_the_mean_of_its_last_80k_samples_and_waits_for_the_budget():
    run = result([50.0, 60.0, 70.0, 64.0])  # every 40k samples, to 160k
    run.evaluations.insert(2, Evaluation(1248, 1, {"top1": 80.0}, 150.0))  # an epoch's end at 79,872 samples
    run.evaluations.insert(4, Evaluation(1872, 2, {"top1": 61.0}, 250.0))  # and at 119,808
    assert run.figure(160_000) == pytest.approx((60.0 + 61.0 + 70.0 + 64.0) / 4)  # from 80k on: steps 1250 .. 2500
    assert run.figure(120_000) == pytest.approx((50.0 + 80.0 + 60.0 + 61.0 + 70.0) / 5)  # its own last 80k
    assert run.figure(200_000) is None  # not reached


def test_a_kept_record_resumes_an_unfinished_run_in_another_folder(smoke_runs, tmp_path):
    runs = smoke_runs[0]
    unfinished = tmp_path / "runs" / "length9" / "frame" / "seed0"
    shutil.copytree(runs / "length9" / "frame" / "seed0", unfinished)
    (unfinished / SUMMARY).unlink()  # as if stopped after its last checkpoint
    records = tmp_path / "records"
    assert study.keep(tmp_path / "runs", records) == [records / "length9" / "frame" / "seed0"]
    assert sorted(p.name for p in (records / "length9" / "frame" / "seed0").iterdir()) == [
        "checkpoint",
        METRICS,
        TRAIN_CONFIG,
    ]
    fresh = tmp_path / "elsewhere"
    study.run("frame", 9, 0, 192, runs.parent / "data", fresh, eval_samples=64, records=records)
    resumed = fresh / "length9" / "frame" / "seed0"
    assert read_summary(resumed).steps == 3
    assert [e.step for e in read_evaluations(resumed)] == [1, 2, 3]  # the record's two, then the resumed one
