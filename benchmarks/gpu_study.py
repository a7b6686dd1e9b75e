"""One GPU study in one command: CUDA correctness of the iris models, throughput and memory against timm peers, and
Pathfinder-64 learning curves at three contour lengths, all within a time budget.

    python -m benchmarks.pack_pathfinder                       # once: ../shared/data -> output/pathfinder64.npz
    python -m benchmarks.gpu_study --out output/gpu_study      # one CUDA GPU, 540 s by default
    python -m benchmarks.gpu_study --smoke --out output/gpu_study_smoke   # every part, tiny, on the CPU

Parts, each written to ``results.json`` and ``results.md`` in ``--out`` as soon as it ends:

1. correctness: every registered ``iris_*`` model, forward and backward under bf16 and fp16 autocast on odd,
   non-square grids (finite or not), and the largest error of the model's output and of one CDR operator's against
   float32, relative to the float32 output's largest magnitude;
2. throughput: training step and inference images/s and peak memory (``torch.cuda.max_memory_allocated``) at 224²
   and 1024², bf16 autocast, channels-last (:func:`iris_timm.tools.benchmark.measure`); with ``--compile`` also the iris
   models' inference under ``torch.compile``, which needs a larger budget (``--budget-s 600``);
3. pathfinder: at contour lengths 6, 9 and 14, the iris recipe, its local-only and global-only ablations and a ResNet
   peer, each trained the same seconds (bf16 autocast, images on the device, dihedral flips by ``BatchAugment``,
   the recipe's optimizer with a linear warm-up then a cosine over the seconds), validation accuracy at evenly
   spaced times and the step at which it first reaches 60 %.

The smoke run falls back to the first images of ``../shared/data`` or to noise when the compact file is absent.
The plan (seconds per part) is printed first; the study refuses to start if it exceeds ``--budget-s``. Each
Pathfinder run's seconds are what the budget leaves after the other parts' estimates, unless ``--train-s`` sets them.
"""

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2

import iris_timm  # noqa: F401  (registers the iris_* models)
from benchmarks.pack_pathfinder import DEFAULT_OUT as DEFAULT_DATA
from benchmarks.pack_pathfinder import FOLDERS, SPLITS, pack, split_name
from iris_timm.files import write_text
from iris_timm.layers import ConvectionDiffusionReaction2d, create_cdr
from iris_timm.tools.benchmark import measure
from iris_timm.training.data import preprocessing
from iris_timm.training.memory_data import BatchAugment, load_compact, save_compact
from train import Config, parse_config

__all__ = ["Plan", "Settings", "check_model", "check_operator", "main", "make_plan", "markdown", "train_pathfinder"]

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
VARIANTS = {"iris": "", "local": "_local", "global": "_global", "resnet": "_resnet"}  # recipe name suffix
PASS_ACCURACY = 0.6


@dataclass
class Settings:
    """What the full study and the smoke run differ in. Seconds are estimates for the plan."""

    device: str
    autocast: str | None  # throughput and Pathfinder; None: float32 (CPUs without bf16 matmuls are slow in it)
    iris_models: list[str]
    grids: list[tuple[int, int]]  # (H, W), odd and non-square
    peers: list[str]
    throughput_models: list[str]
    batch_sizes: dict[int, int]  # throughput input size -> batch size
    warmup: int  # untimed throughput steps
    min_run_time: float  # seconds of timed throughput steps (torch.utils.benchmark's blocked_autorange)
    lengths: list[int]
    batch_size: int | None  # Pathfinder; None: the recipe's
    evaluations: int  # per Pathfinder run, evenly spaced in training time
    limit: int | None  # keep the first N images of each Pathfinder split
    startup_s: float  # CUDA context, data to the device
    check_s: float  # one (model, grid, autocast) correctness check
    record_s: float  # one throughput (model, size, mode), excluding compilation
    compile_s: float  # torch.compile of one throughput record
    run_overhead_s: float  # one Pathfinder run besides training: model, first steps, evaluations
    min_train_s: float


