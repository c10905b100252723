"""Batched speculative decoding with a position a row: prompts of any lengths decode as one batch,
and every row commits its own accepted drafts (beyond the paper, whose runs decode one sequence).

A step runs decode.py's four phases on a batch of ``B`` rows (arXiv 2607.21535, Sec. 2-3: draft
extend, recursive drafts, one verify pass, commit), each row at its own positions: every pass of
the head and of the target takes positions ``(B, L)`` (the attention ops, RoPE, log-length scaling
and the caches' writes take a position a row). Row ``b`` with its latest token at ``n_b`` drafts
``K`` tokens at ``n_b + 1 ..``, the target verifies ``n_b .. n_b + K``, and the row keeps its own
``a_b`` accepted drafts and its target token: ``n_b`` moves on by ``a_b + 1``. So at a fixed depth
each row drafts, accepts and outputs what it would alone (wmtp/lockstep.py's rows instead keep the
batch's least match, and its prompts share one length); with a depth policy the depths, and so the
drafts, may differ from the row's alone, and the output does not.

NOTE [Padded rows]: the batch's tensors are rectangular where the rows are not. Prompts are padded
at their ends to the longest; the head's extend covers ``max_b(a_b + 1)`` positions a row. The
padding runs as real tokens would: it writes keys and values at positions past the row's
committed ones. No query reads them before they are written again: a query at ``t`` reads keys at
``j <= t`` only, every pass writes its positions before it reads, and a row's passes move through
its positions in order, as NOTE [No rollback] in wmtp/kvcache.py says of rejected drafts. A row
that has stopped (its ``eos_id``, or ``max_new_tokens``) runs on in the batch at its last live
step's positions, which its caches hold, until every row has stopped; what it computes is dropped.

NOTE [Refill]: with ``max_batch`` below the number of prompts, at most ``max_batch`` rows decode at
once and a row whose prompt has stopped takes the next waiting prompt (continuous batching): the
prompt is prefilled alone, its keys and values copied into the row's positions ``0 .. P - 1`` of
both caches (``admit``), and the row's state set as a first step's. What the row's earlier prompt
left at positions ``>= P`` is never read: the new prompt's passes write each position before any
query reads it, as above. So a batch no longer waits for its slowest row while prompts wait; the
outputs come back in the prompts' order, and ``BatchedStats`` counts a prompt, not a row.

The depth is one a step for the whole batch: a depth policy (wmtp/policy.py) hears each live
row's step as one observation. As in lockstep, a batched row and the row alone can differ in the
last bits (wmtp/lockstep.py NOTE [Batch exactness]); tests/test_batched.py checks each row against
``greedy_generate`` and ``speculative_generate`` of its prompt alone with ``torch.equal`` in float64.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .attention import resolve_impl
from .decode import _finish
from .device import synchronize
from .keyset import key_count
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy, as_policy, next_depth
from .request import check_spec_request

__all__ = ["BatchedStats", "batched_speculative_generate"]


@dataclass
class BatchedStats:
    """Counters of one batched run of ``batch`` prompts (as many rows, or fewer that refill: NOTE
    [Refill]): ``steps`` verify passes; prompt ``i`` was live (not yet stopped) for
    ``live_steps[i]`` of them, accepted ``accepted[i]`` drafts and kept ``committed[i]`` tokens in
    them (after its output's cut at ``max_new_tokens`` or ``eos_id``)."""

    depth: int
    batch: int
    steps: int = 0
    accepted: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    live_steps: list[int] = field(default_factory=list)
    draft_keys_read: int = 0  # keys the draft's attention read for the live rows' real queries
    steps_by_depth: list[int] = field(default_factory=list)
    draft_times_s: list[float] = field(default_factory=list)
    verify_times_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted = self.accepted or [0] * self.batch
        self.committed = self.committed or [0] * self.batch
        self.live_steps = self.live_steps or [0] * self.batch
        self.steps_by_depth = self.steps_by_depth or [0] * (self.depth + 1)

    @property
    def mean_accept_length(self) -> float:
        """Tokens a live row kept per verify pass, over every row's live steps (the paper's AL)."""
        return sum(self.committed) / max(sum(self.live_steps), 1)


def _rows(prompts) -> list[torch.Tensor]:
    """The prompts as a list of 1-D tensors: a ``(B, P)`` tensor's rows, or a list as given."""
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 2 and prompts.numel():
        return list(prompts)
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, torch.Tensor) for p in prompts):
        return list(prompts)
    raise ValueError("prompts must be a non-empty (B, P) tensor or a non-empty list of 1-D token-id tensors")


