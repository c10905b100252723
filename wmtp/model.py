"""Target LM: a small Llama-style decoder (RMSNorm, SwiGLU, GQA) with a position-indexed KV cache.

Its layers are the blocks of wmtp/block.py (the MTP head's one layer is such a block too).

The paper (arXiv 2607.21535, Sec. 2 and 5) targets hybrid models in which few layers hold full
KV. This target mirrors that: most layers are *local* (RoPE, sliding window of ``local_window``
keys, the key-set formula with ``n_sink=0``), and ``global_layers`` are full-attention layers
with no positional encoding (NoPE). Trained at a short context, such a model stays sensible at
16K tokens: the local layers never see an unseen distance, and the NoPE layers scale their
queries by ``max(1, log(t + 1) / log(train_seq_len))`` (log-length scaling, as in Qwen's
logn attention) so that attention does not flatten as the context grows.

Parameters are plain ``nn.Parameter``s initialised from an explicit ``torch.Generator``: building
a model never touches torch's global RNG.

NOTE [Few-row products] (wmtp/linear.py): every product of the model goes through ``linear``, which
hands a product of few rows on CUDA to cuBLASLt.

NOTE [Logits at]: a prefill needs the target's logits only at each prompt's last position, while
the LM head over every position is its largest product (``P x d x V``) and its largest buffer
(``P x V`` floats: 268 MB for the small preset's 16384 tokens). ``forward(..., logits_at=)`` takes
the normed hidden states at the given positions before the head. Hidden states and caches are
the full pass's bit for bit; the logits are its rows up to rounding (a product of other row counts
may take another kernel). Every loop's prefill (wmtp/prefill.py, rows.py, lockstep.py) takes it,
so a dense run and a speculative one start from the same logits. (The MTP head's prefill computes
no logits at all: ``MTPHead.write_cache``, NOTE [Shared draft prefill] in wmtp/prefill.py.)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .block import Block, RMSNorm, op_impl
from .config import ModelConfig
from .kvcache import KVCache, SeparateWrites
from .linear import linear, rezero, zero_bias
from .pagedcache import PagedKVCache
from .rmsnorm import add_rms_norm


def check_generator(generator) -> None:
    """A model's ``generator`` must be ``None`` or a CPU ``torch.Generator`` (weights are drawn on the CPU)."""
    if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
        where = f" on {generator.device}" if isinstance(generator, torch.Generator) else ""
        raise ValueError(f"generator must be None or a CPU torch.Generator, got {type(generator).__name__}{where}")


