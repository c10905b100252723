"""The ``wmtp`` command's arguments: help texts, ``--version`` and ``python -m wmtp``, the
``auto-research`` alias, bad argument values (exit 2, one line, no traceback) and the devices they
name (resolved in one place; an absent CUDA or MPS, or float64 on MPS, is one line)."""

from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli as _run

from wmtp.cli import auto_research_main


def test_help_lists_every_subcommand_and_flag(capsys):
    code, out, _ = _run(capsys, ["--help"])
    assert code == 0 and "reproduce" in out and "bench" in out
    code, out, _ = _run(capsys, ["reproduce", "--help"])
    for flag in ("--paper", "--dataset-dir", "--device", "--seed", "--preset", "--out", "--depth", "--keysets"):
        assert flag in out
    code, out, _ = _run(capsys, ["bench", "attention", "--help"])
    assert code == 0 and "--contexts" in out
    # the bars a user can read, not an issue tracker's they never see
    assert "the bars of docs/results/gpu-attention.md" in " ".join(out.split()) and "issue" not in out


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
    assert run.returncode == 2
    assert run.stderr == "python -m wmtp reproduce: error: depth must be an integer >= 1, got 0\n"
    assert "Traceback" not in run.stderr
    assert command_line("python -m wmtp", ["generate", "it's a prompt", "--seed", "1"]) == (
        "python -m wmtp generate 'it'\"'\"'s a prompt' --seed 1")
    assert environment("cpu")["versions"]["wmtp"] == wmtp.__version__
    cpu = environment("cpu")["cpu"]  # another CPU can train another model (docs/results/cpu-reproduction.md)
    assert cpu["capability"] == torch.backends.cpu.get_cpu_capability() and isinstance(cpu["model"], str)


BAD = [
    (["reproduce", "--depth", "0"], "depth"),
    (["reproduce", "--depth", "-3"], "depth"),
    (["reproduce", "--keysets=-1:64"], "sink count"),
    (["reproduce", "--keysets", "-1:64"],  # "-1:64" was read as an option
     "--keysets -1:64: the sink count must be an integer from 0 to 2**62, got -1"),
    (["generate", "--keyset", "8:64", "-1:64"], "--keyset -1:64: the sink count"),
    (["reproduce", "--contexts", "-5"], "--contexts"),
    (["reproduce", "--keysets", "8:-2"], "window"),
    # the flag and the value named, in the command line's terms (KeySetConfig's own words say "or None")
    (["reproduce", "--keysets", "4:-16"], "error: --keysets 4:-16: the window must be an integer from 1 to 2**62, "
                                          "got -16\n"),
    (["reproduce", "--keysets", "8:64@-3"], "error: --keysets 8:64@-3: the gate must be an integer >= 1 (a context "
                                            "length), got -3\n"),
    (["bench", "decode", "--keysets", "8:0"], "error: --keysets 8:0: the window must be"),
    (["generate", "--keyset", "8:0"], "error: --keyset 8:0: the window must be"),
    (["reproduce", "--keysets", "8:99999999999999999999"],
     "--keysets 8:99999999999999999999: the window must be an integer from 1 to 2**62, got 99999999999999999999\n"),
    (["generate", "--keyset", "99999999999999999999:1"],  # a wrapped key set, an OverflowError once trained
     "--keyset 99999999999999999999:1: the sink count must be an integer from 0 to 2**62, got 99999999999999999999\n"),
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
    (["generate", "--keyset", "native", "8:64", "native"], "key set native is given twice"),  # ran twice
    (["reproduce", "--device", "auto:3"], "only cuda and mps take an index"), (["bench", "decode", "--device", "cpu:1"],
                                                                             "only cuda and mps take an index"),
    (["plot", ""], "is a folder"),
    (["reproduce", "--paper", "other"], "invalid choice"),
    (["bench", "attention", "--device", "tpu"], "unknown device"),
    (["bench", "attention", "--repeats", "0"], "positive"),
]


@pytest.mark.parametrize("argv,match", BAD)
def test_bad_input_exits_2_with_one_line(capsys, argv, match, monkeypatch):
    import wmtp.cli

    monkeypatch.setattr("wmtp.device.mps_available", lambda: False)  # "mps absent" on a Mac too
    # input let through fails here, not after minutes of training (mutation round 8: --seed abc read as 0)
    monkeypatch.setattr("wmtp.reproduce.prepare_models", lambda *a, **k: pytest.fail("the training started"))
    for bench in wmtp.cli.BENCHES:
        monkeypatch.setattr(f"wmtp.bench_{bench}.bench_setup", lambda *a, **k: pytest.fail("the bench started"))
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error for an absent CUDA device")
def test_absent_cuda_is_a_clear_error(capsys):
    code, _, err = _run(capsys, ["reproduce", "--device", "cuda"])
    assert code == 2 and "CUDA is not available" in err


def test_auto_research_alias(capsys):
    code, out, _ = _run(capsys, ["reproduce", "--help"], auto_research_main)
    assert code == 0 and "auto-research" in out
    code, _, err = _run(capsys, ["reproduce", "--depth", "0"], auto_research_main)
    assert code == 2 and err.startswith("auto-research reproduce: error:")


def test_a_missing_subcommand_is_a_usage_error(capsys, monkeypatch):
    """``wmtp`` alone and ``wmtp bench`` alone: argparse's one line and exit 2, not a traceback nor a
    benchmark (mutation round 8: either subparser's required=True dropped survived)."""
    monkeypatch.setattr("wmtp.bench.attention_cli", lambda *a: pytest.fail("the bench started"))
    assert _run(capsys, []) == (2, "", "wmtp: error: the following arguments are required: command "
                                       "(see `wmtp --help`)\n")
    assert _run(capsys, ["bench"]) == (2, "", "wmtp bench: error: the following arguments are required: bench "
                                              "(see `wmtp bench --help`)\n")


def test_an_unknown_option_names_its_subcommand(capsys, monkeypatch):
    """argparse said ``wmtp: error: unrecognized arguments`` for an option the subcommand lacks."""
    monkeypatch.setattr("wmtp.reproduce.prepare_models", lambda *a, **k: pytest.fail("the training started"))
    monkeypatch.setattr("wmtp.bench_decode.bench_setup", lambda *a, **k: pytest.fail("the bench started"))
    assert _run(capsys, ["reproduce", "--bogus"]) == (2, "", "wmtp reproduce: error: unrecognized arguments: --bogus\n")
    assert _run(capsys, ["bench", "decode", "--max-tokens", "5"]) == (
        2, "", "wmtp bench decode: error: unrecognized arguments: --max-tokens 5\n")
    assert _run(capsys, ["plot", "a.json", "b.json"]) == (2, "", "wmtp plot: error: unrecognized arguments: b.json\n")
