"""A training run's settings: the ``Config`` dataclass (every field a recipe key and a command-line flag), read from
its defaults, a YAML recipe and the command line (:mod:`.recipes`), and checked before any training."""

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch

from .clock import PACE_STEPS
from .data import LOADERS, dataset_kind
from .errors import TrainingError
from .recipes import BARE, parse_recipe
from .run_folder import TRAINER_STATE

__all__ = ["RESUMABLE_CHANGES", "Config", "parse_config", "validate"]


@dataclass
class Config:
    # model
    model: str = "iris_pdessm_test"  # a timm model name; iris_* models export with their model card
    model_kwargs: dict = field(default_factory=lambda: {"stem_stride": 2})  # extra timm.create_model arguments
    pretrained: str | None = None  # hf-hub:ORG/NAME, local-dir:PATH or a .safetensors file
    img_size: int | None = 32  # None: the model's pretrained_cfg input size
    drop_path: float = 0.0
    freeze_backbone: bool = False  # linear probe: train the classifier only
    grad_checkpointing: bool = False
    channels_last: bool = False
    compile: bool = False
    num_threads: int | None = None  # torch's CPU threads per process; None: torch's default (OMP_NUM_THREADS)
    # data
    dataset: str = "digits"  # "digits" (ships with scikit-learn), a Hub name, Parquet file/folder or image folder
    data_source: str | None = None  # where the data come from, said when the dataset is missing (data not public)
    dataset_config: str | None = None
    train_split: str = "train"
    val_split: str | None = None  # None: "validation", "val" or "valid", else val_fraction of train, held out by class
    val_fraction: float = 0.1
    image_column: str = "image"
    label_column: str = "label"
    streaming: bool = False  # stream a Hub dataset instead of downloading it whole (needs max_steps)
    loader: str = "auto"  # memory: decoded once, batches augmented on the device; pil: timm's transforms; auto
    num_workers: int = 0
    # augmentation and regularisation
    scale: tuple[float, float] = (0.5, 1.0)  # random-resized-crop area range
    hflip: float = 0.0
    vflip: float = 0.0
    transpose: float = 0.0  # swap the image axes; with hflip and vflip at 0.5: every flip and 90° rotation
    auto_augment: str | None = None  # e.g. "rand-m9-mstd0.5-inc1-mmax9" (RandAugment; pil loader only)
    reprob: float = 0.0  # random erasing probability (pil loader only)
    color_jitter: float = 0.0  # brightness, contrast and saturation jitter (pil loader only)
    crop_pct: float | None = 1.0  # eval centre-crop fraction; None: the model's
    mixup: float = 0.0
    cutmix: float = 0.0
    smoothing: float = 0.1
    # optimisation (timm optimizer and scheduler factories)
    epochs: int = 8
    max_steps: int | None = None  # stop after this many optimizer updates (overrides epochs)
    time_budget_s: float | None = None  # train about this long (evaluation excluded); see fit_to_budget
    batch_size: int = 64  # per process
    grad_accum_steps: int = 1
    opt: str = "adamw"
    lr: float = 2e-3
    weight_decay: float = 0.05
    momentum: float = 0.9
    layer_decay: float | None = None  # layer-wise LR decay through the model's group_matcher
    sched: str = "cosine"
    warmup_steps: int = 20
    min_lr: float = 1e-5
    clip_grad: float | None = 1.0
    ema_decay: float | None = None  # keep an EMA of the weights; it is what gets exported
    mixed_precision: str = "no"  # no | bf16 | fp16
    # run
    output_dir: str = "output/digits"
    seed: int = 0
    resume: str | None = field(default=None, metadata={BARE: "auto"})  # "auto" (bare --resume) or a checkpoint folder
    overwrite: bool = False  # clear an output_dir that holds another run (otherwise such a folder is refused)
    checkpoint_every: int | None = None  # steps; a checkpoint is also written after each epoch
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int | None = None  # also evaluate every this many steps (accuracy vs samples seen)
    eval_every_s: float | None = None  # also evaluate after each this many seconds of training (accuracy vs time)
    max_bad_steps: int = 5  # stop after this many non-finite losses in a row
    log_with: str | None = "auto"  # Accelerate tracker ("tensorboard", ...), "auto": TensorBoard if installed


