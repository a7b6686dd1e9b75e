"""The files of a training run's folder (``train.py --output-dir``), defined once for the code that writes them
(train.py) and the code that reads them (``benchmarks/study.py``).

- ``train_config.yaml``: the run's whole configuration, every field of train.py's ``Config``;
- ``metrics.jsonl``: one JSON object a line, a ``TrainingLog`` every ``log_every`` steps and an ``Evaluation``
  after each evaluation, both with the step and epoch they were taken at;
- ``summary.json``: the ``Summary``, written last, so a folder without it is a run that did not finish;
- ``checkpoints/step_<N>/``: Accelerate's state plus ``trainer_state.json`` (the ``TrainerState``) and, with an
  EMA, ``ema.safetensors``;
- ``.lock``: held by the run that uses the folder (:func:`take_run_folder`), naming its PID.
"""

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from ..files import write_text
from .errors import TrainingError

__all__ = [
    "CHECKPOINTS",
    "EMA_WEIGHTS",
    "METRICS",
    "SUMMARY",
    "TRAINER_STATE",
    "TRAIN_CONFIG",
    "Evaluation",
    "Summary",
    "TrainerState",
    "TrainingLog",
    "append_metrics",
    "check_output_dir",
    "checkpoint_dirs",
    "last_checkpoint",
    "read_evaluations",
    "read_summary",
    "read_train_config",
    "take_run_folder",
    "truncate_metrics",
    "write_summary",
    "write_train_config",
]

TRAIN_CONFIG = "train_config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
EMA_WEIGHTS = "ema.safetensors"  # safetensors, unlike Accelerate's custom objects (pickles)

_VAL = "val/"  # the prefix of evaluation metrics, in metrics.jsonl and in the trackers (TensorBoard)


def _from_dict(cls: type, values: dict[str, Any], path: Path) -> Any:
    """``cls(**values)``, failing with the file's name on keys the record does not have or lacks."""
    try:
        return cls(**values)
    except TypeError as error:
        raise ValueError(f"{path} does not hold a {cls.__name__}: {error}.") from None


# ----------------------------------------------------------------------------- train_config.yaml


def write_train_config(folder: Path, config: dict[str, Any]) -> None:
    write_text(folder / TRAIN_CONFIG, yaml.safe_dump(config, sort_keys=False))


def read_train_config(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / TRAIN_CONFIG).read_text())


# ----------------------------------------------------------------------------- metrics.jsonl


@dataclass
class TrainingLog:
    """The loss and learning rate at a training step."""

    step: int
    epoch: int
    loss: float
    lr: float

    def metrics(self) -> dict[str, float]:
        """The values by the names metrics.jsonl and the trackers give them."""
        return {"train/loss": self.loss, "train/lr": self.lr}


@dataclass
class Evaluation:
    """Accuracy on the validation split after ``train_time_s`` seconds of training."""

    step: int
    epoch: int
    accuracy: dict[str, float]  # percent by metric: top1, top5 and, with an EMA, ema_top1, ema_top5
    train_time_s: float

    def metrics(self) -> dict[str, float]:
        """The values by the names metrics.jsonl and the trackers give them."""
        return {**{_VAL + name: value for name, value in self.accuracy.items()}, "train_time_s": self.train_time_s}


