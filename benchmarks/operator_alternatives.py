"""Alternatives to the CDR operator's implementation, measured against it: one thread, the median seconds per
call of ``torch.utils.benchmark.Timer(...).blocked_autorange``.

    python -m benchmarks.operator_alternatives              # 1-4
    python -m benchmarks.operator_alternatives --compile    # and 5 (compilation takes minutes)

1. A large grid (``(8, 56, 56, 64)``, the first stage of ``iris_pdessm_s`` at 224²): the two transforms along H
   alone, against one ``C x C`` linear and the whole operator; and the same transform with the even and odd halves
   of the axis folded first (half the multiply-adds, one more pass over the map).
2. The dense grids in training (forward and backward): the batched products the operator uses, two depthwise
   convolutions, and one Kronecker matrix per channel for both axes.
3. Band-limited evaluation on the large grids: area-pool to 14², the operator there, bilinear upsampling back. Its
   time against the exact operator's, and its error (of the output's peak) on a smooth field and on white noise.
4. In the model: ``iris_pdessm_atto`` training steps (CIFAR-10 sizes, stem 4, batch 64) with the operator, with an
   identity in its place (the sum kept), and without it (``spatial_mix="local"``).
5. With ``--compile``: the same steps with and without the operator, eager and ``torch.compile``d.
"""

import argparse
from collections.abc import Callable

import timm
import torch
import torch.nn.functional as F
from torch import nn

import iris_timm  # noqa: F401  (registers the iris_* models)
from iris_timm.layers import create_cdr
from iris_timm.layers.cdr import _apply_axis_convolutions, _axis_matrix, _AxisMatrices
from iris_timm.tools.benchmark import timed

MIN_RUN_TIME = 0.5  # seconds of timed calls per measurement


def median_ms(call: Callable[[], object]) -> float:
    return 1e3 * timed(call, MIN_RUN_TIME, warmup=3).median


def axis_matrices(op: nn.Module, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    h, w = op.grid_operator(H, W, torch.device("cpu"), op.coefficients())
    return _axis_matrix(*h).detach(), _axis_matrix(*w).detach()


def kronecker(x: torch.Tensor, along_h: torch.Tensor, along_w: torch.Tensor) -> torch.Tensor:
    """Both axes as one ``(HW, HW)`` matrix per channel."""
    B, H, W, C = x.shape
    matrix = (along_h[:, :, None, :, None] * along_w[:, None, :, None, :]).reshape(C, H * W, H * W)
    y = torch.bmm(x.reshape(B, H * W, C).permute(2, 0, 1), matrix.transpose(1, 2))  # (C, B, HW)
    return y.permute(1, 2, 0).reshape(B, H, W, C)


def large_grid() -> None:
    B, H, W, C = 8, 56, 56, 64
    x, op, linear = torch.randn(B, H, W, C), create_cdr(C), nn.Linear(C, C)
    analysis = torch.randn(14, H)
    columns = x.reshape(B, H, W * C)
    half = H // 2
    with torch.inference_mode():
        times = {
            "linear": median_ms(lambda: linear(x)),
            "operator": median_ms(lambda: op(x)),
            "transform along H": median_ms(lambda: torch.matmul(analysis, columns)),
            "the same, halves folded": median_ms(
                lambda: (
                    torch.matmul(analysis[:7, :half], columns[:, :half] + columns[:, half:].flip(1)),
                    torch.matmul(analysis[7:, :half], columns[:, :half] - columns[:, half:].flip(1)),
                )
            ),
        }
    print(f"1. {(B, H, W, C)}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()))


def dense_grids_in_training() -> None:
    print("2. dense grids, forward + backward (ms): batched products / depthwise convolutions / Kronecker")
    for B, S, C in [(64, 8, 40), (64, 4, 80), (64, 2, 160), (8, 14, 320), (8, 7, 512)]:
        x, g = torch.randn(B, S, S, C, requires_grad=True), torch.randn(B, S, S, C)
        along_h, along_w = (m.requires_grad_() for m in axis_matrices(create_cdr(C), S, S))
        inputs = [x, along_h, along_w]

        def timed(apply: Callable, inputs=inputs, g=g) -> float:
            return median_ms(lambda: torch.autograd.grad(apply(*inputs), inputs, g))

        products = timed(_AxisMatrices.apply)
        convolutions = timed(_apply_axis_convolutions)
        print(f"   {(B, S, S, C)}: {products:.2f} / {convolutions:.2f} / {timed(kronecker):.2f}")


def band_limited() -> None:
    print("3. pooled to 14², bilinear back: ms (exact ms), error of the peak on a smooth field / white noise")
    for B, S, C in [(8, 56, 64), (1, 256, 64)]:
        op = create_cdr(C)
        with torch.no_grad():
            op.log_diffusion.fill_(-12.0)  # the narrowest blur: the hardest case for an approximation

        def pooled(x: torch.Tensor, op=op, S=S) -> torch.Tensor:
            small = F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), 14)
            y = op(small.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return F.interpolate(y, size=(S, S), mode="bilinear", align_corners=False).permute(0, 2, 3, 1)

        noise = torch.randn(B, S, S, C)
        smooth = F.interpolate(torch.randn(B, C, 8, 8), size=(S, S), mode="bicubic").permute(0, 2, 3, 1)
        with torch.inference_mode():
            errors = [((pooled(x) - op(x)).abs().max() / op(x).abs().max()).item() for x in (smooth, noise)]
            cost = median_ms(lambda x=noise: pooled(x)), median_ms(lambda x=noise, op=op: op(x))
        print(f"   {(B, S, S, C)}: {cost[0]:.2f} ms ({cost[1]:.2f}), error {errors[0]:.3f} / {errors[1]:.3f}")


def atto(kind: str, compiled: bool = False) -> tuple[Callable, torch.optim.Optimizer]:
    """``iris_pdessm_atto`` for CIFAR-10 with the operator, with an identity in its place, or without it."""
    local = {"spatial_mix": "local"} if kind == "without" else {}
    model = timm.create_model("iris_pdessm_atto", num_classes=10, **local)
    if kind == "identity":
        for module in model.modules():
            if isinstance(getattr(module, "operator", None), nn.Module):
                module.operator = nn.Identity()
    return torch.compile(model) if compiled else model, torch.optim.AdamW(model.parameters())


def training_steps(runs: dict[str, tuple[Callable, torch.optim.Optimizer]]) -> str:
    """Median ms of training steps (batch 64, 32²) of each run."""
    x, target = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step(model: Callable, optimizer: torch.optim.Optimizer) -> None:
        F.cross_entropy(model(x), target).backward()
        optimizer.step()
        optimizer.zero_grad()

    return ", ".join(f"{kind} {median_ms(lambda run=run: step(*run)):.0f} ms" for kind, run in runs.items())


def in_the_model() -> None:
    steps = training_steps({kind: atto(kind) for kind in ("with", "identity", "without")})
    print(f"4. iris_pdessm_atto training step (batch 64, 32², stem 4), operator {steps}")


def compiled() -> None:
    for compile_ in (False, True):
        steps = training_steps({kind: atto(kind, compile_) for kind in ("with", "without")})
        print(f"5. {'torch.compile' if compile_ else 'eager'}, operator {steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd training steps (5)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    large_grid()
    dense_grids_in_training()
    band_limited()
    in_the_model()
    if args.compile:
        compiled()


if __name__ == "__main__":
    main()
