"""Decoded image tensors, their cache and compact files, and whole-batch augmentation."""

import itertools

import numpy as np
import pytest
import torch
from datasets import Dataset, Features, Value
from datasets import Image as ImageFeature
from PIL import Image

from iris_timm.training import memory_data
from iris_timm.training.memory_data import (
    BatchAugment,
    ImageTensorDataset,
    UnreadableImage,
    decode_images,
    hash_uniform,
    load_compact,
    save_compact,
)

MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


def random_images(count: int, height: int, width: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def image_dataset(images: list) -> Dataset:
    features = Features({"image": ImageFeature(), "label": Value("int64")})
    return Dataset.from_dict({"image": images, "label": list(range(len(images)))}, features=features)


def normalised(images: torch.Tensor) -> torch.Tensor:
    """The reference normalisation of uint8 images (B, 3, H, W)."""
    return (images.float() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


def uint8_batch(count: int, height: int, width: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (count, 3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_decode_images_equals_pil(tmp_path, mode):
    pictures = random_images(3, 5, 7)
    images, labels = decode_images(image_dataset(pictures), "image", "label", mode, None, tmp_path)
    expected = np.stack([np.asarray(p.convert(mode)).reshape(5, 7, -1).transpose(2, 0, 1) for p in pictures])
    assert images.dtype == torch.uint8 and images.shape == (3, len(mode), 5, 7)
    np.testing.assert_array_equal(images.numpy(), expected)
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 2]


def test_decode_images_resizes_as_timm_eval(tmp_path):
    """Shorter side to the size (bicubic), then the centre crop."""
    square, wide = random_images(1, 16, 16)[0], random_images(1, 16, 24, seed=1)[0]
    images, _ = decode_images(image_dataset([square, wide]), "image", "label", "RGB", (8, 8), tmp_path)
    expected = [square.resize((8, 8), Image.BICUBIC), wide.resize((12, 8), Image.BICUBIC).crop((2, 0, 10, 8))]
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), np.stack([np.asarray(e) for e in expected]))
    with pytest.raises(ValueError, match="give a size"):
        decode_images(image_dataset([square, wide]), "image", "label", "RGB", None, tmp_path)


def test_decode_images_cached(tmp_path, monkeypatch):
    dataset = image_dataset(random_images(2, 4, 4))
    first = decode_images(dataset, "image", "label", "RGB", None, tmp_path)
    assert len(list(tmp_path.rglob("*.safetensors"))) == 1

    def no_decoding(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(memory_data, "_decode", no_decoding)
    second = decode_images(dataset, "image", "label", "RGB", None, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert len(list(tmp_path.rglob("*"))) == 2  # the folder and the one file: nothing left half-written


def test_decode_images_names_unreadable_row(tmp_path):
    good = random_images(1, 4, 4)[0]
    dataset = image_dataset([good, {"bytes": b"not an image", "path": "broken.png"}])
    with pytest.raises(UnreadableImage, match=r"Image 1 \(broken.png\)"):
        decode_images(dataset, "image", "label", "RGB", None, tmp_path)


def test_image_tensor_dataset_rows():
    images, labels = uint8_batch(3, 2, 2), torch.tensor([4, 5, 6])
    image, label, index = ImageTensorDataset(images, labels)[2]
    assert torch.equal(image, images[2]) and label.item() == 6 and index.dtype == torch.int64 and index.item() == 2


# ----------------------------------------------------------------------------- augmentation


def test_hash_is_splitmix64():
    """The int64 tensor hash equals splitmix64 computed with Python's unbounded integers modulo 2**64."""

    def mix(x: int) -> int:
        x = (x + 0x9E3779B97F4A7C15) % 2**64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
        return x ^ (x >> 31)

    seed, epoch, indices = 7, 3, [0, 1, 123_456_789]
    expected = [[mix(mix(mix(mix(seed) ^ epoch) ^ i) ^ d) >> 40 for d in range(4)] for i in indices]
    draws = hash_uniform(seed, epoch, torch.tensor(indices), 4)
    assert (draws * 2**24).long().tolist() == expected


@pytest.mark.parametrize(
    "kwargs",
    [dict(scale=[1.0, 1.0]), dict(scale=(0.2, 1.0), pad=4, hflip=1.0, vflip=1.0, transpose=1.0, training=False)],
    ids=["probabilities 0", "eval"],
)
def test_normalise_only(kwargs):
    images = uint8_batch(4, 6, 6)
    assert torch.equal(BatchAugment(MEAN, STD, **kwargs)(images, torch.arange(4), 0), normalised(images))


@pytest.mark.parametrize(
    ("name", "reference"),
    [("hflip", lambda x: x.flip(-1)), ("vflip", lambda x: x.flip(-2)), ("transpose", lambda x: x.transpose(-1, -2))],
)
def test_flip_with_probability_1(name, reference):
    images = uint8_batch(4, 6, 6)
    augmented = BatchAugment(MEAN, STD, **{name: 1.0})(images, torch.arange(4), 0)
    assert torch.equal(augmented, normalised(reference(images)))


def test_draws_follow_the_sample_not_the_batch():
    augment = BatchAugment(MEAN, STD, scale=(0.3, 1.0), pad=2, hflip=0.5, vflip=0.5, transpose=0.5, seed=3)
    images, indices = uint8_batch(8, 10, 10), torch.arange(100, 108)
    whole = augment(images, indices, 5)
    order = torch.tensor([6, 2, 7, 0])
    others = uint8_batch(3, 10, 10).flip(0)
    mixed = augment(torch.cat([images[order], others]), torch.cat([indices[order], torch.tensor([1, 2, 3])]), 5)
    torch.testing.assert_close(mixed[:4], whole[order])
    assert not torch.allclose(augment(images, indices, 6), whole)


def test_flip_frequencies():
    """Each transform is drawn with its probability, independently: decoded from where the corners of a 2x2 image
    land, among the 8 combinations."""
    probabilities = (0.3, 0.6, 0.5)
    image = torch.tensor([[0, 1], [2, 3]], dtype=torch.uint8).expand(20_000, 3, 2, 2)
    augmented = BatchAugment(MEAN, STD, hflip=0.3, vflip=0.6, transpose=0.5)(image, torch.arange(20_000), 0)
    ops = (lambda x: x.flip(-1), lambda x: x.flip(-2), lambda x: x.transpose(-1, -2))
    drawn = torch.zeros(20_000, 3, dtype=torch.bool)
    for combination in itertools.product([False, True], repeat=3):
        expected = image[0]
        for on, op in zip(combination, ops, strict=True):
            expected = op(expected) if on else expected
        drawn[(augmented == normalised(expected[None])).flatten(1).all(1)] = torch.tensor(combination)
    torch.testing.assert_close(drawn.float().mean(0), torch.tensor(probabilities), atol=0.02, rtol=0)
    assert abs((drawn[:, 0] & drawn[:, 1]).float().mean() - 0.3 * 0.6) < 0.02


@pytest.mark.parametrize(("height", "width"), [(16, 16), (12, 20)])
def test_random_resized_crop(height, width):
    """On a ramp image (channel 0 = 8 x column, channel 1 = 8 x row) a crop is a steeper ramp: its slopes give the
    crop's width and height, whose area and aspect ratio lie in the ranges; a constant image stays constant."""
    scale, ratio, count = (0.3, 0.9), (0.5, 2.0), 256
    rows, columns = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    ramp = torch.stack([8 * columns, 8 * rows, torch.zeros_like(rows)]).to(torch.uint8).expand(count, 3, -1, -1)
    augment = BatchAugment((0, 0, 0), (1 / 255, 1 / 255, 1 / 255), scale=scale, ratio=ratio)
    cropped = augment(ramp, torch.arange(count), 0)  # (count, 3, H, W) in 0..255 units
    assert cropped.shape == ramp.shape
    w = (cropped[:, 0, 0, -3] - cropped[:, 0, 0, 2]) / (8 * (width - 5))  # the slope, away from the clamped edges
    h = (cropped[:, 1, -3, 0] - cropped[:, 1, 2, 0]) / (8 * (height - 5))
    area, aspect = w * h, (w * width) / (h * height)
    assert w.max() <= 1 + 1e-3 and h.max() <= 1 + 1e-3  # inside the image
    assert scale[0] - 1e-3 <= area.min() and area.max() <= scale[1] + 1e-3 and area.std() > 0.1
    assert ratio[0] - 1e-3 <= aspect.min() and aspect.max() <= ratio[1] + 1e-3

    constant = torch.full((count, 3, height, width), 77, dtype=torch.uint8)
    torch.testing.assert_close(augment(constant, torch.arange(count), 0), torch.full_like(cropped, 77.0))


def test_translate_fills_black():
    """With pad, each sample is its image shifted by whole pixels (at most pad), black where it moved in."""
    pad, images = 2, uint8_batch(32, 6, 6)
    shifted = BatchAugment((0, 0, 0), (1 / 255, 1 / 255, 1 / 255), pad=pad)(images, torch.arange(32), 0).round()
    padded = torch.nn.functional.pad(images.float(), (pad,) * 4)
    shifts = []
    for sample, image in zip(shifted, padded, strict=True):
        candidates = itertools.product(range(2 * pad + 1), repeat=2)
        shifts += [next(s for s in candidates if torch.equal(image[:, s[0] : s[0] + 6, s[1] : s[1] + 6], sample))]
    assert len(set(shifts)) > 10  # of the 25 shifts


# ----------------------------------------------------------------------------- compact files


def test_compact_round_trip(tmp_path):
    splits = {
        "train": (uint8_batch(3, 4, 5), torch.tensor([0, 2, 1])),
        "val": (uint8_batch(2, 4, 5)[:, :1], torch.tensor([1, 1])),
    }
    path = tmp_path / "data.npz"
    save_compact(path, splits, ["zéro", "one", "two"])
    loaded, names = load_compact(path)
    assert names == ["zéro", "one", "two"] and list(loaded) == ["train", "val"]
    for name, (images, labels) in splits.items():
        assert torch.equal(loaded[name][0], images) and torch.equal(loaded[name][1], labels)
    assert [p.name for p in tmp_path.iterdir()] == ["data.npz"]
