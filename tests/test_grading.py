"""The course grader (wmtp/grading.py, tutorials/assignments/): it passes every reference solution,
fails the unimplemented templates, and catches each planted bug with a message naming the case.
Also ``wmtp.kvcache.ring_slot`` (its formula, argument checks and no-evicted-read property) and
``wmtp grade`` exit codes."""

from pathlib import Path

import pytest
import torch

from wmtp import decode, grading, grading_process
from wmtp.cli import main
from wmtp.decode import verify_greedy
from wmtp.grading_batch import HARNESS, library_commit
from wmtp.grading_fork import library_fork
from wmtp.grading_paged import library_addresses
from wmtp.keyset import draft_key_indices, sink_query_position
from wmtp.kvcache import ring_slot
from wmtp.policy import best_depth

ASSIGNMENTS = Path(__file__).resolve().parents[1] / "tutorials" / "assignments"
FILES = {"keyset": "01_keyset.py", "ring_slot": "02_ring_slot.py", "greedy_verify": "03_greedy_verify.py",
         "splitk_merge": "04_splitk_merge.py", "reindexed": "05_reindexed_positions.py",
         "rejection": "06_rejection_sampling.py", "paged": "07_paged_keys.py", "depth": "08_draft_depth.py",
         "fork": "09_fork_table.py", "batch": "10_batch_commit.py"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The harness's matrices are 64 wide: one thread is fastest and leaves the other cores alone."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _write(tmp_path, source: str) -> Path:
    path = tmp_path / "student.py"
    path.write_text("import torch\n\n" + source)
    return path


def test_every_assignment_has_a_template_and_a_solution():
    assert set(FILES) == set(grading.ASSIGNMENTS)
    assert sorted(p.name for p in ASSIGNMENTS.glob("[0-9][0-9]_*.py")) == sorted(FILES.values())
    assert sorted(p.name for p in (ASSIGNMENTS / "solutions").glob("[0-9][0-9]_*.py")) == sorted(FILES.values())


@pytest.mark.parametrize("assignment", FILES)
def test_reference_solution_passes(assignment):
    report = grading.grade(assignment, ASSIGNMENTS / "solutions" / FILES[assignment])
    assert report.passed, str(report)
    # rejection: 7 literal cases and 8 distributions of 20000 trials each; the others: 100s of cases
    assert report.first_failure is None and report.n_checks > (10 if assignment == "rejection" else 100)
    assert str(report).startswith(f"PASS {assignment}")


LIBRARY = {  # the library's own definitions, in the students' signatures
    "keyset": lambda t, n_sink, window: draft_key_indices(t, n_sink, window).tolist(),
    "ring_slot": ring_slot,
    "greedy_verify": lambda drafts, choice: verify_greedy(torch.tensor(drafts), torch.tensor(choice)),
    "reindexed": sink_query_position,
    "paged": library_addresses,
    "depth": best_depth,
    "fork": library_fork,
    "batch": library_commit,
}


@pytest.mark.parametrize("assignment", LIBRARY)
def test_literal_cases_agree_with_the_library(assignment):
    """The grader's literal expectations are the library's answers (and its oracles pass their own grader)."""
    report = grading.grade_function(assignment, LIBRARY[assignment])
    assert report.passed, str(report)


@pytest.mark.parametrize("assignment", FILES)
def test_template_fails_as_not_implemented(assignment):
    report = grading.grade(assignment, ASSIGNMENTS / FILES[assignment])
    assert not report.passed and report.n_checks == 1
    assert "not implemented yet" in report.first_failure and "not implemented yet" in str(report)


PLANTED = {
    "off-by-one window": ("keyset", """
def draft_key_indices(t, n_sink, window):
    return [j for j in range(t + 1) if j < n_sink or window is None or j >= t - window]
""", ["draft_key_indices(t=19, n_sink=2, window=6)", "expected [0, 1, 14,", "got [0, 1, 13,", "9 keys"]),
    "sinks counted twice": ("keyset", """
def draft_key_indices(t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    return list(range(min(n_sink, t + 1))) + list(range(start, t + 1))
""", ["draft_key_indices(t=2, n_sink=4, window=6)", "expected [0, 1, 2], got [0, 1, 2, 0, 1, 2]", "appear twice"]),
    "accepting past the first mismatch": ("greedy_verify", """
def accept_count(drafts, target_choice):
    return sum(d == y for d, y in zip(drafts, target_choice))
""", ["accept_count(drafts=[1, 2, 3], target_choice=[0, 2, 3, 0])", "expected 0, got 2", "first mismatch"]),
    "verifier comparing with the wrong target position": ("greedy_verify", """
def accept_count(drafts, target_choice):
    a = 0
    while a < len(drafts) and drafts[a] == target_choice[a + 1]:
        a += 1
    return a
""", ["accept_count(drafts=[1, 2, 3], target_choice=[1, 2, 3, 9])", "expected 3, got 0"]),
    "ring slot that overwrites a sink": ("ring_slot", """
def ring_slot(p, n_sink, window, depth):
    return p % (n_sink + window + depth)
""", ["ring_slot(p=12, n_sink=4, window=6, depth=2)", "expected 4, got 0", "evicts a sink"]),
    "ring without room for the drafts": ("ring_slot", """
def ring_slot(p, n_sink, window, depth):
    return p if p < n_sink else n_sink + (p - n_sink) % window
""", ["ring_slot(p=11, n_sink=4, window=6, depth=2)", "expected 11, got 5"]),
    "merge without the exp(m_i - m) rescale": ("splitk_merge", """
def merge_splits(m, l, acc):
    return acc.sum(0) / l.sum()
""", ["s=[0.5, -1.0, 2.0, 0.0] split into runs of [2, 2] keys", "m=[0.5, 2.0]", "rescale by exp(m_i - max m)"]),
    "merge with NaN on an empty split": ("splitk_merge", """
def merge_splits(m, l, acc):
    w = l * torch.exp(m - m.max())
    return (w[:, None] * (acc / l[:, None])).sum(0) / w.sum()
""", ["split into runs of [0, 2, 1] keys", "m=[-inf, 2.0, -0.7]", "got [nan, nan]", "empty split"]),
    "merge in float32": ("splitk_merge", """
def merge_splits(m, l, acc):
    m, l, acc = m.float(), l.float(), acc.float()
    scale = torch.exp(m - m.max())
    return (scale[:, None] * acc).sum(0) / (scale * l).sum()
""", ["split into runs of [3] keys", "a torch.float32 result: the partials are float64"]),
    "re-indexed query past t before anything is evicted": ("reindexed", """
def sink_query_position(t, n_sink, window):
    return t if window is None or n_sink == 0 else n_sink + window - 1
""", ["sink_query_position(t=7, n_sink=4, window=6)", "expected 7, got 9", "nothing is evicted while t < n_sink"]),
    "re-indexed query one past the key set": ("reindexed", """
def sink_query_position(t, n_sink, window):
    return t if window is None or n_sink == 0 else min(t, n_sink + window)
""", ["sink_query_position(t=19, n_sink=2, window=6)", "expected 7, got 8", "LAST index"]),
    "re-indexing a sliding window without sinks": ("reindexed", """
def sink_query_position(t, n_sink, window):
    return t if window is None else min(t, n_sink + window - 1)
""", ["sink_query_position(t=100, n_sink=0, window=6)", "expected 100, got 5", "nothing is re-indexed"]),
    "rejection that resamples p instead of the residual": ("rejection", """
def verify_one(p, q, draft, u, r):
    if u * q[draft] < p[draft]:
        return draft
    total = 0.0
    for token, mass in enumerate(p):
        total += mass
        if total > r:
            return token
    return len(p) - 1
""", ["drafts from q=[0.333, 0.333, 0.333] verified against p=[0.7, 0.2, 0.1]", "was committed in",
      "the output must be distributed as p"]),
    "rejection that accepts with probability q/p": ("rejection", """
def verify_one(p, q, draft, u, r):
    if u * p[draft] < q[draft]:
        return draft
    residual = [max(a - b, 0.0) for a, b in zip(p, q)]
    total, target = 0.0, r * sum(residual)
    for token, mass in enumerate(residual):
        total += mass
        if total > target:
            return token
    return draft
""", ["verify_one(p=[0.2, 0.8], q=[0.6, 0.4], draft=0, u=0.5, r=0.5)", "expected 1, got 0",
      "a rejected draft is never committed"]),
    "rejection whose inverse CDF takes a token without residual mass": ("rejection", """
def verify_one(p, q, draft, u, r):
    if u * q[draft] < p[draft]:
        return draft
    residual = [max(a - b, 0.0) for a, b in zip(p, q)]
    total, target = 0.0, r * sum(residual)
    for token, mass in enumerate(residual):
        total += mass
        if total >= target:
            return token
    return len(p) - 1
""", ["verify_one(p=[0.0, 0.6, 0.4], q=[0.3, 0.2, 0.5], draft=2, u=0.9, r=0.0)", "expected 1, got 0",
      "token 0 has no residual mass", "EXCEEDS r times the total"]),
    "rejection that samples the residual with random numbers of its own": ("rejection", """
import random

def verify_one(p, q, draft, u, r):
    if u * q[draft] < p[draft]:
        return draft
    residual = [max(a - b, 0.0) for a, b in zip(p, q)]
    return random.choices(range(len(p)), weights=residual)[0]
""", ["called 20 times", "for the same arguments over 20 calls", "no random numbers of your own"]),
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
    "fork that pops its pages off the free list": ("fork", """
def fork_table(block_table, page_size, filled, needed, free, scratch):
    first, last = filled // page_size, -(-needed // page_size)
    mine = [free.pop(0) for _ in range(last - first)]
    copies = [(block_table[first], mine[0])] if filled % page_size else []
    return block_table[:first] + mine + [scratch] * (len(block_table) - last), copies
""", ["changed its argument free from [9, 3, 8] to [8]", "without removing them"]),
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
    "merge that overflows on large scores": ("splitk_merge", """
def merge_splits(m, l, acc):
    return (torch.exp(m)[:, None] * acc).sum(0) / (torch.exp(m) * l).sum()
""", ["s=[900.0, -1800.0, 450.0] split into runs of [1, 2] keys", "got [nan, nan]"]),
}


ACCEPTED = """

def _accepted(d, c):
    a = 0
    while a < len(d) and d[a] == c[a]:
        a += 1
    return a
"""


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bug_is_caught_with_the_failing_case(tmp_path, bug):
    assignment, source, needles = PLANTED[bug]
    report = grading.grade(assignment, _write(tmp_path, source + (ACCEPTED if assignment == "batch" else "")))
    assert not report.passed
    for needle in needles:
        assert needle in report.first_failure, report.first_failure
    assert str(report).startswith(f"FAIL {assignment}")


def test_a_crash_in_the_student_function_names_the_case(tmp_path):
    crash = _write(tmp_path, "def ring_slot(p, n_sink, window, depth):\n    return [][p]\n")
    report = grading.grade("ring_slot", crash)
    assert not report.passed
    assert report.first_failure.startswith("ring_slot(p=0, n_sink=4, window=6, depth=2): raised IndexError")


@pytest.mark.parametrize("body", ["def ring_slot(p, n_sink, window, depth):\n    raise SystemExit(0)\n",
                                  "raise SystemExit(3)\n"])
def test_exiting_is_a_failed_grade_not_a_pass(tmp_path, body):
    """``SystemExit(0)`` from the student's function or module must not end the grader with status 0."""
    report = grading.grade("ring_slot", _write(tmp_path, body))
    assert not report.passed and "SystemExit" in report.first_failure


KEYS = """
def draft_key_indices(t, n_sink, window):
    sinks = range(min(n_sink, t + 1))
    recent = range(0 if window is None else max(n_sink, t - window + 1), t + 1)
    return sorted(set(sinks) | set(recent))
"""


def test_a_correct_file_may_use_dataclasses_and_a_helper_beside_it(tmp_path):
    """The file is a module in sys.modules while it runs (dataclasses need it), its folder on sys.path."""
    (tmp_path / "keyhelper.py").write_text(KEYS)
    path = tmp_path / "student.py"
    path.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n\nimport keyhelper\n\n\n"
                    "@dataclass\nclass Query:\n    t: int\n\n\n"
                    "def draft_key_indices(t, n_sink, window):\n"
                    "    return keyhelper.draft_key_indices(Query(t).t, n_sink, window)\n")
    report = grading.grade("keyset", path)
    assert report.passed, report


