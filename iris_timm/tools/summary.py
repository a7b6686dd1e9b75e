"""Print parameters and GMACs of iris models (and any timm model) at a given input size.

python -m iris_timm.tools.summary                      # every iris_* model at 224x224
python -m iris_timm.tools.summary iris_pdessm_s convnext_tiny --img-size 384
"""

import argparse

import timm

import iris_timm  # noqa: F401  (registers the iris_* models)
from iris_timm.flops import count_macs, count_params, create_model_for_size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="timm model names (default: every iris_* model)")
    parser.add_argument("--img-size", type=int, default=224, help="square input size (default: 224)")
    args = parser.parse_args(argv)

    names = args.models or timm.list_models("iris_*")
    print(f"{'model':<28} {'params (M)':>11} {f'GMACs @ {args.img_size}':>12}")
    for name in names:
        model = create_model_for_size(name, args.img_size)
        macs = count_macs(model, (3, args.img_size, args.img_size))
        print(f"{name:<28} {count_params(model) / 1e6:>11.2f} {macs / 1e9:>12.2f}")


if __name__ == "__main__":
    main()
