"""The public attention ops' argument checks (wmtp/attention/arguments.py) called directly, each
edge on both sides: the shapes, the positions' and pages' host-side range checks and when they run,
what the Triton kernels refuse, and q_sink's match with q."""

from types import SimpleNamespace

import pytest
import torch

from wmtp.attention.arguments import check_pages, check_positions, check_q_sink, check_shapes, triton_refuses


def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


def test_check_shapes_returns_the_group_and_refuses_no_kv_heads_or_no_positions():
    """Hq // Hkv query heads per kv head; a k of no heads (Hq % 0) and a cache of S = 0 are one-line
    ValueErrors; q_pos is (Lq,) or (B, Lq), not (B + 1, Lq)."""
    assert check_shapes(_t(2, 4, 3, 8), _t(2, 2, 5, 8), _t(2, 2, 5, 8), torch.zeros(3, dtype=torch.long)) == 2
    assert check_shapes(_t(2, 4, 3, 8), _t(2, 4, 5, 8), _t(2, 4, 5, 8), torch.zeros(2, 3, dtype=torch.long)) == 1
    with pytest.raises(ValueError, match=r"^q \(1, 2, 1, 4\) does not fit k \(1, 0, 3, 4\) \(batch, head_dim"):
        check_shapes(_t(1, 2, 1, 4), _t(1, 0, 3, 4), _t(1, 0, 3, 4), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^the cache holds no positions \(S = 0\)$"):
        check_shapes(_t(1, 2, 1, 4), _t(1, 1, 0, 4), _t(1, 1, 0, 4), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^q_pos must have shape \(3,\) or \(2, 3\), got \(3, 3\)$"):
        check_shapes(_t(2, 4, 3, 8), _t(2, 2, 5, 8), _t(2, 2, 5, 8), torch.zeros(3, 3, dtype=torch.long))


class _DevicePositions:
    """Positions that say they live on another device (what check_positions reads of them)."""

    def __init__(self, values, device_type):
        self.values, self.device = torch.tensor(values), SimpleNamespace(type=device_type)

    def numel(self):
        return self.values.numel()

    def min(self):
        return self.values.min()

    def max(self):
        return self.values.max()


def test_check_positions_range_and_when_it_runs():
    """Positions lie in [0, S): S - 1 passes, S and -1 do not. The reference checks them wherever they
    are; the Triton path only in host memory (positions on a GPU are never read: no sync)."""
    check_positions("torch", torch.tensor([0, 3]), 4)
    check_positions("torch", torch.tensor(3), 4)
    for impl in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"^query positions must lie in \[0, 4\), got \[1, 4\]$"):
            check_positions(impl, torch.tensor([1, 4]), 4)
        with pytest.raises(ValueError, match=r"^query positions must lie in \[0, 4\), got \[-1, 2\]$"):
            check_positions(impl, torch.tensor([-1, 2]), 4)
        with pytest.raises(ValueError, match=r"got \[4, 4\]$"):
            check_positions(impl, torch.tensor([4]), 4)
    check_positions("triton", _DevicePositions([1, 9], "cuda"), 4)  # not read
    with pytest.raises(ValueError, match=r"^query positions must lie in \[0, 4\), got \[1, 9\]$"):
        check_positions("torch", _DevicePositions([1, 9], "cuda"), 4)
    check_positions("torch", torch.zeros(0, dtype=torch.long), 4)  # no queries, nothing to check


def test_check_pages_reads_only_the_pages_the_queries_reach():
    """Pages of 4 rows: positions up to 5 read a table's first two columns (the third may hold
    anything); with positions per row, each row only its own reach (row 0's up to 1: one column;
    row 1's up to 9: three). Page ids lie in [0, num_pages): num_pages - 1 passes, num_pages and -1
    do not; a table in host memory is checked for the Triton path too."""
    check_pages("torch", torch.tensor([[0, 1, 99]]), torch.arange(6), 2, 4)
    for impl in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"^block_table's pages for positions up to 5 must lie in \[0, 2\), "
                                             r"got \[0, 7\]$"):
            check_pages(impl, torch.tensor([[0, 7, 1]]), torch.arange(6), 2, 4)
        with pytest.raises(ValueError, match=r"got \[0, 2\]$"):
            check_pages(impl, torch.tensor([[0, 2]]), torch.arange(6), 2, 4)
        with pytest.raises(ValueError, match=r"got \[-1, 0\]$"):
            check_pages(impl, torch.tensor([[-1, 0]]), torch.arange(6), 2, 4)
    q_pos = torch.tensor([[0, 1], [4, 9]])
    check_pages("torch", torch.tensor([[0, 9, 9], [1, 0, 1]]), q_pos, 2, 4)
    with pytest.raises(ValueError, match=r"^block_table's pages for positions up to 9 must lie in \[0, 2\), "
                                         r"got \[0, 5\]$"):
        check_pages("torch", torch.tensor([[0, 9, 9], [1, 0, 5]]), q_pos, 2, 4)


