"""What the operator needs on Pathfinder: operator variants in a frame that learns the task on a CPU.

The frame is a CNN known to leave chance on Pathfinder on a CPU: a stride-2 3x3 conv stem to a 32x32 grid, residual
3x3 conv blocks with BatchNorm at that grid, global max pooling. Each block takes a global path beside its conv,

    x + relu(bn(conv(x) + g * G(x)))          # g: a per-channel gain, zero at the start

so every variant starts as the frame alone and the global path enters as its gain learns. The variants of ``G``:

- ``frame``: none;
- ``cdr``: the iris operator (content modes up to 6): a smooth, shifted blur per channel;
- ``cdr_full``: the operator on every mode of the grid (``modes=0``): narrow kernels, long learned shifts;
- ``cdr_dynamic``: the operator with per-sample coefficients (diffusion, velocity, reaction, time) computed from the
  block's pooled input (``iris_timm.layers.DynamicConvectionDiffusionReaction2d``, the model option
  ``pde_dynamic``); still diagonal in the Fourier basis and linear in the pixels;
- ``spectral``: a free learned filter per channel on the grid's Fourier modes (GFNet's global filter, periodic).

Budgets are in samples, equal for every variant; accuracy on the validation split every 40k samples. Every run
trains through ``iris_timm.training.fit``, the code ``train.py`` runs, one thread, into a run folder that resumes:

    python -m benchmarks.pathfinder_study run cdr --length 9 --seed 0      # one run
    python -m benchmarks.pathfinder_study all --lengths 9 --seeds 0 1       # every variant, two runs at a time
    python -m benchmarks.pathfinder_study all --jobs 5 --mixed-precision bf16 --num-threads 3   # other train.py options
    python -m benchmarks.pathfinder_study keep          # the runs' records into model_cards/pathfinder_study/runs
    python -m benchmarks.pathfinder_study all --records model_cards/pathfinder_study/runs   # resumed from them
    python -m benchmarks.pathfinder_study table --out model_cards/pathfinder_study/runs \
        --results model_cards/pathfinder_study/results.md
    python -m benchmarks.pathfinder_study --smoke                           # seconds, on made-up data

The data are not public: ``configs/pathfinder_study.yaml`` says how to make them. ``--data-root`` holds one folder
per contour length, named by it (``pathfinder64_length9``, ``pathfinder64_length6``; length 14:
``pathfinder64``).
"""

import argparse
import dataclasses
import json
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.layers import LayerScale
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from iris_timm.files import write_text
from iris_timm.layers import create_cdr
from iris_timm.training import TrainingError, fit, parse_config
from iris_timm.training.run_folder import (
    CHECKPOINTS,
    METRICS,
    SUMMARY,
    TRAIN_CONFIG,
    Evaluation,
    TrainerState,
    checkpoint_dirs,
    read_evaluations,
    read_summary,
    read_train_config,
)

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "pathfinder_study.yaml"
VARIANTS: dict[str, dict[str, Any]] = {
    "frame": {"global_path": "none"},
    "cdr": {"global_path": "cdr", "modes": 6},
    "cdr_full": {"global_path": "cdr", "modes": 0},
    "cdr_dynamic": {"global_path": "cdr_dynamic", "modes": 6},
    "spectral": {"global_path": "spectral"},
}
RECORDS = Path("model_cards/pathfinder_study/runs")  # the runs' records, kept with the project (keep, restore)
SAMPLES = 400_000  # per run, every variant
EVAL_SAMPLES = 40_000  # between evaluations
TARGET_TOP1 = 60.0  # the table gives the samples at which a run first reaches this
# A run's figure: the mean of every evaluation (every 40k samples and at each epoch's end) in its last 80k samples.
# At a constant learning rate with BatchNorm, evaluations a few steps apart differ by several points: one is not a
# figure.
FIGURE_SAMPLES = 80_000


# ----------------------------------------------------------------------------- global paths, channels-last


