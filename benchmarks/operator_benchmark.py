"""The CDR operator's cost against one C x C linear layer, on every stage grid of a model, and what it costs a
whole model's training.

python -m benchmarks.operator_benchmark                              # iris_pdessm_s, 224² (batch 8), 1024² (batch 1)
python -m benchmarks.operator_benchmark --train                      # forward + backward, and whole-model training
python -m benchmarks.operator_benchmark --device cuda --dtype bfloat16

For each stage, the operator of that stage's blocks (its width, heads, boundary and cut-off) runs on the
stage's feature map ``(B, H, W, C)`` at each input size, beside ``nn.Linear(C, C)`` on the same tensor and a copy
of it (``x.clone()``: one read and one write of the map, the least any operator on it can cost). Each timed call is
one forward, timed by ``torch.utils.benchmark.Timer(...).blocked_autorange`` for at least ``--min-run-time``
seconds after ``--warmup`` untimed calls. The table shows the linear's median time and the operator's and the
copy's ratios to it; ``operator_benchmark.json`` keeps each timed block. The operator's ratio is checked against
:data:`TARGET_RATIO`.

With ``--train`` each timed call is a forward and a backward (the gradient of a fixed random projection of the
output, so both the input's and the coefficients' gradients are computed), and a second table times whole-model
training steps (forward, cross-entropy, backward, AdamW update) of each model in :data:`TRAINING_MODELS` against
the same model without the operator (``spatial_mix="local"``: each block's spatial filter is its depthwise conv
alone), timed the same way. Their ratio of images/s is checked against :data:`TARGET_TRAINING`.
"""

import argparse
import json
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch

from iris_timm.files import write_text
from iris_timm.layers import ConvectionDiffusionReaction2d, create_cdr
from iris_timm.tools.benchmark import default_batch_size, timed, training_step

__all__ = ["TARGET_RATIO", "TARGET_TRAINING", "TRAINING_MODELS", "main", "measure_training", "stage_operators"]

# The operator should cost at most half of one C x C linear layer on every stage grid.
TARGET_RATIO = 0.5
# A model with the operator should train at least this fraction of the images/s of the same model without it.
TARGET_TRAINING = 0.9
# (model, input size, batch size, model arguments): ImageNet's setting and the CIFAR-10 recipes' two stems.
TRAINING_MODELS = [
    ("iris_pdessm_s", 224, 8, {}),
    ("iris_pdessm_atto", 32, 64, {"num_classes": 10}),
    ("iris_pdessm_atto", 32, 64, {"num_classes": 10, "stem_stride": 2}),
]


