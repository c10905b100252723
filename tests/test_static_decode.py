"""Device-resident decoding (wmtp/static_decode.py): the output is dense greedy's, token for token,
and the statistics are the eager loop's, for every accept length, key set and depth.

A draft that answers on the device for every row (``DeviceOracle``: the static extend picks its
row on the device, where grading.OracleDraft answers on the last row only) drives every accept
length 0..K. Float64 on CPU (decode.py NOTE [Exactness]); on CUDA both impls, and the CUDA graphs.
"""

import copy
import os

import pytest
import torch
from decode_harness import Cycling, DeviceOracle, HeadProxy, V, random_prompt, same_counts

import wmtp
from wmtp import graphs
from wmtp.grading import harness_models
from wmtp.keyset import key_count
from wmtp.kvcache import KVCache
from wmtp.policy import AdaptiveDepth
from wmtp.static_decode import EOS_CHECK, static_greedy_generate, static_speculative_generate

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KEYSETS = [(0, None), (4, 16), (0, 1), (2, 3)]


class ForcedHead(HeadProxy):
    """The real head, its attention and caches included, with a logit bonus that makes the first
    ``j`` drafts of every step right and the rest wrong; it records each call's logits and ``g`` per
    (step, call in the step, position), so that two loops can be compared row by row."""

    def __init__(self, head, sequence: torch.Tensor, j: int, depth: int):
        self.head, self.seq, self.j, self.depth = head, sequence, j, depth
        self.calls = 0  # the draft prefill is write_cache's, no call
        self.rows: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, g = self.head(hidden, next_ids, pos, cache, n_sink, window, impl)
        call, self.calls = self.calls, self.calls + 1
        step, i = divmod(call, self.depth)
        for r, p in enumerate(pos.tolist()):
            self.rows[step, i, p] = logits[0, r].clone(), g[0, r].clone()
        truth = self.seq[(pos + 2).clamp(max=self.seq.numel() - 1)]  # (L,)
        tok = truth if i < self.j else (truth + 1) % V
        bonus = torch.zeros_like(logits)
        bonus[0, torch.arange(pos.numel()), tok] = 1e6
        return logits + bonus, g


@pytest.fixture(scope="module")
def models():
    return harness_models()


@pytest.mark.parametrize("depth", [1, 3, 8])
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_every_accept_length_matches_the_eager_loop(models, depth, n_sink, window):
    target, head = models
    prompt = random_prompt(12)
    ref = wmtp.greedy_generate(target, prompt, 40)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for j in range(depth + 1):
        oracle = DeviceOracle(head, seq, j)
        out, stats = static_speculative_generate(target, oracle, prompt, 40, depth, n_sink, window)
        eager_out, eager = wmtp.speculative_generate(target, oracle, prompt, 40, depth, n_sink, window)
        assert torch.equal(out, ref) and torch.equal(eager_out, ref), f"j={j}"
        same_counts(stats, eager)
        assert stats.accept_length_histogram[j] >= stats.steps - 1  # the oracle's j, every whole step
        # depth + 1 extend rows (1 at the first step), depth - 1 recursive drafts
        assert stats.draft_queries == 2 * depth * stats.steps - depth


@pytest.mark.parametrize("depth", [3, 8])
@pytest.mark.parametrize("prompt_len", [1, 23])
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_a_real_head_drafts_the_same_in_both_loops(models, depth, prompt_len, n_sink, window):
    """The real head, acceptance forced to every j: each eager call's logits and hidden state, row by
    row, equal the static loop's (float64, 1e-9), so the static extend picks row ``a`` of the logits
    AND of ``g`` (NOTE [Static extend]); the static extend's extra rows are compared with nothing."""
    target, head = models
    prompt = random_prompt(prompt_len, seed=depth + prompt_len)
    ref = wmtp.greedy_generate(target, prompt, 30)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for j in range(depth + 1):
        eager, static = (ForcedHead(head, seq, j, depth) for _ in range(2))
        out_e, stats_e = wmtp.speculative_generate(target, eager, prompt, 30, depth, n_sink, window)
        out_s, stats_s = static_speculative_generate(target, static, prompt, 30, depth, n_sink, window)
        assert torch.equal(out_e, ref) and torch.equal(out_s, ref), f"j={j}"
        same_counts(stats_s, stats_e)
        assert stats_s.accept_length_histogram[j] >= stats_s.steps - 1, f"j={j}"
        for key, (logits, g) in eager.rows.items():
            assert key in static.rows, f"j={j}: no static row {key}"
            torch.testing.assert_close(static.rows[key][0], logits, rtol=0, atol=1e-9)
            torch.testing.assert_close(static.rows[key][1], g, rtol=0, atol=1e-9)


