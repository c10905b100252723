"""Atomic file writes: nothing wmtp writes (metrics, checkpoints, tokenizers) is ever half-written.

``atomic_path(path)`` yields a temporary path in the same folder; when the block succeeds the
file is renamed onto ``path`` (``os.replace`` is atomic on one filesystem), otherwise removed.
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
