"""Inference speed of iris models against timm peers, eager in float32 and bfloat16 autocast and in ONNX Runtime, as
one table of images/s and ratios to a baseline model.

python -m iris_timm.tools.benchmark                       # the table: CPU, 1 thread, 224² (batch 8) and 1024² (batch 1)
python -m iris_timm.tools.benchmark --modes fp32 train --sizes 224 384 512
python -m iris_timm.tools.benchmark --device cuda --modes fp32 bf16 --channels-last --threads 16 --sizes 224 1024 2048

Modes: ``fp32`` (eager, float32), ``bf16`` (eager, under bfloat16 autocast), ``onnxruntime`` (the model exported by
:func:`iris_timm.export.to_onnx` for its size, any batch, run by ONNX Runtime's CPU provider with ``--threads``
threads; the ``--onnx-models`` only) and ``train`` (a float32 training step: forward, cross-entropy, backward and
an SGD update). Every (model, size, mode) runs in a fresh subprocess, so one model's allocations never count
against another and a model that fails at a size (out of memory, a fixed input size) is reported with its reason;
``--rounds`` repeats the whole sweep and takes each figure's median over the rounds, so that a change in the
machine's load reaches every model alike.

* Time: ``--warmup`` untimed steps, then ``torch.utils.benchmark.Timer(...).blocked_autorange`` for at least
  ``--min-run-time`` seconds (it synchronises the accelerator); images/s is the batch over the median seconds per
  step of the timed blocks, the JSON keeps each block's.
* Ratio: images/s over the ``--baseline`` model's in the same mode at the same size.
* Peak memory (JSON): on CUDA ``torch.cuda.max_memory_allocated``; on the CPU the process's peak resident set
  (``getrusage(RUSAGE_SELF).ru_maxrss``) minus the resident set measured after imports and before the model is
  built: weights, activations and workspace, without the Python and torch runtime.
* GMACs (JSON, fp32 records): :func:`iris_timm.flops.count_macs` on one image (it counts FFTs, which common
  counters skip).
"""

import argparse
import json
import math
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark

from iris_timm.files import MissingExtra, import_pyplot, write_text

__all__ = [
    "MODES",
    "TARGETS",
    "Target",
    "check_targets",
    "default_batch_size",
    "format_table",
    "main",
    "measure",
    "measure_onnxruntime",
    "merge_rounds",
    "timed",
    "training_step",
]

DEFAULT_MODELS = ["iris_pdessm_t", "iris_pdessm_s"]
DEFAULT_PEERS = ["convnext_tiny", "mambaout_tiny", "deit_small_patch16_224"]
DEFAULT_SIZES = [224, 1024]
MODES = ("fp32", "bf16", "onnxruntime", "train")
DEFAULT_MODES = ["fp32", "bf16", "onnxruntime"]
DEFAULT_ONNX_MODELS = ["iris_pdessm_s", "convnext_tiny"]
BASELINE = "convnext_tiny"


def default_batch_size(size: int) -> int:
    """8 images at 224² (the ImageNet setting), 1 above (the dense-prediction setting)."""
    return 8 if size <= 224 else 1


def _rss_bytes() -> int:
    """Current resident set of this process (Linux ``/proc``; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _build(name: str, size: int, device: torch.device, dtype: torch.dtype, channels_last: bool) -> torch.nn.Module:
    import iris_timm  # noqa: F401  (registers the iris_* models)
    from iris_timm.flops import create_model_for_size

    model = create_model_for_size(name, size).to(device=device, dtype=dtype)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def training_step(
    model: Callable[[torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    target: torch.Tensor,
    autocast: Any,
) -> Callable[[], None]:
    """One training step to time: the forward under ``autocast``, cross-entropy in float32, backward, update."""

    def step() -> None:
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x).float(), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def timed(call: Callable[[], Any], min_run_time: float, warmup: int = 0) -> benchmark.Measurement:
    """``call`` after ``warmup`` untimed calls, timed by ``torch.utils.benchmark.Timer.blocked_autorange`` over at least
    ``min_run_time`` seconds: the measurement's ``median`` and per-block ``times`` are seconds per call."""
    for _ in range(warmup):
        call()
    return benchmark.Timer(stmt="call()", globals={"call": call}).blocked_autorange(min_run_time=min_run_time)


