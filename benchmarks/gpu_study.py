"""One GPU study in one command: CUDA correctness of the iris models, throughput and memory against timm peers, and
the Pathfinder study (``benchmarks.pathfinder_study``) trained on the GPU, all within a time budget.

    python -m benchmarks.pack_pathfinder                       # once: the data and wheels that travel (see below)
    python -m benchmarks.gpu_study --out output/gpu_study      # one CUDA GPU, 540 s by default
    python -m benchmarks.gpu_study --smoke --out output/gpu_study_smoke   # every part, tiny, on the CPU

Parts, each written to ``results.json`` and ``results.md`` in ``--out`` as soon as it ends:

1. data: the Pathfinder sets the runs read, ``--root`` as it is when it holds them, else unpacked into it from the
   compact file ``--data`` (:func:`benchmarks.pack_pathfinder.unpack`);
2. correctness: every registered ``iris_*`` model, forward and backward under bf16 and fp16 autocast on odd,
   non-square grids (finite or not), and the largest error of the model's output and of one CDR operator's against
   float32, relative to the float32 output's largest magnitude;
3. throughput: training step and inference images/s and peak memory (``torch.cuda.max_memory_allocated``) at 224²
   and 1024², bf16 autocast, channels-last (:func:`iris_timm.tools.benchmark.measure`); with ``--compile`` also the iris
   models' inference under ``torch.compile``, which needs a larger budget (``--budget-s 600``);
4. pathfinder: the study's variants at a budget in samples (400k), every run trained by
   :func:`benchmarks.pathfinder_study.run_all` through ``iris_timm.training.fit`` (the code ``train.py`` runs) with
   the study's recipe, ``--mixed-precision bf16``, into run folders under ``--out``/pathfinder, several runs at a time
   sharing the GPU; then the study's table: validation accuracy every 40k samples, the samples to 60 %.

The plan comes first: the seconds of each part, the Pathfinder runs estimated from their samples and a stated pace
per variant (``Settings.step_s``; the results give each run's measured images/s). It takes every variant at contour
length 9 with seeds 0 and 1, then lengths 6 and 14 as the budget allows, longest runs first, and refuses to start
if even the first groups exceed ``--budget-s``. Runs still going when the budget runs out are stopped by SIGTERM,
each with a checkpoint of its last step and its evaluations, and runs not yet started are skipped: the table shows
how far each got.

The machine may be offline: it needs the checkout, ``output/pathfinder64.npz`` and, where PyTorch's image lacks
``datasets``, the wheels in ``output/wheels`` (installed with ``pip install --no-index --no-deps --target``).
"""

import argparse
import dataclasses
import gc
import heapq
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import timm
import torch

import iris_timm  # noqa: F401  (registers the iris_* models)
from benchmarks import pathfinder_study
from benchmarks.pack_pathfinder import DEFAULT_OUT as DEFAULT_DATA
from benchmarks.pack_pathfinder import FOLDERS, SPLITS, parquet_paths, split_name, unpack
from iris_timm.files import write_text
from iris_timm.layers import ConvectionDiffusionReaction2d, create_cdr
from iris_timm.tools.benchmark import measure
from iris_timm.training import parse_config
from iris_timm.training.memory_data import save_compact
from iris_timm.training.run_folder import read_summary

__all__ = ["Plan", "Settings", "check_model", "check_operator", "main", "make_plan", "makespan", "markdown"]

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
MIXED_PRECISION = "bf16"  # the Pathfinder runs' --mixed-precision
SMOKE_IMAGES = 128  # per split: two training steps of the study's batch
Run = tuple[int, int, str]  # (contour length, seed, variant), as pathfinder_study.run_all takes them


