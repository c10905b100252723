"""Lockstep batches with device-resident steps: wmtp/lockstep.py's two loops (a dense batch, and a
batch of speculative rows that commit their least match) with steps that never read the device, each
captured once in a CUDA graph (as wmtp/static_decode.py does for one sequence; beyond the paper,
whose runs decode one sequence, arXiv 2607.21535 Sec. 4).

Why: on a GPU a small model's eager step is bound by the host's kernel launches, so the eager
lockstep loop cannot show what a batch costs the device. Here the state is static_decode.py's with
a batch axis, and every row shares one position, as in lockstep:

- ``n_prev`` (the extend's first position), ``accepted`` (the last step's ``m``), ``n`` (the
  position of the rows' latest tokens) are one number for the batch; ``h_next (B, K+1, d)`` and
  ``t_next (B, K+1)`` hold each row's hidden states and tokens from the last verify pass.
- The extend runs the last step's ``k + 1`` rows of every row of the batch and picks row ``m``
  (static_decode.py NOTE [Static extend]); the rows past ``m`` write entries that the next step
  rewrites before anyone reads them.
- The verify phase computes each row's match ``a_b``, and ``m``, the least over the rows still
  live (``live (B,)``, which the host sets when a row has stopped), on the device. The next extend
  consumes each row's target choices ``0 .. m``: a live row's first ``m`` choices are its drafts
  (``m <= a_b``), so its chain is the eager loop's. A stopped row's chain may differ from the eager
  loop's past its stop (its drafts, there), but such a row no longer counts in ``m`` and its tokens
  are cut: the outputs and the counters of the live rows are the eager loop's.
- The host reads one small tensor a step (``m``, every ``a_b`` and the choices), keeps the counters,
  and asks the depth policy for the next step's depth: the draft phase is captured per (extend
  rows, depth), the verify phase per depth (static_decode.py NOTE [Static depths]).

Every row's output is its dense greedy decoding, token for token (lockstep.py NOTE [Batch
exactness]; tests/test_static_lockstep.py checks both loops against the eager ones in float64).
``LockstepStats.draft_keys_read`` counts the extend's ``k + 1`` rows, as static_decode.py does.
"""

from __future__ import annotations

import torch

from .attention import resolve_impl
from .graphs import Clock, Phases, on_device_of, use_graph
from .keyset import key_count
from .lockstep import (
    LockstepStats,
    _check_rows,
    _check_shape,
    _cut,
    _done,
    _prefill_batch,
    check_dense_batch,
    first_positions,
)
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy, as_policy, next_depth
from .request import check_spec_request, check_times, spec_extra
from .rows import prefill_rows, timed
from .static_decode import greedy_steps

__all__ = ["static_batched_greedy_generate", "static_lockstep_generate"]


