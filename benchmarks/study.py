"""The results table and pictures of a CIFAR-10 study, rebuilt from train.py's run folders.

    python -m benchmarks.study --runs output/cifar10_cpu --out model_cards/cifar10

A run is a folder ``<runs>/<configuration>/seed<N>`` written by ``train.py --output-dir``: it holds
``train_config.yaml``, ``metrics.jsonl`` and ``summary.json``. Runs without ``summary.json`` (unfinished) are
skipped and named. Written to ``--out``:

- ``results.md``: per configuration, the model, parameters, steps, training images/s and seconds, and the final
  validation top-1 as mean ± sample standard deviation over seeds (most accurate first), then the command of
  every run;
- ``accuracy_vs_time.png``: validation top-1 against seconds of training, one line per run;
- with ``--eval-sizes``, a second table: each run's final weights evaluated on the validation images resized to
  other sizes, without fine-tuning (measured once and kept in the run folder as ``resolution_top1.json``);
- ``pde_coefficients.png`` and ``pde_kernels.png``, from the exported weights of ``--pde-run`` (by default the
  first seed of ``iris``): what the convection–diffusion–reaction operators learned, stage by stage.
"""

import argparse
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.nn.functional as F
from torch import nn

from iris_timm.files import MissingExtra, atomic_write, import_pyplot, write_text
from iris_timm.hub import from_pretrained
from iris_timm.layers import ConvectionDiffusionReaction2d, DepthwiseConv
from iris_timm.training.run_folder import Summary, read_evaluations, read_summary, read_train_config

__all__ = [
    "Run",
    "effective_kernels",
    "load_runs",
    "pde_operators",
    "report",
    "resolution_table",
    "results_table",
    "summarize",
    "top1_at_sizes",
]


@dataclass
class Run:
    configuration: str
    seed: str
    config: dict[str, Any]  # train_config.yaml
    summary: Summary
    curve: list[tuple[float, float]]  # (seconds of training, validation top-1) at each evaluation
    folder: Path


def load_runs(root: Path) -> list[Run]:
    """Every finished run under ``root/<configuration>/<seed>``, sorted; unfinished ones are reported."""
    runs = []

    def order(folder: Path) -> tuple:  # seed2 before seed10
        return folder.parent.name, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", folder.name)]

    for folder in sorted((p for p in root.glob("*/*") if p.is_dir()), key=order):
        summary = read_summary(folder)
        if summary is None:
            print(f"skipped {folder}: no summary.json (the run did not finish)")
            continue
        curve = [(e.train_time_s, e.accuracy["top1"]) for e in read_evaluations(folder)]
        if not curve:
            raise SystemExit(f"{folder}/metrics.jsonl has no evaluation: is it a train.py run folder?")
        runs.append(Run(folder.parent.name, folder.name, read_train_config(folder), summary, curve, folder))
    if not runs:
        raise SystemExit(f"No finished runs under {root}: expected {root}/<configuration>/<seed>/summary.json.")
    return runs


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def top1_after(run: Run, seconds: float) -> float | None:
    """Top-1 of the run's first evaluation after ``seconds`` of training; ``None`` if it stopped before."""
    return next((top1 for time, top1 in run.curve if time >= seconds), None)


def summarize(runs: list[Run], at_s: float = 200.0) -> list[dict[str, Any]]:
    """One row per configuration, most accurate first. Besides the final top-1 (after the budget the run fitted),
    each row has the top-1 of the first evaluation after ``at_s`` seconds of training, the same time for all."""
    rows = []
    for name in sorted({r.configuration for r in runs}):
        group = [r for r in runs if r.configuration == name]
        top1, top1_std = _mean_std([r.summary.top1 for r in group])
        early = [top1_after(r, at_s) for r in group]
        top1_at, top1_at_std = _mean_std(early) if None not in early else (None, None)
        times = [r.summary.train_time_s for r in group]
        rows.append(
            {
                "configuration": name,
                "model": group[0].config["model"],
                "model_kwargs": group[0].config["model_kwargs"],
                "params_m": group[0].summary.params / 1e6,
                "seeds": len(group),
                "steps": statistics.fmean(r.summary.steps for r in group),
                "images_per_s": statistics.fmean(r.summary.train_images_per_s for r in group),
                "train_time_s": (statistics.fmean(times), min(times), max(times)),
                "at_s": at_s,
                "top1_at": top1_at,
                "top1_at_std": top1_at_std,
                "top1": top1,
                "top1_std": top1_std,
                "command": group[0].summary.command,
            }
        )
    return sorted(rows, key=lambda row: -row["top1"])