FULL = Settings(
    device="cuda",
    autocast="bf16",
    iris_models=[],  # every registered iris_* model
    grids=[(97, 75), (161, 131)],
    peers=["convnext_tiny", "mambaout_tiny", "deit_small_patch16_224"],
    throughput_models=["iris_pdessm_t", "iris_pdessm_s"],
    batch_sizes={224: 64, 1024: 4},
    warmup=5,
    min_run_time=1.0,
    lengths=[6, 9, 14],
    batch_size=None,
    evaluations=12,
    limit=None,
    startup_s=20.0,
    check_s=1.0,
    record_s=4.0,
    compile_s=45.0,
    run_overhead_s=6.0,
    min_train_s=10.0,
)
SMOKE = Settings(
    device="cpu",
    autocast=None,
    iris_models=["iris_pdessm_test"],
    grids=[(17, 11)],
    peers=[],  # the same code path as the iris models
    throughput_models=["iris_pdessm_test"],
    batch_sizes={32: 2},
    warmup=1,
    min_run_time=0.01,
    lengths=[14],
    batch_size=4,
    evaluations=2,
    limit=8,
    startup_s=3.0,
    check_s=0.3,
    record_s=0.5,
    compile_s=30.0,
    run_overhead_s=0.5,
    min_train_s=0.1,
)


