"""``wmtp reproduce`` end to end on the ``tiny`` preset: a metrics JSON whose every arm was asserted
lossless, a checkpoint reused for the same config and refused for another, default ``--out`` names
that never overwrite the committed metrics, and (with CUDA) the same run on the Triton kernels. What
the reproduction computes for that JSON, from stubbed decoding, is tests/test_reproduce_figures.py."""

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli as _run


def test_tiny_reproduce_end_to_end(capsys, wikitext_dir, tmp_path):
    out = tmp_path / "m.json"
    args = ["reproduce", "--paper", "windowed-mtp", "--preset", "tiny", "--dataset-dir", str(wikitext_dir),
            "--device", "cpu", "--seed", "0", "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    code, stdout, err = _run(capsys, args + ["--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["schema_version"] == 1 and m["corpus"]["name"] == "wikitext-2" and m["seed"] == 0
    assert m["decode_dtype"] == "float64"  # the CPU decodes in float64 (mutation round 5: float32 survived)
    assert m["command"].startswith("wmtp reproduce --paper windowed-mtp --preset tiny")
    assert m["config"]["model"]["d_model"] == 64 and m["config"]["spec"]["depth"] == 3
    assert [c["context"] for c in m["contexts"]] == [64, 256]
    for c in m["contexts"]:
        assert set(c["arms"]) == {"native", "sink4+win16"}
        for arm in c["arms"].values():
            assert arm["lossless"] is True and sum(arm["accept_length_histogram"]) == arm["steps"]
    windowed = m["contexts"][1]["arms"]["sink4+win16"]
    per_step = windowed["draft_queries"] / windowed["steps"]
    assert windowed["draft_keys_read_per_step"] <= 20 * per_step
    assert set(m["target_perplexity"]["by_context"]) == {"64", "256"}
    assert len(m["head_top1_accuracy_teacher_forced"]) == 3
    assert "native" in stdout and not list(tmp_path.glob("*.tmp"))
    assert "TPOT speedup vs dense" in stdout and "lossless" in stdout  # whole headers, though not a terminal

    # Same config again: the checkpoint is reused, not retrained.
    code, _, err = _run(capsys, args + ["--out", str(tmp_path / "again.json")])
    assert code == 0 and "loaded checkpoint" in err
    # A checkpoint made for another config (seed) is refused with exit 2.
    ckpt = next((tmp_path / "cache").glob("ckpt-*.pt"))
    other_seed = [a if a != "0" else "1" for a in args]
    code, _, err = _run(capsys, other_seed + ["--checkpoint", str(ckpt), "--out", str(tmp_path / "x.json")])
    assert code == 2 and "another config" in err and "seed" in err
    assert not (tmp_path / "x.json").exists()


def test_default_out_names_another_preset_and_device(capsys, wikitext_dir, tmp_path, monkeypatch):
    """Neither a quick --preset tiny run nor a GPU or MPS run overwrites the committed
    metrics/<corpus>-seed<seed>.json."""
    from wmtp.reproduce_cli import _default_out

    assert _default_out("wikitext-2", "small", False, 42, "cpu") == Path("metrics/wikitext-2-seed42.json")
    assert _default_out("wikitext-2", "tiny", False, 42, "cpu") == Path("metrics/wikitext-2-tiny-seed42.json")
    assert _default_out("wikitext-2", "small", True, 42, "cpu") == Path("metrics/wikitext-2-small-custom-seed42.json")
    assert _default_out("wikitext-2", "small", False, 42, "cuda") == Path("metrics/wikitext-2-seed42-cuda.json")
    assert _default_out("python-stdlib", "tiny", True, 0, "mps") == Path(
        "metrics/python-stdlib-tiny-custom-seed0-mps.json")
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, ["reproduce", "--preset", "tiny", "--dataset-dir", str(wikitext_dir), "--device",
                                 "cpu", "--seed", "5", "--cache-dir", "cache", "--no-progress"])
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == ["wikitext-2-tiny-seed5.json",
                                                                       "wikitext-2-tiny-seed5.png"]
    code, _, err = _run(capsys, ["reproduce", "--preset", "tiny", "--dataset-dir", str(wikitext_dir), "--device",
                                 "cpu", "--seed", "5", "--cache-dir", "cache", "--no-progress", "--new-tokens", "3"])
    assert code == 0, err  # an override of the preset is another config: another file
    assert (tmp_path / "metrics" / "wikitext-2-tiny-custom-seed5.json").is_file()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: reproduce with the Triton kernels")
