"""The figures of ``wmtp bench decode``, ``depth``, ``sampling`` and ``positions`` (wmtp/bench_*.py), one
context's row from fake generators with literal step times and counts: medians, not means; speedup
``old / new - 1`` and reduction ``1 - new / old`` the right way round; the native arm the baseline
though listed last; the counts of the first round; the lossless assertions, which raise on a token
that differs; and the position of the last draft query, on which ``bench positions``' ``evicts`` rests
(one short decode of the untrained tiny models). Nothing is timed (tests/test_cli_bench_*.py run the
benches)."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import table_cells

import wmtp
from wmtp import bench_decode, bench_depth, bench_positions, bench_sampling
from wmtp.cli import main
from wmtp.config import KeySetConfig, get_preset
from wmtp.mtp import MTPHead
from wmtp.sampling import speculative_sample
from wmtp.stats import SpecStats

NATIVE, WIN = KeySetConfig(0, None), KeySetConfig(4, 16)
TOKENS = torch.arange(4)
PROMPT = torch.zeros(10, dtype=torch.long)


def _preset(*keysets, new_tokens=4, depth=3):
    p = get_preset("tiny")
    return dataclasses.replace(p, spec=dataclasses.replace(p.spec, keysets=keysets, new_tokens=new_tokens,
                                                           depth=depth))


def _decode_fakes(monkeypatch, wrong=False):
    """Dense steps 1, 2, 6 s (median 2, mean 3); the native arm's medians draft 0.5, verify 0.5 s, AL 2;
    the windowed arm's draft 0.25, verify 0.5 s, AL 3."""
    def greedy(target, prompt, n, step_times, prefill):
        step_times += [1.0, 2.0, 6.0]
        return TOKENS

    stats = {None: SpecStats(3, steps=3, committed=6, proposed=9, accepted=3, draft_keys_read=300, draft_kv_bytes=800,
                             draft_times_s=[0.5, 0.5, 8.0], verify_times_s=[0.5] * 3),
             16: SpecStats(3, steps=3, committed=9, proposed=9, accepted=6, draft_keys_read=60, draft_kv_bytes=200,
                           draft_times_s=[0.25, 0.25, 4.0], verify_times_s=[0.5, 0.5, 0.25])}

    def speculative(target, head, prompt, n, depth, n_sink, window, prefill, draft_cache, gate):
        return TOKENS + (wrong and window is not None), stats[window]

    monkeypatch.setattr(bench_decode, "loop_generators", lambda loop: (greedy, speculative))


def test_decode_row_from_literal_step_times(monkeypatch):
    _decode_fakes(monkeypatch)
    row = bench_decode.run_context(None, None, PROMPT, _preset(WIN, NATIVE), "eager", "pre")
    assert (row["context"], row["loop"], row["new_tokens"]) == (10, "eager", 4)
    assert row["dense"] == {"step_median_s": 2.0, "tpot_s": 2.0}
    assert list(row["arms"]) == ["native", "sink4+win16"]  # the native arm first, the baseline
    keys = ("steps", "mean_accept_length", "draft_keys_read_per_step", "draft_time_per_step_s",
            "verify_time_per_step_s", "draft_share_of_step", "tpot_s", "tpot_speedup_vs_dense",
            "draft_time_reduction_vs_native")
    got = [[row["arms"][label][k] for k in keys] for label in ("native", "sink4+win16")]
    assert got[0] == [3, 2.0, 100.0, 0.5, 0.5, 0.5, 0.5, 3.0, 0.0]  # tpot (0.5 + 0.5) / 2; 2 / 0.5 - 1
    assert got[1] == pytest.approx([3, 3.0, 20.0, 0.25, 0.5, 1 / 3, 0.25, 7.0, 0.5])  # 1 - 0.25 / 0.5
    fields = ("lossless", "n_sink", "window", "gate", "draft_cache", "draft_kv_bytes", "acceptance_rate")
    assert [[row["arms"][label][k] for k in fields] for label in ("native", "sink4+win16")] == [
        [True, 0, None, None, "full", 800, 1 / 3], [True, 4, 16, None, "full", 200, 2 / 3]]
    assert table_cells(bench_decode.table({"environment": {"device": "cpu"}, "decode_dtype": "float64",
                                           "rows": [row]})) == [
        ["10", "eager", "dense", "1", "", "", "", "2000.000", "", ""],
        ["", "", "native", "2.00", "500.000", "500.000", "50%", "500.000", "+300%", "-"],
        ["", "", "sink4+win16", "3.00", "250.000", "500.000", "33%", "250.000", "+700%", "50%"]]


