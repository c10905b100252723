"""Student files with one planted bug each, for assignments 01 to 06 (key set, ring slot, greedy
verification, split-K merge, re-indexed positions, rejection sampling): the bug's name maps to the
assignment, the file's source and the phrases the grader's failure must contain. Checked by
tests/test_grading_verdicts.py."""


PLANTED_01_06 = {
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
    "accept count that counts the target's own token": ("greedy_verify", """
def accept_count(drafts, target_choice):
    a = 0
    while a < len(drafts) and drafts[a] == target_choice[a]:
        a += 1
    return a + 1
""", ["accept_count(drafts=[1, 2, 3], target_choice=[1, 2, 3, 9])", "expected 3, got 4",
      "at most the 3 drafts are accepted"]),
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
""", ["ring_slot(p=11, n_sink=4, window=6, depth=2)", "expected 11, got 5", "window + depth slots rotate"]),
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
    "merge that rescales acc but not l": ("splitk_merge", """
def merge_splits(m, l, acc):
    scale = torch.exp(m - m.max())
    return (scale[:, None] * acc).sum(0) / l.sum()
""", ["s=[0.5, -1.0, 2.0, 0.0] split into runs of [2, 2] keys", "acc was rescaled by exp(m_i - max m) but l was not"]),
    "merge without the division": ("splitk_merge", """
def merge_splits(m, l, acc):
    return (torch.exp(m - m.max())[:, None] * acc).sum(0)
""", ["split into runs of [3] keys", "not yet divided by the rescaled l's sum"]),
    "merge as an unweighted mean of the splits": ("splitk_merge", """
def merge_splits(m, l, acc):
    live = l > 0
    return (acc[live] / l[live, None]).mean(0)
""", ["s=[0.5, -1.0, 2.0, 0.0] split into runs of [2, 2] keys", "an unweighted mean", "exp(m_i - max m) * l_i"]),
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
""", ["verify_one(p=[0.1, 0.3, 0.6], q=[0.5, 0.25, 0.25], draft=0, u=0.9, r=0.3)", "expected 2, got 1",
      "sample max(p - q, 0), normalised, not p"]),
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
    "merge that overflows on large scores": ("splitk_merge", """
def merge_splits(m, l, acc):
    return (torch.exp(m)[:, None] * acc).sum(0) / (torch.exp(m) * l).sum()
""", ["s=[900.0, -1800.0, 450.0] split into runs of [1, 2] keys", "got [nan, nan]"]),
}
