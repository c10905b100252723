"""The ``wmtp`` command: help texts, bad input (exit 2, one line, no traceback), and a tiny
end-to-end ``reproduce`` that writes a metrics JSON whose every arm was asserted lossless."""

import dataclasses
import json
import os
import random
from pathlib import Path

import pytest
import torch

from wmtp.cli import auto_research_main, main
from wmtp.config import KeySetConfig

WORDS = "the of and in to a was is for on as with by he at from his an were are which it this that".split()


@pytest.fixture(scope="module")
def wikitext_dir(tmp_path_factory):
    """A small WikiText-format corpus (train/valid/test.txt) with some structure to learn."""
    root = tmp_path_factory.mktemp("wikitext")
    rng = random.Random(0)
    for split, n in [("train", 1500), ("valid", 300), ("test", 300)]:
        lines = []
        for i in range(n):
            if i % 25 == 0:
                lines.append(f" = Section {i // 25} = ")
            lines.append(" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) + " . ")
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _run(capsys, argv, entry=main):
    code = entry(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_subcommand_and_flag(capsys):
    code, out, _ = _run(capsys, ["--help"])
    assert code == 0 and "reproduce" in out and "bench" in out
    code, out, _ = _run(capsys, ["reproduce", "--help"])
    for flag in ("--paper", "--dataset-dir", "--device", "--seed", "--preset", "--out", "--depth", "--keysets"):
        assert flag in out
    code, out, _ = _run(capsys, ["bench", "attention", "--help"])
    assert code == 0 and "--contexts" in out


def test_version_and_python_m(capsys):
    """``--version`` names the package's version (pyproject.toml's); ``python -m wmtp`` is the command
    from a checkout, and a metrics JSON records the command as typed and wmtp's version."""
    import re
    import subprocess
    import sys

    import wmtp
    from wmtp.metrics import command_line, environment

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"$', pyproject, flags=re.M)[1] == wmtp.__version__
    code, out, _ = _run(capsys, ["--version"])
    assert code == 0 and out == f"wmtp {wmtp.__version__}\n"
    run = subprocess.run([sys.executable, "-m", "wmtp", "--version"], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (0, f"python -m wmtp {wmtp.__version__}\n")
    run = subprocess.run([sys.executable, "-m", "wmtp", "reproduce", "--depth", "0"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and run.stderr == "python -m wmtp: error: depth must be an integer >= 1, got 0\n"
    assert "Traceback" not in run.stderr
    assert command_line("python -m wmtp", ["generate", "it's a prompt", "--seed", "1"]) == (
        "python -m wmtp generate 'it'\"'\"'s a prompt' --seed 1")
    assert environment("cpu")["versions"]["wmtp"] == wmtp.__version__


BAD = [
    (["reproduce", "--depth", "0"], "depth"),
    (["reproduce", "--depth", "-3"], "depth"),
    (["reproduce", "--keysets=-1:64"], "n_sink"),
    (["reproduce", "--keysets", "-1:64"], "n_sink must be a non-negative integer, got -1"),  # was read as an option
    (["generate", "--keyset", "8:64", "-1:64"], "n_sink"), (["reproduce", "--contexts", "-5"], "--contexts"),
    (["reproduce", "--keysets", "8:-2"], "window"),
    (["reproduce", "--keysets", "8"], "SINK:WINDOW"),
    (["reproduce", "--device", "tpu"], "unknown device"),
    (["reproduce", "--device", "mps"], "MPS is not available"),
    (["reproduce", "--preset", "huge"], "unknown preset"),
    (["reproduce", "--contexts", "100000"], "cache"),
    (["reproduce", "--dataset-dir", "/no/such/dir"], "does not exist"),
    (["reproduce", "--seed", "abc"], "--seed: must be an integer from 0 to 2**64 - 1, got 'abc'"),
    (["reproduce", "--seed", "-1"], "from 0 to 2**64 - 1"), (["generate", "--seed", str(2**64)], "from 0"),
    (["bench", "decode", "--seed", "1e3"], "from 0"),
    (["reproduce", "--keysets", " 8:64"], "is not SINK:WINDOW"), (["reproduce", "--keysets", "1_0:64"], "SINK:WINDOW"),
    (["reproduce", "--keysets", "8:64", "8:64"], "key set sink8+win64 is given twice"),
    (["reproduce", "--contexts", "64", "128", "64"], "context 64 is given twice"),
    (["reproduce", "--device", "auto:3"], "only cuda and mps take an index"), (["bench", "decode", "--device", "cpu:1"],
                                                                             "only cuda and mps take an index"),
    (["plot", ""], "is a folder"),
    (["reproduce", "--paper", "other"], "invalid choice"),
    (["bench", "attention", "--device", "tpu"], "unknown device"),
    (["bench", "attention", "--repeats", "0"], "positive"),
]


@pytest.mark.parametrize("argv,match", BAD)
def test_bad_input_exits_2_with_one_line(capsys, argv, match, monkeypatch):
    monkeypatch.setattr("wmtp.device.mps_available", lambda: False)  # "mps absent" on a Mac too
    code, out, err = _run(capsys, argv)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and match in err, err
    assert "Traceback" not in err + out


def test_devices_resolve_in_one_place_and_mps_has_no_float64(capsys, monkeypatch):
    """auto prefers CUDA, then MPS, then CPU; float64 on MPS is one line and exit 2, before any work."""
    from wmtp.device import check_dtype, mps_available, resolve_device

    # the backend's answer, not that torch has an mps module (every build has; mutation round 5)
    assert mps_available() is torch.backends.mps.is_available()
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("wmtp.device.mps_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps") and resolve_device("mps") == torch.device("mps")
    with pytest.raises(ValueError, match="MPS has no float64"):
        check_dtype(torch.device("mps"), torch.float64)
    check_dtype(torch.device("mps"), torch.float32)
    check_dtype(torch.device("cpu"), torch.float64)
    code, out, err = _run(capsys, ["bench", "attention", "--device", "mps", "--dtype", "float64", "--preset", "tiny"])
    assert code == 2 and "MPS has no float64" in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setattr("wmtp.device.mps_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    code, _, err = _run(capsys, ["bench", "attention", "--device", "mps"])
    assert code == 2 and "MPS is not available" in err
    # refused by resolve_device itself (mutation round 5: without it, reproduce --device cuda and
    # --device auto:3 got through to their work and failed only minutes later)
    for name, match in (("cuda", "CUDA is not available"), ("cuda:1", "CUDA is not available"),
                        ("mps", "MPS is not available"), ("auto:3", "only cuda and mps"),
                        ("cpu:1", "only cuda and mps"), ("tpu", "unknown device")):
        with pytest.raises(ValueError, match=match):
            resolve_device(name)
    assert resolve_device("cpu") == torch.device("cpu")


def test_unwritable_outputs_and_bad_paths_exit_2_before_any_work(capsys, tmp_path, monkeypatch):
    """An --out that is a folder or lies under a file, a --cache-dir that is a file, a malformed
    device, a JSON path that is a folder: one line, exit 2, and reproduce never starts its run."""
    import wmtp.cli
    import wmtp.reproduce

    monkeypatch.setattr(wmtp.reproduce, "reproduce", lambda *a, **k: pytest.fail("the run started"))
    for bench in wmtp.cli.BENCHES:  # each bench module holds its own name for bench_setup
        monkeypatch.setattr(f"wmtp.bench_{bench}.bench_setup", lambda *a, **k: pytest.fail("the bench started"))
    afile, fifo, cache = tmp_path / "f", tmp_path / "fifo", tmp_path / "cache"
    afile.write_text("x")
    os.mkfifo(fifo)
    os.mkfifo(tmp_path / "fifo.png")
    for argv, match in [
        (["reproduce", "--out", str(fifo)], "is not a regular file"),
        (["reproduce", "--checkpoint", str(tmp_path / "x.json"), "--out", str(tmp_path / "x.json")],
         "would be overwritten by --out"),
        (["reproduce", "--checkpoint", str(tmp_path / "x.png"), "--out", str(tmp_path / "x.json")],
         "would be overwritten by --out's plot"),
        (["reproduce", "--checkpoint", "metrics/python-stdlib-tiny-seed42.json", "--preset", "tiny", "--device", "cpu"],
         "would be overwritten by --out metrics/*-tiny-seed42.json"),  # the default --out, any corpus
        (["reproduce", "--out", str(tmp_path / "fifo.json")], "--out's plot"),  # fifo.png: the plot's path
        (["plot", str(fifo)], f"metrics file {fifo} is not a regular file"),  # not a read that never ends
        (["reproduce", "--cache-dir", str(cache), "--out", str(cache / "m.json")], "is inside --cache-dir"),
        (["bench", "decode", "--device", "cpu", "--cache-dir", str(afile), "--out", str(tmp_path / "b.json")],
         "--cache-dir"),
        (["bench", "depth", "--device", "cpu", "--cache-dir", str(cache), "--out", str(cache / "b.json")],
         "is inside --cache-dir"),
        (["bench", "batch", "--device", "cpu", "--batch-sizes", "4", "4"], "each once"),
        (["bench", "batch", "--device", "cpu", "--batch-sizes", "64", "--prompts-per-row", "100"], "at most 4096"),
        (["bench", "decode", "--device", "cpu", "--loops", "eager", "eager"], "distinct"),
        (["bench", "batch", "--device", "cpu", "--lengths", "equal", "equal"], "distinct"),
        (["bench", "sampling", "--device", "cpu", "--contexts", "64", "64"], "--contexts must each be given once"),
        (["bench", "attention", "--device", "cpu", "--contexts", "64", "64"], "--contexts must each be given once"),
        (["plot", str(tmp_path / "m.json"), "--out", str(tmp_path / "m.jpg")], "the plot is a PNG, name it .png"),
        (["reproduce", "--out", str(tmp_path)], "is a folder"),
        (["reproduce", "--out", str(afile / "m.json")], "not a writable folder"),
        (["reproduce", "--cache-dir", str(afile)], "not a writable folder"),
        (["reproduce", "--checkpoint", str(tmp_path)], "is a folder: pass the checkpoint file's path"),
        (["reproduce", "--device", "cpu:abc"], "bad device"),
        (["bench", "attention", "--out", str(afile / "b.json")], "not a writable folder"),
        (["plot", str(tmp_path / "m.json"), "--out", str(tmp_path)], "is a folder"),
        (["plot", str(tmp_path)], "is a folder: pass a JSON file's path"),
    ]:
        code, out, err = _run(capsys, argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, (argv, err)
        assert "Traceback" not in err + out
    assert fifo.is_fifo() and not cache.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f", "fifo", "fifo.png"]  # nothing written
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics").write_text("a file where the default --out's folder goes")
    code, out, err = _run(capsys, ["reproduce"])
    assert code == 2 and "not a writable folder" in err and "Traceback" not in err + out, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error for an absent CUDA device")
def test_absent_cuda_is_a_clear_error(capsys):
    code, _, err = _run(capsys, ["reproduce", "--device", "cuda"])
    assert code == 2 and "CUDA is not available" in err


def test_empty_dataset_dir(capsys, tmp_path):
    code, _, err = _run(capsys, ["reproduce", "--dataset-dir", str(tmp_path)])
    assert code == 2 and "empty" in err


def test_auto_research_alias(capsys):
    code, out, _ = _run(capsys, ["reproduce", "--help"], auto_research_main)
    assert code == 0 and "auto-research" in out
    code, _, err = _run(capsys, ["reproduce", "--depth", "0"], auto_research_main)
    assert code == 2 and err.startswith("auto-research: error:")


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


def test_plot_renders_a_reproduce_json(capsys, wikitext_dir, tmp_path):
    out = tmp_path / "m.json"
    assert main(["reproduce", "--preset", "tiny", "--dataset-dir", str(wikitext_dir), "--device", "cpu", "--seed", "3",
                 "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--out", str(out)]) == 0
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # reproduce draws its JSON
    code, stdout, _ = _run(capsys, ["plot", str(out), "--out", str(tmp_path / "again.png")])
    assert code == 0 and (tmp_path / "again.png").stat().st_size > 10_000
    (tmp_path / "bad.json").write_text('{"runs": 1}')
    code, _, err = _run(capsys, ["plot", str(tmp_path / "bad.json")])
    assert code == 2 and "not a metrics file of" in err
    for kind in ('["x"]', '{"a": 1}'):  # a kind that is not a string
        (tmp_path / "kind.json").write_text(f'{{"kind": {kind}}}')
        code, _, err = _run(capsys, ["plot", str(tmp_path / "kind.json")])
        assert code == 2 and "not a metrics file of" in err and "Traceback" not in err, err
    (tmp_path / "rows.json").write_text('{"rows": [], "unit": "us"}')  # rows, but of no kind plot knows
    code, _, err = _run(capsys, ["plot", str(tmp_path / "rows.json")])
    assert code == 2 and "not a metrics file of" in err
    code, _, err = _run(capsys, ["plot", str(tmp_path / "missing.json")])
    assert code == 2 and "no such metrics file" in err
    (tmp_path / "text.json").write_text("hi")
    code, _, err = _run(capsys, ["plot", str(tmp_path / "text.json")])
    assert code == 2 and "is not JSON (Expecting value, line 1 column 1)" in err
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe\x00")
    code, _, err = _run(capsys, ["plot", str(tmp_path / "bytes.json")])
    assert code == 2 and "is not JSON (not UTF-8 text)" in err
    for broken in ('{"contexts": [], "draft_attention": []}', '{"rows": [], "methods": []}',
                   '{"rows": 1, "kind": "draft-attention"}', '{"kind": "draft-attention"}',
                   '{"rows": [], "kind": "bench-decode"}'):
        (tmp_path / "broken.json").write_text(broken)  # the right kind, not whole: one line, no traceback
        code, _, err = _run(capsys, ["plot", str(tmp_path / "broken.json")])
        assert code == 2 and "incomplete" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _run(capsys, ["plot", str(out), "--out", str(out)])  # the plot would overwrite its JSON
    assert code == 2 and "name it .png" in err and out.read_text().startswith("{")
    (tmp_path / "j.png").write_text(out.read_text())  # a JSON named .png: its default plot is itself
    code, _, err = _run(capsys, ["plot", str(tmp_path / "j.png")])
    assert code == 2 and "same file" in err and (tmp_path / "j.png").read_text().startswith("{")


def test_bench_attention_off_cuda_writes_a_json_that_plot_draws(capsys, tmp_path):
    out = tmp_path / "cpu.json"
    code, _, _ = _run(capsys, ["bench", "attention", "--device", "cpu", "--preset", "tiny", "--contexts", "64", "256",
                               "--repeats", "2", "--out", str(out)])
    m = json.loads(out.read_text())
    assert code == 0 and m["kind"] == "draft-attention" and m["command"].startswith("wmtp bench attention")
    assert {"schema_version", "environment", "preset", "dtype", "rows"} <= set(m)
    code, _, _ = _run(capsys, ["plot", str(out)])
    assert code == 0 and (tmp_path / "cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_json_out_named_like_its_plot_exits_2_before_any_work(capsys, tmp_path, monkeypatch):
    import wmtp.reproduce

    monkeypatch.setattr(wmtp.reproduce, "reproduce", lambda *a, **k: pytest.fail("the run started"))
    code, _, err = _run(capsys, ["reproduce", "--out", str(tmp_path / "m.png")])
    assert code == 2 and "same file" in err


def test_check_writable_tries_a_file_where_os_access_says_yes(tmp_path, monkeypatch):
    """As root, os.access allows everything: a folder that refuses a new file must still fail up front."""
    import tempfile

    from wmtp.fileio import check_writable

    def refuse(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(ValueError, match="refuses a new file"):
        check_writable(tmp_path / "m.json", "--out")


def test_draft_attention_bar_is_judged_on_cpu_only():
    """The reproduction's draft-attention bar reads its own row and is not judged off the CPU."""
    from wmtp.reproduce import draft_attention_bar

    rows = [{"context": 16384, "n_sink": 0, "window": None, "keys_read": 16384, "time_ratio_vs_native": 1.0},
            {"context": 16384, "n_sink": 8, "window": 64, "gate": 32768, "keys_read": 16384,
             "time_ratio_vs_native": 1.0},  # gated past this context: the native key set, not the bar's
            {"context": 16384, "n_sink": 8, "window": 64, "gate": None, "keys_read": 72, "time_ratio_vs_native": 20.0},
            {"context": 4096, "n_sink": 8, "window": 64, "keys_read": 72, "time_ratio_vs_native": 2.0}]
    bar = draft_attention_bar(rows, torch.device("cpu"))
    assert (bar["met"], bar["ratio"], bar["keys_read"], bar["judged_on"]) == (True, 20.0, 72, "cpu")
    rows[2]["time_ratio_vs_native"] = 14.9
    assert draft_attention_bar(rows, torch.device("cpu"))["met"] is False
    rows[2]["time_ratio_vs_native"] = 15.0  # min_ratio itself meets it (mutation round 5: > survived)
    assert draft_attention_bar(rows, torch.device("cpu"))["met"] is True
    assert draft_attention_bar(rows, torch.device("cuda"))["met"] is None  # no device needed: the type decides
    assert draft_attention_bar(rows[3:], torch.device("cpu")) is None
    assert draft_attention_bar(rows[:2], torch.device("cpu")) is None  # only the gated row at 16384


def test_speedup_reduction_and_tpot_are_the_stated_formulas():
    """The metrics JSON's figures (wmtp/metrics.py, DESIGN.md "Measuring"): a speedup is old/new - 1,
    a reduction 1 - new/old, TPOT (t_verify + t_draft) / AL, and an AL that is not positive a ValueError."""
    from wmtp.metrics import reduction, speedup, tpot

    assert speedup(3.0, 2.0) == 0.5 and speedup(2.0, 4.0) == -0.5  # 3 s -> 2 s: 50% faster
    assert reduction(4.0, 3.0) == 0.25 and reduction(2.0, 3.0) == -0.5  # a cost of 4 -> 3: 25% less
    assert tpot(3.0, 1.0, 2.0) == 2.0  # a 4 s step keeping 2 tokens
    for al in (0, -1.0):
        with pytest.raises(ValueError, match="mean accept length must be positive"):
            tpot(1.0, 1.0, al)


@pytest.mark.parametrize("device, warmed", [("cpu", False), ("meta", True)])
def test_run_arms_warms_up_off_the_cpu_only(monkeypatch, device, warmed):
    """Off the CPU every run is made once untimed first (Triton compiles on first calls); on the
    CPU, where nothing compiles, never. Decoding is stubbed: this counts calls, on any device."""
    import wmtp.reproduce as rep
    from wmtp.config import get_preset
    from wmtp.stats import SpecStats

    calls = {"untimed": 0}

    def greedy(target, prompt, n, step_times=None):
        calls["untimed"] += step_times is None
        if step_times is not None:
            step_times.extend([1e-3] * (n - 1))
        return torch.zeros(n, dtype=torch.long)

    gates = []

    def speculative(target, head, prompt, n, depth, n_sink, window, gate):
        calls["untimed"] += 1  # the timed runs are counted too, and subtracted below
        gates.append(gate)
        stats = SpecStats(depth, proposed=depth, steps=1, committed=n, draft_times_s=[1e-3], verify_times_s=[1e-3])
        return torch.zeros(n, dtype=torch.long), stats

    monkeypatch.setattr(rep, "greedy_generate", greedy)
    monkeypatch.setattr(rep, "speculative_generate", speculative)
    preset = get_preset("tiny")  # two key sets: native and one window; and one gated
    preset = dataclasses.replace(preset, spec=dataclasses.replace(
        preset.spec, keysets=(*preset.spec.keysets, KeySetConfig(4, 16, gate=20))))
    row = rep.run_arms(None, None, torch.zeros(8, dtype=torch.long, device=device), preset)
    untimed = 1 + len(preset.spec.keysets) if warmed else 0  # dense + each arm, once, off the CPU
    assert calls["untimed"] - len(preset.spec.keysets) == untimed
    assert set(row["arms"]) == {ks.label for ks in preset.spec.keysets}
    assert gates[-3:] == [None, None, 20] and row["arms"]["sink4+win16+gate20"]["gate"] == 20


def test_run_arms_figures_from_scripted_times(monkeypatch):
    """Every figure of an arm, from scripted step times worked out by hand (decoding stubbed; mutation
    round 4: each formula below could change unseen). Dense: steps of 1, 2 and 6 s, median 2. Native
    (run first, though listed last): draft 2, 4, 12 and verify 10, 6, 2: medians 4 and 6, step median
    of the sums 12, 10, 14: 12; 6 tokens in 3 steps, AL 2: TPOT (6 + 4) / 2 = 5, speedup 2 / 5 - 1.
    sink4+win16: draft 1 each, verify 6 each, AL 9 / 3 = 3: TPOT 7 / 3, draft 1 - 1/4 = 75 % less
    than native's. An arm whose tokens are not dense's is an AssertionError, never a row."""
    import wmtp.reproduce as rep
    from wmtp.config import get_preset
    from wmtp.stats import SpecStats

    def greedy(target, prompt, n, step_times=None):
        step_times.extend([1.0, 6.0, 2.0])
        return torch.zeros(n, dtype=torch.long)

    script = {None: ([2.0, 4.0, 12.0], [10.0, 6.0, 2.0], 6, 30), 16: ([1.0] * 3, [6.0] * 3, 9, 24)}
    wrong = []

    def speculative(target, head, prompt, n, depth, n_sink, window, gate):
        draft, verify, committed, keys = script[window]
        stats = SpecStats(depth, proposed=3 * depth, accepted=3, steps=3, committed=committed, draft_keys_read=keys,
                          draft_times_s=draft, verify_times_s=verify)
        return torch.full((n,), int(window in wrong), dtype=torch.long), stats

    monkeypatch.setattr(rep, "greedy_generate", greedy)
    monkeypatch.setattr(rep, "speculative_generate", speculative)
    preset = get_preset("tiny")
    preset = dataclasses.replace(preset, spec=dataclasses.replace(preset.spec, keysets=preset.spec.keysets[::-1]))
    row = rep.run_arms(None, None, torch.zeros(8, dtype=torch.long), preset)
    assert row["dense"] == {"step_median_s": 2.0, "tpot_s": 2.0} and list(row["arms"]) == ["native", "sink4+win16"]
    native, win = row["arms"]["native"], row["arms"]["sink4+win16"]
    assert (native["draft_time_per_step_s"], native["verify_time_per_step_s"], native["step_median_s"]) == (4, 6, 12)
    assert native["tpot_s"] == 5 and native["draft_keys_read_per_step"] == 10
    assert native["draft_time_reduction_vs_native"] == 0
    assert native["tpot_speedup_vs_dense"] == pytest.approx(-0.6) and native["lossless"] is True
    assert (win["draft_time_per_step_s"], win["verify_time_per_step_s"], win["step_median_s"]) == (1, 6, 7)
    assert win["tpot_s"] == pytest.approx(7 / 3) and win["tpot_speedup_vs_dense"] == pytest.approx(6 / 7 - 1)
    assert (win["draft_keys_read_per_step"], win["draft_time_reduction_vs_native"]) == (8, 0.75)
    wrong.append(16)
    with pytest.raises(AssertionError, match=r"arm sink4\+win16 at context 8 is not lossless"):
        rep.run_arms(None, None, torch.zeros(8, dtype=torch.long), preset)


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


def record_prefills(monkeypatch) -> tuple[list, list]:
    """Lists that fill, as a bench runs, with each prefill it makes and the prefill each run starts from."""
    import wmtp.bench_common
    import wmtp.decode

    prefills, starts = [], []
    monkeypatch.setattr(wmtp.bench_common, "prefill_prompt",
                        lambda *a, **k: prefills.append(wmtp.prefill.prefill_prompt(*a, **k)) or prefills[-1])
    monkeypatch.setattr(wmtp.decode, "start",
                        lambda *a, **k: starts.append(k["prefill"]) or wmtp.prefill.start(*a, **k))
    return prefills, starts


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
                         (["--keysets", "4:16@0"], "gate must be"), (["--keysets", "4:16@x"], "SINK:WINDOW@GATE"),
                         (["--contexts", "1"], "at least 2"), (["--contexts", "10000000"], "needs more")):
        code, _, err = _run(capsys, args + extra + ["--out", str(tmp_path / "bad.json")])
        last = err.strip().splitlines()[-1]  # after the corpus's line, for the context the corpus cannot fill
        assert code == 2 and match in last and last.startswith("wmtp: error:") and "Traceback" not in err, err
        assert not (tmp_path / "bad.json").exists()


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


@pytest.mark.parametrize("bad,match", [(["--temperatures", "-0.5"], "--temperatures must be finite and >= 0"),
                                       (["--temperatures", "0.7", "nan"], "--temperatures must be finite"),
                                       (["--temperatures=inf"], "--temperatures must be finite"),
                                       (["--sample-seeds", "-1"], "seed must be an int"),
                                       (["--sample-seeds", "2", "2"], "--sample-seeds must be distinct")])
def test_bench_sampling_bad_temperature_exits_2_before_any_work(capsys, tmp_path, bad, match):
    out = tmp_path / "s.json"
    code, stdout, err = _run(capsys, ["bench", "sampling", "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                      str(tmp_path / "cache"), "--no-progress", "--out", str(out), *bad])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("wmtp: error:") and match in err, err
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the CUDA-graph loop")
def test_bench_decode_on_cuda_times_both_loops(capsys, tmp_path):
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
    assert err.startswith("wmtp: error:") and match in err, err
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the CUDA-graph loop")
def test_bench_depth_on_cuda_in_the_graph_loop(capsys, tmp_path):
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
                       (["--keysets", "4:16@100"], "ungated key sets")):
        code, _, err = _run(capsys, ["bench", "positions", "--preset", "tiny", "--device", "cpu", "--no-progress",
                                     "--cache-dir", str(tmp_path / "none"), "--out", str(tmp_path / "bad.json"), *bad])
        assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, err
        assert not (tmp_path / "bad.json").exists() and not (tmp_path / "none").exists()


def test_generate_prints_the_text_and_writes_its_marks(capsys, wikitext_dir, tmp_path, monkeypatch):
    from wmtp import tokenizer

    base = ["generate", "--preset", "tiny", "--dataset-dir", str(wikitext_dir), "--device", "cpu", "--seed", "0",
            "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--max-new-tokens", "12"]
    out = tmp_path / "g.json"
    code, stdout, err = _run(capsys, [*base, " the of and in", "--out", str(out)])
    assert code == 0, err
    m = json.loads(out.read_text())
    assert m["kind"] == "generate" and m["preset"] == "tiny" and (m["depth"], m["decode_dtype"]) == (3, "float64")
    (r,) = m["runs"]
    assert (r["n_sink"], r["window"], r["identical_to_dense_greedy"]) == (4, 16, True)  # the preset's key set
    assert r["proposed"] == 3 * r["steps"] and r["draft_keys_read"] <= (4 + 16) * r["draft_queries"]
    assert r["ids"] == m["dense_ids"] and len(r["drafted"]) == 12 and r["drafted"][0] is False
    assert r["steps"] == r["drafted"][1:].count(False) + r["drafted"][-1]
    tok = tokenizer.train_tokenizer(__import__("wmtp").data.load_corpus(str(wikitext_dir)), 512, tmp_path / "cache")
    assert r["text"] == tokenizer.decode(tok, r["ids"])
    assert m["prompt_ids"] == tokenizer.encode(tok, " the of and in").tolist()
    assert " ".join(r["text"].split()) in " ".join(stdout.split())  # the new text, printed
    assert "identical to dense greedy" in stdout and "yes" in stdout and "Traceback" not in err
    assert "dense greedy decoding: 4 prompt tokens" in err and "speculative decoding, sink4+win16, depth 3" in err
    code, stdout, err = _run(capsys, [*base, "--context", "40", "--keyset", "2:3", "native", "2:3@45", "--depth", "2",
                                      "--impl", "torch", "--out", str(out)])
    assert code == 0 and "sink2+win3" in stdout and "native" in stdout and "sink2+win3+gate45" in stdout, err
    m = json.loads(out.read_text())
    assert [(r["n_sink"], r["window"], r["gate"]) for r in m["runs"]] == [(2, 3, None), (0, None, None), (2, 3, 45)]
    assert len(m["prompt_ids"]) == 40
    assert m["runs"][0]["draft_keys_read"] < m["runs"][2]["draft_keys_read"] < m["runs"][1]["draft_keys_read"]
    assert m["depth"] == 2 and m["impl"] == "torch"
    for r in m["runs"]:  # one text, two sets of marks
        assert r["ids"] == m["dense_ids"] and r["identical_to_dense_greedy"] and r["proposed"] == 2 * r["steps"]
    assert m["runs"][0]["draft_keys_read"] <= (2 + 3) * m["runs"][0]["draft_queries"]
    assert m["runs"][1]["draft_keys_read"] > (2 + 3) * m["runs"][1]["draft_queries"]  # native: the whole context
    code, stdout, err = _run(capsys, [*base, " the of", "--no-check", "--out", str(out)])
    assert code == 0 and "not checked" in stdout and json.loads(out.read_text())["dense_ids"] is None, err
    monkeypatch.setattr("wmtp.generate.greedy_generate", lambda *a, **k: torch.zeros(12, dtype=torch.long))
    code, _, err = _run(capsys, [*base, " the of"])  # a dense run that disagrees: exit 1, said in one line
    assert code == 1 and "differs from dense greedy" in err


@pytest.mark.parametrize("bad,match", [
    (["--keyset", "natve"], "is not native, SINK:WINDOW or SINK:WINDOW@GATE"), (["--keyset=-1:64"], "n_sink must be"),
    (["--keyset", "8:64@0"], "gate must be a positive integer (a context length) or None, got 0\n"),
    (["--depth", "0"], "depth"),
    (["--max-new-tokens", "0"], "at least 1"),
    (["the", "--context", "9"], "not both"), ([""], "empty"), (["--device", "tpu"], "unknown device"),
    (["--preset", "huge"], "unknown preset"), (["--out", "TMP"], "is a folder"), (["--context", "0"], "at least 1"),
    (["--context", "-5"], "at least 1"), (["--max-new-tokens", "5000"], "to 4096"), (["--depth", "65"], "to 64"),
    (["--impl", "bogus"], "invalid choice"), (["--out", "TMP/g.json"], "inside --cache-dir"),
    (["--loop", "graph"], "captures CUDA graphs"),
])
def test_generate_bad_input_exits_2_before_any_work(capsys, tmp_path, bad, match, monkeypatch):
    monkeypatch.setattr("wmtp.data.load_corpus", lambda *a, **k: pytest.fail("work started"))
    code, stdout, err = _run(capsys, ["generate", "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                      str(tmp_path), *(b.replace("TMP", str(tmp_path)) for b in bad)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, err
