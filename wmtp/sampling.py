"""Sampled decoding, and two ways to verify sampled drafts (beyond arXiv 2607.21535, which
verifies greedily, Sec. 2; the window changes the draft only, Sec. 3, so both work with it).

Every random choice is keyed by the token's absolute position. NOTE [Position-keyed noise]: the
token at position ``t`` is ``argmax(log p_t + G(seed, t))``, where ``p_t = softmax(logits / T)``
and ``G(seed, t)`` is a row of Gumbel noise from a ``torch.Generator`` seeded with a hash of
``(seed, stream, t)`` (the Gumbel-max trick: the argmax is a sample of ``p_t``). The noise is
drawn in float64 on the CPU, so it is the same on every device and whatever the batching of the
passes, and two runs that see the same ``p_t`` pick the same token: a run is a function of its
seed, up to the last bits of the logits (a near-tie of two perturbed scores can flip between
devices or dtypes, as an argmax can: decode.py NOTE [Exactness]) and, under ``"rejection"``, of the
depths its steps drafted (a rejection at position ``t`` resamples there with other noise). Each
prompt of a batch runs as alone, with the same seed: the same prompt twice gives the same tokens.

Verification (``speculative_sample``), ``method=``:

- ``"rejection"`` (speculative sampling: Leviathan et al. 2023, Chen et al. 2023): the draft
  samples ``d ~ q`` and the target accepts it with probability ``min(1, p(d) / q(d))``; after a
  rejection it samples from ``max(p - q, 0)``, normalised. Each committed token is distributed
  as ``p`` exactly: equal to ``sample_generate`` in distribution (per token: ``q(x) min(1, p(x) /
  q(x)) + max(p(x) - q(x), 0) = p(x)``), and acceptance per draft is ``sum_x min(p(x), q(x))``,
  the most any verifier of one draft can get.
- ``"gumbel"``: draft and target both pick ``argmax(log prob + G(seed, t))`` with the same noise,
  and verification is greedy on those choices. Every committed token is the target's own
  sampled token, so the output equals ``sample_generate`` with the same seed token for token
  (tests/test_sampling.py asserts ``torch.equal``), as greedy speculation equals greedy
  decoding; acceptance is the chance that the two perturbed argmaxes agree, at most the
  rejection method's.

``temperature=0`` is greedy decoding (``decode.GreedyRule``): no noise is drawn. A temperature
above 0 is at least ``MIN_TEMPERATURE``: far below it ``logits / T`` overflows and sampling would
silently return garbage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .checks import check_seed, check_tensors
from .decode import GreedyRule, _each_prompt, _one_prompt, dense_loop, speculative_loop, verify_greedy
from .keyset import as_position, is_integer_tensor
from .model import TargetLM
from .mtp import MTPHead
from .policy import DepthPolicy
from .prefill import Prefill
from .stats import SpecStats

__all__ = ["METHODS", "MIN_TEMPERATURE", "position_uniforms", "sample_positions", "verify_rejection", "sample_generate",
           "speculative_sample"]

METHODS = ("rejection", "gumbel")
MIN_TEMPERATURE = 1e-4  # the smallest temperature above 0 (logits / T must stay finite)
TOKEN, ACCEPT, RESIDUAL = 0, 1, 2  # noise streams: the token's Gumbel noise, rejection's uniform, its resample
_MASK = (1 << 64) - 1


def _stream_seed(seed: int, stream: int, pos: int) -> int:
    """A 64-bit generator seed for ``(seed, stream, pos)``: splitmix64's finaliser over a mix of the three."""
    z = (seed * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03 + pos * 0xBF58476D1CE4E5B9 + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def position_uniforms(seed: int, stream: int, positions: Sequence[int], n: int) -> torch.Tensor:
    """``(len(positions), n)`` float64 uniforms in ``[0, 1)`` on the CPU, row ``i`` a function of
    ``(seed, stream, positions[i])`` only (NOTE [Position-keyed noise]). On the CPU by name, whatever
    ``torch.set_default_device`` says: Apple MPS has no float64, and a CPU generator draws on the CPU only."""
    rows = [torch.rand(n, generator=torch.Generator().manual_seed(_stream_seed(seed, stream, int(t))),
                       dtype=torch.float64, device="cpu") for t in positions]
    return torch.stack(rows)  # (L, n)


def sample_positions(probs: torch.Tensor, positions: Sequence[int], seed: int, stream: int = TOKEN) -> torch.Tensor:
    """One token a row: ``argmax(log probs + G)``, with ``G`` the Gumbel noise of each row's position.

    ``probs`` ``(L, V)`` need not be normalised (a row's weights, all >= 0, not all 0); row ``i``
    is a sample of ``probs[i] / probs[i].sum()`` at position ``positions[i]``. Returns ``(L,)`` on
    ``probs``' device.
    """
    u = position_uniforms(seed, stream, positions, probs.shape[-1])  # (L, V)
    gumbel = (-torch.log(-torch.log(u))).to(probs.device, probs.dtype)  # (L, V); u = 0 gives -inf: never chosen
    return (torch.log(probs) + gumbel).argmax(-1)  # (L,)


def verify_rejection(drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, pos: int,
                     seed: int) -> tuple[int, torch.Tensor]:
    """Speculative sampling's verification, token by token: the drafts accepted and the next token.

    Args:
        drafts: ``(K,)`` the drafted tokens, ``drafts[i]`` sampled from ``draft_probs[i]``, at
            position ``pos + i``.
        draft_probs: ``(K, V)`` the draft's distributions ``q``.
        target_probs: ``(K+1, V)`` the target's distributions ``p``; row ``i`` is the target's
            next-token distribution after ``i`` accepted drafts, for position ``pos + i``.
        pos: the position of the first draft.
        seed: the run's seed (the uniforms and resamples are keyed by position).

    Returns:
        ``a``, the drafts accepted (each with probability ``min(1, p(d) / q(d))``, until the first
        rejection), and the token at position ``pos + a``: a sample of ``max(p - q, 0)`` after a
        rejection, of ``p`` after ``K`` acceptances.

    Raises:
        ValueError: for arguments of other types, shapes or dtypes, probabilities on two devices, a
            negative ``pos``, a bad ``seed``, or a draft token outside ``[0, V)`` or a probability
            that is negative, infinite or NaN where it is read, or a target row all zero or holding an
            infinity where the next token is sampled from it (checked as read: one scalar a read).
    """
    pos = _check_rejection_args(drafts, draft_probs, target_probs, pos, seed)
    K, V = drafts.shape[0], target_probs.shape[-1]
    u = position_uniforms(seed, ACCEPT, range(pos, pos + K), 1)[:, 0]  # (K,) one uniform a draft
    for i in range(K):
        d = int(drafts[i])
        if not 0 <= d < V:  # a negative id would index from the end: another token's probability, silently
            raise ValueError(f"drafts[{i}] = {d} is not a token id in [0, {V})")
        p, q = float(target_probs[i, d]), float(draft_probs[i, d])
        if not (0 <= p < math.inf and 0 <= q < math.inf):  # an inf p accepted every draft, then sampled token 0
            raise ValueError(f"probabilities must be >= 0 and finite, got target {p} and draft {q} for drafts[{i}] "
                             f"= {d}")
        if float(u[i]) * q < p:  # accept with probability min(1, p / q)
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)  # (V,) where p exceeds q
        if not float(residual.sum()) > 0:  # p == q up to rounding (then a rejection has probability ~0)
            residual = target_probs[i]
        return i, _sample_row(residual[None], i, pos, seed, RESIDUAL)
    return K, _sample_row(target_probs[K:], K, pos, seed, TOKEN)