@dataclass
class Plan:
    parts: dict[str, float]  # estimated seconds
    train_s: float  # each Pathfinder run
    runs: int

    @property
    def total_s(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        lines = [f"  {name:<34} {seconds:7.1f} s" for name, seconds in self.parts.items()]
        return "\n".join(["plan:", *lines, f"  {'total':<34} {self.total_s:7.1f} s"])


def make_plan(settings: Settings, budget_s: float, train_s: float | None, compile: bool) -> Plan:
    """Seconds per part; the Pathfinder runs share what the budget leaves (10 % of it is kept as margin) unless
    ``train_s`` fixes them. Refuses a plan over the budget."""
    cases = throughput_cases(settings, compile)
    checks = len(settings.iris_models or iris_models()) * len(settings.grids) * len(AUTOCAST)
    runs = len(settings.lengths) * len(VARIANTS)
    parts = {
        "startup": settings.startup_s,
        "correctness": checks * settings.check_s,
        "throughput": sum(settings.record_s + settings.compile_s * compiled for *_, compiled in cases),
        f"pathfinder overheads ({runs} runs)": runs * settings.run_overhead_s,
        "margin": 0.1 * budget_s,
    }
    if train_s is None:
        train_s = (budget_s - sum(parts.values())) / runs
    plan = Plan({**parts, f"pathfinder training ({runs} x {train_s:.1f} s)": runs * train_s}, train_s, runs)
    if train_s < settings.min_train_s or plan.total_s > budget_s + 1e-6:
        raise SystemExit(
            f"{plan.describe()}\nThe plan exceeds the budget of {budget_s:.0f} s (or leaves each Pathfinder run under "
            f"{settings.min_train_s:.0f} s): raise --budget-s, lower --train-s, or drop --compile."
        )
    return plan


def iris_models() -> list[str]:
    return timm.list_models("iris_*")


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference relative to the reference's largest magnitude."""
    return ((value.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-12)).item()


def _autocast(device: torch.device, name: str | None) -> torch.autocast:
    """Autocast to ``name``'s dtype; off for None."""
    return torch.autocast(device.type, dtype=AUTOCAST.get(name, torch.bfloat16), enabled=name is not None)


def _finite_gradients(model: torch.nn.Module) -> bool:
    return all(p.grad.isfinite().all().item() for p in model.parameters() if p.grad is not None)


def check_model(model: torch.nn.Module, grid: tuple[int, int], autocast: str) -> dict[str, Any]:
    """Forward and backward of ``model`` on two images of ``grid`` under ``autocast``: finite or not, and the
    output's error against float32."""
    device = next(model.parameters()).device
    x = torch.randn(2, 3, *grid, device=device, generator=torch.Generator(device).manual_seed(0))
    with torch.no_grad():
        reference = model.eval()(x)
        with _autocast(device, autocast):
            low = model(x)
    model.train()
    with _autocast(device, autocast):
        out = model(x)
    out.float().square().mean().backward()
    finite_backward = _finite_gradients(model)
    model.zero_grad(set_to_none=True)
    return {
        "grid": list(grid),
        "autocast": autocast,
        "finite_forward": bool(out.isfinite().all()),
        "finite_backward": finite_backward,
        "rel_max_error": relative_error(low, reference),
    }


def check_operator(grid: tuple[int, int], autocast: str, device: torch.device, channels: int = 64) -> dict[str, Any]:
    """One CDR operator, coefficients drawn away from their (diffusion-only) start, on ``(2, H, W, channels)``:
    its output's error under ``autocast`` against float32."""
    torch.manual_seed(0)
    operator: ConvectionDiffusionReaction2d = create_cdr(channels).to(device)
    with torch.no_grad():
        operator.velocity.normal_(0.0, 0.2)
        operator.reaction.normal_(0.0, 0.3)
    x = torch.randn(2, *grid, channels, device=device)  # (B, H, W, C)
    with torch.no_grad():
        reference = operator(x)
        with _autocast(device, autocast):
            low = operator(x)
    return {"operator": type(operator).__name__, "grid": list(grid), "autocast": autocast, **_error(low, reference)}


def _error(low: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    return {"finite_forward": bool(low.isfinite().all()), "rel_max_error": relative_error(low, reference)}


def correctness(settings: Settings, device: torch.device) -> dict[str, list[dict[str, Any]]]:
    cases = [(grid, autocast) for grid in settings.grids for autocast in AUTOCAST]
    models = []
    for name in settings.iris_models or iris_models():
        torch.manual_seed(0)
        model = timm.create_model(name).to(device)
        models += [{"model": name, **check_model(model, *case)} for case in cases]
    _free_memory(device)
    return {"models": models, "operator": [check_operator(*case, device) for case in cases]}


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def throughput_cases(settings: Settings, compile: bool) -> list[tuple[str, int, bool, bool]]:
    """(model, size, train, compiled): every model's training step and inference at every size, and with
    ``compile`` the iris models' inference under ``torch.compile`` too."""
    eager = [
        (name, size, train, False)
        for size in settings.batch_sizes
        for name in settings.throughput_models + settings.peers
        for train in (True, False)
    ]
    compiled = [(name, size, False, True) for size in settings.batch_sizes for name in settings.throughput_models]
    return eager + (compiled if compile else [])


def throughput(settings: Settings, device: torch.device, compile: bool) -> list[dict[str, Any]]:
    """Channels-last, under the settings' autocast; a record that cannot run keeps its reason."""
    records = []
    for name, size, train, compiled in throughput_cases(settings, compile):
        batch_size = settings.batch_sizes[size]
        base = {"model": name, "size": size, "batch_size": batch_size, "mode": "train" if train else "infer"}
        kwargs = dict(device=device.type, amp=settings.autocast == "bf16", channels_last=True, compile=compiled)
        kwargs.update(warmup=settings.warmup, min_run_time=settings.min_run_time)
        try:
            record = measure(name, size, batch_size, train, **kwargs)
        except RuntimeError as error:  # out of memory, a compiler failure: the other records still run
            record = {"error": str(error).strip().splitlines()[0]}
        records.append({**base, "compiled": compiled, **record})
        _free_memory(device)
        print(_throughput_row(records[-1]), flush=True)
    return records


# ----------------------------------------------------------------------------- Pathfinder


def recipe_path(variant: str, length: int, configs: Path = Path("configs")) -> Path:
    """``pathfinder64_length<L><suffix>.yaml`` if it exists, else the length-14 recipe ``pathfinder64<suffix>.yaml``."""
    suffix = VARIANTS[variant]
    own = configs / f"pathfinder64_length{length}{suffix}.yaml"
    return own if length != 14 and own.is_file() else configs / f"pathfinder64{suffix}.yaml"


Splits = dict[str, tuple[torch.Tensor, torch.Tensor]]  # name -> (images uint8 (N, 1, 64, 64), labels (N,))


def pathfinder_data(args: argparse.Namespace, settings: Settings) -> tuple[Splits, str]:
    """The compact file's splits and where they came from. The smoke run falls back to the first images of the
    Parquet sets under ``--root`` (written to a compact file in ``--out`` first) or, without them, to noise."""
    if args.data.is_file():
        splits, _ = load_compact(args.data)
        source = str(args.data)
    elif not args.smoke:
        raise SystemExit(f"{args.data} does not exist: make it with `python -m benchmarks.pack_pathfinder`.")
    elif all((args.root / folder).is_dir() for folder in FOLDERS.values()):
        small = args.out / "pathfinder64_smoke.npz"
        save_compact(small, *pack(args.root, settings.limit))
        splits, _ = load_compact(small)
        source = f"first {settings.limit} images of each split of {args.root}"
    else:
        generator = torch.Generator().manual_seed(0)
        n = settings.limit or 64
        splits = {
            split_name(length, split): (
                torch.randint(0, 256, (n, 1, 64, 64), dtype=torch.uint8, generator=generator),
                torch.randint(0, 2, (n,), generator=generator),
            )
            for length in FOLDERS
            for split in SPLITS
        }
        source = "synthetic noise (no Pathfinder sets found)"
    if settings.limit:
        splits = {name: (x[: settings.limit], y[: settings.limit]) for name, (x, y) in splits.items()}
    return splits, source


def cosine_lr(cfg: Config, step: int, fraction: float) -> float:
    """Linear warm-up over ``cfg.warmup_steps``, then a cosine from ``cfg.lr`` to ``cfg.min_lr`` over the fraction
    of the training seconds spent."""
    warmup = min(1.0, (step + 1) / max(cfg.warmup_steps, 1))
    cosine = cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1 + math.cos(math.pi * min(fraction, 1.0)))
    return warmup * cosine


@torch.inference_mode()
def accuracy(
    model: torch.nn.Module, normalise: BatchAugment, images: torch.Tensor, labels: torch.Tensor, autocast: str | None
) -> float:
    model.eval()
    correct = 0
    for rows in torch.arange(len(labels), device=images.device).split(500):
        with _autocast(images.device, autocast):
            logits = model(normalise(images[rows], rows, 0))
        correct += (logits.argmax(1) == labels[rows]).sum().item()
    model.train()
    return correct / len(labels)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_pathfinder(
    cfg: Config,
    train_split: tuple[torch.Tensor, torch.Tensor],
    val_split: tuple[torch.Tensor, torch.Tensor],
    train_s: float,
    evaluations: int,
    device: torch.device,
    autocast: str | None,
) -> dict[str, Any]:
    """Train ``cfg``'s model for ``train_s`` seconds (evaluations excluded) on images held on ``device``; the
    validation accuracy at ``evaluations`` evenly spaced times, and the first step at or above 60 %."""
    torch.manual_seed(cfg.seed)
    model = timm.create_model(cfg.model, num_classes=2, **cfg.model_kwargs).to(device)
    data_config = preprocessing(cfg, model)
    mean, std = data_config["mean"], data_config["std"]
    flips = dict(hflip=cfg.hflip, vflip=cfg.vflip, transpose=cfg.transpose, seed=cfg.seed)
    augment = BatchAugment(mean, std, **flips).to(device)
    normalise = BatchAugment(mean, std, training=False).to(device)
    images, labels = (t.to(device) for t in train_split)  # (N, 1, 64, 64) uint8, (N,)
    val_images, val_labels = (t.to(device) for t in val_split)
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay)
    batch_size = min(cfg.batch_size, len(labels))
    step, epoch, trained_s, curve = 0, 0, 0.0, []
    due = [train_s * (i + 1) / evaluations for i in range(evaluations)]
    _sync(device)
    start = time.perf_counter()
    while due:
        for rows in torch.randperm(len(labels), device=device).split(batch_size):
            if len(rows) < batch_size:
                continue  # a full batch every step
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(cfg, step, (trained_s + time.perf_counter() - start) / train_s)
            with _autocast(device, autocast):
                logits = model(augment(images[rows], rows, epoch))
            loss = F.cross_entropy(logits.float(), labels[rows], label_smoothing=cfg.smoothing)
            loss.backward()
            if cfg.clip_grad:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if trained_s + time.perf_counter() - start >= due[0]:
                _sync(device)
                trained_s += time.perf_counter() - start
                due.pop(0)
                point = {"train_s": trained_s, "step": step, "samples": step * batch_size, "loss": loss.item()}
                curve.append({**point, "accuracy": accuracy(model, normalise, val_images, val_labels, autocast)})
                start = time.perf_counter()
                if not due:
                    break
        epoch += 1
    passed = next((point for point in curve if point["accuracy"] >= PASS_ACCURACY), None)
    return {
        "model": cfg.model,
        "model_kwargs": cfg.model_kwargs,
        "batch_size": batch_size,
        "train_s": trained_s,
        "steps": step,
        "images_per_s": step * batch_size / trained_s,
        "final_accuracy": curve[-1]["accuracy"],
        "best_accuracy": max(point["accuracy"] for point in curve),
        "steps_to_60": passed and passed["step"],
        "samples_to_60": passed and passed["samples"],
        "seconds_to_60": passed and passed["train_s"],
        "curve": curve,
    }


