"""Batches with a position a row and device-resident steps: wmtp/batched.py's loop with steps that
never read the device, each phase captured once in a CUDA graph (as wmtp/static_lockstep.py does for
lockstep; beyond the paper, whose runs decode one sequence, arXiv 2607.21535 Sec. 4).

The state is static_lockstep.py's with every number a row's own:

- ``n_prev (B,)`` (a row's extend's first position), ``accepted (B,)`` (its last step's ``a_b``),
  ``n (B,)`` (the position of its latest token); ``h_next (B, K+1, d)`` and ``t_next (B, K+1)`` hold
  each row's hidden states and target choices from the last verify pass (a row's first ``a_b``
  choices are its accepted drafts, so ``t_next`` is the tokens after its positions).
- The extend runs the last step's ``k + 1`` rows of every row and takes row ``a_b`` of row ``b``;
  the rows past it write entries that are rewritten before anyone reads them (NOTE [Padded rows] in
  wmtp/batched.py).
- The verify phase computes each row's ``a_b`` on the device and moves the rows in ``live (B,)`` on;
  a row the host has seen stop keeps its state. The host sees a stop after the step that made it,
  so a stopped row sits at the positions after that step: the caches hold ``K + 1`` positions more
  than the eager loop's, for its passes, which write nothing anyone reads.
- The host reads one small tensor a step (every ``a_b`` and the choices), keeps the counters, and
  asks the depth policy for the next step's depth: the draft phase is captured per (extend rows,
  depth), the verify phase per depth (static_decode.py NOTE [Static depths]).

Every row's output and counters are the eager loop's (tests/test_static_batched.py, float64).
"""

from __future__ import annotations

import torch

from .batched import BatchedStats, check_batch
from .graphs import Clock, Phases, on_device_of, use_graph
from .keyset import key_count
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy, next_depth
from .rows import Admitter, Slots, batch_rows, prefill_rows, timed

__all__ = ["static_batched_speculative_generate"]


@torch.no_grad()
def static_batched_speculative_generate(target: TargetLM, draft: MTPHead, prompts, max_new_tokens: int,
                                        depth: int | DepthPolicy, n_sink: int | None = None,
                                        window: int | None = None, impl: str = "auto", eos_id: int | None = None,
                                        cuda_graph: bool | None = None, max_batch: int | None = None,
                                        prefill_batch: int = 1
                                        ) -> tuple[list[torch.Tensor], BatchedStats]:
    """``batched_speculative_generate`` with device-resident steps (the module docstring): its outputs,
    token for token, and its counters.

    Args:
        target, draft, prompts, max_new_tokens, depth, n_sink, window, impl, eos_id: as in
            ``batched_speculative_generate``.
        max_batch, prefill_batch: as there; a prompt takes a stopped row between steps, outside the
            graphs (NOTE [Refill] in wmtp/batched.py).
        cuda_graph: capture the draft phase and the verify phase, each in a CUDA graph (``None``:
            when on CUDA with the Triton impl; ``True`` elsewhere is a ``ValueError``); the counters'
            ``draft_times_s`` and ``verify_times_s`` are then device times.

    Returns:
        One 1-D LongTensor of new tokens a prompt and the batch's ``BatchedStats``.

    Raises:
        ValueError: as ``batched_speculative_generate``, and for a bad ``cuda_graph`` (as above).
    """
    rows, policy, needed, impl = check_batch(target, draft, prompts, max_new_tokens, depth, n_sink, window, eos_id,
                                             impl)
    B = batch_rows(max_batch, len(rows), prefill_batch)
    with on_device_of(rows[0]):
        return _run(target, draft, rows, B, max_new_tokens, policy, n_sink, window, impl, eos_id, needed, cuda_graph,
                    prefill_batch)


