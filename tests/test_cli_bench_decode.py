"""``wmtp bench decode``: lossless rows for every arm on the CPU, each run starting from its context's
one prefill; the ring draft cache's bytes and a paged prefill's identical runs; gated key sets; bad
input (one line, exit 2); and, with CUDA, both the eager and the CUDA-graph loop."""

import json

import pytest
import torch
from cli_helpers import record_captures, record_prefills
from cli_helpers import run_cli as _run


def test_bench_decode_writes_lossless_rows(capsys, wikitext_dir, tmp_path, monkeypatch):
    prefills, starts = record_prefills(monkeypatch)  # every run must start from its context's one prefill
    out = tmp_path / "d.json"
    args = ["bench", "decode", "--preset", "tiny", "--dataset-dir", str(wikitext_dir), "--device", "cpu", "--seed",
            "0", "--contexts", "64", "300", "--new-tokens", "9", "--cache-dir", str(tmp_path / "cache"),
            "--no-progress"]
    code, stdout, err = _run(capsys, args + ["--draft-caches", "full", "ring", "--out", str(out)])
    assert code == 0, err
    assert len(prefills) == 2 and [p.prompt.numel() for p in prefills] == [64, 300]
    assert starts == [prefills[0]] * 4 + [prefills[1]] * 4  # dense and three arms a context, eager loop
    m = json.loads(out.read_text())
    assert m["kind"] == "bench-decode" and m["complete"] and m["decode_dtype"] == "float64"
    assert m["config"]["kv_capacity"] == 300 + 9 + 3  # the longest context, the new tokens, the depth
    assert [(r["context"], r["loop"]) for r in m["rows"]] == [(64, "eager"), (300, "eager")]
    assert m["draft_caches"] == ["full", "ring"]
    for r in m["rows"]:
        assert r["new_tokens"] == 9 and list(r["arms"]) == ["native", "sink4+win16", "sink4+win16 ring"]
        assert r["prefill_s"] > 0
        full, ring = r["arms"]["sink4+win16"], r["arms"]["sink4+win16 ring"]
        assert (full["draft_cache"], ring["draft_cache"]) == ("full", "ring")
        assert ring["mean_accept_length"] == full["mean_accept_length"] and ring["steps"] == full["steps"]
        positions = r["context"] + 9 + 3  # the prefill's cache: the context, the new tokens, the depth
        assert full["draft_kv_bytes"] == 2 * 2 * positions * 16 * 8  # K, V; 2 kv heads; a row a position; D 16; fp64
        assert ring["draft_kv_bytes"] == 2 * 2 * min(positions, 4 + 16 + 3) * 16 * 8  # slots: n_sink + window + depth
        for arm in r["arms"].values():
            assert arm["lossless"] is True and 0 < arm["draft_share_of_step"] < 1
            assert arm["tpot_s"] == pytest.approx((arm["draft_time_per_step_s"] + arm["verify_time_per_step_s"])
                                                  / arm["mean_accept_length"])
    windowed = m["rows"][1]["arms"]["sink4+win16"]
    assert windowed["draft_keys_read_per_step"] < m["rows"][1]["arms"]["native"]["draft_keys_read_per_step"]
    assert "TPOT speedup vs dense" in stdout and not list(tmp_path.glob("*.tmp"))
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # drawn by plots.plot_decode
    # bad input: one line, exit 2, before any training
    paged = tmp_path / "paged.json"  # the same runs from a paged prefill: the same tokens and accepts
    code, _, err = _run(capsys, args + ["--page-size", "16", "--out", str(paged)])
    assert code == 0, err
    p = json.loads(paged.read_text())
    assert p["page_size"] == 16 and m["page_size"] is None
    for r, q in zip(m["rows"], p["rows"]):
        for label, arm in q["arms"].items():
            assert arm["lossless"] is True and arm["steps"] == r["arms"][label]["steps"]
            assert arm["mean_accept_length"] == r["arms"][label]["mean_accept_length"]
    gated = tmp_path / "gated.json"  # --keysets: a gate inside the 64-token run's steps (contexts 65 ..), below 300
    code, stdout, err = _run(capsys, args + ["--keysets", "4:16", "4:16@66", "--draft-caches", "full", "ring",
                                             "--out", str(gated)])
    assert code == 0 and "sink4+win16+gate66" in stdout, err
    g = json.loads(gated.read_text())
    assert g["config"]["spec"]["keysets"][2] == {"n_sink": 4, "window": 16, "gate": 66}
    for r, q in zip(m["rows"], g["rows"]):
        assert list(q["arms"]) == ["native", "sink4+win16", "sink4+win16 ring", "sink4+win16+gate66"]  # no gated ring
        arm, windowed, native = (q["arms"][k] for k in ("sink4+win16+gate66", "sink4+win16", "native"))
        assert arm["lossless"] and arm["gate"] == 66 and windowed["gate"] is None
        assert windowed["steps"] == r["arms"]["sink4+win16"]["steps"]
        if r["context"] == 300:  # past the gate from the first step: the windowed draft's run
            assert (arm["steps"], arm["draft_keys_read_per_step"]) == (windowed["steps"],
                                                                       windowed["draft_keys_read_per_step"])
        else:
            assert windowed["draft_keys_read_per_step"] < arm["draft_keys_read_per_step"]
    for extra, match in ((["--loops", "graph"], "graph loop captures CUDA graphs"), (["--page-size", "0"], ">= 1"),
                         (["--page-size", "100000"], "--page-size must be at most the smallest context"),
                         (["--keysets", "4:16@0"], "gate must be"), (["--keysets", "4:16@x"], "SINK:WINDOW@GATE"),
                         (["--contexts", "1"], "at least 2"),
                         (["--contexts", "10000000"], "needs more: pass --contexts of at most")):
        code, _, err = _run(capsys, args + extra + ["--out", str(tmp_path / "bad.json")])
        last = err.strip().splitlines()[-1]  # after the corpus's line, for the context the corpus cannot fill
        assert code == 2 and match in last and "Traceback" not in err, err
        assert last.startswith("wmtp bench decode: error:"), err
        assert not (tmp_path / "bad.json").exists()