@dataclass
class Settings:
    """What the full study and the smoke run differ in. Seconds are estimates for the plan."""

    device: str
    autocast: str | None  # correctness and throughput; None: float32 (CPUs without bf16 matmuls are slow in it)
    iris_models: list[str]
    grids: list[tuple[int, int]]  # (H, W), odd and non-square
    peers: list[str]
    throughput_models: list[str]
    batch_sizes: dict[int, int]  # throughput input size -> batch size
    warmup: int  # untimed throughput steps
    min_run_time: float  # seconds of timed throughput steps (torch.utils.benchmark's blocked_autorange)
    variants: list[str]  # Pathfinder study variants
    groups: list[tuple[int, int]]  # (contour length, seed) of each group of runs, every variant, by priority
    min_groups: int  # a plan without this many groups is refused
    samples: int  # training samples per Pathfinder run
    eval_samples: int  # between evaluations
    jobs: int  # Pathfinder runs at a time
    limit: int | None  # unpack the first N images of each split
    startup_s: float  # CUDA context
    data_s: float  # unpacking the Pathfinder sets
    check_s: float  # one (model, grid, autocast) correctness check
    record_s: float  # one throughput (model, size, mode), excluding compilation
    compile_s: float  # torch.compile of one throughput record
    step_s: dict[str, float]  # one training step (the recipe's batch) of each variant while `jobs` runs share it
    run_overhead_s: float  # one run besides its steps: process start, data, evaluations, checkpoints


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
    variants=list(pathfinder_study.VARIANTS),
    groups=[(9, 0), (9, 1), (6, 0), (14, 0), (6, 1), (14, 1)],
    min_groups=2,
    samples=pathfinder_study.SAMPLES,
    eval_samples=pathfinder_study.EVAL_SAMPLES,
    jobs=5,
    limit=None,
    startup_s=20.0,
    data_s=20.0,
    check_s=1.0,
    record_s=4.0,
    compile_s=45.0,
    # Not measured. Eager PyTorch dispatches each operator from Python, some 10 µs apiece on these small tensors;
    # a step dispatches about 260 (frame), 600 (spectral), 2,100 (cdr_full), 2,500 (cdr) or 2,800 (cdr_dynamic)
    # of them (counted on a CPU) besides the trainer's own; five runs share the GPU, taking turns on it.
    step_s={"frame": 0.008, "cdr": 0.024, "cdr_full": 0.024, "cdr_dynamic": 0.034, "spectral": 0.014},
    run_overhead_s=15.0,
)
SMOKE = Settings(
    device="cpu",
    autocast=None,
    iris_models=["iris_pdessm_test"],
    # At least 17 a side: torch's CPU bf16 convolution backward can return NaN weight gradients for an input one
    # pixel wide (a 17x11 image is 2x1 at the last stage's downsample).
    grids=[(21, 19)],
    peers=[],  # the same code path as the iris models
    throughput_models=["iris_pdessm_test"],
    batch_sizes={32: 2},
    warmup=1,
    min_run_time=0.01,
    variants=["frame", "cdr"],
    groups=[(9, 0)],
    min_groups=1,
    samples=128,  # two steps
    eval_samples=64,
    jobs=2,
    limit=SMOKE_IMAGES,
    startup_s=3.0,
    data_s=2.0,
    check_s=0.3,
    record_s=0.5,
    compile_s=30.0,
    step_s={"frame": 0.3, "cdr": 0.6},
    run_overhead_s=20.0,  # process start on a busy 2-core machine
)


