"""``wmtp generate``: it prints the new text, checks it against dense greedy decoding (exit 1 where
they differ) and writes each key set's marks; bad input is one line and exit 2 before any work."""

import json
import re
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli as _run
from rich.progress import Progress


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
    code, _, err = _run(capsys, [*base, "--context", "100000000"])  # generate's flag is --context, not --contexts
    assert code == 2 and "Traceback" not in err, err
    assert re.fullmatch(r"wmtp generate: error: the corpus has (\d+) tokens; context 100000000 needs more: "
                        r"pass --context of at most \1 tokens", err.strip().splitlines()[-1]), err
    code, stdout, err = _run(capsys, [*base, "\n\n the of", "--no-check"])  # the prompt, less its blank lines
    assert code == 0 and stdout.startswith(" the of"), (err, stdout[:40])
    monkeypatch.setattr("wmtp.generate.greedy_generate", lambda *a, **k: torch.zeros(12, dtype=torch.long))
    code, _, err = _run(capsys, [*base, " the of"])  # a dense run that disagrees: exit 1, said in one line
    assert code == 1 and "differs from dense greedy" in err


@pytest.mark.parametrize("bad,match", [
    (["--keyset", "natve"], "is not native, SINK:WINDOW or SINK:WINDOW@GATE"),
    (["--keyset=-1:64"], "--keyset -1:64: the sink count must be"),
    (["--keyset", "8:64@0"], "--keyset 8:64@0: the gate must be an integer >= 1 (a context length), got 0\n"),
    (["--depth", "0"], "depth"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be from 1 to 4096, got 0\n"),
    (["the", "--context", "9"], "not both"), ([""], "empty"), (["--device", "tpu"], "unknown device"),
    (["--preset", "huge"], "unknown preset"), (["--out", "TMP"], "is a folder"),
    (["--context", "0"], "--context must be at least 1, got 0\n"),
    (["--context", "-5"], "--context must be at least 1, got -5\n"),  # each flag blamed alone
    (["--max-new-tokens", "5000"], "--max-new-tokens must be from 1 to 4096, got 5000\n"), (["--depth", "65"], "to 64"),
    (["--impl", "bogus"], "invalid choice"), (["--out", "TMP/g.json"], "inside --cache-dir"),
    (["--loop", "graph"], "captures CUDA graphs"), (["--keyset", "8:64", "8:64"], "key set sink8+win64 is given twice"),
    (["ab\udcffc"], "the prompt is not UTF-8 text"),  # argv's byte 0xff, which the tokenizer refused with a traceback
])
def test_generate_bad_input_exits_2_before_any_work(capsys, tmp_path, bad, match, monkeypatch):
    monkeypatch.setattr("wmtp.data.load_corpus", lambda *a, **k: pytest.fail("work started"))
    code, stdout, err = _run(capsys, ["generate", "--preset", "tiny", "--device", "cpu", "--cache-dir",
                                      str(tmp_path), *(b.replace("TMP", str(tmp_path)) for b in bad)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and match in err, err


def test_generate_options_take_their_bounds_and_defaults(tmp_path, monkeypatch):
    """``--max-new-tokens 4096`` and ``--depth 64`` are taken; without ``--depth`` and ``--keyset``,
    the preset's depth and last windowed key set (small: 7 and 8:64); ``--loop graph`` refuses the
    Triton kernels off CUDA (under the interpreter here) as it refuses CUDA's reference; the parser's
    defaults are its help's (mutation round 8: each of those survived)."""
    from wmtp.cli import build_parser
    from wmtp.config import KeySetConfig
    from wmtp.generate_cli import _options

    def options(*argv):
        return _options(build_parser().parse_args(["generate", "--device", "cpu", "--cache-dir", str(tmp_path), *argv]))

    preset, device, dtype, impl, keysets, depth = options("--preset", "tiny", "--max-new-tokens", "4096", "--depth",
                                                          "64", "--impl", "torch")
    assert (preset.name, device, dtype, impl, keysets, depth) == (
        "tiny", torch.device("cpu"), torch.float64, "torch", [KeySetConfig(4, 16)], 64)
    assert options()[4:] == ([KeySetConfig(8, 64)], 7)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as on the CPU (conftest): a CUDA machine's tests run without it
    with pytest.raises(ValueError, match="^--loop graph captures CUDA graphs of the Triton kernels; got device cpu, "
                                         "impl triton$"):
        options("--preset", "tiny", "--impl", "triton", "--loop", "graph")
    args = build_parser().parse_args(["generate"])
    assert (args.max_new_tokens, args.seed, args.preset, args.cache_dir, args.loop, args.impl, args.device) == (
        64, 42, "small", Path(".wmtp-cache"), "eager", "auto", "auto")


def _stub_run(monkeypatch, dense_equal=True):
    """``wmtp generate``'s corpus, tokenizer, models, dense loop and ``generate`` stubbed: splits of ids
    0..399, each id decoding to ``<id>``, end-of-text id 3; the dense run 5 tokens at 4 ms a step; the
    speculative run literal counters. Returns the list each ``generate`` call's arguments go to."""
    from types import SimpleNamespace

    import wmtp
    from wmtp.generate import Generation
    from wmtp.stats import SpecStats

    monkeypatch.setattr("wmtp.data.load_corpus", lambda *a, **k: SimpleNamespace(name="c", message="a stub corpus"))
    monkeypatch.setattr("wmtp.tokenizer.train_tokenizer", lambda *a: None)
    monkeypatch.setattr("wmtp.tokenizer.corpus_token_splits", lambda corpus, tok: {
        "train": torch.arange(200), "valid": torch.arange(200, 300), "test": torch.arange(300, 400)})
    monkeypatch.setattr("wmtp.tokenizer.decode", lambda tok, ids: "".join(f"<{int(i)}>" for i in ids))
    monkeypatch.setattr("wmtp.tokenizer.eos_id", lambda tok: 3)
    models = wmtp.build_models("tiny", seed=0)
    monkeypatch.setattr("wmtp.reproduce.prepare_models", lambda *a, **k: (*models, {}))
    new = torch.tensor([7, 8, 9, 10, 11])

    def dense(target, prompt, max_new_tokens, impl, eos_id, step_times):
        for _ in range(4):  # one append a step, as the eager loop does: each advances the run's bar
            step_times.append(0.004)
        return new

    monkeypatch.setattr("wmtp.generate_cli.loop_functions", lambda loop: (dense,))
    calls = []
    stats = SpecStats(depth=3, proposed=6, accepted=3, committed=4, steps=2, draft_keys_read=120, draft_queries=6,
                      draft_times_s=[0.001, 0.002], verify_times_s=[0.003, 0.002])
    monkeypatch.setattr("wmtp.generate_cli.generate", lambda *a, **k: calls.append((a[2:], k)) or [
        k["on_step"](n) for n in (3, 3)] and Generation(new, [False, True, True, False, True], stats, 0.5, dense_equal))
    return calls


def test_the_bars_are_on_stderr_and_cleared_at_the_end():
    """stdout holds the text and table: the bars go to stderr, transient, and --no-progress disables them."""
    from wmtp.generate_cli import _progress

    on, off = _progress(True), _progress(False)
    assert on.console.stderr and on.live.transient and not on.disable and off.disable
    # each bar: the run's name, the bar, new tokens as M/N, the time so far (mutation round 12: M/N dropped survived)
    assert [type(c).__name__ for c in on.columns] == ["TextColumn", "BarColumn", "MofNCompleteColumn",
                                                      "TimeElapsedColumn"] and on.columns[0].text_format == \
        "{task.description}"


@pytest.mark.parametrize("loop", ["eager", "graph"])
def test_the_dense_bar_hears_every_step_of_either_loop(loop):
    """The dense run's ``_Steps`` under the real loops: the eager one appends each step's seconds, the
    graph one (static_greedy_generate, here without a CUDA graph) extends by all of them at the end;
    either way the bar, from the prefill's token, reaches the output's length (an extend that bypassed
    ``on_step`` left the graph run's bar at 1)."""
    import wmtp
    from wmtp.generate_cli import _Steps

    target, _ = wmtp.build_models("tiny", seed=0)
    steps, heard = _Steps(), []
    steps.on_step = heard.append
    run = wmtp.greedy_generate if loop == "eager" else wmtp.static_greedy_generate
    out = run(target.double(), torch.arange(10), 9, step_times=steps)
    assert len(out) == 9 and len(steps) == 8 and all(t > 0 for t in steps)
    assert heard == ([1] * 8 if loop == "eager" else [8]) and 1 + sum(heard) == len(out)
    quiet = _Steps()  # no bar, any iterable: no loop does either (round 12: both broken survived)
    quiet.extend(iter([0.5, 0.5]))
    quiet.append(0.25)
    assert quiet == [0.5, 0.5, 0.25]


def test_generate_prints_and_writes_what_its_runs_return(capsys, tmp_path, monkeypatch):
    """On stubbed runs: the default prompt is the corpus's last 256 tokens, of which the last 64 are
    printed; the table's cells, the JSON's fields and each run's arguments are literal; a run that
    differs from dense decoding in float64 is called a bug, exit 1 (mutation round 8: a default
    context of 64, 32 tokens printed, the seed, the dense steps, draft and verify times or committed
    tokens written wrong, ms / token in microseconds, gate or check dropped, the float32 reason
    given, each survived)."""
    calls = _stub_run(monkeypatch)
    import wmtp.generate_cli

    bars, shown = [], []  # each call's progress bars, rendering nothing (their tasks' counts are read below)
    monkeypatch.setattr(wmtp.generate_cli, "_progress", lambda enabled: shown.append(enabled) or bars.append(
        Progress(disable=True)) or bars[-1])
    out = tmp_path / "g.json"
    argv = ["generate", "--preset", "tiny", "--device", "cpu", "--seed", "7", "--max-new-tokens", "5",
            "--cache-dir", str(tmp_path / "cache"), "--keyset", "2:3@45", "--out", str(out)]
    code, stdout, err = _run(capsys, argv)
    assert code == 0, err
    lines = stdout.splitlines()
    assert lines[0] == "".join(f"<{i}>" for i in range(336, 400))
    assert "<7><8><9><10><11>" in lines
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert rows == [["dense", "5", "4", "1.00", "", "", "4.000", ""],
                    ["sink2+win3+gate45", "5", "2", "2.00", "0.50", "20", "2.000", "yes"]]
    prompt = torch.arange(144, 400)
    (args, kwargs), = calls
    assert torch.equal(args[0], prompt) and args[1:] == (5, 3, 2, 3, "torch")
    assert torch.equal(kwargs.pop("reference"), torch.tensor([7, 8, 9, 10, 11]))
    assert callable(kwargs.pop("on_step")) and kwargs == {"check": True, "eos_id": 3, "loop": "eager", "gate": 45}
    # a bar per run, of --max-new-tokens: the prefill's token, then each step's (the last step's cut at 5)
    assert [(t.description, t.total, t.completed) for t in bars[0].tasks] == [("dense greedy", 5, 5),
                                                                             ("sink2+win3+gate45", 5, 5)]
    m = json.loads(out.read_text())
    assert (m["seed"], m["prompt_ids"], m["dense_ids"], m["dense_step_s"]) == (7, prompt.tolist(), [7, 8, 9, 10, 11],
                                                                                [0.004] * 4)
    (r,) = m["runs"]
    assert r == {"n_sink": 2, "window": 3, "gate": 45, "ids": [7, 8, 9, 10, 11],
                 "drafted": [False, True, True, False, True], "text": "<7><8><9><10><11>", "steps": 2, "proposed": 6,
                 "accepted": 3, "draft_queries": 6, "draft_keys_read": 120, "mean_accept_length": 2.0,
                 "acceptance_rate": 0.5, "seconds": 0.5, "draft_s": 0.003, "verify_s": 0.005, "committed": 4,
                 "identical_to_dense_greedy": True}
    _stub_run(monkeypatch, dense_equal=False)
    code, _, err = _run(capsys, [*argv[:-2], "--no-progress"])
    assert code == 1 and err.endswith("\nthe output differs from dense greedy decoding: a bug, please report it\n")
    assert shown == [True, False]  # --no-progress reaches the bars
    options = wmtp.generate_cli._options  # decoding in float32, as on MPS: a near-tie, said in one line
    monkeypatch.setattr(wmtp.generate_cli, "_options", lambda args: (*options(args)[:2], torch.float32,
                                                                     *options(args)[3:]))
    code, _, err = _run(capsys, argv[:-2])
    assert code == 1 and err.endswith("\nthe output differs from dense greedy decoding: in float32 a near-tie can "
                                      "flip an argmax (decode.py NOTE [Exactness])\n"), err


def test_each_run_has_its_own_bar_and_no_check_no_dense_bar(capsys, tmp_path, monkeypatch):
    """On stubbed runs that stop short of --max-new-tokens (as at an end-of-text token): each bar counts
    its own run's tokens, 5 and 7 of 8, not the first bar's, and is shown while every run goes (on a
    console of its own here) and gone after; with --no-check there is no dense run and no dense bar;
    --no-progress also reaches the models' training (mutation round 12: a bar read from task 0, the
    dense bar added under --no-check, the key sets' runs after the bars stopped, and prepare_models
    always told to show progress survived)."""
    import io

    from rich.console import Console

    _stub_run(monkeypatch)
    import wmtp.generate_cli
    import wmtp.reproduce

    bars, trained, shown = [], [], []
    monkeypatch.setattr(wmtp.generate_cli, "_progress", lambda enabled: bars.append(Progress(
        console=Console(file=io.StringIO()), auto_refresh=False, disable=not enabled)) or bars[-1])
    prepare, (dense,), generate = (wmtp.reproduce.prepare_models, wmtp.generate_cli.loop_functions("eager"),
                                   wmtp.generate_cli.generate)
    monkeypatch.setattr(wmtp.reproduce, "prepare_models", lambda *a: trained.append(a[7]) or prepare(*a))
    monkeypatch.setattr(wmtp.generate_cli, "loop_functions", lambda loop: (
        lambda *a, **k: shown.append(bars[-1].live.is_started) or dense(*a, **k),))
    monkeypatch.setattr(wmtp.generate_cli, "generate",
                        lambda *a, **k: shown.append(bars[-1].live.is_started) or generate(*a, **k))
    argv = ["generate", "--preset", "tiny", "--device", "cpu", "--max-new-tokens", "8", "--cache-dir",
            str(tmp_path / "cache"), "--keyset", "2:3", "native"]
    for extra in ([], ["--no-check", "--no-progress"]):
        code, _, err = _run(capsys, [*argv, *extra])
        assert code == 0, err
        shown.append(bars[-1].live.is_started)
    assert [[(t.description, t.total, t.completed) for t in bar.tasks] for bar in bars] == [
        [("dense greedy", 8, 5), ("sink2+win3", 8, 7), ("native", 8, 7)], [("sink2+win3", 8, 7), ("native", 8, 7)]]
    assert shown == [True, True, True, False, False, False, False] and trained == [True, False]
