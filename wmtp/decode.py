"""Dense greedy decoding, greedy verification, and (Windowed-)MTP speculative decoding.

One speculative step (arXiv 2607.21535, Sec. 2-3), with the committed tokens at positions
``0 .. n-1`` in the target's KV cache and ``x``, the target's latest token, at position ``n``
(committed, not yet fed to the target):

1. *draft extend*: the head consumes the target hidden states of the positions committed since
   its last step (filling the draft KV with true-chain entries) and guesses ``d_1``;
2. *draft*: ``depth - 1`` recursive head steps guess ``d_2 .. d_K`` (speculative draft KV);
3. *verify*: one target pass over ``[x, d_1 .. d_K]`` at positions ``n .. n+K`` yields the
   target's greedy choices ``y_0 .. y_K``; ``d_i`` is accepted while ``d_i == y_{i-1}``;
4. commit the accepted drafts plus ``y_a`` (the target's own next token).

Only the head's attention key set changes with ``(n_sink, window)`` (and, with a context ``gate``,
from step to step: ``gated_key_set`` in wmtp/policy.py). Every committed token is
the target's greedy argmax given the committed prefix, so the output equals ``greedy_generate``
token for token, whatever the draft proposes (tests/test_lossless.py asserts it). Both caches are
position-indexed: rejected positions are overwritten by the next step, never rolled back
(wmtp/kvcache.py). On a full accept the head consumes its last proposal ``d_K`` in the next
step's extend, like every other accepted token.

NOTE [Exactness]: the proof is exact in real arithmetic. In floating point, a position's logits
from a ``K+1``-token verify pass and from a one-token decode pass can differ in the last bits
(different matrix shapes sum in different orders); a near-tie can then flip an argmax. The
losslessness checks therefore run in float64, where that noise is ~1e-16: on CPU, and on CUDA
with both attention impls (the Triton kernel accumulates fp64 inputs in fp64). Apple MPS has no
float64, and `wmtp reproduce` decodes in float32 off the CPU: there the output is still checked
with ``torch.equal``, and a near-tie that flipped an argmax would fail that check loudly, never
pass silently (none did in the committed CUDA run, metrics/python-stdlib-seed42-cuda-h200.json).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable

import torch

from .attention import resolve_impl
from .checks import check_tensors
from .device import synchronize
from .keyset import is_integer_tensor, key_count
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy, as_policy, gated_key_set, next_depth
from .prefill import Prefill, start
from .request import check_request, check_spec_request, check_times, draft_ring, with_positions
from .stats import SpecStats

VERIFIERS = ("batched", "loop")
Verifier = Callable[[torch.Tensor, torch.Tensor], int]  # (drafts (K,), target choices (K+1,)) -> accepted


def _check_verify(drafts: torch.Tensor, target_choice: torch.Tensor) -> None:
    """Both verifiers' arguments: ``drafts (K,)`` and ``target_choice (K+1,)`` integer tensors on one
    device, else ``ValueError`` (shapes, dtypes and devices only: no sync in the decoding loop)."""
    check_tensors(drafts=drafts, target_choice=target_choice)
    K = drafts.shape[0] if drafts.dim() == 1 else -1
    if (K < 0 or target_choice.shape != (K + 1,) or not is_integer_tensor(drafts)
            or not is_integer_tensor(target_choice) or drafts.device != target_choice.device):
        raise ValueError(f"expected drafts (K,) and target_choice (K+1,) of integer token ids on one device; got "
                         f"{drafts.dtype} {tuple(drafts.shape)} on {drafts.device}, {target_choice.dtype} "
                         f"{tuple(target_choice.shape)} on {target_choice.device}")


def verify_greedy(drafts: torch.Tensor, target_choice: torch.Tensor) -> int:
    """Number of drafts accepted: the longest prefix with ``drafts[i] == target_choice[i]``.

    ``drafts`` is ``(K,)``; ``target_choice`` ``(K+1,)`` is the target's argmax at the verify
    positions, so ``target_choice[a]`` is the token committed after ``a`` accepted drafts.

    Raises:
        ValueError: for arguments of other shapes, a non-integer dtype, or two devices.
    """
    _check_verify(drafts, target_choice)
    return int((drafts == target_choice[: drafts.shape[0]]).long().cumprod(0).sum())


def verify_greedy_loop(drafts: torch.Tensor, target_choice: torch.Tensor) -> int:
    """Token-by-token reference for :func:`verify_greedy`: stop at the first mismatch."""
    _check_verify(drafts, target_choice)
    accepted = 0
    for i in range(drafts.shape[0]):
        if int(drafts[i]) != int(target_choice[i]):
            break
        accepted += 1
    return accepted


def _accepted(a, depth: int) -> int:
    """A verifier's answer as an int in ``[0, depth]`` (a custom verifier may return a 0-d tensor)."""
    try:
        n = operator.index(a)
    except TypeError:
        n = None
    if n is None or isinstance(a, bool) or not 0 <= n <= depth:
        raise ValueError(f"the verifier must return the number of accepted drafts, an int in [0, {depth}]; "
                         f"got {a!r}")
    return n


