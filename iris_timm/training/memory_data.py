"""Small images held in memory as one uint8 tensor, augmented a whole batch at a time on its device.

:func:`decode_images` decodes a ``datasets`` split once (cached as safetensors beside the datasets cache);
:class:`ImageTensorDataset` serves its rows with their indices; :class:`BatchAugment` crops, flips and normalises a
batch of rows in a few tensor operations, each sample's randomness a hash of ``(seed, epoch, index)``.
:func:`save_compact` and :func:`load_compact` keep decoded splits in one compressed file that travels without the
dataset.
"""

import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..files import apply_umask, atomic_write

__all__ = [
    "BatchAugment",
    "ImageTensorDataset",
    "UnreadableImage",
    "decode_images",
    "hash_uniform",
    "load_compact",
    "save_compact",
]


class UnreadableImage(ValueError):
    """An image of the dataset that cannot be decoded."""


# ----------------------------------------------------------------------------- decoding


def decode_images(
    dataset,
    image_column: str,
    label_column: str,
    mode: str,
    size: tuple[int, int] | None,
    cache_dir: str | os.PathLike | None = None,
    interpolation: str = "bicubic",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``datasets.Dataset`` split's images as one uint8 tensor (N, C, H, W) (C = 1 for mode ``"L"``, 3 for
    ``"RGB"``) and its labels as int64 (N,), decoded once.

    Images of another size than ``size`` (H, W) are resized as timm's evaluation transform does at crop_pct 1
    (shorter side, then centre crop, with ``interpolation``); with ``size`` None all images must share one size.
    The result is cached in ``cache_dir`` (default: the datasets cache) as a safetensors file named by the dataset's
    fingerprint, the columns, mode and size. An image that does not decode raises :class:`UnreadableImage` naming
    its row (and file)."""
    import datasets  # only this function needs the training extra

    if mode not in ("L", "RGB"):
        raise ValueError(f"mode must be 'L' (greyscale) or 'RGB', not {mode!r}.")
    if len(dataset) == 0:
        raise ValueError("The dataset split has no rows: there are no images to decode.")
    size = tuple(size) if size else None  # a list from a recipe names the same file
    key = (dataset._fingerprint, image_column, label_column, mode, size, interpolation)
    folder = Path(cache_dir or datasets.config.HF_DATASETS_CACHE) / "decoded_images"
    path = folder / f"{datasets.fingerprint.Hasher.hash(key)}.safetensors"
    if path.is_file():
        cached = load_file(path)
        return cached["images"], cached["labels"]

    images = _decode(dataset, image_column, mode, size, interpolation)
    labels = torch.as_tensor(np.asarray(dataset.with_format("numpy")[label_column]), dtype=torch.int64)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as partial:
        save_file({"images": images, "labels": labels}, partial)
        apply_umask(partial)  # safetensors writes 0600: the cache is as readable as the dataset's own
    return images, labels


def _decode(dataset, column: str, mode: str, size: tuple[int, int] | None, interpolation: str) -> torch.Tensor:
    """The column's images, converted to ``mode`` and brought to ``size``, as uint8 (N, C, H, W)."""
    from datasets import Image as ImageFeature
    from timm.data.transforms_factory import transforms_imagenet_eval

    raw = dataset.select_columns([column]).cast_column(column, ImageFeature(decode=False))
    feature, images, out = ImageFeature(mode=mode), None, None
    values = (value for batch in raw.iter(batch_size=1000) for value in batch[column])
    for index, value in enumerate(values):
        try:
            image = feature.decode_example(value)
        except Exception as error:  # PIL raises many types for a broken file; all mean the same here
            where = f" ({value['path']})" if value.get("path") else ""
            raise UnreadableImage(
                f"Image {index}{where} of the dataset cannot be read: {error}. Replace or remove it."
            ) from None
        if out is None:
            height, width = size or (image.height, image.width)
            images = torch.empty((len(raw), len(mode), height, width), dtype=torch.uint8)
            out = images.numpy()  # (N, C, H, W), written in place
            options = dict(crop_pct=1.0, interpolation=interpolation, normalize=False)
            resize = transforms_imagenet_eval((height, width), **options)
        if (image.height, image.width) == (height, width):
            out[index] = np.asarray(image).reshape(height, width, -1).transpose(2, 0, 1)
        elif size is None:
            raise ValueError(
                f"Image {index} is {image.height}x{image.width}, image 0 {height}x{width}: give a size to "
                "resize them to."
            )
        else:
            out[index] = resize(image).numpy()
    return images