def test_ring_alone_still_runs_the_native_and_gated_arms(capsys, wikitext_dir, tmp_path):
    """``--draft-caches ring`` ran only the ungated windowed arms: no native arm (which ``--keysets`` says
    always runs, and which the draft-time reduction is measured against), and with only gated key sets
    a bench of dense decoding alone."""
    out = tmp_path / "ring.json"
    code, stdout, err = _run(capsys, ["bench", "decode", "--preset", "tiny", "--dataset-dir", str(wikitext_dir),
                                      "--device", "cpu", "--seed", "0", "--contexts", "64", "--new-tokens", "9",
                                      "--keysets", "4:16", "4:16@66", "--draft-caches", "ring", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0, err
    (row,) = json.loads(out.read_text())["rows"]
    assert list(row["arms"]) == ["native", "sink4+win16 ring", "sink4+win16+gate66"]
    assert [a["draft_cache"] for a in row["arms"].values()] == ["full", "ring", "full"]
    assert row["arms"]["sink4+win16 ring"]["draft_time_reduction_vs_native"] is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the CUDA-graph loop")
def test_bench_decode_on_cuda_times_both_loops(capsys, tmp_path, monkeypatch):
    """Both loops' rows, lossless; the graph loop's dense and speculative runs in CUDA graphs (the
    rows a loop labelled ``graph`` times must be the graphs', not the static loop run eagerly)."""
    captured = record_captures(monkeypatch)
    out = tmp_path / "d.json"
    code, _, err = _run(capsys, ["bench", "decode", "--preset", "tiny", "--device", "cuda", "--contexts", "64", "512",
                                 "--new-tokens", "12", "--cache-dir", str(tmp_path / "cache"), "--no-progress",
                                 "--draft-caches", "full", "ring", "--page-size", "16", "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["page_size"] == 16  # paged target and draft caches, in both loops (the graph loop's captures too)
    assert [(r["context"], r["loop"]) for r in m["rows"]] == [(64, "eager"), (64, "graph"), (512, "eager"),
                                                              (512, "graph")]
    assert all(list(r["arms"]) == ["native", "sink4+win16", "sink4+win16 ring"] for r in m["rows"])
    assert all(arm["lossless"] is True for r in m["rows"] for arm in r["arms"].values())
    assert m["rows"][0]["prefill_s"] == m["rows"][1]["prefill_s"] > 0  # one prefill a context, both loops
    assert set(captured) == {"static_greedy_generate", "static_speculative_generate"}
