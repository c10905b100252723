"""Batches that refill (NOTE [Refill] in wmtp/batched.py): with ``max_batch`` rows for more prompts,
a row whose prompt has stopped takes the next one. Every prompt must still be its dense greedy
decoding alone and, at a fixed depth, draft and accept what ``speculative_generate`` of it alone
does; the batch's steps must follow the refill schedule. float64 on the CPU, reference ops; the
static loop (wmtp/static_batched.py) must give the eager loop's outputs and counters."""

import copy
import os

import pytest
import torch
from decode_harness import HeadProxy, InputOracle, prompts_of, scripted_counts

import wmtp
from wmtp.batched import batched_speculative_generate
from wmtp.rows import prefill_rows
from wmtp.static_batched import static_batched_speculative_generate

LENGTHS = [5, 17, 1, 9, 23, 12, 3]
COUNTERS = ("depth", "batch", "steps", "accepted", "committed", "live_steps", "steps_by_depth", "draft_keys_read")


@pytest.fixture(scope="module")
def models():
    target, head = wmtp.build_models("tiny", seed=0)
    return target.double(), head.double()


def schedule(steps: list[int], rows: int) -> int:
    """The batch's steps when each prompt takes the first row free after its predecessors: a row
    whose prompt stops in a step takes the next prompt for the next step (rows in order)."""
    free = list(steps[:rows])  # the step after which each row's prompt is done
    for s in steps[rows:]:
        b = min(range(rows), key=lambda i: (free[i], i))
        free[b] += s
    return max(free, default=0)


def random_caches(target, head, S: int, seed: int):
    """A target and a head cache of 3 rows and ``S`` positions, filled with noise."""
    g = torch.Generator().manual_seed(seed)
    caches = target.new_cache(3, S), head.new_cache(3, S)
    for c in caches:
        c.k.copy_(torch.randn(c.k.shape, generator=g, dtype=c.k.dtype))
        c.v.copy_(torch.randn(c.v.shape, generator=g, dtype=c.v.dtype))
    return caches


@pytest.mark.parametrize("P", [1, 2, 9])
def test_admit_writes_its_prompt_into_its_row_only(models, P):
    """``admit``: row ``b``'s positions ``0 .. P - 1`` of both caches become the prompt's prefill
    alone (the head's chain ``0 .. P - 2``; its ``P - 1`` is left for the first extend to write);
    every other row, and row ``b`` past ``P - 1``, keep what they held."""
    from wmtp.rows import admit, prefill_rows

    target, head = models
    tcache, dcache = random_caches(target, head, 16, seed=27)
    before = [(c.k.clone(), c.v.clone()) for c in (tcache, dcache)]
    prompt = prompts_of([P], seed=28)[0]
    x, h = admit(target, head, tcache, dcache, 1, prompt, "torch")
    tc, dc, x1, h1, _ = prefill_rows(target, head, [prompt], P, "torch")
    assert torch.equal(x, x1[0]) and torch.equal(h, h1[0])
    for c, alone, (k0, v0), chain in ((tcache, tc, before[0], P), (dcache, dc, before[1], P - 1)):
        for got, want, old in ((c.k, alone.k, k0), (c.v, alone.v, v0)):  # (n_layers, B, Hkv, S, D)
            assert torch.equal(got[:, 1, :, :chain], want[:, 0, :, :chain])
            assert torch.equal(got[:, 1, :, P:], old[:, 1, :, P:])
            assert torch.equal(got[:, [0, 2]], old[:, [0, 2]])