def test_decode_refuses_an_arm_whose_tokens_differ(monkeypatch):
    _decode_fakes(monkeypatch, wrong=True)
    with pytest.raises(AssertionError, match=r"arm sink4\+win16 \(eager loop\) at context 10 is not lossless"):
        bench_decode.run_context(None, None, PROMPT, _preset(NATIVE, WIN), "eager", "pre")


def test_decode_options_take_a_page_as_long_as_the_smallest_context(monkeypatch):
    def started(*a):
        raise RuntimeError("the bench started")

    monkeypatch.setattr(bench_decode, "bench_setup", started)

    def run(**kw):
        bench_decode.bench_decode(_preset(NATIVE), None, torch.device("cpu"), 0, (64, 128),
                                  **{"loops": ("eager",), "cache_dir": None, "command": "c", **kw})

    with pytest.raises(RuntimeError, match="the bench started"):
        run(page_size=64, draft_caches=("ring", "full"))
    for kw, match in ((dict(page_size=65), "--page-size must be at most the smallest context 64, got 65"),
                      (dict(page_size=0), "--page-size must be an integer >= 1, got 0"),
                      (dict(page_size=16.0), "--page-size must be an integer >= 1, got 16.0"),
                      (dict(draft_caches=("full", "full")), "draft caches must be distinct ones of full, ring"),
                      (dict(loops=("eager", "eager")), "loops must be distinct ones of eager, graph"),
                      (dict(loops=()), r"loops must be distinct ones of eager, graph, got \[\]"),
                      (dict(draft_caches=()), r"draft caches must be distinct ones of full, ring, got \[\]"),
                      (dict(draft_caches=("full", "paged")), r"draft caches .*, got \['full', 'paged'\]")):
        with pytest.raises(ValueError, match=match):
            run(**kw)


def _depth_fakes(monkeypatch, wrong=False):
    """3 rounds; dense steps 1, 1, 4 then 3, 3, 3 then 7, 7, 7 s (a round's TPOT the mean of its steps:
    2, 3, 7; their median 3, their mean 4); a run's seconds 2, 12, 4 a round (TPOT over 4 tokens 0.5, 3,
    1: median 1, mean 1.5) times its policy's factor (native: fixed 1, adaptive 2, per-depth 4;
    windowed: 4, 1, 2); a run's steps 2, 3, 4 a round."""
    dense_steps = iter([[1.0, 1.0, 4.0], [3.0] * 3, [7.0] * 3])
    calls = []

    def greedy(target, prompt, n, step_times, prefill):
        step_times += next(dense_steps)
        return TOKENS

    def speculative(target, head, prompt, n, policy, n_sink, window, prefill, gate):
        r = len(calls) // 6  # 2 arms x 3 policies a round
        calls.append(policy)
        d = policy.describe()
        name = d.get("cost_model", "fixed")
        factor = {None: {"fixed": 1, "line": 2, "per-depth": 4}, 16: {"fixed": 4, "line": 1, "per-depth": 2}}
        seconds = (2.0, 12.0, 4.0)[r] * factor[window][name]
        stats = SpecStats(1, steps=r + 2, proposed=2 * r + 2, committed=4, draft_times_s=[seconds / 4],
                          verify_times_s=[seconds * 3 / 4])
        return TOKENS + (wrong and window is not None), stats

    monkeypatch.setattr(bench_depth, "loop_generators", lambda loop: (greedy, speculative))
    return calls


