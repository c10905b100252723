"""Device-resident decoding: greedy and speculative loops whose steps never read the device, so that
a step can be captured once in a CUDA graph and replayed (as gpt-fast captures its decode step).

Why: the draft-KV tax (arXiv 2607.21535, Sec. 1 and 4) is device time, a few microseconds per draft
call at long context. The eager loops of wmtp/decode.py launch every kernel from Python and read
every accepted count back before planning the next step; on a GPU a small model's step is then
bound by the host (metrics/python-stdlib-seed42-cuda-h200.json: 75-135 us per eager draft-attention
call, whatever the number of keys), and no key set can change that. Here:

- The step's state lives on the device: ``n_prev`` (the first position the head consumes),
  ``accepted`` (the last step's accepted count), the target's hidden states at ``n_prev ..
  n_prev + depth`` and the tokens that follow them. Every position is computed on the device.
- NOTE [Static extend]: the eager draft extend consumes the ``a + 1`` positions committed by the
  last step (``a`` accepted drafts and the target's own token). Its count varies, so here the
  extend runs the last step's ``depth + 1`` rows (the most it can commit; at the first step one
  row, the prompt's last position), of which rows ``0 .. a`` are real, and picks row ``a`` on the
  device. The other rows write draft-KV entries at positions ``>= n`` (``n``: the position of
  the target's latest token), which nobody reads before the recursive drafts and the next step's
  extend rewrite them: the caches are position-indexed (NOTE [No rollback], wmtp/kvcache.py), and a
  query only reads keys at or before its own position. A real row reads the same keys as in the
  eager extend, so it computes the same draft, up to the last bits of matrices of another shape.
- The accepted drafts equal the target's choices, so after the verify pass the next extend's
  hidden states are the verify pass's and its tokens are the target's choices, all ``k + 1`` of a
  step that drafted ``k``.
- The host reads one small tensor per step (the accepted count and the target's ``k + 1``
  choices), keeps the statistics and decides when to stop, exactly as the eager loop.
- NOTE [Static depths]: a depth policy (wmtp/policy.py) picks each step's depth ``k`` on the host,
  before the step, from what the host read after the last one. The state is sized for the
  policy's ``max_depth`` ``K``; a step after a depth-``j`` step extends ``j + 1`` rows, drafts its
  ``k`` tokens and verifies ``k + 1``. The draft phase is captured once per (extend rows, depth,
  key set) met (a context gate gives a step one of two key sets: ``gated_key_set`` in
  wmtp/policy.py) and the verify phase once per depth, each at the first step that needs it; the output
  stays dense greedy's whatever the depths. (An extend of ``K + 1`` rows every step would need one
  draft graph per depth, but it cost the adaptive policy's mostly depth-1 steps about 0.2 ms
  each on the H200 at 16384 tokens: 0.552 ms a token, 0.444 with this extend; docs/results/depth-gpu.md.)

The output is the target's greedy output token for token (tests/test_static_decode.py asserts
``torch.equal`` against wmtp/decode.py's ``greedy_generate``, on every device and impl). With
``cuda_graph`` the draft phase and the verify phase are each one CUDA graph (NOTE [Static depths]),
all of a run's graphs in one memory pool (NOTE [One graph pool] in wmtp/graphs.py), timed by CUDA
events: ``SpecStats.draft_times_s`` and ``verify_times_s`` are then device times.
Verification is the batched greedy rule (``verify_greedy``); a custom verifier needs the eager loop.
"""

from __future__ import annotations

import torch

from .attention import resolve_impl
from .decode import _each_prompt, _finish, _one_prompt
from .graphs import Clock, Phases, on_device_of, runner, use_graph
from .keyset import key_count
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy, as_policy, gated_key_set, next_depth
from .prefill import Prefill, start
from .request import check_request, check_spec_request, check_times, draft_ring, with_positions
from .stats import SpecStats

EOS_CHECK = 16  # greedy: steps between reads of the output when an eos_id can stop it early


