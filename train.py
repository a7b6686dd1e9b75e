"""Train or fine-tune an iris model with Accelerate.

    python train.py                                         # embedded default: digits, a few CPU minutes
    python train.py --config configs/cifar10.yaml
    accelerate launch --multi_gpu train.py --config configs/in1k_s.yaml --mixed-precision bf16
    python train.py --config configs/finetune_cifar10.yaml --pretrained local-dir:output/digits
    python train.py --config configs/cifar10_cpu_resnet.yaml --seed 1 --output-dir output/cifar10_cpu/resnet/seed1

Every field of `Config` below is a YAML key and a command-line flag (`batch_size` is `--batch-size`);
the command line wins over the YAML file, which wins over the defaults. `python train.py --help` lists them.
A YAML file may name a `base:` recipe (a path relative to itself) whose values it overrides; its `model_kwargs`
add to the base's, unless it names another model (`model_kwargs: {}` clears them). On the command line,
`--model-kwargs` replaces them.

main() reads as the run's phases; the functions it calls, in order, follow the configuration below: data, model,
loss and optimizer, checkpoints and resume, the training clock, one training step, evaluation, export.
"""

import argparse
import dataclasses
import difflib
import fcntl
import json
import math
import os
import random
import shlex
import shutil
import statistics
import sys
import time
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import timm
import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, broadcast_object_list, is_tensorboard_available, set_seed
from datasets import ClassLabel, Dataset, DatasetDict, load_dataset
from datasets import Image as ImageFeature
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from timm.data import Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader
from torchvision.transforms import Compose
from tqdm.auto import tqdm

import iris_timm
from iris_timm.run_folder import (
    CHECKPOINTS,
    EMA_WEIGHTS,
    TRAINER_STATE,
    Evaluation,
    Summary,
    TrainerState,
    TrainingLog,
    append_metrics,
    read_train_config,
    truncate_metrics,
    write_summary,
    write_train_config,
)


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
    dataset_config: str | None = None
    train_split: str = "train"
    val_split: str | None = None  # None: "validation", "val", "valid" or "test", else val_fraction of train
    val_fraction: float = 0.1
    image_column: str = "image"
    label_column: str = "label"
    streaming: bool = False  # stream a Hub dataset instead of downloading it whole (needs max_steps)
    num_workers: int = 0
    # augmentation (timm transforms) and regularisation
    scale: tuple[float, float] = (0.5, 1.0)  # random-resized-crop area range
    hflip: float = 0.0
    vflip: float = 0.0
    transpose: float = 0.0  # swap the image axes; with hflip and vflip at 0.5: every flip and 90° rotation
    auto_augment: str | None = None  # e.g. "rand-m9-mstd0.5-inc1-mmax9" (RandAugment)
    reprob: float = 0.0  # random erasing probability
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
    resume: str | None = None  # "auto" (latest checkpoint in output_dir) or a checkpoint folder
    overwrite: bool = False  # clear an output_dir that holds another run (otherwise such a folder is refused)
    checkpoint_every: int | None = None  # steps; a checkpoint is also written after each epoch
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every_s: float | None = None  # also evaluate after each this many seconds of training (accuracy vs time)
    max_bad_steps: int = 5  # stop after this many non-finite losses in a row
    log_with: str | None = "auto"  # Accelerate tracker ("tensorboard", ...), "auto": TensorBoard if installed


# ----------------------------------------------------------------------------- configuration


def config_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(Config)}


def check_keys(keys, source: str) -> None:
    fields = config_fields()
    for key in keys:
        if key not in fields:
            hint = difflib.get_close_matches(key, fields, n=1)
            did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
            raise SystemExit(f"Unknown config key {key!r} in {source}.{did_you_mean} Valid keys: {', '.join(fields)}.")


def coerce(name: str, value):
    """Convert a YAML or command-line value to the type of field `name`, or fail naming the key."""
    annotation = typing.get_type_hints(Config)[name]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = isinstance(annotation, types.UnionType) and type(None) in typing.get_args(annotation)
    base = args[0] if optional else annotation
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise SystemExit(f"Config key {name!r} cannot be empty.")
    try:
        if typing.get_origin(base) is tuple:
            value = json.loads(value) if isinstance(value, str) else value
            return tuple(float(v) for v in value)
        if base is dict:
            value = json.loads(value) if isinstance(value, str) else value
            if not isinstance(value, dict):
                raise TypeError
            return value
        if base is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return base(value)
    except (TypeError, ValueError, json.JSONDecodeError):
        raise SystemExit(f"Config key {name!r} expects {annotation}, got {value!r}.") from None