class ImageTensorDataset(torch.utils.data.Dataset):
    """Rows of a uint8 image tensor: ``dataset[i]`` is (image uint8 (C, H, W), label int64, index int64)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels: give one label per image.")
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index], torch.tensor(index, dtype=torch.int64)


# ----------------------------------------------------------------------------- augmentation


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (``>>`` on a tensor shifts in the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's step on int64 (its products wrap modulo 2**64, as unsigned ones would)."""
    x = x + (0x9E3779B97F4A7C15 - 2**64)
    x = (x ^ _shift_right(x, 30)) * (0xBF58476D1CE4E5B9 - 2**64)
    x = (x ^ _shift_right(x, 27)) * (0x94D049BB133111EB - 2**64)
    return x ^ _shift_right(x, 31)


def hash_uniform(seed: int, epoch: int, indices: torch.Tensor, draws: int) -> torch.Tensor:
    """Uniform floats in [0, 1), (B, draws), on the indices' device: a hash of (seed, epoch, index, draw number),
    the same on every device and in every batch."""
    indices = indices.to(torch.int64)
    key = _mix(_mix(_mix(torch.full_like(indices, seed)) ^ epoch) ^ indices)  # (B,)
    bits = _mix(key[:, None] ^ torch.arange(draws, device=indices.device))  # (B, draws)
    return _shift_right(bits, 40).float() / 2**24  # the top 24 bits: exact in float32


def _sample_points(n: int, extent: torch.Tensor, centre: torch.Tensor, move: torch.Tensor) -> torch.Tensor:
    """Where the n output pixels of each sample read along one axis (B, n), in grid_sample's -1..1 units: a window
    of half-width ``extent`` around ``centre``, kept within the outer pixels' centres, then moved by ``move`` pixels."""
    pixels = (2 * torch.arange(n, device=extent.device) + 1) / n - 1  # (n,): the pixel centres
    return (extent[:, None] * pixels + centre[:, None]).clamp(-1 + 1 / n, 1 - 1 / n) + 2 * move[:, None] / n


_FLIPS = (lambda x: x.flip(3), lambda x: x.flip(2), lambda x: x.transpose(2, 3))  # hflip, vflip, transpose