@pytest.mark.parametrize("depth", [1, 2, 5, 8])
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_random_head_is_lossless_and_drafts_as_the_eager_loop(models, depth, n_sink, window):
    """A real head's drafts come from row ``a`` of a ``depth + 1``-row extend: the same drafts as the
    eager ``a + 1``-row extend (float64), so the same accepts."""
    target, head = models
    prompt = random_prompt(20, seed=depth)
    ref = wmtp.greedy_generate(target, prompt, 24)
    out, stats = static_speculative_generate(target, head, prompt, 24, depth, n_sink, window)
    assert torch.equal(out, ref)
    same_counts(stats, wmtp.speculative_generate(target, head, prompt, 24, depth, n_sink, window)[1])
    assert len(stats.draft_times_s) == len(stats.verify_times_s) == stats.steps


@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_depth_policies_draft_as_the_eager_loop(models, n_sink, window, monkeypatch):
    """Cycling depths (NOTE [Static depths]) with every accept length: the eager loop's depths,
    accepts and counts, dense greedy's output; each depth's two phases are built once."""
    target, head = models
    prompt = random_prompt(11, seed=5)
    ref = wmtp.greedy_generate(target, prompt, 40)
    seq = torch.cat([prompt, ref, torch.zeros(8, dtype=torch.long)])
    built = []
    runner = graphs.runner  # the speculative loop's phases capture through graphs.Phases
    monkeypatch.setattr(graphs, "runner", lambda step, state, graph, pool=None: built.append(state) or runner(
        step, state, graph, pool))
    for j in range(6):
        oracle, static, eager = DeviceOracle(head, seq, j), Cycling([1, 5, 3, 5, 2]), Cycling([1, 5, 3, 5, 2])
        built.clear()
        out, stats = static_speculative_generate(target, oracle, prompt, 40, static, n_sink, window)
        eager_out, eager_stats = wmtp.speculative_generate(target, oracle, prompt, 40, eager, n_sink, window)
        assert torch.equal(out, ref) and torch.equal(eager_out, ref), f"j={j}"
        assert static.seen == eager.seen and len(static.seen) == stats.steps, f"j={j}"
        assert all(a == min(j, d) for d, a in static.seen[:-1]), f"j={j}"  # the oracle's j, cut at the depth
        same_counts(stats, eager_stats)
        assert stats.steps_by_depth == eager_stats.steps_by_depth and stats.depth == 5
        assert static.positions == eager.positions, f"j={j}"  # asked at the target's latest token's position
        assert static.times == list(zip(stats.draft_times_s, stats.verify_times_s)), f"j={j}"
        # the extend's rows (the last step's depth + 1; 1 at the first step) from the last step's position,
        # then k - 1 recursive drafts from this step's
        depths = [d for d, _ in static.seen]
        extends = [1] + [d + 1 for d in depths[:-1]]
        starts = [prompt.numel() - 1] + static.positions[:-1]
        queries = [[*range(h, h + e), *range(p, p + d - 1)] for h, e, p, d in zip(starts, extends, static.positions,
                                                                                  depths)]
        assert stats.draft_queries == sum(map(len, queries)) == sum(e + d - 1 for e, d in zip(extends, depths))
        assert stats.draft_keys_read == sum(key_count(t, n_sink, window) for q in queries for t in q), f"j={j}"
        # a draft phase per (extend rows, depth) pair, a verify phase per depth (state: what it restores)
        assert sorted(len(state) for state in built) == [0] * len(set(zip(extends, depths))) + [4] * len(
            set(depths)), f"j={j}: phases built {len(built)} times"
    out, _ = static_speculative_generate(target, head, prompt, 40, AdaptiveDepth(6, learn_costs=True), n_sink, window)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("draft_cache,positions", [("full", "reindexed"), ("ring", "absolute"), ("ring", "reindexed")])
