"""Lockstep batched speculative decoding: prompts of one length decode as one batch, every row
committing the same number of tokens a step (beyond the paper, whose runs decode one sequence).

A step runs decode.py's four phases on a batch of ``B`` rows at the same positions ``n .. n + K``
(arXiv 2607.21535, Sec. 2-3: draft extend, recursive drafts, one verify pass, commit). Row ``b``
accepts ``a_b`` of its ``K`` drafts; the batch commits ``m = min_b a_b`` of each row's drafts and
then each row's target token ``y_m``. Every row's first ``m`` drafts equal its target's greedy
choices, so ``y_m`` of row ``b`` is its target's greedy token after a greedy prefix, and each row's
output is its dense greedy decoding, token for token: the batch's rows stay at one position, and
the caches, position-indexed, overwrite the entries of drafts a row accepted past ``m`` in the next
step (wmtp/kvcache.py), as they do a rejected draft's. Lockstep costs acceptance, not exactness: a
row keeps ``m + 1`` tokens where alone it might have kept ``a_b + 1`` (``LockstepStats``). A row
that has stopped (its ``eos_id``, or ``max_new_tokens``) decodes on with the batch, its tokens cut
from its output, and no longer counts in ``m``. What lockstep buys is the batch: one pass of the
head and of the target serves ``B`` rows, and a model whose step is launch-bound
(docs/results/step-anatomy.md) pays its launches once for all of them (measured on the CPU and, with
the CUDA-graph form of wmtp/static_lockstep.py, on the H200: docs/results/lockstep.md).

NOTE [Batch exactness]: a row of a batched pass and the same row computed alone can differ in the
last bits (a matrix product of ``B`` rows may sum in another order). As decode.py NOTE
[Exactness] says of verify against decode passes, the equality with ``greedy_generate`` of each
row alone is exact in real arithmetic; tests/test_lockstep.py checks it with ``torch.equal`` in
float64.
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
from .request import check_request, check_spec_request, check_target, check_times, spec_extra
from .rows import as_rows, prefill_rows, timed

__all__ = ["LockstepStats", "batched_greedy_generate", "check_dense_batch", "lockstep_generate"]


@dataclass
class LockstepStats:
    """Counters of one lockstep run of ``batch`` rows: the steps add ``committed`` tokens to every row
    (counted up to ``max_new_tokens``, also past a row's ``eos_id``: a stopped row decodes on) in
    ``steps`` verify passes; ``accepted`` sums each step's ``m``. While row ``b`` has not stopped
    (``live_steps[b]`` steps) it matched ``accepted_alone[b]`` drafts itself and kept ``kept_live``'s
    share."""

    depth: int
    batch: int
    steps: int = 0
    committed: int = 0
    accepted: int = 0
    accepted_alone: list[int] = field(default_factory=list)
    live_steps: list[int] = field(default_factory=list)
    kept_live: int = 0  # tokens the live rows kept, summed over rows and steps
    draft_keys_read: int = 0  # keys the draft's attention read for one row (each row reads as many)
    steps_by_depth: list[int] = field(default_factory=list)  # steps that drafted k (all at depth without a policy)
    draft_times_s: list[float] = field(default_factory=list)
    verify_times_s: list[float] = field(default_factory=list)
    prefill_times_s: list[float] = field(default_factory=list)  # the prefill's wall-clock seconds (one)

    def __post_init__(self) -> None:
        self.accepted_alone = self.accepted_alone or [0] * self.batch
        self.live_steps = self.live_steps or [0] * self.batch
        self.steps_by_depth = self.steps_by_depth or [0] * (self.depth + 1)

    @property
    def mean_accept_length(self) -> float:
        """Tokens the steps add to a row per verify pass (the paper's AL for the batch, counted up to
        ``max_new_tokens`` and past an ``eos_id``)."""
        return self.committed / max(self.steps, 1)

    @property
    def lockstep_efficiency(self) -> float:
        """Tokens the live rows kept over the tokens their own matches would have kept in the same
        steps, ``sum_b sum(m + 1) / sum_b sum(a_b + 1)`` over each row's live steps (without an
        ``eos_id``: ``sum(m + 1) / mean_b sum(a_b + 1)``); 1 when every row matched alike, or no step ran."""
        own = sum(a + s for a, s in zip(self.accepted_alone, self.live_steps))
        return self.kept_live / own if own else 1.0


def _check_shape(prompts: torch.Tensor) -> None:
    if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2 or prompts.numel() == 0:
        raise ValueError("prompts must be a non-empty (B, P) integer tensor: B prompts of P tokens each")


def _check_rows(target: TargetLM, prompts: torch.Tensor, max_new_tokens: int, extra: int,
                eos_id: int | None) -> int:
    """Every row checked as ``check_request`` checks a prompt; returns the positions a row writes."""
    _check_shape(prompts)
    needed = 0
    for b, row in enumerate(prompts):
        try:
            needed = max(needed, check_request(target, row, max_new_tokens, extra, eos_id))
        except ValueError as e:
            raise ValueError(f"prompts row {b}: {e}") from None
    return needed


def _cut(rows: list[list[int]], max_new_tokens: int, eos_id: int | None) -> list[list[int]]:
    """Each row cut at ``max_new_tokens`` and after its first ``eos_id``."""
    rows = [r[:max_new_tokens] for r in rows]
    return [r[: r.index(eos_id) + 1] if eos_id in r else r for r in rows]


def _done(rows: list[list[int]], max_new_tokens: int, eos_id: int | None) -> bool:
    return all(len(r) >= max_new_tokens or eos_id in r for r in rows)


def _prefill_batch(target: TargetLM, draft: MTPHead | None, prompts: torch.Tensor, needed: int, impl: str,
                   checked: bool = True):
    """New caches of ``needed`` positions for the ``(B, P)`` prompts: the target over the prompts, then
    the head's cache write (if a head) over their true chains, positions ``0 .. P-2`` (NOTE [Shared
    draft prefill] in wmtp/prefill.py). Returns both caches (the head's ``None`` without a head), the
    target's last logits ``(B, V)`` and last hidden states ``(B, 1, d)``. ``checked``: the caches'
    range check (off for the static loops: ``KVCache``'s docstring in wmtp/kvcache.py)."""
    B, P = prompts.shape
    dev = prompts.device
    tcache = target.new_cache(B, needed, checked=checked)
    last = torch.full((B, 1), P - 1, device=dev)  # NOTE [Logits at] in wmtp/model.py
    logits, hidden = target(prompts, torch.arange(P, device=dev), tcache, impl, last)  # (B, 1, V), (B, P, d)
    dcache = None if draft is None else draft.new_cache(B, needed, checked=checked)
    if draft is not None and P > 1:  # the head's true chain over the prompt, positions 0 .. P-2
        draft.write_cache(hidden[:, :-1], prompts[:, 1:], torch.arange(P - 1, device=dev), dcache, impl)
    return tcache, dcache, logits[:, 0], hidden[:, -1:]


def check_dense_batch(target: TargetLM, prompts, max_new_tokens: int, eos_id: int | None, impl: str):
    """The dense batch's checks: returns the prompts as a list of rows (a ``(B, P)`` tensor's, or a
    list of 1-D ones of any lengths), the cache positions a row writes and ``impl`` resolved."""
    check_target(target)  # once, not as a row's error
    rows = as_rows(prompts)
    dev = rows[0].device
    if any(r.device != dev for r in rows):
        raise ValueError("every prompt must be on one device")
    needed = 0
    for b, row in enumerate(rows):
        try:
            needed = max(needed, check_request(target, row, max_new_tokens, -1, eos_id))
        except ValueError as e:
            raise ValueError(f"prompts row {b}: {e}") from None
    impl = resolve_impl(impl, dev, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    return rows, max(needed, max(r.numel() for r in rows)), impl


def first_positions(lengths: torch.Tensor) -> torch.Tensor:
    """The positions of the rows' first new tokens: ``(1,)`` when the prompts share one length (every
    row at one position, as lockstep has it), else ``(B, 1)``, a position a row (wmtp/batched.py)."""
    return lengths[:1].clone() if bool((lengths == lengths[0]).all()) else lengths[:, None].clone()


@torch.no_grad()
def batched_greedy_generate(target: TargetLM, prompts, max_new_tokens: int, eos_id: int | None = None,
                            impl: str = "auto", step_times: list[float] | None = None,
                            prefill_times: list[float] | None = None) -> list[torch.Tensor]:
    """Dense greedy decoding of ``B`` prompts as one batch: the reference of ``lockstep_generate`` and
    of ``batched_speculative_generate`` (its rows are ``greedy_generate`` of each prompt: NOTE [Batch
    exactness]). Prompts of different lengths are padded at their ends, each row at its own
    positions (NOTE [Padded rows] in wmtp/batched.py).

    Args:
        prompts: a ``(B, P)`` tensor of token ids, or a list of 1-D ones of any lengths.
        max_new_tokens, eos_id, impl: as in ``greedy_generate`` (a row stops after its ``eos_id``;
            the batch runs until every row has stopped).
        step_times: if a list, the wall-clock seconds of each one-token step are appended.
        prefill_times: if a list, the prefill's wall-clock seconds are appended.

    Returns:
        One 1-D LongTensor of new tokens a row.

    Raises:
        ValueError: for prompts of another form or on two devices, timing outputs that are not
            lists, and for any row ``greedy_generate`` refuses.
    """
    check_times(step_times=step_times, prefill_times=prefill_times)
    rows, needed, impl = check_dense_batch(target, prompts, max_new_tokens, eos_id, impl)
    dev = rows[0].device
    cache, _, x, _, lengths = timed(dev, lambda: prefill_rows(target, None, rows, needed, impl),
                                    None if prefill_times is None else prefill_times.append)  # x (B,): first tokens
    pos = first_positions(lengths)  # (1,) or (B, 1)
    out = [[t] for t in x.tolist()]
    while not _done(out, max_new_tokens, eos_id):
        if step_times is not None:
            synchronize(dev)
        t0 = time.perf_counter()
        logits, _ = target(x[:, None], pos, cache, impl)  # (B, 1, V)
        x = logits[:, -1].argmax(-1)
        out, pos = [r + [t] for r, t in zip(out, x.tolist())], pos + 1
        if step_times is not None:
            step_times.append(time.perf_counter() - t0)
    return [torch.tensor(r, dtype=torch.long, device=dev) for r in _cut(out, max_new_tokens, eos_id)]


@torch.no_grad()
def lockstep_generate(target: TargetLM, draft: MTPHead, prompts: torch.Tensor, max_new_tokens: int,
                      depth: int | DepthPolicy,
                      n_sink: int | None = None, window: int | None = None, impl: str = "auto",
                      eos_id: int | None = None) -> tuple[list[torch.Tensor], LockstepStats]:
    """Greedy speculative decoding of ``B`` prompts of one length in lockstep (the module docstring).

    Args:
        target, draft: the target LM and its MTP head.
        prompts: ``(B, P)`` integer token ids.
        max_new_tokens: tokens to generate a row.
        depth: draft tokens a step (K), or a depth policy (wmtp/policy.py) told each step's ``m``:
            ``AdaptiveDepth`` drafts less when the batch's least match is short.
        n_sink, window: the draft key set (``window=None``: the native draft).
        impl: attention implementation for draft and target.
        eos_id: a row stops after this token (included); the batch runs until every row has stopped.

    ``speculative_generate``'s other options (``prefill``, ``draft_cache``, ``positions``, ``gate``,
    ``verifier``) have no lockstep form; this loop is eager (``static_lockstep_generate`` in
    wmtp/static_lockstep.py is its CUDA-graph form).

    Returns:
        One 1-D LongTensor of new tokens a row (each ``greedy_generate`` of its prompt: NOTE [Batch
        exactness]) and the batch's ``LockstepStats``.

    Raises:
        ValueError: for ``prompts`` that are not a non-empty ``(B, P)`` tensor, and for any row
            ``speculative_generate`` refuses.
    """
    _check_shape(prompts)
    policy = as_policy(depth)
    depth = policy.max_depth  # the caches hold a step of the most drafts
    needed = check_spec_request(target, draft, prompts[0], max_new_tokens, depth, n_sink, window, eos_id)
    _check_rows(target, prompts, max_new_tokens, spec_extra(max_new_tokens, depth), eos_id)
    prompts, (B, P) = prompts.long(), prompts.shape
    dev = prompts.device
    impl = resolve_impl(impl, dev, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    stats = LockstepStats(depth=depth, batch=B)
    tcache, dcache, last, h_last = timed(dev, lambda: _prefill_batch(target, draft, prompts, needed, impl),
                                         stats.prefill_times_s.append)
    x = last.argmax(-1)  # (B,) the first new token of each row, at position P
    rows = [[t] for t in x.tolist()]
    head_start, h_new, next_tokens, n = P - 1, h_last, x[:, None], P  # (B, 1, d), (B, 1)
    while not _done(rows, max_new_tokens, eos_id):
        live = [not _done([r], max_new_tokens, eos_id) for r in rows]
        k = next_depth(policy, n, depth)
        synchronize(dev)
        t0 = time.perf_counter()
        dlogits, g = draft(h_new, next_tokens, torch.arange(head_start, n, device=dev), dcache, n_sink, window,
                           impl)  # (B, n - head_start, V), (B, n - head_start, d)
        drafts = [dlogits[:, -1].argmax(-1)]  # (B,) d_1 guesses position n + 1
        for i in range(1, k):  # recursive drafting, every row at position n - 1 + i
            dlogits, g = draft(g[:, -1:], drafts[-1][:, None], torch.tensor([n - 1 + i], device=dev), dcache,
                               n_sink, window, impl)
            drafts.append(dlogits[:, -1].argmax(-1))
        d = torch.stack(drafts, dim=1)  # (B, k)
        stats.draft_keys_read += sum(key_count(t, n_sink, window) for t in range(head_start, n - 1 + k))
        synchronize(dev)
        t1 = time.perf_counter()
        vlogits, vhidden = target(torch.cat([x[:, None], d], dim=1), torch.arange(n, n + k + 1, device=dev),
                                  tcache, impl)  # (B, k+1, V), (B, k+1, d)
        choice = vlogits.argmax(-1)  # (B, k+1): each row's greedy token after each prefix
        alone = (d == choice[:, :k]).long().cumprod(dim=1).sum(dim=1)  # (B,) a_b
        m = min(a for a, on in zip(alone.tolist(), live) if on)  # the live rows' least match
        x = choice[:, m]  # (B,) each row's target token after m accepted drafts
        synchronize(dev)
        t2 = time.perf_counter()
        stats.steps += 1
        stats.accepted += m
        stats.accepted_alone = [s + a * on for s, a, on in zip(stats.accepted_alone, alone.tolist(), live)]
        stats.live_steps = [s + on for s, on in zip(stats.live_steps, live)]
        stats.kept_live += (m + 1) * sum(live)
        stats.draft_times_s.append(t1 - t0)
        stats.verify_times_s.append(t2 - t1)
        stats.steps_by_depth[k] += 1
        policy.update(k, m, t1 - t0, t2 - t1)
        kept = torch.cat([d[:, :m], x[:, None]], dim=1)  # (B, m + 1)
        rows = [r + new for r, new in zip(rows, kept.tolist())]
        stats.committed = min(stats.committed + m + 1, max_new_tokens - 1)  # tokens kept (the cut's)
        head_start, h_new, next_tokens = n, vhidden[:, : m + 1], kept  # the head's next extend: n .. n + m
        n += m + 1
    return [torch.tensor(r, dtype=torch.long, device=dev) for r in _cut(rows, max_new_tokens, eos_id)], stats
