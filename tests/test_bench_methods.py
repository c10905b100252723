"""The inputs of ``wmtp bench attention``'s methods (wmtp/bench_methods.py) on literal cells: the window's
key ranges when the queries reach into the sinks, the full method's causal mask beside the window's,
the gathered keys, and SDPA without ``enable_gqa`` (torch < 2.5: kv heads repeated) equal to SDPA with
it. tests/test_bench_attention.py runs the sweep."""

import torch

from wmtp import bench_methods as bm
from wmtp.keyset import draft_key_mask


def test_window_keys_never_start_the_recent_range_inside_the_sinks():
    assert bm.window_keys(3, 3, 4, 16) == (3, 3)  # queries 0..2, every key a sink: nothing past them
    assert bm.window_keys(6, 4, 4, 1) == (4, 4)  # queries 2..5 of window 1: query 2 reads sinks only


def test_cell_masks_the_full_set_causally_and_the_window_over_its_gathered_keys():
    k = torch.arange(40.0).reshape(1, 1, 40, 1).expand(1, 2, 40, 2).contiguous()  # key j holds j
    c = bm.Cell(k, k + 100, None, 4, 3, 4, 8, torch.Generator().manual_seed(0))  # queries 37..39
    kept = [0, 1, 2, 3] + list(range(30, 40))  # sinks, then the union of the windows
    assert (c.sink_hi, c.rec_lo) == (4, 30)
    assert [x[0, 0, :, 0].tolist() for x in c.compact()] == [kept, [j + 100.0 for j in kept]]
    assert torch.equal(c.mask(False), draft_key_mask(c.q_pos, 40, None, None))
    assert torch.equal(c.mask(True), draft_key_mask(c.q_pos, 40, 4, 8)[:, kept])
    assert bm.Cell(k, k, None, 4, 1, 4, 8, torch.Generator()).mask(False) is None  # one query reads every key given


def test_sdpa_without_enable_gqa_repeats_each_kv_head_for_its_queries():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 5, 8, generator=g) for h in (6, 2, 2))  # 3 query heads a kv head
    mask = draft_key_mask(torch.arange(5), 5, 1, 2)  # (5, 5)
    want = bm._attend_sdpa(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask, False)
    torch.testing.assert_close(bm._attend_sdpa(q, k, v, mask, False), want)
    torch.testing.assert_close(bm.sdpa(q, k, v, mask, False)(), want)
