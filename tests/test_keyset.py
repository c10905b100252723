"""Tests of wmtp/keyset.py, the one definition of the Windowed-MTP draft key set.

The formula (DESIGN.md, arXiv 2607.21535 Sec. 3): a draft query at position ``t`` may read key
``j`` iff ``j <= t and (j < n_sink or j > t - window)``; ``window`` counts the query's own key,
so the set has ``min(t + 1, n_sink + window)`` keys. Expected sets are written out as literal
index lists (STYLE.md lesson 2); only the exhaustive grid test re-derives them, by brute force
in plain Python, to check every derived form (indices, mask, count, ranges) against each other.
"""

import numpy as np
import pytest
import torch

from wmtp.keyset import (
    as_positions,
    draft_key_csr,
    draft_key_indices,
    draft_key_mask,
    key_count,
    key_ranges,
    render_mask,
    sink_query_position,
)

# (t, n_sink, window, expected key positions), one regime per row.
LITERAL_CASES = [
    pytest.param(2, 4, 6, [0, 1, 2], id="t+1<=n_sink"),
    pytest.param(0, 4, 6, [0], id="first-position"),
    pytest.param(7, 4, 6, [0, 1, 2, 3, 4, 5, 6, 7], id="n_sink<t+1<=n_sink+window"),
    pytest.param(19, 2, 6, [0, 1, 14, 15, 16, 17, 18, 19], id="t+1>n_sink+window"),
    pytest.param(9, 4, 6, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], id="t+1==n_sink+window"),
    pytest.param(10, 4, 6, [0, 1, 2, 3, 5, 6, 7, 8, 9, 10], id="t+1==n_sink+window+1"),
    pytest.param(11, 4, 6, [0, 1, 2, 3, 6, 7, 8, 9, 10, 11], id="t+1==n_sink+window+2"),
    pytest.param(9, 0, 4, [6, 7, 8, 9], id="n_sink=0-sliding"),
    pytest.param(2, 0, 4, [0, 1, 2], id="n_sink=0-short"),
    pytest.param(9, None, 3, [7, 8, 9], id="n_sink=None-is-0"),
    pytest.param(9, 3, 1, [0, 1, 2, 9], id="window=1-sinks+self"),
    pytest.param(2, 3, 1, [0, 1, 2], id="window=1-self-is-sink"),
    pytest.param(3, 3, 1, [0, 1, 2, 3], id="window=1-self-after-sinks"),
    pytest.param(5, 0, 1, [5], id="window=1-n_sink=0-self-only"),
    pytest.param(5, 2, None, [0, 1, 2, 3, 4, 5], id="window=None-full-causal"),
    pytest.param(3, None, None, [0, 1, 2, 3], id="both-None"),
    pytest.param(4, 9, 2, [0, 1, 2, 3, 4], id="n_sink>t+1"),
]


@pytest.mark.parametrize("t, n_sink, window, expected", LITERAL_CASES)
def test_draft_key_indices_literal(t, n_sink, window, expected):
    got = draft_key_indices(t, n_sink, window)
    assert got.dtype == torch.long
    assert got.tolist() == expected
    assert key_count(t, n_sink, window) == len(expected)


def _row(kv_len, keys):
    row = torch.zeros(kv_len, dtype=torch.bool)
    row[keys] = True
    return row


def test_draft_key_mask_literal_rows():
    q_pos = torch.tensor([0, 3, 10])
    mask = draft_key_mask(q_pos, 12, n_sink=2, window=3)
    assert mask.shape == (3, 12) and mask.dtype == torch.bool
    assert torch.equal(mask[0], _row(12, [0]))
    assert torch.equal(mask[1], _row(12, [0, 1, 2, 3]))
    assert torch.equal(mask[2], _row(12, [0, 1, 8, 9, 10]))  # column 11 > t stays False


