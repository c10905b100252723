"""MTP draft head, DeepSeek-V3 style, with its own (draft) KV cache.

One step of the head (arXiv 2607.21535, Sec. 2; DeepSeek-V3 report, Sec. 2.2) at position ``t``:

    x_t = W [ RMSNorm(h_t) ; RMSNorm(Emb(token_{t+1})) ]        (2d -> d)
    g_t = Block(x_t)                attention over the draft KV, the Windowed-MTP key set
    logits_t = LMHead(FinalNorm(g_t))   -> a guess for token_{t+2}

``h_t`` is the target's final hidden state at ``t`` for committed positions and, when drafting
more than one token, the head's own ``g`` from the previous position (recursive use). The
embedding, final norm and LM head are the target's, shared and frozen; the head owns only the
two norms, the projection and the block. Windowed-MTP changes one thing: the block's attention
reads the key set ``(n_sink, window)`` of the draft KV instead of every position.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .block import Block, RMSNorm, op_impl
from .config import MTPConfig
from .head_input import head_input
from .kvcache import KVCache
from .linear import linear, rezero, zero_bias
from .model import TargetLM, check_generator, init_weights
from .pagedcache import PagedKVCache
from .ringcache import RingKVCache


class MTPHead(nn.Module):
    """Draft head sharing ``target``'s embedding and LM head (not registered: not its parameters).

    Args:
        config: head settings.
        target: the target LM whose embedding, final norm and LM head are used.
        generator: CPU RNG for the initial weights (default: a generator seeded with 1).

    Raises:
        ValueError: for a ``config`` that is not an ``MTPConfig``, a ``target`` that is not a
            ``TargetLM``, or a ``generator`` that is not ``None`` or a CPU ``torch.Generator``.
    """

    def __init__(self, config: MTPConfig, target: TargetLM, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, MTPConfig) or not isinstance(target, TargetLM):
            raise ValueError(f"MTPHead takes (MTPConfig, TargetLM), got ({type(config).__name__}, "
                             f"{type(target).__name__})")
        check_generator(generator)
        self.config = config
        self.__dict__["target"] = target  # shared, frozen; kept out of this module's parameters
        mc = target.config
        self.hidden_norm = RMSNorm(mc.d_model, mc.norm_eps)
        self.embed_norm = RMSNorm(mc.d_model, mc.norm_eps)
        self.proj = nn.Parameter(torch.empty(mc.d_model, 2 * mc.d_model))
        self.register_buffer("zero", zero_bias(mc.d_model), persistent=False)  # linear's (NOTE [Few-row products])
        self.register_load_state_dict_post_hook(rezero)
        self.block = Block(mc, rope=config.rope)
        init_weights(self, generator or torch.Generator().manual_seed(1), n_layers=1)

    def new_cache(self, batch: int = 1, max_len: int | None = None, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, checked: bool = True,
                  ring: tuple[int | None, int, int] | None = None,
                  page_size: int | None = None) -> KVCache | RingKVCache | PagedKVCache:
        """The draft KV: every position (``KVCache``; with ``page_size``, a ``PagedKVCache`` of pages of
        that many positions, wmtp/pagedcache.py), or with ``ring=(n_sink, window, spare)`` a ring of
        ``n_sink + window + spare`` slots (``RingKVCache``, wmtp/ringcache.py) for that key set.

        Raises:
            ValueError: for both ``ring`` and ``page_size``, or sizes the cache refuses."""
        mc = self.target.config
        max_len = mc.max_seq_len if max_len is None else max_len  # 0 is refused by the cache, not read as None
        kw = dict(dtype=dtype or self.proj.dtype, device=device or self.proj.device, checked=checked)
        if ring is not None and page_size is not None:
            raise ValueError("a ring is already paged (pages of one row); pass ring or page_size, not both")
        if page_size is not None:
            return PagedKVCache(1, batch, mc.n_kv_heads, max_len, mc.head_dim, page_size=page_size, **kw)
        if ring is not None:
            n_sink, window, spare = ring
            return RingKVCache(1, batch, mc.n_kv_heads, mc.head_dim, n_sink=n_sink, window=window, spare=spare,
                               max_len=max_len, **kw)
        return KVCache(1, batch, mc.n_kv_heads, max_len, mc.head_dim, **kw)

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, pos: torch.Tensor | None = None,
                cache: KVCache | None = None, n_sink: int | None = None, window: int | None = None,
                impl: str = "auto", positions: str = "absolute") -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step for positions ``pos``.

        Args:
            hidden: ``(B, L, d)`` target hidden (or the head's previous ``g``) at positions ``pos``.
            next_ids: ``(B, L)`` the token that follows each position.
            pos: ``(L,)`` absolute positions (default ``0..L-1``), or ``(B, L)``: each row's own
                (batched decoding; needs a ``cache``).
            cache: the draft KV cache (written at ``pos``, read through the key set).
            n_sink, window: the draft key set (``window=None``: full context, the native MTP).
            impl: attention implementation.
            positions: ``"absolute"`` (RoPE of each key's position, the paper's) or ``"reindexed"``
                (StreamingLLM's positions inside the key set: wmtp/keyset.py; the same as absolute
                for the native draft, a pure sliding window or a head without RoPE).

        Returns:
            ``logits (B, L, V)`` guessing the token two after each position, and ``g (B, L, d)``.
        """
        if pos is None:
            pos = torch.arange(hidden.shape[1], device=hidden.device)
        ni = op_impl(impl, hidden.device)
        g, pending = self.block.step(self.inputs(hidden, next_ids, ni), None, pos, cache, 0, n_sink, window, impl,
                                     positions)  # (B, L, d) each
        return self.target.final(g, pending, ni)  # logits, g = g + pending (NOTE [Pending addition] in wmtp/block.py)

    def inputs(self, hidden: torch.Tensor, next_ids: torch.Tensor, ni: str) -> torch.Tensor:
        """The block's input ``x_t = W [norm(h_t) ; norm(e_{t+1})]`` ``(B, L, d)``; ``ni`` the small ops' impl."""
        h, e = self.hidden_norm, self.embed_norm  # one kernel on CUDA (wmtp/head_input.py)
        x = head_input(hidden, next_ids, self.target.embed, h.weight, e.weight, h.eps, e.eps, ni)  # (B, L, 2d)
        return linear(x, self.proj, self.zero)  # (B, L, d)

    def write_cache(self, hidden: torch.Tensor, next_ids: torch.Tensor, pos: torch.Tensor, cache: KVCache,
                    impl: str = "auto") -> None:
        """``forward``'s cache write alone: the keys and values of positions ``pos`` into ``cache``, the
        same bits as ``forward`` writes with any key set, without its attention, MLP or logits. A
        prefill takes it (NOTE [Shared draft prefill] in wmtp/prefill.py): a one-block head's keys and
        values are its input's alone, and nobody reads a prefill's drafts. Arguments as ``forward``'s."""
        self.block.write(self.inputs(hidden, next_ids, op_impl(impl, hidden.device)), pos, cache, 0, impl)
