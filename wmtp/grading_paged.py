"""Assignment 07's checks (``wmtp grade paged``): ``key_addresses``, where each key of a draft
query's key set lives in a paged KV cache (the vLLM layout of wmtp/attention/paged.py: logical
position ``p`` is row ``p % page_size`` of page ``block_table[p // page_size]``; the key set of
arXiv 2607.21535, Sec. 3, read in place, as the paged Triton kernel reads it).

Checked in order (wmtp/grading.py runs them and stops at the first failure): literal addresses
for each regime, the library's own addresses (``wmtp.keyset.draft_key_indices`` through
``wmtp.attention.paged.page_rows``) on fuzzed cases, and then what the addresses are for: attention
over the keys and values gathered from randomly permuted pages at the student's addresses, against
``paged_attention_torch`` on the same pages, in float64.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator

import torch

from .attention.paged import page_rows, paged_attention_torch, paginate
from .grading_checks import to_int
from .keyset import draft_key_indices

__all__ = ["PAGED_LITERAL", "paged_checks"]

PAGED_LITERAL = [  # (block_table, page_size, t, n_sink, window) -> [(page, row), ...]
    (([5, 2, 7, 0], 4, 13, 2, 4), [(5, 0), (5, 1), (7, 2), (7, 3), (0, 0), (0, 1)]),  # sinks; a window over 2 pages
    (([5, 2, 7, 0], 4, 6, 0, 3), [(2, 0), (2, 1), (2, 2)]),  # no sinks: the window alone, inside one page
    (([5, 2, 7, 0], 4, 5, 2, None), [(5, 0), (5, 1), (5, 2), (5, 3), (2, 0), (2, 1)]),  # the full causal set
    (([3, 0, 2, 1], 1, 3, 1, 2), [(3, 0), (2, 0), (1, 0)]),  # pages of one row (the ring's): row 0 always
    (([9], 16, 2, 4, 6), [(9, 0), (9, 1), (9, 2)]),  # t + 1 <= n_sink: every key so far, in the first page
    (([1, 4, 6], 2, 5, 3, 3), [(1, 0), (1, 1), (4, 0), (4, 1), (6, 0), (6, 1)]),  # sinks and window touch
    (([8, 3], 3, 4, 1, 1), [(8, 0), (3, 1)]),  # a window of the query's own key
]
D = 8  # the attention check's head dim


def library_addresses(block_table: list[int], page_size: int, t: int, n_sink: int,
                      window: int | None) -> list[tuple[int, int]]:
    """The library's answer: the key set (wmtp/keyset.py) through the paged address (``page_rows``)."""
    idx = draft_key_indices(t, n_sink, window)  # (n,)
    page, row = page_rows(torch.tensor([block_table], dtype=torch.int32), page_size, idx)  # (1, n), (n,)
    return list(zip(page[0].tolist(), row.tolist()))


def _hint(got: list, expected: list, block_table: list[int], page_size: int, t: int, n_sink: int,
          window: int | None) -> str:
    positions = draft_key_indices(t, n_sink, window).tolist()
    if len(got) != len(expected):
        return f" ({len(expected)} keys in the key set, {len(got)} addresses: check the key set, assignment 01)"
    if got == [(p // page_size, p % page_size) for p in positions]:
        return " (those are logical pages: look p // page_size up in the block table)"
    if got == [(r, p) for p, r in expected]:
        return " (each address is (page, row), in that order)"
    if got == [(block_table[p % page_size] if p % page_size < len(block_table) else None, p // page_size)
               for p in positions]:
        return " (the logical page is p // page_size, the row p % page_size: not the other way round)"
    if sorted(got) == sorted(expected):
        return " (the right addresses in another order: list them by ascending key position)"
    return ""


def _address_case(fn, block_table: list[int], page_size: int, t: int, n_sink: int, window: int | None,
                  expected: list[tuple[int, int]]) -> str | None:
    got = fn(list(block_table), page_size, t, n_sink, window)
    try:
        got = [(to_int(page), to_int(row)) for page, row in got]  # ints, never truncated floats or bools
    except (TypeError, ValueError):
        return f"expected a list of (page, row) pairs of ints, got {got!r}"
    if got == expected:
        return None
    return f"expected {expected}, got {got}" + _hint(got, expected, block_table, page_size, t, n_sink, window)


def _attention_case(fn, page_size: int, t: int, n_sink: int, window: int | None, seed: int) -> str | None:
    """Attention over the keys gathered at ``fn``'s addresses against the paged reference, float64."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 1, 1, t + 1 + page_size, D, generator=g, dtype=torch.float64)  # (B, Hkv, S, D) each
    q = torch.randn(1, 1, 1, D, generator=g, dtype=torch.float64)  # (B, Hq, 1, D)
    k_pages, v_pages, block_table = paginate(k, v, page_size, g)  # (pages, page_size, Hkv, D) each, (1, pages)
    expected = paged_attention_torch(q, k_pages, v_pages, block_table, torch.tensor([t]), n_sink, window)
    addresses = [(to_int(page), to_int(row))
                 for page, row in fn(block_table[0].tolist(), page_size, t, n_sink, window)]
    if not addresses:
        return "no addresses: the key set of a query always holds its own key"
    pages, rows = torch.tensor(addresses).T  # (n,), (n,)
    k_set, v_set = k_pages[pages, rows, 0], v_pages[pages, rows, 0]  # (n, D) each
    got = torch.softmax(q[0, 0] @ k_set.T / math.sqrt(D), -1) @ v_set  # (1, D)
    err = (got - expected[0, 0]).abs().max().item()
    if err <= 1e-10:
        return None
    return (f"attention over the keys read at your addresses is {err:.3g} away from attention over the key set "
            f"(the cache in {block_table.shape[1]} randomly permuted pages of {page_size} rows)")


def paged_checks(fn: Callable | None, n_fuzz: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The checks of ``key_addresses`` (the student's function ``fn``), named, in order."""
    rng = random.Random(7)
    fuzz = []
    for _ in range(n_fuzz):
        page_size, t = rng.choice([1, 2, 3, 4, 8, 16]), rng.randrange(120)
        n_pages = -(-(t + 1) // page_size) + rng.randrange(3)  # a table may hold pages past the query's
        table = rng.sample(range(2 * n_pages + 5), n_pages)  # pages of a shared pool, in no order
        fuzz.append((table, page_size, t, rng.randrange(9), rng.choice([None, *range(1, 40)])))
    cases = PAGED_LITERAL + [(a, library_addresses(*a)) for a in fuzz]
    for (table, page_size, t, n_sink, window), expected in cases:
        yield (f"key_addresses(block_table={table}, page_size={page_size}, t={t}, n_sink={n_sink}, window={window})",
               functools.partial(_address_case, fn, table, page_size, t, n_sink, window, expected))
    for i, (page_size, t, n_sink, window) in enumerate([(4, 40, 4, 8), (1, 30, 2, 5), (16, 70, 8, 20),
                                                        (3, 11, 0, None), (8, 9, 2, 3)]):
        yield (f"attention at t={t} with {n_sink} sinks and a window of {window}, keys and values read from pages "
               f"of {page_size} rows at key_addresses(...)",
               functools.partial(_attention_case, fn, page_size, t, n_sink, window, i))
