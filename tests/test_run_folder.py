"""The files of a run folder (metrics, summary, trainer state) read back as they were written."""

import dataclasses
import json

import pytest
from conftest import run_summary

from iris_timm.training.run_folder import (
    Evaluation,
    TrainerState,
    TrainingLog,
    append_metrics,
    read_evaluations,
    read_summary,
    write_summary,
)


def test_evaluations_are_read_back_from_the_metrics_lines(tmp_path):
    evaluation = Evaluation(step=20, epoch=1, accuracy={"top1": 51.0, "top5": 90.0, "ema_top1": 52.5}, train_time_s=9.5)
    append_metrics(tmp_path, TrainingLog(step=10, epoch=0, loss=2.0, lr=1e-3))
    append_metrics(tmp_path, evaluation)
    append_metrics(tmp_path, TrainingLog(step=30, epoch=1, loss=1.5, lr=1e-3))
    assert read_evaluations(tmp_path) == [evaluation]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[1] == {
        "step": 20,
        "epoch": 1,
        "val/top1": 51.0,
        "val/top5": 90.0,
        "val/ema_top1": 52.5,
        "train_time_s": 9.5,
    }


def test_summary_round_trip_and_unfinished_runs(tmp_path):
    assert read_summary(tmp_path) is None  # no summary.json: the run did not finish
    summary = run_summary(threads=1)
    write_summary(tmp_path, summary)
    assert read_summary(tmp_path) == summary
    (tmp_path / "summary.json").write_text(json.dumps({**dataclasses.asdict(summary), "top_one": 50.0}))
    with pytest.raises(ValueError, match=r"summary\.json does not hold a Summary: .*'top_one'"):
        read_summary(tmp_path)


def test_trainer_state_round_trip(tmp_path):
    state = TrainerState(total_steps=100, budget_fitted=True, step=40, pace_from_s=1.5, best_top1=20.0)
    state.save(tmp_path)
    assert TrainerState.load(tmp_path) == state
