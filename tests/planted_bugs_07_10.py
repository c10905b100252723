"""Student files with one planted bug each, for assignments 07 to 10 (paged keys, draft depth, fork
table, batch commit), as in tests/planted_bugs_01_06.py; and ACCEPTED, the helper appended to each
batch file (a row's accept count). Checked by tests/test_grading_verdicts.py."""


PLANTED_07_10 = {
    "paged keys at their logical pages": ("paged", """
def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    keys = sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1)))
    return [(p // page_size, p % page_size) for p in keys]
""", ["key_addresses(block_table=[5, 2, 7, 0], page_size=4, t=13, n_sink=2, window=4)",
      "expected [(5, 0), (5, 1), (7, 2)", "got [(0, 0), (0, 1), (2, 2)", "look p // page_size up in the block table"]),
    "paged keys addressed (row, page)": ("paged", """
def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    keys = sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1)))
    return [(p % page_size, block_table[p // page_size]) for p in keys]
""", ["got [(0, 5), (1, 5)", "(page, row), in that order"]),
    "paged keys with the window one key short": ("paged", """
def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 2)
    keys = sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1)))
    return [(block_table[p // page_size], p % page_size) for p in keys]
""", ["t=13, n_sink=2, window=4)", "6 keys in the key set, 5 addresses"]),
    "paged address with // and % swapped": ("paged", """
def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    keys = sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1)))
    return [(block_table[p % page_size], p // page_size) for p in keys]
""", ["got [(5, 0), (2, 0), (7, 2)", "the logical page is p // page_size, the row p % page_size"]),
    "paged addresses as floats": ("paged", """
def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    keys = sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1)))
    return [(block_table[p // page_size] + 0.9, p % page_size + 0.5) for p in keys]
""", ["key_addresses(block_table=[5, 2, 7, 0], page_size=4, t=13, n_sink=2, window=4)", "pairs of ints"]),
    "depth without the target's own token": ("depth", """
def best_depth(alphas, costs):
    rates = []
    for k in range(1, len(costs) + 1):
        run, total = 1.0, 0.0
        for a in alphas[:k]:
            run *= a
            total += run
        rates.append(total / costs[k - 1])
    return 1 + rates.index(max(rates))
""", ["best_depth(alphas=[0.5, 0.5], costs=[1.0, 1.4])", "expected 1, got 2", "the target's own token"]),
    "depth that adds the alphas": ("depth", """
def best_depth(alphas, costs):
    rates = [(1 + sum(alphas[:k])) / costs[k - 1] for k in range(1, len(costs) + 1)]
    return 1 + rates.index(max(rates))
""", ["best_depth(alphas=[0.0, 0.9], costs=[1.0, 1.1])", "expected 1, got 2", "multiply the alphas"]),
    "depth as an index": ("depth", """
def best_depth(alphas, costs):
    rates, run, total = [], 1.0, 1.0
    for k in range(1, len(costs) + 1):
        run *= alphas[k - 1]
        total += run
        rates.append(total / costs[k - 1])
    return rates.index(max(rates))
""", ["best_depth(alphas=[0.9, 0.9, 0.9], costs=[1.0, 1.0, 1.0])", "expected 3, got 2", "depths count from 1"]),
    "depth that loops over the alphas": ("depth", """
def best_depth(alphas, costs):
    rates, run, total = [], 1.0, 1.0
    for k in range(1, len(alphas) + 1):
        run *= alphas[k - 1]
        total += run
        rates.append(total / costs[k - 1])
    return 1 + rates.index(max(rates))
""", ["best_depth(alphas=[0.9, 0.9, 0.9, 0.9], costs=[1.0, 1.3])", "raised IndexError", "4 alphas but 2 costs",
      "k = 1 .. len(costs)"]),
    "fork sharing the page holding filled": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first = -(-filled // page_size)
    last = min(max(-(-needed // page_size), first), len(block_table))
    mine = free[:last - first]
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), []
""", ["fork_table(block_table=[5, 2, 7, 0], page_size=4, filled=6, needed=10", "expected ([5, 9, 3, 1], [(2, 9)])",
      "still the prompt's"]),
    "fork without the copy": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first = filled // page_size
    last = -(-needed // page_size)
    mine = free[:last - first]
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), []
""", ["filled=6, needed=10", "copy it into the fork's page"]),
    "fork taking free pages from the end": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first = filled // page_size
    last = -(-needed // page_size)
    mine = free[len(free) - (last - first):]
    copies = [(block_table[first], mine[0])] if filled % page_size else []
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), copies
""", ["filled=6, needed=10", "got ([5, 3, 8, 1], [(2, 3)])"]),
    "fork keeping the prompt's pages past its own": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first = filled // page_size
    last = -(-needed // page_size)
    mine = free[:last - first]
    copies = [(block_table[first], mine[0])] if filled % page_size else []
    return block_table[:first] + mine + block_table[last:], copies
""", ["filled=6, needed=10", "got ([5, 9, 3, 0], [(2, 9)])", "addresses the scratch page"]),
    "fork that writes its table into the prompt's": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first, last = filled // page_size, -(-needed // page_size)
    copies = [(block_table[first], free[0])] if filled % page_size else []
    table = block_table
    for i in range(first, len(table)):
        table[i] = free[i - first] if i < last else scratch
    return table, copies
""", ["fork_table(block_table=[5, 2, 7, 0], page_size=4, filled=6, needed=10",
      "changed its argument block_table from [5, 2, 7, 0] to [5, 9, 3, 1]", "the prompt's table is every fork's"]),
    "fork without a page until it writes": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first, last = filled // page_size, -(-needed // page_size)
    if needed == filled:
        return block_table[:first] + [scratch] * (len(block_table) - first), []
    mine = free[:last - first]
    copies = [(block_table[first], mine[0])] if filled % page_size else []
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), copies
""", ["filled=6, needed=6", "got ([5, 1, 1, 1], [])", "the run's even before it writes there"]),
    "fork returning its one copy as a bare pair": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first, last = filled // page_size, -(-needed // page_size)
    copy = (block_table[first], free[0]) if filled % page_size else []
    return block_table[:first] + free[:last - first] + [scratch] * (len(block_table) - last), copy
""", ["filled=6, needed=10", "expected (table, copies)", "got ([5, 9, 3, 1], (2, 9))"]),
    "fork that pops its pages off the free list": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first, last = filled // page_size, -(-needed // page_size)
    mine = [free.pop(0) for _ in range(last - first)]
    copies = [(block_table[first], mine[0])] if filled % page_size else []
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), copies
""", ["changed its argument free from [9, 3, 8] to [8]", "without removing them"]),
    # every literal and two-fork case has pages of 1, 4 or 16 positions, or fills a page of 3 to its boundary:
    # only the fuzzed pages of 3 show the mask (mutation round 12: a fuzz list without them passed this file)
    "fork taking filled's row in its page as a mask, right for pages of a power of two": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first, last = filled // page_size, -(-needed // page_size)
    mine = free[:last - first]
    copies = [(block_table[first], mine[0])] if filled & (page_size - 1) else []
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), copies
""", ["fork_table(block_table=[10, 1, 6, 0], page_size=3, filled=6, needed=8", "expected ([10, 1, 13, 14], [])",
      "got ([10, 1, 13, 14], [(6, 13)])"]),
    "batch that moves the positions it was given": ("batch", """
