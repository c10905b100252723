"""Argument checks shared across wmtp: one definition each of what an integer size, a real number,
a seed and a tensor argument must be. Each raises a one-line ``ValueError`` that names the argument
and the value it got (bad input is a clear ``ValueError``, never a ``TypeError`` or ``IndexError``
from deep inside torch). The key set's own arguments are checked in wmtp/keyset.py
(``check_key_set_args``), next to its formula. Library plumbing, beyond the paper (arXiv 2607.21535).
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["SEED_LIMIT", "as_real", "check_int", "check_number", "check_seed", "check_tensors"]

SEED_LIMIT = 2**64  # seeds are ints in [0, 2**64): torch's manual_seed takes them, sampled verification hashes 64 bits


def check_int(name: str, value, low: int) -> None:
    """``value`` must be an ``int`` (not a bool, not a float such as 2.0) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_number(name: str, value, *, positive: bool, finite: bool = True) -> None:
    """``value`` must be a real number (not a bool, not NaN), ``> 0`` if ``positive`` else ``>= 0``,
    and finite unless ``finite=False`` (``inf`` then reads as "no limit")."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value) and (
        value > 0 if positive else value >= 0) and (finite is False or math.isfinite(value))
    if not ok:
        raise ValueError(f"{name} must be a{' finite' if finite else ''} number {'>' if positive else '>='} 0, "
                         f"got {value!r}")


def as_real(value):
    """``value`` as a ``float`` where it is a real number that is neither an int nor a float (a NumPy scalar
    such as ``np.float32(0.5)``; not a bool); anything else unchanged, for ``check_number`` to refuse by
    name. For arguments kept as floats: a config keeps what it is given (JSON takes no ``np.float32``)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, int, float)):
        return float(value)
    return value


def check_seed(seed, name: str = "seed") -> None:
    """``seed`` must be an ``int`` in ``[0, 2**64)``. A negative seed is refused: torch would take -1
    as 2**64 - 1, so two seeds would draw the same numbers."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{name} must be an int in [0, 2**64), got {seed!r}")


def check_tensors(**named) -> None:
    """Each named argument must be a ``torch.Tensor`` (a list or a NumPy array is refused by name)."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
