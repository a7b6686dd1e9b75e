"""The one error type of the training support: what a user can fix (a recipe value, a dataset, a run folder), with a
message that says what is wrong and what to do. ``train.py`` prints it as one line and exits non-zero."""

import signal

__all__ = ["Interrupted", "TrainingError", "WrongLaunch"]


class TrainingError(Exception):
    """A run cannot start or go on as configured; ``str(error)`` is the one line to show the user, ``exit_code`` the
    status a program ends with."""

    exit_code = 1


class Interrupted(TrainingError):
    """Training was stopped by a signal (Ctrl-C's SIGINT, or SIGTERM); the message says how to continue. The exit
    status is the one a shell gives a process that signal ended: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, message: str, signum: signal.Signals = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class WrongLaunch(TrainingError):
    """The launch started processes that cannot train together (several, each run alone). Every process of the launch
    raises it; one per machine shows it and ends the launch (:mod:`.launch`)."""