@pytest.mark.parametrize("assignment, source", [
    ("depth", """
import numpy as np

def best_depth(alphas, costs):
    expected = 1 + np.cumsum(np.cumprod(alphas[: len(costs)]))
    return np.argmax(expected / np.asarray(costs)) + 1  # a numpy int: an int all the same
"""),
    ("paged", """
import numpy as np

def key_addresses(block_table, page_size, t, n_sink, window):
    start = 0 if window is None else max(0, t - window + 1)
    keys = np.array(sorted(set(range(min(n_sink, t + 1))) | set(range(start, t + 1))), dtype=np.int64)
    return list(zip(np.asarray(block_table)[keys // page_size], keys % page_size))
"""),
])
def test_numpy_integers_are_integers(tmp_path, assignment, source):
    report = grading.grade(assignment, _write(tmp_path, source))
    assert report.passed, report


def _solution(assignment):
    """The instructor's function of ``assignment``, imported in this process."""
    import importlib.util

    path = ASSIGNMENTS / "solutions" / FILES[assignment]
    spec = importlib.util.spec_from_file_location(f"solution_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, grading.ASSIGNMENTS[assignment])


@pytest.mark.parametrize("assignment", ["keyset", "ring_slot", "greedy_verify", "reindexed", "rejection"])
def test_numpy_integers_pass_every_int_grader(assignment):
    """A right answer in numpy ints (np.searchsorted, np.argmax, np.arange) is right: every grader
    that wants an int takes numpy's, as the depth and paged graders always did; a float still fails."""
    import numpy as np

    right = _solution(assignment)
    if assignment == "keyset":
        as_numpy = lambda *args: list(np.asarray(right(*args), dtype=np.int64))  # noqa: E731
        as_float = lambda *args: [float(k) for k in right(*args)]  # noqa: E731
    else:
        as_numpy = lambda *args: np.int64(right(*args))  # noqa: E731
        as_float = lambda *args: float(right(*args))  # noqa: E731
    report = grading.grade_function(assignment, as_numpy)
    assert report.passed, report
    report = grading.grade_function(assignment, as_float)
    assert not report.passed and "expected the" in report.first_failure, report


def test_as_int_takes_integers_only():
    import numpy as np

    from wmtp.grading_checks import as_int, to_int

    assert [as_int(x) for x in (3, np.int64(3), np.int32(-2), torch.tensor(4), torch.tensor(5, dtype=torch.int32))] == \
        [3, 3, -2, 4, 5]
    bad = (True, np.True_, torch.tensor(True), 3.0, np.float64(3), torch.tensor(3.0), torch.tensor([3]), "3", None)
    assert [as_int(x) for x in bad] == [None] * len(bad)
    assert to_int(np.int64(7)) == 7  # the paged, fork and batch graders read their pairs and rows through it
    for x in bad:
        with pytest.raises(TypeError, match="is not an int"):
            to_int(x)


@pytest.mark.parametrize("body, why", [
    ("import os\nos._exit(0)\n", "ended the grading process (exit status 0)"),  # not a silent pass
    ("while True:\n    pass\n", "took longer than 20 s"),
    ("import wmtp.grading_checks as g\ng.N_FUZZ = 0\ng.KEYSET_LITERAL.clear()\n", "of the 310 checks ran"),
])
def test_a_file_that_exits_loops_or_edits_the_grader_fails(tmp_path, body, why):
    report = grading.grade("keyset", _write(tmp_path, KEYS + body), timeout_s=20)
    assert not report.passed and why in report.first_failure, report


def test_what_a_file_prints_is_shown_cut_to_its_first_and_last_lines(tmp_path, capsys, monkeypatch):
    """A print in the graded function runs once a check (310 for the key set): the student sees the
    first SHOWN_LINES lines, a count of the cut ones and the last TAIL_LINES, on stderr, and the grade is
    the function's. A file that prints in an endless loop still times out, its output cut the same way;
    what a file prints before it hangs or hard-exits is shown, even with output buffered (no
    PYTHONUNBUFFERED: a pipe's block buffer would have kept it)."""
    first, last = grading_process.SHOWN_LINES, grading_process.TAIL_LINES
    printing = KEYS.replace("    sinks = ", "    print('called with', t, n_sink, window)\n    sinks = ")
    report = grading.grade("keyset", _write(tmp_path, printing), timeout_s=60)
    err = capsys.readouterr().err.splitlines()
    assert report.passed, report
    assert err[0] == "output while grading student.py:" and len(err) == 1 + first + 1 + last
    assert all(line.startswith("  | called with ") for line in err[1:first + 1] + err[-last:])
    assert err[first + 1] == f"  ({report.n_checks - first - last} more lines)"  # one print a check
    report = grading.grade("keyset", _write(tmp_path, KEYS + "while True:\n    print('x' * 2999)\n"), timeout_s=5)
    err = capsys.readouterr().err.splitlines()
    assert not report.passed and "took longer than 5 s" in report.first_failure
    assert err[1:4] == ["  | " + "x" * 1000] * 2 + ["  | " + "x" * 999]  # a long line shown 1000 bytes at a time
    assert len(err) == 1 + first + 1 + last and err[first + 1].endswith(" more lines)")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    hang, hard_exit = ("while True:\n    pass\n", "took longer than 5 s"), ("import os\nos._exit(3)\n", "exit status 3")
    for body, why in (hang, hard_exit):
        report = grading.grade("keyset", _write(tmp_path, KEYS + "print('loading')\nprint('step 2')\n" + body),
                               timeout_s=5)
        err = capsys.readouterr().err.splitlines()
        assert not report.passed and why in report.first_failure, report
        assert err == ["output while grading student.py:", "  | loading", "  | step 2"]


def test_a_file_that_does_not_import_is_a_failed_grade(tmp_path):
    report = grading.grade("keyset", _write(tmp_path, "def draft_key_indices(t, n_sink, window)\n"))
    assert not report.passed and "could not be imported: SyntaxError" in report.first_failure


def test_a_grader_out_of_date_with_the_decoder_is_not_blamed_on_the_student(monkeypatch):
    monkeypatch.setattr(decode, "speculative_generate", lambda *args, **kwargs: (torch.zeros(0), None))
    with pytest.raises(grading.GraderError, match="never called the student's verifier"):
        grading.grade_function("greedy_verify", _loop)


def test_bad_input_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        grading.grade("keyset", tmp_path / "missing.py")
    with pytest.raises(ValueError, match="is a folder: pass the student's .py file"):
        grading.grade("keyset", tmp_path)
    with pytest.raises(ValueError, match=r"defines no function draft_key_indices\(\)"):
        grading.grade("keyset", _write(tmp_path, "def keys(t, n_sink, window):\n    return []\n"))
    (tmp_path / "notes.txt").write_text("def draft_key_indices(t, n_sink, window):\n    return []\n")
    with pytest.raises(ValueError, match="not a Python file"):
        grading.grade("keyset", tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="unknown assignment 'kv'"):
        grading.grade("kv", ASSIGNMENTS / "solutions" / "01_keyset.py")


def test_ring_simulation_catches_an_evicted_read():
    """A ring with no room for the speculative positions loses window keys (caught by simulation alone)."""
    too_small = lambda p, n_sink, window, depth: p if p < n_sink else n_sink + (p - n_sink) % window  # noqa: E731
    why = grading.ring_no_evicted_read(too_small, 4, 6, 2)
    assert why == "query t=8 reads key 4 from slot 4, but position 10 overwrote it (positions up to 10 written)"
    out_of_range = lambda p, n_sink, window, depth: p  # noqa: E731
    assert "outside the ring's 12 slots" in grading.ring_no_evicted_read(out_of_range, 4, 6, 2)
    for n_sink, window, depth in grading.RING_SIMULATED:
        assert grading.ring_no_evicted_read(ring_slot, n_sink, window, depth) is None


def test_ring_slot_formula_and_arguments():
    assert [ring_slot(p, 2, 3, 1) for p in range(12)] == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 2, 3]
    assert [ring_slot(p, 0, 1, 0) for p in range(4)] == [0, 0, 0, 0]
    for args, name in [((-1, 2, 3, 1), "p"), ((0, -1, 3, 1), "n_sink"), ((0, 2, 0, 1), "window"),
                       ((0, 2, 3, -1), "depth"), ((0, 2, None, 1), "window"), ((True, 2, 3, 1), "p")]:
        with pytest.raises(ValueError, match=name):
            ring_slot(*args)