def _profile_table(step: Callable[[], None], rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def measure(
    name: str,
    size: int,
    batch_size: int,
    train: bool,
    device: str = "cpu",
    dtype: str = "float32",
    amp: bool = False,
    channels_last: bool = False,
    compile: bool = False,
    warmup: int = 2,
    min_run_time: float = 1.0,
    profile: bool = False,
    count: bool = True,
) -> dict[str, Any]:
    """Measure one eager model at one size in this process (the benchmark runs it in a fresh subprocess); ``count``
    adds its parameters and GMACs."""
    from iris_timm.flops import count_macs, count_params

    dev = torch.device(device)
    baseline_rss = _rss_bytes()
    model = _build(name, size, dev, getattr(torch, dtype), channels_last)
    record: dict[str, Any] = {}
    if count:
        record.update(params=count_params(model), gmacs=count_macs(model, (3, size, size), device=dev) / 1e9)
    x = torch.randn(batch_size, 3, size, size, device=dev, dtype=getattr(torch, dtype))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    run = torch.compile(model) if compile else model
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16) if amp else nullcontext()

    if train:
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        step = training_step(run, optimizer, x, torch.randint(0, 1000, (batch_size,), device=dev), autocast)
    else:
        model.eval()

        @torch.inference_mode()
        def step() -> None:
            with autocast:
                run(x)

    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    measurement = timed(step, min_run_time, warmup)
    if dev.type == "cuda":
        record["peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        record["peak_memory_mb"] = (_peak_rss_bytes() - baseline_rss) / 2**20
    record["seconds"] = measurement.times
    record["images_per_s"] = batch_size / measurement.median
    if profile:
        record["profile"] = _profile_table(step)
    return record


def measure_onnxruntime(
    name: str, size: int, batch_size: int, threads: int = 1, warmup: int = 2, min_run_time: float = 1.0
) -> dict[str, Any]:
    """Measure one model exported to ONNX (:func:`iris_timm.export.to_onnx`, float32, this size, any batch) in ONNX
    Runtime's CPU provider with ``threads`` threads, in this process; the export's seconds are kept, not its memory
    (the exporter's own would count)."""
    import numpy as np
    import onnxruntime

    from iris_timm.export import to_onnx

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        model = _build(name, size, torch.device("cpu"), torch.float32, False).eval()
        path = to_onnx(model, Path(folder) / "model.onnx", (3, size, size))
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    export_s = time.perf_counter() - start
    x = np.random.default_rng(0).standard_normal((batch_size, 3, size, size), dtype=np.float32)
    measurement = timed(lambda: session.run(None, {"images": x}), min_run_time, warmup)
    return {"export_s": export_s, "seconds": measurement.times, "images_per_s": batch_size / measurement.median}


def _run_isolated(args: argparse.Namespace, name: str, size: int, mode: str) -> dict[str, Any]:
    """Measure one model, size and mode in a fresh interpreter; a failure becomes ``{'error': reason}``."""
    batch_size = args.batch_size or default_batch_size(size)
    timing = dict(name=name, size=size, batch_size=batch_size, warmup=args.warmup, min_run_time=args.min_run_time)
    if mode == "onnxruntime":
        call, kwargs = "measure_onnxruntime", dict(timing, threads=args.threads)
    else:
        call = "measure"
        kwargs = dict(
            timing,
            train=mode == "train",
            device=args.device,
            amp=mode == "bf16",
            channels_last=args.channels_last,
            compile=args.compile,
            profile=args.profile and name.startswith("iris_"),
            count=mode == "fp32",
        )
    code = (
        "import json, sys, torch\n"
        f"torch.set_num_threads({args.threads})\n"
        f"from iris_timm.tools.benchmark import {call}\n"
        f"print('@@' + json.dumps({call}(**json.loads(sys.argv[1]))))\n"
    )
    base = {"model": name, "size": size, "batch_size": batch_size, "mode": mode}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {args.timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith("@@"):
            return {**base, **json.loads(line[2:])}
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit status {done.returncode}"
    if done.returncode < 0:
        reason = f"killed by signal {-done.returncode} (out of memory?)"
    return {**base, "error": reason}


def merge_rounds(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per (model, size, mode): its images/s the median over the rounds, every timed block kept; an error
    in any round is the record's error."""
    merged = []
    for records in zip(*rounds, strict=True):
        failed = [r for r in records if "error" in r]
        if failed:
            merged.append(failed[0])
            continue
        record = {**records[0], "images_per_s": statistics.median(r["images_per_s"] for r in records)}
        record["seconds"] = [t for r in records for t in r["seconds"]]
        record["rounds"] = [r["images_per_s"] for r in records]
        merged.append(record)
    return merged


def _by_key(records: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(r["model"], r["size"], r["mode"]): r for r in records if "error" not in r}


class Target:
    """``iris images/s ÷ peer images/s`` (or a memory or scaling ratio) in float32 eager, compared with a bound."""

    def __init__(self, text: str, ratio: Callable[[dict], float | None], bound: float, at_least: bool = True):
        self.text, self.ratio, self.bound, self.at_least = text, ratio, bound, at_least

    def check(self, table: dict) -> tuple[str, float | None]:
        value = self.ratio(table)
        if value is None:
            return "NOT MEASURED", None
        passed = value >= self.bound if self.at_least else value <= self.bound
        return ("PASS" if passed else "FAIL"), value


def _ratio(model: str, peer: str, size: int, key: str = "images_per_s") -> Callable[[dict], float | None]:
    def ratio(table: dict) -> float | None:
        a, b = table.get((model, size, "fp32"), {}), table.get((peer, size, "fp32"), {})
        return a[key] / b[key] if key in a and key in b else None

    return ratio


def _scaling_exponent(model: str, low: int, high: int) -> Callable[[dict], float | None]:
    """Exponent p with (time per image at high) / (time per image at low) = (pixel ratio)^p."""

    def exponent(table: dict) -> float | None:
        a, b = table.get((model, low, "fp32"), {}), table.get((model, high, "fp32"), {})
        if "images_per_s" not in a or "images_per_s" not in b:
            return None
        return math.log(a["images_per_s"] / b["images_per_s"]) / math.log((high / low) ** 2)

    return exponent


IRIS, VIT, CONVNEXT, MAMBAOUT = "iris_pdessm_s", "deit_small_patch16_224", "convnext_tiny", "mambaout_tiny"
TARGETS = [
    Target(f"224²: {IRIS} / {VIT} images/s >= 1.0", _ratio(IRIS, VIT, 224), 1.0),
    Target(f"224²: {IRIS} / {CONVNEXT} images/s >= 1.0", _ratio(IRIS, CONVNEXT, 224), 1.0),
    Target(f"224²: {IRIS} / {MAMBAOUT} images/s >= 1.2", _ratio(IRIS, MAMBAOUT, 224), 1.2),
    Target(f"1024²: {IRIS} / {VIT} images/s >= 2.0", _ratio(IRIS, VIT, 1024), 2.0),
    Target(f"1024²: {IRIS} / {CONVNEXT} images/s >= 1.2", _ratio(IRIS, CONVNEXT, 1024), 1.2),
    Target(f"1024²: {IRIS} / {VIT} peak memory <= 0.3", _ratio(IRIS, VIT, 1024, "peak_memory_mb"), 0.3, False),
    Target(
        f"1024²: {IRIS} / {CONVNEXT} peak memory <= 1.0", _ratio(IRIS, CONVNEXT, 1024, "peak_memory_mb"), 1.0, False
    ),
    Target(f"224²→1024²: {IRIS} time/image ~ (pixels)^p, p <= 1.1", _scaling_exponent(IRIS, 224, 1024), 1.1, False),
]


def check_targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate :data:`TARGETS` on the measured records (float32 eager inference, same run)."""
    table = _by_key(records)
    results = []
    for target in TARGETS:
        verdict, value = target.check(table)
        results.append({"target": target.text, "verdict": verdict, "measured": value})
    return results


def format_table(records: list[dict[str, Any]], baseline: str = BASELINE) -> str:
    """One row per mode and model, two columns per size: images/s, and the ratio to ``baseline``'s images/s in the
    same mode and size; ``-`` where a model was not measured or has no baseline, ``error`` where it failed."""
    sizes = list(dict.fromkeys(r["size"] for r in records))
    rows = list(dict.fromkeys((r["mode"], r["model"]) for r in records))
    by_key, found = _by_key(records), {(r["model"], r["size"], r["mode"]): r for r in records}
    batches = {size: found[next(k for k in found if k[1] == size)]["batch_size"] for size in sizes}
    header = f"{'mode':<12} {'model':<24}" + "".join(
        f" {f'{size}² b{batches[size]} img/s':>17} {f'× {baseline}':>{len(baseline) + 2}}" for size in sizes
    )
    lines = [header]
    for mode, model in rows:
        line = f"{mode:<12} {model:<24}"
        for size in sizes:
            record, reference = by_key.get((model, size, mode)), by_key.get((baseline, size, mode))
            if record is None:
                speed = "error" if (model, size, mode) in found else "-"
                line += f" {speed:>17} {'-':>{len(baseline) + 2}}"
                continue
            ratio = f"{record['images_per_s'] / reference['images_per_s']:.2f}" if reference else "-"
            line += f" {record['images_per_s']:>17.2f} {ratio:>{len(baseline) + 2}}"
        lines.append(line)
    errors = [r for r in records if "error" in r]
    lines += [f"error: {r['mode']} {r['model']} {r['size']}²: {r['error'][:200]}" for r in errors]
    return "\n".join(lines)


def _plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = import_pyplot(alternative="pass --no-plot")

    fig, ax = plt.subplots(figsize=(7, 4.8))
    for mode, model in dict.fromkeys((r["mode"], r["model"]) for r in records):
        points = [
            (r["size"], r["images_per_s"])
            for r in records
            if (r["mode"], r["model"]) == (mode, model) and "images_per_s" in r
        ]
        if points:
            sizes, values = zip(*points, strict=True)
            width = 2.5 if model.startswith("iris_") else 1.2
            ax.plot(sizes, values, marker="o", linewidth=width, label=f"{model} ({mode})")
    sizes = sorted({r["size"] for r in records})
    ax.set(xscale="log", yscale="log", xlabel="input size (pixels per side)", ylabel="images/s")
    ax.set_xticks(sizes, labels=[str(s) for s in sizes])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="iris models")
    parser.add_argument("--peers", nargs="*", default=DEFAULT_PEERS, help="timm models to compare with")
    parser.add_argument("--baseline", default=BASELINE, help="the model every ratio divides by")
    parser.add_argument("--sizes", nargs="+", type=int, default=DEFAULT_SIZES, help="square input sizes")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 8 at 224 and below, 1 above")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=DEFAULT_MODES)
    parser.add_argument("--onnx-models", nargs="*", default=DEFAULT_ONNX_MODELS, help="the models onnxruntime runs")
    parser.add_argument("--device", default="cpu", help="of the eager modes")
    parser.add_argument("--channels-last", action="store_true", help="eager modes")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model (eager modes)")
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime threads (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="sweeps; each figure is the median over them")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timed steps")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per model, size and mode")
    parser.add_argument("--profile", action="store_true", help="torch.profiler top ops of the iris models")
    parser.add_argument("--out", type=Path, default=Path("benchmark_results"), help="JSON and PNG go here")
    parser.add_argument("--no-plot", action="store_true")
    return parser.parse_args(argv)


def _sweep(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(model, size, mode) in the order they run: by size and mode, every model of one mode one after another."""
    models = list(dict.fromkeys([*args.models, *args.peers]))
    return [
        (name, size, mode)
        for size in args.sizes
        for mode in args.modes
        for name in models
        if mode != "onnxruntime" or name in args.onnx_models
    ]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = _parse(argv)
    setting = (
        f"device={args.device} threads={args.threads} channels_last={args.channels_last} compile={args.compile} "
        f"rounds={args.rounds} torch={torch.__version__}"
    )
    print(setting, flush=True)
    rounds = []
    for round_index in range(args.rounds):
        records = []
        for name, size, mode in _sweep(args):
            record = _run_isolated(args, name, size, mode)
            records.append(record)
            speed = f"{record['images_per_s']:.2f} images/s" if "error" not in record else record["error"][:200]
            print(f"round {round_index + 1}: {mode} {name} {size}² batch {record['batch_size']}: {speed}", flush=True)
            if "profile" in record:
                print(record["profile"], flush=True)
        rounds.append(records)
    records = merge_rounds(rounds)

    print("\n" + format_table(records, args.baseline))
    targets = check_targets(records)
    print("\ntargets (fp32 inference, this run):")
    for t in targets:
        value = "-" if t["measured"] is None else f"{t['measured']:.2f}"
        print(f"  {t['verdict']:<12} {value:>6}  {t['target']}")

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(["python -m iris_timm.tools.benchmark", *(argv or sys.argv[1:])]), "setting": setting}
    meta["machine"] = f"{platform.processor() or platform.machine()} {platform.platform()}"
    write_text(args.out / "benchmark.json", json.dumps({**meta, "records": records, "targets": targets}, indent=1))
    if not args.no_plot:
        _plot(records, args.out / "benchmark.png", setting)
    print(f"\nwrote {args.out / 'benchmark.json'}" + ("" if args.no_plot else f" and {args.out / 'benchmark.png'}"))
    return records


if __name__ == "__main__":
    try:
        main()
    except MissingExtra as error:
        raise SystemExit(str(error)) from None
