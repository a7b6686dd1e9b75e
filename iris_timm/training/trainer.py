"""Training with Accelerate: ``fit(cfg)`` builds the recipe's model, data, optimizer and schedule, trains with
checkpoints that resume bitwise, evaluates, and exports a Hub-ready folder. ``train.py`` is its command line; the
studies in ``benchmarks/`` call it too, so every figure they report comes from the path users run.

The run folder (``cfg.output_dir``) holds train_config.yaml, metrics.jsonl, checkpoints/step_<N>/, best/, the
exported model and summary.json (:mod:`.run_folder`). One run per folder, held by a lock; a run resumes bitwise.
SIGINT (Ctrl-C) or SIGTERM stops it after the step it is in, with a checkpoint there (:mod:`.interrupt`). Everything
a user can fix ends in a :class:`TrainingError`.
"""

import dataclasses
import difflib
import inspect
import json
import math
import os
import shlex
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, is_tensorboard_available, set_seed
from safetensors.torch import load_file, save_file
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, accuracy
from tqdm.auto import tqdm

from ..files import apply_umask
from ..hub import from_pretrained, save_pretrained
from ..weights import check_weights, check_weights_file, safetensors_header
from .clock import PACE_STEPS, TrainingClock
from .config import RESUMABLE_CHANGES, Config, validate
from .data import UnreadableImage, classes, load_splits, local_copy, make_loaders, preprocessing
from .errors import Interrupted, TrainingError, WrongLaunch
from .interrupt import StopSignals
from .launch import requested_processes
from .run_folder import (
    CHECKPOINTS,
    EMA_WEIGHTS,
    TRAINER_STATE,
    Evaluation,
    Summary,
    TrainerState,
    TrainingLog,
    append_metrics,
    checkpoint_dirs,
    last_checkpoint,
    take_run_folder,
    truncate_metrics,
    write_summary,
)

__all__ = ["Training", "create_model", "fit"]


# ----------------------------------------------------------------------------- model and optimisation


def create_model(cfg: Config, num_classes: int) -> torch.nn.Module:
    """The recipe's timm model for `num_classes`, with the weights `cfg.pretrained` names, checked before use."""
    if cfg.pretrained is not None and not cfg.pretrained.endswith(".safetensors"):
        # hf-hub: / local-dir: folders carry their own architecture and model_args.
        try:
            model = from_pretrained(cfg.pretrained, num_classes=num_classes, drop_path_rate=cfg.drop_path)
        except (OSError, ValueError) as error:  # a missing or unreadable folder, or weights that do not fit
            raise TrainingError(f"pretrained: {' '.join(str(error).split())}") from None
        if model.pretrained_cfg["architecture"] != cfg.model or cfg.model_kwargs:
            print(
                f"Note: {cfg.pretrained} brings its own architecture ({model.pretrained_cfg['architecture']}) and "
                f"model arguments; the recipe's model ({cfg.model}, {cfg.model_kwargs}) is not used."
            )
        return model
    kwargs, file = dict(cfg.model_kwargs, num_classes=num_classes, drop_path_rate=cfg.drop_path), cfg.pretrained
    try:
        if file is not None:  # a bare weights file, loaded into the recipe's model
            if not Path(file).is_file():
                raise TrainingError(f"pretrained: {file} does not exist.")
            # timm keeps the file's classifier only if its size matches: tell it the size the file holds.
            head = safetensors_header(file).get(f"{timm.get_pretrained_cfg_value(cfg.model, 'classifier')}.weight")
            kwargs["pretrained_cfg_overlay"] = {"file": file, "num_classes": head.shape[0] if head else num_classes}
            check_weights_file(file, cfg.model, **kwargs)
        model = timm.create_model(cfg.model, pretrained=file is not None, **kwargs)
    except TypeError as error:  # an argument the model does not take
        raise TrainingError(unknown_argument_message(cfg, error)) from None
    except ValueError as error:  # a model argument out of range, or weights that do not fit
        raise TrainingError(str(error)) from None
    if file is not None:
        try:
            check_weights(model.state_dict(), None, source=file)
        except ValueError as error:
            raise TrainingError(str(error)) from None
    return model