def test_draft_key_mask_full_and_sliding_rows():
    full = draft_key_mask(torch.tensor([1, 4]), 6, n_sink=None, window=None)
    assert torch.equal(full[0], _row(6, [0, 1]))
    assert torch.equal(full[1], _row(6, [0, 1, 2, 3, 4]))
    sliding = draft_key_mask(torch.tensor([5]), 8, n_sink=0, window=2)
    assert torch.equal(sliding[0], _row(8, [4, 5]))


def test_draft_key_mask_accepts_list_and_kv_len_past_queries():
    mask = draft_key_mask([7], 20, n_sink=1, window=2)
    assert mask.shape == (1, 20)
    assert torch.equal(mask[0], _row(20, [0, 6, 7]))


def _brute_force(t, n_sink, window):
    """The formula of DESIGN.md in plain Python: the independent check of the grid test."""
    n_sink = n_sink or 0
    if window is None:
        return [j for j in range(t + 1)]
    return [j for j in range(t + 1) if j < n_sink or j > t - window]


T_MAX = 40


@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 6, 7, 8, None])
@pytest.mark.parametrize("n_sink", [0, 1, 2, 3, 4, 5, 6])
def test_all_forms_agree_on_grid(n_sink, window):
    mask = draft_key_mask(torch.arange(T_MAX), T_MAX, n_sink, window)  # (T_MAX, T_MAX)
    for t in range(T_MAX):
        expected = _brute_force(t, n_sink, window)
        assert draft_key_indices(t, n_sink, window).tolist() == expected, t
        assert mask[t].nonzero().flatten().tolist() == expected, t
        want_count = t + 1 if window is None else min(t + 1, n_sink + window)
        assert key_count(t, n_sink, window) == want_count == len(expected), t

        (s0, s1), (r0, r1) = key_ranges(t, n_sink, window)
        assert s0 == 0 and s0 <= s1 <= r0 <= r1 == t + 1, (t, (s0, s1), (r0, r1))  # disjoint, sink first
        assert list(range(s0, s1)) + list(range(r0, r1)) == expected, t


def test_draft_key_csr_one_sequence():
    indptr, indices = draft_key_csr(torch.tensor([2, 5, 6]), n_sink=1, window=2)
    assert indptr.tolist() == [0, 3, 6, 9]
    assert indices.tolist() == [0, 1, 2, 0, 4, 5, 0, 5, 6]
    assert indptr.dtype == indices.dtype == torch.long
    for same in ([2, 5, 6], (2, 5, 6), [torch.tensor(2), torch.tensor(5), torch.tensor(6)]):  # one sequence too
        assert all(torch.equal(a, b) for a, b in zip(draft_key_csr(same, 1, 2), (indptr, indices)))


def test_draft_key_csr_two_sequences():
    indptr, indices = draft_key_csr([torch.tensor([0, 1]), torch.tensor([4])], n_sink=1, window=2)
    assert indptr.tolist() == [0, 1, 3, 6]
    assert indices.tolist() == [0, 0, 1, 0, 3, 4]


def test_draft_key_csr_no_queries():
    indptr, indices = draft_key_csr([], n_sink=1, window=2)
    assert indptr.tolist() == [0]
    assert indices.tolist() == []


BAD_ARGS = [
    pytest.param(-1, 4, "n_sink", id="negative-n_sink"),
    pytest.param(1.5, 4, "n_sink", id="float-n_sink"),
    pytest.param(True, 4, "n_sink", id="bool-n_sink"),
    pytest.param(2, 0, "window", id="window-0"),
    pytest.param(2, -3, "window", id="negative-window"),
    pytest.param(2, 2.5, "window", id="float-window"),
    pytest.param(2, True, "window", id="bool-window"),
    pytest.param(2**63, 4, "n_sink", id="n_sink-past-int64"),  # the mask's j < n_sink wrapped: 12 of 57 keys
    pytest.param(2, 2**64 - 1, "window", id="window-past-int64"),  # t - window wrapped: 6 keys, not all 57
    pytest.param(2**70, 4, "n_sink", id="n_sink-2**70"),  # torch's OverflowError in the mask
]

