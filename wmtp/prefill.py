"""A prompt's prefill, run once and shared by many generations (arXiv 2607.21535, Sec. 5: every
decoding arm at one long context starts from the same prompt).

At a million tokens the prefill is most of a run's time: the target's global layers read every
earlier key for every prompt token. ``prefill_prompt`` runs it once: the target over the prompt
(its KV cache, the last position's logits and hidden state) and, with a ``draft`` head, the head
over the prompt's true chain (its KV cache). Every generator in wmtp/decode.py and
wmtp/static_decode.py takes it as ``prefill=`` and starts from copies of its caches (forks of paged
ones, below), so one ``Prefill`` serves any number of runs, in any order, with any draft key set.

NOTE [Shared draft prefill]: the draft head is ONE block, so the keys and values it writes at a
position are projections of that position's input alone (``x_t`` in wmtp/mtp.py); its attention
output, the only thing the key set changes, and everything after it (MLP, logits) are discarded by
the prefill. So the head's prefill cache is the same for every ``(n_sink, window)``, and every
prefill (``prefill_prompt``, a generator's own, a batch's in wmtp/rows.py and wmtp/lockstep.py)
writes it with ``MTPHead.write_cache``: the projections and the cache write alone, no attention, MLP
or LM head (tests/test_prefill.py checks the caches equal ``forward``'s with every key set). A
custom draft passed as ``draft`` (a wrapper, a grader's oracle) has a ``write_cache`` too, and must
write the cache its calls would, whatever their key set: no prefill can check that.

A ``Prefill`` holds the caches of the weights it was made with: change them in place and prefill
again (a change of dtype or device is refused; a change of values cannot be seen). Each run copies
contiguous caches (no run writes positions the prefill filled, NOTE [No rollback] in
wmtp/kvcache.py, but a copy keeps the ``Prefill`` safe from any run): at a million tokens the copies
double the KV memory. Paged caches (``page_size``) are forked instead: a run shares the prompt's
pages and writes its own tokens' pages from the prefill's free ones (NOTE [Forks] in
wmtp/pagedcache.py), so it adds its new tokens' KV, not a second prompt's.

A run from a ``Prefill`` decodes with caches of the prefill's capacity (``max_len``), which may
choose other kernel launches than a run's own ``needed``-sized caches: its output equals the same
target's greedy output from the same ``Prefill`` (bench decode compares them), and in float64 the
outputs without a prefill too (tests/test_prefill.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .attention import resolve_impl
from .kvcache import KVCache
from .model import TargetLM
from .mtp import MTPHead
from .pagedcache import PagedKVCache
from .request import check_draft, check_request
from .ringcache import ring_kept

__all__ = ["Prefill", "prefill_prompt"]


@dataclass(frozen=True, eq=False)
class Prefill:
    """A prompt run through ``target`` (and ``draft``): the caches runs start from, never written."""

    target: TargetLM
    draft: MTPHead | None
    prompt: torch.Tensor  # (P,) int64
    target_cache: KVCache  # positions 0 .. P-1
    draft_cache: KVCache | None  # positions 0 .. P-2 (the head's true chain): NOTE [Shared draft prefill]
    logits: torch.Tensor  # (V,) the target's logits at position P-1
    hidden: torch.Tensor  # (1, 1, d) the target's hidden state at position P-1

    @property
    def max_len(self) -> int:
        return self.target_cache.max_len


@torch.no_grad()
def prefill_prompt(target: TargetLM, prompt_ids: torch.Tensor, max_len: int | None = None,
                   draft: MTPHead | None = None, impl: str = "auto", page_size: int | None = None) -> Prefill:
    """Run ``prompt_ids`` through ``target`` (and ``draft``) once, into caches of ``max_len`` positions.

    Args:
        target: the target LM.
        prompt_ids: 1-D integer prompt on the models' device.
        max_len: the caches' positions (default: the target's ``max_seq_len``); a run from this
            prefill needs at most this many.
        draft: the MTP head whose cache to fill too (needed by speculative runs).
        impl: attention implementation.
        page_size: keep both caches paged, in pages of this many positions (``PagedKVCache``,
            wmtp/pagedcache.py); every run from this prefill then decodes on forks of them, which
            share the prompt's pages (NOTE [Forks] there). Runs alive at once share the free pages:
            those past the prompt's last page and one spare (the target's cache: ``ceil(max_len /
            page_size) - ceil(len(prompt) / page_size) + 1``); a run whose fork finds too few (another run's
            cache still held) raises ``ValueError``.
            ``None``: contiguous caches.

    Returns:
        A ``Prefill``: the caches, the logits and hidden state at the prompt's last position, which the
        decoders' ``prefill=`` argument starts from (any number of runs; none writes them).

    Raises:
        ValueError: for a prompt that is not a non-empty 1-D integer tensor of ids in the
            vocabulary, a ``max_len`` shorter than the prompt or longer than the target's
            ``max_seq_len``, a ``page_size`` below 1 or above ``max_len``, a head built on another
            target, or a ``draft`` without a head's call, ``new_cache`` and ``write_cache``.
    """
    check_request(target, prompt_ids, 0, extra=0, eos_id=None)
    c = target.config
    max_len = c.max_seq_len if max_len is None else max_len
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not prompt_ids.numel() <= max_len <= c.max_seq_len:
        raise ValueError(f"max_len must be an int from the prompt's {prompt_ids.numel()} tokens to the target's "
                         f"max_seq_len {c.max_seq_len}, got {max_len!r}")
    if draft is not None:
        check_draft(target, draft)
    prompt = prompt_ids.long().clone()  # a copy: the caller may edit theirs in place
    impl = resolve_impl(impl, prompt.device, target.embed.dtype, c.head_dim, c.n_heads // c.n_kv_heads)
    got = _run_prefill(target, draft, prompt, max_len, impl, True, page_size=page_size)
    return Prefill(target, draft, prompt, got.target_cache, got.draft_cache, got.logits.clone(), got.hidden.clone())


class Start(NamedTuple):
    """What a generator starts from: its caches and the target's last prompt position's outputs."""

    target_cache: KVCache
    draft_cache: KVCache | None
    logits: torch.Tensor  # (V,)
    hidden: torch.Tensor  # (1, 1, d)


def _run_prefill(target: TargetLM, draft: MTPHead | None, prompt: torch.Tensor, max_len: int, impl: str, checked: bool,
                 ring: tuple[int, int, int] | None = None, page_size: int | None = None) -> Start:
    """The prefill into new caches of ``max_len`` positions: the target over the prompt, then the head's
    cache write (if a head) over the prompt's true chain, positions 0..P-2 (not part of any decoding
    step; NOTE [Shared draft prefill]). With ``ring=(n_sink, window, spare)`` the head's cache is a
    ring, written only at the positions it keeps (``ring_kept``; a write reads nothing, so one call a
    span: NOTE [Ring writes] in wmtp/ringcache.py); with ``page_size`` both caches are paged."""
    dev, P = prompt.device, prompt.numel()
    tcache = target.new_cache(1, max_len, checked=checked, page_size=page_size)
    last = torch.full((1, 1), P - 1, device=dev)  # NOTE [Logits at] in wmtp/model.py
    logits, hidden = target(prompt[None], torch.arange(P, device=dev), tcache, impl, last)  # (1, 1, V), (1, P, d)
    dcache = None
    if draft is not None:
        layout = {"ring": ring} if ring is not None else {"page_size": page_size} if page_size is not None else {}
        dcache = draft.new_cache(1, max_len, checked=checked, **layout)  # a draft wrapper may take neither
        for span in [range(P - 1)] if ring is None else ring_kept(P - 1, *ring):  # what stays, a call each
            a, b = span.start, span.stop
            if b > a:
                draft.write_cache(hidden[:, a:b], prompt[None, a + 1:b + 1], torch.arange(a, b, device=dev), dcache,
                                  impl)
    return Start(tcache, dcache, logits[0, 0], hidden[:, -1:])


def start(target: TargetLM, draft: MTPHead | None, prompt_ids: torch.Tensor, *, needed: int, impl: str,
          checked: bool, prefill: Prefill | None, ring: tuple[int, int, int] | None = None) -> Start:
    """A generator's caches and first outputs: its own prefill of ``needed`` positions, or copies (forks
    of paged ones) of ``prefill``'s caches (``prompt_ids`` already checked, ``impl`` resolved).
    ``checked``: the caches' range check (off for the static loops: ``KVCache``'s docstring);
    ``ring=(n_sink, window, spare)``: the draft's cache is a ring (wmtp/ringcache.py), filled by its
    own prefill or from ``prefill``'s positions it holds.

    Raises:
        ValueError: for a ``prefill`` of other models (or of these before a dtype or device
            change), another prompt, or too few positions.
    """
    if prefill is None:
        return _run_prefill(target, draft, prompt_ids, needed, impl, checked, ring)
    if not isinstance(prefill, Prefill):
        raise ValueError(f"prefill must be a wmtp.Prefill from prefill_prompt, got {type(prefill).__name__}")
    if draft is not None and prefill.draft is None and prefill.target is target:
        raise ValueError("prefill was made without a draft head; prefill_prompt(target, prompt, max_len, draft)")
    if prefill.target is not target or (draft is not None and prefill.draft is not draft):
        raise ValueError("prefill was made with other models; prefill_prompt with this target and head")
    k = prefill.target_cache.k
    if (k.dtype, k.device) != (target.embed.dtype, target.embed.device):
        raise ValueError(f"prefill's caches are {k.dtype} on {k.device}, the target now {target.embed.dtype} on "
                         f"{target.embed.device}; prefill_prompt again")
    if prefill.prompt.device != prompt_ids.device or not torch.equal(prefill.prompt, prompt_ids):
        raise ValueError("prefill was made for another prompt; pass the prompt it was made from")
    if prefill.max_len < needed:
        raise ValueError(f"this run writes {needed} cache positions; the prefill's caches hold {prefill.max_len} "
                         "(prefill_prompt's max_len)")
    P = prompt_ids.numel()
    if draft is None:
        dcache = None
    elif ring is None:
        dcache = _run_cache(prefill.draft_cache, P - 1, needed, checked)
    else:  # the positions a ring filled through the prompt's true chain would hold
        dcache = draft.new_cache(1, prefill.max_len, checked=checked, ring=ring)
        dcache.fill_from(prefill.draft_cache, P - 1)
    return Start(_run_cache(prefill.target_cache, P, needed, checked), dcache, prefill.logits, prefill.hidden)


def _run_cache(cache: KVCache | PagedKVCache, filled: int, needed: int, checked: bool) -> KVCache | PagedKVCache:
    """A run's cache from a prefill's, which holds positions ``0 .. filled-1``: a paged one's fork
    (its pages shared, NOTE [Forks] in wmtp/pagedcache.py), else a copy."""
    return cache.fork(filled, needed, checked) if isinstance(cache, PagedKVCache) else cache.copy(checked)