def pathfinder(args: argparse.Namespace, settings: Settings, plan: Plan, device: torch.device) -> dict[str, Any]:
    begin = time.perf_counter()
    splits, source = pathfinder_data(args, settings)
    data = {"source": source, "images": {name: len(labels) for name, (_, labels) in splits.items()}}
    data["load_s"] = time.perf_counter() - begin
    runs = []
    for length in settings.lengths:
        for variant in VARIANTS:
            path = recipe_path(variant, length)
            batch_size = [] if settings.batch_size is None else ["--batch-size", str(settings.batch_size)]
            cfg = parse_config(["--config", str(path), *batch_size])
            train_split, val_split = (splits[split_name(length, split)] for split in SPLITS)
            timing = (plan.train_s, settings.evaluations, device, settings.autocast)
            run = train_pathfinder(cfg, train_split, val_split, *timing)
            runs.append({"variant": variant, "length": length, "recipe": path.as_posix(), **run})
            print(_pathfinder_row(runs[-1]), flush=True)
            _free_memory(device)
    return {"data": data, "runs": runs}


# ----------------------------------------------------------------------------- report


def _throughput_row(r: dict[str, Any]) -> str:
    head = f"| {r['model']}{' (compiled)' if r['compiled'] else ''} | {r['size']}² | {r['batch_size']} | {r['mode']} |"
    if "error" in r:
        return f"{head} cannot run: {r['error'][:80]} | |"
    return f"{head} {r['images_per_s']:.1f} | {r['peak_memory_mb'] / 1024:.2f} |"


