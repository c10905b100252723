"""Assignment 09's checks (``wmtp grade fork``): ``fork_table``, the block table of a run that
continues a prompt held in a paged KV cache while sharing its pages (copy on write, as vLLM shares
a prompt's blocks; NOTE [Forks] in wmtp/pagedcache.py). Beyond arXiv 2607.21535, whose runs at one
long context all start from the same prompt (Sec. 5): forked, a run adds its new tokens' pages, not
a copy of the prompt's.

Checked in order (wmtp/grading.py runs them and stops at the first failure): literal tables and
copies for each regime, the library's own ``wmtp.pagedcache.fork_table`` on fuzzed cases, and then
what the table is for: a pool of pages holding a prompt, two forks of it made one after the other
from the free pages, each copying what the student says and writing its positions through the
student's table; every fork must read back the prompt and its own writes, and the prompt's pages
must stay as they were. The function gets copies of its arguments and must leave them unchanged
(the prompt's block table is every fork's).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator

import torch

from .grading_checks import to_int
from .pagedcache import fork_pages, fork_table

__all__ = ["FORK_LITERAL", "fork_checks", "library_fork"]

FORK_LITERAL = [  # (block_table, page_size, filled, needed, free, scratch) -> (table, copies)
    (([5, 2, 7, 0], 4, 6, 10, [9, 3, 8], 1), ([5, 9, 3, 1], [(2, 9)])),  # page 1 copied, page 2 its own
    (([5, 2, 7, 0], 4, 8, 10, [9, 3, 8], 1), ([5, 2, 9, 1], [])),  # `filled` at a page boundary: no copy
    (([5, 2, 7, 0], 4, 6, 16, [9, 3, 8], 1), ([5, 9, 3, 8], [(2, 9)])),  # writes to the table's end
    (([5, 2, 7, 0], 4, 0, 5, [9, 3, 8], 1), ([9, 3, 1, 1], [])),  # nothing filled: nothing shared
    (([5, 2, 7, 0], 4, 16, 16, [9], 1), ([5, 2, 7, 0], [])),  # everything filled, nothing written
    (([5, 2, 7, 0], 4, 6, 6, [9, 3], 1), ([5, 9, 1, 1], [(2, 9)])),  # nothing written yet: still its own copy
    (([5, 2, 7, 0], 4, 8, 8, [9, 3], 1), ([5, 2, 1, 1], [])),  # nothing written, at a boundary: no page of its own
    (([3, 0, 2, 1], 1, 2, 3, [7, 6], 5), ([3, 0, 7, 5], [])),  # pages of one row never need a copy
]


def library_fork(block_table: list[int], page_size: int, filled: int, needed: int, free: list[int],
                 scratch: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The library's answer (``wmtp.pagedcache.fork_table``) for one sequence, free pages from the front."""
    own = fork_pages(filled, needed, page_size)[1]
    table, copies = fork_table(torch.tensor([block_table]), page_size, filled, needed, free[:own], scratch)
    return table[0].tolist(), copies


def _as_ints(got) -> tuple[list[int], list[tuple[int, int]]]:
    table, copies = got
    return [to_int(p) for p in table], [(to_int(a), to_int(b)) for a, b in copies]


def _hint(got: tuple, expected: tuple, block_table: list[int], page_size: int, filled: int, scratch: int) -> str:
    (table, copies), (want, want_copies) = got, expected
    first = filled // page_size
    if filled % page_size and first < len(table) and table[first] == block_table[first]:
        return (" (the page holding `filled` is still the prompt's: the fork's writes there would change the "
                "prompt; take a page of your own and copy it)")
    if want_copies and not copies and first < len(table) and table[first] == scratch:
        return (" (the page holding `filled` is the run's even before it writes there: copy the prompt's page into "
                "the first free page)")
    if table == want and not copies and want_copies:
        return " (the page holding `filled` also holds prompt positions: copy it into the fork's page)"
    if table == want:
        return " (the right table; the copies are (src, dst) pages: the prompt's page, then the fork's)"
    if len(table) != len(want):
        return " (the fork's table has one entry per entry of the prompt's)"
    if table[:first] != want[:first]:
        return " (the pages wholly below `filled` are shared: keep the prompt's entries there)"
    end = next((i for i in range(len(want), 0, -1) if want[i - 1] != scratch), 0)
    if table[:end] == want[:end]:
        return " (every entry past the run's own pages addresses the scratch page)"
    return ""