def _run(target: TargetLM, draft: MTPHead, rows: list[torch.Tensor], B: int, max_new_tokens: int,
         policy: DepthPolicy, n_sink: int | None, window: int | None, impl: str, eos_id: int | None, needed: int,
         cuda_graph: bool | None, prefill_batch: int) -> tuple[list[torch.Tensor], BatchedStats]:
    K, dev = policy.max_depth, rows[0].device
    graph = use_graph(cuda_graph, dev, impl)
    stats = BatchedStats(depth=K, batch=len(rows))
    slots = Slots(stats, B, max_new_tokens, eos_id)
    tcache, dcache, x, h_last, lengths = timed(
        dev, lambda: prefill_rows(target, draft, rows[:B], needed + K + 1, impl, checked=False), stats.add_prefill)
    for b, t in enumerate(x.tolist()):
        slots.start(b, t)

    idx = torch.arange(K + 1, device=dev)  # (K+1,)
    h_next = h_last.new_zeros(B, K + 1, h_last.shape[-1])  # (B, K+1, d) hidden states the extend consumes
    h_next[:, 0] = h_last
    t_next = torch.zeros(B, K + 1, dtype=torch.long, device=dev)  # (B, K+1) the token after each of them
    t_next[:, 0] = x
    n_prev = lengths - 1  # (B,) position of each row's extend row 0
    accepted = torch.zeros(B, dtype=torch.long, device=dev)  # (B,) each row's last a_b: rows 0..a_b are real
    drafts = torch.zeros(B, K, dtype=torch.long, device=dev)  # (B, K) the draft phase's proposals
    n = lengths.clone()  # (B,) position of each row's latest token
    live = torch.ones(B, dtype=torch.bool, device=dev)  # (B,) the rows that move on
    report = torch.zeros(B * (K + 2), dtype=torch.long, device=dev)  # every a_b, the (B, k+1) choices

    def draft_phase(e: int, k: int) -> None:  # the extend of e rows a row, then k - 1 recursive drafts
        dlogits, g = draft(h_next[:, :e], t_next[:, :e], n_prev[:, None] + idx[:e], dcache, n_sink, window,
                           impl)  # (B, e, V), (B, e, d)
        last = accepted.clamp(max=e - 1)[:, None, None]  # (B, 1, 1): a stopped row's may pass e
        proposals = [dlogits.gather(1, last.expand(-1, -1, dlogits.shape[-1]))[:, 0].argmax(-1)]  # (B,)
        g = g.gather(1, last.expand(-1, -1, g.shape[-1]))  # (B, 1, d)
        at = n_prev + accepted + 1  # (B,) each row's latest token's position
        for i in range(1, k):
            dlogits, g = draft(g, proposals[-1][:, None], (at + i - 1)[:, None], dcache, n_sink, window, impl)
            proposals.append(dlogits[:, -1].argmax(-1))
        drafts[:, :k].copy_(torch.stack(proposals, dim=1))
        n.copy_(at)

    def verify_phase(k: int) -> None:  # the target over [x, d_1 .. d_k] of every row, each a_b, the next state
        x = t_next.gather(1, accepted[:, None])  # (B, 1)
        vlogits, vhidden = target(torch.cat([x, drafts[:, :k]], dim=1), n[:, None] + idx[: k + 1], tcache,
                                  impl)  # (B, k+1, V), (B, k+1, d)
        choice = vlogits.argmax(-1)  # (B, k+1)
        a = (drafts[:, :k] == choice[:, :k]).long().cumprod(dim=1).sum(dim=1)  # (B,) a_b
        report[: B * (k + 2)].copy_(torch.cat([a, choice.flatten()]))
        n_prev.copy_(torch.where(live, n, n_prev))
        accepted.copy_(torch.where(live, a, accepted))
        h_next[:, : k + 1].copy_(torch.where(live[:, None, None], vhidden, h_next[:, : k + 1]))
        t_next[:, : k + 1].copy_(torch.where(live[:, None], choice, t_next[:, : k + 1]))

    clock, e, was_live = Clock(dev), 1, [True] * B
    phases = Phases(draft_phase, verify_phase, (h_next, t_next, n_prev, accepted), graph, clock)
    pos = lengths.tolist()  # each row's latest token's position, on the host, for the counters
    head_start = [p - 1 for p in pos]

    admitter = Admitter(target, draft, tcache, dcache, impl, rows, prefill_batch)

    def admit_row(b: int, i: int) -> int:  # the row's state as a first step's (NOTE [Refill])
        x0, h0 = timed(dev, lambda: admitter(b, i), stats.add_prefill)
        h_next[b, 0], t_next[b, 0] = h0, x0  # the graphs' state, in place
        P = rows[i].numel()
        n_prev[b], accepted[b] = P - 1, 0
        head_start[b], pos[b] = P - 1, P
        return int(x0)

    slots.refill(admit_row)
    while not all(slots.stopped):
        now_live = [not stop for stop in slots.stopped]
        if now_live != was_live:  # a row stopped: it no longer moves
            live.copy_(torch.tensor(now_live, device=dev))
            was_live = now_live
        k = next_depth(policy, min(p for p, on in zip(pos, now_live) if on), K)
        phases.step((e, k), k)  # captured by (extend rows, depth)
        got = report[: B * (k + 2)].tolist()  # the step's one read of the device
        a, choice = got[:B], got[B:]
        draft_s, verify_s = clock.spans()
        stats.add_step(k, draft_s, verify_s)
        for b in (b for b in range(B) if now_live[b]):
            stats.draft_keys_read += sum(key_count(t, n_sink, window) for t in range(head_start[b], pos[b] - 1 + k))
            policy.update(k, a[b], draft_s, verify_s)
            slots.commit(b, choice[b * (k + 1) : b * (k + 1) + a[b] + 1], a[b])
            head_start[b], pos[b] = pos[b], pos[b] + a[b] + 1
        e = k + 1
        slots.refill(admit_row)
    return slots.outputs(dev), stats