def unknown_argument_message(cfg: Config, error: TypeError) -> str:
    """What to say when timm's model rejects an argument of `model_kwargs`: the argument, and the ones it takes."""
    model_class = type(timm.create_model(cfg.model))
    accepted = [p for p in inspect.signature(model_class.__init__).parameters if p not in ("self", "kwargs")]
    wrong = [k for k in cfg.model_kwargs if k not in accepted]
    hints = [f"{k!r} (did you mean {m[0]!r}?)" for k in wrong if (m := difflib.get_close_matches(k, accepted, n=1))]
    named = ", ".join(hints) or ", ".join(map(repr, wrong)) or str(error)
    return (
        f"model_kwargs: {cfg.model} ({model_class.__name__}) takes no argument {named}. "
        f"Its arguments: {', '.join(accepted)}."
    )


def model_and_optimizer(cfg: Config, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model set up for training as the recipe says, and its optimizer, with weight decay and layer decay from
    the model's no_weight_decay and group_matcher."""
    if cfg.freeze_backbone:  # a linear probe: only the classifier trains
        classifier = model.pretrained_cfg["classifier"]
        for name, param in model.named_parameters():
            param.requires_grad = name.startswith(classifier + ".")
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
        model.register_state_dict_post_hook(contiguous_state)
    optimizer = create_optimizer_v2(
        model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum, layer_decay=cfg.layer_decay
    )
    return model, optimizer


def contiguous_state(module: torch.nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    """A state dict hook: channels-last weights in the standard layout, the only one safetensors writes (checkpoints,
    the EMA, the exported model)."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and not value.is_contiguous():
            state[key] = value.contiguous()


def make_criterion(cfg: Config, num_classes: int) -> tuple[torch.nn.Module, Mixup | None]:
    """The loss, and the Mixup/CutMix that makes its soft targets when the recipe asks for it."""
    if cfg.mixup > 0 or cfg.cutmix > 0:  # the label smoothing is folded into the soft targets
        mixup = Mixup(cfg.mixup, cfg.cutmix, label_smoothing=cfg.smoothing, num_classes=num_classes)
        return SoftTargetCrossEntropy(), mixup
    if cfg.smoothing > 0:
        return LabelSmoothingCrossEntropy(cfg.smoothing), None
    return torch.nn.CrossEntropyLoss(), None


# ----------------------------------------------------------------------------- checkpoints and resume


def save_checkpoint(run: "Training") -> None:
    """Accelerate's state, the EMA and the trainer state, written into a '.tmp-' folder that is renamed into place
    when complete: a crash never leaves a half-written checkpoint under a name `--resume` would pick. (Accelerate's
    automatic_checkpoint_naming writes in place and drops the oldest checkpoint before the new one is complete.)"""
    refuse_non_finite_weights(run)
    accelerator, final = run.accelerator, run.output_dir / CHECKPOINTS / f"step_{run.state.step:08d}"
    tmp = final.with_name(".tmp-" + final.name)
    with run.clock.paused():
        if accelerator.is_main_process:  # what a killed or twice-interrupted write left; this run holds the folder
            for partial in final.parent.glob(".tmp-*"):
                shutil.rmtree(partial)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        if run.ema is not None and accelerator.is_main_process:
            save_file(run.ema.module.state_dict(), str(tmp / EMA_WEIGHTS))
        accelerator.wait_for_everyone()  # every process has written its part before the folder is renamed
        if accelerator.is_main_process:
            run.state.save(tmp)
            apply_umask(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in checkpoint_dirs(run.output_dir)[: -run.cfg.keep_checkpoints]:
                shutil.rmtree(old)
        accelerator.wait_for_everyone()
    run.checkpoint_step = run.state.step


def refuse_non_finite_weights(run: "Training") -> None:
    """Stop before writing weights that hold NaN or infinity (the weights, or the EMA's, diverged); every process
    holds the same weights, so all stop together."""
    for model in [run.plain_model()] + ([run.ema.module] if run.ema is not None else []):
        try:
            check_weights(model.state_dict(), None, source=f"the weights at step {run.state.step}")
        except ValueError as error:
            raise TrainingError(
                f"{error} Nothing is written. Last good checkpoint: {last_checkpoint(run.output_dir)}. Lower lr or "
                "keep clip_grad on."
            ) from None


def resume_point(cfg: Config, recipe_steps: int) -> tuple[Path | None, TrainerState]:
    """The checkpoint the run continues (with --resume: the latest in output_dir, or the folder it names; None where
    there is none) and the state it starts from: step 0, or the checkpoint's, its length the recipe's unless a time
    budget fixed it. A checkpoint without its weights or state is refused."""
    output_dir = Path(cfg.output_dir)
    checkpoint = Path(cfg.resume) if cfg.resume not in (None, "auto") else None
    if cfg.resume == "auto" and not cfg.overwrite and checkpoint_dirs(output_dir):
        checkpoint = checkpoint_dirs(output_dir)[-1]
    if checkpoint is None:
        return None, TrainerState(total_steps=recipe_steps, recipe_steps=recipe_steps)
    missing = [name for name in ("model.safetensors", TRAINER_STATE) if not (checkpoint / name).is_file()]
    if missing:
        raise TrainingError(
            f"Checkpoint {checkpoint} is incomplete: {', '.join(missing)} missing. Resume from another checkpoint "
            f"(--resume {checkpoint.parent}/step_...), or start afresh with --overwrite."
        )
    state = TrainerState.load(checkpoint)
    state.recipe_steps = recipe_steps
    if not state.budget_fitted:  # the recipe's length, which the command line may have changed
        state.total_steps = recipe_steps
    return checkpoint, state


def resume(cfg: Config, accelerator: Accelerator, ema: ModelEmaV3 | None, checkpoint: Path | None, step: int) -> None:
    """The weights, optimizer, EMA and random generators ``checkpoint`` saved (Accelerate's state), and the records
    of metrics.jsonl up to its ``step``; a resumed run without a checkpoint starts its records again."""
    output_dir = Path(cfg.output_dir)
    if checkpoint is None:  # nothing to resume from: the run starts again, and so do its records
        if cfg.resume is not None and accelerator.is_main_process:
            truncate_metrics(output_dir, -1)
        if cfg.resume is not None and not cfg.overwrite:
            accelerator.print(
                f"--resume: {output_dir} holds no checkpoint (the run stopped before its first one), so the run "
                "starts again from step 0."
            )
        return
    accelerator.load_state(str(checkpoint))
    if ema is not None:
        ema.module.load_state_dict(load_file(str(checkpoint / EMA_WEIGHTS)))
    if accelerator.is_main_process:
        truncate_metrics(output_dir, step)
    accelerator.print(f"Resumed from {checkpoint} at step {step}.")


# ----------------------------------------------------------------------------- training


@dataclass
class Training:
    """A run's prepared objects and where it stands: what the functions that train, evaluate, checkpoint and
    export share."""

    cfg: Config
    accelerator: Accelerator
    model: torch.nn.Module  # as Accelerate prepared it (DDP, torch.compile)
    optimizer: torch.optim.Optimizer
    ema: ModelEmaV3 | None
    criterion: torch.nn.Module
    mixup: Mixup | None
    loaders: tuple  # the prepared training and validation loaders
    batches: tuple  # iris_timm.training.data.Batches of each: a loader's batch as model inputs on the device
    label_names: list[str] | None
    state: TrainerState
    bad_in_a_row: int = 0  # updates skipped for a non-finite loss, in a row
    bad_in_window: bool = False  # a non-finite loss in the current gradient-accumulation window
    checkpoint_step: int | None = None  # the step of the checkpoint this process wrote last
    stop: StopSignals = field(default_factory=StopSignals)  # SIGINT and SIGTERM, while training

    def __post_init__(self) -> None:
        self.output_dir = Path(self.cfg.output_dir)
        self.clock = TrainingClock(
            self.state, self.cfg.time_budget_s, self.cfg.eval_every_s, self.accelerator.num_processes
        )
        self.progress = tqdm(
            total=self.state.total_steps, initial=self.state.step, disable=not self.accelerator.is_local_main_process
        )
        self.reschedule()

    def reschedule(self) -> None:
        """A learning-rate schedule over state.total_steps, at the current step."""
        cfg, steps = self.cfg, self.state.total_steps  # counted in optimizer updates, not epochs
        self.scheduler, _ = create_scheduler_v2(
            self.optimizer, cfg.sched, num_epochs=steps, warmup_epochs=min(cfg.warmup_steps, steps // 2),
            min_lr=cfg.min_lr, warmup_lr=cfg.lr / 100, step_on_epochs=False, updates_per_epoch=1,
        )  # fmt: skip
        self.scheduler.step_update(num_updates=self.state.step)  # creating it set the warm-up LR
        self.progress.total = self.state.total_steps

    def plain_model(self) -> torch.nn.Module:
        """The model under the DDP and torch.compile wrappers."""
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=False)


def train_steps(run: Training) -> None:
    """Batches until the last step; an optimizer update at the end of each gradient-accumulation window, then its
    bookkeeping, logs, checkpoints and evaluations when due; an evaluation and a checkpoint after each epoch and
    after the last step."""
    cfg, accelerator, state = run.cfg, run.accelerator, run.state
    (train_loader, _), (batches, _) = run.loaders, run.batches
    run.model.train()
    while state.step < state.total_steps:
        train_loader.set_epoch(state.epoch)  # seeds this epoch's shuffle
        batches.start_epoch(state.epoch)  # and its augmentation
        for batch in accelerator.skip_first_batches(train_loader, state.batch_in_epoch):
            if state.step >= state.total_steps:
                break
            state.batch_in_epoch += 1
            # Mixup, drop path and dropout draw from generators seeded by the position in the data, so a resumed run
            # draws exactly what an uninterrupted one would (and each process draws differently).
            set_seed(hash((cfg.seed, state.epoch, state.batch_in_epoch)) % 2**32, device_specific=True)
            images, targets = batches(batch)
            if run.mixup is not None:
                images, targets = run.mixup(images, targets)
            if cfg.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with accelerator.accumulate(run.model):
                loss = run.criterion(run.model(images), targets)
                # Backward runs even on a non-finite loss, so every process joins the gradient all-reduce; the
                # window's update is then skipped (optimizer_step), its gradients dropped.
                accelerator.backward(loss)
                run.bad_in_window |= not loss.detach().isfinite().item()
                if not accelerator.sync_gradients:
                    continue  # within the window: accumulate
                updated = optimizer_step(run)
            if run.ema is not None and updated:
                run.ema.update(run.plain_model(), step=state.step)
            state.step += 1
            state.images_seen += len(images) * accelerator.num_processes * cfg.grad_accum_steps
            after_step(run, loss)
            stop_if_asked(run)
        else:  # the epoch ran out, not the steps
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        evaluate_and_checkpoint(run)
        stop_if_asked(run)


def after_step(run: Training, loss: torch.Tensor) -> None:
    """An update's bookkeeping: the clock (and the step count it fits to a time budget), the LR schedule, logs,
    checkpoints and timed evaluations."""
    cfg, state = run.cfg, run.state
    pace = run.clock.tick()
    if pace is not None:  # the pace so far fits the step count to the time budget
        run.reschedule()
        if state.step == PACE_STEPS[1] or run.clock.evaluation_due():
            run.accelerator.print(f"{pace:.3f} s per step: {state.total_steps} steps fit the time budget.")
    run.scheduler.step_update(num_updates=state.step)
    run.progress.update(1)
    if state.step % cfg.log_every == 0:
        run.progress.set_postfix(loss=f"{loss.item():.3f}")
        log(run, TrainingLog(state.step, state.epoch, loss.item(), run.optimizer.param_groups[0]["lr"]))
    if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
        save_checkpoint(run)
    every_steps = cfg.eval_every and state.step % cfg.eval_every == 0
    if (every_steps or run.clock.evaluation_due()) and state.step < state.total_steps:  # the last comes after the loop
        evaluate_and_checkpoint(run)


def stop_if_asked(run: Training) -> None:
    """After a step: where SIGINT or SIGTERM reached any process (every process learns it through Accelerate's
    trigger, at the same step), write this step's checkpoint unless it is written, and stop, saying how to continue.
    A signal during the last step lets the run finish."""
    state, accelerator = run.state, run.accelerator
    if state.step >= state.total_steps:
        return
    if run.stop.received is not None:
        accelerator.set_trigger()
    if not accelerator.check_trigger():
        return
    if run.checkpoint_step != state.step:
        save_checkpoint(run)
    signum = run.stop.received or signal.SIGINT  # a process the signal did not reach stops with the others
    raise Interrupted(
        f"Stopped by {signum.name} at step {state.step}; checkpoint written: {last_checkpoint(run.output_dir)}. "
        f"Continue with: {resume_command(run.cfg)}",
        signum,
    )


def optimizer_step(run: Training) -> bool:
    """The update that ends a gradient-accumulation window, skipped after a non-finite loss in it on any process (one
    collective per window: every process must agree); stops the run after ``max_bad_steps`` skipped in a row. Returns
    whether the weights were updated."""
    cfg, state, accelerator = run.cfg, run.state, run.accelerator
    updated = not accelerator.gather(torch.tensor([run.bad_in_window], device=accelerator.device)).any().item()
    if updated:
        run.bad_in_a_row = 0
        if cfg.clip_grad:
            accelerator.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
        run.optimizer.step()
    else:
        state.bad_steps += 1
        run.bad_in_a_row += 1
    run.optimizer.zero_grad(set_to_none=True)
    run.bad_in_window = False
    if run.bad_in_a_row >= cfg.max_bad_steps:
        raise TrainingError(
            f"{run.bad_in_a_row} non-finite losses in a row at step {state.step}; stopping. Last good checkpoint: "
            f"{last_checkpoint(run.output_dir)}. Lower lr, keep clip_grad on, or use bf16 instead of fp16."
        )
    return updated


def log(run: Training, record: TrainingLog | Evaluation) -> None:
    run.accelerator.log(record.metrics(), step=record.step)
    if run.accelerator.is_main_process:
        append_metrics(run.output_dir, record)


# ----------------------------------------------------------------------------- evaluation and export


def evaluate(run: Training, model: torch.nn.Module, topk: tuple[int, ...]) -> dict[str, float]:
    """Top-k accuracy (%) over the whole validation split, gathered from every process without duplicates."""
    (_, loader), (_, batches) = run.loaders, run.batches
    model.eval()
    outputs, targets = [], []
    with torch.no_grad():
        for batch in loader:
            images, labels = batches(batch)
            logits, labels = run.accelerator.gather_for_metrics((model(images), labels))
            outputs.append(logits.float().cpu())
            targets.append(labels.cpu())
    model.train()
    scores = accuracy(torch.cat(outputs), torch.cat(targets), topk=topk)
    return {f"top{k}": score.item() for k, score in zip(topk, scores, strict=True)}


def evaluate_and_checkpoint(run: Training) -> None:
    """Evaluate (unless the clock just did, at this step), export the best weights so far, log, and checkpoint.
    Off the training clock."""
    with run.clock.paused():
        if run.state.last_eval_step != run.state.step:
            record_evaluation(run)
        save_checkpoint(run)


def record_evaluation(run: Training) -> None:
    state, topk = run.state, (1, 5) if run.plain_model().num_classes >= 5 else (1,)
    state.last_eval_step, state.last_eval_s = state.step, state.train_time_s
    scores = evaluate(run, run.model, topk)
    if run.ema is not None:
        scores |= {f"ema_{k}": v for k, v in evaluate(run, run.ema.module, topk).items()}
    state.top1 = scores["ema_top1" if run.ema is not None else "top1"]
    if state.best_top1 is None or state.top1 > state.best_top1:
        state.best_top1, state.best_epoch = state.top1, state.epoch
        export(run, run.output_dir / "best")
    log(run, Evaluation(state.step, state.epoch, scores, round(state.train_time_s, 2)))
    run.accelerator.print(
        f"epoch {state.epoch} step {state.step} ({state.train_time_s:.0f} s of training): "
        + ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    )


def command_line() -> str:
    """The command that started this process, as a user would type it (``python -m module ...`` for a module)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = ["-m", spec.name] if spec is not None and spec.name != "__main__" else sys.argv[:1]
    return "python " + shlex.join(program + sys.argv[1:])


def resume_command(cfg: Config) -> str:
    """The command that continues this run from its latest checkpoint."""
    return command_line() + ("" if cfg.resume else " --resume")


def export(run: Training, directory: Path) -> None:
    """A Hub-ready folder of the current weights (the EMA's when on); an iris model's card records this run."""
    refuse_non_finite_weights(run)
    if not run.accelerator.is_main_process:
        return
    model = run.ema.module if run.ema is not None else run.plain_model()
    dataset = "scikit-learn digits" if run.cfg.dataset == "digits" else Path(run.cfg.dataset).name
    results = {"dataset": dataset, "top1": round(run.state.top1, 2), "epochs": run.state.epoch}
    save_pretrained(
        model, directory, label_names=run.label_names, training_results=results | {"command": command_line()}
    )


def summarize(run: Training, updates_per_epoch: int | None) -> Summary:
    state = run.state
    return Summary(
        top1=state.top1,
        best_top1=state.best_top1,
        best_epoch=state.best_epoch,
        steps=state.step,
        epochs=state.step / updates_per_epoch if updates_per_epoch else None,
        skipped_steps=state.bad_steps,
        params=sum(p.numel() for p in run.plain_model().parameters()),
        train_images_per_s=state.images_seen / max(state.train_time_s, 1e-9),
        train_time_s=state.train_time_s,
        process_wall_time_s=run.clock.wall_time_s(),
        threads=torch.get_num_threads(),
        command=command_line(),
        processes=run.accelerator.num_processes,
    )


# ----------------------------------------------------------------------------- the run


def setup(cfg: Config) -> Accelerator:
    """The Accelerator (devices, processes, mixed precision, trackers), with every generator seeded."""
    log_with = ("tensorboard" if is_tensorboard_available() else None) if cfg.log_with == "auto" else cfg.log_with
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision,
        gradient_accumulation_steps=cfg.grad_accum_steps,
        log_with=log_with,
        project_dir=cfg.output_dir,
        dynamo_backend="inductor" if cfg.compile else "no",
        # Shuffle order from (seed, epoch) alone, so a resumed run sees the batches an uninterrupted one would.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    requested = requested_processes()
    if requested > 1 and accelerator.num_processes == 1:
        # Without a GPU, `--multi_gpu` and torchrun start processes that each train alone on the same folder, and
        # `accelerate launch --cpu --num_processes N` starts one.
        raise WrongLaunch(
            f"This process was launched as one of {requested} (WORLD_SIZE or --num_processes), but Accelerate runs "
            "it alone: each process would train the whole run into the same folder. On CPUs launch with: "
            "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N train.py ..."
        )
    set_seed(cfg.seed)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    return accelerator


def fit(cfg: Config) -> Summary:
    """Train, evaluate, checkpoint and export as `cfg` says; returns what summary.json records."""
    cfg = local_copy(cfg)
    validate(cfg)
    accelerator = setup(cfg)

    # Data, and a model for its classes that prepares its inputs as the recipe says.
    train_data, val_data = load_splits(cfg)
    names, num_classes = classes(cfg, train_data)
    model = create_model(cfg, num_classes)
    train_loader, val_loader, *batches = make_loaders(cfg, preprocessing(cfg, model), train_data, val_data)

    # Optimizer and loss; Accelerate places the model and shards the data over the processes.
    model, optimizer = model_and_optimizer(cfg, model)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    criterion, mixup = make_criterion(cfg, num_classes)

    # Where training starts: step 0 or a checkpoint. The run folder is checked against it before anything is
    # written there.
    updates_per_epoch = None if cfg.streaming else math.ceil(len(train_loader) / cfg.grad_accum_steps)
    checkpoint, state = resume_point(cfg, recipe_steps=cfg.max_steps or cfg.epochs * updates_per_epoch)
    lock = None
    if accelerator.is_main_process:
        steps_left = None if checkpoint is None else state.total_steps - state.step
        lock = take_run_folder(
            Path(cfg.output_dir), dataclasses.asdict(cfg), cfg.resume is not None, cfg.overwrite, RESUMABLE_CHANGES,
            steps_left,
        )  # fmt: skip
    try:  # the folder is this run's until fit returns or raises
        accelerator.wait_for_everyone()
        if accelerator.log_with:
            accelerator.init_trackers("train", config={k: str(v) for k, v in dataclasses.asdict(cfg).items()})
        plain = accelerator.unwrap_model(model, keep_torch_compile=False)
        ema = ModelEmaV3(plain, decay=cfg.ema_decay) if cfg.ema_decay else None
        resume(cfg, accelerator, ema, checkpoint, state.step)
        loaders = (train_loader, val_loader)
        run = Training(cfg, accelerator, model, optimizer, ema, criterion, mixup, loaders, tuple(batches), names, state)
        return train_and_export(run, updates_per_epoch)
    finally:
        if lock is not None:
            lock.release()


def train_and_export(run: Training, updates_per_epoch: int | None) -> Summary:
    """Train to the last step (or a stop signal), then export the last weights and write the run's summary."""
    cfg, accelerator, state = run.cfg, run.accelerator, run.state
    try:
        with run.stop:
            train_steps(run)
    except KeyboardInterrupt:  # a second signal: at once, the last complete checkpoint left as it was
        signum = run.stop.again or signal.SIGINT
        raise Interrupted(
            f"Stopped at once by a second {signum.name} at step {state.step}, its checkpoint not written. Last "
            f"checkpoint: {last_checkpoint(run.output_dir)}. Continue with: {resume_command(cfg)}",
            signum,
        ) from None
    except UnreadableImage as error:
        raise TrainingError(str(error).strip().splitlines()[-1]) from None
    finally:
        run.progress.close()  # the bar's line ends before any message

    export(run, run.output_dir)
    summary = summarize(run, updates_per_epoch)
    if accelerator.is_main_process:
        write_summary(run.output_dir, summary)
        accelerator.print("summary: " + json.dumps(dataclasses.asdict(summary)))
    accelerator.end_training()
    return summary
