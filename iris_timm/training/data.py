"""Datasets for train.py: the splits of a recipe's dataset, checked, and the loaders that feed them to a model.

A dataset is scikit-learn's digits (``"digits"``, no download), a Parquet file or folder (one file per split), an
image folder (``root/<class>/*`` or ``root/<split>/<class>/*``) or a Hub dataset. A recipe's dataset that is not a
local path is read from a local copy where the folder ``$IRIS_TIMM_DATA`` holds one (:func:`local_copy`). Two loaders
read it:

- ``"pil"``: timm's per-image transforms (RandAugment, random erasing, any image size), seeded per sample;
- ``"memory"``: the split decoded once into a uint8 tensor (cached), augmented a whole batch at a time on the training
  device by :class:`iris_timm.training.memory_data.BatchAugment`, the small-image path.

Both draw each sample's augmentation from ``(seed, epoch, index)`` alone, so a resumed run, another process or
another worker augments sample ``i`` of epoch ``e`` the same way. ``cfg`` below is a run's
:class:`~iris_timm.training.config.Config`.
"""

import dataclasses
import math
import os
import random
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import PIL
import torch
from datasets import ClassLabel, Dataset, DatasetDict, load_dataset
from datasets import Image as ImageFeature
from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder
from PIL import Image
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader
from torchvision.transforms import Compose

from .errors import TrainingError
from .memory_data import BatchAugment, ImageTensorDataset, UnreadableImage, decode_images

if TYPE_CHECKING:  # config.py reads this module's LOADERS and dataset_kind
    from .config import Config

__all__ = [
    "LOADERS",
    "LOCAL_DATA",
    "Batches",
    "UnreadableImage",
    "classes",
    "dataset_kind",
    "load_splits",
    "local_copy",
    "make_loaders",
    "preprocessing",
]

LOADERS = ("auto", "memory", "pil")
MEMORY_LIMIT_BYTES = 4 * 2**30  # "auto" decodes a split into memory when its uint8 tensor is at most this large
LOCAL_DATA = "IRIS_TIMM_DATA"  # the environment variable naming a folder of local copies of the recipes' datasets
KINDS = (
    "a Parquet file or folder (one .parquet file per split), an image folder (one subfolder of images per class), "
    "a Hub dataset id or digits"
)
VAL_SPLITS = ("validation", "val", "valid")  # a test split is never chosen to pick the best weights
IMAGE_EXTENSIONS = {extension.lower() for extension in ImageFolder.EXTENSIONS}  # what datasets' imagefolder reads
HOLD_OUT_SEED = 0  # the validation rows held out of a training split are the same whatever the run's seed


# ----------------------------------------------------------------------------- splits