def test_depth_row_takes_medians_of_rounds_and_the_first_rounds_counts(monkeypatch):
    calls = _depth_fakes(monkeypatch)
    row = bench_depth.run_context(None, None, PROMPT, _preset(WIN, NATIVE, depth=1), (1,), 3, "pre")
    assert len(calls) == 18 and len({id(p) for p in calls}) == 18  # a fresh policy a run
    assert row["dense"] == {"tpot_s": 3.0, "tpot_s_rounds": [2.0, 3.0, 7.0]} and row["rounds"] == 3
    assert list(row["arms"]) == ["native", "sink4+win16"]
    native, windowed = row["arms"]["native"], row["arms"]["sink4+win16"]
    assert (native["fastest_policy"], windowed["fastest_policy"]) == ("fixed-1", "adaptive")
    got = {name: [p["tpot_s"], p["tpot_s_rounds"], p["tpot_speedup_vs_dense"]]
           for name, p in native["policies"].items()}
    assert got == {"fixed-1": [1.0, [0.5, 3.0, 1.0], 2.0], "adaptive": [2.0, [1.0, 6.0, 2.0], 0.5],
                   "adaptive-per-depth": [4.0, [2.0, 12.0, 4.0], -0.25]}  # 3 / tpot - 1
    p = windowed["policies"]["adaptive"]
    assert (p["tpot_s"], p["tpot_speedup_vs_dense"], p["draft_s"], p["verify_s"]) == (1.0, 2.0, 0.5, 1.5)
    assert (p["steps"], p["proposed"], p["mean_depth"], p["mean_accept_length"]) == (2, 2, 1.0, 2.0)  # round 1's
    assert p["mean_depth_rounds"] == pytest.approx([1.0, 4 / 3, 1.5])
    assert p["mean_accept_length_rounds"] == pytest.approx([2.0, 4 / 3, 1.0])
    assert p["policy"]["fitted_cost"] is None and p["policy_after"]["acceptance"] == [0.5]
    assert "policy_after" not in windowed["policies"]["fixed-1"]
    cells = table_cells(bench_depth.table({"environment": {"device": "cpu"}, "decode_dtype": "float64",
                                           "rows": [row]}))
    assert cells[:3] == [["10", "3000.000", "native", "fixed-1 *", "1.00", "2.00", "1000.000", "+200.0%"],
                         ["", "", "native", "adaptive", "1.00", "2.00", "2000.000", "+50.0%"],
                         ["", "", "native", "adaptive-per-depth", "1.00", "2.00", "4000.000", "-25.0%"]]
    assert [c[3] for c in cells[3:]] == ["fixed-1", "adaptive *", "adaptive-per-depth"]


def test_depth_refuses_a_run_whose_tokens_differ(monkeypatch):
    _depth_fakes(monkeypatch, wrong=True)
    with pytest.raises(AssertionError, match=r"arm sink4\+win16 with policy fixed-1 at context 10 is not token-equal"):
        bench_depth.run_context(None, None, PROMPT, _preset(NATIVE, WIN, depth=1), (1,), 3, "pre")


def test_depth_sums_every_steps_seconds_and_hands_each_arm_its_gate(monkeypatch):
    """A run's TPOT charges every step: the sums of its draft (0.25 + 0.75 + 2) and verify (1 + 1 + 4)
    seconds over its 4 tokens, 9 / 4 (not the median or largest step); the gated arm decodes with its gate."""
    gates = []

    def greedy(target, prompt, n, step_times, prefill):
        step_times += [1.0, 3.0]
        return TOKENS

    def speculative(target, head, prompt, n, policy, n_sink, window, prefill, gate):
        gates.append((window, gate))
        return TOKENS, SpecStats(1, steps=3, proposed=3, accepted=1, committed=4, draft_times_s=[0.25, 0.75, 2.0],
                                 verify_times_s=[1.0, 1.0, 4.0], steps_by_depth=[0, 3])

    monkeypatch.setattr(bench_depth, "loop_generators", lambda loop: (greedy, speculative))
    gated = KeySetConfig(4, 16, gate=100)
    row = bench_depth.run_context(None, None, PROMPT, _preset(NATIVE, gated, depth=1), (1,), 1, "pre")
    assert gates == [(None, None)] * 3 + [(16, 100)] * 3  # fixed-1, adaptive, adaptive-per-depth
    assert row["dense"]["tpot_s"] == 2.0 and row["arms"]["sink4+win16+gate100"]["gate"] == 100
    p = row["arms"]["sink4+win16+gate100"]["policies"]["fixed-1"]
    assert (p["draft_s"], p["verify_s"], p["tpot_s"], p["tpot_speedup_vs_dense"]) == (3.0, 6.0, 2.25, 2.0 / 2.25 - 1)
    assert (p["committed"], p["accepted"], p["acceptance_rate"], p["steps_by_depth"]) == (4, 1, 1 / 3, [0, 3])


