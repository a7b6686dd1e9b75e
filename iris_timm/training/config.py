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
from .recipes import HELP, parse_recipe, setting
from .run_folder import TRAINER_STATE, check_output_dir

__all__ = ["RESUMABLE_CHANGES", "Config", "parse_config", "validate"]


@dataclass
class Config:
    """Every setting of a run: a recipe key and a command-line flag each, with the help line ``--help`` shows."""

    # model
    model: str = setting("iris_pdessm_test", "a timm model (iris_pdessm_s, resnet10t, ...); iris_* export a card")
    model_kwargs: dict = field(
        default_factory=lambda: {"stem_stride": 2}, metadata={HELP: "extra timm.create_model arguments, a JSON object"}
    )
    pretrained: str | None = setting(
        None, "weights to start from: hf-hub:ORG/NAME, local-dir:PATH (a saved folder) or a .safetensors file"
    )
    img_size: int | None = setting(32, "image size in pixels; none: the model's pretrained_cfg input size")
    drop_path: float = setting(0.0, "stochastic depth (drop path) rate")
    freeze_backbone: bool = setting(False, "a linear probe: train the classifier only")
    grad_checkpointing: bool = setting(False, "recompute activations in the backward pass: less memory, more time")
    channels_last: bool = setting(False, "train in the channels-last memory layout")
    compile: bool = setting(False, "torch.compile the model (inductor)")
    num_threads: int | None = setting(None, "torch's CPU threads per process; none: OMP_NUM_THREADS or torch's default")
    # data
    dataset: str = setting(
        "digits",
        "digits (ships with scikit-learn), a Hub dataset id ORG/NAME, a Parquet file or a folder of one .parquet per "
        "split (train.parquet, val.parquet), or an image folder (<class>/*.png, or train/<class>/*.png and "
        "validation/<class>/*.png)",
    )
    data_source: str | None = setting(None, "where the dataset comes from, said when it is missing (data not public)")
    dataset_config: str | None = setting(None, "the Hub dataset's configuration name")
    train_split: str = setting("train", "the split to train on")
    val_split: str | None = setting(
        None, "the split to validate on; none: validation, val or valid, else val_fraction of train held out by class"
    )
    val_fraction: float = setting(0.1, "the share of train held out for validation where there is no such split")
    image_column: str = setting("image", "the dataset's image column")
    label_column: str = setting("label", "the dataset's label column (class indices 0..N-1, or a ClassLabel)")
    streaming: bool = setting(False, "stream a Hub dataset instead of downloading it whole (needs max_steps)")
    loader: str = setting(
        "auto", "memory: decoded once, batches augmented on the device; pil: timm's per-image transforms; auto: memory "
        "where the split fits and the recipe asks for nothing it lacks"
    )  # fmt: skip
    num_workers: int = setting(0, "data-loading worker processes")
    # augmentation and regularisation
    scale: tuple[float, float] = setting((0.5, 1.0), "random-resized-crop area range, a JSON pair")
    hflip: float = setting(0.0, "probability of a left-right flip")
    vflip: float = setting(0.0, "probability of a top-bottom flip")
    transpose: float = setting(0.0, "probability of swapping the image axes (with both flips at 0.5: every rotation)")
    auto_augment: str | None = setting(None, "a RandAugment policy, e.g. rand-m9-mstd0.5-inc1-mmax9 (pil loader only)")
    reprob: float = setting(0.0, "random erasing probability (pil loader only)")
    color_jitter: float = setting(0.0, "brightness, contrast and saturation jitter (pil loader only)")
    crop_pct: float | None = setting(1.0, "evaluation centre-crop fraction; none: the model's")
    mixup: float = setting(0.0, "mixup alpha; 0: off")
    cutmix: float = setting(0.0, "cutmix alpha; 0: off")
    smoothing: float = setting(0.1, "label smoothing")
    # optimisation (timm optimizer and scheduler factories)
    epochs: int = setting(8, "passes over the training split (max_steps wins)")
    max_steps: int | None = setting(None, "stop after this many optimizer updates (overrides epochs)")
    time_budget_s: float | None = setting(
        None, "train about this many seconds (evaluation excluded): the step count is fitted to the measured pace"
    )
    batch_size: int = setting(64, "images per process and batch")
    grad_accum_steps: int = setting(1, "batches accumulated into one optimizer update")
    opt: str = setting("adamw", "a timm optimizer (adamw, lamb, sgd, ...)")
    lr: float = setting(2e-3, "peak learning rate")
    weight_decay: float = setting(0.05, "weight decay")
    momentum: float = setting(0.9, "momentum, for the optimizers that take one (sgd)")
    layer_decay: float | None = setting(None, "layer-wise LR decay through the model's group_matcher, e.g. 0.75")
    sched: str = setting("cosine", "a timm LR schedule, stepped per update")
    warmup_steps: int = setting(20, "warm-up updates (at most half the run)")
    min_lr: float = setting(1e-5, "the schedule's lowest learning rate")
    clip_grad: float | None = setting(1.0, "clip the gradient norm to this; none: no clipping")
    ema_decay: float | None = setting(None, "keep an EMA of the weights with this decay; it is what gets exported")
    mixed_precision: str = setting("no", "no, bf16 or fp16 (autocast; fp16 adds loss scaling and needs a CUDA GPU)")
    # run
    output_dir: str = setting("output/digits", "the run folder: checkpoints, metrics.jsonl, the exported model")
    seed: int = setting(0, "seed of the weights, the data order and the augmentation")
    resume: str | None = setting(
        None, "continue the run from output_dir's latest checkpoint (bare --resume: auto) or from this folder", "auto"
    )
    overwrite: bool = setting(False, "clear an output_dir that holds another run (otherwise such a folder is refused)")
    checkpoint_every: int | None = setting(
        None, "also checkpoint every this many steps; one is written after each epoch and on Ctrl-C or SIGTERM"
    )
    keep_checkpoints: int = setting(2, "how many checkpoints to keep")
    log_every: int = setting(10, "log the loss and LR every this many steps")
    eval_every: int | None = setting(None, "also evaluate every this many steps (accuracy vs samples seen)")
    eval_every_s: float | None = setting(None, "also evaluate after each this many seconds of training")
    max_bad_steps: int = setting(5, "stop after this many non-finite losses in a row")
    log_with: str | None = setting("auto", "an Accelerate tracker (tensorboard, ...); auto: TensorBoard if installed")


def parse_config(argv: list[str] | None = None, description: str | None = None) -> Config:
    """The defaults above, under a `--config` recipe's values, under the command line's."""
    values = parse_recipe(Config, argv, description=description)
    if values.get("model", Config.model) != Config.model and "model_kwargs" not in values:
        values["model_kwargs"] = {}  # the default's model_kwargs are the default model's arguments, not any model's
    return Config(**values)


def validate(cfg: Config) -> None:
    """Fail before any training on values that cannot work, saying what to fix."""
    dataset_kind(cfg)  # a missing dataset first: its message says where the recipe's data come from
    check_output_dir(Path(cfg.output_dir))
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
