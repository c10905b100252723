"""Public attention op with an explicit implementation switch (arXiv 2607.21535, Sec. 3).

``attention(q, k, v, q_pos, n_sink, window, impl)`` computes attention of queries at absolute
positions ``q_pos`` over the keys of wmtp/keyset.py's key set, on a contiguous cache;
``paged_attention(q, k_pages, v_pages, block_table, q_pos, ...)`` does the same on a paged cache.
``impl="torch"`` is the plain PyTorch reference (attention/reference.py, attention/paged.py);
``impl="triton"`` the split-K kernel of attention/triton_attention.py. ``impl="auto"`` resolves
once, by device, through ``resolve_impl``. Asking for an implementation that cannot run raises
``ValueError``: there is no silent fallback; the ops' argument checks are in attention/arguments.py.
Triton is imported only when it is used, so ``import wmtp`` works without it.
"""

from __future__ import annotations

import functools
import os

import torch

from ..checks import check_tensors
from ..keyset import as_positions, check_key_set_args, is_integer_tensor
from .arguments import check_pages, check_positions, check_q_sink, check_shapes, triton_refuses
from .paged import paged_attention_torch
from .plan import max_tile_rows
from .reference import attention_torch

IMPLS = ("auto", "torch", "triton")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)

__all__ = ["attention", "paged_attention", "resolve_impl", "IMPLS"]


@functools.lru_cache(maxsize=None)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _triton_unsupported(dtype: torch.dtype | None, head_dim: int | None, group: int | None) -> str | None:
    """Why the Triton kernel cannot take these inputs, or ``None`` if it can."""
    if dtype is not None and dtype not in TRITON_DTYPES:
        return f"dtype {dtype} (the kernel takes float16, bfloat16, float32 or float64)"
    if head_dim is not None and head_dim not in TRITON_HEAD_DIMS:
        return f"head_dim {head_dim} (the kernel takes {', '.join(map(str, TRITON_HEAD_DIMS))})"
    if group is not None and dtype is not None and head_dim is not None and group > max_tile_rows(dtype, head_dim):
        return f"{group} query heads per kv head at {dtype}, head_dim {head_dim} (its tile holds " \
               f"{max_tile_rows(dtype, head_dim)} rows)"
    return None