def _pathfinder_row(r: dict[str, Any]) -> str:
    to_60 = "not reached" if r["samples_to_60"] is None else f"{r['samples_to_60']:,} ({r['steps_to_60']:,} steps)"
    return (
        f"| {r['variant']} | {r['model']} | {r['length']} | {100 * r['final_accuracy']:.1f} % after "
        f"{r['train_s']:.0f} s | {100 * r['best_accuracy']:.1f} % | {to_60} | {r['images_per_s']:.0f} |"
    )


def _table(header: list[str], rows: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows, ""]


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown tables, each part's under its heading once it has run."""
    lines = [f"# GPU study\n\n`{results['command']}` on {results['device']}, torch {results['torch']}.\n"]
    lines += _table(["planned part", "s"], [f"| {name} | {s:.0f} |" for name, s in results["plan"]["parts"].items()])
    lines += _table(["part", "took s"], [f"| {name} | {s:.0f} |" for name, s in results["took_s"].items()])
    if "correctness" in results:
        rows = [
            f"| {r['model']} | {r['grid'][0]}x{r['grid'][1]} | {r['autocast']} | {r['finite_forward']} | "
            f"{r['finite_backward']} | {r['rel_max_error']:.2e} |"
            for r in results["correctness"]["models"]
        ]
        rows += [
            f"| {r['operator']} (operator) | {r['grid'][0]}x{r['grid'][1]} | {r['autocast']} | {r['finite_forward']} "
            f"| | {r['rel_max_error']:.2e} |"
            for r in results["correctness"]["operator"]
        ]
        header = ["model", "grid (HxW)", "autocast", "finite forward", "finite backward", "rel. max error vs fp32"]
        lines += ["## Correctness under autocast (batch 2)\n", *_table(header, rows)]
    if "throughput" in results:
        header = ["model", "size", "batch", "mode", "images/s", "peak GiB"]
        lines += [f"## Throughput ({results['precision']}, channels-last)\n"]
        lines += _table(header, [_throughput_row(r) for r in results["throughput"]])
    if "pathfinder" in results:
        header = ["variant", "model", "contour length", "val accuracy", "best", "samples to 60 %", "train images/s"]
        source = results["pathfinder"]["data"]["source"]
        lines += [f"## Pathfinder-64, equal training time ({results['precision']}; data: {source})\n"]
        lines += _table(header, [_pathfinder_row(r) for r in results["pathfinder"]["runs"]])
    return "\n".join(lines)


