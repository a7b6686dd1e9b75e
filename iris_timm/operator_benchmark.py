"""The PDE operator's cost against one C x C linear layer, on every stage grid of a model.

python -m iris_timm.operator_benchmark                              # iris_pdessm_s, 224² (batch 8), 1024² (batch 1)
python -m iris_timm.operator_benchmark --device cuda --dtype bfloat16

For each stage, the operator of that stage's blocks (its width, heads, boundary and cut-off) runs on the
stage's feature map ``(B, H, W, C)`` at each input size, once per implementation (``modes``, ``separable``,
``fft``), beside ``nn.Linear(C, C)`` on the same tensor. Each timed call is one forward; the operator and the
linear alternate, so drifts of the machine's speed hit both alike. The table shows the median time of each over
``--repeats`` calls and their ratio; ``operator_benchmark.json`` keeps every sample. The default
implementation's ratio is checked against :data:`TARGET_RATIO`.
"""

import argparse
import json
import platform
import statistics
from pathlib import Path
from typing import Any

import timm
import torch

from .benchmark import default_batch_size, seconds
from .files import write_text
from .layers import CDR_METHODS, ConvectionDiffusionReaction2d, create_cdr

__all__ = ["TARGET_RATIO", "main", "stage_operators"]

# The default operator should cost at most half of one C x C linear layer on every stage grid.
TARGET_RATIO = 0.5


def stage_operators(model_name: str, size: int, batch_size: int) -> list[dict[str, Any]]:
    """Each stage's feature-map shape at ``size`` and its first PDE operator's settings, from a model built on
    the meta device (no weights are allocated)."""
    import iris_timm  # noqa: F401  (registers the iris_* models)

    with torch.device("meta"):
        model = timm.create_model(model_name, pretrained=False)
        features = model.forward_intermediates(
            torch.empty(batch_size, 3, size, size), intermediates_only=True, output_fmt="NHWC"
        )
    stages = []
    for index, (stage, feature) in enumerate(zip(model.stages, features, strict=True)):
        operator = next(m for m in stage.modules() if isinstance(m, ConvectionDiffusionReaction2d))
        stages.append(
            {
                "stage": index,
                "shape": list(feature.shape),  # (B, H, W, C)
                "channels": operator.channels,
                "num_heads": operator.num_heads,
                "boundary": operator.boundary,
                "modes": operator.modes,
            }
        )
    return stages


def measure(stage: dict[str, Any], method: str, device: torch.device, dtype: torch.dtype, repeats: int, warmup: int):
    """Seconds per forward of the stage's operator (by ``method``) and of ``nn.Linear(C, C)``, interleaved."""
    B, H, W, C = stage["shape"]
    operator = create_cdr(
        stage["channels"],
        method,
        num_heads=stage["num_heads"],
        channels_last=True,
        boundary=stage["boundary"],
        modes=stage["modes"],
        device=device,
    )
    linear = torch.nn.Linear(C, C, device=device)
    x = torch.randn(B, H, W, C, device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    samples: dict[str, list[float]] = {"operator": [], "linear": []}
    with torch.no_grad(), autocast:
        for step in range(warmup + repeats):
            times = {"operator": seconds(lambda: operator(x), device), "linear": seconds(lambda: linear(x), device)}
            if step >= warmup:
                for name, sample in times.items():
                    samples[name].append(sample)
    return samples


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="iris_pdessm_s")
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 1024])
    parser.add_argument("--methods", nargs="+", default=list(CDR_METHODS), choices=list(CDR_METHODS))
    parser.add_argument(
        "--modes", type=int, help="measure at this cut-off instead of the model's (the cost/cut-off trade-off)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (the comparison is per thread)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("output/operator_benchmark"))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    records = []
    cutoff = f", modes={args.modes}" if args.modes else ""
    print(
        f"{args.model}{cutoff}: operator time / nn.Linear(C, C) time, {args.device} {args.dtype}, "
        f"{args.threads} thread(s)"
    )
    print(
        f"{'size':>5} {'batch':>5} {'stage grid (B, H, W, C)':>24} {'linear ms':>10} "
        + " ".join(f"{method:>10}" for method in args.methods)
    )
    for size in args.sizes:
        batch_size = default_batch_size(size)
        for stage in stage_operators(args.model, size, batch_size):
            stage["modes"] = args.modes or stage["modes"]
            row = {"size": size, "batch_size": batch_size, **stage, "methods": {}}
            linear_all = []
            for method in args.methods:
                samples = measure(stage, method, device, dtype, args.repeats, args.warmup)
                linear_all += samples["linear"]
                row["methods"][method] = {
                    "samples_s": samples["operator"],
                    "linear_samples_s": samples["linear"],
                    "ratio": statistics.median(samples["operator"]) / statistics.median(samples["linear"]),
                }
            row["linear_ms"] = statistics.median(linear_all) * 1e3
            records.append(row)
            ratios = " ".join(f"{row['methods'][m]['ratio']:>9.2f}x" for m in args.methods)
            print(f"{size:>5} {batch_size:>5} {tuple(stage['shape'])!s:>24} {row['linear_ms']:>10.2f} {ratios}")

    default = next(iter(CDR_METHODS))
    worst = max(row["methods"][default]["ratio"] for row in records) if default in args.methods else None
    if worst is not None:
        verdict = "meets" if worst <= TARGET_RATIO else "misses"
        print(f"default ({default}): worst ratio {worst:.2f}x, {verdict} the target of {TARGET_RATIO}x")
    meta = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "target_ratio": TARGET_RATIO,
        "worst_default_ratio": worst,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    result = {**meta, "records": records}
    write_text(args.out / "operator_benchmark.json", json.dumps(result, indent=1))  # atomic: never read half-written
    return result


if __name__ == "__main__":
    main()
