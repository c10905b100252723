"""``wmtp bench sampling`` and ``wmtp bench positions``: acceptance under rejection and Gumbel sampling
for every arm, temperature and seed; absolute against re-indexed draft positions for an evicting and
a non-evicting key set; bad temperatures, seeds and key sets before any work."""

import json

import pytest
from cli_helpers import record_prefills
from cli_helpers import run_cli as _run


def test_bench_sampling_writes_every_arm_and_method(capsys, wikitext_dir, tmp_path, monkeypatch):
    prefills, starts = record_prefills(monkeypatch)  # every run must start from its context's one prefill
    out = tmp_path / "s.json"
    code, stdout, err = _run(capsys, ["bench", "sampling", "--preset", "tiny", "--dataset-dir", str(wikitext_dir),
                                      "--device", "cpu", "--seed", "0", "--contexts", "64", "300", "--new-tokens", "9",
                                      "--temperatures", "0.7", "1.5", "--sample-seeds", "3", "5", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0, err
    assert [p.prompt.numel() for p in prefills] == [64, 300]
    assert starts == [prefills[0]] * 20 + [prefills[1]] * 20  # per temperature and seed: dense, 2 arms x 2 methods
    m = json.loads(out.read_text())
    assert m["kind"] == "bench-sampling" and m["complete"] and m["decode_dtype"] == "float64"
    assert m["sample_seeds"] == [3, 5] and m["config"]["preset"] == "tiny"
    assert m["command"].startswith("wmtp bench sampling")
    assert not m["checkpoint"]["loaded"] and len(m["checkpoint"]["weights_sha256"]) == 16  # the weights trained
    assert [(r["context"], r["temperature"]) for r in m["rows"]] == [(64, 0.7), (64, 1.5), (300, 0.7), (300, 1.5)]
    for r in m["rows"]:
        assert r["new_tokens"] == 9 and list(r["arms"]) == ["native", "sink4+win16"] and r["prefill_s"] > 0
        for label, arm in r["arms"].items():
            assert list(arm["methods"]) == ["rejection", "gumbel"]
            assert arm["methods"]["gumbel"]["lossless"] == "token-equal to dense sampling"
            for a in arm["methods"].values():
                assert 0 <= a["acceptance_rate"] <= 1 and 1 <= a["mean_accept_length"] <= 4  # depth 3
                assert sum(a["accept_length_histogram"]) == a["steps"] > 0 and a["proposed"] == 3 * a["steps"]
                assert a["accepted"] == round(a["acceptance_rate"] * a["proposed"])
                per_seed = a["mean_accept_length_per_seed"]  # pooled AL lies between the seeds'
                assert len(per_seed) == 2 and min(per_seed) - 1e-9 <= a["mean_accept_length"] <= max(per_seed) + 1e-9
                assert len(a["per_position_acceptance"]) == 3
                assert (a["mean_accept_length_change_vs_native"] is None) == (label == "native")
    assert "AL change vs native" in stdout and not list(tmp_path.glob("*.tmp"))
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn by plots.plot_acceptance


@pytest.mark.parametrize("bad,match", [(["--temperatures", "-0.5"], "--temperatures must be finite and >= 0"),
                                       (["--temperatures", "0.7", "nan"], "--temperatures must be finite"),
                                       (["--temperatures=inf"], "--temperatures must be finite"),
                                       (["--sample-seeds", "-1"], "argument --sample-seeds: must be an integer"),
                                       (["--sample-seeds", "2", "2"], "--sample-seeds must be distinct"),
                                       (["--temperatures", "1.0", "1.0"], "--temperatures must be distinct"),
                                       (["--temperatures", "0.7", "0.70"], "--temperatures must be distinct")])
def test_bench_sampling_bad_temperature_exits_2_before_any_work(capsys, tmp_path, bad, match, monkeypatch):
    """A repeated temperature decoded its rows twice (every other list option of a bench is refused repeated)."""
    monkeypatch.setattr("wmtp.bench_sampling.bench_setup", lambda *a, **k: pytest.fail("the bench started"))
    out = tmp_path / "s.json"
    code, stdout, err = _run(capsys, ["bench", "sampling", "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out), *bad])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("wmtp bench sampling: error:") and match in err, err
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("bench", ["sampling", "positions"])
@pytest.mark.parametrize("seed", ["-1", str(2**64), "x"])
def test_a_bad_sample_seed_names_the_flag(capsys, tmp_path, bench, seed):
    """``--sample-seeds`` takes ``--seed``'s type: its error named a ``seed`` the command has no option for."""
    code, _, err = _run(capsys, ["bench", bench, "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                 str(tmp_path / "cache"), "--out", str(tmp_path / "s.json"),
                                 "--sample-seeds", "3", seed])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.strip() == (f"wmtp bench {bench}: error: argument --sample-seeds: must be an integer from 0 to "
                           f"2**64 - 1, got '{seed}'")
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "cache").exists()


def test_bench_positions_pairs_absolute_and_reindexed(capsys, wikitext_dir, tmp_path, monkeypatch):
    prefills, starts = record_prefills(monkeypatch)  # every run must start from its context's one prefill
    out = tmp_path / "r.json"
    code, stdout, err = _run(capsys, ["bench", "positions", "--preset", "tiny", "--dataset-dir", str(wikitext_dir),
                                      "--device", "cpu", "--seed", "0", "--contexts", "64", "300", "--new-tokens", "9",
                                      "--keysets", "2:8", "4:512", "--temperatures", "0", "1.0", "--sample-seeds",
                                      "3", "5", "--cache-dir", str(tmp_path / "cache"), "--no-progress",
                                      "--out", str(out)])
    assert code == 0, err
    assert [p.prompt.numel() for p in prefills] == [64, 300]
    assert starts == [prefills[0]] * 15 + [prefills[1]] * 15  # greedy once, then 2 seeds: dense + 2 sets x 2 positions
    m = json.loads(out.read_text())
    assert m["kind"] == "bench-positions" and m["complete"] and m["positions"] == ["absolute", "reindexed"]
    assert m["keysets"] == [{"n_sink": 2, "window": 8}, {"n_sink": 4, "window": 512}] and m["train_seq_len"] == 64
    assert [(r["context"], r["temperature"], r["sample_seeds"]) for r in m["rows"]] == [
        (64, 0.0, [3]), (64, 1.0, [3, 5]), (300, 0.0, [3]), (300, 1.0, [3, 5])]
    for r in m["rows"]:
        evicting, kept = r["arms"]["sink2+win8"], r["arms"]["sink4+win512"]
        assert evicting["evicts"] and not kept["evicts"]
        assert kept["positions"]["absolute"] == kept["positions"]["reindexed"]  # nothing evicted: the same drafts
        for arm in (evicting, kept):
            a, b = (arm["positions"][p] for p in ("absolute", "reindexed"))
            assert arm["reindexed_al_change"] == pytest.approx(b["mean_accept_length"] / a["mean_accept_length"] - 1)
            for s in (a, b):
                assert sum(s["accept_length_histogram"]) == s["steps"] > 0 and s["proposed"] == 3 * s["steps"]
                assert len(s["mean_accept_length_per_seed"]) == len(r["sample_seeds"])
    assert "AL re-indexed" in stdout and not list(tmp_path.glob("*.tmp"))
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn by plots.plot_acceptance
    for bad, match in ((["--keysets", "4"], "is not SINK:WINDOW"), (["--temperatures", "-1"], "--temperatures"),
                       (["--keysets", "4:16@100"], "ungated key sets"), (["--temperatures", "0", "0"], "distinct")):
        code, _, err = _run(capsys, ["bench", "positions", "--preset", "tiny", "--device", "cpu", "--no-progress",
                                     "--cache-dir", str(tmp_path / "none"), "--out", str(tmp_path / "bad.json"), *bad])
        assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, err
        assert not (tmp_path / "bad.json").exists() and not (tmp_path / "none").exists()
