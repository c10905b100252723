"""Reference solution to assignment 09: many runs from one prompt, sharing its pages (copy on write).

At a million tokens a prompt's KV cache takes gigabytes, and every decoding arm of an experiment
starts from the same prompt (arXiv 2607.21535, Sec. 5). In a paged cache (assignment 07) a run
need not copy it: its block table can list the prompt's pages and add pages of its own for the
positions it writes, as vLLM shares a prompt's blocks among the sequences that continue it
(``wmtp.pagedcache.PagedKVCache.fork``, NOTE [Forks]; ``docs/concepts.md#paged-caches``).

The prompt fills positions ``0 .. filled-1``, which no run writes again; the run writes
``filled .. needed-1``. Logical page ``i`` holds positions ``i * page_size .. (i + 1) * page_size - 1``.

Your task: implement ``fork_table`` below (plain Python), the run's block table and the pages to
copy before it writes:

- the logical pages wholly below ``filled`` stay the prompt's (shared);
- the run owns the logical pages holding positions ``filled .. needed-1``, and the page holding
  ``filled`` whenever ``filled`` is not a page boundary, even if the run writes nothing yet: that
  page also holds prompt positions, so the run copies it into a page of its own first (copy on
  write). It never owns pages past the table's end;
- its pages are the first free pages, in order, one per owned logical page;
- every other entry (past the shared pages and its own) addresses ``scratch``, a page no correct
  run reads.

Return ``(table, copies)``: the table (as long as ``block_table``) and a list of ``(src, dst)``
pages to copy, ``[(prompt's page holding filled, the run's page for it)]`` or ``[]``. Do not change
the arguments: the prompt's ``block_table`` is every fork's, and ``free`` is the caller's (take its
first pages without removing them). You need not validate arguments.

Grade it:

    wmtp grade fork tutorials/assignments/09_fork_table.py

The grader checks literal tables, 300 fuzzed cases against ``wmtp.pagedcache.fork_table``, and then
two runs forked from one prompt in a pool of pages, both alive, each writing through your table:
each must read back the prompt and its own tokens, and the prompt's pages must not change.
"""

from __future__ import annotations


def fork_table(block_table: list[int], page_size: int, filled: int, needed: int, free: list[int],
               scratch: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The block table of a run that continues the prompt in ``block_table``'s pages.

    Args:
        block_table: the prompt's pages: logical page ``i`` is page ``block_table[i]`` of the pool.
        page_size: rows per page (>= 1).
        filled: positions ``0 .. filled-1`` hold the prompt (``0 <= filled <= needed``).
        needed: the run writes positions ``filled .. needed-1`` (``needed <= len(block_table) * page_size``).
        free: free pages of the pool; take the first ones, in order.
        scratch: the page every entry past the run's own pages addresses.

    Returns:
        ``(table, copies)``: the run's block table and ``[(src, dst), ...]`` pages to copy.
    """
    first = filled // page_size  # the logical page holding `filled`
    last = -(-needed // page_size)  # one past the last page it writes (it covers the page holding `filled`)
    mine = free[:last - first]
    table = block_table[:first] + mine + [scratch] * (len(block_table) - last)
    copies = [(block_table[first], mine[0])] if filled % page_size else []
    return table, copies