@torch.no_grad()
def static_greedy_generate(target: TargetLM, prompt_ids: torch.Tensor | list[torch.Tensor], max_new_tokens: int,
                           eos_id: int | None = None, impl: str = "auto", cuda_graph: bool | None = None,
                           step_times: list[float] | None = None, prefill: Prefill | None = None
                           ) -> torch.Tensor | list[torch.Tensor]:
    """Dense greedy decoding with device-resident steps: ``greedy_generate``'s output, token for token.

    The other arguments are ``greedy_generate``'s. With an ``eos_id`` the output is read every
    ``EOS_CHECK`` steps, and the steps run past the eos are cut.

    Args:
        cuda_graph: capture the one-token step in a CUDA graph (``None``: when on CUDA with the
            Triton impl; ``True`` elsewhere is a ``ValueError``).
        step_times: if a list, each step's seconds are appended (device time under a graph).
        prefill: as ``greedy_generate``'s (wmtp/prefill.py).

    Returns:
        As ``greedy_generate``: a 1-D LongTensor of new tokens (a list of them for a list of prompts).

    Raises:
        ValueError: as ``greedy_generate``, and for a ``cuda_graph`` that is not ``None`` or a bool,
            or ``True`` off CUDA or without the Triton impl.
    """
    check_times(step_times=step_times)
    if isinstance(prompt_ids, (list, tuple)):
        _one_prompt(prefill)
        return _each_prompt(prompt_ids, lambda p: static_greedy_generate(target, p, max_new_tokens, eos_id, impl,
                                                                         cuda_graph, step_times))
    with on_device_of(prompt_ids):
        return _greedy(target, prompt_ids, max_new_tokens, eos_id, impl, cuda_graph, step_times, prefill)