def stage_operators(model_name: str, size: int, batch_size: int) -> list[dict[str, Any]]:
    """Each stage's feature-map shape at ``size`` and its first CDR operator's settings, from a model built on
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


class Copy(torch.nn.Module):
    """``x.clone()``: one read and one write of the map (and of its gradient)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def measure(
    stage: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    min_run_time: float,
    warmup: int,
    train: bool = False,
) -> dict[str, list[float]]:
    """Seconds per call (one per timed block) of the stage's operator, of ``nn.Linear(C, C)`` and of a copy: a
    forward, or with ``train`` a forward and a backward."""
    B, H, W, C = stage["shape"]
    operator = create_cdr(
        stage["channels"], num_heads=stage["num_heads"], boundary=stage["boundary"], modes=stage["modes"], device=device
    )
    linear = torch.nn.Linear(C, C, device=device)
    x = torch.randn(B, H, W, C, device=device, requires_grad=train)
    projection = torch.randn(B, H, W, C, device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def call(layer: torch.nn.Module) -> Callable[[], None]:
        if not train:
            return lambda: layer(x)
        return lambda: layer(x).backward(projection)

    # The copy reads the map and writes one of the same size: the least any operator on it can cost.
    layers = {"operator": operator, "linear": linear, "copy": Copy()}
    with torch.set_grad_enabled(train), autocast:
        return {name: timed(call(layer), min_run_time, warmup).times for name, layer in layers.items()}


def measure_training(
    model_name: str,
    size: int,
    batch_size: int,
    model_args: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    min_run_time: float,
    warmup: int,
) -> dict[str, list[float]]:
    """Seconds per training step (one per timed block) of the model and of the same model without the operator."""
    import iris_timm  # noqa: F401  (registers the iris_* models)

    models = {
        "with": timm.create_model(model_name, **model_args).to(device),
        "without": timm.create_model(model_name, spatial_mix="local", **model_args).to(device),
    }
    x = torch.randn(batch_size, 3, size, size, device=device)
    target = torch.randint(0, models["with"].num_classes, (batch_size,), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    samples = {}
    for name, model in models.items():
        step = training_step(model.train(), torch.optim.AdamW(model.parameters()), x, target, autocast)
        samples[name] = timed(step, min_run_time, warmup).times
    return samples


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="iris_pdessm_s")
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 1024])
    parser.add_argument(
        "--modes", type=int, help="measure at this cut-off instead of the model's (the cost/cut-off trade-off)"
    )
    parser.add_argument("--train", action="store_true", help="forward + backward, and whole-model training steps")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (the comparison is per thread)")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds of timed calls per layer")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("output/operator_benchmark"))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    records = []
    cutoff = f", modes={args.modes}" if args.modes else ""
    kind = "forward + backward" if args.train else "forward"
    print(
        f"{args.model}{cutoff}: operator time / nn.Linear(C, C) time ({kind}), {args.device} {args.dtype}, "
        f"{args.threads} thread(s)"
    )
    print(f"{'size':>5} {'batch':>5} {'stage grid (B, H, W, C)':>24} {'linear ms':>10} {'operator':>10} {'copy':>10}")
    for size in args.sizes:
        batch_size = default_batch_size(size)
        for stage in stage_operators(args.model, size, batch_size):
            stage["modes"] = args.modes or stage["modes"]
            samples = measure(stage, device, dtype, args.min_run_time, args.warmup, args.train)
            linear = statistics.median(samples["linear"])
            row = {"size": size, "batch_size": batch_size, **stage, "linear_ms": linear * 1e3}
            row.update({f"{name}_samples_s": values for name, values in samples.items()})
            row["ratio"] = statistics.median(samples["operator"]) / linear
            row["copy_ratio"] = statistics.median(samples["copy"]) / linear
            records.append(row)
            print(
                f"{size:>5} {batch_size:>5} {tuple(stage['shape'])!s:>24} {row['linear_ms']:>10.2f} "
                f"{row['ratio']:>9.2f}x {row['copy_ratio']:>9.2f}x"
            )

    worst = max(row["ratio"] for row in records)
    verdict = "meets" if worst <= TARGET_RATIO else "misses"
    print(f"operator: worst ratio {worst:.2f}x, {verdict} the target of {TARGET_RATIO}x")
    training = []
    if args.train:
        print(
            "training step (forward, backward, AdamW), images/s with and without the operator, "
            f"median of blocks over {args.min_run_time} s"
        )
        print(f"{'model':>18} {'size':>5} {'batch':>5} {'arguments':>24} {'with':>8} {'without':>8} {'ratio':>6}")
        for name, size, batch_size, model_args in TRAINING_MODELS:
            samples = measure_training(
                name, size, batch_size, model_args, device, dtype, args.min_run_time, args.warmup
            )
            speed = {key: batch_size / statistics.median(values) for key, values in samples.items()}
            row = {"model": name, "size": size, "batch_size": batch_size, "model_args": model_args}
            row.update(samples_s=samples, images_per_s=speed, ratio=speed["with"] / speed["without"])
            training.append(row)
            shown = ", ".join(f"{k}={v}" for k, v in model_args.items() if k != "num_classes") or "defaults"
            print(
                f"{name:>18} {size:>5} {batch_size:>5} {shown:>24} {speed['with']:>8.1f} {speed['without']:>8.1f} "
                f"{row['ratio']:>5.2f}x"
            )
        slowest = min(row["ratio"] for row in training)
        verdict = "meets" if slowest >= TARGET_TRAINING else "misses"
        print(f"training: slowest ratio {slowest:.2f}x, {verdict} the target of {TARGET_TRAINING}x")
    meta = {
        "model": args.model,
        "train": args.train,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "min_run_time": args.min_run_time,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "target_ratio": TARGET_RATIO,
        "worst_ratio": worst,
        "target_training": TARGET_TRAINING,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    result = {**meta, "records": records, "training": training}
    write_text(args.out / "operator_benchmark.json", json.dumps(result, indent=1))  # atomic: never read half-written
    return result


if __name__ == "__main__":
    main()