def _impl(target: TargetLM, impl: str, dev: torch.device) -> str:
    c = target.config
    return resolve_impl(impl, dev, target.embed.dtype, c.head_dim, c.n_heads // c.n_kv_heads)


@torch.no_grad()
def static_batched_greedy_generate(target: TargetLM, prompts, max_new_tokens: int, eos_id: int | None = None,
                                   impl: str = "auto", cuda_graph: bool | None = None,
                                   step_times: list[float] | None = None,
                                   prefill_times: list[float] | None = None) -> list[torch.Tensor]:
    """``batched_greedy_generate`` with device-resident steps: its output, token for token.

    With an ``eos_id`` the output is read every ``EOS_CHECK`` steps, and the steps run past the
    batch's last eos are cut.

    Args:
        prompts: a ``(B, P)`` tensor of token ids, or a list of 1-D ones of any lengths (each row
            at its own positions).
        cuda_graph: capture the one-token step in a CUDA graph (``None``: when on CUDA with the
            Triton impl; ``True`` elsewhere is a ``ValueError``).
        step_times: if a list, each step's seconds are appended (device time under a graph).
        prefill_times: if a list, the prefill's wall-clock seconds are appended.

    Returns:
        One 1-D LongTensor of new tokens a row, as ``batched_greedy_generate``.

    Raises:
        ValueError: as ``batched_greedy_generate``, and for a ``cuda_graph`` that is not ``None`` or
            a bool, or ``True`` off CUDA or without the Triton impl.
    """
    check_times(step_times=step_times, prefill_times=prefill_times)
    rows, needed, impl = check_dense_batch(target, prompts, max_new_tokens, eos_id, impl)
    dev = rows[0].device
    with on_device_of(rows[0]):
        graph = use_graph(cuda_graph, dev, impl)
        cache, _, first, _, lengths = timed(dev, lambda: prefill_rows(target, None, rows, needed, impl, checked=False),
                                            None if prefill_times is None else prefill_times.append)
        out = greedy_steps(target, cache, first, first_positions(lengths), max_new_tokens, eos_id, impl, graph,
                           step_times)
        return [torch.tensor(r, dtype=torch.long, device=dev) for r in _cut(out, max_new_tokens, eos_id)]


@torch.no_grad()
def static_lockstep_generate(target: TargetLM, draft: MTPHead, prompts: torch.Tensor, max_new_tokens: int,
                             depth: int | DepthPolicy, n_sink: int | None = None, window: int | None = None,
                             impl: str = "auto", eos_id: int | None = None, cuda_graph: bool | None = None
                             ) -> tuple[list[torch.Tensor], LockstepStats]:
    """``lockstep_generate`` with device-resident steps (the module docstring): its outputs, token for
    token, and its counters (``draft_keys_read`` counts the extend's ``k + 1`` rows).

    Args:
        target, draft, prompts, max_new_tokens, depth, n_sink, window, impl, eos_id: as in
            ``lockstep_generate``.
        cuda_graph: capture the draft phase and the verify phase, each in a CUDA graph (``None``:
            when on CUDA with the Triton impl; ``True`` elsewhere is a ``ValueError``); the
            counters' ``draft_times_s`` and ``verify_times_s`` are then device times.

    Returns:
        One 1-D LongTensor of new tokens a row and the batch's ``LockstepStats``.

    Raises:
        ValueError: as ``lockstep_generate``, and for a bad ``cuda_graph`` (as above).
    """
    _check_shape(prompts)
    with on_device_of(prompts):
        return _lockstep(target, draft, prompts, max_new_tokens, as_policy(depth), n_sink, window, impl, eos_id,
                         cuda_graph)


def _lockstep(target: TargetLM, draft: MTPHead, prompts: torch.Tensor, max_new_tokens: int, policy: DepthPolicy,
              n_sink: int | None, window: int | None, impl: str, eos_id: int | None,
              cuda_graph: bool | None) -> tuple[list[torch.Tensor], LockstepStats]:
    K = policy.max_depth  # the state and the caches hold a step of the most drafts
    # the extend's rows reach n_prev + K <= n - 1 + K, below the verify pass's n + K: `needed` holds both
    needed = check_spec_request(target, draft, prompts[0], max_new_tokens, K, n_sink, window, eos_id)
    _check_rows(target, prompts, max_new_tokens, spec_extra(max_new_tokens, K), eos_id)
    prompts, (B, P) = prompts.long(), prompts.shape
    dev = prompts.device
    impl = _impl(target, impl, dev)
    graph = use_graph(cuda_graph, dev, impl)
    stats = LockstepStats(depth=K, batch=B)
    tcache, dcache, last, h_last = timed(dev, lambda: _prefill_batch(target, draft, prompts, needed, impl,
                                                                      checked=False),
                                         stats.prefill_times_s.append)
    x = last.argmax(-1)  # (B,) each row's first new token, at position P
    rows_out = [[t] for t in x.tolist()]

    idx = torch.arange(K + 1, device=dev)  # (K+1,)
    h_next = h_last.new_zeros(B, K + 1, h_last.shape[-1])  # (B, K+1, d) hidden states the extend consumes
    h_next[:, :1] = h_last
    t_next = torch.zeros(B, K + 1, dtype=torch.long, device=dev)  # (B, K+1) the token after each of them
    t_next[:, 0] = x
    n_prev = torch.full((1,), P - 1, device=dev)  # (1,) position of the extend's row 0
    accepted = torch.zeros(1, dtype=torch.long, device=dev)  # (1,) the last step's m: rows 0..m are real
    drafts = torch.zeros(B, K, dtype=torch.long, device=dev)  # (B, K) the draft phase's proposals
    n = torch.zeros(1, dtype=torch.long, device=dev)  # (1,) position of the rows' latest tokens
    live = torch.ones(B, dtype=torch.bool, device=dev)  # (B,) the rows that count in m
    report = torch.zeros(1 + B * (K + 2), dtype=torch.long, device=dev)  # m, every a_b, the (B, k+1) choices

    def draft_phase(e: int, k: int) -> None:  # the extend of e rows, then k - 1 recursive drafts
        dlogits, g = draft(h_next[:, :e], t_next[:, :e], n_prev + idx[:e], dcache, n_sink, window, impl)  # (B, e, V)
        proposals = [dlogits.index_select(1, accepted)[:, 0].argmax(-1)]  # (B,) from extend row m
        g = g.index_select(1, accepted)  # (B, 1, d)
        at = n_prev + accepted + 1  # (1,) the rows' latest tokens' position
        for i in range(1, k):
            dlogits, g = draft(g, proposals[-1][:, None], at + (i - 1), dcache, n_sink, window, impl)  # (B, 1, V)
            proposals.append(dlogits[:, -1].argmax(-1))
        drafts[:, :k].copy_(torch.stack(proposals, dim=1))
        n.copy_(at)

    def verify_phase(k: int) -> None:  # the target over [x, d_1 .. d_k] of every row, m, the next state
        x = t_next.index_select(1, accepted)  # (B, 1)
        vlogits, vhidden = target(torch.cat([x, drafts[:, :k]], dim=1), n + idx[: k + 1], tcache, impl)  # (B, k+1, V)
        choice = vlogits.argmax(-1)  # (B, k+1)
        alone = (drafts[:, :k] == choice[:, :k]).long().cumprod(dim=1).sum(dim=1)  # (B,) a_b
        m = torch.where(live, alone, k).min().view(1)  # (1,) the live rows' least match
        report[: 1 + B * (k + 2)].copy_(torch.cat([m, alone, choice.flatten()]))
        n_prev.copy_(n)
        accepted.copy_(m)
        h_next[:, : k + 1].copy_(vhidden)
        t_next[:, : k + 1].copy_(choice)

    clock, head_start, pos, e, was_live = Clock(dev), P - 1, P, 1, [True] * B
    phases = Phases(draft_phase, verify_phase, (h_next, t_next, n_prev, accepted), graph, clock)
    while not _done(rows_out, max_new_tokens, eos_id):
        now_live = [not _done([r], max_new_tokens, eos_id) for r in rows_out]
        if now_live != was_live:  # a row stopped: it no longer counts in m
            live.copy_(torch.tensor(now_live, device=dev))
            was_live = now_live
        k = next_depth(policy, pos, K)
        phases.step((e, k), k)  # captured by (extend rows, depth)
        got = report[: 1 + B * (k + 2)].tolist()  # the step's one read of the device
        m, alone, choice = got[0], got[1 : 1 + B], got[1 + B :]
        draft_s, verify_s = clock.spans()
        stats.draft_keys_read += sum(key_count(t, n_sink, window)
                                     for t in [*range(head_start, head_start + e), *range(pos, pos + k - 1)])
        stats.steps += 1
        stats.accepted += m
        stats.accepted_alone = [s + a * on for s, a, on in zip(stats.accepted_alone, alone, now_live)]
        stats.live_steps = [s + on for s, on in zip(stats.live_steps, now_live)]
        stats.kept_live += (m + 1) * sum(now_live)
        stats.draft_times_s.append(draft_s)
        stats.verify_times_s.append(verify_s)
        stats.steps_by_depth[k] += 1
        policy.update(k, m, draft_s, verify_s)
        rows_out = [r + choice[b * (k + 1) : b * (k + 1) + m + 1] for b, r in enumerate(rows_out)]
        stats.committed = min(stats.committed + m + 1, max_new_tokens - 1)  # tokens kept (the cut's)
        head_start, pos, e = pos, pos + m + 1, k + 1
    return [torch.tensor(r, dtype=torch.long, device=dev) for r in _cut(rows_out, max_new_tokens, eos_id)], stats
