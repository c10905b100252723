"""A generation request's checks, shared by every generator (wmtp/decode.py, wmtp/static_decode.py)
and by ``prefill_prompt`` (wmtp/prefill.py): what a caller can get wrong, refused with a
``ValueError`` before anything runs, the cache positions a valid request writes (arXiv
2607.21535, Sec. 3: a verify pass writes ``depth + 1`` positions past the committed ones), and the
draft's options resolved (its cache's ring, its keys' positions).
"""

from __future__ import annotations

import functools
import inspect

import torch

from .keyset import check_key_set_args, check_positions, is_integer_tensor
from .model import TargetLM
from .mtp import MTPHead
from .policy import check_gate

__all__ = ["check_draft", "check_request", "check_spec_request", "check_target", "check_times", "draft_ring",
           "spec_extra", "with_positions"]

DRAFT_CACHES = ("full", "ring")  # the draft's KV: every position, or a ring of its key set (wmtp/ringcache.py)


def check_target(target: TargetLM) -> None:
    """``target`` must be a ``TargetLM`` (a draft head or ``None`` passed in its place is refused)."""
    if not isinstance(target, TargetLM):
        raise ValueError(f"target must be a wmtp.TargetLM, got {type(target).__name__}")


def check_times(**lists) -> None:
    """Timing outputs (``step_times=``, ``prefill_times=``): ``None`` or a list (anything with
    ``append``) that seconds are appended to."""
    for name, value in lists.items():
        if value is not None and not callable(getattr(value, "append", None)):
            raise ValueError(f"{name} must be None or a list (seconds are appended to it), got {type(value).__name__}")


def check_request(target: TargetLM, prompt_ids: torch.Tensor, max_new_tokens: int, extra: int,
                  eos_id: int | None) -> int:
    """A request's checks; returns the cache positions it writes, ``P + max_new_tokens + extra``
    (at least the prompt's ``P``)."""
    check_target(target)
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dim() != 1 or prompt_ids.numel() == 0:
        raise ValueError("prompt_ids must be a non-empty 1-D LongTensor of token ids")
    if not is_integer_tensor(prompt_ids):
        raise ValueError(f"prompt_ids must hold integer token ids, got dtype {prompt_ids.dtype}")
    if prompt_ids.device != target.embed.device:
        raise ValueError(f"prompt_ids is on {prompt_ids.device}, the target on {target.embed.device}; move the "
                         "prompt with .to(device)")
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int)
                               or not 0 <= eos_id < target.config.vocab_size):
        raise ValueError(f"eos_id must be None or a token id in [0, {target.config.vocab_size}), got {eos_id!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    ids = prompt_ids if prompt_ids.is_signed() else prompt_ids.long()  # torch has no min of uint16, 32 or 64
    if int(ids.min()) < 0 or int(ids.max()) >= target.config.vocab_size:  # a uint64 id past 2**63 reads as < 0
        raise ValueError(f"prompt token ids must lie in [0, {target.config.vocab_size})")
    needed = max(prompt_ids.numel(), prompt_ids.numel() + max_new_tokens + extra)  # positions written
    if needed > target.config.max_seq_len:
        raise ValueError(f"prompt of {prompt_ids.numel()} tokens plus {max_new_tokens} new tokens needs "
                         f"{needed} cache positions; the KV cache holds {target.config.max_seq_len}")
    return needed


def check_draft(target: TargetLM, draft: MTPHead) -> None:
    """A draft is an ``MTPHead`` or anything with its call, ``new_cache`` and ``write_cache`` (a wrapper,
    an oracle); one built on another target is refused, since it drafts with that target's embedding and
    output head (a wrapper without ``target`` passes)."""
    missing = [name for name in ("__call__", "new_cache", "write_cache") if not callable(getattr(draft, name, None))]
    if missing:
        raise ValueError(f"a draft needs MTPHead's call, new_cache and write_cache; {type(draft).__name__} has no "
                         f"{', '.join(missing)}")
    built_on = getattr(draft, "target", target)
    if getattr(built_on, "config", target.config) != target.config:
        raise ValueError("the draft head was built for a target of another config; build it on this target")
    if built_on is not target:  # same config, other weights: it would draft with the other target's embedding
        raise ValueError("the draft head was built on another target (MTPHead(target) keeps it); build it on this one")
    w, e = (draft.proj, target.embed) if isinstance(draft, MTPHead) else (None, None)  # a head follows its target
    if w is not None and (w.dtype, w.device) != (e.dtype, e.device):
        raise ValueError(f"the draft head is {w.dtype} on {w.device}, the target {e.dtype} on {e.device}; move both "
                         "with .to()")


def check_spec_request(target: TargetLM, draft: MTPHead, prompt_ids: torch.Tensor, max_new_tokens: int,
                       depth: int, n_sink: int | None, window: int | None, eos_id: int | None,
                       gate: int | None = None) -> int:
    """A speculative request's checks (``gate``: wmtp/policy.py's context gate); returns the cache
    positions it writes."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    check_target(target)
    check_draft(target, draft)
    check_key_set_args(n_sink, window)
    check_gate(gate, window)
    # a step runs while fewer than max_new_tokens are out, so x sits at n <= P + max_new_tokens - 2 and
    # the verify pass writes n .. n + depth: positions up to P + max_new_tokens + depth - 2; with
    # max_new_tokens <= 1 no step runs and only the prefill's P positions are written
    return check_request(target, prompt_ids, max_new_tokens, extra=spec_extra(max_new_tokens, depth), eos_id=eos_id)


def spec_extra(max_new_tokens: int, depth: int) -> int:
    """Positions a speculative run writes past ``P + max_new_tokens`` (``check_spec_request``'s ``extra``)."""
    return depth - 1 if max_new_tokens > 1 else -1


def draft_ring(draft_cache: str, n_sink: int | None, window: int | None, depth: int,
               gate: int | None = None) -> tuple[int, int, int] | None:
    """``draft_cache``'s ring ``(n_sink, window, spare)``, or ``None`` for the full draft KV.

    Raises:
        ValueError: for an unknown ``draft_cache``, or a ring for the native draft (``window=None``)
            or a gated one (its steps below the gate read every key).
    """
    if draft_cache not in DRAFT_CACHES:
        raise ValueError(f"unknown draft_cache {draft_cache!r}; choose one of {', '.join(DRAFT_CACHES)}")
    if draft_cache == "full":
        return None
    if window is None:
        raise ValueError("draft_cache='ring' keeps a window of keys; the native draft (window=None) reads every key")
    if gate is not None:
        raise ValueError(f"draft_cache='ring' keeps a window of keys; a draft gated at {gate} reads every key while "
                         "the context is at most that (use draft_cache='full')")
    return n_sink or 0, window, depth  # a step writes at most depth positions past a query (NOTE [Ring writes])


def with_positions(draft: MTPHead, positions: str) -> MTPHead:
    """``draft`` calling its forward with ``positions`` (``MTPHead.forward``'s argument); ``draft``
    itself for ``"absolute"``, so a draft callable without that argument runs as before.

    Raises:
        ValueError: for an unknown ``positions``, or ``"reindexed"`` with a draft that takes no
            ``positions`` (checked here, before any prefill).
    """
    if check_positions(positions) == "absolute":
        return draft
    params = inspect.signature(draft).parameters.values()
    if not any(p.name == "positions" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        raise ValueError(f"positions={positions!r} needs a draft that takes positions= (MTPHead does); "
                         f"{type(draft).__name__} does not")
    return functools.partial(draft, positions=positions)