def _sample_row(weights: torch.Tensor, i: int, pos: int, seed: int, stream: int) -> torch.Tensor:
    """The token at position ``pos + i`` sampled from ``weights`` ``(1, V)``; ``ValueError`` if it has
    no positive weight (target row ``i`` all zero: the sampler's argmax of ``log 0`` would say token 0)
    or an infinite one (the argmax would say the first inf, whatever the rest)."""
    token = sample_positions(weights, [pos + i], seed, stream)[0]  # ()
    w = float(weights[0, token])  # an inf weight, where there is one, is always drawn
    if not w > 0:  # a token of weight > 0 is always drawn where there is one
        raise ValueError(f"target_probs[{i}] has no positive probability to sample the next token from")
    if w == math.inf:
        raise ValueError(f"target_probs[{i}] holds an infinite probability")
    return token


def _check_rejection_args(drafts, draft_probs, target_probs, pos, seed) -> int:
    """``verify_rejection``'s arguments, shapes, dtypes and devices only (no sync); returns ``pos`` as an int."""
    check_tensors(drafts=drafts, draft_probs=draft_probs, target_probs=target_probs)
    K = drafts.shape[0] if drafts.dim() == 1 else 0
    if K < 1 or target_probs.dim() != 2 or draft_probs.shape != (K, target_probs.shape[-1]) or \
            target_probs.shape[0] != K + 1:
        shapes = ", ".join(str(tuple(t.shape)) for t in (drafts, draft_probs, target_probs))
        raise ValueError(f"verify_rejection needs drafts (K,) with K >= 1, draft_probs (K, V) and target_probs "
                         f"(K+1, V); got {shapes}")
    if not is_integer_tensor(drafts) or not (draft_probs.is_floating_point() and target_probs.is_floating_point()):
        raise ValueError(f"verify_rejection needs integer drafts and floating-point probabilities, got "
                         f"{drafts.dtype}, {draft_probs.dtype}, {target_probs.dtype}")
    if draft_probs.device != target_probs.device:
        raise ValueError(f"draft_probs and target_probs must be on one device, got {draft_probs.device}, "
                         f"{target_probs.device}")
    check_seed(seed)
    return as_position(pos, "pos (the first draft's position)")


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / temperature)`` over the last dim; ``(..., V)`` in, ``(..., V)`` out."""
    return F.softmax(logits / temperature, dim=-1)


class GumbelRule:
    """Sampled tokens and greedy verification of them (``method="gumbel"``): every choice at position
    ``t`` is ``argmax(log softmax-probs + G(seed, t))``, the draft's and the target's with the same noise."""

    def __init__(self, temperature: float, seed: int) -> None:
        self.temperature, self.seed = temperature, seed

    def choose(self, logits: torch.Tensor, pos: int) -> torch.Tensor:
        """The sampled token at ``pos`` from ``logits`` ``(V,)``: a 0-d tensor."""
        return sample_positions(_probs(logits, self.temperature)[None], [pos], self.seed)[0]

    propose = choose

    def verify(self, drafts: torch.Tensor, logits: torch.Tensor, pos: int) -> tuple[int, torch.Tensor]:
        """The target's sampled token at ``pos .. pos + K`` from ``logits`` ``(K+1, V)``, then greedy
        verification of ``drafts`` ``(K,)`` against them: the drafts accepted and the next token."""
        choice = sample_positions(_probs(logits, self.temperature), range(pos, pos + logits.shape[0]), self.seed)
        a = verify_greedy(drafts, choice)
        return a, choice[a]


class RejectionRule(GumbelRule):
    """Sampled drafts verified by rejection sampling (``method="rejection"``); it keeps each step's
    draft distributions from ``propose`` until ``verify``."""

    def __init__(self, temperature: float, seed: int) -> None:
        super().__init__(temperature, seed)
        self.draft_probs: list[torch.Tensor] = []

    def propose(self, logits: torch.Tensor, pos: int) -> torch.Tensor:
        """The draft's sample at ``pos`` from its ``logits`` ``(V,)``; its distribution is kept for ``verify``."""
        q = _probs(logits, self.temperature)  # (V,)
        self.draft_probs.append(q)
        return sample_positions(q[None], [pos], self.seed)[0]

    def verify(self, drafts: torch.Tensor, logits: torch.Tensor, pos: int) -> tuple[int, torch.Tensor]:
        """``verify_rejection`` of ``drafts`` ``(K,)`` against the target's ``logits`` ``(K+1, V)``."""
        q, self.draft_probs = torch.stack(self.draft_probs), []  # (K, V)
        return verify_rejection(drafts, q, _probs(logits, self.temperature), pos, self.seed)


