"""Writing result files so that readers never see half of one, and matplotlib for the pictures.

A report, a summary or a picture is read while runs still write (a study rebuilt mid-way, a benchmark killed by its
time limit): each is written under a partial name beside its final one and renamed over it when complete, which
POSIX makes atomic within a folder.

Some writers (safetensors' ``save_file``) create their files readable by the owner only; ``apply_umask`` gives them
the permissions the user's umask gives any new file.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["MissingExtra", "apply_umask", "atomic_write", "import_pyplot", "write_text"]


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a path beside ``path`` to write to; when the block ends, rename it to ``path``.

    The partial file is named by this process (``results.partial-<pid>.md``), so two processes writing one path
    never write into each other's, and keeps the suffix, which writers such as matplotlib's ``savefig`` read the
    format from. If the block raises, the partial file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    partial = path.with_name(f"{path.stem}.partial-{os.getpid()}{path.suffix}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # only there when the block failed


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_write``)."""
    with atomic_write(path) as partial:
        partial.write_text(text, encoding="utf-8")


def _umask() -> int:
    """The process's umask, read without changing it (Linux), else set and restored at once."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def apply_umask(path: str | os.PathLike) -> None:
    """Give ``path`` (a file, or a folder and everything in it) the permissions the umask gives a new one:
    ``0o666 & ~umask`` for files, ``0o777 & ~umask`` for folders (0644 and 0755 under umask 022); symbolic links
    are left alone."""
    mask = _umask()
    path = Path(path)
    for item in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if not item.is_symlink():
            os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra installs it."""


def import_pyplot(alternative: str | None = None) -> Any:
    """``matplotlib.pyplot`` drawing to files (the Agg backend: no display needed), or :class:`MissingExtra` saying
    how to install it; ``alternative`` names another way out, such as a flag that skips the pictures."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        otherwise = f" (or {alternative})" if alternative else ""
        raise MissingExtra(f"Pictures need matplotlib: pip install 'iris-timm[bench]'{otherwise}.") from error
    return plt
