"""Throughput, memory, parameters and GMACs of iris models and timm peers over resolutions, side by side.

python -m iris_timm.tools.benchmark                                    # defaults: CPU, 1 thread, fp32
python -m iris_timm.tools.benchmark --sizes 224 1024 --peers deit_small_patch16_224 convnext_tiny
python -m iris_timm.tools.benchmark --device cuda --amp --channels-last --sizes 224 512 1024 2048

Every (model, size, mode) runs in a fresh subprocess, so one model's allocations never count against
another and a model that fails at a size (out of memory, a fixed input size) is reported with its reason.

* Time: ``--warmup`` untimed steps, then ``torch.utils.benchmark.Timer(...).blocked_autorange`` for at least
  ``--min-run-time`` seconds (it synchronises the accelerator); the table shows the median seconds per step over
  the timed blocks, the JSON keeps each block's.
  A training step is forward, cross-entropy, backward and an SGD update.
* Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on the CPU the process's peak resident set
  (``getrusage(RUSAGE_SELF).ru_maxrss``) minus the resident set measured after imports and before the
  model is built: weights, activations and workspace, without the Python and torch runtime.
* GMACs: :func:`iris_timm.flops.count_macs` on one image (it counts FFTs, which common counters skip).
"""

import argparse
import json
import math
import platform
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark

from iris_timm.files import MissingExtra, import_pyplot, write_text

__all__ = ["TARGETS", "Target", "check_targets", "main", "measure", "timed"]

DEFAULT_MODELS = ["iris_pdessm_s"]
DEFAULT_PEERS = [
    "deit_small_patch16_224",
    "convnext_tiny",
    "swin_tiny_patch4_window7_224",
    "mambaout_tiny",
    "resnet50",
]
DEFAULT_SIZES = [224, 384, 512, 768, 1024]


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
) -> dict[str, Any]:
    """Measure one model at one size in this process (the benchmark runs it in a fresh subprocess)."""
    from iris_timm.flops import count_macs, count_params

    dev = torch.device(device)
    baseline_rss = _rss_bytes()
    model = _build(name, size, dev, getattr(torch, dtype), channels_last)
    record: dict[str, Any] = {"params": count_params(model)}
    record["gmacs"] = count_macs(model, (3, size, size), device=dev) / 1e9
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


def _run_isolated(args: argparse.Namespace, name: str, size: int, train: bool) -> dict[str, Any]:
    """Run :func:`measure` in a fresh interpreter; a failure becomes ``{'error': reason}``."""
    batch_size = args.batch_size or default_batch_size(size)
    kwargs = dict(
        name=name,
        size=size,
        batch_size=batch_size,
        train=train,
        device=args.device,
        dtype=args.dtype,
        amp=args.amp,
        channels_last=args.channels_last,
        compile=args.compile,
        warmup=args.warmup,
        min_run_time=args.min_run_time,
        profile=args.profile and name.startswith("iris_"),
    )
    code = (
        "import json, sys, torch\n"
        f"torch.set_num_threads({args.threads})\n"
        "from iris_timm.tools.benchmark import measure\n"
        "print('@@' + json.dumps(measure(**json.loads(sys.argv[1]))))\n"
    )
    base = {"model": name, "size": size, "batch_size": batch_size, "mode": "train" if train else "infer"}
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


class Target:
    """``iris images/s ÷ peer images/s`` (or a memory or scaling ratio) compared with a bound."""

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
        a, b = table.get((model, size, "infer"), {}), table.get((peer, size, "infer"), {})
        return a[key] / b[key] if key in a and key in b else None

    return ratio


def _scaling_exponent(model: str, low: int, high: int) -> Callable[[dict], float | None]:
    """Exponent p with (time per image at high) / (time per image at low) = (pixel ratio)^p."""

    def exponent(table: dict) -> float | None:
        a, b = table.get((model, low, "infer"), {}), table.get((model, high, "infer"), {})
        if "images_per_s" not in a or "images_per_s" not in b:
            return None
        return math.log(a["images_per_s"] / b["images_per_s"]) / math.log((high / low) ** 2)

    return exponent


