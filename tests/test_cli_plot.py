"""``wmtp plot``: it draws the metrics JSON of a reproduction and of ``wmtp bench attention`` (run off
CUDA here), and refuses, in one line with exit 2, a file that is missing, not JSON, not UTF-8, of no
kind it knows or incomplete, and a PNG path that would overwrite its JSON."""

import json
from pathlib import Path

from cli_helpers import run_cli as _run

from wmtp.cli import main


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
    depth = json.loads((Path(__file__).resolve().parents[1] / "metrics" / "bench-depth-cpu.json").read_text())
    (tmp_path / "nopolicies.json").write_text(json.dumps({**depth, "policies": []}))  # bars of no series: 0.8 / 0
    code, _, err = _run(capsys, ["plot", str(tmp_path / "nopolicies.json"), "--out", str(tmp_path / "np.png")])
    assert code == 2 and err.strip().endswith("ZeroDivisionError: float division by zero"), err
    assert "incomplete 'wmtp bench depth' metrics file" in err and len(err.strip().splitlines()) == 1, err
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
    (tmp_path / "none.json").write_text(json.dumps({**m, "rows": []}))  # drew an empty plot, exit 0
    code, _, err = _run(capsys, ["plot", str(tmp_path / "none.json")])
    assert code == 2 and "has no rows to plot" in err and not (tmp_path / "none.png").exists(), err


def test_plot_says_what_it_wrote_and_takes_an_upper_case_png(capsys, tmp_path, monkeypatch):
    """``--out P.PNG`` is a PNG's name too; the command prints the path it drew (render stubbed;
    mutation round 8: the suffix compared without .lower(), and the printed line dropped, survived)."""
    drawn = []
    monkeypatch.setattr("wmtp.plots.render", lambda json_path, png_path: drawn.append((json_path, png_path)) or "x.png")
    (tmp_path / "m.json").write_text("{}")
    code, out, err = _run(capsys, ["plot", str(tmp_path / "m.json"), "--out", str(tmp_path / "P.PNG")])
    assert (code, out, err) == (0, "wrote x.png\n", "")
    assert drawn == [(tmp_path / "m.json", tmp_path / "P.PNG")]
