"""The transformer block of the target and the MTP head: RMSNorm, GQA attention over a key set, SwiGLU.

``Attention`` reads a key set given as ``(n_sink, window)`` (wmtp/keyset.py; the paper's Sec. 3
sink+window set for the draft, ``(0, local_window)`` for the target's local layers, full causal
for its global ones). RoPE is optional: the target's global layers have none (NoPE) and scale their
queries by ``max(1, log(t + 1) / log(train_seq_len))`` instead (log-length scaling, as in Qwen's
logn attention), so a model trained at a short context stays sensible at 16K tokens (Sec. 2 and 5:
hybrid models with few full-KV layers). With ``positions="reindexed"`` the sinks are scored from a
re-indexed query position (StreamingLLM; beyond the paper).

NOTE [Pending addition]: ``Block.step`` leaves its last residual addition pending, and the norm that
reads the sum makes it (``add_rms_norm`` in wmtp/rmsnorm.py, one kernel on CUDA), so a stack of
blocks launches no addition of its own; the sums are torch's, bit for bit.

``op_impl`` picks the impl of the small ops (norms, RoPE, log-length scaling, SwiGLU's activation,
the KV write) beside attention's ``impl``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .attention import IMPLS, attention
from .config import ModelConfig
from .fused import logn_scale, silu_mul
from .keyset import check_positions, sink_query_position
from .kvcache import KVCache
from .linear import linear, project, zero_bias
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
    """RMSNorm with a learned scale ``weight`` ``(dim,)``, ones at first: ``x / sqrt(mean(x^2) + eps) * weight``."""

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
    """SwiGLU feed-forward: ``w_down (silu(w_gate x) * w_up x)``, ``d_model -> d_ff -> d_model``."""

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