class SpectralFilter(nn.Module):
    """GFNet's global filter: a free complex weight per channel and Fourier mode of the (periodic) grid, a learned
    full-size circular kernel per channel; built for one grid size."""

    def __init__(self, channels: int, grid: int):
        super().__init__()
        self.grid = grid
        self.weight = nn.Parameter(0.02 * torch.randn(grid, grid // 2 + 1, channels, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C), H = W = grid
        spectrum = torch.fft.rfft2(x.float(), dim=(1, 2), norm="ortho")  # (B, H, W // 2 + 1, C)
        # contiguous(): a channels-last model keeps this 4-D weight in another layout
        y = torch.fft.irfft2(
            spectrum * torch.view_as_complex(self.weight.contiguous()), s=x.shape[1:3], dim=(1, 2), norm="ortho"
        )
        return y.to(x.dtype)


def create_global_path(kind: str, channels: int, modes: int, grid: int) -> nn.Module | None:
    if kind == "none":
        return None
    if kind in ("cdr", "cdr_dynamic"):
        return create_cdr(channels, dynamic=kind == "cdr_dynamic", modes=modes)
    if kind == "spectral":
        return SpectralFilter(channels, grid)
    raise ValueError(f"Unknown global_path {kind!r}; choose one of none, cdr, cdr_dynamic, spectral.")


# ----------------------------------------------------------------------------- the frame


class ConvBlock(nn.Module):
    """``x + relu(bn(conv3x3(x) + g * G(x)))`` on NCHW maps, ``G`` channels-last, ``g`` starting at zero."""

    def __init__(self, dim: int, global_path: nn.Module | None):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, padding=1, bias=False)
        self.global_path = global_path
        self.gain = LayerScale(dim, 0.0) if global_path is not None else None
        self.norm = nn.BatchNorm2d(dim)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
        y = self.conv(x)
        if self.global_path is not None:
            y = y + self.gain(self.global_path(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return x + self.act(self.norm(y))


class PathfinderFrame(nn.Module):
    """The reference Pathfinder CNN with a global path in each block (see the module docstring)."""

    def __init__(
        self,
        in_chans: int = 1,
        num_classes: int = 2,
        dim: int = 32,
        depth: int = 8,
        global_path: str = "none",
        modes: int = 6,
        grid: int = 32,
        drop_path_rate: float = 0.0,
    ):
        super().__init__()
        if drop_path_rate:
            raise ValueError("The Pathfinder frame has no drop path; leave drop_path at 0.")
        self.num_classes, self.num_features = num_classes, dim
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, dim, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(dim), nn.ReLU(inplace=True)
        )
        self.blocks = nn.Sequential(
            *[ConvBlock(dim, create_global_path(global_path, dim, modes, grid)) for _ in range(depth)]
        )
        self.head = nn.Linear(dim, num_classes)
        self.feature_info = [dict(num_chs=dim, reduction=2, module="blocks")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, 64, 64)
        x = self.blocks(self.stem(x))  # (B, dim, 32, 32)
        return self.head(x.amax((2, 3)))


default_cfgs = generate_default_cfgs(
    {
        "pathfinder_frame": {
            "num_classes": 2,
            "input_size": (1, 64, 64),
            "mean": (0.05,),
            "std": (0.2,),
            "crop_pct": 1.0,
            "first_conv": "stem.0",
            "classifier": "head",
        }
    }
)


@register_model
def pathfinder_frame(pretrained: bool = False, **kwargs: Any) -> PathfinderFrame:
    return build_model_with_cfg(PathfinderFrame, "pathfinder_frame", pretrained, **kwargs)


# ----------------------------------------------------------------------------- runs


def data_folder(root: Path, length: int) -> Path:
    return root / ("pathfinder64" if length == 14 else f"pathfinder64_length{length}")


def run_folder(out: Path, variant: str, length: int, seed: int) -> Path:
    return out / f"length{length}" / variant / f"seed{seed}"


def keep(out: Path, records: Path) -> list[Path]:
    """Copy every run's record from ``out`` to ``records``, a folder kept with the project: its train_config.yaml,
    metrics.jsonl and summary.json and, while the run is unfinished, its latest checkpoint (``checkpoint/``), so
    that the table is rebuilt and an unfinished run resumed from another checkout (:func:`restore`). Returns the
    records written."""
    written = []
    for folder in sorted(p.parent for p in out.glob(f"length*/*/seed*/{TRAIN_CONFIG}")):
        record = records / folder.relative_to(out)
        record.mkdir(parents=True, exist_ok=True)
        for name in (TRAIN_CONFIG, METRICS, SUMMARY):
            if (folder / name).is_file():
                write_text(record / name, (folder / name).read_text())
        latest = checkpoint_dirs(folder)[-1:] if not (folder / SUMMARY).is_file() else []
        staging = record / ".checkpoint"
        shutil.rmtree(staging, ignore_errors=True)
        for checkpoint in latest:  # copied whole beside its name, then put in place
            shutil.copytree(checkpoint, staging)
        shutil.rmtree(record / "checkpoint", ignore_errors=True)
        if latest:
            staging.rename(record / "checkpoint")
        written.append(record)
    return written


def restore(folder: Path, record: Path) -> None:
    """Where ``folder`` holds no run and ``record`` (:func:`keep`) does: the record's files, and its checkpoint as
    the run's latest, to resume from."""
    if not (record / TRAIN_CONFIG).is_file() or (folder / TRAIN_CONFIG).is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    for name in (TRAIN_CONFIG, METRICS, SUMMARY):
        if (record / name).is_file():
            write_text(folder / name, (record / name).read_text())
    if (record / "checkpoint").is_dir():
        step = TrainerState.load(record / "checkpoint").step
        shutil.copytree(record / "checkpoint", folder / CHECKPOINTS / f"step_{step:08d}")


def run_argv(
    variant: str, length: int, seed: int, samples: int, data_root: Path, out: Path, eval_samples: int
) -> list[str]:
    """train.py's command line for one run: the study recipe, the variant, the budget in steps."""
    batch = parse_config(["--config", str(RECIPE)]).batch_size
    folder = run_folder(out, variant, length, seed)
    argv = ["--config", str(RECIPE), "--model-kwargs", json.dumps(VARIANTS[variant]), "--seed", str(seed)]
    argv += ["--dataset", str(data_folder(data_root, length)), "--output-dir", str(folder)]
    argv += ["--max-steps", str(samples // batch), "--eval-every", str(eval_samples // batch)]
    summary = read_summary(folder) if folder.is_dir() else None
    if (folder / "checkpoints").is_dir() and (summary is None or summary.steps < samples // batch):
        argv.append("--resume")  # an unfinished run, or one a longer budget extends
    return argv


def run(
    variant: str,
    length: int,
    seed: int,
    samples: int,
    data_root: Path,
    out: Path,
    eval_samples: int = EVAL_SAMPLES,
    options: Sequence[str] = (),
    records: Path | None = None,
) -> None:
    """One run through iris_timm.training.fit, skipped when its folder holds it finished at this budget, resumed
    where it holds it unfinished (or, with ``records``, where the run's record does: :func:`restore`); ``options``
    are train.py options over the study's (``--mixed-precision bf16``)."""
    if records is not None:
        restore(run_folder(out, variant, length, seed), run_folder(records, variant, length, seed))
    argv = run_argv(variant, length, seed, samples, data_root, out, eval_samples)
    cfg = parse_config([*argv, *options])
    summary = read_summary(Path(cfg.output_dir)) if Path(cfg.output_dir).is_dir() else None
    if summary is not None and summary.steps >= cfg.max_steps:
        print(f"{cfg.output_dir}: finished ({summary.steps} steps).")
        return
    fit(cfg)


def run_all(
    keys: list[tuple[int, int, str]],
    samples: int,
    eval_samples: int,
    data_root: Path,
    out: Path,
    jobs: int,
    options: Sequence[str] = (),
    deadline: float | None = None,
) -> dict[tuple[int, int, str], int | None]:
    """The (length, seed, variant) runs in this order, ``jobs`` processes at a time, each logging to its folder's
    study.log; ``options`` are train.py options for every run (the recipe's one thread unless they say otherwise).
    With a ``deadline`` (``time.monotonic()``), a run not started by then is skipped and one still going is stopped
    as a job scheduler stops it, by SIGTERM: from its first step on it writes a checkpoint there and ends (143);
    before, the signal ends it at once. (Not SIGINT: a process started in the background of a shell, or by a test
    worker, inherits SIGINT ignored, and Python then drops one that comes before training sets its handler.) Each
    run's exit status, None where skipped."""

    def one(key: tuple[int, int, str]) -> int | None:
        length, seed, variant = key
        if deadline is not None and time.monotonic() >= deadline:
            return None
        folder = run_folder(out, variant, length, seed)
        folder.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "benchmarks.pathfinder_study", "run", variant, "--length", str(length)]
        argv += ["--seed", str(seed), "--samples", str(samples), "--eval-samples", str(eval_samples)]
        argv += ["--data-root", str(data_root), "--out", str(out), *options]
        with open(folder / "study.log", "a") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = process.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGTERM)
                code = process.wait()
        print(f"{folder}: exit {code}", flush=True)
        return code

    with ThreadPoolExecutor(jobs) as pool:
        return dict(zip(keys, pool.map(one, keys), strict=True))


# ----------------------------------------------------------------------------- the table


@dataclasses.dataclass
class RunResult:
    variant: str
    length: int
    seed: int
    batch_size: int
    evaluations: list[Evaluation]
    finished: bool

    def top1_at(self, samples: int) -> float | None:
        step = samples // self.batch_size
        return next((e.accuracy["top1"] for e in self.evaluations if e.step == step), None)

    def every(self, samples: int) -> list[Evaluation]:
        """The evaluations every ``samples`` samples (train.py also evaluates at each epoch's end)."""
        return [e for e in self.evaluations if e.step % (samples // self.batch_size) == 0]

    def samples_to(self, top1: float, every: int) -> int | None:
        """The samples at the first evaluation every ``every`` samples that reaches ``top1``."""
        return next((e.step * self.batch_size for e in self.every(every) if e.accuracy["top1"] >= top1), None)

    def figure(self, samples: int) -> float | None:
        """The study's figure at a budget of ``samples``: the mean top-1 of every evaluation from ``samples -
        FIGURE_SAMPLES`` on; None until the run has reached the budget."""
        if self.top1_at(samples) is None:
            return None
        start, end = (samples - FIGURE_SAMPLES) // self.batch_size, samples // self.batch_size
        return statistics.fmean(e.accuracy["top1"] for e in self.evaluations if start <= e.step <= end)

    def best(self, samples: int) -> float | None:
        """The best top-1 of any evaluation within the budget."""
        top1 = [e.accuracy["top1"] for e in self.evaluations if e.step <= samples // self.batch_size]
        return max(top1, default=None)

    def seconds(self) -> float | None:
        return self.evaluations[-1].train_time_s if self.evaluations else None

    def samples_per_s(self) -> float | None:
        """Training samples a second, up to the last evaluation."""
        last = self.evaluations[-1] if self.evaluations else None
        return None if last is None or not last.train_time_s else last.step * self.batch_size / last.train_time_s


def read_results(out: Path) -> list[RunResult]:
    """Every run under ``out`` (``length<L>/<variant>/seed<S>``), finished or not."""
    results = []
    for metrics in sorted(out.glob("length*/*/seed*/metrics.jsonl")):
        folder = metrics.parent
        results.append(
            RunResult(
                variant=folder.parent.name,
                length=int(folder.parent.parent.name.removeprefix("length")),
                seed=int(folder.name.removeprefix("seed")),
                batch_size=read_train_config(folder)["batch_size"],
                evaluations=read_evaluations(folder),
                finished=read_summary(folder) is not None,
            )
        )
    return results


def _samples(count: int) -> str:
    return f"{count // 1000}k" if count % 1000 == 0 else str(count)


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.fmean(values):.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")


def table(results: list[RunResult], samples: int, eval_samples: int) -> str:
    """Markdown: every run's validation top-1 every ``eval_samples`` samples, its figure (:meth:`RunResult.figure`),
    the samples at which it first reaches TARGET_TOP1, its seconds of training and samples a second; then each
    variant's figure, final and best top-1 as mean ± sd over the seeds that reached the budget."""
    points = list(range(eval_samples, samples + 1, eval_samples))
    at = _samples(samples)
    lines = [
        "| length | variant | seed | " + " | ".join(_samples(p) for p in points) + f" | figure at {at} | samples to "
        f"{TARGET_TOP1:.0f} % | train s | samples/s |",
        "|---:|---|---:|" + "---:|" * len(points) + "---:|---:|---:|---:|",
    ]
    order = {name: i for i, name in enumerate(VARIANTS)}
    results = sorted(results, key=lambda r: (r.length, order.get(r.variant, len(order)), r.seed))
    for r in results:
        reached = r.samples_to(TARGET_TOP1, eval_samples)
        cells = [_cell(r.top1_at(p)) for p in points] + [_cell(r.figure(samples))]
        cells += ["–" if reached is None else _samples(reached)]
        cells += [
            "–" if (v := r.seconds()) is None else f"{v:.0f}",
            "–" if (v := r.samples_per_s()) is None else f"{v:.1f}",
        ]
        lines.append(f"| {r.length} | {r.variant} | {r.seed} | " + " | ".join(cells) + " |")
    lines += ["", f"| length | variant | seeds at {at} | figure (%, mean ± sd) | top-1 at {at} | best |"]
    lines.append("|---:|---|---:|---:|---:|---:|")
    groups: dict[tuple[int, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.length, r.variant), []).append(r)
    for (length, variant), runs in groups.items():
        done = [r for r in runs if r.top1_at(samples) is not None]
        figure, final, best = (
            [f(r) for r in done]
            for f in (lambda r: r.figure(samples), lambda r: r.top1_at(samples), lambda r: r.best(samples))
        )
        lines.append(
            f"| {length} | {variant} | {len(done)} | {_mean_sd(figure)} | {_mean_sd(final)} | {_mean_sd(best)} |"
        )
    return "\n".join(lines) + "\n"


def results_page(text: str, out: Path, argv: list[str] | None) -> str:
    """The table with what it shows, the command of every finished run, and the command that made it."""
    commands = [summary.command for p in sorted(out.glob("length*/*/seed*")) if (summary := read_summary(p))]
    lines = [
        "# Pathfinder study: operator variants in a CNN frame",
        "",
        "Validation top-1 (%) of each run every 40k training samples (batch 64, one CPU thread a run); its figure, the",
        f"mean of every evaluation in its last {_samples(FIGURE_SAMPLES)} samples (every 40k and at each epoch's end:",
        "at a constant learning rate with BatchNorm, evaluations a few steps apart differ by several points); the",
        f"samples at which it first reaches {TARGET_TOP1:.0f} %; its seconds of training and samples a second (two",
        "runs at a time on a 2-core machine that other work shared at times: a rough cost, not a benchmark). Then each",
        "variant's figure, final and best top-1 (any evaluation) as mean ± sample standard deviation over seeds.",
        "Runs in progress show what they have reached.",
        "",
        text,
        "The finished runs (unfinished ones resume with `all --records`):",
        "",
        "```bash",
        *commands,
        "python -m benchmarks.pathfinder_study " + shlex.join(sys.argv[1:] if argv is None else argv),
        "```",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- smoke


def make_smoke_data(root: Path, length: int) -> None:
    """A few random 64x64 grey images with balanced labels, as Pathfinder's Parquet splits are laid out."""
    from datasets import ClassLabel, Dataset, Image

    generator = np.random.default_rng(length)
    folder = data_folder(root, length)
    if folder.is_dir():
        return
    folder.mkdir(parents=True)
    for split, rows in (("train", 128), ("val", 32)):
        images = [generator.integers(0, 256, (64, 64), dtype=np.uint8) for _ in range(rows)]
        data = Dataset.from_dict({"image": images, "label": [i % 2 for i in range(rows)]})
        data = data.cast_column("image", Image()).cast_column("label", ClassLabel(names=["disconnected", "connected"]))
        data.to_parquet(str(folder / f"{split}.parquet"))


def smoke(out: Path) -> str:
    """Every variant for 2 steps on made-up data, in this process, then the table: what CI runs."""
    data_root = out / "data"
    make_smoke_data(data_root, 9)
    samples, eval_samples = 128, 64
    for variant in VARIANTS:
        run(variant, 9, 0, samples, data_root, out / "runs", eval_samples)
    return table(read_results(out / "runs"), samples, eval_samples)


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="every variant for a few steps on made-up data")
    commands = parser.add_subparsers(dest="command")
    for name in ("run", "all", "table", "keep"):
        command = commands.add_parser(name)
        command.add_argument("--out", type=Path, default=Path("output/pathfinder_study"), help="the runs' folders")
        if name != "keep":
            command.add_argument("--samples", type=int, default=SAMPLES, help="training samples per run")
            command.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES, help="samples between evaluations")
        if name == "keep":
            command.add_argument("--records", type=Path, default=RECORDS, help="where to keep the runs' records")
        if name in ("run", "all"):
            command.add_argument("--records", type=Path, help=f"resume from the runs' records there ({RECORDS})")
        if name in ("run", "all"):
            command.add_argument("--data-root", type=Path, default=Path("data"), help="holds pathfinder64_length<L>/")
    commands.choices["run"].add_argument("variant", choices=list(VARIANTS))
    commands.choices["run"].add_argument("--length", type=int, default=9)
    commands.choices["run"].add_argument("--seed", type=int, default=0)
    commands.choices["all"].add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    commands.choices["all"].add_argument("--lengths", nargs="+", type=int, default=[9])
    commands.choices["all"].add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    commands.choices["all"].add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    commands.choices["table"].add_argument("--results", type=Path, help="write the table here (results.md)")
    args, options = parser.parse_known_args(argv)  # run and all pass other options on to train.py
    if options and args.command not in ("run", "all"):
        parser.error(f"unrecognized arguments: {' '.join(options)}")
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            print(smoke(Path(tmp)))
        return
    try:
        if args.command == "run":
            run(
                args.variant,
                args.length,
                args.seed,
                args.samples,
                args.data_root,
                args.out,
                args.eval_samples,
                options,
                args.records,
            )
        elif args.command == "all":
            keys = [(length, seed, v) for length in args.lengths for seed in args.seeds for v in args.variants]
            options = [*options, *(["--records", str(args.records)] if args.records else [])]
            codes = run_all(keys, args.samples, args.eval_samples, args.data_root, args.out, args.jobs, options)
            if any(codes.values()):
                failed = sum(code != 0 for code in codes.values())
                raise SystemExit(f"{failed} of {len(codes)} runs failed; see study.log in their folders.")
        elif args.command == "table":
            text = table(read_results(args.out), args.samples, args.eval_samples)
            if args.results:
                write_text(args.results, results_page(text, args.out, argv))
            print(text)
        elif args.command == "keep":
            for record in keep(args.out, args.records):
                print(f"kept {record}")
        else:
            parser.error("choose a command (run, all, table, keep) or --smoke")
    except TrainingError as error:  # one line, and a stopped run's status (143 after SIGTERM)
        print(error, file=sys.stderr)
        raise SystemExit(error.exit_code) from None


if __name__ == "__main__":
    main()
