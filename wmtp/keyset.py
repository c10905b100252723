"""The draft key set of Windowed-MTP: the one definition, and the forms derived from it.

Windowed-MTP (arXiv 2607.21535, Sec. 3) lets the MTP draft head attend only to the first
``n_sink`` tokens (attention sinks) and the most recent ``window`` tokens. For a query at
absolute position ``t`` (0-based; its own key is at ``t``) the draft may read key ``j`` iff

    j <= t  and  ( j < n_sink  or  j > t - window )

so ``window`` counts the query's own key and the set holds ``min(t + 1, n_sink + window)``
keys. With ``S = t + 1`` this is the paper's ``{0 .. n_sink-1} ∪ {S-window .. S-1}``.
``window=None`` means the full causal set ``{0 .. t}``; ``n_sink=0`` is a pure sliding
window. The target model verifies with its own layers' key sets, the same as in dense decoding
(full causal in its global layers, a sliding window in its local ones); only the draft's changes.

``in_key_set`` below is that formula and nothing else. Every other form — the two key
ranges a kernel loops over, index lists, boolean masks, the CSR layout for a batch — is
derived from it here and tested against it with literal index lists (tests/test_keyset.py).

Positions (DESIGN.md): keys carry RoPE of their absolute position by default, as in the paper.
``positions="reindexed"`` is StreamingLLM's alternative (Xiao et al., 2023, Sec. 3.2): inside
the key set, key ``i`` (ascending) sits at position ``i`` and the query at the set's last index,
``reindexed_key_positions``. RoPE scores depend only on the distance between query and key, so
this needs no second copy of the cache: a recent key moves by the same shift as the query (its
distance ``t - j`` is unchanged), and only the sinks change, to the distance from
``sink_query_position(t) = min(t, n_sink + window - 1)``. Re-indexed attention is therefore
the usual attention with the sink keys scored by the query rotated to that position (the
attention ops' ``q_sink``; wmtp/block.py rotates it).
"""

from __future__ import annotations

import operator

import torch

__all__ = [
    "POSITIONS",
    "as_position",
    "as_positions",
    "check_key_set_args",
    "check_positions",
    "in_key_set",
    "key_ranges",
    "key_count",
    "draft_key_indices",
    "draft_key_mask",
    "draft_key_csr",
    "reindexed_key_positions",
    "sink_query_position",
]

POSITIONS = ("absolute", "reindexed")  # RoPE positions of the draft's keys: the paper's, or StreamingLLM's
LIMIT = 2**62  # the largest n_sink, window and position: they meet int64 positions, and n_sink + window must fit


def check_key_set_args(n_sink: int | None, window: int | None) -> int:
    """Validate ``(n_sink, window)`` and return ``n_sink`` with ``None`` read as 0.

    Raises:
        ValueError: if ``n_sink`` is not an integer in ``[0, LIMIT]`` or ``window`` is not ``None`` or an
            integer in ``[1, LIMIT]`` (a larger one wrapped when torch compared it with int64 positions: a
            silently wrong key set, or an OverflowError).
    """
    n_sink = 0 if n_sink is None else n_sink
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
        raise ValueError(f"n_sink must be a non-negative integer, got {n_sink!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive integer or None (full causal set), got {window!r}")
    for name, value in (("n_sink", n_sink), ("window", window)):
        if value is not None and value > LIMIT:
            raise ValueError(f"{name} must be at most 2**62 (positions are int64), got {value}")
    return n_sink


def in_key_set(t: torch.Tensor, j: torch.Tensor, n_sink: int | None, window: int | None) -> torch.Tensor:
    """THE key-set formula: may a draft query at position ``t`` read the key at position ``j``?

    ``t`` and ``j`` broadcast against each other (e.g. ``t[:, None]`` and ``j[None, :]``).
    """
    n_sink = check_key_set_args(n_sink, window)
    causal = j <= t
    if window is None:
        return causal
    return causal & ((j < n_sink) | (j > t - window))


def is_integer_tensor(t: torch.Tensor) -> bool:
    """Whether ``t`` holds integers (token ids, positions): not floating, complex or bool."""
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def as_positions(q_pos) -> torch.Tensor:
    """``q_pos`` (a tensor, a list of ints, a numpy array) as a tensor, else ``ValueError`` (``None``, a
    string, ragged lists: torch's TypeError, RuntimeError or unnamed ValueError otherwise). A list's integer
    scalars are read by ``as_int`` (torch refuses a 0-d array in a list); an empty list is no positions,
    int64 (torch would make it float32)."""
    if isinstance(q_pos, (list, tuple)):
        if not q_pos:
            return torch.zeros(0, dtype=torch.long)
        q_pos = [as_int(p) for p in q_pos]
    try:
        return torch.as_tensor(q_pos)
    except (TypeError, RuntimeError, ValueError):
        raise ValueError(f"q_pos must be a tensor (or list) of integer positions, got {type(q_pos).__name__}"
                         ) from None


