"""The figures of ``wmtp bench batch`` (wmtp/bench_batch.py) from fake generators with literal times:
each method's waves and their timeline (a later wave's prompts wait for the waves before it), the
refilling batches' arguments, the ALs; a cell's medians over its timed rounds after the untimed one,
per-token times, speedups ``old / new - 1`` and the reduction ``1 - new / old`` against the dense
batch, its table as printed; a run with an output missing refused; the largest cell and a mixed
cell of one row of several prompts taken. No model decodes and nothing is timed
(tests/test_bench_batch.py runs the bench)."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import table_cells

import wmtp
from wmtp import bench_batch, bench_common
from wmtp.bench_batch import run_cell

TINY = wmtp.get_preset("tiny")
PRESET = dataclasses.replace(TINY, spec=dataclasses.replace(TINY.spec, new_tokens=5))


def test_each_methods_waves_follow_one_another(monkeypatch):
    """4 prompts in rows of 2: two waves. The dense batch's prefills 0.5 then 0.25 s, steps 1 + 2 then
    4 s; a speculative wave's prefill 0.5 then 0.25 s, steps 1.5 then 2 s, its rows' first tokens and
    ends from its own start."""
    dense_waves = iter([(0.5, [1.0, 2.0]), (0.25, [4.0])])

    def dense(target, wave, n, step_times, prefill_times):
        pre, steps = next(dense_waves)
        prefill_times.append(pre)
        step_times += steps
        return list(wave)

    spec_waves = [dict(draft_times_s=[0.5], verify_times_s=[1.0], prefill_times_s=[0.5], first_token_s=[0.5, 0.5],
                       done_s=[1.5, 2.0], committed=[4, 6], live_steps=[2, 3], steps=3),
                  dict(draft_times_s=[1.0], verify_times_s=[1.0], prefill_times_s=[0.25], first_token_s=[0.25, 0.25],
                       done_s=[2.0, 2.25], committed=[3, 5], live_steps=[3, 1], steps=3)]
    calls = []

    def own(target, head, wave, n, depth, n_sink, window, **kw):
        calls.append((len(wave), window, kw))
        return list(wave), SimpleNamespace(**spec_waves[(len(calls) - 1) % 2])

    def lockstep(target, head, wave, n, depth, n_sink, window):
        w = spec_waves[len(calls) % 2]
        calls.append((tuple(wave.shape), window))
        return list(wave), SimpleNamespace(**{**w, "committed": sum(w["committed"])})

    monkeypatch.setattr(bench_batch, "batched_greedy_generate", dense)
    monkeypatch.setattr(bench_batch, "batched_speculative_generate", own)
    monkeypatch.setattr(bench_batch, "lockstep_generate", lockstep)
    runs = bench_batch.methods(PRESET, "eager", True, 2, refill=True)
    assert list(runs) == ["dense batch"] + [f"{how} {ks}" for ks in ("native", "sink4+win16")
                                            for how in ("lockstep", "own positions", "refill", "refill staged")]
    prompts = [torch.arange(4) + i for i in range(4)]
    outs, seconds, counts = runs["dense batch"](None, None, prompts)
    assert outs == prompts and seconds == 7.0
    assert counts == {"mean_accept_length": None, "steps": 3, "prefill_seconds": 0.75, "prefills": 2,
                      "first_token_s": [0.5, 0.5, 3.75, 3.75], "done_s": [3.5, 3.5, 7.75, 7.75]}
    outs, seconds, counts = runs["own positions sink4+win16"](None, None, prompts)
    assert outs == prompts and seconds == 3.5 and calls == [(2, 16, {}), (2, 16, {})]
    assert counts == {"mean_accept_length": 2.0, "steps": 6, "row_accept_lengths": [2.0, 2.0, 1.0, 5.0],
                      "prefill_seconds": 0.75, "prefills": 2, "first_token_s": [0.5, 0.5, 2.25, 2.25],
                      "done_s": [1.5, 2.0, 4.0, 4.25]}  # the second wave starts at 1.5 + 0.5 s
    calls.clear()
    outs, seconds, counts = runs["lockstep native"](None, None, prompts)
    assert seconds == 3.5 and calls == [((2, 4), None), ((2, 4), None)]
    assert (counts["mean_accept_length"], counts["steps"]) == (3.0, 6)  # 18 tokens in 6 steps
    assert (counts["first_token_s"], counts["done_s"]) == ([0.5, 0.5, 2.25, 2.25], [2.0, 2.0, 4.25, 4.25])
    calls.clear()
    runs["refill native"](None, None, prompts)
    runs["refill staged native"](None, None, prompts)
    assert calls == [(4, None, {"max_batch": 2, "prefill_batch": 1}), (4, None, {"max_batch": 2, "prefill_batch": 2})]


def _fake_methods(monkeypatch, short=False):
    """Two methods of 2 prompts each, 4 rounds (the first the untimed warm-up, 100 s): the dense batch's
    decode seconds 1, 2, 6 (median 2, mean 3), each round's prefills 1 s, first tokens 0.5 and 1 s, done
    at 3 and 2 s; a speculative batch's 0.5, 1, 0.25 s, done at 1 and 1.25 s (``short``: one output)."""
    seen = []

    def run_of(seconds, done):
        it = iter(seconds)

        def run(target, head, prompts):
            s = next(it)
            counts = {"mean_accept_length": None, "steps": 4, "prefill_seconds": 100.0 if s == 100 else 1.0,
                      "prefills": 1, "first_token_s": [0.5, 1.0], "done_s": done}
            return list(prompts), s, counts
        return run

    def methods(preset, loop, equal, rows, refill):
        seen.append((loop, equal, rows, refill))
        spec = run_of([100.0, 0.5, 1.0, 0.25], [1.0, 1.25])
        return {"dense batch": run_of([100.0, 1.0, 2.0, 6.0], [3.0, 2.0]),
                "own positions native": (lambda *a: (lambda o, s, c: (o[:1], s, c))(*spec(*a))) if short else spec}

    monkeypatch.setattr(bench_batch, "methods", methods)
    return seen


