"""Atomic file writes: nothing wmtp writes (metrics, checkpoints, tokenizers) is ever half-written.

``atomic_path(path)`` yields a temporary path in the same folder; when the block succeeds the
file is renamed onto ``path`` (``os.replace`` is atomic on one filesystem), otherwise removed.
``check_writable(path)`` says up front, as a ``ValueError``, why ``path`` could not be written, and
``check_distinct`` that two paths are not one file, and ``check_cache_dir`` that a cache folder can
be made and holds no output, so a command fails before its work rather than after it. A symbolic
link is written through (its target replaced, the link kept); a device, FIFO or socket is refused,
never replaced by a regular file. Library plumbing, beyond the paper (arXiv 2607.21535).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Write to the yielded temporary path; it becomes ``path`` (a link's target, for a symbolic
    link) only if the block succeeds. ``ValueError`` if ``path`` exists and is not a regular file."""
    path = _regular(Path(path), "output")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot make folder {path.parent}: {e.strerror}") from None
    try:  # the name's first 64 bytes: a name of the longest length leaves no room for more
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{os.fsdecode(os.fsencode(path.name)[:64])}.",
                                   suffix=".tmp")
    except OSError as e:  # name the file asked for, not the temporary one
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from None
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already unless the write or the rename failed


def check_writable(path: str | Path, what: str = "output") -> None:
    """Raise ``ValueError`` if a file could not be written at ``path`` (the folders above it are
    created as needed): ``path`` is a folder, a device, FIFO or socket (or a link to one), a name
    the file system refuses (too long), or its nearest existing ancestor is not a writable folder."""
    given = Path(path)
    try:
        why = _unwritable(_regular(given, what).parent)
    except OSError as e:  # a name longer than the file system takes, say
        why = e.strerror or type(e).__name__
    if why is not None:
        raise ValueError(f"{what} {given} cannot be written: {why}")


def _unwritable(folder: Path) -> str | None:
    """Why no file could be made in ``folder`` (made as needed, below its nearest existing ancestor),
    or ``None`` if one can."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not a writable folder"
    try:  # os.access says yes to root everywhere (a read-only mount, /proc): try a file there
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"{folder} refuses a new file ({e.strerror})"
    return None


def _regular(given: Path, what: str) -> Path:
    """The path written for ``given`` (a symbolic link's target); ``ValueError`` naming ``given``
    if that exists and is not a regular file."""
    path = Path(os.path.realpath(given)) if given.is_symlink() else given
    name = f"{given}" if path == given else f"{given} (a link to {path})"
    if path.is_dir():
        raise ValueError(f"{what} {name} is a folder, not a file path")
    if path.exists() and not path.is_file():
        raise ValueError(f"{what} {name} is not a regular file (a device, FIFO or socket): it would be replaced")
    return path


def check_cache_dir(cache_dir: str | Path, outputs: dict[str, str | Path | None]) -> None:
    """Raise ``ValueError`` if the cache folder ``cache_dir`` could not be made (an existing one may
    be read-only: a cache already filled is only read), or if an output (``{what: path}``, ``None``
    skipped) lies inside it, where it could overwrite a cached tokenizer or checkpoint."""
    cache_dir = Path(cache_dir)
    why = None if cache_dir.is_dir() else _unwritable(cache_dir)
    if why is not None:  # the folder asked for, not a file in it, named
        raise ValueError(f"--cache-dir {cache_dir} cannot be made: {why}")
    for what, path in outputs.items():
        if path is not None and Path(path).resolve().is_relative_to(cache_dir.resolve()):
            raise ValueError(f"{what} {path} is inside --cache-dir {cache_dir}: write it elsewhere")


def check_distinct(first: str | Path, second: str | Path, what_first: str, what_second: str) -> None:
    """Raise ``ValueError`` if two outputs (or an input and an output) are one file: the second
    would overwrite the first (a metrics JSON named ``.png`` and its plot, say)."""
    if Path(first).resolve() == Path(second).resolve():
        raise ValueError(f"{what_second} {second} is the same file as {what_first} {first}: give them two names")
