"""Atomic file writes: nothing wmtp writes (metrics, checkpoints, tokenizers) is ever half-written.

``atomic_path(path)`` yields a temporary path in the same folder; when the block succeeds the
file is renamed onto ``path`` (``os.replace`` is atomic on one filesystem), otherwise removed.
``check_writable(path)`` says up front, as a ``ValueError``, why ``path`` could not be written, and
``check_distinct`` that two paths are not one file, so a command fails before its work rather than
after it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Write to the yielded temporary path; it becomes ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already unless the write or the rename failed


def check_writable(path: str | Path, what: str = "output") -> None:
    """Raise ``ValueError`` if a file could not be written at ``path`` (the folders above it are
    created as needed): ``path`` is a folder, or its nearest existing ancestor is not a writable folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder, not a file path")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} cannot be written: {parent} is not a writable folder")
    try:  # os.access says yes to root everywhere (a read-only mount, /proc): try a file there
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be written: {parent} refuses a new file ({e.strerror})") from None


def check_distinct(first: str | Path, second: str | Path, what_first: str, what_second: str) -> None:
    """Raise ``ValueError`` if two outputs (or an input and an output) are one file: the second
    would overwrite the first (a metrics JSON named ``.png`` and its plot, say)."""
    if Path(first).resolve() == Path(second).resolve():
        raise ValueError(f"{what_second} {second} is the same file as {what_first} {first}: give them two names")