@pytest.mark.parametrize("n_sink,window", [(4, 16), (2, 3)])
def test_depth_policies_with_rings_positions_and_eos(models, draft_cache, positions, n_sink, window):
    """The real head with cycling depths: the eager loop's depths and accepts, dense greedy's output,
    with a ring draft KV, re-indexed positions, and an eos that stops the run."""
    target, head = models
    prompt = random_prompt(15, seed=8)
    ref = wmtp.greedy_generate(target, prompt, 40)
    eos = int(ref[23])
    for eos_id, dense in ((None, ref), (eos, wmtp.greedy_generate(target, prompt, 40, eos_id=eos))):
        static, eager = Cycling([2, 6, 1, 4]), Cycling([2, 6, 1, 4])
        kwargs = {"draft_cache": draft_cache, "positions": positions, "eos_id": eos_id}
        out, stats = static_speculative_generate(target, head, prompt, 40, static, n_sink, window, **kwargs)
        eager_out, eager_stats = wmtp.speculative_generate(target, head, prompt, 40, eager, n_sink, window, **kwargs)
        assert torch.equal(out, dense) and torch.equal(eager_out, dense), f"eos {eos_id}"
        assert static.seen == eager.seen and static.positions == eager.positions, f"eos {eos_id}"
        same_counts(stats, eager_stats)


def test_eos_and_cuts_at_every_accept_length(models):
    """An eos inside an accepted run, and max_new_tokens cutting a step, for every j (depth 5)."""
    target, head = models
    prompt, depth = random_prompt(7), 5
    ref = wmtp.greedy_generate(target, prompt, 40)
    eos = int(ref[9])
    dense = wmtp.greedy_generate(target, prompt, 40, eos_id=eos)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for j in range(depth + 1):
        oracle = DeviceOracle(head, seq, j)
        out, _ = static_speculative_generate(target, oracle, prompt, 40, depth, 4, 16, eos_id=eos)
        assert torch.equal(out, dense), f"eos, j={j}"
        for n in (1, 2, 5, 9, 13):
            out, _ = static_speculative_generate(target, oracle, prompt, n, depth, 4, 16)
            assert torch.equal(out, ref[:n]), f"max_new {n}, j={j}"


@pytest.mark.parametrize("prompt_len", [1, 9, 30])
def test_requests_up_to_the_last_cache_position(models, prompt_len):
    import dataclasses

    target, head = models
    L, depth = 40, 3
    small = wmtp.TargetLM(dataclasses.replace(target.config, max_seq_len=L)).double()
    small.load_state_dict(target.state_dict())
    small_head = wmtp.MTPHead(head.config, small).double()
    small_head.load_state_dict(head.state_dict())
    prompt = random_prompt(prompt_len, seed=prompt_len)
    greedy_max, spec_max = L + 1 - prompt_len, L + 1 - prompt_len - depth
    ref = wmtp.greedy_generate(small, prompt, greedy_max)
    assert torch.equal(static_greedy_generate(small, prompt, greedy_max), ref)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for draft in (small_head, DeviceOracle(small_head, seq, depth)):  # no accepts; every draft accepted
        out, _ = static_speculative_generate(small, draft, prompt, spec_max, depth, 2, 3)
        assert torch.equal(out, ref[:spec_max])
    with pytest.raises(ValueError, match="KV cache"):
        static_speculative_generate(small, small_head, prompt, spec_max + 1, depth)
    with pytest.raises(ValueError, match="KV cache"):
        static_greedy_generate(small, prompt, greedy_max + 1)


@pytest.mark.parametrize("max_new", [0, 1, 2, 17, 40])
@pytest.mark.parametrize("eos_at", [None, 0, 5, 16, 17, 30])
def test_greedy_equals_the_eager_loop(models, max_new, eos_at):
    """Including an eos before, at and after the output's reads (every EOS_CHECK steps)."""
    target, _ = models
    prompt = random_prompt(9)
    eos = None if eos_at is None else int(wmtp.greedy_generate(target, prompt, 40)[eos_at])
    times: list[float] = []
    out = static_greedy_generate(target, prompt, max_new, eos_id=eos, step_times=times)
    assert torch.equal(out, wmtp.greedy_generate(target, prompt, max_new, eos_id=eos))
    assert len(times) <= max(max_new - 1, 0) and all(t > 0 for t in times)
    if eos is not None and len(out) < max_new:  # stopped by the eos: within EOS_CHECK steps of it
        assert len(times) < len(out) + EOS_CHECK


def test_batches_and_integer_prompts(models):
    target, head = models
    prompts = [random_prompt(5, seed=1), random_prompt(13, seed=2).int()]
    refs = wmtp.greedy_generate(target, prompts, 9)
    assert all(torch.equal(a, b) for a, b in zip(static_greedy_generate(target, prompts, 9), refs))
    outs, stats = static_speculative_generate(target, head, prompts, 9, 3, 4, 16)
    assert all(torch.equal(a, b) for a, b in zip(outs, refs)) and len(stats) == 2