def _table_case(fn, args: tuple, expected: tuple) -> str | None:
    block_table, page_size, filled, needed, free, scratch = args
    table_in, free_in = list(block_table), list(free)
    answer = fn(table_in, page_size, filled, needed, free_in, scratch)
    for name, before, after, why in (("block_table", block_table, table_in, "the prompt's table is every fork's"),
                                     ("free", free, free_in, "take its first pages without removing them")):
        if after != before:
            return (f"fork_table changed its argument {name} from {before} to {after}: do not change the arguments "
                    f"({why}); build new lists")
    try:
        got = _as_ints(answer)
    except (TypeError, ValueError):
        return f"expected (table, copies): a list of page ints and a list of (src, dst) int pairs, got {answer!r}"
    if got == expected:
        return None
    return f"expected {expected}, got {got}" + _hint(got, expected, block_table, page_size, filled, scratch)


def _two_forks_case(fn, page_size: int, n_pages: int, filled: int, needs: tuple[int, int], seed: int) -> str | None:
    """A prompt in a pool of pages; two forks, each writing through the student's table."""
    rng = random.Random(seed)
    own = [fork_pages(filled, n, page_size)[1] for n in needs]
    order = rng.sample(range(n_pages + sum(own) + 1), n_pages + sum(own) + 1)  # the pool's pages, shuffled
    parent, free, scratch = order[:n_pages], order[n_pages:-1], order[-1]
    pool = torch.zeros(len(order), page_size, dtype=torch.float64)  # (pages, rows): one value a position
    for p in range(filled):
        pool[parent[p // page_size], p % page_size] = p + 1  # the prompt: position p holds p + 1
    prompt_pages = {parent[i] for i in range(-(-filled // page_size))}
    before = pool.clone()
    forks = []
    for f, needed in enumerate(needs):  # one after the other, both alive: the second takes what the first left
        table, copies = _as_ints(fn(list(parent), page_size, filled, needed, list(free), scratch))
        for src, dst in copies:
            if dst in prompt_pages or dst == scratch:
                return f"fork {f + 1} copies into page {dst}, which it does not own"
            pool[dst] = pool[src]
        for p in range(filled, needed):
            if table[p // page_size] in prompt_pages:
                return f"fork {f + 1} writes position {p} into page {table[p // page_size]}, a page of the prompt"
            pool[table[p // page_size], p % page_size] = -(f + 1) * (p + 1)
        allowed = set(parent[:filled // page_size]) | set(free[:own[f]]) | {scratch}
        if not set(table) <= allowed:
            return (f"fork {f + 1} addresses pages {sorted(set(table) - allowed)} that are neither the prompt's shared "
                    f"pages, the first free pages it needs, nor the scratch page")
        forks.append((table, needed, f))
        free = free[own[f]:]
    if not torch.equal(pool[sorted(prompt_pages)], before[sorted(prompt_pages)]):
        return "the prompt's pages changed: a fork wrote into a page it shares"
    for table, needed, f in forks:
        want = [p + 1 for p in range(filled)] + [-(f + 1) * (p + 1) for p in range(filled, needed)]
        got = [pool[table[p // page_size], p % page_size].item() for p in range(needed)]
        if got != want:
            bad = next(p for p in range(needed) if got[p] != want[p])
            return (f"fork {f + 1} reads position {bad} as {got[bad]:g}, expected {want[bad]:g} (the "
                    f"{'prompt' if bad < filled else 'fork'}'s): two forks of a prompt of {filled} positions in "
                    f"pages of {page_size}, alive at once")
    return None


def fork_checks(fn: Callable | None, n_fuzz: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """The checks of ``fork_table`` (the student's function ``fn``), named, in order."""
    rng = random.Random(9)
    fuzz = []
    for _ in range(n_fuzz):
        page_size, n_pages = rng.choice([1, 2, 3, 4, 8, 16]), rng.randrange(1, 9)
        filled = rng.randrange(n_pages * page_size + 1)
        needed = rng.randrange(filled, n_pages * page_size + 1)
        pool = rng.sample(range(4 * n_pages + 4), 2 * n_pages + 2)
        fuzz.append((pool[:n_pages], page_size, filled, needed, pool[n_pages:-1], pool[-1]))
    for args, expected in FORK_LITERAL + [(a, library_fork(*a)) for a in fuzz]:
        table, page_size, filled, needed, free, scratch = args
        yield (f"fork_table(block_table={table}, page_size={page_size}, filled={filled}, needed={needed}, "
               f"free={free}, scratch={scratch})", functools.partial(_table_case, fn, args, expected))
    for i, (page_size, n_pages, filled, needs) in enumerate([(4, 6, 10, (17, 24)), (1, 9, 4, (6, 9)),
                                                             (16, 3, 20, (40, 33)), (3, 5, 9, (9, 14)),
                                                             (4, 4, 0, (5, 16))]):
        yield (f"two forks of a prompt of {filled} positions in pages of {page_size}, writing to {needs[0]} and "
               f"{needs[1]}", functools.partial(_two_forks_case, fn, page_size, n_pages, filled, needs, i))
