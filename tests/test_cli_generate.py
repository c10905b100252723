"""``wmtp generate``: it prints the new text, checks it against dense greedy decoding (exit 1 where
they differ) and writes each key set's marks; bad input is one line and exit 2 before any work."""

import json

import pytest
import torch
from cli_helpers import run_cli as _run


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
    code, stdout, err = _run(capsys, [*base, "\n\n the of", "--no-check"])  # the prompt, less its blank lines
    assert code == 0 and stdout.startswith(" the of"), (err, stdout[:40])
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