def test_depth_options_refuse_bad_rounds_and_repeated_depths():
    bench_depth.check_options((1, 3), 3, 1)
    for rounds in (0, True, 1.0):
        with pytest.raises(ValueError, match="--rounds must be a positive integer"):
            bench_depth.check_options((1,), 3, rounds)
    with pytest.raises(ValueError, match="each once"):
        bench_depth.check_options((1, 1), 3, 1)
    with pytest.raises(ValueError, match=r"--depths needs at least one value, each once, got \[\]"):
        bench_depth.check_options((), 3, 1)
    with pytest.raises(ValueError, match="--loop must be one of eager, graph"):
        bench_depth.check_options((1,), 3, 1, "lazy")


def test_depth_checks_its_options_before_any_work(monkeypatch):
    """``bench_depth`` itself refuses a depth past the preset's and the graph loop off CUDA (the command
    line checks them too, first)."""
    monkeypatch.setattr(bench_depth, "bench_setup", lambda *a: pytest.fail("the bench started"))
    for kw, match in ((dict(depths=(4,)), r"--depths must be in \[1, 3\] \(the preset's depth\), got 4"),
                      (dict(loop="graph"), "the graph loop captures CUDA graphs; device cpu has none")):
        with pytest.raises(ValueError, match=match):
            bench_depth.bench_depth(_preset(NATIVE), None, torch.device("cpu"), 0, (64,), cache_dir=None, command="c",
                                    **{"depths": (1,), "rounds": 1, **kw})


def test_sampling_options_refuse_no_temperature_or_seed():
    bench_sampling.check_temperatures((0.0, 1.0), (3,))
    for temperatures, seeds in (((), (3,)), ((1.0,), ())):
        with pytest.raises(ValueError, match="--temperatures and --sample-seeds need at least one value each"):
            bench_sampling.check_temperatures(temperatures, seeds)


def _sampling_stats(steps, committed, hist, per_position):
    return SpecStats(2, steps=steps, proposed=2 * steps, accepted=committed - steps, committed=committed,
                     accept_length_histogram=hist, per_position_accepted=per_position)


def test_pooled_sums_every_count():
    total = bench_sampling.pooled([_sampling_stats(2, 4, [0, 2, 0], [2, 0]), _sampling_stats(3, 8, [1, 0, 2], [2, 2])])
    assert (total.steps, total.proposed, total.accepted, total.committed) == (5, 10, 7, 12)
    assert (total.accept_length_histogram, total.per_position_accepted) == ([1, 2, 2], [4, 2])
    assert total.mean_accept_length == 12 / 5 and total.per_position_acceptance == [0.8, 0.4]