def resolve_impl(impl: str, device: torch.device | str, dtype: torch.dtype | None = None,
                 head_dim: int | None = None, group: int | None = None) -> str:
    """Resolve ``impl`` for tensors on ``device`` to a concrete implementation name.

    ``"auto"`` is ``"triton"`` for CUDA tensors when triton imports (and, if given, ``dtype``,
    ``head_dim`` and ``group``, the query heads per kv head, are ones the kernel takes), else
    ``"torch"``. ``"triton"`` runs on CUDA, or on
    CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, read only to detect it).

    Args:
        impl: ``"auto"``, ``"torch"`` or ``"triton"``.
        device: where the tensors live (a ``torch.device`` or a string such as ``"cuda:0"``).
        dtype, head_dim, group: the call's dtype, head dimension and query heads per kv head, each
            ``None`` when not known; given, ``"auto"`` picks the reference for what the kernel
            cannot take and ``"triton"`` raises.

    Returns:
        ``"torch"`` or ``"triton"``.

    Raises:
        ValueError: for an unknown name or an implementation that cannot run here.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if dtype is not None and not isinstance(dtype, torch.dtype):  # "auto" would silently pick the reference
        raise ValueError(f"dtype must be a torch.dtype or None, got {dtype!r}")
    for name, value in (("head_dim", head_dim), ("group", group)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an int or None, got {value!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:  # one line: neither a tensor's repr nor torch's list of signatures
        if isinstance(device, (str, int)):
            raise ValueError(f"bad device {device!r}: {str(e).splitlines()[0]}") from None
        raise ValueError(f"bad device: give a torch.device or a string such as 'cuda', got {type(device).__name__}"
                         ) from None
    if impl == "torch":
        return "torch"
    if impl == "auto":
        cuda = device.type == "cuda" and _triton_unsupported(dtype, head_dim, group) is None
        return "triton" if cuda and _triton_importable() else "torch"
    interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not interpreted:
        raise ValueError(f"impl='triton' needs a CUDA device (or TRITON_INTERPRET=1 for CPU tensors); got "
                         f"tensors on {device}; use impl='torch' or impl='auto'")
    if not _triton_importable():
        raise ValueError("impl='triton' needs the triton package (pip install 'wmtp[triton]'); use impl='torch'")
    reason = _triton_unsupported(dtype, head_dim, group)
    if reason is not None:
        raise ValueError(f"impl='triton' does not support {reason}; use impl='torch'")
    return "triton"


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos, impl: str,
             logical: torch.Tensor | None = None, q_sink: torch.Tensor | None = None
             ) -> tuple[str, torch.Tensor, torch.Tensor]:
    """Shared by both ops: check shapes against the ``(B, Hkv, S, D)`` cache (``logical`` for pages),
    devices and dtypes, resolve ``impl`` once, check positions where that costs no sync, and move
    them to ``q``'s device. Returns ``impl``, ``q`` (contiguous in its head dim for Triton), positions."""
    q_pos = as_positions(q_pos)
    if not is_integer_tensor(q_pos):
        raise ValueError(f"q_pos must hold integer positions, got dtype {q_pos.dtype}")
    q_pos = q_pos.long()  # (Lq,) or (B, Lq) where it was given
    group = check_shapes(q, logical if logical is not None else k, logical if logical is not None else v, q_pos)
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise ValueError(f"q, k, v must be floating point, got {q.dtype}, {k.dtype}, {v.dtype}")
    resolved = resolve_impl(impl, q.device, q.dtype, q.shape[-1], group)
    capacity = (logical if logical is not None else k).shape[2]
    refused = triton_refuses(q, k, v, q_sink, capacity) if resolved == "triton" else None
    if refused is not None and impl == "auto":  # as for a head_dim the kernel lacks: the reference
        resolved = "torch"
    elif refused is not None:
        raise ValueError(f"impl='triton' does not support {refused}; use impl='torch'")
    check_positions(resolved, q_pos, capacity)
    if resolved == "triton" and q.stride(-1) != 1:
        q = q.contiguous()  # the kernel loads each query row whole; q is small
    return resolved, q, q_pos.to(q.device)


