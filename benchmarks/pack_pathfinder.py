"""Pack the three Pathfinder-64 sets (contour lengths 6, 9 and 14) into one compact file for the GPU study, and the
wheels of the training code's packages that a bare PyTorch image lacks; unpack the file back into Parquet sets.

    python -m benchmarks.pack_pathfinder --root ../shared/data    # the Parquet sets -> output/pathfinder64.npz
    python -m benchmarks.pack_pathfinder --limit 256 --out output/pathfinder64_small.npz --no-wheels

Each set's train and val Parquet files are decoded once into 64x64 greyscale uint8 arrays and saved with
:func:`iris_timm.training.memory_data.save_compact` under the split names ``length<L>_train`` and ``length<L>_val``
(50 MB for the three sets; their Parquet files hold 99 MB of PNGs). :func:`unpack` writes them back as the Parquet
folders ``train.py --dataset`` reads, image for image. The wheels (``datasets`` and the two packages it needs beyond
PyTorch's, at the versions installed here, for Python 3.12) go to ``output/wheels``.
"""

import argparse
import importlib.metadata
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import torch

from iris_timm.files import atomic_write
from iris_timm.training.memory_data import decode_images, load_compact, save_compact

__all__ = [
    "DEFAULT_OUT",
    "DEFAULT_WHEELS",
    "FOLDERS",
    "SPLITS",
    "download_wheels",
    "pack",
    "parquet_paths",
    "split_name",
    "unpack",
]

FOLDERS = {6: "pathfinder64_length6", 9: "pathfinder64_length9", 14: "pathfinder64"}  # contour length -> folder
SPLITS = ("train", "val")
DEFAULT_OUT = Path("output/pathfinder64.npz")
DEFAULT_WHEELS = Path("output/wheels")
WHEELS = ("datasets", "dill", "multiprocess")  # the training code's packages missing from a PyTorch image
WHEEL_PYTHON = "3.12"


def split_name(length: int, split: str) -> str:
    return f"length{length}_{split}"


def parquet_paths(root: Path, lengths: Iterable[int] = tuple(FOLDERS)) -> dict[str, Path]:
    """Where each length's train and val Parquet files lie under ``root``, by split name."""
    return {split_name(n, split): root / FOLDERS[n] / f"{split}.parquet" for n in lengths for split in SPLITS}


def _read(path: Path, limit: int | None) -> datasets.Dataset:
    """The Parquet file as a `datasets` table (its Image feature from the file's metadata), first ``limit`` rows."""
    table = pq.read_table(path)
    return datasets.Dataset(table if limit is None else table.slice(0, limit))


def pack(root: Path, limit: int | None = None) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """Decode every length's train and val split under ``root``: the splits, the class names."""
    paths = parquet_paths(root)
    missing = [str(path) for path in paths.values() if not path.is_file()]
    if missing:
        folders = ", ".join(FOLDERS.values())
        raise SystemExit(f"{', '.join(missing)} not found: pass --root, the folder that holds {folders}.")
    tables = {name: _read(path, limit) for name, path in paths.items()}
    decode = dict(image_column="image", label_column="label", mode="L", size=(64, 64))
    with tempfile.TemporaryDirectory() as cache:  # decode_images' cache: the compact file is what is kept
        splits = {name: decode_images(dataset, **decode, cache_dir=cache) for name, dataset in tables.items()}
    return splits, next(iter(tables.values())).features["label"].names  # (N, 1, 64, 64) uint8, (N,) int64


def unpack(path: Path, root: Path, lengths: Iterable[int] = tuple(FOLDERS), limit: int | None = None) -> None:
    """Write the compact file's sets for ``lengths`` under ``root`` as :func:`pack` reads them (PNG images, the
    class names as a ClassLabel), the first ``limit`` images of each split; a file already there is kept."""
    splits, class_names = load_compact(path)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=class_names)})
    for name, target in parquet_paths(root, lengths).items():
        if target.is_file():
            continue
        images, labels = (tensor[:limit] for tensor in splits[name])
        rows = {"image": list(images[:, 0].numpy()), "label": labels.tolist()}  # (N, 64, 64) uint8 each
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(target) as partial:
            datasets.Dataset.from_dict(rows, features=features).to_parquet(str(partial))


def download_wheels(dest: Path) -> None:
    """The wheels of ``WHEELS`` at the versions installed here, for Python ``WHEEL_PYTHON``, into ``dest``."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", WHEEL_PYTHON, "--dest", str(dest), *pins]
    if subprocess.call(command):
        raise SystemExit(f"pip could not download {' '.join(pins)}; rerun with network access, or with --no-wheels.")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data"), help="folder of the Parquet sets (pathfinder64*/)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--limit", type=int, default=None, help="keep the first N images of each split")
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS, help="folder for the wheels")
    parser.add_argument("--no-wheels", action="store_true", help="pack the data only")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = _parse(argv)
    begin = time.perf_counter()
    splits, class_names = pack(args.root, args.limit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_compact(args.out, splits, class_names)
    counts = ", ".join(f"{name} {len(labels)}" for name, (_, labels) in splits.items())
    size_mb = args.out.stat().st_size / 1e6
    print(f"wrote {args.out}: {size_mb:.1f} MB in {time.perf_counter() - begin:.1f} s ({counts})")
    if not args.no_wheels:
        download_wheels(args.wheels)
        print(f"wrote {', '.join(sorted(p.name for p in args.wheels.glob('*.whl')))} to {args.wheels}")
    return args.out


if __name__ == "__main__":
    main()