def test_a_cell_takes_the_medians_of_its_timed_rounds(monkeypatch):
    seen = _fake_methods(monkeypatch)
    preset = PRESET
    prompts = [torch.arange(6), torch.arange(6)]
    cell = run_cell(None, None, prompts, preset, "eager", 3, True)
    assert seen == [("eager", True, 2, False)]  # one wave of both prompts: no refill
    keys = ("seconds_rounds", "prefill_seconds_rounds", "us_per_token_per_row", "us_per_token_per_row_with_prefill",
            "median_first_token_ms", "median_done_ms", "last_done_ms", "speedup_vs_dense_batch",
            "speedup_with_prefill_vs_dense_batch", "median_done_reduction_vs_dense_batch", "steps", "prefills")
    dense, own = ([cell[name][k] for k in keys] for name in ("dense batch", "own positions native"))
    # seconds / (2 prompts x 4 tokens after the prefill's); with the prefills / (2 x 5 tokens)
    assert dense == [[1.0, 2.0, 6.0], [1.0] * 3, 250000.0, 300000.0, 750.0, 2500.0, 3000.0, 0.0, 0.0, 0.0, 4, 1]
    assert own[:2] == [[0.5, 1.0, 0.25], [1.0] * 3]
    assert own[2:] == pytest.approx([62500.0, 150000.0, 750.0, 1125.0, 1250.0, 3.0, 1.0, 1 - 1125 / 2500, 4, 1])
    result = {"environment": {"device": "cpu"}, "decode_dtype": "float64", "config": {"spec": {"depth": 3}},
              "rows": [{"context": 6, "lengths": "equal", "batch": 2, "loop": "eager", "methods": cell}]}
    assert table_cells(bench_batch.table(result)) == [
        ["6", "equal", "2", "eager", "dense batch", "1", "4", "250000.0", "", "300000.0", "", "750.0", "2500.0", ""],
        ["", "", "", "", "own positions native", "1", "4", "62500.0", "+300%", "150000.0", "+100%", "750.0", "1125.0",
         "+55%"]]
    assert run_cell(None, None, prompts, preset, "eager", 1, True, rows=1)["dense batch"]["seconds_rounds"] == [1.0]
    assert seen[-1] == ("eager", True, 1, True)  # 2 prompts in 1 row: refilled
    _fake_methods(monkeypatch, short=True)
    with pytest.raises(AssertionError, match="own positions native .* not token-equal to the dense batch"):
        run_cell(None, None, prompts, preset, "eager", 1, True)


def test_options_take_the_largest_cell_and_a_mixed_row_of_several_prompts(monkeypatch):
    """A cell of exactly MAX_PROMPTS prompts runs; one prompt a row of mixed lengths runs with more
    prompts a row (its waves hold several), at the capacity of the graph loop's caches."""
    preset, cpu = wmtp.get_preset("tiny"), torch.device("cpu")
    bench_batch.check_options(preset, (64,), ("equal",), ("eager",), 1, cpu, bench_batch.MAX_PROMPTS // 64)
    bench_batch.check_options(preset, (1,), ("mixed",), ("eager",), 1, cpu, 3)
    with pytest.raises(ValueError, match="at most 4096; got 64 x 65"):
        bench_batch.check_options(preset, (64,), ("equal",), ("eager",), 1, cpu, 65)
    setup = bench_common.BenchSetup("t", "h", {}, {"kind": "bench-batch"}, torch.arange(100))
    monkeypatch.setattr(bench_batch, "bench_setup", lambda *a: setup)
    capacity = []
    monkeypatch.setattr(bench_batch, "with_capacity", lambda t, h, n: capacity.append(n) or (t, h))
    monkeypatch.setattr(bench_batch, "run_cell", lambda t, h, prompts, *a: {"n": len(prompts)})
    m = bench_batch.bench_batch(preset, None, cpu, 0, (16,), (1,), ("equal", "mixed"), ("eager",), 1, None, "c",
                                prompts_per_row=3)
    assert capacity == [16 + 16 + 2 * 3 + 2] and m["complete"] and m["prompts_per_row"] == 3
    assert [(r["lengths"], r["batch"], r["prompts"], r["prompt_lengths"], r["methods"]) for r in m["rows"]] == [
        ("equal", 1, 3, [16] * 3, {"n": 3}), ("mixed", 1, 3, [16, 14, 11], {"n": 3})]