def test_tiny_reproduce_on_cuda(capsys, tmp_path):
    """End to end on the GPU, on the offline corpus (no `datasets` needed): every arm lossless in float32."""
    out = tmp_path / "m.json"
    code, _, err = _run(capsys, ["reproduce", "--preset", "tiny", "--device", "cuda", "--seed", "0", "--cache-dir",
                                 str(tmp_path / "cache"), "--no-progress", "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["environment"]["device"] == "cuda" and m["decode_dtype"] == "float32"
    assert m["corpus"]["name"] == "python-stdlib" and [c["context"] for c in m["contexts"]] == [64, 256]
    assert all(arm["lossless"] is True for c in m["contexts"] for arm in c["arms"].values())


@pytest.mark.parametrize("argv, message", [  # each names the one flag that is wrong, not both
    (["--new-tokens", "1"], "--new-tokens must be at least 2 (one decode step to time), got 1"),
    (["--contexts", "64", "0"], "--contexts must be positive, got 64 0"),
    (["--contexts", "-5"], "--contexts must be positive, got -5"),
    (["--contexts", "2031", "64"], "a prompt of 2031 tokens plus 16 new tokens and depth 3 needs 2049 cache positions; "
                             "the KV cache holds 2048"),
    (["--contexts", "2030"], "the run started"), (["--new-tokens", "2"], "the run started"),
])
def test_reproduce_overrides_are_refused_past_their_bounds(capsys, tmp_path, monkeypatch, argv, message):
    """tiny's cache holds 2048 positions; a run writes context + new tokens + depth - 1 of them, so a
    context of 2030 fits and 2031 does not, the longest of the contexts given; one new token times no
    decode step (mutation round 8: refusing new tokens below 1, contexts below 0 or only all of them,
    one position fewer, and the shortest context checked, survived)."""
    def started(*a, **k):
        raise ValueError("the run started")

    monkeypatch.setattr("wmtp.reproduce.reproduce", started)
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, ["reproduce", "--preset", "tiny", "--device", "cpu", *argv])
    assert (code, out, err) == (2, "", f"wmtp reproduce: error: {message}\n")


def test_reproduce_passes_its_options_on_and_prints_what_the_run_returns(capsys, tmp_path, monkeypatch):
    """On a stubbed run: the overrides reach the preset (the native arm first), an existing checkpoint
    is only read (its folder may refuse new files) while a new one must be writable, the run gets the
    command line's options, and the JSON, its default name and the tables are literal (mutation round
    8: the native arm dropped, an existing checkpoint checked as written, progress bars always on, the
    seed's default, the tables' cells, the last line, each survived the tests above)."""
    import tempfile

    from wmtp.config import KeySetConfig, get_preset

    real_temporary_file, ro = tempfile.TemporaryFile, tmp_path / "ro"

    def temporary_file(*args, **kwargs):  # ro refuses a new file, as a read-only mount would
        if Path(kwargs.get("dir", "")) == ro:
            raise PermissionError(30, "Read-only file system")
        return real_temporary_file(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", temporary_file)
    ro.mkdir()
    (ro / "ckpt.pt").write_bytes(b"a checkpoint")
    arm = {"draft_keys_read_per_step": 60.0, "acceptance_rate": 0.5, "mean_accept_length": 2.5,
           "draft_time_per_step_s": 0.001, "verify_time_per_step_s": 0.003, "tpot_s": 0.0016,
           "tpot_speedup_vs_dense": 0.5625, "lossless": True}
    m = {"corpus": {"name": "c"}, "config": {"preset": "tiny", "spec": {"depth": 2}}, "decode_dtype": "float64",
         "wall_time_s": 12.3,
         "contexts": [{"context": 64, "dense": {"step_median_s": 0.002, "tpot_s": 0.0025},
                       "arms": {"native": arm, "sink8+win64": {**arm, "tpot_speedup_vs_dense": -0.25,
                                                               "lossless": False}}}],
         "draft_attention": [{"context": 64, "keyset": "sink8+win64", "keys_read": 64, "median_s": 1e-5, "window": 64,
                              "time_ratio_vs_native": 2.0}],
         "target_perplexity": {"valid_tokens_scored": 100, "by_context": {"64": 12.5, "128": 9.25}}}
    calls = []
    monkeypatch.setattr("wmtp.reproduce.reproduce", lambda *a, **k: calls.append((a, k)) or m)
    monkeypatch.setattr("wmtp.plots.render", lambda path: path.with_suffix(".png"))
    monkeypatch.chdir(tmp_path)
    argv = ["reproduce", "--preset", "tiny", "--device", "cpu", "--keysets", "8:64", "--depth", "2", "--contexts",
            "64", "--checkpoint", str(ro / "ckpt.pt"), "--cache-dir", "cache", "--no-progress"]
    code, stdout, err = _run(capsys, argv)
    assert code == 0, err
    ((preset, *args), kwargs), = calls
    spec = get_preset("tiny").spec
    assert (preset.spec.keysets, preset.spec.depth, preset.spec.contexts) == (
        (KeySetConfig(0, None), KeySetConfig(8, 64)), 2, (64,))
    assert preset.spec.new_tokens == spec.new_tokens and preset.model == get_preset("tiny").model
    assert args == [None, torch.device("cpu"), 42, None, Path("cache"), ro / "ckpt.pt", "wmtp " + " ".join(argv)]
    assert kwargs["progress"] is False
    assert json.loads(Path("metrics/c-tiny-custom-seed42.json").read_text()) == m
    assert err == "wrote metrics/c-tiny-custom-seed42.json and metrics/c-tiny-custom-seed42.png in 12 s\n"
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]
    heads = [[cell.strip() for cell in line.split("┃")[1:-1]] for line in stdout.splitlines() if line.startswith("┃")]
    assert heads[0] == ["context", "arm", "draft keys/step", "accept", "AL", "draft ms/step", "verify ms/step",
                        "TPOT ms", "TPOT speedup vs dense", "lossless"]  # the draft's keys, not the verify's
    assert rows == [["64", "dense", "-", "-", "1.00", "-", "2.00", "2.50", "-", "-"],
                    ["", "native", "60", "0.50", "2.50", "1.00", "3.00", "1.60", "+56%", "yes"],  # a percentage
                    ["", "sink8+win64", "60", "0.50", "2.50", "1.00", "3.00", "1.60", "-25%", "NO"],
                    ["64", "sink8+win64", "64", "0.0100", "2.0x"]]
    assert "Windowed-MTP reproduction: c, preset tiny, depth 2, decode float64" in stdout  # a tiny run says so
    assert stdout.endswith("\ntarget perplexity on 100 valid tokens, by context: 64: 12.50, 128: 9.25\n")
    code, _, err = _run(capsys, [*argv, "--out", "[bold]/m.json"])  # printed as it is, no markup
    assert (code, err) == (0, "wrote [bold]/m.json and [bold]/m.png in 12 s\n")
    code, _, err = _run(capsys, [*argv[:-5], "--checkpoint", str(ro / "new.pt")])
    assert (code, err) == (2, f"wmtp reproduce: error: --checkpoint {ro / 'new.pt'} cannot be written: {ro} refuses a "
                              "new file (Read-only file system)\n")