def test_cuda_graph_needs_cuda_and_triton(models):
    target, head = models
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
        static_speculative_generate(target, head, random_prompt(5), 4, 2, cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph=True needs"):
        static_greedy_generate(target, random_prompt(5), 4, impl="torch", cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph must be"):
        static_greedy_generate(target, random_prompt(5), 4, cuda_graph="yes")
    with pytest.raises(ValueError, match="depth"):
        static_speculative_generate(target, head, random_prompt(5), 4, 0)


def test_a_phases_step_is_draft_then_verify_between_three_marks():
    """``Phases.step``: mark, the draft phase, mark, the verify phase, mark; so a step's two spans time
    its two phases (mutation round 5: marking after the draft phase, whose time then went to neither
    span, survived every test); each phase is built once per key."""
    log = []

    class Marks:
        def mark(self):
            log.append("mark")

    phases = graphs.Phases(lambda e, k: log.append(("draft", e, k)), lambda k: log.append(("verify", k)), (), False,
                           Marks())
    phases.step((1, 3), 3)
    phases.step((4, 2), 2)
    assert log == ["mark", ("draft", 1, 3), "mark", ("verify", 3), "mark",
                   "mark", ("draft", 4, 2), "mark", ("verify", 2), "mark"]
    assert list(phases.drafts) == [(1, 3), (4, 2)] and list(phases.verifies) == [3, 2]


def test_an_unchecked_cache_writes_as_a_checked_one(monkeypatch):
    """``checked=False`` skips only the range check (the read a CUDA graph cannot make)."""
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 1, 2, 3, 4, generator=g)
    pos = torch.tensor([5, 1, 7])
    a, b = KVCache(1, 1, 2, 8, 4), KVCache(1, 1, 2, 8, 4, checked=False)
    for c in (a, b):
        c.update(0, pos, k, v)
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    with pytest.raises(ValueError, match="do not fit"):
        a.update(0, torch.tensor([8, 9, 10]), k, v)

    def no_read(*args, **kwargs):
        raise AssertionError("the range check read the positions")

    monkeypatch.setattr(torch, "aminmax", no_read)
    b.update(0, pos.flip(0), k, v)  # no read of the positions
    with pytest.raises(AssertionError, match="range check"):
        a.update(0, pos, k, v)


@pytest.mark.skipif(not INTERPRETED or CUDA, reason="the Triton kernels under the CPU interpreter")
def test_triton_interpreter_is_lossless(models):
    target, head = models
    prompt = random_prompt(10)
    ref = wmtp.greedy_generate(target, prompt, 8)
    assert torch.equal(static_greedy_generate(target, prompt, 8, impl="triton"), ref)
    out, _ = static_speculative_generate(target, head, prompt, 8, 3, 4, 16, impl="triton")
    assert torch.equal(out, ref)


@pytest.fixture(scope="module")
def cuda_models():
    """A copy on the GPU (harness_models() is cached and shared with the CPU tests), float64."""
    target, head = copy.deepcopy(harness_models())
    return target.cuda(), head.cuda()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl,graph", [("torch", False), ("triton", False), ("triton", True)])
@pytest.mark.parametrize("depth", [1, 3, 8])
@pytest.mark.parametrize("n_sink,window", [(0, None), (4, 16)])
def test_cuda_is_lossless(cuda_models, impl, graph, depth, n_sink, window):
    """Float64 on the GPU against the same impl's eager dense decoding, for the random head and every
    accept length; through the CUDA graphs too (the oracle is device ops only: it is captured)."""
    target, head = cuda_models
    prompt = random_prompt(30, seed=depth).cuda()
    ref = wmtp.greedy_generate(target, prompt, 33, impl=impl)
    assert torch.equal(static_greedy_generate(target, prompt, 33, impl=impl, cuda_graph=graph), ref)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long, device="cuda")])
    for j, draft in [(None, head)] + [(j, DeviceOracle(head, seq, j)) for j in range(depth + 1)]:
        out, stats = static_speculative_generate(target, draft, prompt, 33, depth, n_sink, window, impl=impl,
                                                 cuda_graph=graph)
        assert out.device.type == "cuda" and torch.equal(out, ref), f"j={j}"
        if j is not None:
            assert stats.accept_length_histogram[j] >= stats.steps - 1, f"j={j}"
        assert all(t > 0 for t in stats.draft_times_s + stats.verify_times_s)
    if depth > 1:  # NOTE [Static depths]: a pair of graphs per depth the policy drafts
        for j, draft in [(None, head), (depth - 1, DeviceOracle(head, seq, depth - 1))]:
            policy = Cycling([depth, 1, depth - 1])
            out, stats = static_speculative_generate(target, draft, prompt, 33, policy, n_sink, window, impl=impl,
                                                     cuda_graph=graph)
            assert torch.equal(out, ref) and len(policy.seen) == stats.steps, f"policy, j={j}"
            if j is not None:
                assert all(a == min(j, d) for d, a in policy.seen[:-1]), f"policy, j={j}"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graphs_of_a_run_share_one_pool_and_replay_in_any_order(cuda_models, monkeypatch):
    """NOTE [One graph pool] (wmtp/graphs.py): every capture of a run goes to one pool, and the graphs,
    replayed in an order other than their captures', still give dense greedy's tokens."""
    target, head = cuda_models
    prompt = random_prompt(30, seed=11).cuda()
    ref = wmtp.greedy_generate(target, prompt, 60, impl="triton")
    seq = torch.cat([prompt, ref, torch.zeros(6, dtype=torch.long, device="cuda")])
    pools, runner = [], graphs.runner
    monkeypatch.setattr(graphs, "runner", lambda step, state, graph, pool=None: pools.append(pool) or runner(
        step, state, graph, pool))
    for j, draft in [(None, head), (1, DeviceOracle(head, seq, 1)), (4, DeviceOracle(head, seq, 4))]:
        pools.clear()
        policy = Cycling([3, 1, 4, 2, 4, 1, 1, 3, 2, 2, 4, 3])  # 12 (extend rows, depth) pairs, then replays
        out, stats = static_speculative_generate(target, draft, prompt, 60, policy, 4, 16, impl="triton",
                                                 cuda_graph=True)
        assert torch.equal(out, ref), f"j={j}"
        assert len(pools) > 8 and pools[0] is not None and all(p == pools[0] for p in pools), f"j={j}"