def append_metrics(folder: Path, record: TrainingLog | Evaluation) -> None:
    line = {"step": record.step, "epoch": record.epoch, **record.metrics()}
    with open(folder / METRICS, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def truncate_metrics(folder: Path, step: int) -> None:
    """Drop the records after ``step`` (a resumed checkpoint's), which the resumed run writes again: no step is
    recorded twice. Rewritten atomically."""
    path = folder / METRICS
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        write_text(path, "".join(line + "\n" for line in lines if json.loads(line)["step"] <= step))


def read_evaluations(folder: Path) -> list[Evaluation]:
    """The run's evaluations, in the order they were made."""
    evaluations = []
    for line in (folder / METRICS).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        accuracy = {key.removeprefix(_VAL): value for key, value in record.items() if key.startswith(_VAL)}
        if accuracy:
            evaluations.append(Evaluation(record["step"], record["epoch"], accuracy, record["train_time_s"]))
    return evaluations


# ----------------------------------------------------------------------------- summary.json


@dataclass
class Summary:
    """What a finished run measured."""

    top1: float | None  # of the last evaluation (of the EMA weights when on), percent
    best_top1: float | None
    best_epoch: int | None
    steps: int  # optimizer updates
    epochs: float | None  # None for a streamed dataset, which has no length
    skipped_steps: int  # updates skipped for a non-finite loss
    params: int
    train_images_per_s: float
    train_time_s: float  # seconds of training over the whole run, resumes included; evaluations, checkpoints excluded
    process_wall_time_s: float  # seconds the last process ran, from its start (or resume) to the end, all included
    threads: int | None = None  # torch's CPU threads per process; runs from before it was recorded lack it
    command: str = ""
    processes: int = 1  # training processes (Accelerate's num_processes)


def write_summary(folder: Path, summary: Summary) -> None:
    write_text(folder / SUMMARY, json.dumps(dataclasses.asdict(summary), indent=2))


def read_summary(folder: Path) -> Summary | None:
    """The run's summary; ``None`` if it has none (it did not finish)."""
    path = folder / SUMMARY
    if not path.is_file():
        return None
    return _from_dict(Summary, json.loads(path.read_text(encoding="utf-8")), path)


# ----------------------------------------------------------------------------- checkpoints/step_<N>/trainer_state.json


@dataclass
class TrainerState:
    """Where training stands. Saved in every checkpoint; a resumed run continues from it."""

    total_steps: int  # the run's length in optimizer updates: the recipe's, or what fits its time budget
    budget_fitted: bool = False  # True once the time budget has fixed total_steps
    recipe_steps: int | None = None  # the recipe's length: no fit of the time budget goes beyond it
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of the current epoch already trained on
    train_time_s: float = 0.0  # evaluations and checkpoints excluded
    pace_from_s: float | None = None  # train_time_s when the pace measurement began
    images_seen: int = 0
    last_eval_step: int | None = None
    last_eval_s: float = 0.0  # train_time_s at the last evaluation
    bad_steps: int = 0  # updates skipped for a non-finite loss
    top1: float | None = None  # of the latest evaluation
    best_top1: float | None = None
    best_epoch: int | None = None

    def save(self, checkpoint: Path) -> None:
        (checkpoint / TRAINER_STATE).write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, checkpoint: Path) -> "TrainerState":
        path = checkpoint / TRAINER_STATE
        return _from_dict(cls, json.loads(path.read_text(encoding="utf-8")), path)


# ----------------------------------------------------------------------------- the folder as a whole

LOCK = ".lock"
RUN_FILES = (CHECKPOINTS, "model.safetensors", "best", SUMMARY)  # what a run leaves that a new run would lose


def checkpoint_dirs(folder: Path) -> list[Path]:
    """Complete checkpoints, oldest first. One being written lives under a '.tmp-' name, never picked."""
    return sorted((folder / CHECKPOINTS).glob("step_*"))


def last_checkpoint(folder: Path) -> str:
    """The latest complete checkpoint, for messages."""
    return str((checkpoint_dirs(folder)[-1:] or ["none written yet"])[0])


def check_output_dir(folder: Path) -> None:
    """Refuse, before anything is loaded or written, a run folder that cannot be made or written in: a file on its
    path, or a folder this process may not write in (tried with an empty folder, removed at once)."""
    nearest = next(path for path in (folder, *folder.parents) if path.exists())
    made = "written in" if nearest == folder else "made"
    if not nearest.is_dir():
        raise TrainingError(
            f"output_dir: {folder} cannot be {made}: {nearest} is a file, not a folder. Choose another --output-dir."
        )
    try:
        os.rmdir(tempfile.mkdtemp(dir=nearest, prefix=".write-check-"))
    except OSError as error:
        reason = "you may not write in" if isinstance(error, PermissionError) else "nothing can be written in"
        raise TrainingError(
            f"output_dir: {folder} cannot be {made}: {reason} {nearest} ({error.strerror}). Choose another "
            "--output-dir."
        ) from None


