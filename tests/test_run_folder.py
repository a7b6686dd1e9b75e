"""Atomic writes, permissions from the umask, and the files of a run folder read back as they were written."""

import dataclasses
import json
import os
import stat

import pytest
import torch
from conftest import run_summary
from safetensors.torch import save_file

from iris_timm.files import apply_umask, atomic_write, write_text
from iris_timm.training.run_folder import (
    Evaluation,
    TrainerState,
    TrainingLog,
    append_metrics,
    read_evaluations,
    read_summary,
    write_summary,
)


def test_a_failed_write_leaves_the_previous_file_and_no_partial(tmp_path):
    path = tmp_path / "results.md"
    write_text(path, "before")
    with pytest.raises(RuntimeError, match="disk full"), atomic_write(path) as partial:
        partial.write_text("half of it")
        raise RuntimeError("disk full")
    assert path.read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]


def test_the_partial_file_keeps_the_suffix_and_replaces_the_target(tmp_path):
    path = tmp_path / "picture.png"
    with atomic_write(path) as partial:
        assert partial.parent == tmp_path and partial.suffix == ".png" and partial != path
        partial.write_bytes(b"\x89PNG")
        assert not path.exists()  # nothing is visible under the final name before the block ends
    assert path.read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["picture.png"]


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


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_apply_umask_gives_a_folder_and_everything_in_it_the_umasks_permissions(tmp_path, umask):
    folder = tmp_path / "checkpoint"
    (folder / "random_states").mkdir(parents=True, mode=0o700)
    save_file({"w": torch.zeros(2)}, folder / "model.safetensors")  # written readable by the owner only
    (folder / "random_states" / "rng.pkl").write_bytes(b"")
    previous = os.umask(umask)
    try:
        apply_umask(folder)
    finally:
        os.umask(previous)
    modes = {path.relative_to(folder).as_posix(): stat.S_IMODE(path.stat().st_mode) for path in folder.rglob("*")}
    folder_mode, file_mode = 0o777 & ~umask, 0o666 & ~umask
    assert modes == {"model.safetensors": file_mode, "random_states": folder_mode, "random_states/rng.pkl": file_mode}
    assert stat.S_IMODE(folder.stat().st_mode) == folder_mode