IRIS, VIT, CONVNEXT, MAMBAOUT = "iris_pdessm_s", "deit_small_patch16_224", "convnext_tiny", "mambaout_tiny"
TARGETS = [
    Target(f"224²: {IRIS} / {VIT} images/s >= 1.0", _ratio(IRIS, VIT, 224), 1.0),
    Target(f"224²: {IRIS} / {CONVNEXT} images/s >= 1.0", _ratio(IRIS, CONVNEXT, 224), 1.0),
    Target(f"224²: {IRIS} / {MAMBAOUT} images/s >= 1.2", _ratio(IRIS, MAMBAOUT, 224), 1.2),
    Target(f"1024²: {IRIS} / {VIT} images/s >= 2.5", _ratio(IRIS, VIT, 1024), 2.5),
    Target(f"1024²: {IRIS} / {CONVNEXT} images/s >= 1.2", _ratio(IRIS, CONVNEXT, 1024), 1.2),
    Target(f"1024²: {IRIS} / {VIT} peak memory <= 0.3", _ratio(IRIS, VIT, 1024, "peak_memory_mb"), 0.3, False),
    Target(
        f"1024²: {IRIS} / {CONVNEXT} peak memory <= 1.0", _ratio(IRIS, CONVNEXT, 1024, "peak_memory_mb"), 1.0, False
    ),
    Target(f"224²→1024²: {IRIS} time/image ~ (pixels)^p, p <= 1.1", _scaling_exponent(IRIS, 224, 1024), 1.1, False),
]


def check_targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate :data:`TARGETS` on the measured records (inference, same run)."""
    table = {(r["model"], r["size"], r["mode"]): r for r in records if "error" not in r}
    results = []
    for target in TARGETS:
        verdict, value = target.check(table)
        results.append({"target": target.text, "verdict": verdict, "measured": value})
    return results


def _format_table(records: list[dict[str, Any]]) -> str:
    rows = [
        f"{'model':<30} {'size':>5} {'batch':>5} {'mode':>5} {'img/s':>9} {'spread %':>8} "
        f"{'peak MB':>9} {'params M':>8} {'GMACs':>8}"
    ]
    for r in records:
        head = f"{r['model']:<30} {r['size']:>5} {r['batch_size']:>5} {r['mode']:>5}"
        if "error" in r:
            rows.append(f"{head}   cannot run: {r['error'][:100]}")
            continue
        median = statistics.median(r["seconds"])
        spread = 100 * (max(r["seconds"]) - min(r["seconds"])) / median
        rows.append(
            f"{head} {r['images_per_s']:>9.2f} {spread:>8.1f} {r['peak_memory_mb']:>9.0f} "
            f"{r['params'] / 1e6:>8.2f} {r['gmacs']:>8.2f}"
        )
    return "\n".join(rows)


def _plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = import_pyplot(alternative="pass --no-plot")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for (key, label), ax in zip(
        [("images_per_s", "inference images/s"), ("peak_memory_mb", "inference peak memory (MB)")], axes, strict=True
    ):
        for model in dict.fromkeys(r["model"] for r in records):
            points = [(r["size"], r[key]) for r in records if r["model"] == model and r["mode"] == "infer" and key in r]
            if points:
                sizes, values = zip(*points, strict=True)
                ax.plot(sizes, values, marker="o", linewidth=2.5 if model.startswith("iris_") else 1.2, label=model)
        ax.set(xscale="log", yscale="log", xlabel="input size (pixels per side)", ylabel=label)
        ax.set_xticks(
            sorted({r["size"] for r in records}), labels=[str(s) for s in sorted({r["size"] for r in records})]
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="iris models")
    parser.add_argument("--peers", nargs="*", default=DEFAULT_PEERS, help="timm models to compare with")
    parser.add_argument("--sizes", nargs="+", type=int, default=DEFAULT_SIZES, help="square input sizes")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 8 at 224 and below, 1 above")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile each model")
    parser.add_argument("--no-train", action="store_true", help="inference only")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timed steps")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per model, size and mode")
    parser.add_argument("--profile", action="store_true", help="torch.profiler top ops of the iris models")
    parser.add_argument("--out", type=Path, default=Path("benchmark_results"), help="JSON and PNG go here")
    parser.add_argument("--no-plot", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = _parse(argv)
    setting = (
        f"device={args.device} threads={args.threads} dtype={args.dtype} amp={args.amp} "
        f"channels_last={args.channels_last} compile={args.compile} torch={torch.__version__}"
    )
    print(setting, flush=True)
    records = []
    for size in args.sizes:
        for name in [*args.models, *args.peers]:
            for train in [False] if args.no_train else [False, True]:
                record = _run_isolated(args, name, size, train)
                records.append(record)
                print(_format_table([record]).splitlines()[1], flush=True)
                if "profile" in record:
                    print(record["profile"], flush=True)

    print("\n" + _format_table(records))
    targets = check_targets(records)
    print("\ntargets (inference, this run):")
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
