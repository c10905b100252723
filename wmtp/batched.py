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
prompt is prefilled alone straight into the row's positions ``0 .. P - 1`` of both caches
(``admit`` in wmtp/rows.py, through ``KVCache.row``), or with ``prefill_batch`` above 1 with the
next waiting prompts as one batch into caches of their own, and copied into the row
(``Admitter``); the row's state is set as a first step's.
What the row's earlier prompt left at positions ``>= P`` is never read: the new prompt's passes
write each position before any query reads it, as above. So a batch no longer waits for its
slowest row while prompts wait; the outputs come back in the prompts' order, and ``BatchedStats``
counts a prompt, not a row.

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
from .device import synchronize
from .keyset import key_count
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy, as_policy, next_depth
from .request import check_spec_request
from .rows import Admitter, Slots, as_rows, batch_rows, prefill_rows, timed

__all__ = ["BatchedStats", "batched_speculative_generate"]


@dataclass
class BatchedStats:
    """Counters of one batched run of ``batch`` prompts (as many rows, or fewer that refill: NOTE
    [Refill]): ``steps`` verify passes; prompt ``i`` was live (not yet stopped) for
    ``live_steps[i]`` of them, accepted ``accepted[i]`` drafts and kept ``committed[i]`` tokens in
    them (after its output's cut at ``max_new_tokens`` or ``eos_id``).

    Times: each step's draft and verify phase (wall-clock after a synchronize in the eager loop,
    device time under a CUDA graph) and each prefill (the first rows' together, then each
    admission's: its prefill, or with ``prefill_batch`` the staged prefill it starts and its copy;
    wall-clock after a synchronize, launches included). ``elapsed_s`` sums them; prompt ``i`` had its
    first new token at ``first_token_s[i]`` of that sum (a staged prompt's counted at its admission)
    and its last at ``done_s[i]`` (every prompt waiting from the start; the host's work between the
    timed spans is not counted)."""

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
    prefill_times_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    first_token_s: list[float | None] = field(default_factory=list)
    done_s: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted = self.accepted or [0] * self.batch
        self.committed = self.committed or [0] * self.batch
        self.live_steps = self.live_steps or [0] * self.batch
        self.steps_by_depth = self.steps_by_depth or [0] * (self.depth + 1)
        self.first_token_s = self.first_token_s or [None] * self.batch
        self.done_s = self.done_s or [None] * self.batch

    @property
    def mean_accept_length(self) -> float:
        """Tokens a live row kept per verify pass, over every row's live steps (the paper's AL)."""
        return sum(self.committed) / max(sum(self.live_steps), 1)

    def add_step(self, k: int, draft_s: float, verify_s: float) -> None:
        """A verify pass after ``k`` drafts, and its phases' seconds."""
        self.steps += 1
        self.steps_by_depth[k] += 1
        self.draft_times_s.append(draft_s)
        self.verify_times_s.append(verify_s)
        self.elapsed_s += draft_s + verify_s

    def add_prefill(self, seconds: float) -> None:
        self.prefill_times_s.append(seconds)
        self.elapsed_s += seconds

    def record(self, i: int, stopped: bool) -> None:
        """Prompt ``i`` has new tokens now and has ``stopped`` or not: the times of its first and last."""
        if self.first_token_s[i] is None:
            self.first_token_s[i] = self.elapsed_s
        if stopped:
            self.done_s[i] = self.elapsed_s


def check_batch(target: TargetLM, draft: MTPHead, prompts, max_new_tokens: int, depth: int | DepthPolicy,
                n_sink: int | None, window: int | None, eos_id: int | None, impl: str):
    """``batched_speculative_generate``'s checks: returns the prompts as a list of rows, the depth
    policy, the cache positions the batch writes (the padded prefill's included) and ``impl`` resolved."""
    rows = as_rows(prompts)
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