def init_weights(module: nn.Module, generator: torch.Generator, n_layers: int) -> None:
    """Initialise every matrix ``N(0, 0.02)`` (output projections ``/ sqrt(2 n_layers)``), norms to 1."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("wo", "w_down")) else 0.02
            p.copy_(torch.randn(p.shape, generator=generator, device=generator.device) * std)


class TargetLM(nn.Module):
    """The target model. ``forward`` returns logits (at every position, or at ``logits_at``'s: NOTE
    [Logits at] in wmtp/model.py) and the final hidden state (before the norm).

    Args:
        config: model shape.
        generator: RNG for the initial weights (default: a generator seeded with 0).
    """

    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a wmtp.ModelConfig, got {type(config).__name__}")
        check_generator(generator)
        self.config = config
        self.embed = nn.Parameter(torch.empty(config.vocab_size, config.d_model))  # tied with the LM head
        self.layers = nn.ModuleList(
            Block(config, rope=i not in config.global_layers, logn_scale=i in config.global_layers)
            for i in range(config.n_layers)
        )
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.register_buffer("zero", zero_bias(config.vocab_size), persistent=False)  # the LM head's
        self.register_load_state_dict_post_hook(rezero)
        init_weights(self, generator or torch.Generator().manual_seed(0), config.n_layers)

    def layer_key_set(self, i: int) -> tuple[int, int | None]:
        """``(n_sink, window)`` of target layer ``i``: full causal for global layers."""
        return (0, None) if i in self.config.global_layers else (0, self.config.local_window)

    def new_cache(self, batch: int = 1, max_len: int | None = None, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, checked: bool = True,
                  page_size: int | None = None) -> KVCache | PagedKVCache:
        """A position-indexed KV cache for every layer: contiguous, or with ``page_size`` a
        ``PagedKVCache`` (wmtp/pagedcache.py) of pages of that many positions."""
        c = self.config
        max_len = c.max_seq_len if max_len is None else max_len  # 0 is refused by the cache, not read as None
        kw = dict(dtype=dtype or self.embed.dtype, device=device or self.embed.device, checked=checked)
        if page_size is not None:
            return PagedKVCache(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, page_size=page_size, **kw)
        return KVCache(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, **kw)

    def logits(self, hidden: torch.Tensor, impl: str = "torch") -> torch.Tensor:
        """Final norm and LM head (shared, frozen, with the MTP head); ``impl`` the norm's (``rms_norm``)."""
        return self.lm_head(self.norm(hidden, impl))  # (B, L, V)

    def lm_head(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head (the embedding, tied) on final-normed hidden states ``(B, L, d)``."""
        return linear(normed, self.embed, self.zero)  # (B, L, V)

    def final(self, x: torch.Tensor, pending: torch.Tensor, impl: str = "torch",
              logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last pending addition of a stack of ``Block.step`` and the logits after it: ``(logits,
        hidden)`` with ``hidden = x + pending`` (NOTE [Pending addition] in wmtp/block.py); ``impl`` the
        norm's; ``logits_at`` as ``forward``'s (NOTE [Logits at])."""
        hidden, normed = add_rms_norm(x, pending, self.norm.weight, self.norm.eps, impl)  # (B, L, d) each
        if logits_at is not None:
            normed = normed.gather(1, logits_at[:, :, None].expand(-1, -1, normed.shape[-1]))  # (B, n, d)
        return self.lm_head(normed), hidden

    def forward(self, ids: torch.Tensor, pos: torch.Tensor | None = None, cache: KVCache | None = None,
                impl: str = "auto", logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run tokens ``ids`` ``(B, L)`` at absolute positions ``pos`` ``(L,)`` (default ``0..L-1``), or
        ``(B, L)``: each row at its own positions (batched decoding; needs a ``cache``).

        With a ``cache``, keys are written at ``pos`` and every earlier position is read from it.
        ``logits_at`` ``(B, n)``: the indices into ``L`` whose logits to compute, each row its own
        (a prefill needs only its last position's; NOTE [Logits at]); default every position.

        Returns:
            ``logits (B, L, V)`` (``(B, n, V)`` with ``logits_at``) and ``hidden (B, L, d_model)``.

        Raises:
            ValueError: for ``ids`` that are not a ``(B, L)`` int32 or int64 tensor on the model's device
                with ``L >= 1``, or (on the CPU) hold an id outside ``[0, vocab_size)``; for a ``pos`` that
                is not a tensor; for a ``logits_at`` that is not a ``(B, n)`` integer tensor on ``ids``'
                device, or (on the CPU) that indexes past ``L``; for a ``cache`` that is not ``None`` or a
                KV cache (wmtp/kvcache.py, a paged or ring cache) of ``B`` rows.
        """
        check_ids(ids, self.embed)
        check_cache(cache, ids.shape[0])
        if pos is None:
            pos = torch.arange(ids.shape[1], device=ids.device)
        elif not isinstance(pos, torch.Tensor):
            raise ValueError(f"pos must be a tensor of positions or None, got {type(pos).__name__}")
        if logits_at is not None:
            check_logits_at(logits_at, ids)
        try:
            x, pending = F.embedding(ids, self.embed), None  # (B, L, d)
        except IndexError:  # the CPU's range check (no sync added; on CUDA a device-side assert)
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})") from None
        for i, block in enumerate(self.layers):
            x, pending = block.step(x, pending, pos, cache, i, *self.layer_key_set(i), impl)
        return self.final(x, pending, op_impl(impl, x.device), logits_at)


def check_ids(ids: torch.Tensor, embed: torch.Tensor) -> None:
    """``TargetLM.forward``'s check of ``ids``: shape, dtype and device only (no sync); the range is the
    embedding lookup's (``forward``)."""
    if (not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not ids.shape[1]
            or ids.dtype not in (torch.int32, torch.int64) or ids.device != embed.device):
        got = f"{tuple(ids.shape)} {ids.dtype} on {ids.device}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a (B, L) int32 or int64 tensor of token ids with L >= 1 on {embed.device}, "
                         f"got {got}")


def check_cache(cache, batch: int) -> None:
    """``TargetLM.forward``'s check of ``cache``: ``None`` or a cache of ``batch`` rows (its type and a
    shape, no sync; its layers, heads and positions are its writes' checks)."""
    if cache is not None and not isinstance(cache, (KVCache, SeparateWrites)):
        raise ValueError(f"cache must be None or a KV cache (wmtp.KVCache, a paged or ring cache), got "
                         f"{type(cache).__name__}")
    if cache is not None and cache.batch != batch:
        raise ValueError(f"the cache holds {cache.batch} rows and ids {batch}: a forward pass writes every row")


def check_logits_at(logits_at: torch.Tensor, ids: torch.Tensor) -> None:
    """``TargetLM.forward``'s check of ``logits_at`` against ``ids (B, L)``. The range is checked only
    on the CPU: on a GPU it would wait for the device (a bad index there is a device-side assert)."""
    B, L = ids.shape
    if (not isinstance(logits_at, torch.Tensor) or logits_at.dim() != 2 or logits_at.shape[0] != B
            or logits_at.dtype not in (torch.int32, torch.int64) or logits_at.device != ids.device):
        t = logits_at
        got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"logits_at must be a ({B}, n) int32 or int64 tensor on {ids.device}, got {got}")
    if logits_at.device.type == "cpu" and logits_at.numel() and not bool(((logits_at >= 0) & (logits_at < L)).all()):
        raise ValueError(f"logits_at must index into the {L} positions of ids, got values "
                         f"{int(logits_at.min())}..{int(logits_at.max())}")