def _greedy(target: TargetLM, prompt_ids: torch.Tensor, max_new_tokens: int, eos_id: int | None, impl: str,
            cuda_graph: bool | None, step_times: list[float] | None, prefill: Prefill | None) -> torch.Tensor:
    needed = check_request(target, prompt_ids, max_new_tokens, extra=-1, eos_id=eos_id)
    prompt_ids, dev = prompt_ids.long(), prompt_ids.device
    impl = resolve_impl(impl, dev, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    graph = use_graph(cuda_graph, dev, impl)
    cache, _, last, _ = start(target, None, prompt_ids, needed=needed, impl=impl, checked=False, prefill=prefill)
    rows = greedy_steps(target, cache, last.argmax().view(1), prompt_ids.numel(), max_new_tokens, eos_id, impl,
                        graph, step_times)
    return torch.tensor(_finish(rows[0], max_new_tokens, eos_id)[0], dtype=torch.long, device=dev)


def greedy_steps(target: TargetLM, cache, first: torch.Tensor, P: int | torch.Tensor, max_new_tokens: int,
                 eos_id: int | None, impl: str, graph: bool, step_times: list[float] | None) -> list[list[int]]:
    """The device-resident dense loop of ``B`` rows after a prefill of ``P`` positions into ``cache``
    (a tensor: the first new tokens' positions, ``(1,)`` or a row's own ``(B, 1)``):
    from each row's first new token ``first`` ``(B,)``, one token a row a step (the step one CUDA graph
    with ``graph``) until ``max_new_tokens``, or until every row holds ``eos_id`` (read every
    ``EOS_CHECK`` steps). Returns each row's tokens, uncut (the steps run past an eos included)."""
    B, dev = first.numel(), first.device
    tok = first.view(B, 1).clone()  # (B, 1) each row's latest token, fed to the next step
    out = torch.zeros(B, max(max_new_tokens, 1), dtype=torch.long, device=dev)  # (B, max_new_tokens)
    out[:, :1] = tok
    pos = P.clone() if isinstance(P, torch.Tensor) else torch.full((1,), P, device=dev)  # (1,) or (B, 1)
    slot = torch.ones(1, dtype=torch.long, device=dev)  # (1,) where the step's tokens go in out

    def step() -> None:
        logits, _ = target(tok, pos, cache, impl)  # (B, 1, V)
        nxt = logits[:, -1].argmax(-1)[:, None]  # (B, 1)
        tok.copy_(nxt)
        out.index_copy_(1, slot, nxt)
        pos.add_(1)
        slot.add_(1)

    run = runner(step, (tok, pos, slot), graph) if max_new_tokens > 1 else step
    clock, done = Clock(dev), 1
    clock.mark()
    while done < max_new_tokens:
        if eos_id is not None and done % EOS_CHECK == 1 and all(eos_id in r for r in out[:, :done].tolist()):
            break
        run()
        clock.mark()
        done += 1
    if step_times is not None:
        step_times.extend(clock.spans())
    return out[:, :done].tolist()


@torch.no_grad()
def static_speculative_generate(target: TargetLM, draft: MTPHead, prompt_ids: torch.Tensor | list[torch.Tensor],
                                max_new_tokens: int, depth: int | DepthPolicy, n_sink: int | None = None,
                                window: int | None = None, impl: str = "auto", eos_id: int | None = None,
                                cuda_graph: bool | None = None, prefill: Prefill | None = None,
                                draft_cache: str = "full", positions: str = "absolute", gate: int | None = None
                                ) -> tuple[torch.Tensor, SpecStats] | tuple[list[torch.Tensor], list[SpecStats]]:
    """Greedy (Windowed-)MTP speculative decoding with device-resident steps.

    The arguments and the output are ``speculative_generate``'s (without ``verifier``), and the
    statistics count the same steps, drafts and accepts; ``draft_queries`` and ``draft_keys_read``
    count the extend's rows, the last step's ``depth + 1`` (NOTE [Static extend]).

    Args:
        depth: draft tokens per step, or a depth policy (wmtp/policy.py) asked before each step,
            as in ``speculative_generate`` (NOTE [Static depths]).
        cuda_graph: capture the draft phase and the verify phase, each in a CUDA graph (``None``:
            when on CUDA with the Triton impl; ``True`` elsewhere is a ``ValueError``).
        prefill: as ``speculative_generate``'s (wmtp/prefill.py).
        draft_cache: as ``speculative_generate``'s: ``"ring"`` keeps the draft's KV in a ring
            (wmtp/ringcache.py; the extend's at most ``depth + 1`` rows are within its spare slots).
        positions: as ``speculative_generate``'s (``"reindexed"``: StreamingLLM's, wmtp/keyset.py).
        gate: as ``speculative_generate``'s (a context gate: ``gated_key_set`` in wmtp/policy.py); a draft phase is
            captured per key set too.

    Returns:
        As ``speculative_generate``: the new tokens and a ``SpecStats`` (a list of each for a list
        of prompts).

    Raises:
        ValueError: as ``speculative_generate``, and for a ``cuda_graph`` that is not ``None`` or a
            bool, or ``True`` off CUDA or without the Triton impl.
    """
    if isinstance(prompt_ids, (list, tuple)):
        _one_prompt(prefill)
        runs = _each_prompt(prompt_ids, lambda p: static_speculative_generate(
            target, draft, p, max_new_tokens, depth, n_sink, window, impl, eos_id, cuda_graph,
            draft_cache=draft_cache, positions=positions, gate=gate))
        return [out for out, _ in runs], [stats for _, stats in runs]
    with on_device_of(prompt_ids):
        return _speculative(target, draft, prompt_ids, max_new_tokens, depth, n_sink, window, impl, eos_id,
                            cuda_graph, prefill, draft_cache, positions, gate)


def _speculative(target: TargetLM, draft: MTPHead, prompt_ids: torch.Tensor, max_new_tokens: int, depth: int,
                 n_sink: int | None, window: int | None, impl: str, eos_id: int | None,
                 cuda_graph: bool | None, prefill: Prefill | None, draft_cache: str,
                 positions: str, gate: int | None) -> tuple[torch.Tensor, SpecStats]:
    policy = as_policy(depth)
    depth = policy.max_depth  # the state and the caches hold a step of the most drafts
    needed = check_spec_request(target, draft, prompt_ids, max_new_tokens, depth, n_sink, window, eos_id, gate)
    ring, head = draft_ring(draft_cache, n_sink, window, depth, gate), with_positions(draft, positions)
    prompt_ids, dev, K = prompt_ids.long(), prompt_ids.device, depth
    impl = resolve_impl(impl, dev, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    graph = use_graph(cuda_graph, dev, impl)
    stats = SpecStats(depth=K)
    # the extend's rows reach n_prev + K <= n - 1 + K, below the verify pass's n + K: `needed` holds both
    tcache, dcache, last_logits, last_hidden = start(  # the prefill, as the eager loop's
        target, draft, prompt_ids, needed=needed, impl=impl, checked=False, prefill=prefill, ring=ring)
    stats.draft_kv_bytes = getattr(dcache, "nbytes", 0)
    P = prompt_ids.numel()
    x = last_logits.argmax()
    out, stop = _finish([int(x)], max_new_tokens, eos_id)
    if stop:
        return torch.tensor(out, dtype=torch.long, device=dev), stats

    rows = torch.arange(K + 1, device=dev)  # (K+1,)
    h_next = last_hidden.new_zeros(1, K + 1, last_hidden.shape[-1])  # (1, K+1, d) hidden states the extend consumes
    h_next[:, 0] = last_hidden[:, -1]
    t_next = torch.zeros(K + 1, dtype=torch.long, device=dev)  # (K+1,) the token after each of them
    t_next[0] = x
    n_prev = torch.full((1,), P - 1, device=dev)  # (1,) position of the extend's row 0
    accepted = torch.zeros(1, dtype=torch.long, device=dev)  # (1,) rows 0..accepted are real
    drafts = torch.zeros(K, dtype=torch.long, device=dev)  # (K,) the draft phase's proposals
    n = torch.zeros(1, dtype=torch.long, device=dev)  # (1,) position of the target's latest token
    report = torch.zeros(K + 2, dtype=torch.long, device=dev)  # (K+2,) accepted count, the K+1 choices

    def draft_phase(e: int, k: int, sink: int | None, win: int | None) -> None:
        # the extend of e rows (NOTE [Static extend]), k - 1 recursive drafts, over the key set (sink, win)
        dlogits, g = head(h_next[:, :e], t_next[None, :e], n_prev + rows[:e], dcache, sink, win, impl)  # (1, e, V)
        proposals = [dlogits[0].index_select(0, accepted).argmax(-1)]  # (1,) from row `accepted`
        g = g.index_select(1, accepted)  # (1, 1, d)
        at = n_prev + accepted + 1  # (1,)
        for i in range(1, k):
            dlogits, g = head(g, proposals[-1].view(1, 1), at + (i - 1), dcache, sink, win, impl)
            proposals.append(dlogits[0, -1].argmax().view(1))
        drafts[:k].copy_(torch.cat(proposals))
        n.copy_(at)

    def verify_phase(k: int) -> None:  # the target over [x, d_1 .. d_k], the greedy rule, the next state
        x = t_next.index_select(0, accepted)  # (1,)
        vlogits, vhidden = target(torch.cat([x, drafts[:k]])[None], n + rows[: k + 1], tcache, impl)  # (1, k+1, V)
        choice = vlogits[0].argmax(-1)  # (k+1,)
        a = (drafts[:k] == choice[:k]).long().cumprod(0).sum().view(1)  # (1,) verify_greedy on the device
        report[: k + 2].copy_(torch.cat([a, choice]))
        n_prev.copy_(n)
        accepted.copy_(a)
        h_next[:, : k + 1].copy_(vhidden)
        t_next[: k + 1].copy_(choice)

    clock, head_start, pos, e = Clock(dev), P - 1, P, 1
    phases = Phases(draft_phase, verify_phase, (h_next, t_next, n_prev, accepted), graph, clock)  # NOTE [Static depths]
    while not stop:
        k = next_depth(policy, pos, K)
        keys = gated_key_set(pos + 1, n_sink, window, gate)  # this step's key set: positions 0..pos are committed
        phases.step((e, k, *keys), k)  # captured by (extend rows, depth, key set)
        a, *choice = report.tolist()  # the step's one read of the device
        draft_s, verify_s = clock.spans()
        draft_pos = [*range(head_start, head_start + e), *range(pos, pos + k - 1)]
        stats.draft_keys_read += sum(key_count(t, *keys) for t in draft_pos)
        stats.draft_queries += len(draft_pos)
        stats.add_step(a, draft_s, verify_s, depth=k)
        policy.update(k, a, draft_s, verify_s)
        before = len(out)
        out, stop = _finish(out + choice[: a + 1], max_new_tokens, eos_id)
        stats.committed += len(out) - before
        head_start, pos, e = pos, pos + a + 1, k + 1
    return torch.tensor(out, dtype=torch.long, device=dev), stats