def as_int(value):
    """``value`` as an ``int`` where it is an integer scalar: an int, a NumPy integer or a 0-d integer tensor;
    anything else unchanged, for a check to refuse by name (a bool, a float, a 1-D tensor: torch would read a
    one-element one as its element, a bool tensor as 0 or 1)."""
    if isinstance(value, (bool, int)) or getattr(value, "ndim", 0) != 0 or getattr(value, "dtype", None) == torch.bool:
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def as_key_set_args(n_sink, window) -> tuple[int, int | None]:
    """``(n_sink, window)`` as ints (``as_int``; ``None`` for ``n_sink`` read as 0), checked by
    ``check_key_set_args``: what the key-set functions below take."""
    window = as_int(window)
    return check_key_set_args(as_int(n_sink), window), window


def as_position(t, name: str = "a query position") -> int:
    """``t`` as a position: an integer scalar (``as_int``) in ``[0, LIMIT]``, else ``ValueError`` naming
    ``name`` (5.5 is no position; 2**64 no int64 one; a one-element 1-D tensor is no scalar)."""
    t = as_int(t)
    if isinstance(t, bool) or not isinstance(t, int):
        raise ValueError(f"{name} must be an integer, got {t!r}")
    if t < 0:
        raise ValueError(f"{name} must be >= 0, got {t}")
    if t > LIMIT:
        raise ValueError(f"{name} must be at most 2**62 (positions are int64), got {t}")
    return t


def key_ranges(t: int, n_sink: int | None, window: int | None) -> tuple[tuple[int, int], tuple[int, int]]:
    """The key set of position ``t`` as two disjoint half-open ranges ``(sink, recent)``.

    ``sink = [0, a)`` and ``recent = [b, t + 1)`` with ``a <= b``; either may be empty. This is
    the form the kernels loop over: two contiguous key ranges, never a gathered copy.
    """
    n_sink, window = as_key_set_args(n_sink, window)
    t = as_position(t)
    if window is None:
        return (0, 0), (0, t + 1)
    a = min(n_sink, t + 1)  # sinks that exist yet
    b = max(n_sink, t - window + 1)  # first recent key that is not already a sink
    return (0, a), (min(b, t + 1), t + 1)


def key_count(t: int, n_sink: int | None, window: int | None) -> int:
    """Number of keys a draft query at position ``t`` reads: ``min(t + 1, n_sink + window)``."""
    (s0, s1), (r0, r1) = key_ranges(t, n_sink, window)
    return (s1 - s0) + (r1 - r0)


def draft_key_indices(t: int, n_sink: int | None, window: int | None) -> torch.Tensor:
    """Key positions the draft query at position ``t`` may read, ascending.

    Example: ``draft_key_indices(19, n_sink=2, window=6)`` is ``[0, 1, 14, 15, 16, 17, 18, 19]``.
    ``t``, ``n_sink`` and ``window`` may each be an int, a NumPy integer or a 0-d integer tensor (``as_int``).

    Args:
        t: absolute query position (0-based).
        n_sink: number of attention-sink keys at the start (``None`` = 0).
        window: number of recent keys including the query's own (``None`` = full causal set).

    Returns:
        LongTensor ``(min(t + 1, n_sink + window),)`` of key positions (``(t + 1,)`` for ``window=None``).

    Raises:
        ValueError: for a ``t`` that is not an integer >= 0 (a 1-D tensor, even of one element, is
            none), or a bad ``(n_sink, window)`` (``check_key_set_args``).
    """
    (s0, s1), (r0, r1) = key_ranges(t, n_sink, window)
    return torch.cat([torch.arange(s0, s1), torch.arange(r0, r1)])


def draft_key_mask(q_pos: torch.Tensor, kv_len: int, n_sink: int | None, window: int | None) -> torch.Tensor:
    """Boolean mask ``(len(q_pos), kv_len)``: ``mask[i, j]`` iff query ``q_pos[i]`` may read key ``j``.

    Args:
        q_pos: ``(Lq,)`` absolute query positions: an integer tensor (any integer dtype) or a list of ints.
        kv_len: number of key positions (columns).
        n_sink: number of sink keys (``None`` = 0; an integer scalar as ``draft_key_indices``').
        window: recent-window size including the query (``None`` = full causal set; likewise).

    Returns:
        BoolTensor ``(Lq, kv_len)`` on ``q_pos``'s device (``(0, kv_len)`` for no queries, ``[]`` included).

    Raises:
        ValueError: for ``q_pos`` that is not 1-D integer positions >= 0, a ``kv_len`` that is not an
            int >= 0, or a bad ``(n_sink, window)``.
    """
    n_sink, window = as_key_set_args(n_sink, window)
    q_pos = as_positions(q_pos)
    if q_pos.dim() != 1 or not is_integer_tensor(q_pos):
        raise ValueError(f"q_pos must be a 1-D tensor of integer positions, got {q_pos.dtype} {tuple(q_pos.shape)}")
    q_pos = q_pos.long()  # torch has no min of uint16, 32 or 64; a uint64 position past 2**63 reads as < 0
    if q_pos.numel() and int(q_pos.min()) < 0:
        raise ValueError(f"query positions must be >= 0 (and below 2**63), got {int(q_pos.min())}")
    if isinstance(kv_len, bool) or not isinstance(kv_len, int) or not 0 <= kv_len <= LIMIT:
        raise ValueError(f"kv_len must be an int >= 0 (at most 2**62), got {kv_len!r}")
    j = torch.arange(kv_len, device=q_pos.device)
    return in_key_set(q_pos[:, None], j[None, :], n_sink, window)  # (Lq, kv_len)


