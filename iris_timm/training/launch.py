"""How this process was launched: the processes a launch asked for, and how a launch that cannot train ends.

``accelerate launch --multi_gpu`` (or a GPU config such as ``configs/accelerate/multi_gpu.yaml``) and torchrun on a
machine without GPUs start processes that Accelerate runs alone; ``accelerate launch --cpu --num_processes N`` starts
one. Every such process stops with a :class:`~.errors.WrongLaunch`; one per machine says so (:func:`speaks_for_launch`)
and ends the launch (:func:`stop_launcher`), so that the message shows once and no launcher traceback follows it.
"""

import os
import stat
import sys
import time
from pathlib import Path

import psutil

__all__ = ["accelerate_launcher", "requested_processes", "speaks_for_launch", "stop_launcher"]

# How `accelerate launch` shows in a process's command line: its console scripts, or `python -m` of its module.
_LAUNCH_PROGRAMS = {"accelerate-launch", "accelerate.commands.launch"}


def accelerate_launcher() -> psutil.Process | None:
    """The `accelerate launch` process that started this one, or None. Accelerate marks the processes it launches
    with ACCELERATE_MIXED_PRECISION; the parent's command line tells an `accelerate launch` from another parent that
    passed the variable on."""
    if "ACCELERATE_MIXED_PRECISION" not in os.environ:
        return None
    parent = psutil.Process().parent()
    names = [Path(word).name for word in parent.cmdline()[:3]] if parent is not None else []
    if _LAUNCH_PROGRAMS & set(names) or names[1:3] == ["accelerate", "launch"]:
        return parent
    return None


def requested_processes() -> int:
    """How many processes the launch asked for: WORLD_SIZE (torchrun, accelerate's multi-process launchers) or the
    `--num_processes` of an `accelerate launch` parent that started this one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ["WORLD_SIZE"])
    launcher = accelerate_launcher()
    words = launcher.cmdline() if launcher is not None else []
    for i, word in enumerate(words):
        value = word.split("=", 1)[1] if word.startswith("--num_processes=") else words[i + 1 : i + 2]
        if word.startswith("--num_processes") and value:
            return int(value if isinstance(value, str) else value[0])
    return 1


def speaks_for_launch() -> bool:
    """Whether this process is the one of its machine that reports what stops the launch (local rank 0)."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def stop_launcher(timeout_s: float = 30.0) -> None:
    """End the launch through the `accelerate launch` that started this process, once this machine's other processes
    of it have ended: a SIGTERM, on which Accelerate stops its processes (this one included) and exits with status
    143 without a traceback, where a failed process makes it print torchrun's. Returns at once when no `accelerate
    launch` started this process, else when the launcher has ended or after ``timeout_s``."""
    launcher = accelerate_launcher()
    if launcher is None:
        return
    others = [process for process in launcher.children() if process.pid != os.getpid()]
    psutil.wait_procs(others, timeout=timeout_s)  # they end quietly; stopped by the launcher, each would log a line
    wait_until_passed_on(launcher)
    launcher.terminate()
    try:
        launcher.wait(timeout_s)
    except psutil.TimeoutExpired:
        pass


def _stderr_unread() -> int:
    """The bytes this process wrote to its stderr that its reader has not taken yet, where stderr is a pipe (0 where
    it is not, or where the platform cannot tell)."""
    try:
        import fcntl
        import termios

        if not stat.S_ISFIFO(os.fstat(sys.stderr.fileno()).st_mode):
            return 0
        return int.from_bytes(fcntl.ioctl(sys.stderr.fileno(), termios.FIONREAD, bytes(4)), sys.byteorder)
    except (ImportError, OSError, ValueError):
        return 0


def wait_until_passed_on(launcher: psutil.Process, timeout_s: float = 5.0) -> None:
    """Wait, at most ``timeout_s``, until the launcher has read what this process wrote to stderr and waits for
    more. `accelerate launch` reads its process's stderr through a pipe and writes it on: stopped between the two, it
    would drop the message that says why the launch ends."""
    deadline = time.monotonic() + timeout_s
    idle = 0
    while idle < 2 and time.monotonic() < deadline:  # twice in a row: not just between a read and its write
        idle = idle + 1 if _stderr_unread() == 0 and launcher.status() == psutil.STATUS_SLEEPING else 0
        time.sleep(0.02)
