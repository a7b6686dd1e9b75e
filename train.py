"""Train or fine-tune an iris model (or any timm model) with Accelerate.

    python train.py                                         # embedded default: digits, a few CPU minutes
    python train.py --config configs/cifar10.yaml
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml train.py --config configs/in1k_s.yaml
    python train.py --config configs/finetune_cifar10.yaml --pretrained local-dir:output/digits

Every field of `Config` is a YAML key and a command-line flag (`batch_size` is `--batch-size`); the command line
wins over the YAML file, which wins over the defaults (`python train.py --help` lists them). A recipe may name a
`base:` recipe (a path relative to itself) whose values it overrides; its `model_kwargs` add to the base's unless it
names another model (`model_kwargs: {}` clears them). `--model-kwargs` on the command line replaces them.

The run folder (`--output-dir`) holds train_config.yaml, metrics.jsonl, checkpoints/step_<N>/, best/, the exported
model and summary.json (see iris_timm/training/run_folder.py). One run per folder, held by a lock; a run resumes
bitwise. Ctrl-C (SIGINT) or SIGTERM stops it after the step it is in, with a checkpoint there, and says how to
continue; a second Ctrl-C stops it at once. The training itself is iris_timm.training.fit; this script is its
command line.
"""

import sys

from accelerate import PartialState

from iris_timm.training import Config, Summary, TrainingError, WrongLaunch, fit, parse_config
from iris_timm.training.data import LOCAL_DATA
from iris_timm.training.launch import speaks_for_launch, stop_launcher


def next_steps(output_dir: str) -> str:
    """Where the trained model is, and the commands that load and fine-tune it (the recipe's data from the Hub, or
    from a local copy)."""
    under = " " * 16  # the fine-tuning command's notes, under it
    return (
        f"The model is in {output_dir}/ (model.safetensors, config.json and its card, README.md). Next:\n"
        f"  load it:      python -c \"import iris_timm; print(iris_timm.from_pretrained('{output_dir}'))\"\n"
        f"  fine-tune it: python train.py --config configs/finetune_cifar10.yaml --pretrained local-dir:{output_dir}\n"
        f"{under}It downloads CIFAR-10 from the Hub. Offline: save CIFAR-10 as DIR/cifar10/train.parquet where the\n"
        f"{under}Hub is reachable (docs/training.md, Data), then prefix the command with {LOCAL_DATA}=DIR."
    )


def main(cfg: Config) -> Summary:
    """Train as ``cfg`` says; what a user can fix ends the program with its one-line message and exit status."""
    try:
        summary = fit(cfg)
        if PartialState().is_main_process:
            print(next_steps(cfg.output_dir))
        return summary
    except WrongLaunch as error:  # every process of the launch: one per machine says why, then ends the launch
        if not speaks_for_launch():
            raise SystemExit(0) from None
        print(error, file=sys.stderr, flush=True)
        stop_launcher()
        raise SystemExit(1) from None
    except TrainingError as error:
        if error.exit_code == 1:
            raise SystemExit(str(error)) from None  # Python prints the message and exits with 1
        print(error, file=sys.stderr)
        raise SystemExit(error.exit_code) from None


if __name__ == "__main__":
    try:
        config = parse_config(description=__doc__)
    except TrainingError as error:
        raise SystemExit(str(error)) from None
    main(config)
