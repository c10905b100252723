"""Target LM: a small Llama-style decoder (RMSNorm, SwiGLU, GQA) with a position-indexed KV cache.

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

from .attention import IMPLS, attention
from .config import ModelConfig
from .fused import logn_scale, silu_mul
from .keyset import check_positions, sink_query_position
from .kvcache import KVCache
from .linear import linear, project, rezero, zero_bias
from .pagedcache import PagedKVCache
from .qkv_write import prepare_qk
from .rmsnorm import add_rms_norm, rms_norm
from .rope import rope, rope_frequencies, rope_torch
from .stacked import StackedWeights


def _weight(out_features: int, in_features: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(out_features, in_features))


def op_impl(impl: str, device: torch.device | str) -> str:
    """The impl of the norms, RoPE, log-length scaling and SwiGLU's activation (``rms_norm`` in
    wmtp/rmsnorm.py, ``rope`` in wmtp/rope.py, ``logn_scale`` and ``silu_mul`` in wmtp/fused.py)
    beside attention's ``impl``.

    Args:
        impl: attention's, ``"auto"``, ``"torch"`` or ``"triton"``.
        device: the tensors'.

    Returns:
        ``"torch"`` off CUDA (under the CPU interpreter a kernel runs program by program, slowly:
        tests/test_rmsnorm.py and tests/test_rope.py run them there) or for ``"torch"``; else ``impl``
        itself: ``"auto"`` lets each op take its kernel when no tensor needs a gradient, as attention does.

    Raises:
        ValueError: for an unknown ``impl``.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(IMPLS)}")
    return "torch" if impl == "torch" or torch.device(device).type != "cuda" else impl


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, impl: str = "torch") -> torch.Tensor:
        """``x`` normalised over its last dimension (``rms_norm``: ``impl`` ``"torch"``, ``"triton"`` or ``"auto"``)."""
        return rms_norm(x, self.weight, self.eps, impl)


