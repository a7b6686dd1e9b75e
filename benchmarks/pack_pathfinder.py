"""Pack the three Pathfinder-64 sets (contour lengths 6, 9 and 14) into one compact file the GPU study reads.

    python -m benchmarks.pack_pathfinder                          # ../shared/data -> output/pathfinder64.npz
    python -m benchmarks.pack_pathfinder --limit 256 --out output/pathfinder64_small.npz

Each set's train and val Parquet files are decoded once into 64x64 greyscale uint8 arrays and saved with
:func:`iris_timm.training.memory_data.save_compact` under the split names ``length<L>_train`` and ``length<L>_val``.
"""

import argparse
import tempfile
import time
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import torch

from iris_timm.training.memory_data import decode_images, save_compact

__all__ = ["DEFAULT_OUT", "FOLDERS", "SPLITS", "pack", "split_name"]

FOLDERS = {6: "pathfinder64_length6", 9: "pathfinder64_length9", 14: "pathfinder64"}  # contour length -> folder
SPLITS = ("train", "val")
DEFAULT_OUT = Path("output/pathfinder64.npz")


def split_name(length: int, split: str) -> str:
    return f"length{length}_{split}"


def _read(path: Path, limit: int | None) -> datasets.Dataset:
    """The Parquet file as a `datasets` table (its Image feature from the file's metadata), first ``limit`` rows."""
    table = pq.read_table(path)
    return datasets.Dataset(table if limit is None else table.slice(0, limit))


def pack(root: Path, limit: int | None = None) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
    """Decode every length's train and val split under ``root`` (``../shared/data``): the splits, the class names."""
    paths = {
        split_name(n, split): root / folder / f"{split}.parquet" for n, folder in FOLDERS.items() for split in SPLITS
    }
    missing = [str(path) for path in paths.values() if not path.is_file()]
    if missing:
        folders = ", ".join(FOLDERS.values())
        raise SystemExit(f"{', '.join(missing)} not found: pass --root, the folder that holds {folders}.")
    tables = {name: _read(path, limit) for name, path in paths.items()}
    decode = dict(image_column="image", label_column="label", mode="L", size=(64, 64))
    with tempfile.TemporaryDirectory() as cache:  # decode_images' cache: the compact file is what is kept
        splits = {name: decode_images(dataset, **decode, cache_dir=cache) for name, dataset in tables.items()}
    return splits, next(iter(tables.values())).features["label"].names  # (N, 1, 64, 64) uint8, (N,) int64


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("../shared/data"), help="folder of the Parquet sets")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--limit", type=int, default=None, help="keep the first N images of each split")
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
    return args.out


if __name__ == "__main__":
    main()