def _lock(folder: Path) -> FileLock:
    """An exclusive OS lock on ``folder/.lock`` (the OS drops it when the process dies); a folder another run holds
    is refused, naming the PID that run wrote in the file."""
    lock = FileLock(folder / LOCK, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        holder = (folder / LOCK).read_text().strip() or "unknown"
        raise TrainingError(
            f"{folder} is in use by another run (PID {holder}): one run per folder. Wait for it, stop it, or "
            "choose another --output-dir."
        ) from None
    return lock


def _check_same_recipe(folder: Path, config: dict[str, Any], resumable: set[str]) -> None:
    """A resumed run continues the saved recipe: refuse every change but the ``resumable`` keys, naming each."""
    saved, current = read_train_config(folder), yaml.safe_load(yaml.safe_dump(config))  # tuples as saved
    changed = [k for k in current if k not in resumable and k in saved and current[k] != saved[k]]
    if changed:
        differences = "; ".join(f"{k}: saved {saved[k]!r}, now {current[k]!r}" for k in changed)
        raise TrainingError(
            f"--resume continues the run in {folder}, but the recipe differs: {differences}. Resume with the saved "
            f"recipe ({folder / TRAIN_CONFIG}), or start a new run with --overwrite or another --output-dir."
        )


def take_run_folder(
    folder: Path,
    config: dict[str, Any],
    resume: bool,
    overwrite: bool,
    resumable: set[str],
    steps_left: int | None = None,
) -> FileLock:
    """Lock ``folder`` for this run, check that the run may use it, and write the run's ``config`` and PID. A folder
    that holds another run is refused unless this run resumes it with the same recipe, or ``overwrite`` clears it. A
    resumed run needs a run to continue: a checkpoint (``steps_left``: the updates left to train from it), or the
    config of a run that ended before its first checkpoint, which holds nothing to lose and starts again. A finished
    run is resumed only to train longer. Nothing is written before every check has passed. Returns the lock, to hold
    for the run's life."""
    continues = resume and not overwrite
    if continues and steps_left is None and not (folder / TRAIN_CONFIG).is_file():
        raise TrainingError(
            f"--resume: {folder} holds no run to continue (no checkpoint, no {TRAIN_CONFIG}). Start the run without "
            "--resume, or give the --output-dir of the run to continue."
        )
    folder.mkdir(parents=True, exist_ok=True)
    lock = _lock(folder)
    existing = sorted(name for name in RUN_FILES if (folder / name).exists())
    if existing and overwrite:
        for path in folder.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.name != LOCK:
                path.unlink()
    elif existing and not resume:
        raise TrainingError(
            f"{folder} already holds a run ({', '.join(existing)}). Continue it with --resume, replace it with "
            "--overwrite, or choose another --output-dir."
        )
    elif resume and (folder / TRAIN_CONFIG).is_file():
        _check_same_recipe(folder, config, resumable)
    finished = read_summary(folder) if continues and steps_left is not None and steps_left <= 0 else None
    if finished is not None:
        raise TrainingError(
            f"--resume: {folder} holds a finished run of {finished.steps} steps, which --resume extends only with more "
            f"steps. Give a --max-steps above {finished.steps} (or more --epochs), or start afresh with --overwrite or "
            "another --output-dir."
        )
    (folder / LOCK).write_text(str(os.getpid()))  # another descriptor: the lock stays this process's
    if not resume:
        truncate_metrics(folder, -1)  # the records of a run that ended before its first checkpoint
    write_train_config(folder, config)
    return lock