def test_triton_refuses_each_thing_the_kernels_cannot_take():
    """Any of q, k, v of another dtype; a strided head dim even where k and v share it; k and v of
    two layouts each with a contiguous head dim; a gradient on v or on q_sink, but not under no_grad;
    a cache of more than 2**30 positions."""
    q, k, v = _t(1, 2, 3, 4), _t(1, 2, 5, 4), _t(1, 2, 5, 4)
    assert triton_refuses(q, k, v, None) is None
    assert triton_refuses(q, k, v.double(), None) == (
        "q, k, v of different dtypes (torch.float32, torch.float32, torch.float64)")
    ks, vs = _t(1, 2, 5, 8)[..., ::2], _t(1, 2, 5, 8)[..., ::2]
    assert triton_refuses(q, ks, vs, None) == (
        "k and v of two layouts or a strided head dim (strides (80, 40, 8, 2), (80, 40, 8, 2))")
    vt = _t(1, 5, 2, 4).transpose(1, 2)
    assert triton_refuses(q, k, vt, None) == (
        "k and v of two layouts or a strided head dim (strides (40, 20, 4, 1), (40, 4, 8, 1))")
    grad = "tensors that require grad (the kernels have no backward)"
    assert triton_refuses(q, k, v.requires_grad_(), None) == grad
    assert triton_refuses(q, _t(1, 2, 5, 4).requires_grad_(), _t(1, 2, 5, 4), None) == grad  # k's alone (session 54)
    sink = _t(1, 2, 3, 4).requires_grad_()
    assert triton_refuses(q, k, _t(1, 2, 5, 4), sink) == grad
    with torch.no_grad():
        assert triton_refuses(q, k, v, sink) is None
    v = _t(1, 2, 5, 4)  # the one above requires grad now
    assert triton_refuses(q, k, v, None, 2**30) is None  # capacity: the cache's key positions
    assert triton_refuses(q, k, v, None, 2**30 + 1) == (
        "a cache of 1073741825 key positions (the kernels' positions are int32: at most 2**30)")


def test_check_q_sink_must_be_a_tensor_matching_q_with_a_window():
    """None passes; a list is refused by name; a window of None has no sinks; shape, dtype and device
    must each match q's."""
    q = _t(1, 2, 3, 4)
    check_q_sink(q, None, None)
    check_q_sink(q, _t(1, 2, 3, 4), 8)
    with pytest.raises(ValueError, match=r"^q_sink must be a torch.Tensor, got list$"):
        check_q_sink(q, [0.0], 8)
    with pytest.raises(ValueError, match=r"^q_sink scores the sink keys of a windowed key set; window=None"):
        check_q_sink(q, _t(1, 2, 3, 4), None)
    for bad, got in ((_t(1, 2, 3, 2), r"\(1, 2, 3, 2\) torch.float32 on cpu"),
                     (_t(1, 2, 3, 4, dtype=torch.float64), r"\(1, 2, 3, 4\) torch.float64 on cpu"),
                     (torch.zeros(1, 2, 3, 4, device="meta"), r"\(1, 2, 3, 4\) torch.float32 on meta")):
        with pytest.raises(ValueError, match=rf"^q_sink must match q: got {got}, q is \(1, 2, 3, 4\) torch.float32 "
                                             r"on cpu$"):
            check_q_sink(q, bad, 8)