def test_staged_prefills_copy_each_prompt_into_its_row_only(models, monkeypatch):
    """``Admitter`` with ``prefill_batch`` 3: the first admission prefills prompts 0-2 as one batch
    (one prefill for three admissions, then one for the fourth), and each later admission copies its
    prompt's keys and values into its row's positions ``0 .. P - 1`` (the head's ``0 .. P - 2``), as
    a prefill alone would have written them; every other entry keeps what it held."""
    from wmtp import rows

    target, head = models
    tcache, dcache = random_caches(target, head, 24, seed=30)
    prompts = prompts_of([5, 17, 1, 9], seed=31)
    calls = []
    monkeypatch.setattr(rows, "prefill_rows", lambda *a, **k: calls.append(len(a[2])) or prefill_rows(*a, **k))
    admitter = rows.Admitter(target, head, tcache, dcache, "torch", prompts, 3)
    for b, i in ((2, 0), (0, 1), (2, 2), (1, 3)):
        before = [(c.k.clone(), c.v.clone()) for c in (tcache, dcache)]
        x, h = admitter(b, i)
        assert (admitter.stage is None) == (i in (2, 3))  # a used-up stage's caches go with it (mutation round 6)
        P = prompts[i].numel()
        tc, dc, x1, h1, _ = prefill_rows(target, head, [prompts[i]], P, "torch")
        assert torch.allclose(x, x1[0]) and torch.allclose(h, h1[0], rtol=0, atol=1e-12)
        for c, alone, (k0, v0), chain in ((tcache, tc, before[0], P), (dcache, dc, before[1], P - 1)):
            for got, want, old in ((c.k, alone.k, k0), (c.v, alone.v, v0)):  # (n_layers, B, Hkv, S, D)
                assert torch.allclose(got[:, b, :, :chain], want[:, 0, :, :chain], rtol=0, atol=1e-12)
                assert torch.equal(got[:, b, :, chain:], old[:, b, :, chain:])
                others = [r for r in range(3) if r != b]
                assert torch.equal(got[:, others], old[:, others])
    assert calls == [3, 1]


@pytest.mark.parametrize("bad", [-1, 3, True, 1.0])
def test_a_row_outside_the_cache_is_a_value_error(models, bad):
    with pytest.raises(ValueError, match="row must be an int"):
        models[0].new_cache(3, 16).row(bad)


@pytest.mark.parametrize("generate", [batched_speculative_generate, static_batched_speculative_generate])
@pytest.mark.parametrize("max_batch, prefill_batch", [(1, 1), (1, 3), (None, 1)])
def test_each_prompts_times_follow_the_schedule(models, generate, max_batch, prefill_batch):
    """``first_token_s`` and ``done_s``: one row, prompts one after another (each first token a
    prefill after the one before is done); every prompt a row, one prefill, then each done after
    its own live steps of the batch's."""
    target, head = models
    prompts = prompts_of(LENGTHS, seed=22)
    eos = int(wmtp.greedy_generate(target, prompts[2], 12, impl="torch")[3])  # some prompts stop early
    _, st = generate(target, head, prompts, 12, 3, 2, 8, impl="torch", eos_id=eos, max_batch=max_batch,
                     prefill_batch=prefill_batch)
    steps = [d + v for d, v in zip(st.draft_times_s, st.verify_times_s)]
    assert st.elapsed_s == pytest.approx(sum(st.prefill_times_s) + sum(steps), rel=1e-12)
    assert max(st.done_s) == st.elapsed_s and all(t > 0 for t in st.prefill_times_s + steps)
    if max_batch == 1:
        assert len(st.prefill_times_s) == len(prompts) and sum(st.live_steps) == st.steps
        start = 0
        for i in range(len(prompts)):
            before = st.done_s[i - 1] if i else 0.0
            assert st.first_token_s[i] == before + st.prefill_times_s[i]
            mine = steps[start: start + st.live_steps[i]]
            assert st.done_s[i] == pytest.approx(st.first_token_s[i] + sum(mine), rel=1e-12)
            start += st.live_steps[i]
    else:
        assert len(st.prefill_times_s) == 1 and st.first_token_s == [st.prefill_times_s[0]] * len(prompts)
        assert len(set(st.live_steps)) > 1  # the prompts stop at different steps
        for i, n in enumerate(st.live_steps):
            assert st.done_s[i] == pytest.approx(st.prefill_times_s[0] + sum(steps[:n]), rel=1e-12)


class Recorder(HeadProxy):
    """The real head, logging every column it is called on: (position, token fed, hidden state, logits)."""

    def __init__(self, head):
        self.head, self.log = head, []

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, g = self.head(hidden, next_ids, pos, cache, n_sink, window, impl)
        B, L = next_ids.shape
        t = pos.expand(B, L)  # (B, L) each column's position
        self.log += [(int(t[b, c]), int(next_ids[b, c]), hidden[b, c].clone(), logits[b, c].clone())
                     for b in range(B) for c in range(L)]  # copies: the static loop's buffers change in place
        return logits, g