def parse_config(argv: list[str] | None = None, description: str | None = None) -> Config:
    """The defaults above, under a `--config` recipe's values, under the command line's."""
    values = parse_recipe(Config, argv, description=description)
    if values.get("model", Config.model) != Config.model and "model_kwargs" not in values:
        values["model_kwargs"] = {}  # the default's model_kwargs are the default model's arguments, not any model's
    return Config(**values)


def validate(cfg: Config) -> None:
    """Fail before any training on values that cannot work, saying what to fix."""
    dataset_kind(cfg)  # a missing dataset first: its message says where the recipe's data come from
    if not timm.is_model(cfg.model):
        close = difflib.get_close_matches(cfg.model, timm.list_models(), n=3)
        raise TrainingError(f"timm does not know the model {cfg.model!r}. Close names: {close or 'none'}.")
    choices = {"mixed_precision": ("no", "bf16", "fp16"), "loader": LOADERS}
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise TrainingError(f"{name} must be one of {', '.join(allowed)}, got {getattr(cfg, name)!r}.")
    for name in ("epochs", "batch_size", "grad_accum_steps", "keep_checkpoints", "log_every", "max_bad_steps"):
        if getattr(cfg, name) < 1:
            raise TrainingError(f"{name} must be >= 1, got {getattr(cfg, name)}.")
    for name in ("max_steps", "checkpoint_every", "time_budget_s", "eval_every", "eval_every_s", "num_threads"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise TrainingError(f"{name} must be >= 1 or none, got {getattr(cfg, name)}.")
    if not math.isfinite(cfg.lr) or cfg.lr <= 0:
        raise TrainingError(f"lr must be a finite number > 0, got {cfg.lr}.")
    if cfg.img_size is not None and cfg.img_size < 1:
        raise TrainingError(f"img_size must be >= 1 pixels, or none for the model's own size; got {cfg.img_size}.")
    if cfg.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise TrainingError("mixed_precision fp16 needs a CUDA GPU, and none is available; on a CPU use bf16 (or no).")
    for name in ("hflip", "vflip", "transpose"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise TrainingError(f"{name} is a probability: it must be in [0, 1], got {getattr(cfg, name)}.")
    if (cfg.mixup > 0 or cfg.cutmix > 0) and cfg.batch_size % 2:
        raise TrainingError(f"mixup/cutmix need an even batch_size, got {cfg.batch_size}.")
    if cfg.time_budget_s and cfg.max_steps is not None and cfg.max_steps <= PACE_STEPS[1]:
        raise TrainingError(
            f"A time budget measures the pace up to step {PACE_STEPS[1]}: max_steps must be larger, or lift the "
            "budget with --time-budget-s none."
        )
    if cfg.streaming and cfg.max_steps is None:
        raise TrainingError("A streamed dataset has no length: set max_steps.")
    if cfg.resume not in (None, "auto") and not (Path(cfg.resume) / TRAINER_STATE).is_file():
        raise TrainingError(f"resume: {cfg.resume} is not a checkpoint folder (it has no {TRAINER_STATE}).")


# Keys a resumed run may change: how long to train, how to log, evaluate and checkpoint, where the run is; not what
# one training step computes. (Lengthening a run re-plans its LR schedule from the step reached.)
RESUMABLE_CHANGES = {"resume", "overwrite", "output_dir", "max_steps", "epochs", "log_every", "log_with", "loader"}
RESUMABLE_CHANGES |= {"eval_every", "eval_every_s", "checkpoint_every", "keep_checkpoints", "max_bad_steps"}
RESUMABLE_CHANGES |= {"num_workers", "data_source"}