def read_recipe(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """A YAML recipe's values, over those of the `base:` recipe it names (relative to itself), recursively."""
    if not path.is_file():
        raise SystemExit(f"Config file {path} does not exist.")
    chain = (*chain, path)
    if path.resolve() in {p.resolve() for p in chain[:-1]}:
        raise SystemExit(f"Config files name each other as base in a cycle: {' -> '.join(map(str, chain))}.")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SystemExit(f"Config file {path} is not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise SystemExit(f"Config file {path} must hold `key: value` lines, not {type(values).__name__}.")
    base = values.pop("base", None)
    check_keys(values, str(path))
    if base is None:
        return values
    if not isinstance(base, str):
        raise SystemExit(f"Config file {path}: base must be the path of another recipe, got {base!r}.")
    return over_base(read_recipe(path.parent / base, chain), values)


def over_base(base: dict, recipe: dict) -> dict:
    """A recipe's values over its base's. Its model_kwargs add to the base's, so a variant names only the arguments
    it changes, unless it names another model (whose arguments those are not) or gives `{}`, which clears them."""
    merged = base | recipe
    kwargs = recipe.get("model_kwargs")
    if recipe.get("model", base.get("model")) != base.get("model"):
        merged["model_kwargs"] = kwargs if kwargs is not None else {}
    elif isinstance(kwargs, dict) and kwargs and isinstance(base.get("model_kwargs"), dict):
        merged["model_kwargs"] = base["model_kwargs"] | kwargs
    return merged


def parse_config(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML recipe (see configs/)")
    defaults, types_ = Config(), typing.get_type_hints(Config)
    for name in config_fields():
        flag = "--" + name.replace("_", "-")
        help_text = f"default: {getattr(defaults, name)!r}"
        if name == "resume":  # a bare --resume continues from the latest checkpoint
            parser.add_argument(flag, nargs="?", const="auto", default=argparse.SUPPRESS, help=help_text)
        elif types_[name] is bool:  # a bare boolean flag means true (--overwrite, --channels-last)
            parser.add_argument(flag, nargs="?", const="true", default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, default=argparse.SUPPRESS, help=help_text)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        check_flags(unknown)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")

    values = read_recipe(Path(args.config)) if args.config else {}
    values.update({k: v for k, v in vars(args).items() if k != "config"})
    if values.get("model", defaults.model) != defaults.model and "model_kwargs" not in values:
        values["model_kwargs"] = {}  # the default's model_kwargs are the default model's arguments, not any model's
    return Config(**{k: coerce(k, v) for k, v in values.items()})


def check_flags(unknown: list[str]) -> None:
    """Name what is wrong with command-line words argparse did not take: a flag spelled with underscores, or a
    flag that is no config key (values such as the `8` of `--batch_size 8` are not flags)."""
    fields = config_fields()
    for word in unknown:
        if not word.startswith("--"):
            continue
        name = word[2:].split("=")[0]
        if name in fields and "_" in name:
            raise SystemExit(f"Unknown flag {word.split('=')[0]}: flags use dashes, write --{name.replace('_', '-')}.")
        check_keys([name.replace("-", "_")], "the command line")


def validate(cfg: Config) -> None:
    """Fail before any training on values that cannot work, saying what to fix."""
    if not timm.is_model(cfg.model):
        close = difflib.get_close_matches(cfg.model, timm.list_models(), n=3)
        raise SystemExit(f"timm does not know the model {cfg.model!r}. Close names: {close or 'none'}.")
    if cfg.mixed_precision not in ("no", "bf16", "fp16"):
        raise SystemExit(f"mixed_precision must be no, bf16 or fp16, got {cfg.mixed_precision!r}.")
    for name in ("epochs", "batch_size", "grad_accum_steps", "keep_checkpoints", "log_every", "max_bad_steps"):
        if getattr(cfg, name) < 1:
            raise SystemExit(f"{name} must be >= 1, got {getattr(cfg, name)}.")
    for name in ("max_steps", "checkpoint_every", "time_budget_s", "eval_every_s", "num_threads"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise SystemExit(f"{name} must be >= 1 or none, got {getattr(cfg, name)}.")
    if not math.isfinite(cfg.lr) or cfg.lr <= 0:
        raise SystemExit(f"lr must be a finite number > 0, got {cfg.lr}.")
    if cfg.img_size is not None and cfg.img_size < 1:
        raise SystemExit(f"img_size must be >= 1 pixels, or none for the model's own size; got {cfg.img_size}.")
    if cfg.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise SystemExit(
            "mixed_precision fp16 needs a CUDA GPU, and none is available; on a CPU use bf16 (or no), which "
            "autocast runs there."
        )
    for name in ("hflip", "vflip", "transpose"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise SystemExit(f"{name} is a probability: it must be in [0, 1], got {getattr(cfg, name)}.")
    if uses_mixup(cfg) and cfg.batch_size % 2:
        raise SystemExit(f"mixup/cutmix need an even batch_size, got {cfg.batch_size}.")
    if cfg.time_budget_s and cfg.max_steps is not None and cfg.max_steps <= PACE_STEPS[1]:
        raise SystemExit(f"A time budget measures the pace up to step {PACE_STEPS[1]}: max_steps must be larger.")
    if cfg.streaming and cfg.max_steps is None:
        raise SystemExit("A streamed dataset has no length: set max_steps.")
    if cfg.resume not in (None, "auto") and not (Path(cfg.resume) / TRAINER_STATE).is_file():
        raise SystemExit(f"resume: {cfg.resume} is not a checkpoint folder (it has no {TRAINER_STATE}).")


def uses_mixup(cfg: Config) -> bool:
    return cfg.mixup > 0 or cfg.cutmix > 0


# ----------------------------------------------------------------------------- data


def digits_dataset() -> DatasetDict:
    """scikit-learn's 1,797 handwritten digits (8x8 grey), shipped inside the package: no download."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray((d * (255 / 16)).astype(np.uint8)) for d in digits.images]
    features = {"image": None, "label": ClassLabel(names=[str(i) for i in range(10)])}
    ds = Dataset.from_dict({"image": images, "label": digits.target.tolist()})
    ds = ds.cast_column("label", features["label"])
    return ds.train_test_split(test_size=0.1, seed=0, stratify_by_column="label")


def load_splits(cfg: Config):
    """Return (train, validation) datasets from the embedded digits, a local path or the Hub."""
    source = Path(cfg.dataset)
    if cfg.dataset == "digits":
        splits = digits_dataset()
    elif source.is_file() and source.suffix == ".parquet":
        splits = load_dataset("parquet", data_files={cfg.train_split: str(source)})
    elif source.is_dir() and list(source.glob("*.parquet")):
        # One file per split, named by its file stem (train.parquet, val.parquet, ...).
        splits = load_dataset("parquet", data_files={p.stem: str(p) for p in sorted(source.glob("*.parquet"))})
    elif source.is_dir():
        check_class_folders(source)
        splits = load_dataset("imagefolder", data_dir=str(source))
    elif cfg.dataset.startswith((".", "/")) or source.suffix:
        raise SystemExit(f"dataset: {cfg.dataset} does not exist. Give a Parquet file or folder, or an image folder.")
    else:
        try:
            splits = load_dataset(cfg.dataset, cfg.dataset_config, streaming=cfg.streaming)
        except Exception as error:  # datasets raises many types; all mean the same to the user
            raise SystemExit(f"Could not load dataset {cfg.dataset!r} from the Hub: {error}") from error

    if cfg.train_split not in splits:
        raise SystemExit(f"dataset has no split {cfg.train_split!r}; it has {list(splits)}. Set train_split.")
    for split in splits.values():
        check_columns(cfg, split)
    if not cfg.streaming:
        splits = {name: decoded_images(split, cfg.image_column) for name, split in splits.items()}
    val_name = cfg.val_split or next((s for s in ("validation", "val", "valid", "test") if s in splits), None)
    if val_name is None and not cfg.streaming:
        train = splits[cfg.train_split]
        held_out_count = math.ceil(len(train) * cfg.val_fraction)  # as datasets' train_test_split counts
        if held_out_count >= len(train):
            raise SystemExit(
                f"The dataset has {len(train)} image(s) and no validation split: too few to hold out val_fraction "
                f"{cfg.val_fraction}. Add images, or give a validation split (val_split)."
            )
        held_out = train.train_test_split(test_size=cfg.val_fraction, seed=cfg.seed)
        return held_out["train"], held_out["test"]
    if val_name not in splits:
        raise SystemExit(f"dataset has no split {val_name!r}; it has {list(splits)}. Set val_split.")
    return splits[cfg.train_split], splits[val_name]


class SeededTransform(torch.utils.data.Dataset):
    """Applies the transform with randomness seeded by (seed, epoch, index), so sample i of epoch e is
    augmented the same way whichever process, worker or resumed run loads it."""

    def __init__(self, dataset: Dataset, transform, image_column: str, label_column: str, seed: int):
        self.dataset, self.transform, self.seed, self.epoch = dataset, transform, seed, 0
        self.image_column, self.label_column = image_column, label_column

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int):
        example = self.dataset[index]
        # timm's transforms draw from Python's, NumPy's and torch's generators: seed all three, then restore them.
        python_state, numpy_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            seed = hash((self.seed, self.epoch, index)) % 2**32
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            image = self.transform(example[self.image_column])
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        return image, example[self.label_column]


def streamed(dataset, transform, cfg: Config):
    """A streamed split, shuffled with a buffer and transformed on the fly."""

    def apply(example):
        return {"image": transform(example[cfg.image_column]), "label": example[cfg.label_column]}

    return dataset.shuffle(seed=cfg.seed, buffer_size=10_000).map(apply).with_format("torch")


def dataset_name(dataset: str) -> str:
    """How the model card names the data: a Hub id as it is, a local path by its folder or file name."""
    if dataset == "digits":
        return "scikit-learn digits"
    return Path(dataset).name if Path(dataset).exists() else dataset


def label_names(dataset, column: str) -> list[str] | None:
    feature = dataset.features[column] if dataset.features else None
    return feature.names if isinstance(feature, ClassLabel) else None


def classes(cfg: Config, train_data) -> tuple[list[str] | None, int]:
    """The class names (None when the labels are plain integers) and the number of classes."""
    names = label_names(train_data, cfg.label_column)
    if names is None and cfg.streaming:
        raise SystemExit(f"The streamed dataset's {cfg.label_column!r} column is not a ClassLabel: no class count.")
    if cfg.streaming:
        return names, len(names)
    labels = sorted(set(train_data[cfg.label_column]))
    if labels[0] < 0:
        raise SystemExit(
            f"The {cfg.label_column!r} column holds negative labels ({labels[0]}): labels are class indices 0..N-1. "
            "Drop or relabel those rows."
        )
    if names is None and labels != list(range(len(labels))):
        shown = ", ".join(map(str, labels[:5])) + (", ..." if len(labels) > 5 else "")
        raise SystemExit(
            f"The {cfg.label_column!r} labels are {len(labels)} integers ({shown}), not 0..{len(labels) - 1}: "
            f"the head would get {labels[-1] + 1} classes. Map them to 0..{len(labels) - 1}, or cast the column "
            "to a datasets ClassLabel."
        )
    return names, len(names) if names else len(labels)


def check_class_folders(root: Path) -> None:
    """An image folder's class folders each hold a file: datasets' imagefolder drops an empty one silently, and the
    class with it. Class folders sit under the root (``root/<class>/``) or under a split (``root/train/<class>/``)."""
    folders = [*root.glob("*"), *root.glob("*/*")]
    empty = sorted(str(d) for d in folders if d.is_dir() and not any(p.is_file() for p in d.rglob("*")))
    if empty:
        raise SystemExit(
            f"Class folder(s) without images: {', '.join(empty)}. Add images, or remove the folder(s) so the class "
            "list is what you mean."
        )


def check_columns(cfg: Config, dataset) -> None:
    """The image and label columns the recipe names exist (a streamed split may not know its columns)."""
    columns = dataset.column_names
    for key in ("image_column", "label_column"):
        if columns is not None and getattr(cfg, key) not in columns:
            raise SystemExit(f"The dataset has no column {getattr(cfg, key)!r}; its columns are {columns}. Set {key}.")


def decoded_images(dataset, column: str):
    """Parquet written without datasets' metadata holds images as {bytes, path} structs: decode them as images."""
    feature = dataset.features.get(column) if dataset.features else None
    if isinstance(feature, dict) and set(feature) == {"bytes", "path"}:
        return dataset.cast_column(column, ImageFeature())
    return dataset


def image_channels(model: torch.nn.Module) -> int:
    """The channels the model's first convolution takes (timm names it in ``pretrained_cfg['first_conv']``)."""
    return model.get_submodule(model.pretrained_cfg["first_conv"]).in_channels


def preprocessing(cfg: Config, model: torch.nn.Module) -> dict:
    """The model's own preprocessing (mean, std, interpolation) at the recipe's size and crop. It becomes part of the
    model's pretrained_cfg, so the exported folder tells users (and transformers' image processor) how its inputs
    were prepared. A one-channel model (``in_chans: 1``) reads greyscale images, normalised by the mean of the
    model's per-channel statistics."""
    channels = image_channels(model)
    overrides = {"input_size": (channels, cfg.img_size, cfg.img_size)} if cfg.img_size else {}
    if cfg.crop_pct is not None:
        overrides["crop_pct"] = cfg.crop_pct
    data_config = resolve_data_config(overrides, model=model)
    if channels == 1:
        data_config.update({key: (statistics.fmean(data_config[key]),) for key in ("mean", "std")})
    elif channels != 3:
        raise SystemExit(f"The model takes {channels}-channel images; train.py reads RGB (3) or greyscale (1) only.")
    pool = tuple(math.ceil(s / model.feature_info[-1]["reduction"]) for s in data_config["input_size"][1:])
    model.pretrained_cfg = dict(model.pretrained_cfg, **data_config, pool_size=pool)
    return data_config


class ConvertImage:
    """PIL image to the mode the model reads (``"RGB"`` or ``"L"``), then a random axis swap with probability ``p``
    (a transpose: with horizontal and vertical flips, it makes every 90° rotation)."""

    def __init__(self, mode: str, transpose: float = 0.0):
        self.mode, self.transpose = mode, transpose

    def __call__(self, image: Image.Image) -> Image.Image:
        image = image.convert(self.mode)
        return image.transpose(Image.Transpose.TRANSPOSE) if random.random() < self.transpose else image


def make_loaders(
    cfg: Config, data_config: dict, train_data, val_data
) -> tuple[torch.utils.data.Dataset, DataLoader, DataLoader]:
    """The training set (its epoch seeds the augmentation) and the training and validation loaders."""
    augment = dict(scale=cfg.scale, hflip=cfg.hflip, vflip=cfg.vflip, auto_augment=cfg.auto_augment, re_prob=cfg.reprob)
    mode = "L" if data_config["input_size"][0] == 1 else "RGB"
    train_tf = Compose(
        [ConvertImage(mode, cfg.transpose), create_transform(**data_config, is_training=True, **augment)]
    )
    eval_tf = Compose([ConvertImage(mode), create_transform(**data_config)])
    if cfg.streaming:
        train_set, val_set = streamed(train_data, train_tf, cfg), streamed(val_data, eval_tf, cfg)
    else:
        train_set = SeededTransform(train_data, train_tf, cfg.image_column, cfg.label_column, cfg.seed)
        val_set = SeededTransform(val_data, eval_tf, cfg.image_column, cfg.label_column, cfg.seed)
    loader_kwargs = dict(batch_size=cfg.batch_size, num_workers=cfg.num_workers)
    # Mixup needs batches of an even size: the last, partial one is dropped.
    train_loader = DataLoader(train_set, shuffle=not cfg.streaming, drop_last=uses_mixup(cfg), **loader_kwargs)
    return train_set, train_loader, DataLoader(val_set, **loader_kwargs)


# ----------------------------------------------------------------------------- model, loss and optimizer


def create_model(cfg: Config, num_classes: int) -> torch.nn.Module:
    kwargs = dict(cfg.model_kwargs, num_classes=num_classes, drop_path_rate=cfg.drop_path)
    if cfg.pretrained is None:
        return timm.create_model(cfg.model, **kwargs)
    if cfg.pretrained.endswith(".safetensors"):
        if not Path(cfg.pretrained).is_file():
            raise SystemExit(f"pretrained: {cfg.pretrained} does not exist.")
        # timm keeps the file's classifier only if its size matches: tell it the size the file holds.
        classifier = timm.get_pretrained_cfg_value(cfg.model, "classifier")
        with safe_open(cfg.pretrained, "pt") as f:
            file_classes = f.get_slice(f"{classifier}.weight").get_shape()[0]
        overlay = {"file": cfg.pretrained, "num_classes": file_classes}
        return timm.create_model(cfg.model, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    # hf-hub: / local-dir: folders carry their own architecture and model_args.
    model = iris_timm.from_pretrained(cfg.pretrained, num_classes=num_classes, drop_path_rate=cfg.drop_path)
    if model.pretrained_cfg["architecture"] != cfg.model or cfg.model_kwargs:
        print(
            f"Note: {cfg.pretrained} brings its own architecture ({model.pretrained_cfg['architecture']}) and "
            f"model arguments; the recipe's model ({cfg.model}, {cfg.model_kwargs}) is not used."
        )
    return model


def freeze_backbone(model: torch.nn.Module) -> None:
    classifier = model.pretrained_cfg["classifier"]
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith(classifier + ".")


def model_and_optimizer(cfg: Config, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model set up for training as the recipe says, and its optimizer, with weight decay and layer decay from
    the model's no_weight_decay and group_matcher."""
    if cfg.freeze_backbone:
        freeze_backbone(model)
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = create_optimizer_v2(
        model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum, layer_decay=cfg.layer_decay
    )
    return model, optimizer


def make_criterion(cfg: Config, num_classes: int) -> tuple[torch.nn.Module, Mixup | None]:
    """The loss, and the Mixup/CutMix that makes its soft targets when the recipe asks for it."""
    if uses_mixup(cfg):  # the label smoothing is folded into the soft targets
        mixup = Mixup(
            mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.smoothing, num_classes=num_classes
        )
        return SoftTargetCrossEntropy(), mixup
    if cfg.smoothing > 0:
        return LabelSmoothingCrossEntropy(cfg.smoothing), None
    return torch.nn.CrossEntropyLoss(), None


def make_scheduler(cfg: Config, optimizer: torch.optim.Optimizer, total_steps: int) -> Scheduler:
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=cfg.sched,
        num_epochs=total_steps,
        warmup_epochs=min(cfg.warmup_steps, total_steps // 2),
        min_lr=cfg.min_lr,
        warmup_lr=cfg.lr / 100,
        step_on_epochs=False,
        updates_per_epoch=1,  # the schedule is counted in optimizer updates
    )
    return scheduler


def unwrap(accelerator: Accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """The plain model under the DDP and torch.compile wrappers."""
    return accelerator.unwrap_model(model, keep_torch_compile=False)


# ----------------------------------------------------------------------------- checkpoints and resume


def checkpoint_dirs(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first. Incomplete ones live under a '.tmp-' name and are ignored."""
    return sorted((output_dir / CHECKPOINTS).glob("step_*"))


def resume(cfg: Config, accelerator: Accelerator, ema: ModelEmaV3 | None, recipe_steps: int) -> TrainerState:
    """Step 0, or the checkpoint `cfg.resume` names: the weights, optimizer, EMA and random generators from
    Accelerate's state, the position in training from trainer_state.json."""
    checkpoint = Path(cfg.resume) if cfg.resume not in (None, "auto") else None
    if cfg.resume == "auto" and checkpoint_dirs(Path(cfg.output_dir)):
        checkpoint = checkpoint_dirs(Path(cfg.output_dir))[-1]
    if checkpoint is None:  # nothing to resume from: the run starts again, and so do its records
        if cfg.resume is not None and accelerator.is_main_process:
            truncate_metrics(Path(cfg.output_dir), -1)
        return TrainerState(total_steps=recipe_steps, recipe_steps=recipe_steps)
    missing = [name for name in (WEIGHTS_FILE, TRAINER_STATE) if not (checkpoint / name).is_file()]
    if missing:
        raise SystemExit(
            f"Checkpoint {checkpoint} is incomplete: {', '.join(missing)} missing. Resume from another checkpoint "
            f"(--resume {checkpoint.parent}/step_...), or start afresh with --overwrite."
        )
    accelerator.load_state(str(checkpoint))
    if ema is not None:
        ema.module.load_state_dict(load_file(str(checkpoint / EMA_WEIGHTS)))
    state = TrainerState.load(checkpoint)
    if accelerator.is_main_process:
        truncate_metrics(Path(cfg.output_dir), state.step)
    state.recipe_steps = recipe_steps
    if not state.budget_fitted:  # the recipe's length, which the command line may have changed
        state.total_steps = recipe_steps
    accelerator.print(f"Resumed from {checkpoint} at step {state.step}.")
    return state


# ----------------------------------------------------------------------------- the training clock

PACE_STEPS = (10, 40)  # a time budget's step count comes from the pace from the first of these steps, after the
# warm-up: fitted at the second, then again after every step with the pace measured so far


def main_process_value(accelerator: Accelerator, value: float) -> float:
    """The main process's `value` on every process (a no-op for one process)."""
    if accelerator.num_processes == 1:
        return value
    return broadcast_object_list([value])[0]


def fit_to_budget(budget_s: float, state: TrainerState, pace_s: float) -> int:
    """The step count that ends training about `budget_s` seconds in, going on at `pace_s` seconds per step.

    Fixing the count, rather than stopping when the clock runs out, lets the learning-rate schedule end where the
    budget does, and keeps a resumed run on the same schedule. It never exceeds the recipe's count."""
    remaining = max(budget_s - state.train_time_s, 0.0)
    return min(state.recipe_steps or state.total_steps, state.step + int(remaining / pace_s))


class TrainingClock:
    """Counts seconds of training into `state.train_time_s`: the time from one step to the next, less what runs
    while the clock is `paused()` (evaluations and checkpoints). With a time budget or timed evaluations every
    process counts the main process's seconds, so all of them stop and evaluate at the same step."""

    def __init__(self, accelerator: Accelerator, state: TrainerState, cfg: Config):
        self.accelerator, self.state = accelerator, state
        self.budget_s, self.eval_every_s = cfg.time_budget_s, cfg.eval_every_s
        self.started = self.mark = time.perf_counter()

    def tick(self) -> float | None:
        """Count the step just made. With a time budget, measure the pace from PACE_STEPS[0] and, from
        PACE_STEPS[1] on, fit `state.total_steps` to what the budget holds at that pace after every step, so a run
        whose pace drifts (two runs sharing a machine) still ends within a step of its budget: returns the pace
        (seconds a step) when the count changed, else None."""
        state, now = self.state, time.perf_counter()
        state.train_time_s += now - self.mark
        self.mark = now
        if self.budget_s or self.eval_every_s:
            state.train_time_s = main_process_value(self.accelerator, state.train_time_s)
        if not self.budget_s:
            return None
        if state.step == PACE_STEPS[0]:
            state.pace_from_s = state.train_time_s
        if state.step < PACE_STEPS[1] or state.pace_from_s is None:
            return None
        pace = (state.train_time_s - state.pace_from_s) / (state.step - PACE_STEPS[0])
        total_steps = fit_to_budget(self.budget_s, state, pace)
        if state.budget_fitted and total_steps == state.total_steps:
            return None
        state.total_steps, state.budget_fitted = total_steps, True
        return pace

    def evaluation_due(self) -> bool:
        """Whether the clock has passed a multiple of eval_every_s since the last evaluation."""
        every, state = self.eval_every_s, self.state
        return bool(every) and state.train_time_s // every > state.last_eval_s // every

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in the block is not training time."""
        try:
            yield
        finally:
            self.mark = time.perf_counter()

    def wall_time_s(self) -> float:
        return time.perf_counter() - self.started


# ----------------------------------------------------------------------------- training


@dataclass
class Training:
    """A run's prepared objects and where it stands: what the functions that train, evaluate, checkpoint and
    export share."""

    cfg: Config
    accelerator: Accelerator
    model: torch.nn.Module  # as Accelerate prepared it (DDP, torch.compile)
    optimizer: torch.optim.Optimizer
    ema: ModelEmaV3 | None
    criterion: torch.nn.Module
    mixup: Mixup | None
    train_set: torch.utils.data.Dataset
    train_loader: DataLoader
    val_loader: DataLoader
    label_names: list[str] | None
    state: TrainerState
    bad_in_a_row: int = 0  # updates skipped for a non-finite loss, in a row
    bad_in_window: bool = False  # a non-finite loss in the current gradient-accumulation window

    def __post_init__(self) -> None:
        self.output_dir = Path(self.cfg.output_dir)
        self.clock = TrainingClock(self.accelerator, self.state, self.cfg)
        self.progress = tqdm(
            total=self.state.total_steps, initial=self.state.step, disable=not self.accelerator.is_local_main_process
        )
        self.reschedule()

    def reschedule(self) -> None:
        """A learning-rate schedule over state.total_steps, at the current step."""
        self.scheduler = make_scheduler(self.cfg, self.optimizer, self.state.total_steps)
        self.scheduler.step_update(num_updates=self.state.step)  # creating it set the warm-up LR
        self.progress.total = self.state.total_steps

    def plain_model(self) -> torch.nn.Module:
        return unwrap(self.accelerator, self.model)


def train(run: Training) -> None:
    """The training loop: batches until the last step; an optimizer update at the end of each gradient-accumulation
    window, then the update's bookkeeping, logs, checkpoints and evaluations when due; an evaluation and a checkpoint
    after each epoch and after the last step."""
    cfg, accelerator, state = run.cfg, run.accelerator, run.state
    run.model.train()
    while state.step < state.total_steps:
        run.train_loader.set_epoch(state.epoch)  # seeds this epoch's shuffle
        run.train_set.set_epoch(state.epoch)  # and its augmentation
        for images, targets in accelerator.skip_first_batches(run.train_loader, state.batch_in_epoch):
            if state.step >= state.total_steps:
                break
            state.batch_in_epoch += 1
            # Mixup, drop path and dropout draw from generators seeded by the position in the data, so a resumed run
            # draws exactly what an uninterrupted one would (and each process draws differently).
            set_seed(hash((cfg.seed, state.epoch, state.batch_in_epoch)) % 2**32, device_specific=True)
            if run.mixup is not None:
                images, targets = run.mixup(images, targets)
            if cfg.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with accelerator.accumulate(run.model):
                loss = run.criterion(run.model(images), targets)
                # Backward runs even on a non-finite loss, so every process joins the gradient all-reduce; the
                # window's update is then skipped (optimizer_step), its gradients dropped.
                accelerator.backward(loss)
                run.bad_in_window |= not loss.detach().isfinite().item()
                if not accelerator.sync_gradients:
                    continue  # within the window: accumulate
                updated = optimizer_step(run)
            if run.ema is not None and updated:
                run.ema.update(run.plain_model(), step=state.step)
            state.step += 1
            state.images_seen += len(images) * accelerator.num_processes * cfg.grad_accum_steps
            pace = run.clock.tick()
            if pace is not None:  # the pace so far fits the step count to the time budget
                run.reschedule()
                if state.step == PACE_STEPS[1] or run.clock.evaluation_due():
                    accelerator.print(f"{pace:.3f} s per step: {state.total_steps} steps fit the time budget.")
            run.scheduler.step_update(num_updates=state.step)
            run.progress.update(1)
            if state.step % cfg.log_every == 0:
                run.progress.set_postfix(loss=f"{loss.item():.3f}")
                log(run, TrainingLog(state.step, state.epoch, loss.item(), run.optimizer.param_groups[0]["lr"]))
            if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
                save_checkpoint(run)
            if run.clock.evaluation_due() and state.step < state.total_steps:  # the last step's comes below
                evaluate_and_checkpoint(run)
        else:  # the epoch ran out, not the steps
            state.epoch += 1
            state.batch_in_epoch = 0
        evaluate_and_checkpoint(run)
    run.progress.close()


def optimizer_step(run: Training) -> bool:
    """The update that ends a gradient-accumulation window, skipped after a non-finite loss in it on any process (one
    collective per window: every process must agree); stops the run after ``max_bad_steps`` skipped in a row. Returns
    whether the weights were updated."""
    cfg, state, accelerator = run.cfg, run.state, run.accelerator
    bad = torch.tensor([run.bad_in_window], device=accelerator.device)
    updated = not accelerator.gather(bad).any().item()
    if updated:
        run.bad_in_a_row = 0
        if cfg.clip_grad:
            accelerator.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
        run.optimizer.step()
    else:
        state.bad_steps += 1
        run.bad_in_a_row += 1
    run.optimizer.zero_grad(set_to_none=True)
    run.bad_in_window = False
    if run.bad_in_a_row >= cfg.max_bad_steps:
        last = checkpoint_dirs(run.output_dir)[-1:] or ["none written yet"]
        raise SystemExit(
            f"{run.bad_in_a_row} non-finite losses in a row at step {state.step}; stopping. "
            f"Last good checkpoint: {last[0]}. Lower lr, keep clip_grad on, or use bf16 instead of fp16."
        )
    return updated


def log(run: Training, record: TrainingLog | Evaluation) -> None:
    run.accelerator.log(record.metrics(), step=record.step)
    if run.accelerator.is_main_process:
        append_metrics(run.output_dir, record)


def save_checkpoint(run: Training) -> None:
    """Write the Accelerate state into a temporary folder, then rename it: a crash never leaves a half-written
    checkpoint under a name `--resume auto` would pick. Off the training clock."""
    refuse_non_finite_weights(run)
    accelerator = run.accelerator
    final = run.output_dir / CHECKPOINTS / f"step_{run.state.step:08d}"
    tmp = final.with_name(".tmp-" + final.name)
    with run.clock.paused():
        if accelerator.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        if run.ema is not None and accelerator.is_main_process:
            save_file(run.ema.module.state_dict(), str(tmp / EMA_WEIGHTS))
        accelerator.wait_for_everyone()  # every process has written its part before the folder is renamed
        if accelerator.is_main_process:
            commit_checkpoint(run, tmp, final)
        accelerator.wait_for_everyone()


def refuse_non_finite_weights(run: Training) -> None:
    """Stop before writing weights that hold NaN or infinity (the weights, or the EMA's, diverged); every process
    holds the same weights, so all stop together."""
    models = [run.plain_model()] + ([run.ema.module] if run.ema is not None else [])
    bad = [name for model in models for name, tensor in model.state_dict().items() if not tensor.isfinite().all()]
    if bad:
        last = checkpoint_dirs(run.output_dir)[-1:] or ["none written yet"]
        raise SystemExit(
            f"The weights hold NaN or infinity at step {run.state.step} ({len(bad)} tensors, e.g. {bad[0]}): "
            f"nothing is written. Last good checkpoint: {last[0]}. Lower lr or keep clip_grad on."
        )


def commit_checkpoint(run: Training, tmp: Path, final: Path) -> None:
    """Add the trainer state, rename the folder into place and drop the oldest checkpoints beyond the kept number.
    (Accelerate's own total_limit applies to its automatic checkpoint names only, which it writes in place.)"""
    run.state.save(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run.output_dir)[: -run.cfg.keep_checkpoints]:
        shutil.rmtree(old)


# ----------------------------------------------------------------------------- evaluation and export


def evaluate(model, loader, accelerator: Accelerator, topk: tuple[int, ...]) -> dict[str, float]:
    """Top-k accuracy (%) over the whole split, gathered from every process without duplicates."""
    model.eval()
    correct, count = torch.zeros(len(topk)), 0
    with torch.no_grad():
        for images, targets in loader:
            predictions = model(images).topk(max(topk), dim=-1).indices  # (B, max k)
            predictions, targets = accelerator.gather_for_metrics((predictions, targets))
            hits = predictions == targets[:, None]
            correct += torch.stack([hits[:, :k].any(dim=1).sum() for k in topk]).cpu()
            count += len(targets)
    model.train()
    return {f"top{k}": 100 * c.item() / max(count, 1) for k, c in zip(topk, correct, strict=True)}


def evaluate_and_checkpoint(run: Training) -> None:
    """Evaluate (unless the clock just did, at this step), export the best weights so far, log, and checkpoint.
    Off the training clock."""
    state = run.state
    with run.clock.paused():
        if state.last_eval_step != state.step:
            record_evaluation(run)
        save_checkpoint(run)


def record_evaluation(run: Training) -> None:
    state, topk = run.state, (1, 5) if run.plain_model().num_classes >= 5 else (1,)
    state.last_eval_step, state.last_eval_s = state.step, state.train_time_s
    accuracy = evaluate(run.model, run.val_loader, run.accelerator, topk)
    if run.ema is not None:
        ema_accuracy = evaluate(run.ema.module, run.val_loader, run.accelerator, topk)
        accuracy.update({f"ema_{k}": v for k, v in ema_accuracy.items()})
    state.top1 = accuracy["ema_top1" if run.ema is not None else "top1"]
    if state.best_top1 is None or state.top1 > state.best_top1:
        state.best_top1, state.best_epoch = state.top1, state.epoch
        export(run, run.output_dir / "best")
    log(run, Evaluation(state.step, state.epoch, accuracy, round(state.train_time_s, 2)))
    run.accelerator.print(
        f"epoch {state.epoch} step {state.step} ({state.train_time_s:.0f} s of training): "
        + ", ".join(f"{k} {v:.2f}" for k, v in accuracy.items())
    )


def command_line() -> str:
    return "python " + shlex.join(sys.argv)


def export(run: Training, directory: Path) -> None:
    """A Hub-ready folder of the current weights (the EMA's when on); an iris model's card records this run (other
    timm models get no card)."""
    refuse_non_finite_weights(run)
    model = run.ema.module if run.ema is not None else run.plain_model()
    if not run.accelerator.is_main_process:
        return
    dataset, top1 = dataset_name(run.cfg.dataset), round(run.state.top1, 2)
    results = {"dataset": dataset, "top1": top1, "epochs": run.state.epoch, "command": command_line()}
    iris_timm.save_pretrained(model, directory, label_names=run.label_names, training_results=results)


def summarize(run: Training, updates_per_epoch: int | None) -> Summary:
    state = run.state
    return Summary(
        top1=state.top1,
        best_top1=state.best_top1,
        best_epoch=state.best_epoch,
        steps=state.step,
        epochs=state.step / updates_per_epoch if updates_per_epoch else None,
        skipped_steps=state.bad_steps,
        params=sum(p.numel() for p in run.plain_model().parameters()),
        train_images_per_s=state.images_seen / max(state.train_time_s, 1e-9),
        train_time_s=state.train_time_s,
        wall_time_s=run.clock.wall_time_s(),
        threads=torch.get_num_threads(),
        command=command_line(),
        processes=run.accelerator.num_processes,
    )


# ----------------------------------------------------------------------------- the run


def setup(cfg: Config) -> Accelerator:
    """The Accelerator (devices, processes, mixed precision, trackers), with every generator seeded, and the run
    folder with the run's configuration."""
    log_with = cfg.log_with
    if log_with == "auto":
        log_with = "tensorboard" if is_tensorboard_available() else None
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision,
        gradient_accumulation_steps=cfg.grad_accum_steps,
        log_with=log_with,
        project_dir=cfg.output_dir,
        dynamo_backend="inductor" if cfg.compile else "no",
        # Shuffle order from (seed, epoch) alone, so a resumed run sees the batches an uninterrupted one would.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and accelerator.num_processes == 1:
        # Without a GPU, `--multi_gpu` and torchrun start processes that each train alone on the same folder.
        raise SystemExit(
            f"This process was launched as one of {os.environ['WORLD_SIZE']} (WORLD_SIZE), but Accelerate runs it "
            "alone: each process would train the whole run into the same folder. On CPUs launch with: "
            "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N train.py ..."
        )
    set_seed(cfg.seed)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    return accelerator


WEIGHTS_FILE = "model.safetensors"  # the weights Accelerate's save_state writes in a checkpoint
RUN_FILES = ("train_config.yaml", "metrics.jsonl", "summary.json", CHECKPOINTS, "model.safetensors", "best")
LOCK_NAME = ".lock"


def open_run_folder(cfg: Config, accelerator: Accelerator):
    """Take the run folder for this run, once the config, model and data are known to be good: an exclusive lock
    for the run's life (the OS drops it when the process dies), then the folder is checked to hold no other run
    (unless resuming, or `--overwrite` clears it), and the configuration and trackers are written. Returns the
    locked file, to keep open."""
    folder, lock = Path(cfg.output_dir), None
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        lock = lock_folder(folder)
        existing = sorted(name for name in RUN_FILES if (folder / name).exists())
        if existing and cfg.overwrite:
            for path in folder.iterdir():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.name != LOCK_NAME:
                    path.unlink()
        elif existing and cfg.resume is None:
            raise SystemExit(
                f"{folder} already holds a run ({', '.join(existing)}). Continue it with --resume, replace it with "
                "--overwrite, or choose another --output-dir."
            )
        elif cfg.resume is not None and (folder / "train_config.yaml").is_file():
            check_same_recipe(cfg, read_train_config(folder), folder)
        write_train_config(folder, dataclasses.asdict(cfg))
    accelerator.wait_for_everyone()
    if accelerator.log_with:
        accelerator.init_trackers("train", config={k: str(v) for k, v in dataclasses.asdict(cfg).items()})
    return lock


# Keys a resumed run may change: they say how long to train, how to log, evaluate and checkpoint, or where the run
# is, and not what one training step computes. (Lengthening a run re-plans its LR schedule from the step reached.)
RESUMABLE_CHANGES = {
    "resume",
    "overwrite",
    "output_dir",
    "max_steps",
    "epochs",
    "log_every",
    "log_with",
    "eval_every_s",
    "checkpoint_every",
    "keep_checkpoints",
    "max_bad_steps",
    "num_workers",
}


def check_same_recipe(cfg: Config, saved: dict, folder: Path) -> None:
    """A resumed run continues the saved recipe: refuse every other change, naming each key."""
    current = yaml.safe_load(yaml.safe_dump(dataclasses.asdict(cfg)))  # tuples as the saved file holds them
    changed = [k for k in current if k not in RESUMABLE_CHANGES and k in saved and current[k] != saved[k]]
    if changed:
        differences = "; ".join(f"{k}: saved {saved[k]!r}, now {current[k]!r}" for k in changed)
        raise SystemExit(
            f"--resume continues the run in {folder}, but the recipe differs: {differences}. Resume with the saved "
            f"recipe ({folder / 'train_config.yaml'}), or start a new run with --overwrite or another "
            "--output-dir."
        )


def lock_folder(folder: Path):
    """An exclusive, non-blocking OS lock on `folder`/.lock holding this process's PID; refuses a folder another
    run holds, naming its PID."""
    lock = open(folder / LOCK_NAME, "a+")  # held open for the run's life: closing it would release the lock
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise SystemExit(
            f"{folder} is in use by another run (PID {holder}): one run per folder. Wait for it, stop it, or "
            "choose another --output-dir."
        ) from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def main(cfg: Config) -> Summary:
    """Train, evaluate, checkpoint and export as `cfg` says; returns what summary.json records."""
    validate(cfg)
    accelerator = setup(cfg)

    # Data, and a model for its classes that prepares its inputs as the recipe says.
    train_data, val_data = load_splits(cfg)
    names, num_classes = classes(cfg, train_data)
    model = create_model(cfg, num_classes)
    train_set, train_loader, val_loader = make_loaders(cfg, preprocessing(cfg, model), train_data, val_data)
    run_folder_lock = open_run_folder(cfg, accelerator)  # noqa: F841 - held until the process ends

    # Optimizer and loss; Accelerate places the model and shards the data over the processes.
    model, optimizer = model_and_optimizer(cfg, model)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    ema = ModelEmaV3(unwrap(accelerator, model), decay=cfg.ema_decay) if cfg.ema_decay else None
    criterion, mixup = make_criterion(cfg, num_classes)

    # Training from step 0, or from the checkpoint it resumes.
    updates_per_epoch = None if cfg.streaming else math.ceil(len(train_loader) / cfg.grad_accum_steps)
    state = resume(cfg, accelerator, ema, recipe_steps=cfg.max_steps or cfg.epochs * updates_per_epoch)
    run = Training(
        cfg, accelerator, model, optimizer, ema, criterion, mixup, train_set, train_loader, val_loader, names, state
    )
    train(run)

    # The last weights and the run's summary.
    export(run, run.output_dir)
    summary = summarize(run, updates_per_epoch)
    if accelerator.is_main_process:
        write_summary(run.output_dir, summary)
        accelerator.print("summary: " + json.dumps(dataclasses.asdict(summary)))
    accelerator.end_training()
    return summary


if __name__ == "__main__":
    main(parse_config())