@pytest.mark.parametrize("generate", [batched_speculative_generate, static_batched_speculative_generate])
@pytest.mark.parametrize("n_sink, window", [(None, None), (2, 8)])
@pytest.mark.parametrize("prefill_batch", [1, 3])
def test_every_draft_of_a_prompt_alone_is_drafted_in_the_batch(models, generate, n_sink, window, prefill_batch):
    """The draft's KV in a refilled row: each head call a prompt makes decoded alone has a twin in the
    refilling batch (the same position, token and hidden state) with the same logits, which holds
    only if the row's draft cache holds the prompt's keys (the untrained head accepts nothing, so
    the outputs alone cannot show it). Every prefill writes the head's chain with ``write_cache``, no
    call (NOTE [Shared draft prefill] in wmtp/prefill.py), so only decoding calls are logged."""
    target, head = models
    prompts = prompts_of([5, 17, 1, 9, 23, 12, 3], seed=29)
    batch = Recorder(head)
    generate(target, batch, prompts, 12, 3, n_sink, window, impl="torch", max_batch=2, prefill_batch=prefill_batch)
    calls: dict[tuple[int, int], list] = {}
    for t, x, h, logits in batch.log:
        calls.setdefault((t, x), []).append((h, logits))
    n = 0
    for p in prompts:
        alone = Recorder(head)
        wmtp.speculative_generate(target, alone, p, 12, 3, n_sink, window, impl="torch")
        for t, x, h, logits in alone.log:
            twins = [lg for hb, lg in calls.get((t, x), []) if torch.allclose(hb, h, rtol=0, atol=1e-9)]
            assert any(torch.allclose(lg, logits, rtol=0, atol=1e-9) for lg in twins), (t, x)
            n += 1
    assert n > 100


@pytest.mark.parametrize("max_batch, prefill_batch", [(1, 1), (3, 1), (3, 4), (20, 1)])
@pytest.mark.parametrize("depth, n_sink, window", [(1, None, None), (3, 2, 8), (4, 0, 4)])
def test_each_prompt_is_alone(models, max_batch, prefill_batch, depth, n_sink, window):
    target, head = models
    prompts = prompts_of(LENGTHS, seed=21)
    outs, stats = batched_speculative_generate(target, head, prompts, 24, depth, n_sink, window, impl="torch",
                                               max_batch=max_batch, prefill_batch=prefill_batch)
    alone_steps = []
    for i, p in enumerate(prompts):
        assert torch.equal(outs[i], wmtp.greedy_generate(target, p, 24, impl="torch"))
        alone, s = wmtp.speculative_generate(target, head, p, 24, depth, n_sink, window, impl="torch")
        assert torch.equal(outs[i], alone)
        assert (stats.accepted[i], stats.committed[i], stats.live_steps[i]) == (s.accepted, s.committed, s.steps)
        alone_steps.append(s.steps)
    assert stats.batch == len(prompts) and stats.steps == schedule(alone_steps, min(max_batch, len(prompts)))


@pytest.mark.parametrize("generate", [batched_speculative_generate, static_batched_speculative_generate])
@pytest.mark.parametrize("max_batch, prefill_batch", [(1, 1), (2, 1), (3, 1), (2, 3)])
def test_scripted_matches_refill_rows(monkeypatch, generate, max_batch, prefill_batch):
    """With scripted matches (``InputOracle``, told which row takes which prompt), each prompt keeps
    ``j(i, n) + 1`` tokens a step at its own ``n``, which holds only if an admitted prompt's row is fed
    its true tokens and hidden states; the batch's steps follow the refill schedule, fewer than
    waves of ``max_batch`` prompts each waiting for its slowest would take."""
    from wmtp import rows
    from wmtp.grading_checks import harness_models

    target, head = harness_models()
    K, new, prompts = 3, 30, prompts_of(LENGTHS, seed=26)
    script = [3, 0, 2, 1, 3, 0, 1]  # with the positions' share: 8-20 steps a prompt
    oracle = InputOracle(target, head, prompts, K, new, j=lambda i, n: script[i] if n % 3 else (n + i) % (K + 1))
    monkeypatch.setattr(rows.Admitter, "__call__", oracle.spy(rows.Admitter.__call__))
    outs, stats = generate(target, oracle, prompts, new, K, impl="torch", max_batch=max_batch,
                           prefill_batch=prefill_batch)
    assert all(torch.equal(o, w[:new]) for o, w in zip(outs, oracle.want))
    steps = []
    for i, p in enumerate(prompts):
        s, accepted = scripted_counts(oracle.j, i, p.numel(), new)
        assert (stats.live_steps[i], stats.accepted[i], stats.committed[i]) == (s, accepted, new - 1)
        steps.append(s)
    assert len(set(steps)) > 2  # the prompts differ in steps, so the schedule matters
    assert stats.steps == schedule(steps, max_batch)
    waves = sum(max(steps[w: w + max_batch]) for w in range(0, len(prompts), max_batch))
    assert max_batch == 1 or stats.steps < waves


