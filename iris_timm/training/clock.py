"""The training clock: seconds of training (evaluations and checkpoints excluded), and the step count that ends a
run at its time budget, so that models trained for equal time compare what each learns per second."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from accelerate.utils import broadcast_object_list

from .run_folder import TrainerState

__all__ = ["PACE_STEPS", "TrainingClock", "fit_to_budget"]

PACE_STEPS = (10, 40)  # the pace is measured from the first of these steps (after the warm-up), and the step count
# fitted to the budget at the second, then again after every step at the pace measured so far


def fit_to_budget(budget_s: float, state: TrainerState, pace_s: float) -> int:
    """The step count that ends training about ``budget_s`` seconds in, going on at ``pace_s`` seconds per step.

    Fixing the count, rather than stopping when the clock runs out, lets the learning-rate schedule end where the
    budget does, and keeps a resumed run on the same schedule. It never exceeds the recipe's count."""
    remaining = max(budget_s - state.train_time_s, 0.0)
    return min(state.recipe_steps or state.total_steps, state.step + int(remaining / pace_s))


class TrainingClock:
    """Counts seconds of training into ``state.train_time_s``: the time from one step to the next, less what runs
    while ``paused()``. With a time budget or timed evaluations every process counts the main process's seconds, so
    all of them stop and evaluate at the same step."""

    def __init__(self, state: TrainerState, budget_s: float | None, eval_every_s: float | None, processes: int):
        self.state, self.budget_s, self.eval_every_s, self.processes = state, budget_s, eval_every_s, processes
        self.started = self.mark = time.perf_counter()

    def tick(self) -> float | None:
        """Count the step just made. With a time budget, refit ``state.total_steps`` after every step from
        PACE_STEPS[1] on (a run whose pace drifts still ends within a step of its budget); returns the pace (seconds a
        step) when the count changed, else None."""
        state, now = self.state, time.perf_counter()
        state.train_time_s += now - self.mark
        self.mark = now
        if (self.budget_s or self.eval_every_s) and self.processes > 1:
            state.train_time_s = broadcast_object_list([state.train_time_s])[0]
        if not self.budget_s:
            return None
        if state.step == PACE_STEPS[0]:
            state.pace_from_s = state.train_time_s
        if state.step < PACE_STEPS[1] or state.pace_from_s is None:
            return None
        pace = (state.train_time_s - state.pace_from_s) / (state.step - PACE_STEPS[0])
        total_steps = fit_to_budget(self.budget_s, state, pace)
        if state.budget_fitted and total_steps == state.total_steps:
            return None
        state.total_steps, state.budget_fitted = total_steps, True
        return pace

    def evaluation_due(self) -> bool:
        """Whether the clock has passed a multiple of eval_every_s since the last evaluation."""
        every = self.eval_every_s
        return bool(every) and self.state.train_time_s // every > self.state.last_eval_s // every

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in the block is not training time."""
        try:
            yield
        finally:
            self.mark = time.perf_counter()

    def wall_time_s(self) -> float:
        """Seconds since this process started the clock (a resumed run counts from its resume)."""
        return time.perf_counter() - self.started
