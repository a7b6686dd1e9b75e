"""Training images/s of a recipe with each data path, timm's per-image PIL transforms against the in-memory path
(decoded once, batches augmented on the device), the two runs side by side, one thread each.

    python -m benchmarks.loader_speed configs/cifar10_cpu.yaml configs/pathfinder64.yaml --steps 150 --repeats 3

Each pair of runs shares the machine at the same time, so the ratio of a pair holds when the machine's speed
drifts; the table gives the median images/s of each path and the median of the pairs' ratios. Images/s is
train.py's own figure (summary.json: images over seconds of training, evaluations excluded).
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from iris_timm.training.run_folder import read_summary

LOADERS = ("pil", "memory")


def run_pair(config: str, steps: int, folder: Path) -> dict[str, float]:
    """Both loaders on ``config`` at once, one thread each; their training images/s."""
    common = ["--config", config, "--max-steps", str(steps), "--time-budget-s", "none", "--eval-every-s", "none"]
    common += ["--num-threads", "1", "--log-with", "none", "--overwrite"]
    runs = {
        loader: subprocess.Popen(
            [sys.executable, "train.py", *common, "--loader", loader, "--output-dir", str(folder / loader)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for loader in LOADERS
    }
    for loader, process in runs.items():
        if process.wait() != 0:
            raise SystemExit(f"{config} with loader {loader} failed:\n{process.stderr.read()[-2000:]}")
    return {loader: read_summary(folder / loader).train_images_per_s for loader in LOADERS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="train.py recipes")
    parser.add_argument("--steps", type=int, default=150, help="optimizer updates per run (default: 150)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per recipe (default: 3)")
    args = parser.parse_args(argv)

    print("| recipe | pil images/s | memory images/s | memory / pil (median of pairs) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs:
            pairs = [run_pair(config, args.steps, Path(tmp)) for _ in range(args.repeats)]
            pil, memory = ([pair[loader] for pair in pairs] for loader in LOADERS)
            ratio = statistics.median(m / p for m, p in zip(memory, pil, strict=True))
            print(f"| {config} | {statistics.median(pil):.0f} | {statistics.median(memory):.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
