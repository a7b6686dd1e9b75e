"""The one error type of the training support: what a user can fix (a recipe value, a dataset, a run folder), with a
message that says what is wrong and what to do. ``train.py`` prints it as one line and exits non-zero."""

__all__ = ["Interrupted", "TrainingError", "WrongLaunch"]


class TrainingError(Exception):
    """A run cannot start or go on as configured; ``str(error)`` is the one line to show the user, ``exit_code`` the
    status a program ends with."""

    exit_code = 1


class Interrupted(TrainingError):
    """Training was stopped (Ctrl-C) after its last checkpoint; the message says how to continue."""

    exit_code = 130


class WrongLaunch(TrainingError):
    """The launch started processes that cannot train together (several, each run alone). Every process of the launch
    raises it; one per machine shows it and ends the launch (:mod:`.launch`)."""