class BatchAugment(torch.nn.Module):
    """Augments and normalises a batch of uint8 images on its device, as timm's training transform does per image:
    random-resized crop (area fraction in ``scale``, aspect ratio in ``ratio``, output at the input size), a random
    translation by up to ``pad`` pixels filled with black, flips and a transpose (swap of H and W: with both flips at
    0.5, all 8 rotations and reflections; square images only) with their probabilities, then ``(x - mean) / std``
    with ``mean`` and ``std`` per channel in 0..1 units.

    Each sample's draws are a hash of (seed, epoch, index): sample i of epoch e is augmented the same way in any
    batch, process or resumed run. In eval mode (``training=False`` or ``.eval()``) it only normalises."""

    tries = 10  # random-resized-crop draws per sample before falling back to the whole image, as timm's

    def __init__(
        self,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        scale: tuple[float, float] = (1.0, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        pad: int = 0,
        hflip: float = 0.0,
        vflip: float = 0.0,
        transpose: float = 0.0,
        seed: int = 0,
        training: bool = True,
    ):
        super().__init__()
        if len(mean) != len(std):
            raise ValueError(f"mean has {len(mean)} channel(s) but std {len(std)}: give one value per channel each.")
        if not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1] or pad < 0:
            raise ValueError(f"scale {scale}, ratio {ratio}, pad {pad}: need 0 < scale ≤ 1, 0 < ratio, pad ≥ 0.")
        if not all(0 <= p <= 1 for p in (hflip, vflip, transpose)):
            raise ValueError(f"hflip {hflip}, vflip {vflip}, transpose {transpose}: probabilities lie in 0..1.")
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32)[:, None, None], persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32)[:, None, None], persistent=False)
        self.scale, self.log_ratio = tuple(scale), (math.log(ratio[0]), math.log(ratio[1]))
        self.pad, self.seed = pad, seed
        self.flips = (hflip, vflip, transpose)
        self.train(training)

    def forward(self, images: torch.Tensor, indices: torch.Tensor, epoch: int) -> torch.Tensor:
        """images uint8 (B, C, H, W), indices int64 (B,) -> float32 (B, C, H, W), normalised."""
        if images.shape[1] != len(self.mean):
            raise ValueError(f"The images have {images.shape[1]} channel(s), mean and std {len(self.mean)}.")
        if self.training:
            draws = hash_uniform(self.seed, epoch, indices.to(images.device), 2 * self.tries + 7)  # (B, draws)
            images = self.flip(images, draws[:, -3:])
            x = images.float() / 255
            if self.scale != (1.0, 1.0) or self.pad:
                x = self.crop(x, draws[:, : 2 * self.tries + 4])
        else:
            x = images.float() / 255
        return (x - self.mean) / self.std

    def flip(self, images: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """Flip and transpose the samples whose draws (B, 3) fall under their probabilities."""
        if self.flips[2] and images.shape[2] != images.shape[3]:
            raise ValueError(f"transpose needs square images, not {tuple(images.shape[2:])}: set transpose to 0.")
        for p, op, draw in zip(self.flips, _FLIPS, draws.unbind(1), strict=True):
            if p:
                images = torch.where((draw < p)[:, None, None, None], op(images), images)
        return images

    def crop(self, x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """Random-resized crop, then translation, of float images (B, C, H, W) in one bilinear resampling, from
        (B, 2 * tries + 4) draws."""
        height, width = x.shape[2:]
        area = self.scale[0] + (self.scale[1] - self.scale[0]) * draws[:, : self.tries]  # (B, tries)
        ratio = torch.exp(self.log_ratio[0] + (self.log_ratio[1] - self.log_ratio[0]) * draws[:, self.tries : -4])
        w, h = (area * ratio * height / width).sqrt(), (area / ratio * width / height).sqrt()  # fractions of the side
        fits = (w <= 1) & (h <= 1)
        first = fits.to(torch.uint8).argmax(1, keepdim=True)  # (B, 1): the first draw that fits, as timm's tries
        # None fits: the whole image, its aspect ratio brought into the range (timm's fallback)
        whole = min(max(width / height, math.exp(self.log_ratio[0])), math.exp(self.log_ratio[1]))
        w = torch.where(fits.any(1), w.gather(1, first)[:, 0], min(1.0, whole * height / width))  # (B,)
        h = torch.where(fits.any(1), h.gather(1, first)[:, 0], min(1.0, width / (whole * height)))
        extent = torch.stack([w, h], 1)  # (B, 2): x, y
        centre = (1 - extent) * (2 * draws[:, -4:-2] - 1)  # in -1..1
        moves = (draws[:, -2:] * (2 * self.pad + 1)).floor() - self.pad  # (B, 2): whole pixels
        xs, ys = (_sample_points(n, extent[:, k], centre[:, k], moves[:, k]) for k, n in enumerate((width, height)))
        grid = torch.stack(torch.broadcast_tensors(xs[:, None, :], ys[:, :, None]), -1)  # (B, H, W, 2)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


# ----------------------------------------------------------------------------- compact files


def save_compact(
    path: str | os.PathLike, splits: dict[str, tuple[torch.Tensor, torch.Tensor]], class_names: list[str]
) -> None:
    """Write decoded splits (uint8 images (N, C, H, W), labels (N,)) and the class names to one compressed NumPy
    file, atomically."""
    arrays = {"class_names": np.array(class_names, dtype=str)}
    for name, (images, labels) in splits.items():
        if images.dtype != torch.uint8 or images.ndim != 4 or labels.shape != (len(images),):
            raise ValueError(
                f"Split {name!r}: images must be uint8 (N, C, H, W) and labels (N,), not {images.dtype} "
                f"{tuple(images.shape)} and {tuple(labels.shape)}."
            )
        arrays[f"{name}.images"], arrays[f"{name}.labels"] = images.cpu().numpy(), labels.to(torch.int64).cpu().numpy()
    with atomic_write(path) as partial, open(partial, "wb") as file:
        np.savez_compressed(file, **arrays)


def load_compact(path: str | os.PathLike) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """The splits and class names that :func:`save_compact` wrote."""
    with np.load(path, allow_pickle=False) as file:
        names = [key.removesuffix(".images") for key in file.files if key.endswith(".images")]
        splits = {n: (torch.from_numpy(file[f"{n}.images"]), torch.from_numpy(file[f"{n}.labels"])) for n in names}
        return splits, file["class_names"].tolist()