def _same_layout(q: torch.Tensor, q_sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For the kernel, which offsets both with q's strides: unless they share them, copies of both
    with the canonical contiguous strides (``.contiguous()`` keeps a size-1 dimension's odd stride)."""
    if q_sink is None or q_sink.stride() == q.stride():
        return q, q_sink
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device).copy_(q),
            torch.empty(q.shape, dtype=q.dtype, device=q.device).copy_(q_sink))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    n_sink: int | None = None,
    window: int | None = None,
    impl: str = "auto",
    *,
    q_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over the Windowed-MTP key set (``window=None``: the full causal set).

    Args:
        q: ``(B, Hq, Lq, D)`` queries.
        k, v: ``(B, Hkv, S, D)`` position-indexed keys and values (``Hq % Hkv == 0``).
        q_pos: ``(Lq,)`` LongTensor of absolute query positions, in ``[0, S)``, or ``(B, Lq)``: each
            batch row's own (batched decoding with every sequence at its own position); queries are
            causal among themselves through the key-set formula. Checked unless they are on the GPU
            and ``impl`` resolves to ``"triton"`` (NOTE [Host checks], wmtp/attention/arguments.py).
        n_sink: sink keys (``None`` = 0).
        window: recent keys including the query's own (``None`` = full causal set).
        impl: ``"auto"``, ``"torch"`` or ``"triton"``.
        q_sink: ``(B, Hq, Lq, D)``, like ``q``: queries that score the sink keys (``j < n_sink``)
            in place of ``q``. Re-indexed (StreamingLLM) positions pass ``q`` rotated to
            ``wmtp.keyset.sink_query_position`` here (wmtp/keyset.py); ``None``: absolute positions.

    Returns:
        ``(B, Hq, Lq, D)`` tensor in ``q.dtype``.

    Raises:
        ValueError: for a bad ``(n_sink, window)``, arguments that are not tensors, shapes that do not
            fit, ``q, k, v`` on two devices or not floating point, positions that are not integers or
            (where checked) not in ``[0, S)``, a ``q_sink`` unlike ``q`` or without a window, or an
            ``impl`` that cannot run (``resolve_impl``; ``"triton"`` also refuses tensors that need a
            gradient, k and v of two layouts, q, k, v of different dtypes and caches of more than
            2**30 positions, where ``"auto"`` takes the reference).
    """
    check_key_set_args(n_sink, window)
    check_tensors(q=q, k=k, v=v)
    check_q_sink(q, q_sink, window)
    impl, q, q_pos = _prepare(q, k, v, q_pos, impl, q_sink=q_sink)
    if impl == "triton":
        from .triton_attention import attention_triton

        q, q_sink = _same_layout(q, q_sink)
        return attention_triton(q, k, v, q_pos, n_sink, window, q_sink=q_sink)
    return attention_torch(q, k, v, q_pos, n_sink, window, q_sink)


def paged_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    q_pos: torch.Tensor,
    n_sink: int | None = None,
    window: int | None = None,
    impl: str = "auto",
    *,
    q_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over the Windowed-MTP key set, with keys and values in a paged cache.

    Position ``p`` of sequence ``b`` is row ``p % page_size`` of page ``block_table[b, p // page_size]``.

    Args:
        q: ``(B, Hq, Lq, D)`` queries.
        k_pages, v_pages: ``(num_pages, page_size, Hkv, D)`` pages (``Hq % Hkv == 0``).
        block_table: ``(B, max_pages)`` int32 page indices.
        q_pos: ``(Lq,)`` or ``(B, Lq)`` (each row's own) LongTensor of absolute query positions, each
            ``< max_pages * page_size``; checked as in ``attention`` (not when on the GPU with ``impl``
            resolving to ``"triton"``).
        n_sink: sink keys (``None`` = 0).
        window: recent keys including the query's own (``None`` = full causal set).
        impl: ``"auto"``, ``"torch"`` or ``"triton"``.
        q_sink: queries that score the sink keys, as in ``attention``.

    Returns:
        ``(B, Hq, Lq, D)`` tensor in ``q.dtype``.

    Raises:
        ValueError: as ``attention``, and for pages that are not ``(num_pages, page_size, Hkv, D)``,
            a block table that is not 2-D int32 on ``q``'s device, or (where checked) page ids the
            queries reach outside ``[0, num_pages)``.
    """
    check_key_set_args(n_sink, window)
    check_tensors(q=q, k_pages=k_pages, v_pages=v_pages, block_table=block_table)
    check_q_sink(q, q_sink, window)
    if k_pages.dim() != 4 or v_pages.shape != k_pages.shape or block_table.dim() != 2:
        raise ValueError(f"expected k_pages, v_pages (num_pages, page_size, Hkv, D) and block_table (B, max_pages); "
                         f"got {tuple(k_pages.shape)}, {tuple(v_pages.shape)}, {tuple(block_table.shape)}")
    if block_table.dtype != torch.int32:
        raise ValueError(f"block_table must be int32, got {block_table.dtype}")
    if block_table.device != q.device:
        raise ValueError(f"block_table must be on q's device {q.device}, got {block_table.device}")
    B, Hkv = block_table.shape[0], k_pages.shape[2]
    if q.dim() == 4 and (B != q.shape[0] or k_pages.shape[3] != q.shape[3] or not Hkv or q.shape[1] % Hkv):
        raise ValueError(f"q {tuple(q.shape)} does not fit k_pages {tuple(k_pages.shape)} and block_table "
                         f"{tuple(block_table.shape)} (batch = block_table's rows, head_dim, Hq % Hkv)")
    capacity = block_table.shape[1] * k_pages.shape[1]  # positions the block table can address
    # The logical (B, Hkv, capacity, D) shape the contiguous checks apply to.
    logical = torch.empty(B, Hkv, capacity, k_pages.shape[3], device="meta")
    impl, q, q_pos = _prepare(q, k_pages, v_pages, q_pos, impl, logical, q_sink)
    check_pages(impl, block_table, q_pos, k_pages.shape[0], k_pages.shape[1])
    if impl == "triton":
        from .triton_attention import paged_attention_triton

        q, q_sink = _same_layout(q, q_sink)
        return paged_attention_triton(q, k_pages, v_pages, block_table, q_pos, n_sink, window, q_sink=q_sink)
    return paged_attention_torch(q, k_pages, v_pages, block_table, q_pos, n_sink, window, q_sink)
