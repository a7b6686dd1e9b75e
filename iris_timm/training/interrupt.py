"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM (``kill``, a job scheduler) without losing a step.

The first signal asks the run to stop once the step it is in is done: it writes a checkpoint there and ends, saying
how to continue (:func:`iris_timm.training.trainer.stop_if_asked`). A second one ends it at once, as a
``KeyboardInterrupt``: a checkpoint being written then is left under its '.tmp-' name, never picked, and the last
complete checkpoint as it was.
"""

import signal
import threading
import time

__all__ = ["REPEAT_AFTER_S", "STOP_SIGNALS", "StopSignals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A launcher (torchrun's agent, under `accelerate launch`) passes on to its processes the Ctrl-C the terminal has
# already sent them: a signal this soon after the first is that same request again, not a second one.
REPEAT_AFTER_S = 1.0


class StopSignals:
    """While entered, SIGINT and SIGTERM are recorded in ``received`` instead of ending the process; a second one,
    ``REPEAT_AFTER_S`` or more after the first, is recorded in ``again`` and raises ``KeyboardInterrupt`` at once.
    Python runs signal handlers in the main thread only: entered in another thread, it changes nothing."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.again: signal.Signals | None = None
        self._received_at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received, self._received_at = signal.Signals(signum), time.monotonic()
        elif time.monotonic() - self._received_at >= REPEAT_AFTER_S:
            self.again = signal.Signals(signum)
            raise KeyboardInterrupt