def commit_rows(drafts, choices, positions, live):
    rows = []
    for b, (d, c, on) in enumerate(zip(drafts, choices, live)):
        if on:
            a = _accepted(d, c)
            positions[b] += a + 1
            rows.append((d[:a] + [c[a]], positions[b]))
        else:
            rows.append(([], positions[b]))
    return rows
""", ["positions=[10, 10, 10]", "changed its argument positions from [10, 10, 10] to [14, 12, 11]"]),
    "batch committing lockstep's least match": ("batch", """
def commit_rows(drafts, choices, positions, live):
    own = [_accepted(d, c) for d, c, on in zip(drafts, choices, live) if on]
    m = min(own, default=0)
    return [(d[:m] + [c[m]], p + m + 1) if on else ([], p) for d, c, p, on in zip(drafts, choices, positions, live)]
""", ["commit_rows(drafts=[[4, 7, 1], [4, 7, 1], [2, 2, 2]]", "got [([4], 11), ([4], 11), ([8], 11)]",
      "each row keeps its own match a_b", "lockstep's rule"]),
    "batch with a stopped row that commits": ("batch", """
def commit_rows(drafts, choices, positions, live):
    return [(d[:_accepted(d, c)] + [c[_accepted(d, c)]], p + _accepted(d, c) + 1)
            for d, c, p in zip(drafts, choices, positions)]
""", ["live=[True, False, True])", "([1, 2, 3, 4], 8)",
      "row 1 has stopped: it commits nothing and stays at position 4"]),
    "batch position one short": ("batch", """
def commit_rows(drafts, choices, positions, live):
    return [(d[:_accepted(d, c)] + [c[_accepted(d, c)]], p + _accepted(d, c)) if on else ([], p)
            for d, c, p, on in zip(drafts, choices, positions, live)]
""", ["got [([4, 7, 1, 9], 13), ([4, 3], 11), ([8], 10)]", "positions[b] + a_b + 1"]),
    "batch committing the target's token after the wrong prefix": ("batch", """
def commit_rows(drafts, choices, positions, live):
    return [(d[:_accepted(d, c)] + [c[min(_accepted(d, c) + 1, len(d))]], p + _accepted(d, c) + 1) if on else ([], p)
            for d, c, p, on in zip(drafts, choices, positions, live)]
""", ["got [([4, 7, 1, 9], 14), ([4, 0], 12), ([2], 11)]", "row 1's last token is the target's choices[1][1] = 3"]),
    "batch without the target's token": ("batch", """
def commit_rows(drafts, choices, positions, live):
    return [(d[:_accepted(d, c)], p + _accepted(d, c) + 1) if on else ([], p)
            for d, c, p, on in zip(drafts, choices, positions, live)]
""", ["got [([4, 7, 1], 14), ([4], 12), ([], 11)]", "also commits the target's token choices[0][3]"]),
    "batch accepting past the first mismatch": ("batch", """
def commit_rows(drafts, choices, positions, live):
    rows = []
    for d, c, p, on in zip(drafts, choices, positions, live):
        a = sum(x == y for x, y in zip(d, c))
        rows.append((d[:a] + [c[a]], p + a + 1) if on else ([], p))
    return rows
""", ["got [([4, 7, 1, 9], 14), ([4, 3], 12), ([2, 2, 2], 13)]", "stops at its first mismatch"]),
    "batch as a dict of rows": ("batch", """
def commit_rows(drafts, choices, positions, live):
    return {b: ([c[0]], p + 1) for b, (c, p) in enumerate(zip(choices, positions))}
""", ["expected a list of 3 (tokens, new_position) pairs, one a row"]),
}


ACCEPTED = """

def _accepted(d, c):
    a = 0
    while a < len(d) and d[a] == c[a]:
        a += 1
    return a
"""