@pytest.mark.parametrize("max_batch", [1, 3])
def test_eos_and_short_requests(models, max_batch):
    """Prompts stopping at an eos free their rows early; 0, 1 and 2 new tokens refill at once."""
    target, head = models
    prompts = prompts_of(LENGTHS, seed=22)
    free = [wmtp.greedy_generate(target, p, 20, impl="torch") for p in prompts]
    eos = int(free[2][3])
    outs, _ = batched_speculative_generate(target, head, prompts, 20, 3, 2, 8, impl="torch", eos_id=eos,
                                           max_batch=max_batch)
    assert [o.tolist() for o in outs] == [wmtp.greedy_generate(target, p, 20, eos_id=eos, impl="torch").tolist()
                                          for p in prompts]
    for new in (0, 1, 2):
        outs, stats = batched_speculative_generate(target, head, prompts, new, 3, impl="torch", max_batch=max_batch)
        assert [o.tolist() for o in outs] == [wmtp.greedy_generate(target, p, new, impl="torch").tolist()
                                              for p in prompts]
        assert stats.committed == [max(new - 1, 0)] * len(prompts)


@pytest.mark.parametrize("max_batch, prefill_batch", [(1, 1), (3, 1), (3, 2)])
def test_the_static_loop_is_the_eager_one(models, max_batch, prefill_batch):
    target, head = models
    prompts = prompts_of(LENGTHS, seed=23)
    free = [wmtp.greedy_generate(target, p, 20, impl="torch") for p in prompts]
    for eos in (None, int(free[1][2])):
        a = static_batched_speculative_generate(target, head, prompts, 20, 3, 2, 8, impl="torch", eos_id=eos,
                                                max_batch=max_batch, prefill_batch=prefill_batch)
        b = batched_speculative_generate(target, head, prompts, 20, 3, 2, 8, impl="torch", eos_id=eos,
                                         max_batch=max_batch, prefill_batch=prefill_batch)
        assert [o.tolist() for o in a[0]] == [o.tolist() for o in b[0]]
        for key in COUNTERS:
            assert getattr(a[1], key) == getattr(b[1], key), key


def test_triton_under_the_interpreter(models):
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton kernels under the CPU interpreter")
    target, head = models
    prompts = prompts_of([3, 10, 6], seed=24)
    want = [wmtp.greedy_generate(target, p, 6, impl="torch").tolist() for p in prompts]
    for generate in (batched_speculative_generate, static_batched_speculative_generate):
        for prefill_batch in (1, 2):
            outs, _ = generate(target, head, prompts, 6, 2, 2, 4, impl="triton", max_batch=2,
                               prefill_batch=prefill_batch)
            assert [o.tolist() for o in outs] == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels and graphs on the GPU")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_each_prompt_is_alone_on_cuda(impl):
    """float64 on the GPU; with the Triton impl the static loop's phases are CUDA graphs, refilled between them."""
    from wmtp.grading_checks import harness_models

    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompts = [p.cuda() for p in prompts_of([4, 30, 17, 9, 2], seed=25)]
    want = [wmtp.greedy_generate(target, p, 20, impl=impl).tolist() for p in prompts]
    for prefill_batch in (1, 2):
        eager = batched_speculative_generate(target, head, prompts, 20, 4, 4, 16, impl=impl, max_batch=2,
                                             prefill_batch=prefill_batch)
        static = static_batched_speculative_generate(target, head, prompts, 20, 4, 4, 16, impl=impl, max_batch=2,
                                                     prefill_batch=prefill_batch)
        assert [o.tolist() for o in eager[0]] == want and [o.tolist() for o in static[0]] == want
        assert static[1].accepted == eager[1].accepted and static[1].steps == eager[1].steps


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_bad_max_batch_is_a_value_error(models, bad):
    target, head = models
    for generate in (batched_speculative_generate, static_batched_speculative_generate):
        with pytest.raises(ValueError, match="max_batch"):
            generate(target, head, prompts_of([3, 4]), 4, 2, impl="torch", max_batch=bad)
        with pytest.raises(ValueError, match="prefill_batch must be an integer >= 1"):
            generate(target, head, prompts_of([3, 4]), 4, 2, impl="torch", max_batch=1, prefill_batch=bad)
