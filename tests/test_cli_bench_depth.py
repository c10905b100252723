"""``wmtp bench depth``: every arm under fixed and adaptive depth policies, with each policy's figures
and the adaptive policies' fitted costs; gated key sets (there and in ``wmtp bench sampling``); bad
input before any work; and, with CUDA, the CUDA-graph loop."""

import json

import pytest
import torch
from cli_helpers import record_captures, record_prefills
from cli_helpers import run_cli as _run


def test_bench_depth_writes_every_arm_and_policy(capsys, wikitext_dir, tmp_path, monkeypatch):
    prefills, starts = record_prefills(monkeypatch)  # every run must start from its context's one prefill
    out = tmp_path / "p.json"
    code, stdout, err = _run(capsys, ["bench", "depth", "--preset", "tiny", "--dataset-dir", str(wikitext_dir),
                                      "--device", "cpu", "--seed", "0", "--contexts", "64", "300", "--new-tokens", "9",
                                      "--depths", "1", "3", "--rounds", "2", "--cache-dir", str(tmp_path / "cache"),
                                      "--no-progress", "--out", str(out)])
    assert code == 0, err
    assert [p.prompt.numel() for p in prefills] == [64, 300]
    assert starts == [prefills[0]] * 18 + [prefills[1]] * 18  # 2 rounds of: dense, then 2 arms x 4 policies
    m = json.loads(out.read_text())
    assert m["kind"] == "bench-depth" and m["complete"] and m["decode_dtype"] == "float64" and m["wall_time_s"] > 0
    assert m["command"].startswith("wmtp bench depth") and m["config"]["preset"] == "tiny" and m["seed"] == 0
    assert m["depths"] == [1, 3] and m["rounds"] == 2 and "lossless" in m and m["loop"] == "eager"
    assert m["policies"] == ["fixed-1", "fixed-3", "adaptive", "adaptive-per-depth"]
    assert [(r["context"], r["loop"]) for r in m["rows"]] == [(64, "eager"), (300, "eager")]
    for r in m["rows"]:
        assert r["new_tokens"] == 9 and list(r["arms"]) == ["native", "sink4+win16"] and r["prefill_s"] > 0
        dense = r["dense"]["tpot_s_rounds"]
        assert len(dense) == 2 and r["dense"]["tpot_s"] == pytest.approx(sum(dense) / 2) and min(dense) > 0
        for arm in r["arms"].values():
            runs = arm["policies"]
            assert list(runs) == ["fixed-1", "fixed-3", "adaptive", "adaptive-per-depth"]
            assert arm["fastest_policy"] == min(runs, key=lambda n: runs[n]["tpot_s"])
            for name, p in runs.items():
                assert p["committed"] == 9 - 1  # the first token comes from the prefill's logits
                assert sum(p["steps_by_depth"]) == p["steps"] > 0  # index: the depth, up to the policy's largest
                assert len(p["steps_by_depth"]) == p["policy"]["max_depth"] + 1
                assert p["proposed"] == sum(k * n for k, n in enumerate(p["steps_by_depth"]))
                assert p["mean_depth"] == pytest.approx(p["proposed"] / p["steps"])
                assert p["mean_accept_length"] == pytest.approx(p["committed"] / p["steps"])
                assert len(p["tpot_s_rounds"]) == len(p["mean_depth_rounds"]) == 2 and min(p["tpot_s_rounds"]) > 0
                assert p["tpot_s"] == pytest.approx(sum(p["tpot_s_rounds"]) / 2)  # the median of two
                assert p["tpot_s_rounds"][0] == pytest.approx((p["draft_s"] + p["verify_s"]) / p["committed"])
                assert p["tpot_speedup_vs_dense"] == pytest.approx(r["dense"]["tpot_s"] / p["tpot_s"] - 1)
            assert runs["fixed-1"]["policy"] == {"policy": "fixed", "max_depth": 1}
            assert runs["fixed-1"]["steps_by_depth"] == [0, runs["fixed-1"]["steps"]]
            assert runs["fixed-3"]["mean_depth"] == 3
            adaptive = runs["adaptive"]
            assert adaptive["policy"]["policy"] == "adaptive" and adaptive["policy"]["max_depth"] == 3
            assert adaptive["policy"]["learn_costs"] is True and adaptive["policy"]["fitted_cost"] is None
            fit, alphas = adaptive["policy_after"]["fitted_cost"], adaptive["policy_after"]["acceptance"]
            assert (fit is None or (len(fit) == 2 and fit[1] >= 0)) and len(alphas) == 3
            assert 1 <= adaptive["mean_depth"] <= 3
            per_depth = runs["adaptive-per-depth"]
            assert per_depth["policy"]["cost_model"] == "per-depth" and adaptive["policy"]["cost_model"] == "line"
            measured = per_depth["policy_after"]["measured_costs"]
            assert len(measured) == 3 and all(c is None or c > 0 for c in measured)
            assert [c is not None for c in measured] == [n > 0 for n in per_depth["steps_by_depth"][1:]]
    assert "TPOT speedup vs dense" in stdout and not list(tmp_path.glob("*.tmp"))
    assert out.with_suffix(".png").stat().st_size > 0  # the plot beside it, drawn by wmtp/plots.py
    partial = tmp_path / "partial.json"  # a bench-depth file without its rows: a clear error, not a traceback
    partial.write_text(json.dumps({**m, "rows": []}))
    code, _, err = _run(capsys, ["plot", str(partial)])
    assert code == 2 and "incomplete 'wmtp bench depth' metrics file" in err and "Traceback" not in err


