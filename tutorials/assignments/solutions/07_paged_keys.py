"""Reference solution to assignment 07: where the draft's keys live in a paged KV cache.

Serving engines keep the KV cache in fixed-size pages from one shared pool (vLLM's layout): a
sequence's block table lists its pages, so logical position ``p`` is row ``p % page_size`` of
page ``block_table[p // page_size]``, and consecutive logical pages may sit anywhere in the pool.
Windowed-MTP's draft reads only its key set, the first ``n_sink`` keys and the last ``window``
ones (arXiv 2607.21535, Sec. 3), and wmtp's paged Triton kernel reads them in place: it turns
each key of the set into a (page, row) address and never gathers the cache
(``wmtp/attention/paged.py``; ``docs/concepts.md#the-key-set``).

Your task: implement ``key_addresses`` below (plain Python): the (page, row) of every key in the
key set of the draft query at position ``t``, in ascending key position. Think about which keys
the set holds (assignment 01), about which page a logical page maps to, and about pages of one
row (a ring buffer is a paged cache whose pages hold one row each). You need not validate
arguments.

Grade it:

    wmtp grade paged tutorials/assignments/07_paged_keys.py

The grader checks literal addresses, 300 fuzzed cases against the library's
(``wmtp.keyset.draft_key_indices`` through ``wmtp.attention.paged.page_rows``), and then attention
over the keys and values read at your addresses from randomly permuted pages, against
``wmtp.attention.paged.paged_attention_torch``, in float64.
"""

from __future__ import annotations


def key_addresses(block_table: list[int], page_size: int, t: int, n_sink: int,
                  window: int | None) -> list[tuple[int, int]]:
    """Where each key of the draft key set of the query at position ``t`` lives in a paged cache.

    Args:
        block_table: the sequence's pages: logical page ``i`` is page ``block_table[i]`` of the pool.
        page_size: rows per page (>= 1).
        t: absolute query position (>= 0); the key set is ``j <= t and (j < n_sink or j > t - window)``.
        n_sink: sink keys (>= 0).
        window: recent keys including the query's own (>= 1), or ``None`` for the full causal set.

    Returns:
        ``[(page, row), ...]``, one pair per key of the set, by ascending key position.
    """
    start = 0 if window is None else max(0, t - window + 1)  # the window's first key
    keys = sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1)))  # sinks and window, each key once
    # logical page p // page_size is the block table's entry; inside it, row p % page_size
    return [(block_table[p // page_size], p % page_size) for p in keys]