def apply_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` ``(B, H, L, D)`` by the RoPE angles of absolute positions ``pos`` ``(L,)``: the
    reference (``rope_torch`` in wmtp/rope.py) with base ``theta``'s frequencies."""
    acc = torch.promote_types(x.dtype, torch.float32)
    return rope_torch(x, pos, rope_frequencies(x.shape[-1], theta, x.device, acc))


class Attention(StackedWeights):
    """GQA self-attention over a key set; RoPE optional; optional per-query log-length scaling."""

    STACK = ("wq", "wk", "wv")  # one product on CUDA (wmtp/stacked.py)

    def __init__(self, cfg: ModelConfig, *, rope: bool, logn_scale: bool = False) -> None:
        super().__init__()
        if rope and cfg.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: head_dim {cfg.head_dim} must be even")
        self.cfg, self.rope, self.logn_scale = cfg, rope, logn_scale
        self.wq = _weight(cfg.n_heads * cfg.head_dim, cfg.d_model)
        self.wk = _weight(cfg.n_kv_heads * cfg.head_dim, cfg.d_model)
        self.wv = _weight(cfg.n_kv_heads * cfg.head_dim, cfg.d_model)
        self.wo = _weight(cfg.d_model, cfg.n_heads * cfg.head_dim)
        self.keep_packed()
        width = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim  # the stacked product's
        self.register_buffer("zero", zero_bias(max(width, cfg.d_model)), persistent=False)
        self._freqs: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # RoPE's, by (device, dtype)

    def frequencies(self, x: torch.Tensor) -> torch.Tensor:
        """RoPE's ``inv_freq`` ``(D/2,)`` for ``x``'s device and dtype (promoted to at least float32),
        computed once and kept; not kept when first asked for while a CUDA graph is being captured
        (the tensor would hold its values only once the graph replays)."""
        acc = torch.promote_types(x.dtype, torch.float32)
        f = self._freqs.get((x.device, acc))
        if f is None:
            f = rope_frequencies(self.cfg.head_dim, self.cfg.rope_theta, x.device, acc)  # (D/2,)
            if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
                self._freqs[(x.device, acc)] = f
        return f

    def heads(self, x: torch.Tensor, oi: str):
        """``x``'s queries ``(B, Hq, L, D)``, keys and values ``(B, Hkv, L, D)``, RoPE's frequencies
        (``None`` without RoPE) and the log-length scaling's length (``None`` without it)."""
        B, L, _ = x.shape
        c = self.cfg
        q, k, v = project(self, x, oi)  # (B, L, Hq * D), (B, L, Hkv * D) twice
        q = q.view(B, L, c.n_heads, c.head_dim).transpose(1, 2)  # (B, Hq, L, D)
        k = k.view(B, L, c.n_kv_heads, c.head_dim).transpose(1, 2)  # (B, Hkv, L, D)
        v = v.view(B, L, c.n_kv_heads, c.head_dim).transpose(1, 2)  # (B, Hkv, L, D)
        f = self.frequencies(q) if self.rope else None  # (D/2,)
        return q, k, v, f, c.train_seq_len if self.logn_scale else None

    def write(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, layer: int, impl: str) -> None:
        """``forward``'s cache write alone, no attention: ``x``'s keys and values into ``cache`` at
        ``pos`` (a prefill nobody reads the output of: NOTE [Shared draft prefill] in wmtp/prefill.py)."""
        oi = op_impl(impl, x.device)
        cache.update_qkv(layer, pos, *self.heads(x, oi), oi)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None, layer: int,
                n_sink: int | None, window: int | None, impl: str, positions: str = "absolute") -> torch.Tensor:
        B, L, _ = x.shape
        oi = op_impl(impl, x.device)  # the small ops' impl: RoPE's, the scaling's, the cache write's
        q, k, v, f, T = self.heads(x, oi)  # T: log-length scaling's
        q_sink = None  # re-indexed positions (wmtp/keyset.py): sinks scored from min(t, n_sink + window - 1)
        reindexed = check_positions(positions) == "reindexed" and window is not None and bool(n_sink)
        if reindexed and f is not None:
            q_sink = rope(q, sink_query_position(pos, n_sink, window), f, oi)  # (B, Hq, L, D)
            q_sink = q_sink if T is None else logn_scale(q_sink, pos, T, oi)  # (no model has both)
        if cache is not None:  # a KVCache (one kernel: wmtp/qkv_write.py), a ring or a paged cache
            cache.check_reads(L, n_sink, window)  # before the write: a refused call leaves the cache as it was
            q = cache.update_qkv(layer, pos, q, k, v, f, T, oi)  # (B, Hq, L, D): rotated or scaled
            y = cache.attend(layer, q, pos, n_sink, window, impl, q_sink)  # (B, Hq, L, D)
        elif pos.dim() != 1 or int(pos[0]) != 0:
            raise ValueError("a forward pass without a cache must start at position 0, every row at the same positions")
        else:
            q, k = prepare_qk(q, k, pos, f, T, oi)  # (B, Hq, L, D), (B, Hkv, L, D)
            if impl != "torch" and k.stride() != v.stride():  # the Triton kernels read k and v in one layout
                k, v = k.contiguous(), v.contiguous()  # (B, Hkv, L, D) each
            y = attention(q, k, v, pos, n_sink=n_sink, window=window, impl=impl, q_sink=q_sink)  # (B, Hq, L, D)
        return linear(y.transpose(1, 2).reshape(B, L, -1), self.wo, self.zero)


class MLP(StackedWeights):
    STACK = ("w_gate", "w_up")  # one product on CUDA (wmtp/stacked.py)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate = _weight(cfg.d_ff, cfg.d_model)
        self.w_up = _weight(cfg.d_ff, cfg.d_model)
        self.w_down = _weight(cfg.d_model, cfg.d_ff)
        self.keep_packed()
        self.register_buffer("zero", zero_bias(max(2 * cfg.d_ff, cfg.d_model)), persistent=False)

    def forward(self, x: torch.Tensor, impl: str = "torch") -> torch.Tensor:
        """SwiGLU: ``w_down (silu(w_gate x) * w_up x)``, the activation by ``silu_mul`` (wmtp/fused.py;
        ``impl`` as ``RMSNorm.forward``'s; gate and up one product on CUDA: wmtp/stacked.py)."""
        gate, up = project(self, x, impl)  # (B, L, d_ff) each
        return linear(silu_mul(gate, up, impl), self.w_down, self.zero)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, *, rope: bool, logn_scale: bool = False) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, rope=rope, logn_scale=logn_scale)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None, layer: int,
                n_sink: int | None, window: int | None, impl: str, positions: str = "absolute") -> torch.Tensor:
        x, pending = self.step(x, None, pos, cache, layer, n_sink, window, impl, positions)
        return x + pending

    def step(self, x: torch.Tensor, pending: torch.Tensor | None, pos: torch.Tensor, cache: KVCache | None,
             layer: int, n_sink: int | None, window: int | None, impl: str, positions: str = "absolute"
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` on the residual stream ``x + pending`` (``pending=None``: ``x``), with its last
        addition left pending: returns ``(y, p)`` where ``forward`` returns ``y + p``. NOTE [Pending
        addition]: each addition is made by the norm that reads its sum (``add_rms_norm``, one kernel
        on CUDA), so a stack of blocks launches no addition of its own; the sums are torch's, bit for bit."""
        ni = op_impl(impl, x.device)
        x, h = add_rms_norm(x, pending, self.attn_norm.weight, self.attn_norm.eps, ni)  # (B, L, d) each
        a = self.attn(h, pos, cache, layer, n_sink, window, impl, positions)
        x, h = add_rms_norm(x, a, self.mlp_norm.weight, self.mlp_norm.eps, ni)
        return x, self.mlp(h, ni)

    def write(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, layer: int, impl: str) -> None:
        """``step``'s cache write alone (``Attention.write``), for ``x`` with nothing pending."""
        _, h = add_rms_norm(x, None, self.attn_norm.weight, self.attn_norm.eps, op_impl(impl, x.device))
        self.attn.write(h, pos, cache, layer, impl)


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
            p.copy_(torch.randn(p.shape, generator=generator) * std)


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
        kw = dict(dtype=dtype or self.embed.dtype, device=device or self.embed.device, checked=checked)
        if page_size is not None:
            return PagedKVCache(c.n_layers, batch, c.n_kv_heads, max_len or c.max_seq_len, c.head_dim,
                                page_size=page_size, **kw)
        return KVCache(c.n_layers, batch, c.n_kv_heads, max_len or c.max_seq_len, c.head_dim, **kw)

    def logits(self, hidden: torch.Tensor, impl: str = "torch") -> torch.Tensor:
        """Final norm and LM head (shared, frozen, with the MTP head); ``impl`` the norm's (``rms_norm``)."""
        return self.lm_head(self.norm(hidden, impl))  # (B, L, V)

    def lm_head(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head (the embedding, tied) on final-normed hidden states ``(B, L, d)``."""
        return linear(normed, self.embed, self.zero)  # (B, L, V)

    def final(self, x: torch.Tensor, pending: torch.Tensor, impl: str = "torch",
              logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last pending addition of a stack of ``Block.step`` and the logits after it: ``(logits,
        hidden)`` with ``hidden = x + pending`` (NOTE [Pending addition]); ``impl`` the norm's;
        ``logits_at`` as ``forward``'s (NOTE [Logits at])."""
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
            ValueError: for a ``logits_at`` that is not a ``(B, n)`` integer tensor on ``ids``' device,
                or (on the CPU) that indexes past ``L``.
        """
        if pos is None:
            pos = torch.arange(ids.shape[1], device=ids.device)
        if logits_at is not None:
            check_logits_at(logits_at, ids)
        x, pending = F.embedding(ids, self.embed), None  # (B, L, d)
        for i, block in enumerate(self.layers):
            x, pending = block.step(x, pending, pos, cache, i, *self.layer_key_set(i), impl)
        return self.final(x, pending, op_impl(impl, x.device), logits_at)


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