class GreedyRule:
    """How a loop picks tokens: the target's argmax, everywhere (the paper's greedy decoding).

    The decoding loops below take a rule with three methods, so that sampled decoding
    (wmtp/sampling.py) runs the same loops: ``choose(logits (V,), pos)`` picks the token at
    position ``pos`` from the logits that predict it; ``propose`` does the same for a draft;
    ``verify(drafts (K,), logits (K+1, V), pos)``, with ``logits[i]`` predicting position
    ``pos + i``, returns the number of drafts accepted and the token committed after them.
    """

    def __init__(self, verifier: Verifier = verify_greedy) -> None:
        self.verifier = verifier

    def choose(self, logits: torch.Tensor, pos: int) -> torch.Tensor:
        return logits.argmax()

    propose = choose

    def verify(self, drafts: torch.Tensor, logits: torch.Tensor, pos: int) -> tuple[int, torch.Tensor]:
        choice = logits.argmax(-1)  # (K+1,) the target's greedy token after each prefix
        a = _accepted(self.verifier(drafts, choice), drafts.shape[0])
        return a, choice[a]


def _each_prompt(prompts: list | tuple, run: Callable[[torch.Tensor], object]) -> list:
    """Batched generation over ragged prompts: ``run`` on each 1-D prompt in turn, results in order.

    The sequences run one after another, each exactly as it would alone (``batched_speculative_generate``
    in wmtp/batched.py decodes prompts of different lengths as one batch, a position a row).
    """
    if not prompts:
        raise ValueError("a batch of prompts must hold at least one 1-D LongTensor of token ids")
    return [run(p) for p in prompts]


def _one_prompt(prefill) -> None:
    """A prefill is of one prompt: refuse it with a batch of prompts."""
    if prefill is not None:
        raise ValueError("prefill= is one prompt's; a batch of prompts prefills each prompt itself")


def _finish(out: list[int], max_new_tokens: int, eos_id: int | None) -> tuple[list[int], bool]:
    """Truncate at ``max_new_tokens`` and after the first ``eos_id``; say whether to stop."""
    if eos_id is not None and eos_id in out:
        return out[: out.index(eos_id) + 1][:max_new_tokens], True
    return out[:max_new_tokens], len(out) >= max_new_tokens


@torch.no_grad()
def greedy_generate(target: TargetLM, prompt_ids: torch.Tensor | list[torch.Tensor], max_new_tokens: int,
                    eos_id: int | None = None, impl: str = "auto", step_times: list[float] | None = None,
                    prefill: Prefill | None = None) -> torch.Tensor | list[torch.Tensor]:
    """Dense greedy decoding with a KV cache: the reference output of every speculative run.

    Args:
        target: the target LM.
        prompt_ids: 1-D LongTensor prompt on the target's device, or a list of them (ragged lengths:
            each decoded as alone, ``_each_prompt``; the result is then a list of outputs).
        max_new_tokens: tokens to generate.
        eos_id: stop after this token (included in the output).
        impl: attention implementation (``resolve_impl``).
        step_times: a list to append each one-token decode pass's wall-clock seconds to (prefill excluded).
        prefill: ``prefill_prompt`` of this prompt (wmtp/prefill.py): start from copies of its caches
            (forks of paged ones) instead of prefilling.

    Returns:
        1-D LongTensor of the new tokens (``max_new_tokens`` long, shorter only after ``eos_id``).

    Raises:
        ValueError: for a prompt that is not a non-empty 1-D integer tensor of ids in the vocabulary on
            the target's device, a bad ``max_new_tokens`` or ``eos_id``, more positions than the cache
            holds, an ``impl`` that cannot run, or a ``prefill`` of another prompt or target.
    """
    check_times(step_times=step_times)
    if isinstance(prompt_ids, (list, tuple)):
        _one_prompt(prefill)
        return _each_prompt(prompt_ids, lambda p: greedy_generate(target, p, max_new_tokens, eos_id, impl,
                                                                  step_times))
    return dense_loop(target, prompt_ids, max_new_tokens, eos_id, impl, step_times, prefill, GreedyRule())


