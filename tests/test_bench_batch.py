"""``wmtp bench batch`` (wmtp/bench_batch.py): the batches' prompts, literal; a tiny end-to-end run
whose every cell was asserted token-equal to the dense batch; the assertion itself; bad options
(exit 2, one line, before any work)."""

import json
import statistics

import pytest
import torch

import wmtp
from wmtp import bench_batch
from wmtp.bench_batch import batch_prompts, prompt_lengths, run_cell
from wmtp.cli import main


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_prompt_lengths():
    assert prompt_lengths(1024, 4, "equal") == [1024] * 4
    assert prompt_lengths(1024, 4, "mixed") == [1024, 896, 768, 640]
    assert prompt_lengths(9, 3, "mixed") == [9, 8, 6]
    assert prompt_lengths(9, 1, "mixed") == [9]


def test_batch_prompts_are_different_text():
    text = torch.arange(100)
    assert [p.tolist() for p in batch_prompts(text, 10, 3, "equal")] == [
        list(range(90, 100)), list(range(80, 90)), list(range(70, 80))]
    assert [p.tolist() for p in batch_prompts(text, 10, 3, "mixed")] == [
        list(range(90, 100)), list(range(81, 90)), list(range(73, 80))]
    assert [p.tolist() for p in batch_prompts(torch.arange(14), 10, 3, "equal")] == [  # stride (14 - 10) // 2
        list(range(4, 14)), list(range(2, 12)), list(range(0, 10))]
    with pytest.raises(ValueError, match="context 101 needs more: pass --contexts of at most 100 tokens"):
        batch_prompts(text, 101, 1, "equal")


def assert_times(x: dict, dense: dict, N: int, new: int) -> None:
    """A method's times with the prefills: a token's, and its prompts' latencies, from its rounds."""
    total = [s + p for s, p in zip(x["seconds_rounds"], x["prefill_seconds_rounds"])]
    assert min(x["prefill_seconds_rounds"]) > 0
    assert x["us_per_token_per_row_with_prefill"] == pytest.approx(statistics.median(total) / (N * new) * 1e6)
    assert x["speedup_with_prefill_vs_dense_batch"] == pytest.approx(
        dense["us_per_token_per_row_with_prefill"] / x["us_per_token_per_row_with_prefill"] - 1)
    assert x["median_done_reduction_vs_dense_batch"] == pytest.approx(1 - x["median_done_ms"] / dense["median_done_ms"])
    assert 0 < x["median_first_token_ms"] < x["median_done_ms"] <= x["last_done_ms"]
    assert x["last_done_ms"] == pytest.approx(statistics.median(total) * 1e3)  # the last prompt ends the run