def _sampling_fakes(monkeypatch, module, wrong=None):
    """Per seed 3 and 5: the native arm AL 2 then 3 (pooled 10 / 4), the windowed 1 then 2 (pooled 6 / 4),
    histograms and per-position counts to match (re-indexed runs: one more accepted, counts unchanged);
    ``wrong``: the method (sampling) or positions whose windowed tokens differ from dense decoding's."""
    seen = []

    def dense(target, prompt, n, temperature, seed, prefill):
        seen.append(("dense", seed))
        return TOKENS + seed

    def speculative(target, head, prompt, n, depth, n_sink, window, *, temperature, seed, method, prefill, **kw):
        how = kw.get("positions", method)
        seen.append((window, how, seed))
        committed = {(True, 3): 4, (True, 5): 6, (False, 3): 2, (False, 5): 4}[window is None, seed]
        accepted = committed - 2  # 0, 2 or 4 over two steps of depth 2: each step accepting accepted / 2
        hist, per_position = [0, 0, 0], [min(accepted, 2), max(accepted - 2, 0)]
        hist[accepted // 2] = 2
        stats = SpecStats(2, steps=2, proposed=4, accepted=accepted, committed=committed,
                          accept_length_histogram=hist, per_position_accepted=per_position)
        if how == "reindexed":  # re-indexed positions draft better: one more draft accepted a seed
            stats.committed += 1
            stats.accepted += 1
        return TOKENS + seed + (window is not None and how == wrong), stats

    monkeypatch.setattr(module, "sample_generate", dense)
    monkeypatch.setattr(module, "speculative_sample", speculative)
    return seen


def test_sampling_row_pools_the_seeds_against_the_native_arm(monkeypatch):
    _sampling_fakes(monkeypatch, bench_sampling)
    row = bench_sampling.run_context(None, None, PROMPT, _preset(WIN, NATIVE, depth=2), 0.7, (3, 5), "pre")
    assert (row["context"], row["temperature"], row["new_tokens"]) == (10, 0.7, 4)
    assert list(row["arms"]) == ["native", "sink4+win16"]
    for method in ("rejection", "gumbel"):
        native, windowed = (row["arms"][k]["methods"][method] for k in ("native", "sink4+win16"))
        assert (native["mean_accept_length"], native["mean_accept_length_per_seed"]) == (2.5, [2.0, 3.0])
        assert (windowed["mean_accept_length"], windowed["mean_accept_length_per_seed"]) == (1.5, [1.0, 2.0])
        assert (windowed["steps"], windowed["proposed"], windowed["accepted"]) == (4, 8, 2)
        assert native["mean_accept_length_change_vs_native"] is None
        assert windowed["mean_accept_length_change_vs_native"] == pytest.approx(1.5 / 2.5 - 1)
        lossless = {"rejection": "in distribution (rejection sampling)", "gumbel": "token-equal to dense sampling"}
        assert native == {
            "lossless": lossless[method], "steps": 4, "proposed": 8, "accepted": 6, "acceptance_rate": 0.75,
            "mean_accept_length": 2.5, "mean_accept_length_per_seed": [2.0, 3.0], "accept_length_histogram": [0, 2, 2],
            "per_position_acceptance": [1.0, 0.5], "mean_accept_length_change_vs_native": None}
    result = {"environment": {"device": "cpu"}, "decode_dtype": "float64", "config": {"spec": {"depth": 2}},
              "sample_seeds": [3, 5], "rows": [row]}
    assert table_cells(bench_sampling.table(result)) == [
        ["10", "0.7", "native", "rejection", "2.50", "2.00 3.00", "75.0%", "-"],
        ["", "", "native", "gumbel", "2.50", "2.00 3.00", "75.0%", "-"],
        ["", "", "sink4+win16", "rejection", "1.50", "1.00 2.00", "25.0%", "-40.0%"],
        ["", "", "sink4+win16", "gumbel", "1.50", "1.00 2.00", "25.0%", "-40.0%"]]


def test_sampling_refuses_a_gumbel_run_whose_tokens_differ(monkeypatch):
    _sampling_fakes(monkeypatch, bench_sampling, wrong="rejection")  # equal in distribution only: kept
    bench_sampling.run_context(None, None, PROMPT, _preset(NATIVE, WIN, depth=2), 0.7, (3, 5), "pre")
    _sampling_fakes(monkeypatch, bench_sampling, wrong="gumbel")
    with pytest.raises(AssertionError, match=r"arm sink4\+win16 \(gumbel\) at context 10, temperature 0.7, seed 3"):
        bench_sampling.run_context(None, None, PROMPT, _preset(NATIVE, WIN, depth=2), 0.7, (3, 5), "pre")


def test_positions_row_pairs_reindexed_with_absolute(monkeypatch):
    """Prompt 10, 4 new tokens, depth 3: the last draft query sits at 10 + 4 + 3 - 4 = 13 at most (the
    next test), so a key set of 13 keys evicts (the query at 13 drops key 4) and one of 14 does not."""
    seen = _sampling_fakes(monkeypatch, bench_positions)
    edge, wide = KeySetConfig(4, 9), KeySetConfig(4, 10)
    row = bench_positions.run_context(None, None, PROMPT, _preset(NATIVE), (edge, wide), 1.0, (3, 5), "pre")
    assert row["sample_seeds"] == [3, 5] and list(row["arms"]) == ["sink4+win9", "sink4+win10"]
    assert (row["arms"]["sink4+win9"]["evicts"], row["arms"]["sink4+win10"]["evicts"]) == (True, False)
    arm = row["arms"]["sink4+win9"]["positions"]
    assert (arm["absolute"]["mean_accept_length"], arm["reindexed"]["mean_accept_length"]) == (1.5, 2.0)
    assert arm == {
        "absolute": {"steps": 4, "proposed": 8, "accepted": 2, "acceptance_rate": 0.25, "mean_accept_length": 1.5,
                     "mean_accept_length_per_seed": [1.0, 2.0], "accept_length_histogram": [2, 2, 0],
                     "per_position_acceptance": [0.5, 0.0]},
        "reindexed": {"steps": 4, "proposed": 8, "accepted": 4, "acceptance_rate": 0.5, "mean_accept_length": 2.0,
                      "mean_accept_length_per_seed": [1.5, 2.5], "accept_length_histogram": [2, 2, 0],
                      "per_position_acceptance": [0.5, 0.0]}}
    assert row["arms"]["sink4+win9"]["reindexed_al_change"] == pytest.approx(2.0 / 1.5 - 1)
    result = {"environment": {"device": "cpu"}, "decode_dtype": "float64", "config": {"spec": {"depth": 3}},
              "train_seq_len": 64, "rows": [row]}
    assert table_cells(bench_positions.table(result)) == [
        ["10", "1", "sink4+win9", "yes", "1.50", "2.00", "+33.3%", "25.0%", "50.0%"],
        ["", "", "sink4+win10", "no", "1.50", "2.00", "+33.3%", "25.0%", "50.0%"]]
    seen.clear()
    row = bench_positions.run_context(None, None, PROMPT, _preset(NATIVE), (edge,), 0.0, (3, 5), "pre")
    assert row["sample_seeds"] == [3] and seen == [("dense", 3), (9, "absolute", 3), (9, "reindexed", 3)]
    _sampling_fakes(monkeypatch, bench_positions, wrong="reindexed")
    with pytest.raises(AssertionError, match=r"sink4\+win9 \(reindexed\) at context 10, temperature 1.0, seed 3"):
        bench_positions.run_context(None, None, PROMPT, _preset(NATIVE), (edge,), 1.0, (3, 5), "pre")


def test_sampling_hands_each_arm_its_gate(monkeypatch):
    _sampling_fakes(monkeypatch, bench_sampling)
    inner, gates = bench_sampling.speculative_sample, []

    def speculative(*a, **kw):
        gates.append(kw["gate"])
        return inner(*a, **kw)

    monkeypatch.setattr(bench_sampling, "speculative_sample", speculative)
    gated = KeySetConfig(4, 16, gate=100)
    row = bench_sampling.run_context(None, None, PROMPT, _preset(gated, NATIVE, depth=2), 0.7, (3,), "pre")
    assert gates == [None, None, 100, 100]  # rejection, gumbel: the native arm, then the gated one
    assert [a["gate"] for a in row["arms"].values()] == [None, 100]


def test_sampling_and_positions_check_temperatures_and_seeds_before_any_work(monkeypatch):
    """Each bench refuses bad temperatures and seeds itself (the command line checks them too, first)."""
    bench_sampling.check_temperatures((0.0, 1e-4), (0, 2**64 - 1))
    for temperatures, seeds, match in (((1.0, 1.0), (3,), r"--temperatures must be distinct, got \[1.0, 1.0\]"),
                                       ((-1.0,), (3,), "--temperatures must be finite and >= 0, got -1.0"),
                                       ((5e-5,), (3,), r"temperature must be 0 \(greedy\) or a finite number >= "),
                                       ((1.0,), (-1,), r"seed must be an int in \[0, 2\*\*64\), got -1")):
        for module, call in ((bench_sampling, lambda: bench_sampling.bench_sampling(
                _preset(NATIVE), None, torch.device("cpu"), 0, (64,), temperatures, seeds, None, "c")),
                             (bench_positions, lambda: bench_positions.bench_positions(
                _preset(NATIVE), None, torch.device("cpu"), 0, (64,), (WIN,), temperatures, seeds, None, "c"))):
            monkeypatch.setattr(module, "bench_setup", lambda *a: pytest.fail("the bench started"))
            with pytest.raises(ValueError, match=match):
                call()


def _bench(monkeypatch, module, call) -> tuple[tuple[int, int, int | None], dict]:
    """A bench run with its setup and driver faked: the progress bar's units a context (``run_contexts``'
    ``units``), the ticks its rows make and the page size its prefills are given; and the result it
    starts (its header faked empty)."""
    seen = []

    def run_contexts(name, setup, preset, device, contexts, units, rows, result, t_start, progress, log, on_context,
                     page_size=None):
        ticks = []
        for row in rows(PROMPT, "pre", ticks.append):
            pass
        seen.append((units, len(ticks), page_size))
        return result

    monkeypatch.setattr(module, "bench_setup", lambda *a: SimpleNamespace(header={}, target=None, head=None))
    monkeypatch.setattr(module, "run_contexts", run_contexts)
    result = call()
    (got,) = seen
    return got, result


def test_every_benchs_bar_counts_the_ticks_of_its_rows_and_its_result_says_its_options(monkeypatch):
    """A context's units (the bar's total, less its prefill) are the ticks its rows make: decode a row a
    loop (every loop run: CUDA faked, the generators are); depth every round's dense run and (arm,
    policy); sampling and positions every seed's run a temperature (one seed at temperature 0 for
    positions). Decode's ``page_size`` reaches the prefills. Each result's fields beside its rows, literal."""
    cpu = torch.device("cpu")
    _decode_fakes(monkeypatch)
    got, result = _bench(monkeypatch, bench_decode, lambda: bench_decode.bench_decode(
        _preset(NATIVE, WIN), None, torch.device("cuda"), 0, (10,), ("eager", "graph"), None, "c", page_size=4))
    assert got == (2, 2, 4) and result == {
        "lossless": "asserted: every arm's tokens equal the same loop's dense greedy tokens (torch.equal)",
        "draft_caches": ["full"], "page_size": 4, "rows": [], "complete": False}
    _depth_fakes(monkeypatch)
    got, result = _bench(monkeypatch, bench_depth, lambda: bench_depth.bench_depth(
        _preset(WIN, NATIVE, depth=1), None, cpu, 0, (10,), (1,), 2, None, "c"))
    assert got == (14, 14, None) and result == {
        "depths": [1], "policies": ["fixed-1", "adaptive", "adaptive-per-depth"], "rounds": 2, "loop": "eager",
        "tpot": "measured time per token kept over the whole decode, prefill excluded: (sum of the steps' draft and "
                "verify seconds) / committed tokens",
        "lossless": "asserted: every (arm, policy)'s tokens equal dense greedy decoding's (torch.equal)",
        "rows": [], "complete": False}
    _sampling_fakes(monkeypatch, bench_sampling)
    got, result = _bench(monkeypatch, bench_sampling, lambda: bench_sampling.bench_sampling(
        _preset(WIN, NATIVE, depth=2), None, cpu, 0, (10,), (0.7, 1.0), (3, 5), None, "c"))
    assert got == (20, 20, None) and result == {
        "sample_seeds": [3, 5], "temperatures": [0.7, 1.0], "methods": ["rejection", "gumbel"],
        "lossless": "asserted: every gumbel arm's tokens equal dense sampling's with the same seed (torch.equal); "
                    "rejection arms are equal to it in distribution", "rows": [], "complete": False}
    _sampling_fakes(monkeypatch, bench_positions)
    got, result = _bench(monkeypatch, bench_positions, lambda: bench_positions.bench_positions(
        _preset(NATIVE), None, cpu, 0, (10,), (KeySetConfig(4, 9), WIN), (0.0, 1.0), (3, 5), None, "c"))
    assert got == (15, 15, None) and result == {
        "keysets": [{"n_sink": 4, "window": 9}, {"n_sink": 4, "window": 16}], "sample_seeds": [3, 5],
        "temperatures": [0.0, 1.0], "positions": ["absolute", "reindexed"], "train_seq_len": 64,
        "lossless": "asserted: every run's tokens equal dense decoding's with the same seed (torch.equal); "
                    "gumbel verification, greedy at temperature 0", "rows": [], "complete": False}


def test_positions_refuses_a_native_or_gated_key_set(monkeypatch):
    monkeypatch.setattr(bench_positions, "bench_setup", lambda *a: pytest.fail("the bench started"))
    for keysets, match in (((), "needs windowed key sets"), ((WIN, NATIVE), "needs windowed key sets"),
                           ((KeySetConfig(4, 16, gate=100),), "takes ungated key sets")):
        with pytest.raises(ValueError, match=match):
            bench_positions.bench_positions(_preset(NATIVE), None, torch.device("cpu"), 0, (64,), keysets, (1.0,), (3,),
                                            None, "c")


def test_positions_defaults_to_the_presets_windowed_key_sets(monkeypatch, capsys, tmp_path):
    seen = []

    def stop(preset, dataset_dir, device, seed, contexts, keysets, *a, **k):
        seen.append(keysets)
        raise ValueError("stop here")

    monkeypatch.setattr(bench_positions, "bench_positions", stop)
    assert main(["bench", "positions", "--preset", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path / "cache"),
                 "--out", str(tmp_path / "p.json")]) == 2
    assert seen == [(WIN,)] and "stop here" in capsys.readouterr().err