def digits_dataset() -> DatasetDict:
    """scikit-learn's 1,797 handwritten digits (8x8 grey), shipped inside the package: no download."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray((d * (255 / 16)).astype(np.uint8)) for d in digits.images]
    ds = Dataset.from_dict({"image": images, "label": digits.target.tolist()})
    ds = ds.cast_column("label", ClassLabel(names=[str(i) for i in range(10)]))
    split = ds.train_test_split(test_size=0.1, seed=0, stratify_by_column="label")
    return DatasetDict(train=split["train"], validation=split["test"])


def local_copy(cfg: "Config"):
    """``cfg``, its dataset read from a local copy where there is one: a dataset that is no local path (a Hub id, or a
    recipe's data folder that is missing) is read from ``$IRIS_TIMM_DATA/<its last part>`` when that folder exists
    (``uoft-cs/cifar10``: ``$IRIS_TIMM_DATA/cifar10``). The run then records the copy it read."""
    root = os.environ.get(LOCAL_DATA)
    if not root or cfg.dataset == "digits" or Path(cfg.dataset).exists():
        return cfg
    copy = Path(root) / Path(cfg.dataset).name
    if not copy.exists():
        return cfg
    print(f"dataset: {cfg.dataset} read from its local copy {copy} ({LOCAL_DATA}).")
    return dataclasses.replace(cfg, dataset=str(copy))


def dataset_kind(cfg: "Config") -> str:
    """How ``cfg.dataset`` is read: ``"digits"``, ``"parquet"`` (a file, or a folder of one file per split),
    ``"images"`` (an image folder) or ``"hub"``. A local path that is missing, or holds nothing train.py reads, is
    refused, saying what train.py reads, or where the data come from when the recipe says (``data_source``)."""
    source = Path(cfg.dataset)
    if cfg.dataset == "digits":
        return "digits"
    if source.is_file():
        if source.suffix == ".parquet":
            return "parquet"
        kind = f"a {source.suffix} file" if source.suffix else "a file"
        raise TrainingError(f"dataset: {source} is {kind}, which train.py does not read. It reads {KINDS}.")
    if source.is_dir():
        if any(source.glob("*.parquet")):
            return "parquet"
        if any(p.suffix.lower() in IMAGE_EXTENSIONS for p in source.rglob("*")):
            return "images"
        empty = not any(p.is_file() for p in source.rglob("*"))
        kind = "an empty folder" if empty else "a folder without Parquet files or images"
        raise TrainingError(f"dataset: {source} is {kind}. train.py reads {KINDS}.")
    if cfg.dataset.startswith((".", "/", "~")) or source.suffix or cfg.dataset.count("/") != 1:  # no Hub id
        advice = cfg.data_source or "Give a Parquet file or folder, an image folder or a Hub id."
        raise TrainingError(f"dataset: {cfg.dataset} does not exist. {advice}")
    return "hub"


def _from_hub(cfg: "Config") -> DatasetDict:
    """A Hub dataset; the user is told first that no local path has this name (a mistyped relative path looks like
    a Hub id ``ORG/NAME``)."""
    print(f"dataset: no local file or folder {cfg.dataset}; loading the Hub dataset {cfg.dataset!r}.")
    try:
        return load_dataset(cfg.dataset, cfg.dataset_config, streaming=cfg.streaming)
    except Exception as error:  # datasets raises many types; all mean the same to the user
        advice = cfg.data_source or "Check the path (relative to where you run train.py) or the Hub id."
        raise TrainingError(
            f"dataset: {cfg.dataset} is no local file or folder, and the Hub did not provide it "
            f"({' '.join(str(error).split())}). {advice}"
        ) from None


def _image_folder(cfg: "Config", root: Path) -> DatasetDict:
    """An image folder, its classes named by its subfolders."""
    check_class_folders(root)
    splits = load_dataset("imagefolder", data_dir=str(root))
    columns = next(iter(splits.values())).column_names
    if cfg.label_column not in columns and "label" not in columns:  # datasets found no class subfolders
        raise TrainingError(
            f"dataset: {root} holds images but no class subfolders. An image folder needs one subfolder per class: "
            f"{root}/<class>/*.png, or {root}/train/<class>/*.png and {root}/validation/<class>/*.png."
        )
    return splits


def load_splits(cfg: "Config") -> tuple[Any, Any]:
    """The (train, validation) splits of the embedded digits, a local path or the Hub, their columns checked. The
    validation split is ``val_split``, else the dataset's own (:data:`VAL_SPLITS`), else held out of the training
    split (:func:`hold_out`)."""
    kind, source = dataset_kind(cfg), Path(cfg.dataset)
    if kind == "digits":
        splits = digits_dataset()
    elif kind == "parquet" and source.is_file():
        splits = load_dataset("parquet", data_files={cfg.train_split: str(source)})
    elif kind == "parquet":  # one file per split, named by its stem
        splits = load_dataset("parquet", data_files={p.stem: str(p) for p in sorted(source.glob("*.parquet"))})
    elif kind == "images":
        splits = _image_folder(cfg, source)
    else:
        splits = _from_hub(cfg)

    if cfg.train_split not in splits:
        raise TrainingError(f"dataset has no split {cfg.train_split!r}; it has {list(splits)}. Set train_split.")
    splits = {name: recipe_image_column(cfg, split) for name, split in splits.items()}
    for split in splits.values():
        check_columns(cfg, split)
    if not cfg.streaming:
        splits = {name: decoded_images(split, cfg.image_column) for name, split in splits.items()}
    val_name = cfg.val_split or next((s for s in VAL_SPLITS if s in splits), None)
    if val_name is None and not cfg.streaming:
        return hold_out(cfg, splits[cfg.train_split])
    if val_name not in splits:
        raise TrainingError(f"dataset has no split {val_name!r}; it has {list(splits)}. Set val_split.")
    return splits[cfg.train_split], splits[val_name]


def hold_out(cfg: "Config", train) -> tuple[Any, Any]:
    """``val_fraction`` of the training split held out for validation: the same rows for every seed, and each class
    its share where the labels are a ClassLabel with two images or more a class (CIFAR-10's 50,000 training images:
    45,000 and 5,000, 500 of each class)."""
    if math.ceil(len(train) * cfg.val_fraction) >= len(train):  # as datasets' train_test_split counts
        raise TrainingError(
            f"The dataset has {len(train)} image(s) and no validation split: too few to hold out val_fraction "
            f"{cfg.val_fraction}. Add images, or give a validation split (val_split)."
        )
    by_class = cfg.label_column if isinstance(train.features.get(cfg.label_column), ClassLabel) else None
    try:
        held_out = train.train_test_split(test_size=cfg.val_fraction, seed=HOLD_OUT_SEED, stratify_by_column=by_class)
    except ValueError:  # a class too small to share out between the two
        held_out = train.train_test_split(test_size=cfg.val_fraction, seed=HOLD_OUT_SEED)
    return held_out["train"], held_out["test"]


def check_class_folders(root: Path) -> None:
    """Every class folder holds a file: datasets' imagefolder drops an empty one silently, and the class with it.
    Class folders sit under the root (``root/<class>/``) or under a split (``root/train/<class>/``)."""
    folders = [*root.glob("*"), *root.glob("*/*")]
    empty = sorted(str(d) for d in folders if d.is_dir() and not any(p.is_file() for p in d.rglob("*")))
    if empty:
        raise TrainingError(
            f"Class folder(s) without images: {', '.join(empty)}. Add images, or remove the folder(s) so the class "
            "list is what you mean."
        )


def recipe_image_column(cfg: "Config", dataset):
    """The dataset with its images under the recipe's ``image_column``: a dataset in train.py's own layout (an
    ``image`` column, as the local copies have) is read whatever the recipe names, so a recipe written for a Hub
    dataset's column (CIFAR-10's ``img``) reads a local copy as well."""
    columns = dataset.column_names
    if columns is not None and cfg.image_column not in columns and "image" in columns:
        return dataset.rename_column("image", cfg.image_column)
    return dataset


def check_columns(cfg: "Config", dataset) -> None:
    """The image and label columns the recipe names exist (a streamed split may not know its columns)."""
    columns = dataset.column_names
    for key in ("image_column", "label_column"):
        if columns is not None and getattr(cfg, key) not in columns:
            raise TrainingError(
                f"The dataset has no column {getattr(cfg, key)!r}; its columns are {columns}. Set {key}."
            )


def decoded_images(dataset, column: str):
    """Parquet written without datasets' metadata holds images as {bytes, path} structs: decode them as images."""
    feature = dataset.features.get(column) if dataset.features else None
    if isinstance(feature, dict) and set(feature) == {"bytes", "path"}:
        return dataset.cast_column(column, ImageFeature())
    return dataset