def _write(out: Path, results: dict[str, Any]) -> None:
    write_text(out / "results.json", json.dumps(results, indent=1))
    write_text(out / "results.md", markdown(results))


# ----------------------------------------------------------------------------- command line


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("output/gpu_study"), help="results.json and results.md")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the compact Pathfinder file")
    parser.add_argument("--root", type=Path, default=Path("../shared/data"), help="Parquet sets (smoke fallback)")
    parser.add_argument("--budget-s", type=float, default=None, help="refuse a longer plan (default 540; smoke 12)")
    parser.add_argument("--train-s", type=float, default=None, help="seconds per Pathfinder run (default: budget)")
    parser.add_argument("--compile", action="store_true", help="also the iris models' inference, torch.compile'd")
    parser.add_argument("--smoke", action="store_true", help="every part, tiny, on the CPU")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("The study measures a CUDA GPU and none is available; --smoke checks the script on the CPU.")
    settings = SMOKE if args.smoke else FULL
    budget_s = args.budget_s or (12.0 if args.smoke else 540.0)
    plan = make_plan(settings, budget_s, args.train_s, args.compile)
    print(plan.describe(), flush=True)
    device = torch.device(settings.device)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m benchmarks.gpu_study", *(sys.argv[1:] if argv is None else argv)])
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    results: dict[str, Any] = {"command": command, "device": name, "torch": torch.__version__, "took_s": {}}
    results["precision"] = f"{settings.autocast} autocast" if settings.autocast else "float32"
    results["plan"] = {**dataclasses.asdict(plan), "budget_s": budget_s}
    parts: dict[str, Callable[[], Any]] = {
        "correctness": lambda: correctness(settings, device),
        "throughput": lambda: throughput(settings, device, args.compile),
        "pathfinder": lambda: pathfinder(args, settings, plan, device),
    }
    begin = time.perf_counter()
    for part, run in parts.items():
        started = time.perf_counter()
        results[part] = run()
        results["took_s"][part] = time.perf_counter() - started
        _write(args.out, results)
    results["took_s"]["total"] = time.perf_counter() - begin
    _write(args.out, results)
    print(f"\n{markdown(results)}\nwrote {args.out / 'results.json'} and {args.out / 'results.md'}", flush=True)
    return results


if __name__ == "__main__":
    main()