KEYSET_CALLS = {
    "indices": lambda n_sink, window: draft_key_indices(5, n_sink, window),
    "mask": lambda n_sink, window: draft_key_mask(torch.arange(6), 6, n_sink, window),
    "csr": lambda n_sink, window: draft_key_csr(torch.arange(6), n_sink, window),
    "ranges": lambda n_sink, window: key_ranges(5, n_sink, window),
    "count": lambda n_sink, window: key_count(5, n_sink, window),
}


@pytest.mark.parametrize("call", KEYSET_CALLS.values(), ids=KEYSET_CALLS.keys())
@pytest.mark.parametrize("n_sink, window, name", BAD_ARGS)
def test_bad_key_set_args_raise(call, n_sink, window, name):
    with pytest.raises(ValueError, match=name):
        call(n_sink, window)


@pytest.mark.parametrize("call, match", [  # TypeErrors, RuntimeErrors and torch's unnamed ValueError before
    (lambda: draft_key_mask("abc", 3, 1, 2), "q_pos must be a tensor .* got str"),
    (lambda: draft_key_mask(None, 3, 1, 2), "q_pos must be a tensor .* got NoneType"),
    (lambda: draft_key_mask([[0, 1], [2]], 3, 1, 2), "q_pos must be a tensor .* got list"),
    (lambda: draft_key_csr([0.0, 1.0], 1, 2), r"q_pos must be \(Lq,\) integer positions .* torch.float32"),
    (lambda: draft_key_csr(5, 1, 2), r"q_pos must be \(Lq,\) integer positions .* torch.int64 \(\)"),
    (lambda: draft_key_csr(None, 1, 2), "q_pos must be a tensor .* got NoneType"),
    (lambda: draft_key_csr([torch.arange(2), "ab"], 1, 2), "q_pos must be a tensor .* got str"),
    (lambda: draft_key_csr(torch.arange(4).view(2, 2), 1, 2), r"q_pos must be \(Lq,\) integer positions"),
    (lambda: draft_key_csr(torch.tensor([True, False]), 1, 2), "torch.bool"),
    # a position beside a sequence: not one sequence [2, 4] (torch would convert both), the position is no (Lq,)
    (lambda: draft_key_csr([torch.tensor(2), torch.tensor([4])], 1, 2), r"integer positions .* torch.int64 \(\)"),
    (lambda: draft_key_csr([2, torch.tensor([4])], 1, 2), r"integer positions .* torch.int64 \(\)"),
])
def test_bad_positions_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_position_forms_that_stay_valid():
    assert draft_key_csr([[0, 1], [0, 1, 2]], 1, 2)[0].tolist() == [0, 1, 3, 4, 6, 9]  # lists of lists
    assert draft_key_csr([], 1, 2)[0].tolist() == [0]  # no queries
    assert torch.equal(draft_key_mask([0, 1, 2], 3, 1, 2), draft_key_mask(torch.arange(3), 3, 1, 2))
    for dtype in (torch.uint16, torch.uint32, torch.uint64):  # NotImplementedError ("min_all") before
        assert torch.equal(draft_key_mask(torch.arange(3).to(dtype), 3, 1, 2), draft_key_mask(torch.arange(3), 3, 1, 2))
    with pytest.raises(ValueError, match="query positions must be >= 0"):  # a uint64 past 2**63
        draft_key_mask(torch.tensor([2**63 + 5], dtype=torch.uint64), 4, 0, 2)


@pytest.mark.parametrize("fn", [draft_key_indices, key_ranges, key_count])
@pytest.mark.parametrize("window", [4, None])
def test_negative_position_raises(fn, window):
    with pytest.raises(ValueError, match="position"):
        fn(-1, 2, window)