class Positions(HeadProxy):
    """The real head, recording the ``positions`` each call asks for (``None``: absolute)."""

    def __init__(self, head):
        self.head, self.seen = head, []

    def __call__(self, *args, positions=None):
        self.seen.append(positions)
        return self.head(*args) if positions is None else self.head(*args, positions=positions)


def test_a_list_of_prompts_passes_every_option_on(models):
    """A list of prompts runs each prompt with the same options: the greedy loop's eos and step times,
    the speculative loop's ring draft KV and re-indexed positions (mutation round 6: dropping any of
    them on the list path survived every test)."""
    target, head = models
    prompts = [random_prompt(20, seed=1), random_prompt(9, seed=2)]
    eos = int(wmtp.greedy_generate(target, prompts[0], 6)[3])
    times, one_times = [], []
    outs = static_greedy_generate(target, prompts, 6, eos_id=eos, step_times=times)
    ones = [static_greedy_generate(target, p, 6, eos_id=eos, step_times=one_times) for p in prompts]
    assert outs[0].numel() == 4 and all(torch.equal(a, b) for a, b in zip(outs, ones))
    assert len(times) == len(one_times) > 0
    listed, one = Positions(head), Positions(head)
    kwargs = {"draft_cache": "ring", "positions": "reindexed"}
    _, stats = static_speculative_generate(target, listed, prompts[:1], 3, 2, 2, 3, **kwargs)
    _, one_stats = static_speculative_generate(target, one, prompts[0], 3, 2, 2, 3, **kwargs)
    assert listed.seen == one.seen == ["reindexed"] * 4  # two steps (no accepts) of an extend and a recursive draft
    assert stats[0].draft_kv_bytes == one_stats.draft_kv_bytes < static_speculative_generate(
        target, head, prompts[0], 3, 2, 2, 3)[1].draft_kv_bytes  # a ring's
    # the speculative loop's eos too (dropping it for a list survived, session 54): each prompt cut after
    # its first eos, as alone
    eos = int(wmtp.greedy_generate(target, prompts[1], 8)[2])
    outs, _ = static_speculative_generate(target, head, prompts, 8, 2, 2, 3, eos_id=eos)
    ones = [static_speculative_generate(target, head, p, 8, 2, 2, 3, eos_id=eos)[0] for p in prompts]
    assert outs[1].numel() == 3 and all(torch.equal(a, b) for a, b in zip(outs, ones))