def dense_loop(target: TargetLM, prompt_ids: torch.Tensor, max_new_tokens: int, eos_id: int | None, impl: str,
               step_times: list[float] | None, prefill: Prefill | None, rule) -> torch.Tensor:
    """One prompt's dense decoding, each token picked by ``rule.choose`` (``GreedyRule``: greedy_generate)."""
    # the last token is never fed back: positions 0 .. P + max_new_tokens - 2 are written
    needed = check_request(target, prompt_ids, max_new_tokens, extra=-1, eos_id=eos_id)
    prompt_ids = prompt_ids.long()  # any integer dtype (the embedding takes int64 or int32 only)
    impl = resolve_impl(impl, prompt_ids.device, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    cache, _, last, _ = start(target, None, prompt_ids, needed=needed, impl=impl, checked=True, prefill=prefill)
    logits = last.view(1, 1, -1)  # (1, 1, V)
    out: list[int] = []
    n = prompt_ids.numel()  # the position of the next token
    while max_new_tokens:
        out.append(int(rule.choose(logits[0, -1], n)))
        out, stop = _finish(out, max_new_tokens, eos_id)
        if stop:
            break
        last = torch.tensor([[out[-1]]], device=prompt_ids.device)
        synchronize(prompt_ids.device)
        t0 = time.perf_counter()
        logits, _ = target(last, torch.tensor([n], device=prompt_ids.device), cache, impl)
        synchronize(prompt_ids.device)
        if step_times is not None:
            step_times.append(time.perf_counter() - t0)
        n += 1
    return torch.tensor(out, dtype=torch.long, device=prompt_ids.device)


@torch.no_grad()
def speculative_generate(target: TargetLM, draft: MTPHead, prompt_ids: torch.Tensor | list[torch.Tensor],
                         max_new_tokens: int, depth: int | DepthPolicy, n_sink: int | None = None,
                         window: int | None = None, impl: str = "auto", eos_id: int | None = None,
                         verifier: str | Verifier = "batched",
                         prefill: Prefill | None = None, draft_cache: str = "full", positions: str = "absolute",
                         gate: int | None = None
                         ) -> tuple[torch.Tensor, SpecStats] | tuple[list[torch.Tensor], list[SpecStats]]:
    """Greedy speculative decoding with an MTP draft head whose attention reads ``(n_sink, window)``.

    Args:
        target: the target LM; it verifies with its own layers' key sets, untouched by ``(n_sink, window)``.
        draft: the MTP head drafting ``depth`` tokens per step, recursively.
        prompt_ids: 1-D LongTensor prompt, or a list of them (ragged lengths: each runs as alone,
            ``_each_prompt``; the result is then a list of outputs and a list of statistics).
        max_new_tokens: tokens to generate.
        depth: draft tokens per step (K), or a depth policy choosing them step by step
            (wmtp/policy.py: ``AdaptiveDepth``); the output is the same either way.
        n_sink, window: the draft key set (``window=None``: native MTP, full context).
        impl: attention implementation for draft and target.
        eos_id: stop after this token (included in the output).
        verifier: ``"batched"`` (cumprod of matches), ``"loop"`` (token by token), or a function
            with :func:`verify_greedy`'s signature (the course grader plugs a student's in here).
        prefill: ``prefill_prompt`` of this prompt with this target and head: start from copies
            of its caches (any key set: NOTE [Shared draft prefill] in wmtp/prefill.py).
        draft_cache: ``"full"`` (the draft's KV at every position) or ``"ring"``: only the
            ``n_sink + window + depth`` slots its key set can read (wmtp/ringcache.py;
            a windowed draft only). The output is the same either way.
        positions: the draft keys' RoPE positions: ``"absolute"`` (the paper's) or ``"reindexed"``
            (StreamingLLM's, inside the key set: wmtp/keyset.py). Drafts, and so acceptance, may
            differ; the output is the same either way.
        gate: a context gate (``gated_key_set`` in wmtp/policy.py): a step whose context is at most
            ``gate`` tokens drafts with the full causal set, a later one with ``(n_sink, window)``
            (a windowed key set and the full draft cache only). The output is the same either way.

    Returns:
        The new tokens (identical to ``greedy_generate``) and the step statistics.

    Raises:
        ValueError: as ``greedy_generate``, and for a draft that is not an ``MTPHead`` of this target
            (or an object with its calls), a bad ``depth`` or key set, an unknown ``verifier``,
            ``draft_cache`` or ``positions``, a ring or a gate with a key set they cannot take.
    """
    if isinstance(prompt_ids, (list, tuple)):
        _one_prompt(prefill)
        runs = _each_prompt(prompt_ids, lambda p: speculative_generate(
            target, draft, p, max_new_tokens, depth, n_sink, window, impl, eos_id, verifier, draft_cache=draft_cache,
            positions=positions, gate=gate))
        return [out for out, _ in runs], [stats for _, stats in runs]
    if not callable(verifier) and verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {', '.join(VERIFIERS)} or pass a function")
    verify = verifier if callable(verifier) else {"batched": verify_greedy, "loop": verify_greedy_loop}[verifier]
    return speculative_loop(target, draft, prompt_ids, max_new_tokens, depth, n_sink, window, impl, eos_id, prefill,
                            GreedyRule(verify), draft_cache, positions, gate)


def speculative_loop(target: TargetLM, draft: MTPHead, prompt_ids: torch.Tensor, max_new_tokens: int,
                     depth: int | DepthPolicy, n_sink: int | None, window: int | None, impl: str, eos_id: int | None,
                     prefill: Prefill | None, rule, draft_cache: str = "full",
                     positions: str = "absolute", gate: int | None = None) -> tuple[torch.Tensor, SpecStats]:
    """One prompt's speculative decoding (the module docstring's four steps); ``rule`` picks the
    first token, the drafts and what the verify pass accepts (``GreedyRule``: speculative_generate);
    ``depth`` (an int or a policy) how many drafts each step proposes; ``gate`` each step's key set
    (``gated_key_set``)."""
    policy = as_policy(depth)
    depth = policy.max_depth  # the caches hold a step of the most drafts
    needed = check_spec_request(target, draft, prompt_ids, max_new_tokens, depth, n_sink, window, eos_id, gate)
    ring, head = draft_ring(draft_cache, n_sink, window, depth, gate), with_positions(draft, positions)
    prompt_ids = prompt_ids.long()  # any integer dtype (the embedding takes int64 or int32 only)
    impl = resolve_impl(impl, prompt_ids.device, target.embed.dtype, target.config.head_dim,
                        target.config.n_heads // target.config.n_kv_heads)
    dev = prompt_ids.device
    stats = SpecStats(depth=depth)
    # the prefill (wmtp/prefill.py): true-chain draft KV for positions 0..P-2, not part of any step
    tcache, dcache, last_logits, last_hidden = start(target, draft, prompt_ids, needed=needed, impl=impl, checked=True,
                                                     prefill=prefill, ring=ring)
    stats.draft_kv_bytes = getattr(dcache, "nbytes", 0)
    P = prompt_ids.numel()
    x = rule.choose(last_logits, P)  # the target's first new token, at position P
    out, stop = _finish([int(x)], max_new_tokens, eos_id)
    # Positions the head has not consumed yet: their target hidden states and following tokens.
    head_start, h_new, next_tokens = P - 1, last_hidden, x.view(1)
    n = P  # committed positions 0..n-1 are in the target cache; x sits at position n
    while not stop:
        k = next_depth(policy, n, depth)
        sink, win = gated_key_set(n + 1, n_sink, window, gate)  # this step's key set: positions 0..n are committed
        synchronize(dev)
        t0 = time.perf_counter()
        ext_pos = torch.arange(head_start, n, device=dev)
        dlogits, g = head(h_new, next_tokens[None], ext_pos, dcache, sink, win, impl)
        drafts = [rule.propose(dlogits[0, -1], n + 1)]  # d_1 guesses position n + 1
        for i in range(1, k):  # recursive drafting: the head's own hidden state feeds it back
            pos_i = torch.tensor([n - 1 + i], device=dev)
            dlogits, g = head(g[:, -1:], drafts[-1].view(1, 1), pos_i, dcache, sink, win, impl)
            drafts.append(rule.propose(dlogits[0, -1], n + 1 + i))
        d = torch.stack(drafts)  # (K,)
        draft_pos = range(head_start, n - 1 + k)  # the extend's queries, then the recursive ones
        stats.draft_keys_read += sum(key_count(t, sink, win) for t in draft_pos)
        stats.draft_queries += len(draft_pos)
        synchronize(dev)
        t1 = time.perf_counter()
        vlogits, vhidden = target(torch.cat([x.view(1), d])[None], torch.arange(n, n + k + 1, device=dev),
                                  tcache, impl)
        a, x = rule.verify(d, vlogits[0], n + 1)  # vlogits[0, i] predicts position n + 1 + i
        synchronize(dev)
        t2 = time.perf_counter()
        stats.add_step(a, t1 - t0, t2 - t1, depth=k)
        policy.update(k, a, t1 - t0, t2 - t1)
        before = len(out)
        out, stop = _finish(out + d[:a].tolist() + [int(x)], max_new_tokens, eos_id)
        stats.committed += len(out) - before
        # The head's next extend consumes positions n..n+a with the target's own hidden states.
        head_start, h_new, next_tokens = n, vhidden[:, : a + 1], torch.cat([d[:a], x.view(1)])
        n += a + 1
    return torch.tensor(out, dtype=torch.long, device=dev), stats