def test_render_mask_rows_match_mask():
    text = render_mask(kv_len=8, n_sink=2, window=3)
    lines = text.splitlines()
    assert lines[0].startswith("n_sink=2 window=3")
    rows = [line.split()[-1] for line in lines[1:]]
    assert len(rows) == 8
    assert rows[0] == "#......."
    assert rows[5] == "##.###.."
    assert rows[7] == "##...###"
    mask = draft_key_mask(torch.arange(8), 8, 2, 3)
    for t, row in enumerate(rows):
        assert [c == "#" for c in row] == mask[t].tolist(), t


@pytest.mark.parametrize("call", [
    lambda: draft_key_indices(5.5, 0, None), lambda: draft_key_indices(5.0, 2, None),  # no float is a position
    lambda: draft_key_indices(torch.tensor(5.5), 1, 2), lambda: draft_key_indices(True, 1, 2),
    lambda: draft_key_csr(torch.tensor([3.9]), 0, 2), lambda: draft_key_csr(torch.tensor([], dtype=torch.long), -1, 2),
    lambda: draft_key_mask([3], 2.5, 0, 2), lambda: draft_key_mask([3], -1, 0, 2),
    lambda: draft_key_mask([-1], 4, 0, 2), lambda: draft_key_mask(torch.tensor(3), 4, 0, 2),
    lambda: draft_key_mask([-1, 3], 4, 0, 2),  # a negative one beside another (checking the largest survived)
    lambda: draft_key_mask(torch.tensor([[3]]), 4, 0, 2), lambda: draft_key_mask(torch.tensor([1.5]), 4, 0, 2),
    lambda: draft_key_indices(2**70, 1, 2), lambda: draft_key_mask([3], 2**70, 0, 2),  # torch's OverflowError
    lambda: draft_key_mask(torch.tensor([3 + 0j]), 4, 0, 2), lambda: draft_key_csr(torch.tensor([3 + 1j]), 0, 2),
])
def test_non_positions_are_value_errors(call):
    """Floats were truncated or kept as float 'positions', a negative one gave an empty mask row (a complex one
    would lose its imaginary part)."""
    with pytest.raises(ValueError):
        call()


def test_int64_sized_arguments_are_the_limit():
    """n_sink, window and positions up to 2**62 still give the formula's key set (a larger one is refused)."""
    assert draft_key_indices(19, 2**62, 6).tolist() == list(range(20))  # every key a sink
    assert draft_key_indices(19, 2, 2**62).tolist() == list(range(20))  # every key recent
    assert draft_key_mask([19], 20, 2**62, 2**62).all()
    assert draft_key_indices(2**62, 2, 3).tolist() == [0, 1, 2**62 - 2, 2**62 - 1, 2**62]


def test_integer_tensors_are_positions():
    assert draft_key_indices(torch.tensor(5), 1, 2).tolist() == draft_key_indices(5, 1, 2).tolist() == [0, 4, 5]
    assert draft_key_indices(5, 1, 2).dtype == torch.long


SCALARS = [np.int64, np.int32, lambda x: np.array(x), lambda x: torch.tensor(x, dtype=torch.int32)]


@pytest.mark.parametrize("scalar", SCALARS, ids=["np.int64", "np.int32", "np-0d", "torch-0d"])
def test_integer_scalars_are_ints_for_t_n_sink_and_window_alike(scalar):
    """A NumPy t was taken and a NumPy n_sink or window refused; every integer scalar now reads as its int."""
    assert draft_key_indices(scalar(19), scalar(2), scalar(6)).tolist() == [0, 1, 14, 15, 16, 17, 18, 19]
    assert key_ranges(scalar(19), scalar(2), scalar(6)) == ((0, 2), (14, 20))
    assert key_count(scalar(19), scalar(2), scalar(6)) == 8
    assert torch.equal(draft_key_mask([19], 20, scalar(2), scalar(6)), draft_key_mask([19], 20, 2, 6))
    assert draft_key_csr([scalar(19)], scalar(2), scalar(6))[1].tolist() == [0, 1, 14, 15, 16, 17, 18, 19]