def draft_key_csr(
    q_pos: torch.Tensor | list[torch.Tensor], n_sink: int | None, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR form of the key sets of many queries: ``(indptr, indices)``.

    Row ``r`` (the r-th query, sequences concatenated in order when a list is given) reads keys
    ``indices[indptr[r]:indptr[r + 1]]``, ascending positions within its own sequence. This is
    the layout that paged kernels and FlashInfer-style sparse attention consume.

    Args:
        q_pos: ``(Lq,)`` positions of one sequence (a tensor, or a list of ints), or a list of such
            tensors (one per sequence).
        n_sink: number of sink keys (``None`` = 0; an integer scalar as ``draft_key_indices``').
        window: recent-window size including the query (``None`` = full causal set; likewise).

    Returns:
        ``indptr`` LongTensor ``(R + 1,)`` and ``indices`` LongTensor ``(nnz,)``, on the CPU.

    Raises:
        ValueError: for positions that are not 1-D integer tensors (or lists of ints) of positions
            >= 0, or a bad ``(n_sink, window)``.
    """
    # positions of one sequence unless an element is a sequence (a list, or a tensor or array of a dim):
    # [1.5, 2.0] is one sequence of float positions, refused as such
    one = not isinstance(q_pos, (list, tuple)) or not any(isinstance(t, (list, tuple)) or getattr(t, "ndim", 0)
                                                          for t in q_pos)
    seqs = [as_positions(seq) for seq in ([q_pos] if one else q_pos)]
    n_sink, window = as_key_set_args(n_sink, window)
    for seq in seqs:  # an empty tensor (not list) of another dtype: no positions, no dtype to check
        if seq.dim() != 1 or (seq.numel() and not is_integer_tensor(seq)):
            raise ValueError(f"q_pos must be (Lq,) integer positions or a list of such, got {seq.dtype} "
                             f"{tuple(seq.shape)}")
    rows = [draft_key_indices(t, n_sink, window) for seq in seqs for t in seq.tolist()]
    counts = torch.tensor([len(r) for r in rows], dtype=torch.long)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    indices = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return indptr, indices


def check_positions(positions: str) -> str:
    """``positions`` if it names one of ``POSITIONS``, else ``ValueError``."""
    if positions not in POSITIONS:
        raise ValueError(f"unknown positions {positions!r}; choose one of {', '.join(POSITIONS)}")
    return positions


def reindexed_key_positions(t: int, n_sink: int | None, window: int | None) -> tuple[torch.Tensor, int]:
    """StreamingLLM's positions for the key set of ``t``: ``(key positions, query position)``.

    The i-th key of ``draft_key_indices(t, ...)`` sits at position ``i``, the query at the last
    index. Example: ``t=19, n_sink=2, window=6`` reads keys ``[0, 1, 14, .., 19]`` at positions
    ``[0, 1, 2, .., 7]`` with the query at 7 (absolute: 19). The definition the attention ops'
    ``q_sink`` is tested against (tests/test_positions.py); they never build these lists.
    """
    count = key_count(t, n_sink, window)
    return torch.arange(count), count - 1


def sink_query_position(t, n_sink: int | None, window: int | None):
    """The position to rotate a query at ``t`` to when it scores the sinks under re-indexed positions.

    ``min(t, n_sink + window - 1)`` (module docstring); ``t`` itself when there is nothing to
    re-index (``window=None``, or no sinks). ``t``: an integer scalar (``as_int``), or a tensor of positions.
    """
    n_sink, window = as_key_set_args(n_sink, window)
    t = t if torch.is_tensor(t) else as_position(t)
    if window is None or n_sink == 0:
        return t
    last = n_sink + window - 1
    return t.clamp(max=last) if torch.is_tensor(t) else min(t, last)


def render_mask(kv_len: int = 24, n_sink: int = 4, window: int = 6) -> str:
    """Draw the key set of every query ``t < kv_len`` as text: ``#`` read, ``.`` skipped."""
    mask = draft_key_mask(torch.arange(kv_len), kv_len, n_sink, window)
    lines = [f"n_sink={n_sink} window={window}  (row t = query position, column j = key position)"]
    lines += [f"t={t:3d} " + "".join("#" if m else "." for m in row.tolist()) for t, row in enumerate(mask)]
    return "\n".join(lines)