def classes(cfg: "Config", train_data) -> tuple[list[str] | None, int]:
    """The class names (None when the labels are plain integers) and the number of classes."""
    feature = train_data.features[cfg.label_column] if train_data.features else None
    names = feature.names if isinstance(feature, ClassLabel) else None
    if cfg.streaming:
        if names is None:
            raise TrainingError(
                f"The streamed dataset's {cfg.label_column!r} column is not a ClassLabel: no class count."
            )
        return names, len(names)
    labels = sorted(set(train_data[cfg.label_column]))
    if labels[0] < 0:
        raise TrainingError(
            f"The {cfg.label_column!r} column holds negative labels ({labels[0]}): labels are class indices 0..N-1. "
            "Drop or relabel those rows."
        )
    if names is None and labels != list(range(len(labels))):
        shown = ", ".join(map(str, labels[:5])) + (", ..." if len(labels) > 5 else "")
        raise TrainingError(
            f"The {cfg.label_column!r} labels are {len(labels)} integers ({shown}), not 0..{len(labels) - 1}: "
            f"the head would get {labels[-1] + 1} classes. Map them to 0..{len(labels) - 1}, or cast the column "
            "to a datasets ClassLabel."
        )
    return names, len(names) if names else len(labels)


# ----------------------------------------------------------------------------- preprocessing


