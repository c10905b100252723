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
