"""Writing result files so that readers never see half of one, and matplotlib for the pictures.

A report, a summary or a picture is read while runs still write (a study rebuilt mid-way, a benchmark killed by its
time limit): each is written under a partial name beside its final one and renamed over it when complete, which
POSIX makes atomic within a folder.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "import_pyplot", "write_text"]


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a path beside ``path`` to write to; when the block ends, rename it to ``path``.

    The partial file keeps the suffix (``results.partial.md``), which writers such as matplotlib's ``savefig`` read
    the format from. If the block raises, the partial file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    partial = path.with_name(f"{path.stem}.partial{path.suffix}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # only there when the block failed


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_write``)."""
    with atomic_write(path) as partial:
        partial.write_text(text, encoding="utf-8")


def import_pyplot(alternative: str | None = None) -> Any:
    """``matplotlib.pyplot`` drawing to files (the Agg backend: no display needed), or exit saying how to install
    it; ``alternative`` names another way out, such as a flag that skips the pictures."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        otherwise = f" (or {alternative})" if alternative else ""
        raise SystemExit(f"Pictures need matplotlib: pip install 'iris-timm[bench]'{otherwise}.") from error
    return plt