def preprocessing(cfg: "Config", model: torch.nn.Module) -> dict:
    """The model's own preprocessing (mean, std, interpolation) at the recipe's size and crop. It becomes part of the
    model's pretrained_cfg, so the exported folder tells users (and transformers' image processor) how its inputs
    were prepared. A one-channel model (``in_chans: 1``) reads greyscale images, normalised by the mean of the
    model's per-channel statistics."""
    channels = model.get_submodule(model.pretrained_cfg["first_conv"]).in_channels
    overrides = {"input_size": (channels, cfg.img_size, cfg.img_size)} if cfg.img_size else {}
    if cfg.crop_pct is not None:
        overrides["crop_pct"] = cfg.crop_pct
    data_config = resolve_data_config(overrides, model=model)
    if channels == 1:
        data_config.update({key: (statistics.fmean(data_config[key]),) for key in ("mean", "std")})
    elif channels != 3:
        raise TrainingError(f"The model takes {channels}-channel images; train.py reads RGB (3) or greyscale (1) only.")
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


class SeededTransform(torch.utils.data.Dataset):
    """Applies the transform with randomness seeded by (seed, epoch, index), so sample i of epoch e is
    augmented the same way whichever process, worker or resumed run loads it. An image that cannot be decoded
    raises :class:`UnreadableImage` naming its row and file."""

    def __init__(self, dataset: Dataset, transform, image_column: str, label_column: str, seed: int):
        self.dataset, self.transform, self.seed, self.epoch = dataset, transform, seed, 0
        self.image_column, self.label_column = image_column, label_column

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int):
        # timm's transforms draw from Python's, NumPy's and torch's generators: seed all three, then restore them.
        python_state, numpy_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            seed = hash((self.seed, self.epoch, index)) % 2**32
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            try:
                example = self.dataset[index]
                image = self.transform(example[self.image_column])
            except (OSError, PIL.UnidentifiedImageError) as error:
                raise UnreadableImage(unreadable_message(self.dataset, self.image_column, index, error)) from None
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        return image, example[self.label_column]


def unreadable_message(dataset: Dataset, column: str, index: int, error: Exception) -> str:
    """What to say of row ``index``, whose image does not decode: the row, its file when it has one, the cause."""
    raw = dataset.cast_column(column, ImageFeature(decode=False))[index][column]
    where = f" ({raw['path']})" if raw.get("path") else ""
    return (
        f"Image {index}{where} of the dataset cannot be read: {error}. Replace or remove it; other broken files show "
        'with: python -c "from PIL import Image; import sys; [Image.open(p).load() for p in sys.argv[1:]]" FILES'
    )


# ----------------------------------------------------------------------------- loaders


def choose_loader(cfg: "Config", train_data, data_config: dict) -> str:
    """``cfg.loader``, with ``"auto"`` resolved: the memory path where the split fits in memory and the recipe asks
    only for what it does (crops, flips, normalisation at crop_pct 1), otherwise timm's per-image transforms."""
    lacks = [
        name
        for name, on in [
            ("streaming", cfg.streaming),
            ("auto_augment", cfg.auto_augment),
            ("color_jitter", cfg.color_jitter > 0),
            ("reprob", cfg.reprob > 0),
            ("crop_pct other than 1", data_config["crop_pct"] != 1.0),
        ]
        if on
    ]
    if cfg.loader == "memory" and lacks:
        raise TrainingError(f"loader memory does not do {', '.join(lacks)}: use loader pil (or auto) for this recipe.")
    if cfg.loader != "auto":
        return cfg.loader
    channels, height, width = data_config["input_size"]
    return "memory" if not lacks and len(train_data) * channels * height * width <= MEMORY_LIMIT_BYTES else "pil"