def test_bench_batch_writes_every_cell(capsys, tmp_path):
    out = tmp_path / "b.json"
    code, stdout, err = _run(capsys, ["bench", "batch", "--preset", "tiny", "--device", "cpu", "--seed", "0",
                                      "--contexts", "48", "--batch-sizes", "1", "3", "--new-tokens", "10",
                                      "--rounds", "2", "--cache-dir", str(tmp_path / "cache"), "--no-progress",
                                      "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["kind"] == "bench-batch" and m["complete"] and m["decode_dtype"] == "float64" and "lossless" in m
    assert m["command"].startswith("wmtp bench batch") and m["rounds"] == 2 and m["loops"] == ["eager"]
    assert m["warmup_rounds"] == 1
    assert [(r["context"], r["lengths"], r["batch"]) for r in m["rows"]] == [
        (48, "equal", 1), (48, "equal", 3), (48, "mixed", 3)]  # no mixed batch of one row
    assert [r["prompt_lengths"] for r in m["rows"]] == [[48], [48] * 3, [48, 40, 32]]
    arms = ["native", "sink4+win16"]
    for r in m["rows"]:
        names = ["dense batch"] + [f"{how} {a}" for a in arms
                                   for how in (("lockstep", "own positions") if r["lengths"] == "equal"
                                               else ("own positions",))]
        assert list(r["methods"]) == names and r["new_tokens"] == 10
        for name, x in r["methods"].items():
            assert len(x["seconds_rounds"]) == 2 and min(x["seconds_rounds"]) > 0
            assert x["us_per_token_per_row"] == pytest.approx(sum(x["seconds_rounds"]) / 2 / (r["batch"] * 9) * 1e6)
            base = r["methods"]["dense batch"]["us_per_token_per_row"]
            assert x["speedup_vs_dense_batch"] == pytest.approx(base / x["us_per_token_per_row"] - 1)
            assert (x["mean_accept_length"] is None) == (name == "dense batch")
            assert name == "dense batch" or 1 <= x["mean_accept_length"] <= 1 + m["config"]["spec"]["depth"]
            own = x.get("row_accept_lengths")
            assert (own is not None) == name.startswith("own positions") and x["steps"] > 0
            assert name != "dense batch" or x["steps"] == 9
            if own is not None:  # the batch's AL lies between its rows' own; a step commits at most depth + 1
                assert len(own) == r["batch"] and min(own) - 1e-9 <= x["mean_accept_length"] <= max(own) + 1e-9
                assert x["steps"] >= 9 / (1 + m["config"]["spec"]["depth"])
            assert_times(x, r["methods"]["dense batch"], r["batch"], 10)
        if r["batch"] == 1:  # one row: lockstep's least match is the row's own
            for a in arms:
                assert r["methods"][f"lockstep {a}"]["mean_accept_length"] == \
                    r["methods"][f"own positions {a}"]["mean_accept_length"]
    assert "+prefills speedup" in stdout and out.with_suffix(".png").stat().st_size > 0
    assert not list(tmp_path.glob("*.tmp"))


def test_more_prompts_than_rows_run_in_waves_and_refilled(capsys, tmp_path):
    """``--prompts-per-row 3``: 6 prompts in 2 rows; every method in 3 waves of 2, and a refilling
    batch of 2 rows, which never takes more steps than the waves of its key set (here, with the tiny
    models' even acceptance, as many; tests/test_refill.py shows it taking fewer with scripted ones)."""
    out = tmp_path / "r.json"
    code, stdout, err = _run(capsys, ["bench", "batch", "--preset", "tiny", "--device", "cpu", "--seed", "0",
                                      "--contexts", "40", "--batch-sizes", "2", "--prompts-per-row", "3",
                                      "--lengths", "mixed", "--new-tokens", "8", "--rounds", "1", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["prompts_per_row"] == 3 and len(m["rows"]) == 1
    r = m["rows"][0]
    assert (r["batch"], r["prompts"]) == (2, 6) and r["prompt_lengths"] == [40 - i * 40 // 12 for i in range(6)]
    arms = ["native", "sink4+win16"]
    assert list(r["methods"]) == ["dense batch"] + [f"{how} {a}" for a in arms
                                                     for how in ("own positions", "refill", "refill staged")]
    assert r["methods"]["dense batch"]["steps"] == 3 * 7  # 3 waves of 7 steps
    for a in arms:
        waves, refill, staged = (r["methods"][f"{how} {a}"] for how in ("own positions", "refill", "refill staged"))
        assert (staged["steps"], staged["row_accept_lengths"]) == (refill["steps"], refill["row_accept_lengths"])
        assert staged["prefills"] == refill["prefills"]  # the first rows' prefill, then every admission
        assert len(waves["row_accept_lengths"]) == len(refill["row_accept_lengths"]) == 6
        assert waves["row_accept_lengths"] == refill["row_accept_lengths"]  # a prompt drafts as it would alone
        assert refill["steps"] <= waves["steps"]
        assert refill["us_per_token_per_row"] == pytest.approx(refill["seconds_rounds"][0] / (6 * 7) * 1e6)
        assert (waves["prefills"], refill["prefills"]) == (3, 5)  # a wave's each; the first rows', then 4 alone
        for x in (waves, refill, staged):
            assert_times(x, r["methods"]["dense batch"], 6, 8)
    assert r["methods"]["dense batch"]["prefills"] == 3
    assert "refill sink4+win16" in stdout


def test_a_run_that_is_not_lossless_fails_the_cell(monkeypatch):
    target, head = wmtp.build_models("tiny", seed=0)
    target, head = target.double(), head.double()
    preset = wmtp.get_preset("tiny")
    prompts = [torch.arange(12) % 50, torch.arange(12) % 7]
    assert run_cell(target, head, prompts, preset, "eager", 1, True)["dense batch"]["speedup_vs_dense_batch"] == 0

    def wrong(*args, **kwargs):
        outs, stats = wmtp.batched_speculative_generate(*args, **kwargs)
        outs[1] = outs[1].clone()
        outs[1][-1] += 1
        return outs, stats

    monkeypatch.setattr(bench_batch, "batched_speculative_generate", wrong)
    with pytest.raises(AssertionError, match="own positions native .* not token-equal"):
        run_cell(target, head, prompts, preset, "eager", 1, True)


def test_keysets_help_offers_no_gate(capsys):
    """bench batch refuses a gate (below), so its help offered SINK:WINDOW[@GATE] and 8:64@8192 for nothing;
    the benches that take one still offer it."""
    code, out, _ = _run(capsys, ["bench", "batch", "--help"])
    assert code == 0 and "--keysets SINK:WINDOW [SINK:WINDOW ...]" in out and "@GATE:" in out
    assert "SINK:WINDOW[@GATE]" not in out and "8:64@8192" not in out
    code, out, _ = _run(capsys, ["bench", "decode", "--help"])
    assert code == 0 and "--keysets SINK:WINDOW[@GATE]" in out and "8:64@8192" in out


@pytest.mark.parametrize("bad,match", [(["--batch-sizes", "0"], "--batch-sizes must be integers >= 1"),
                                       (["--lengths", "mixed", "--batch-sizes", "1"], "needs more than one prompt"),
                                       (["--prompts-per-row", "0"], "--prompts-per-row must be an integer >= 1"),
                                       (["--loops", "graph"], "graph loop captures CUDA graphs"),
                                       (["--rounds", "0"], "--rounds must be at least 1"),
                                       (["--keysets", "8:64@100"], "no gated draft"),
                                       (["--contexts", "1"], "at least 2")])
def test_bad_input_exits_2_before_any_work(capsys, tmp_path, bad, match):
    out = tmp_path / "b.json"
    code, stdout, err = _run(capsys, ["bench", "batch", "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out), *bad])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("wmtp bench batch: error:") and match in err, err
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the CUDA-graph loop")
def test_bench_batch_on_cuda_in_both_loops(capsys, tmp_path, monkeypatch):
    """Both loops' rows; the graph loop's dense batch, lockstep (where it runs) and own-position runs,
    refill's among them, in CUDA graphs."""
    from cli_helpers import record_captures

    captured = record_captures(monkeypatch)
    out = tmp_path / "g.json"
    code, _, err = _run(capsys, ["bench", "batch", "--preset", "tiny", "--device", "cuda", "--contexts", "64", "512",
                                 "--batch-sizes", "1", "4", "--prompts-per-row", "2", "--new-tokens", "24", "--rounds",
                                 "1", "--loops", "eager",
                                 "graph", "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["decode_dtype"] == "float32" and m["complete"] and len(m["rows"]) == 2 * 4 * 2
    assert {r["loop"] for r in m["rows"]} == {"eager", "graph"}
    assert all("refill native" in r["methods"] and r["prompts"] == 2 * r["batch"] for r in m["rows"])
    assert all(x["us_per_token_per_row"] > 0 for r in m["rows"] for x in r["methods"].values())
    lockstep = any(name.startswith("lockstep") for r in m["rows"] for name in r["methods"])  # prompts of one length
    assert set(captured) == {"static_batched_greedy_generate", "static_batched_speculative_generate",
                             *(["static_lockstep_generate"] if lockstep else [])}
