"""Positions per row, ``(B, L)``: every sequence of a batch at its own positions, through the caches'
writes, reads and attention, and through the target's and the head's passes. Each row must be what
it is alone, at its ``(L,)`` positions in a cache of one row.

The model passes run in float64 on the CPU with the reference ops: a row of a batched product and
the same row alone may differ in the last bits (wmtp/lockstep.py NOTE [Batch exactness]), so they
are compared to 1e-10; the caches' writes are compared bit for bit.
"""

import pytest
import torch

import wmtp

KINDS = ["contiguous", "paged", "ring"]


@pytest.fixture(scope="module")
def models():
    target, head = wmtp.build_models("tiny", seed=0)
    return target.double(), head.double()


def _cache(model, kind, batch):
    if kind == "ring":
        return model.new_cache(batch, 64, ring=(2, 8, 7))  # 2 sinks + 8 recent keys, 7 spare slots
    return model.new_cache(batch, 64, page_size=4 if kind == "paged" else None)


def _key_set(kind):
    return (2, 8) if kind == "ring" else (None, None)  # the ring holds one key set; the others read all keys


@pytest.mark.parametrize("kind", KINDS)
def test_writes_per_row_are_each_rows_own(models, kind):
    """Keys and values written at ``(B, L)`` positions are read back by attention as each row's own:
    the batch's output equals a cache written row by row through caches of one row."""
    _, head = models
    c = head.block.attn.cfg
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([[9, 10, 11], [3, 4, 5]])  # (2, 3)
    cache, alone = _cache(head, kind, 2), [_cache(head, kind, 1) for _ in range(2)]
    for p in (torch.arange(6), torch.arange(6, 12)):  # a shared prefix at (L,) positions, 6 at a time
        k, v = (torch.randn(2, c.n_kv_heads, 6, c.head_dim, generator=g, dtype=torch.float64) for _ in range(2))
        cache.update(0, p, k, v)
        for b in range(2):
            alone[b].update(0, p, k[b : b + 1], v[b : b + 1])
    k, v = (torch.randn(2, c.n_kv_heads, 3, c.head_dim, generator=g, dtype=torch.float64) for _ in range(2))
    cache.update(0, pos, k, v)  # row 0 after its prefix, row 1 over its positions 3..5
    q = torch.randn(2, c.n_heads, 3, c.head_dim, generator=g, dtype=torch.float64)
    out = cache.attend(0, q, pos, *_key_set(kind), "torch")
    for b in range(2):
        alone[b].update(0, pos[b], k[b : b + 1], v[b : b + 1])
        want = alone[b].attend(0, q[b : b + 1], pos[b], *_key_set(kind), "torch")
        assert torch.equal(out[b : b + 1], want)
        if kind != "ring":
            got_k, got_v = cache.read(0, pos)
            assert torch.equal(got_k[b], k[b]) and torch.equal(got_v[b], v[b])


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_a_target_pass_per_row_is_each_row_alone(models, kind):
    """Two rows decode at their own positions after a shared prefill: row 0 goes on from 24, row 1
    goes back to 20 (its tokens there rewritten, as after a rejected draft) and on; each row's
    logits and hidden states are those of the row alone at its ``(L,)`` positions."""
    target, _ = models
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    steps = [(torch.arange(24, 30), torch.arange(20, 26)), (torch.arange(30, 34), torch.arange(26, 30))]
    cache = target.new_cache(2, 64, page_size=4 if kind == "paged" else None)
    target(ids[:, :24], torch.arange(24), cache)
    batched = []
    for p0, p1 in steps:
        pos = torch.stack([p0, p1])  # (2, L)
        batched.append(target(torch.stack([ids[0, p0], ids[1, p1]]), pos, cache))
    for b in range(2):
        alone = target.new_cache(1, 64, page_size=4 if kind == "paged" else None)
        target(ids[b : b + 1, :24], torch.arange(24), alone)
        for (logits, hidden), step in zip(batched, steps):
            want_logits, want_hidden = target(ids[b : b + 1, step[b]], step[b], alone)
            torch.testing.assert_close(logits[b : b + 1], want_logits, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(hidden[b : b + 1], want_hidden, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("positions", ["absolute", "reindexed"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_head_pass_per_row_is_each_row_alone(models, kind, positions):
    """The head's draft steps at ``(B, 1)`` positions (each row's next draft) over its own draft KV,
    with the windowed key set (re-indexed positions too: the sinks' queries rotated per row)."""
    target, head = models
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 20, target.config.d_model, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 512, (2, 20), generator=g)
    n_sink, window = 2, 8
    cache = _cache(head, kind, 2)
    for p in (torch.arange(0, 7), torch.arange(7, 14)):  # a ring serves at most spare + 1 queries a call
        head(hidden[:, p], ids[:, p], p, cache, n_sink, window, positions=positions)
    pos = torch.tensor([[14], [11]])  # row 0 drafts on, row 1 from an earlier position
    step_hidden, step_ids = torch.stack([hidden[0, 14], hidden[1, 11]])[:, None], torch.stack([ids[0, 14], ids[1, 11]])
    logits, g_out = head(step_hidden, step_ids[:, None], pos, cache, n_sink, window, positions=positions)  # (2, 1, V)
    for b in range(2):
        alone = _cache(head, kind, 1)
        for p in (torch.arange(0, 7), torch.arange(7, 14)):
            head(hidden[b : b + 1, p], ids[b : b + 1, p], p, alone, n_sink, window, positions=positions)
        t = int(pos[b, 0])
        want_logits, want_g = head(hidden[b : b + 1, t : t + 1], ids[b : b + 1, t : t + 1], pos[b], alone, n_sink,
                                   window, positions=positions)
        torch.testing.assert_close(logits[b : b + 1], want_logits, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(g_out[b : b + 1], want_g, rtol=1e-10, atol=1e-10)


def test_positions_per_row_need_a_cache_and_a_row_each(models):
    target, _ = models
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="without a cache"):
        target(ids, torch.arange(3).repeat(2, 1))
    with pytest.raises(ValueError, match=r"\(2, L\)"):
        target(ids, torch.arange(3).repeat(3, 1), target.new_cache(2, 8))


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_reads_refuse_positions_of_another_shape(models, kind):
    target, _ = models
    cache = _cache(target, kind, 2)
    for pos in (torch.zeros(3, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), torch.zeros(2, 2),
                torch.zeros(2, 1, 2, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"read positions must be an integer tensor \(L,\) or \(2, L\)"):
            cache.read(0, pos)