@pytest.mark.parametrize("bench", ["decode", "depth", "sampling", "positions"])
def test_each_bench_command_writes_the_partial_metrics_and_hears_no_progress(bench, monkeypatch, capsys, tmp_path):
    """The command hands its bench a writer of the partial file (a bench stopped after a row keeps it) and
    ``progress=False`` under ``--no-progress`` (True without it)."""
    module, seen = getattr(wmtp, f"bench_{bench}"), []

    def stop(*a, progress, log, on_context, **k):
        seen.append(progress)
        on_context({"rows": ["a row"], "complete": False})
        raise ValueError("stop here")

    monkeypatch.setattr(module, f"bench_{bench}", stop)
    out = tmp_path / "b.json"
    args = ["bench", bench, "--preset", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out)]
    assert main(args) == 2 and main(args + ["--no-progress"]) == 2 and seen == [True, False]
    assert json.loads(out.read_text()) == {"rows": ["a row"], "complete": False}
    assert capsys.readouterr().err.count("stop here") == 2


def test_the_last_draft_query_sits_at_prompt_plus_new_tokens_plus_depth_minus_4(monkeypatch):
    """What ``evicts`` rests on: a step whose last committed token is at ``c`` drafts from the head at
    ``c - 1`` (``h_{c-1}`` and token ``c``) to ``c + depth - 2``; the last step starts at ``c <= P + n - 2``.
    Two new tokens: the first from the prefill at ``c = P``, the one step from there: 10 + 2 + 3 - 4 = 11."""
    target, head = wmtp.build_models("tiny", seed=0)
    seen, forward = [], MTPHead.forward

    def recording(self, hidden, next_ids, pos=None, *a, **k):
        seen.append(int(pos.max()))
        return forward(self, hidden, next_ids, pos, *a, **k)

    monkeypatch.setattr(MTPHead, "forward", recording)
    speculative_sample(target, head, torch.arange(10), 2, 3, 4, 9, temperature=0.0, method="gumbel")
    assert max(seen) == 11
