"""The ``wmtp`` command's files and folders: an ``--out`` that is a folder, a fifo, under a file, inside
``--cache-dir``, named like its plot or like a checkpoint it would overwrite; a ``--cache-dir`` or
dataset dir that cannot serve; a folder that refuses a new file though ``os.access`` says yes. Each
is one line and exit 2, before any work and without writing anything."""

import os

import pytest
from cli_helpers import run_cli as _run


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
        (["bench", "decode", "--device", "cpu", "--out", str(tmp_path / "fifo.json")], "--out's plot"),
        (["bench", "sampling", "--device", "cpu", "--out", str(tmp_path / "b.png")], "is the same file as --out"),
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
        (["bench", "attention", "--device", "cpu", "--out", str(tmp_path / "a.png")], "the metrics file is JSON"),
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


def test_empty_dataset_dir(capsys, tmp_path):
    code, _, err = _run(capsys, ["reproduce", "--dataset-dir", str(tmp_path)])
    assert code == 2 and "empty" in err


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