@torch.no_grad()
def batched_speculative_generate(target: TargetLM, draft: MTPHead, prompts, max_new_tokens: int,
                                 depth: int | DepthPolicy, n_sink: int | None = None, window: int | None = None,
                                 impl: str = "auto", eos_id: int | None = None, max_batch: int | None = None,
                                 prefill_batch: int = 1) -> tuple[list[torch.Tensor], BatchedStats]:
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
        prefill_batch: with ``max_batch``, the waiting prompts prefilled together (NOTE [Refill]):
            1, each alone straight into its row; more, that many as one batch, each copied into a
            row as one frees up.

    Returns:
        One 1-D LongTensor of new tokens a prompt (each ``greedy_generate`` of its prompt: NOTE
        [Batch exactness] in wmtp/lockstep.py) and the batch's ``BatchedStats``, a prompt's counters
        at its index.

    Raises:
        ValueError: for prompts of another form, and for any row ``speculative_generate`` refuses.
    """
    rows, policy, needed, impl = check_batch(target, draft, prompts, max_new_tokens, depth, n_sink, window, eos_id,
                                             impl)
    B, K, dev = batch_rows(max_batch, len(rows), prefill_batch), policy.max_depth, rows[0].device
    stats = BatchedStats(depth=K, batch=len(rows))
    slots = Slots(stats, B, max_new_tokens, eos_id)
    tcache, dcache, x, h, n = timed(dev, lambda: prefill_rows(target, draft, rows[:B], needed, impl), stats.add_prefill)
    for b, t in enumerate(x.tolist()):
        slots.start(b, t)
    # The head's next extend, a row each: positions hs .. hs + r - 1 (r real ones), hidden, next tokens.
    hs, r = n - 1, torch.ones(B, dtype=torch.long, device=dev)  # (B,) each
    h_ext, t_ext = h[:, None].clone(), x[:, None].clone()  # (B, 1, d), (B, 1)

    admitter = Admitter(target, draft, tcache, dcache, impl, rows, prefill_batch)

    def admit_row(b: int, i: int) -> int:  # the row's state as a first step's (NOTE [Refill])
        x0, h0 = timed(dev, lambda: admitter(b, i), stats.add_prefill)
        P = rows[i].numel()
        n[b], x[b], hs[b], r[b] = P, x0, P - 1, 1  # the current state tensors, in place
        h_ext[b, 0], t_ext[b, 0] = h0, x0
        return int(x0)

    slots.refill(admit_row)
    while not all(slots.stopped):
        live = torch.tensor([not stop for stop in slots.stopped], device=dev)  # (B,)
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
        stats.add_step(k, t1 - t0, t2 - t1)
        go = live.clone()  # rows that stay live after this step move on; a row that stops keeps its state
        for b in live.nonzero().flatten().tolist():
            ab = int(a[b])
            policy.update(k, ab, t1 - t0, t2 - t1)
            go[b] = slots.commit(b, d[b, :ab].tolist() + [int(y[b])], ab)
        # The next extend of a moving row: positions n .. n + a with the target's own hidden states;
        # a stopped row keeps its own, so the width covers both (NOTE [Padded rows]).
        r_next = torch.where(go, a + 1, r)  # (B,)
        w = int(r_next.max())
        h_ext = torch.where(go[:, None, None], _width(vhidden, w), _width(h_ext, w))  # (B, w, d)
        t_ext = torch.where(go[:, None], _width(choice, w), _width(t_ext, w))  # (B, w): choices 0..a are d_1..d_a, y
        hs, r = torch.where(go, n, hs), r_next
        n, x = torch.where(go, n + a + 1, n), torch.where(go, y, x)
        slots.refill(admit_row)
    return slots.outputs(dev), stats


def _width(x: torch.Tensor, w: int) -> torch.Tensor:
    """``x`` ``(B, M, ...)`` cut or padded (with its last row repeated) to ``w`` rows a batch row."""
    if x.shape[1] >= w:
        return x[:, :w]
    return torch.cat([x, x[:, -1:].expand(-1, w - x.shape[1], *x.shape[2:])], dim=1)