@pytest.mark.parametrize("bad", [torch.tensor([5]), torch.tensor(True), np.bool_(True), np.float64(5.0)],
                         ids=["1-D", "bool-tensor", "np.bool_", "np.float64"])
@pytest.mark.parametrize("arg", ["t", "n_sink", "window"])
def test_non_scalar_or_non_integer_arguments_are_refused_by_name(bad, arg):
    """A one-element 1-D t was read as its element (and a bool tensor t as 0 or 1): no scalar, no position."""
    args = {"t": 5, "n_sink": 1, "window": 2} | {arg: bad}
    with pytest.raises(ValueError, match="query position" if arg == "t" else arg):
        draft_key_indices(**args)


@pytest.mark.parametrize("scalar", SCALARS, ids=["np.int64", "np.int32", "np-0d", "torch-0d"])
def test_ranges_and_the_sink_query_position_of_integer_scalars_are_ints(scalar):
    """What key_ranges and sink_query_position return is made of ints, whatever scalars came in (a 0-d
    tensor window made the recent range start at tensor(14), which still compares equal to 14)."""
    for got, want in ((key_ranges(scalar(19), scalar(2), scalar(6)), ((0, 2), (14, 20))),
                      (key_ranges(scalar(19), None, scalar(6)), ((0, 0), (14, 20))),
                      (sink_query_position(19, scalar(2), scalar(6)), 7),  # an int t gives an int
                      (sink_query_position(3, scalar(2), scalar(6)), 3)):
        assert got == want and repr(got) == repr(want)  # tensor(14) and np.int64(7) repr otherwise


def test_an_empty_list_is_no_queries_in_the_mask_as_in_the_csr():
    """``[]`` was refused as float32 positions (an empty LongTensor was taken): both are a (0, kv_len) mask."""
    mask = draft_key_mask([], 6, 1, 2)
    assert mask.shape == (0, 6) and mask.dtype == torch.bool
    assert torch.equal(mask, draft_key_mask(torch.tensor([], dtype=torch.long), 6, 1, 2))


def test_a_tuple_of_positions_reads_as_the_list():
    """A tuple is a list of positions to the key-set helpers: ``()`` no queries (not float32 positions),
    and its integer scalars read by ``as_int`` (torch refuses a 0-d array inside a sequence)."""
    assert torch.equal(draft_key_mask((), 6, 1, 2), torch.zeros(0, 6, dtype=torch.bool))
    assert torch.equal(draft_key_mask((np.array(19),), 20, 2, 6), draft_key_mask([19], 20, 2, 6))
    assert draft_key_csr((np.array(19), np.int64(3)), 2, 6)[0].tolist() == [0, 8, 12]
    for empty in ([], ()):  # no positions, int64 (torch.as_tensor([]) is float32)
        got = as_positions(empty)
        assert got.dtype == torch.int64 and got.shape == (0,)


def test_a_list_of_float_positions_is_named_as_one_sequence():
    """Each float was taken as a sequence before: 'got torch.float32 ()', as if the list were a 0-d tensor."""
    with pytest.raises(ValueError, match=r"integer positions .* got torch.float32 \(2,\)"):
        draft_key_csr([1.5, 2.0], 1, 2)


@pytest.mark.parametrize("call", [
    lambda: draft_key_indices(5, 2**62 + 1, 3), lambda: draft_key_indices(5, 2, 2**62 + 1),
    lambda: draft_key_indices(2**62 + 1, 2, 3), lambda: key_ranges(2**62 + 1, 0, None),
])
def test_one_past_the_limit_is_refused(call):
    """2**62 is the last value taken (test above): one more, and n_sink + window or t + 1 could pass int64."""
    with pytest.raises(ValueError, match=r"at most 2\*\*62"):
        call()