def check_sampling(temperature: float, seed: int, method: str = METHODS[0]) -> None:
    """A sampled request's own arguments, refused with a ``ValueError``."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and (temperature == 0 or temperature >= MIN_TEMPERATURE)):
        raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {temperature!r}")
    check_seed(seed)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


@torch.no_grad()
def sample_generate(target: TargetLM, prompt_ids: torch.Tensor | list[torch.Tensor], max_new_tokens: int,
                    temperature: float, seed: int = 0, eos_id: int | None = None, impl: str = "auto",
                    prefill: Prefill | None = None) -> torch.Tensor | list[torch.Tensor]:
    """Dense sampled decoding: the token at position ``t`` is a sample of ``softmax(logits / temperature)``
    drawn with ``seed``'s noise for ``t`` (NOTE [Position-keyed noise]); ``temperature=0`` is
    ``greedy_generate``. The other arguments (``greedy_generate``'s but ``step_times``) and the result are
    ``greedy_generate``'s.

    Raises:
        ValueError: for a ``temperature`` that is not 0 or a finite number ``>= MIN_TEMPERATURE``, a
            ``seed`` that is not an int in ``[0, 2**64)``, and whatever ``greedy_generate`` refuses.
    """
    check_sampling(temperature, seed)
    if isinstance(prompt_ids, (list, tuple)):
        _one_prompt(prefill)
        return _each_prompt(prompt_ids, lambda p: sample_generate(target, p, max_new_tokens, temperature, seed,
                                                                  eos_id, impl))
    rule = GumbelRule(temperature, seed) if temperature else GreedyRule()
    return dense_loop(target, prompt_ids, max_new_tokens, eos_id, impl, None, prefill, rule)


@torch.no_grad()
def speculative_sample(target: TargetLM, draft: MTPHead, prompt_ids: torch.Tensor | list[torch.Tensor],
                       max_new_tokens: int, depth: int | DepthPolicy, n_sink: int | None = None,
                       window: int | None = None, *,
                       temperature: float, seed: int = 0, method: str = "rejection", impl: str = "auto",
                       eos_id: int | None = None, prefill: Prefill | None = None, draft_cache: str = "full",
                       positions: str = "absolute", gate: int | None = None
                       ) -> tuple[torch.Tensor, SpecStats] | tuple[list[torch.Tensor], list[SpecStats]]:
    """Sampled speculative decoding with an MTP draft head whose attention reads ``(n_sink, window)``.

    The arguments not listed below are ``speculative_generate``'s, less ``verifier`` (``method``
    picks the verification here); ``depth`` may be a policy (wmtp/policy.py). Under
    ``"rejection"`` the tokens (never their distribution) depend on the depths the steps drafted, so a
    policy that learns from measured times makes them vary from run to run; under ``"gumbel"`` they
    cannot.

    Args:
        temperature: the sampling temperature of draft and target (``0``: greedy, as
            ``speculative_generate``, whatever ``method``).
        seed: the noise of every position (NOTE [Position-keyed noise]).
        method: ``"rejection"`` (the output is distributed as ``sample_generate``'s) or
            ``"gumbel"`` (the output equals ``sample_generate(..., seed=seed)`` token for token).

    Returns:
        The new tokens and the step statistics (a list of each for a list of prompts).

    Raises:
        ValueError: for a bad ``temperature`` or ``seed`` (as ``sample_generate``), an unknown
            ``method``, and whatever ``speculative_generate`` refuses.
    """
    check_sampling(temperature, seed, method)
    if isinstance(prompt_ids, (list, tuple)):
        _one_prompt(prefill)
        runs = _each_prompt(prompt_ids, lambda p: speculative_sample(
            target, draft, p, max_new_tokens, depth, n_sink, window, temperature=temperature, seed=seed,
            method=method, impl=impl, eos_id=eos_id, draft_cache=draft_cache, positions=positions, gate=gate))
        return [out for out, _ in runs], [stats for _, stats in runs]
    rule = GreedyRule() if not temperature else (RejectionRule if method == "rejection" else GumbelRule)(
        temperature, seed)
    return speculative_loop(target, draft, prompt_ids, max_new_tokens, depth, n_sink, window, impl, eos_id, prefill,
                            rule, draft_cache, positions, gate)