def test_bench_depth_and_sampling_take_gated_keysets(capsys, wikitext_dir, tmp_path):
    """``--keysets SINK:WINDOW@GATE``: the gated arm runs (lossless, asserted inside each bench) and says its gate."""
    common = ["--preset", "tiny", "--dataset-dir", str(wikitext_dir), "--device", "cpu", "--seed", "0",
              "--contexts", "64", "--new-tokens", "9", "--cache-dir", str(tmp_path / "cache"), "--no-progress",
              "--keysets", "4:16", "4:16@66"]
    for bench, extra in (("depth", ["--depths", "1", "--rounds", "1"]),
                         ("sampling", ["--temperatures", "1.0", "--sample-seeds", "3"])):
        out = tmp_path / f"{bench}.json"
        code, stdout, err = _run(capsys, ["bench", bench, *common, *extra, "--out", str(out)])
        assert code == 0 and "sink4+win16+gate66" in stdout, err
        (row,) = json.loads(out.read_text())["rows"]
        assert list(row["arms"]) == ["native", "sink4+win16", "sink4+win16+gate66"]
        assert [a["gate"] for a in row["arms"].values()] == [None, None, 66]


@pytest.mark.parametrize("bad,match", [(["--depths", "0"], "--depths must be in [1, 3]"),
                                       (["--depths", "1", "4"], "--depths must be in [1, 3]"),
                                       (["--contexts", "1"], "at least 2"),
                                       (["--rounds", "0", "--depths", "1"], "--rounds must be a positive integer"),
                                       (["--loop", "graph"], "graph loop captures CUDA graphs")])
def test_bench_depth_bad_input_exits_2_before_any_work(capsys, tmp_path, bad, match):
    out = tmp_path / "p.json"
    code, stdout, err = _run(capsys, ["bench", "depth", "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out), *bad])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("wmtp bench depth: error:") and match in err, err
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the CUDA-graph loop")
def test_bench_depth_on_cuda_in_the_graph_loop(capsys, tmp_path, monkeypatch):
    """The graph loop's rows; its dense and speculative runs in CUDA graphs."""
    captured = record_captures(monkeypatch)
    out = tmp_path / "g.json"
    code, _, err = _run(capsys, ["bench", "depth", "--preset", "tiny", "--device", "cuda", "--contexts", "64", "512",
                                 "--new-tokens", "24", "--depths", "1", "3", "--rounds", "1", "--loop", "graph",
                                 "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["loop"] == "graph" and m["decode_dtype"] == "float32" and m["complete"]
    for r in m["rows"]:
        assert r["loop"] == "graph" and r["dense"]["tpot_s"] > 0
        for arm in r["arms"].values():
            assert arm["policies"]["fixed-3"]["steps_by_depth"][3] == arm["policies"]["fixed-3"]["steps"] > 0
            assert arm["policies"]["adaptive"]["tpot_s"] > 0
    assert set(captured) == {"static_greedy_generate", "static_speculative_generate"}