def test_lossless_harness_catches_over_acceptance():
    accept_all = lambda drafts, target_choice: len(drafts)  # noqa: E731
    why = grading.lossless_harness(accept_all, 1, 4, 16)
    assert why.startswith("output differs from dense greedy from token 2")
    with pytest.raises(ValueError, match="returned 7"):
        grading.lossless_harness(lambda d, c: 7, 1, 4, 16)
    assert grading.lossless_harness(_loop, 2, 0, None) is None


def _loop(drafts, target_choice):
    return decode.verify_greedy_loop(torch.tensor(drafts), torch.tensor(target_choice))


def test_cli_exit_codes(capsys, tmp_path):
    assert main(["grade", "splitk_merge", str(ASSIGNMENTS / "solutions" / "04_splitk_merge.py")]) == 0
    assert "PASS splitk_merge" in capsys.readouterr().out
    bug = _write(tmp_path, "def accept_count(drafts, target_choice):\n    return len(drafts)\n")
    assert main(["grade", "greedy_verify", str(bug)]) == 1
    out = capsys.readouterr().out
    assert "FAIL greedy_verify" in out and "accept_count(drafts=[1, 2, 3], target_choice=[1, 2, 4, 0])" in out
    assert main(["grade", "keyset", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["grade", "kv", str(bug)]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("case", [(4, 6, 10, (17, 24)), (16, 3, 20, (40, 33)), (3, 5, 10, (12, 14))])
def test_two_forks_catch_a_shared_page_and_a_missing_copy(case):
    """Assignment 09's last check on tables the earlier checks would already refuse: it needs no help."""
    from wmtp.grading_fork import _two_forks_case

    def shares(block_table, page_size, filled, needed, free, scratch):  # the page holding `filled` kept shared
        first, last = -(-filled // page_size), min(-(-needed // page_size), len(block_table))
        return block_table[:first] + free[:last - first] + [scratch] * (len(block_table) - last), []

    def no_copy(block_table, page_size, filled, needed, free, scratch):
        table, _ = library_fork(block_table, page_size, filled, needed, free, scratch)
        return table, []

    page_size, filled = case[0], case[2]
    assert "a page of the prompt" in _two_forks_case(shares, *case, 0)
    bad = filled // page_size * page_size  # the copied page's first row, a prompt position
    assert f"reads position {bad} as 0, expected {bad + 1:g} (the prompt's)" in _two_forks_case(no_copy, *case, 0)
    assert _two_forks_case(library_fork, *case, 0) is None


def _rows_alone(drafts, choices, positions, live):
    """Every row committed as if live: a stopped row moves on."""
    return library_commit(drafts, choices, positions, [True] * len(live))


def _lockstep(drafts, choices, positions, live):
    m = min(verify_greedy(torch.tensor(d), torch.tensor(c)) for d, c, on in zip(drafts, choices, live) if on)
    return [(d[:m] + [c[m]], p + m + 1) if on else ([], p) for d, c, p, on in zip(drafts, choices, positions, live)]


@pytest.mark.parametrize("case", HARNESS, ids=[f"K={c[0]},lengths={c[1]}" for c in HARNESS])
def test_batched_loop_catches_a_moving_stopped_row_and_lockstep(case):
    """Assignment 10's last checks on their own: every multi-row batch has a stopped row beside live
    ones, and a row that drafted well must not wait for the others (lockstep's output is still right)."""
    from wmtp.grading_batch import _harness_case

    assert _harness_case(library_commit, *case) is None
    if len(case[1]) > 1:
        assert "has stopped, but it committed [" in _harness_case(_rows_alone, *case)
        assert "whatever the other rows accept" in _harness_case(_lockstep, *case)


def test_batch_grader_passes_copies_and_refuses_bad_answers():
    """A function that empties its arguments after answering fails, as the task says (the grader's
    own batch is untouched: it passed copies); an answer of the wrong length or with a bool position
    is refused with what it should be."""
    def clears(drafts, choices, positions, live):
        rows = library_commit(drafts, choices, positions, live)
        drafts.clear(), choices.clear(), positions.clear(), live.clear()
        return rows

    cleared = grading.grade_function("batch", clears)
    assert "commit_rows changed its argument drafts from [[4, 7, 1], [4, 7, 1], [2, 2, 2]] to []" in \
        cleared.first_failure and "do not change the arguments" in cleared.first_failure
    short = grading.grade_function("batch", lambda d, c, p, on: library_commit(d, c, p, on)[1:])
    assert "expected a list of 3 (tokens, new_position) pairs" in short.first_failure
    assert "2 pairs for a batch of 3 rows" in short.first_failure
    boolean = grading.grade_function("batch", lambda d, c, p, on: [(t, True) for t, _ in library_commit(d, c, p, on)])
    assert "True is not an int" in boolean.first_failure
