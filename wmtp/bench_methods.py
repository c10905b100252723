"""The methods ``wmtp bench attention`` sets side by side, each a builder of one timed call
(arXiv 2607.21535, Sec. 1 and 4: the draft-KV tax, and what reading only sinks + window saves).

A ``Cell`` is one (S, shape, q_len) of the sweep (wmtp/bench_attention.py): queries at positions
``S-q_len .. S-1`` over random keys and values shared by every method. ``BUILDERS`` maps each
method name to a function ``Cell -> call``; setup (gathering a compact copy for
``sdpa_compact_window``, compiling FlexAttention, paging the cache) happens in the builder,
outside the timed call, except where the method's point is to pay it (``gather_sdpa_window``
gathers inside). Window methods read THE key set of wmtp/keyset.py: ``window_keys`` for the
ranges, ``flex_mask_mod`` for FlexAttention.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .bench_report import PAGE_SIZE
from .keyset import in_key_set, key_ranges

__all__ = ["Cell", "BUILDERS", "METHODS", "SDPA_GQA", "window_keys", "flex_mask_mod", "paginate_cell", "sdpa"]

SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def window_keys(S: int, q_len: int, n_sink: int, window: int) -> tuple[int, int]:
    """``(sink_hi, rec_lo)``: queries at ``S-q_len .. S-1`` read keys ``[0, sink_hi) ∪ [rec_lo, S)`` at most."""
    (_, sink_hi), _ = key_ranges(S - 1, n_sink, window)
    _, (rec_lo, _) = key_ranges(S - q_len, n_sink, window)
    return sink_hi, max(rec_lo, sink_hi)


def _backend_name(q, k, v, mask, gqa: bool) -> str | None:
    """The SDPA backend PyTorch picks for these inputs (best effort: ``_fused_sdp_choice`` is private)."""
    try:
        from torch.nn.attention import SDPBackend

        kw = {"enable_gqa": True} if gqa else {}
        return "sdpa backend " + SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, **kw)).name
    except Exception:
        return None


class Cell:
    """One (S, shape, q_len): queries at positions ``S-q_len .. S-1`` of each of ``B`` sequences (k's first
    dimension) over keys and values shared across q_lens."""

    def __init__(self, k, v, pages: Callable, Hq: int, q_len: int, n_sink: int, window: int, gen: torch.Generator):
        B, Hkv, S, D = k.shape
        self.k, self.v, self.pages, self.S, self.q_len, self.n_sink, self.window = k, v, pages, S, q_len, n_sink, window
        self.q = torch.randn(B, Hq, q_len, D, generator=gen, device=k.device, dtype=k.dtype)  # (B, Hq, Lq, D)
        self.q_pos = torch.arange(S - q_len, S, device=k.device)  # (Lq,): every row of the batch at these
        self.sink_hi, self.rec_lo = window_keys(S, q_len, n_sink, window)
        self.gqa = SDPA_GQA

    def compact(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the window union, gathered: ``(B, Hkv, keys, D)`` each."""
        a, b = self.sink_hi, self.rec_lo
        return tuple(torch.cat([x[:, :, :a], x[:, :, b:]], 2) for x in (self.k, self.v))

    def mask(self, windowed: bool) -> torch.Tensor | None:
        """``(q_len, keys)`` mask from THE key-set formula; ``None`` for one query (it reads every key given)."""
        if self.q_len == 1:
            return None
        pos = torch.arange(self.S, device=self.q.device)  # (S,)
        pos = torch.cat([pos[: self.sink_hi], pos[self.rec_lo :]]) if windowed else pos  # (keys,)
        return in_key_set(self.q_pos[:, None], pos[None, :], self.n_sink, self.window if windowed else None)


def paginate_cell(k, v, gen):
    from .attention.paged import paginate

    return paginate(k, v, PAGE_SIZE, gen)  # (k_pages, v_pages, block_table)


def _attend_sdpa(q, k, v, mask, gqa: bool) -> torch.Tensor:
    """SDPA with grouped kv heads: ``enable_gqa`` (torch >= 2.5), else k and v repeated to ``Hq`` heads."""
    if not gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # (B, Hq, keys, D)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **({"enable_gqa": True} if gqa else {}))


def sdpa(q, k, v, mask, gqa: bool) -> Callable[[], torch.Tensor]:
    """SDPA over ready keys; without ``enable_gqa`` they are repeated to ``Hq`` heads here, outside the timed call."""
    k, v = (k, v) if gqa else (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))  # (B, Hq, keys, D)
    fn = lambda: _attend_sdpa(q, k, v, mask, gqa)  # noqa: E731
    fn.note = (_backend_name(q, k, v, mask, gqa) or "") + ("" if gqa else "; k/v repeated outside the timed call")
    return fn


def _triton(c: Cell, windowed: bool, paged: bool) -> Callable[[], torch.Tensor]:
    from .attention import triton_attention as ta

    n_sink, window = (c.n_sink, c.window) if windowed else (None, None)
    if paged:
        k_pages, v_pages, block_table = c.pages()
        return lambda: ta.paged_attention_triton(c.q, k_pages, v_pages, block_table, c.q_pos, n_sink, window)
    return lambda: ta.attention_triton(c.q, c.k, c.v, c.q_pos, n_sink, window)


def _gather_sdpa(c: Cell) -> Callable[[], torch.Tensor]:
    mask = c.mask(True)
    fn = lambda: _attend_sdpa(c.q, *c.compact(), mask, c.gqa)  # noqa: E731 - the gather is inside the timed call
    fn.note = _backend_name(c.q, *c.compact(), mask, c.gqa)
    return fn


def flex_mask_mod(offset: torch.Tensor, n_sink: torch.Tensor, window: torch.Tensor):
    """THE key-set formula (wmtp/keyset.py) as a FlexAttention ``mask_mod``; query ``q_idx`` is at ``offset + q_idx``.
    The parameters are 0-d tensors, not Python ints, so that a new context does not force a recompile."""

    def mask_mod(b, h, q_idx, kv_idx):
        t = offset + q_idx
        return (kv_idx <= t) & ((kv_idx < n_sink) | (kv_idx > t - window))

    return mask_mod


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _flex(c: Cell) -> Callable[[], torch.Tensor]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev = c.q.device
    params = (torch.tensor(v, device=dev) for v in (c.S - c.q_len, c.n_sink, c.window))
    block_mask = create_block_mask(flex_mask_mod(*params), None, None, c.q_len, c.S, device=dev)
    flex = _compiled_flex() if dev.type == "cuda" else flex_attention  # CPU: eager, for tests only
    fn = lambda: flex(c.q, c.k, c.v, block_mask=block_mask, enable_gqa=True)  # noqa: E731
    fn()  # compile and warm up here, outside the timed region
    return fn


BUILDERS: dict[str, Callable[[Cell], Callable[[], torch.Tensor]]] = {
    "triton_window": lambda c: _triton(c, True, False),
    "triton_window_paged": lambda c: _triton(c, True, True),
    "triton_full": lambda c: _triton(c, False, False),
    "triton_full_paged": lambda c: _triton(c, False, True),
    "sdpa_full": lambda c: sdpa(c.q, c.k, c.v, c.mask(False), c.gqa),
    "gather_sdpa_window": _gather_sdpa,
    "sdpa_compact_window": lambda c: sdpa(c.q, *c.compact(), c.mask(True), c.gqa),
    "flex_window": _flex,
}
METHODS = tuple(BUILDERS)