def _with_spread(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def results_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``summarize``'s rows."""
    at_s = f"{rows[0]['at_s']:.0f}" if rows else ""
    lines = [
        "| configuration | model | model arguments | params | seeds | steps | train img/s | train s (min–max) | "
        f"val top-1 after {at_s} s (%) | final val top-1 (%) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        kwargs = ", ".join(f"{k}={v}" for k, v in row["model_kwargs"].items()).replace("|", "/") or "-"
        time, shortest, longest = row["train_time_s"]
        lines.append(
            f"| {row['configuration']} | {row['model']} | {kwargs} | {row['params_m']:.2f}M | {row['seeds']} | "
            f"{row['steps']:.0f} | {row['images_per_s']:.0f} | {time:.0f} ({shortest:.0f}–{longest:.0f}) | "
            f"{_with_spread(row['top1_at'], row['top1_at_std'])} | {_with_spread(row['top1'], row['top1_std'])} |"
        )
    return "\n".join(lines) + "\n"


def report(runs: list[Run], runs_folder: Path, out: Path, at_s: float = 200.0, options: str = "") -> str:
    """``results.md``: the table, then the commands that made every run and the one that rebuilds the report
    (``options``: its flags other than ``--runs`` and ``--out``)."""
    commands = "\n".join(r.summary.command for r in sorted(runs, key=lambda r: (r.seed, r.configuration)))
    return (
        results_table(summarize(runs, at_s))
        + f"\nTop-1 on the validation split, mean ± sample standard deviation over seeds: at the first evaluation "
        f"after {at_s:.0f} s of training (the same time for every run), and after the last step of the budget each "
        f"run fitted. Train s: seconds of training (evaluation excluded) on {_threads(runs)}.\n\n"
        f"The runs, then the report:\n\n```bash\n{commands}\n"
        f"python -m benchmarks.study --runs {runs_folder} --out {out}{options}\n```\n"
    )


# ----------------------------------------------------------------------------- one set of weights at other sizes

RESOLUTION_FILE = "resolution_top1.json"  # written into each run folder: {size: top-1}
EVAL_SIZES = [24, 32, 48, 64]  # --eval-sizes: CIFAR-10's 32² and sizes on both sides
AT_S = 200.0  # --at-s: the seconds of training at which the table also compares top-1


def validation_images(dataset: str, split: str = "val", mode: str = "RGB") -> tuple[torch.Tensor, torch.Tensor]:
    """The validation images of a Parquet dataset folder (``<split>.parquet``) in PIL ``mode`` (``"RGB"``, or
    ``"L"`` for a one-channel model, as train.py reads them) as ``(N, C, H, W)`` floats in [0, 1], and their labels."""
    from datasets import load_dataset  # the train extra; only this part of the study needs it

    path = Path(dataset) / f"{split}.parquet"
    if not path.is_file():
        raise SystemExit(f"{path} not found: --eval-sizes reads the validation split of the runs' Parquet dataset.")
    data = load_dataset("parquet", data_files={split: str(path)})[split]
    pixels = torch.stack([torch.from_numpy(np.array(image.convert(mode))) for image in data["image"]])
    pixels = pixels[..., None] if pixels.ndim == 3 else pixels  # (N, H, W, C)
    return pixels.permute(0, 3, 1, 2).float() / 255, torch.tensor(data["label"])


@torch.no_grad()
def top1_at_sizes(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, sizes: list[int], batch_size: int = 500
) -> dict[int, float | None]:
    """Top-1 (%) of ``model`` on ``images`` resized to each size (bicubic, antialiased), normalised as the model's
    data config says; no fine-tuning. At the images' own size this is the usual evaluation; ``None`` where the
    model cannot run (a model built for one input size)."""
    from timm.data import resolve_data_config

    config = resolve_data_config({}, model=model)
    mean, std = torch.tensor(config["mean"])[:, None, None], torch.tensor(config["std"])[:, None, None]
    model.eval()
    results: dict[int, float | None] = {}
    for size in sizes:
        correct = 0
        try:
            for start in range(0, len(images), batch_size):
                batch = images[start : start + batch_size]
                if batch.shape[-1] != size or batch.shape[-2] != size:
                    batch = F.interpolate(batch, size=(size, size), mode="bicubic", antialias=True).clamp(0, 1)
                correct += (model((batch - mean) / std).argmax(-1) == labels[start : start + batch_size]).sum().item()
        except (AssertionError, RuntimeError, ValueError) as error:  # a model built for one input size
            print(f"{type(model).__name__} cannot run at {size}x{size}: {error}")
            results[size] = None
            continue
        results[size] = 100.0 * correct / len(images)
    return results


def resolution_results(runs: list[Run], sizes: list[int]) -> dict[Path, dict[int, float | None]]:
    """Each run's exported model evaluated at ``sizes``, read from the run folder when measured before."""
    results, images = {}, {}  # images by PIL mode
    for run in runs:
        path = run.folder / RESOLUTION_FILE
        saved = {int(k): v for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}
        missing = [size for size in sizes if size not in saved]
        if missing:
            model = timm.create_model(f"local-dir:{run.folder}", pretrained=True)
            channels = model.get_submodule(model.pretrained_cfg["first_conv"]).in_channels
            mode = "L" if channels == 1 else "RGB"  # as train.py reads images for this model
            if mode not in images:
                split = run.config.get("val_split") or "val"
                images[mode] = validation_images(run.config["dataset"], split, mode)
            saved |= top1_at_sizes(model, *images[mode], missing)
            write_text(path, json.dumps(saved, indent=1))
            print(f"{run.folder}: top-1 at {missing}: {[saved[size] for size in missing]}")
        results[run.folder] = {size: saved[size] for size in sizes}
    return results


def _spread_or_dash(values: list[float | None]) -> str:
    return "-" if None in values else _with_spread(*_mean_std(values))


def resolution_table(
    runs: list[Run], results: dict[Path, dict[int, float | None]], sizes: list[int], train_size: int
) -> str:
    """Per configuration, top-1 at each size (mean ± std over seeds) and the change from the training size; "-"
    where a model cannot run at that size."""
    others = [size for size in sizes if size != train_size]
    header = " | ".join(f"{size}² (%)" for size in sizes)
    changes = " | ".join(f"change at {size}²" for size in others)
    lines = [f"| configuration | seeds | {header} | {changes} |", "|---|---:|" + "---:|" * (len(sizes) + len(others))]
    rows = []
    for name in sorted({r.configuration for r in runs}):
        group = [results[r.folder] for r in runs if r.configuration == name]
        cells = [_spread_or_dash([g[size] for g in group]) for size in sizes]
        deltas = [
            _spread_or_dash([None if g[size] is None else g[size] - g[train_size] for g in group]) for size in others
        ]
        rows.append(
            (
                -statistics.fmean(g[train_size] or 0.0 for g in group),  # models that cannot run come last
                f"| {name} | {len(group)} | " + " | ".join(cells + deltas) + " |",
            )
        )
    return "\n".join(lines + [row for _, row in sorted(rows)]) + "\n"


# ----------------------------------------------------------------------------- what the PDE learned


def modules_by_stage(model: nn.Module, kind: type[nn.Module]) -> dict[int, list[nn.Module]]:
    """The modules of type ``kind`` in an iris model, by stage index, in block order."""
    stages: dict[int, list[nn.Module]] = {}
    for name, module in model.named_modules():
        if isinstance(module, kind):
            stages.setdefault(int(name.split(".")[1]), []).append(module)
    return stages


def pde_operators(model: nn.Module) -> dict[int, list[ConvectionDiffusionReaction2d]]:
    """The CDR operators of an iris model by stage index, in block order."""
    return modules_by_stage(model, ConvectionDiffusionReaction2d)


@torch.no_grad()
def effective_kernels(operator: ConvectionDiffusionReaction2d, size: int) -> torch.Tensor:
    """The spatial kernel of each head on a ``size x size`` grid, with its origin at ``(size // 2, size // 2)``:
    the operator's response to a unit impulse there. The operator convolves each channel with its head's kernel,
    so the response is the kernel, whichever way the operator computes it. Returns ``(heads, size, size)``."""
    impulse = torch.zeros(1, size, size, operator.channels)
    impulse[:, size // 2, size // 2] = 1.0
    one_per_head = slice(None, None, operator.channels // operator.num_heads)
    return operator(impulse)[0, ..., one_per_head].permute(2, 0, 1)


def _threads(runs: list[Run]) -> str:
    counts = sorted({str(r.summary.threads) for r in runs if r.summary.threads is not None})
    unrecorded = sum(r.summary.threads is None for r in runs)
    text = f"{' or '.join(counts) or 'an unrecorded number of'} CPU thread{'' if counts == ['1'] else 's'} per run"
    return text + (f"; {unrecorded} of {len(runs)} runs did not record it" if counts and unrecorded else "")


def _save(fig: Any, path: Path) -> None:
    with atomic_write(path) as partial:
        fig.savefig(partial, dpi=120, bbox_inches="tight")


def plot_accuracy_vs_time(runs: list[Run], path: Path) -> None:
    """Validation top-1 against training seconds, one line per run: the models on the left and, when there are
    configurations named ``iris_*``, the iris ablations (with ``iris``) on the right."""
    plt = import_pyplot()
    names = sorted({r.configuration for r in runs})
    ablations = [n for n in names if n.startswith("iris_")]
    first = ["iris"] if "iris" in names else []  # the same colour in both panels
    panels = [("models", first + [n for n in names if n not in ablations and n != "iris"])]
    if ablations:
        panels.append(("iris ablations", first + ablations))
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False, sharey=True)
    for ax, (title, shown) in zip(axes[0], panels, strict=True):
        labelled = set()
        colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(shown)}
        for run in sorted((r for r in runs if r.configuration in shown), key=lambda r: shown.index(r.configuration)):
            times, top1 = zip(*run.curve, strict=True)
            label = None if run.configuration in labelled else run.configuration
            labelled.add(run.configuration)
            ax.plot(times, top1, marker="o", color=colors[run.configuration], label=label, alpha=0.8)
        ax.set(title=f"{title}: one line per seed", xlabel=f"seconds of training ({_threads(runs)})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel("val top-1 (%)")
    _save(fig, path)
    plt.close(fig)


def plot_pde_coefficients(model: nn.Module, path: Path) -> None:
    """Per stage: diffusion D (log scale), reaction r, time t and velocity v of every head of every block."""
    plt = import_pyplot()
    stages = pde_operators(model)
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))

    def per_stage(get: Callable[[ConvectionDiffusionReaction2d], torch.Tensor]) -> list[list[float]]:
        return [torch.cat([get(op).detach().float().flatten() for op in ops]).tolist() for ops in stages.values()]

    labels = [f"stage {i}" for i in stages]
    for ax, (title, get) in zip(
        axes[:3],
        [
            ("diffusion D", lambda op: op.log_diffusion.exp()),
            ("reaction r", lambda op: op.reaction),
            ("time t", lambda op: op.log_time.exp()),
        ],
        strict=True,
    ):
        ax.boxplot(per_stage(get), tick_labels=labels)
        ax.set_title(title)
    axes[0].set_yscale("log")
    for i, ops in stages.items():
        velocity = torch.cat([op.velocity.detach().float() for op in ops])
        axes[3].scatter(velocity[:, 0].numpy(), velocity[:, 1].numpy(), s=6, label=f"stage {i}", alpha=0.6)
    axes[3].set(title="velocity v (rows, columns)", aspect="equal")
    axes[3].legend(fontsize=8)
    fig.suptitle("Learned PDE coefficients, all heads of all blocks (content units: the image is the unit square)")
    _save(fig, path)
    plt.close(fig)


def plot_pde_kernels(model: nn.Module, path: Path, size: int = 32, heads: int = 6) -> None:
    """Per stage, the effective spatial kernels of the first block's PDE heads with the smallest to the largest
    diffusion, on a ``size`` grid over the whole image (the same content units at every stage), and beside them
    the learned depthwise kernels of the same block's local filter, when it has one (channels of the largest
    kernel norm)."""
    plt = import_pyplot()
    stages = pde_operators(model)
    local = modules_by_stage(model, DepthwiseConv)
    columns = heads + (heads if local else 0)
    fig, axes = plt.subplots(len(stages), columns, figsize=(2 * columns, 2.1 * len(stages)), squeeze=False)
    for row, (i, ops) in zip(axes, stages.items(), strict=True):
        operator = ops[0]
        order = operator.log_diffusion.detach().argsort()
        chosen = order[torch.linspace(0, len(order) - 1, min(heads, len(order))).round().long()]
        kernels = effective_kernels(operator, size)
        for ax, head in zip(row[:heads], chosen.tolist(), strict=False):
            _show(
                ax,
                kernels[head].numpy(),
                f"stage {i} PDE head {head}\nD={operator.log_diffusion[head].exp().item():.1e}",
            )
        if local:
            weight = local[i][0].conv.weight.detach()[:, 0]  # (C, k, k)
            strongest = weight.flatten(1).norm(dim=1).argsort(descending=True)[:heads]
            for ax, channel in zip(row[heads:], strongest.tolist(), strict=False):
                _show(ax, weight[channel].numpy(), f"stage {i} dwconv ch {channel}")
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(
        f"PDE kernels (response to a centred impulse, {size}x{size} grid over the image)"
        + (" and learned depthwise kernels (right)" if local else "")
    )
    _save(fig, path)
    plt.close(fig)


def _show(ax: Any, kernel: Any, title: str) -> None:
    limit = abs(kernel).max()
    ax.imshow(kernel, cmap="RdBu_r", vmin=-limit, vmax=limit)
    ax.set_title(title, fontsize=8)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("output/cifar10_cpu"), help="folder of run folders")
    parser.add_argument("--out", type=Path, default=Path("model_cards/cifar10"), help="where to write")
    parser.add_argument("--pde-run", type=Path, help="a run folder with iris weights (default: iris's first seed)")
    parser.add_argument("--at-s", type=float, default=AT_S, help="also compare top-1 after this many seconds")
    parser.add_argument(
        "--eval-sizes", type=int, nargs="*", default=EVAL_SIZES, help="evaluate every run at these sizes"
    )
    args = parser.parse_args(argv)

    runs = load_runs(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    options = "" if args.eval_sizes == EVAL_SIZES else " ".join(["", "--eval-sizes", *map(str, args.eval_sizes)])
    options += f" --at-s {args.at_s:g}" if args.at_s != AT_S else ""
    text = report(runs, args.runs, args.out, args.at_s, options)
    if args.eval_sizes:
        train_size = runs[0].config["img_size"]
        sizes = sorted({*args.eval_sizes, train_size})
        table = resolution_table(runs, resolution_results(runs, sizes), sizes, train_size)
        text += (
            f"\n### One set of weights at other sizes\n\nValidation top-1 of each run's final weights, trained at "
            f"{train_size}², on the same validation images resized (bicubic, antialiased), without fine-tuning; "
            f"change: top-1 there minus top-1 at {train_size}², per run, then mean ± std:\n\n{table}"
        )
    write_text(args.out / "results.md", text)
    print(text)
    plot_accuracy_vs_time(runs, args.out / "accuracy_vs_time.png")

    pde_run = args.pde_run or next((r.folder for r in runs if r.configuration == "iris"), None)
    if pde_run is None:
        print("No iris run: pass --pde-run for the PDE pictures.")
        return
    model = from_pretrained(f"local-dir:{pde_run}")
    if not pde_operators(model):
        raise SystemExit(
            f"{pde_run} holds a model without CDR operators; pass --pde-run with a run whose model has them "
            "(not spatial_mix='local')."
        )
    plot_pde_coefficients(model, args.out / "pde_coefficients.png")
    plot_pde_kernels(model, args.out / "pde_kernels.png")
    print(f"Wrote results.md and the pictures to {args.out}")


if __name__ == "__main__":
    try:
        main()
    except MissingExtra as error:
        raise SystemExit(str(error)) from None