@dataclass
class Plan:
    parts: dict[str, float]  # estimated seconds
    runs: list[Run]  # Pathfinder runs, in the order they start
    samples: int  # per Pathfinder run
    jobs: int  # Pathfinder runs at a time
    run_s: dict[str, float]  # estimated seconds of one run of each variant

    @property
    def total_s(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        lines = [f"  {name:<38} {seconds:7.1f} s" for name, seconds in self.parts.items()]
        groups = ", ".join(map(str, dict.fromkeys((length, seed) for length, seed, _ in self.runs)))  # by priority
        one_run = ", ".join(f"{variant} {seconds:.0f} s" for variant, seconds in self.run_s.items())
        return "\n".join(
            [
                "plan:",
                *lines,
                f"  {'total':<38} {self.total_s:7.1f} s",
                f"  pathfinder (length, seed): {groups}, every variant, {self.samples:,} samples a run",
                f"  pathfinder, one run: {one_run}",
            ]
        )


def makespan(seconds: list[float], jobs: int) -> float:
    """Wall seconds of runs started in this order by ``jobs`` workers, each taking the next run when it is free."""
    free = [0.0] * jobs  # when each worker is free, a heap
    for run_s in seconds:
        heapq.heapreplace(free, free[0] + run_s)
    return max(free)


def recipe_batch_size() -> int:
    return parse_config(["--config", str(pathfinder_study.RECIPE)]).batch_size


def make_plan(settings: Settings, budget_s: float, samples: int, jobs: int, compile: bool) -> Plan:
    """Seconds per part (10 % of the budget kept as margin), with the first ``settings.min_groups`` groups of
    Pathfinder runs and each further group that still fits the budget; refuses a plan over the budget."""
    cases = throughput_cases(settings, compile)
    checks = len(settings.iris_models or iris_models()) * len(settings.grids) * len(AUTOCAST)
    parts = {
        "startup": settings.startup_s,
        "data": settings.data_s,
        "correctness": checks * settings.check_s,
        "throughput": sum(settings.record_s + settings.compile_s * compiled for *_, compiled in cases),
    }
    steps = samples // recipe_batch_size()
    run_s = {v: settings.run_overhead_s + steps * settings.step_s[v] for v in settings.variants}

    def plan_for(groups: list[tuple[int, int]]) -> Plan:
        # Longest first: the short runs fill the workers' last gaps.
        runs = sorted(((n, seed, v) for n, seed in groups for v in settings.variants), key=lambda r: -run_s[r[2]])
        name = f"pathfinder ({len(runs)} runs, {jobs} at a time)"
        pathfinder = makespan([run_s[v] for *_, v in runs], jobs)
        return Plan({**parts, name: pathfinder, "margin": 0.1 * budget_s}, runs, samples, jobs, run_s)

    plan = plan_for(settings.groups[: settings.min_groups])
    if plan.total_s > budget_s + 1e-6:
        raise SystemExit(
            f"{plan.describe()}\nThe plan exceeds the budget of {budget_s:.0f} s: raise --budget-s, lower --samples, "
            "or drop --compile."
        )
    for count in range(settings.min_groups + 1, len(settings.groups) + 1):
        larger = plan_for(settings.groups[:count])
        if larger.total_s > budget_s + 1e-6:
            break
        plan = larger
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


def made_up_splits(images: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Noise images (N, 1, 64, 64) uint8 with alternating labels, for every length's train and val split."""
    generator = torch.Generator().manual_seed(0)
    return {
        split_name(length, split): (
            torch.randint(0, 256, (images, 1, 64, 64), dtype=torch.uint8, generator=generator),
            torch.arange(images) % 2,
        )
        for length in FOLDERS
        for split in SPLITS
    }


def pathfinder_data(args: argparse.Namespace, settings: Settings, lengths: list[int]) -> dict[str, Any]:
    """The Parquet sets the runs read, under ``args.root``: as they are when it holds them all, else unpacked from
    ``args.data``; the smoke run makes that file up from noise when it is absent. Where they came from, their
    images by split."""
    paths = parquet_paths(args.root, lengths)
    if all(path.is_file() for path in paths.values()):
        source = str(args.root)
    else:
        compact = args.data
        if not compact.is_file() and not args.smoke:
            raise SystemExit(f"{compact} does not exist: make it with `python -m benchmarks.pack_pathfinder`.")
        if not compact.is_file():
            compact = args.out / "pathfinder64_smoke.npz"
            save_compact(compact, made_up_splits(SMOKE_IMAGES), ["disconnected", "connected"])
        unpack(compact, args.root, lengths, settings.limit)
        source = f"{compact}" + (f", first {settings.limit} images of each split" if settings.limit else "")
    images = {name: pq.ParquetFile(path).metadata.num_rows for name, path in paths.items()}
    return {"source": source, "root": str(args.root), "images": images}


def _log_tail(folder: Path, lines: int = 5) -> list[str]:
    log = folder / "study.log"
    return log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []


def run_record(
    out: Path, run: Run, code: int | None, result: pathfinder_study.RunResult | None, eval_samples: int
) -> dict[str, Any]:
    """One run's outcome: its exit status (None: not started), evaluations, samples to the target (evaluations every
    ``eval_samples``) and pace; the end of its log when it failed."""
    length, seed, variant = run
    folder = pathfinder_study.run_folder(out, variant, length, seed)
    summary = read_summary(folder) if folder.is_dir() else None
    record: dict[str, Any] = {"variant": variant, "length": length, "seed": seed, "exit": code}
    if result is not None:
        record["evaluations"] = [
            {"samples": e.step * result.batch_size, "top1": e.accuracy["top1"], "train_s": e.train_time_s}
            for e in result.evaluations
        ]
        record[f"samples_to_{pathfinder_study.TARGET_TOP1:.0f}"] = result.samples_to(
            pathfinder_study.TARGET_TOP1, eval_samples
        )
    record["train_images_per_s"] = summary.train_images_per_s if summary else None
    if code:
        record["log"] = _log_tail(folder)
    return record


def pathfinder(args: argparse.Namespace, settings: Settings, plan: Plan, deadline: float) -> dict[str, Any]:
    """The plan's runs through the Pathfinder study's own runner, then its table over their folders."""
    out, eval_samples, jobs = args.out / "pathfinder", settings.eval_samples, plan.jobs
    options = ["--mixed-precision", MIXED_PRECISION, "--num-threads", str(max(1, (os.cpu_count() or 1) // jobs))]
    codes = pathfinder_study.run_all(plan.runs, plan.samples, eval_samples, args.root, out, jobs, options, deadline)
    results = {(r.length, r.seed, r.variant): r for r in pathfinder_study.read_results(out)}
    records = [run_record(out, run, code, results.get(run), eval_samples) for run, code in codes.items()]
    for r in records:
        if r["exit"]:  # the run folders may stay on the machine: the reason goes into the output
            print(f"length {r['length']} {r['variant']} seed {r['seed']}: exit {r['exit']}", *r["log"], sep="\n  ")
    table = pathfinder_study.table(list(results.values()), plan.samples, eval_samples)
    return {"options": options, "jobs": jobs, "samples": plan.samples, "runs": records, "table": table}


# ----------------------------------------------------------------------------- report


def _throughput_row(r: dict[str, Any]) -> str:
    head = f"| {r['model']}{' (compiled)' if r['compiled'] else ''} | {r['size']}² | {r['batch_size']} | {r['mode']} |"
    if "error" in r:
        return f"{head} cannot run: {r['error'][:80]} | |"
    return f"{head} {r['images_per_s']:.1f} | {r['peak_memory_mb'] / 1024:.2f} |"


def _run_state(r: dict[str, Any]) -> str:
    return {None: "not started", 0: "finished"}.get(r["exit"], f"stopped (exit {r['exit']})")


def _pathfinder_section(results: dict[str, Any]) -> list[str]:
    part, data = results["pathfinder"], results["data"]
    lines = [
        f"## Pathfinder-64 study ({len(part['runs'])} runs of {part['samples']:,} samples, "
        f"`{' '.join(part['options'])}`, {part['jobs']} at a time; data: {data['source']})\n",
        part["table"],
    ]
    rows = [
        f"| {r['length']} | {r['variant']} | {r['seed']} | {_run_state(r)} | "
        + ("–" if r["train_images_per_s"] is None else f"{r['train_images_per_s']:.0f}")
        + " |"
        for r in part["runs"]
    ]
    return [*lines, *_table(["length", "variant", "seed", "run", "train images/s"], rows)]


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
        lines += _pathfinder_section(results)
    return "\n".join(lines)


def _write(out: Path, results: dict[str, Any]) -> None:
    write_text(out / "results.json", json.dumps(results, indent=1))
    write_text(out / "results.md", markdown(results))


# ----------------------------------------------------------------------------- command line


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("output/gpu_study"), help="results and Pathfinder runs")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the compact Pathfinder file")
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="the Pathfinder Parquet sets, unpacked from --data when absent (default output/pathfinder_sets; smoke: "
        "in --out)",
    )
    parser.add_argument("--budget-s", type=float, default=None, help="refuse a longer plan (default 540; smoke 120)")
    parser.add_argument("--samples", type=int, default=None, help="training samples per Pathfinder run")
    parser.add_argument("--jobs", type=int, default=None, help="Pathfinder runs at a time (default 5; smoke 2)")
    parser.add_argument("--compile", action="store_true", help="also the iris models' inference, torch.compile'd")
    parser.add_argument("--smoke", action="store_true", help="every part, tiny, on the CPU")
    args = parser.parse_args(argv)
    if args.root is None:
        args.root = args.out / "pathfinder_sets" if args.smoke else Path("output/pathfinder_sets")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("The study measures a CUDA GPU and none is available; --smoke checks the script on the CPU.")
    settings = SMOKE if args.smoke else FULL
    budget_s = args.budget_s or (120.0 if args.smoke else 540.0)
    deadline = time.monotonic() + budget_s  # Pathfinder runs still going then are stopped
    plan = make_plan(settings, budget_s, args.samples or settings.samples, args.jobs or settings.jobs, args.compile)
    print(plan.describe(), flush=True)
    device = torch.device(settings.device)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m benchmarks.gpu_study", *(sys.argv[1:] if argv is None else argv)])
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    results: dict[str, Any] = {"command": command, "device": name, "torch": torch.__version__, "took_s": {}}
    results["precision"] = f"{settings.autocast} autocast" if settings.autocast else "float32"
    results["plan"] = {**dataclasses.asdict(plan), "budget_s": budget_s}
    lengths = sorted({length for length, *_ in plan.runs})
    parts: dict[str, Callable[[], Any]] = {  # the data first: a missing file stops the study before it spends time
        "data": lambda: pathfinder_data(args, settings, lengths),
        "correctness": lambda: correctness(settings, device),
        "throughput": lambda: throughput(settings, device, args.compile),
        "pathfinder": lambda: pathfinder(args, settings, plan, deadline),
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