class Batches:
    """Turns a loader's batches into the model's input on its device, epoch by epoch: for the memory path, the uint8
    rows augmented and normalised there; for the PIL path, as they come (their transforms read the epoch from the
    dataset, set before the epoch's workers start)."""

    def __init__(self, dataset: torch.utils.data.Dataset, augment: BatchAugment | None = None):
        self.dataset, self.augment, self.epoch = dataset, augment, 0

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if isinstance(self.dataset, SeededTransform):
            self.dataset.set_epoch(epoch)

    def __call__(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        if self.augment is None:
            return batch[0], batch[1]
        images, targets, indices = batch  # (B, C, H, W) uint8, (B,), (B,)
        return self.augment.to(images.device)(images, indices, self.epoch), targets


def pil_loaders(cfg: "Config", data_config: dict, train_data, val_data, shuffle: bool, drop_last: bool):
    """timm's per-image transforms, seeded per sample (streamed: transformed on the fly, shuffled with a buffer)."""
    augment = dict(scale=cfg.scale, hflip=cfg.hflip, vflip=cfg.vflip, color_jitter=cfg.color_jitter or None)
    augment |= dict(auto_augment=cfg.auto_augment, re_prob=cfg.reprob)
    mode = "L" if data_config["input_size"][0] == 1 else "RGB"
    train_tf = Compose(
        [ConvertImage(mode, cfg.transpose), create_transform(**data_config, is_training=True, **augment)]
    )
    eval_tf = Compose([ConvertImage(mode), create_transform(**data_config)])
    if cfg.streaming:

        def streamed(split, transform):
            def apply(example):
                return {"image": transform(example[cfg.image_column]), "label": example[cfg.label_column]}

            return split.shuffle(seed=cfg.seed, buffer_size=10_000).map(apply).with_format("torch")

        train_set, val_set = streamed(train_data, train_tf), streamed(val_data, eval_tf)
    else:
        train_set = SeededTransform(train_data, train_tf, cfg.image_column, cfg.label_column, cfg.seed)
        val_set = SeededTransform(val_data, eval_tf, cfg.image_column, cfg.label_column, cfg.seed)
    kwargs = dict(batch_size=cfg.batch_size, num_workers=cfg.num_workers)
    train_loader = DataLoader(train_set, shuffle=shuffle, drop_last=drop_last, **kwargs)
    return train_loader, DataLoader(val_set, **kwargs), Batches(train_set), Batches(val_set)


def memory_loaders(cfg: "Config", data_config: dict, train_data, val_data, shuffle: bool, drop_last: bool):
    """The splits decoded once into uint8 tensors (cached beside the datasets cache), batches of rows augmented on
    the training device."""
    channels, height, width = data_config["input_size"]
    mode, size = ("L" if channels == 1 else "RGB"), (height, width)
    decode = dict(image_column=cfg.image_column, label_column=cfg.label_column, mode=mode, size=size)
    decode["interpolation"] = data_config["interpolation"]
    try:
        train_set = ImageTensorDataset(*decode_images(train_data, **decode))
        val_set = ImageTensorDataset(*decode_images(val_data, **decode))
    except UnreadableImage as error:
        raise TrainingError(str(error)) from None
    augment = BatchAugment(
        data_config["mean"],
        data_config["std"],
        scale=cfg.scale,
        hflip=cfg.hflip,
        vflip=cfg.vflip,
        transpose=cfg.transpose,
        seed=cfg.seed,
    )
    normalise = BatchAugment(data_config["mean"], data_config["std"], training=False)
    kwargs = dict(batch_size=cfg.batch_size, num_workers=0)  # rows of a tensor: nothing for workers to do
    train_loader = DataLoader(train_set, shuffle=shuffle, drop_last=drop_last, **kwargs)
    return train_loader, DataLoader(val_set, **kwargs), Batches(train_set, augment), Batches(val_set, normalise)


def make_loaders(cfg: "Config", data_config: dict, train_data, val_data):
    """The training and validation loaders, and the :class:`Batches` that turn each one's batches into model inputs.
    Mixup needs batches of an even size: the last, partial one is then dropped."""
    make = memory_loaders if choose_loader(cfg, train_data, data_config) == "memory" else pil_loaders
    return make(
        cfg, data_config, train_data, val_data, shuffle=not cfg.streaming, drop_last=cfg.mixup > 0 or cfg.cutmix > 0
    )