def check_batch(target: TargetLM, draft: MTPHead, prompts, max_new_tokens: int, depth: int | DepthPolicy,
                n_sink: int | None, window: int | None, eos_id: int | None, impl: str):
    """``batched_speculative_generate``'s checks: returns the prompts as a list of rows, the depth
    policy, the cache positions the batch writes (the padded prefill's included) and ``impl`` resolved."""
    rows = _rows(prompts)
    dev = rows[0].device
    if any(r.device != dev for r in rows):
        raise ValueError("every prompt must be on one device")
    policy = as_policy(depth)
    K = policy.max_depth  # the caches hold a step of the most drafts
    one = torch.zeros(1, dtype=torch.long, device=dev)  # the arguments every row shares, checked once
    needed = check_spec_request(target, draft, one, max_new_tokens, K, n_sink, window, eos_id)
    for b, r in enumerate(rows):
        try:
            needed = max(needed, check_spec_request(target, draft, r, max_new_tokens, K, n_sink, window, eos_id))
        except ValueError as e:
            raise ValueError(f"prompts row {b}: {e}") from None
    impl = resolve_impl(impl, dev, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    return rows, policy, max(needed, max(r.numel() for r in rows)), impl


def _prefill(target: TargetLM, draft: MTPHead | None, rows: list[torch.Tensor], needed: int, impl: str,
             n_sink: int | None, window: int | None, checked: bool = True):
    """Caches of ``needed`` positions for the prompts, padded at their ends (NOTE [Padded rows]): the
    target over the prompts, then the head (if any) over their true chains. Returns both caches (the
    head's ``None`` without a head; ``checked``: their range check, off for the static loops), each
    row's first new token ``(B,)``, its target hidden state at its last prompt position ``(B, d)``
    and the prompts' lengths ``(B,)``."""
    B, dev = len(rows), rows[0].device
    lengths = torch.tensor([r.numel() for r in rows], device=dev)  # (B,)
    P = int(lengths.max())
    ids = torch.zeros(B, P, dtype=torch.long, device=dev)  # (B, P): pad token 0
    for b, r in enumerate(rows):
        ids[b, : r.numel()] = r.long()
    tcache = target.new_cache(B, needed, checked=checked)
    dcache = None if draft is None else draft.new_cache(B, needed, checked=checked)
    logits, hidden = target(ids, torch.arange(P, device=dev), tcache, impl)  # (B, P, V), (B, P, d)
    if draft is not None and P > 1:  # the head's true chains, positions 0 .. P_b - 2 (and padding past them)
        draft(hidden[:, :-1], ids[:, 1:], torch.arange(P - 1, device=dev), dcache, n_sink, window, impl)
    last = (lengths - 1)[:, None]  # (B, 1) each row's last prompt position
    x = logits.gather(1, last[:, :, None].expand(-1, -1, logits.shape[-1]))[:, 0].argmax(-1)  # (B,)
    h = hidden.gather(1, last[:, :, None].expand(-1, -1, hidden.shape[-1]))[:, 0]  # (B, d)
    return tcache, dcache, x, h, lengths


def admit(target: TargetLM, draft: MTPHead, tcache, dcache, b: int, prompt: torch.Tensor, impl: str,
          n_sink: int | None, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt`` prefilled alone, its keys and values copied into row ``b`` of both caches (NOTE
    [Refill]); returns its first new token ``()`` and its target hidden state at its last prompt
    position ``(d,)``."""
    P = prompt.numel()
    tc, dc, x, h, _ = _prefill(target, draft, [prompt], P, impl, n_sink, window)
    for big, small, m in ((tcache, tc, P), (dcache, dc, P - 1)):  # the head's chain: positions 0 .. P - 2
        big.k[:, b, :, :m].copy_(small.k[:, 0, :, :m])  # (n_layers, Hkv, m, D)
        big.v[:, b, :, :m].copy_(small.v[:, 0, :, :m])
    return x[0], h[0]


class Slots:
    """Which prompt each of a batch's rows decodes, and the outputs of the prompts done (NOTE [Refill])."""

    def __init__(self, n_prompts: int, rows: int) -> None:
        self.who, self.next, self.done = list(range(rows)), rows, [None] * n_prompts

    @property
    def waiting(self) -> bool:
        return self.next < len(self.done)

    def take(self, b: int, finished: list[int]) -> int:
        """Row ``b``'s prompt done with ``finished``; the row takes the next prompt, whose index it returns."""
        self.done[self.who[b]], self.who[b], self.next = finished, self.next, self.next + 1
        return self.who[b]

    def refill(self, out: list[tuple[list[int], bool]], prompts: list[torch.Tensor], admit_row,
               max_new_tokens: int, eos_id: int | None) -> None:
        """Every stopped row of ``out`` takes waiting prompts until it holds a live one or none wait:
        ``admit_row(b, prompt)`` prefills the prompt into row ``b``, sets the row's state and returns
        its first new token."""
        for b in range(len(self.who)):
            while out[b][1] and self.waiting:
                p = prompts[self.take(b, out[b][0])]
                out[b] = _finish([admit_row(b, p)], max_new_tokens, eos_id)

    def outputs(self, out: list[tuple[list[int], bool]], device: torch.device) -> list[torch.Tensor]:
        for b, (tokens, _) in enumerate(out):
            self.done[self.who[b]] = tokens
        return [torch.tensor(o, dtype=torch.long, device=device) for o in self.done]


def batch_rows(max_batch: int | None, n_prompts: int) -> int:
    """The rows a batch holds: ``max_batch`` (at most the prompts), or every prompt with ``None``."""
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise ValueError(f"max_batch must be None or an integer >= 1, got {max_batch!r}")
    return n_prompts if max_batch is None else min(max_batch, n_prompts)


@torch.no_grad()
def batched_speculative_generate(target: TargetLM, draft: MTPHead, prompts, max_new_tokens: int,
                                 depth: int | DepthPolicy, n_sink: int | None = None, window: int | None = None,
                                 impl: str = "auto", eos_id: int | None = None, max_batch: int | None = None
                                 ) -> tuple[list[torch.Tensor], BatchedStats]:
    """Greedy speculative decoding of ``B`` prompts of any lengths as one batch, each row at its own
    positions and keeping its own matches (the module docstring).

    Args:
        target, draft: the target LM and its MTP head.
        prompts: a ``(B, P)`` tensor of token ids, or a list of 1-D ones of any lengths.
        max_new_tokens: tokens to generate a row.
        depth: draft tokens a step (K), or a depth policy (wmtp/policy.py) that hears each live
            row's step.
        n_sink, window: the draft key set (``window=None``: the native draft).
        impl: attention implementation for draft and target.
        eos_id: a row stops after this token (included); the batch runs until every row has stopped.
        max_batch: at most this many rows at once, a stopped row taking the next prompt (NOTE
            [Refill]; ``None``: every prompt a row).

    Returns:
        One 1-D LongTensor of new tokens a prompt (each ``greedy_generate`` of its prompt: NOTE
        [Batch exactness] in wmtp/lockstep.py) and the batch's ``BatchedStats``, a prompt's counters
        at its index.

    Raises:
        ValueError: for prompts of another form, and for any row ``speculative_generate`` refuses.
    """
    rows, policy, needed, impl = check_batch(target, draft, prompts, max_new_tokens, depth, n_sink, window, eos_id,
                                             impl)
    B, K, dev = batch_rows(max_batch, len(rows)), policy.max_depth, rows[0].device
    stats, slots = BatchedStats(depth=K, batch=len(rows)), Slots(len(rows), B)
    tcache, dcache, x, h, n = _prefill(target, draft, rows[:B], needed, impl, n_sink, window)
    out = [_finish([t], max_new_tokens, eos_id) for t in x.tolist()]  # (tokens, stopped) a row
    # The head's next extend, a row each: positions hs .. hs + r - 1 (r real ones), hidden, next tokens.
    hs, r = n - 1, torch.ones(B, dtype=torch.long, device=dev)  # (B,) each
    h_ext, t_ext = h[:, None].clone(), x[:, None].clone()  # (B, 1, d), (B, 1)

    def admit_row(b: int, p: torch.Tensor) -> int:  # the row's state as a first step's (NOTE [Refill])
        x0, h0 = admit(target, draft, tcache, dcache, b, p, impl, n_sink, window)
        n[b], x[b], hs[b], r[b] = p.numel(), x0, p.numel() - 1, 1  # the current state tensors, in place
        h_ext[b, 0], t_ext[b, 0] = h0, x0
        return int(x0)

    def refill() -> None:
        slots.refill(out, rows, admit_row, max_new_tokens, eos_id)

    refill()
    while not all(stop for _, stop in out):
        live = torch.tensor([not stop for _, stop in out], device=dev)  # (B,)
        k = next_depth(policy, int(n[live].min()), K)
        synchronize(dev)
        t0 = time.perf_counter()
        M = h_ext.shape[1]  # the extend's width: the longest real extend
        dlogits, g = draft(h_ext, t_ext, hs[:, None] + torch.arange(M, device=dev), dcache, n_sink, window,
                           impl)  # (B, M, V), (B, M, d)
        last = (r - 1)[:, None, None]  # (B, 1, 1) each row's last real extend row
        drafts = [dlogits.gather(1, last.expand(-1, -1, dlogits.shape[-1]))[:, 0].argmax(-1)]  # (B,) at n + 1
        g = g.gather(1, last.expand(-1, -1, g.shape[-1]))  # (B, 1, d)
        for i in range(1, k):  # recursive drafting, row b at position n_b - 1 + i
            dlogits, g = draft(g, drafts[-1][:, None], (n - 1 + i)[:, None], dcache, n_sink, window, impl)
            drafts.append(dlogits[:, -1].argmax(-1))
        d = torch.stack(drafts, dim=1)  # (B, k)
        stats.draft_keys_read += sum(key_count(t, n_sink, window) for b in live.nonzero().flatten().tolist()
                                     for t in range(int(hs[b]), int(n[b]) - 1 + k))
        synchronize(dev)
        t1 = time.perf_counter()
        vlogits, vhidden = target(torch.cat([x[:, None], d], dim=1), n[:, None] + torch.arange(k + 1, device=dev),
                                  tcache, impl)  # (B, k+1, V), (B, k+1, d)
        choice = vlogits.argmax(-1)  # (B, k+1): each row's greedy token after each prefix
        a = (d == choice[:, :k]).long().cumprod(dim=1).sum(dim=1)  # (B,) each row's own match
        y = choice.gather(1, a[:, None])[:, 0]  # (B,) each row's target token after its a_b drafts
        synchronize(dev)
        t2 = time.perf_counter()
        stats.steps += 1
        stats.steps_by_depth[k] += 1
        stats.draft_times_s.append(t1 - t0)
        stats.verify_times_s.append(t2 - t1)
        go = live.clone()  # rows that stay live after this step move on; a row that stops keeps its state
        for b in live.nonzero().flatten().tolist():
            ab, i = int(a[b]), slots.who[b]
            policy.update(k, ab, t1 - t0, t2 - t1)
            before = len(out[b][0])
            out[b] = _finish(out[b][0] + d[b, :ab].tolist() + [int(y[b])], max_new_tokens, eos_id)
            stats.accepted[i] += ab
            stats.committed[i] += len(out[b][0]) - before
            stats.live_steps[i] += 1
            go[b] = not out[b][1]
        # The next extend of a moving row: positions n .. n + a with the target's own hidden states;
        # a stopped row keeps its own, so the width covers both (NOTE [Padded rows]).
        r_next = torch.where(go, a + 1, r)  # (B,)
        w = int(r_next.max())
        h_ext = torch.where(go[:, None, None], _width(vhidden, w), _width(h_ext, w))  # (B, w, d)
        t_ext = torch.where(go[:, None], _width(choice, w), _width(t_ext, w))  # (B, w): choices 0..a are d_1..d_a, y
        hs, r = torch.where(go, n, hs), r_next
        n, x = torch.where(go, n + a + 1, n), torch.where(go, y, x)
        refill()
    return slots.outputs(out, dev), stats


def _width(x: torch.Tensor, w: int) -> torch.Tensor:
    """``x`` ``(B, M, ...)`` cut or padded (with its last row repeated) to ``w`` rows a batch row."""
    if x.shape[1] >= w:
        return x[:, :w]
    return torch.cat([x, x[:, -1:].expand(-1, w - x.shape[1], *x.shape[2:])], dim=1)
