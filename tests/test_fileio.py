"""Tests of wmtp.fileio: atomic writes through links, never over a device or FIFO, errors that name
the file asked for, and a cache folder that holds no output."""

import os

import pytest

from wmtp.fileio import atomic_path, check_cache_dir, check_writable


def test_atomic_path_writes_through_a_symbolic_link(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    check_writable(link, "--out")
    with atomic_path(link) as tmp:
        tmp.write_text("new")
    assert link.is_symlink() and target.read_text() == "new"  # the link kept, its target replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]  # no temp file left


def test_a_fifo_is_refused_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="--out .*fifo is not a regular file"):
        check_writable(fifo, "--out")
    with pytest.raises(ValueError, match="is not a regular file"), atomic_path(fifo) as tmp:
        tmp.write_text("never")
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    with pytest.raises(ValueError, match=r"--out .*link\.json \(a link to .*fifo\) is not a regular file"):
        check_writable(link, "--out")
    assert fifo.is_fifo() and sorted(os.listdir(tmp_path)) == ["fifo", "link.json"]


def test_a_failed_write_names_what_failed_not_the_temporary_file(tmp_path, monkeypatch):
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(OSError, match=r"cannot make folder .*/f: "), atomic_path(afile / "m.json") as tmp:
        tmp.write_text("never")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    with pytest.raises(PermissionError, match=r"cannot write .*/m\.json: Permission denied") as e, \
            atomic_path(tmp_path / "m.json") as tmp:
        tmp.write_text("never")
    assert ".tmp" not in str(e.value) and os.listdir(tmp_path) == ["f"]


def test_check_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    check_cache_dir(cache, {"--out": tmp_path / "m.json", "--plot": None})  # a new cache, outputs outside it
    assert not cache.exists()  # checked, not made
    with pytest.raises(ValueError, match="--out .*m.json is inside --cache-dir"):
        check_cache_dir(cache, {"--out": cache / "sub" / "m.json"})
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="--cache-dir .* not a writable folder"):
        check_cache_dir(tmp_path / "f", {})
    for cache in (tmp_path / "f", tmp_path / "f" / "cache"):  # the folder asked for, not its probe file 'x'
        with pytest.raises(ValueError, match=f"^--cache-dir {cache} cannot be made: {tmp_path / 'f'} is not a "
                                             "writable folder$"):
            check_cache_dir(cache, {})


def test_a_name_of_the_longest_length_is_written_and_a_longer_one_refused_up_front(tmp_path):
    """A 255-byte name (the longest most file systems take) passed check_writable, then its temporary
    file's longer name failed the write after all the work ('wmtp reproduce --out' with it decoded, then
    lost its JSON); a longer name was an OSError, not check_writable's ValueError."""
    longest = tmp_path / ("m" * 250 + ".json")
    check_writable(longest, "--out")
    with atomic_path(longest) as tmp:
        tmp.write_text("{}")
    assert longest.read_text() == "{}" and os.listdir(tmp_path) == [longest.name]  # no temporary file left
    wide = tmp_path / ("é" * 125 + ".json")  # 255 bytes in UTF-8: the temporary name is cut in bytes
    with atomic_path(wide) as tmp:
        tmp.write_text("{}")
    assert wide.read_text() == "{}"
    for path in (tmp_path / ("m" * 251 + ".json"), tmp_path / ("d" * 256) / "m.json"):
        with pytest.raises(ValueError, match="^--out .* cannot be written: File name too long$"):
            check_writable(path, "--out")


def test_an_atomic_write_is_readable_by_all(tmp_path):
    """mkstemp makes its temporary file 0600; the file written is 0644, as open() would make it."""
    with atomic_path(tmp_path / "m.json") as tmp:
        tmp.write_text("{}")
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o644


def test_paths_are_compared_as_the_files_they_name(tmp_path, monkeypatch):
    """An output reached through ``..`` or a relative path is inside the cache all the same, and two
    spellings of one file are one file."""
    from wmtp.fileio import check_distinct

    (tmp_path / "a").mkdir()
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="is inside --cache-dir"):
        check_cache_dir(tmp_path / "a" / ".." / "cache", {"--out": cache / "m.json"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="is inside --cache-dir"):
        check_cache_dir(cache, {"--out": "cache/m.json"})
    with pytest.raises(ValueError, match="--plot m.png is the same file as --out .*/m.png: give them two names"):
        check_distinct(tmp_path / "m.png", "m.png", "--out", "--plot")
    check_distinct(tmp_path / "m.json", "m.png", "--out", "--plot")


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    """The temporary file sits beside the output (``os.replace`` is atomic on one file system only), and
    a block that raises leaves the old file as it was and no temporary file."""
    out = tmp_path / "m.json"
    out.write_text("old")
    with pytest.raises(RuntimeError, match="stopped"), atomic_path(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        tmp.write_text("half")
        raise RuntimeError("stopped")
    assert out.read_text() == "old" and os.listdir(tmp_path) == ["m.json"]


def test_a_checkpoint_or_metrics_write_that_fails_leaves_the_old_file(tmp_path, monkeypatch):
    """The library's writers go through ``atomic_path``: a save that dies half-written (a full disk, a
    killed run) leaves the old checkpoint or metrics file whole (session 54: either writer writing
    straight to its path passed every test, which only looked for leftover temporary files)."""
    from pathlib import Path

    import torch

    import wmtp
    from wmtp.metrics import write_json
    from wmtp.train import save_checkpoint

    def half_save(_obj, f, *a, **k):  # torch.save writing the first 100 bytes, then failing
        Path(f).write_bytes(whole[:100])
        raise OSError(28, "No space left on device")

    target, head = wmtp.build_models("tiny", seed=0)
    ckpt = tmp_path / "ckpt.pt"
    save_checkpoint(ckpt, target, head, {"v": 1})
    whole = ckpt.read_bytes()
    monkeypatch.setattr(torch, "save", half_save)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(ckpt, target, head, {"v": 2})
    metrics = tmp_path / "m.json"
    write_json(metrics, {"a": 1})
    real_write_text = Path.write_text

    def half_text(self, text, *a, **k):
        real_write_text(self, text[:3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_text)
    with pytest.raises(OSError, match="No space"):
        write_json(metrics, {"a": 2})
    monkeypatch.undo()
    assert ckpt.read_bytes() == whole and metrics.read_text() == '{\n  "a": 1\n}\n'
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "m.json"]


def test_missing_folders_are_made_below_the_nearest_existing_one(tmp_path):
    """An output two folders below any that exists passes ``check_writable`` (which makes nothing) and
    ``atomic_path`` makes both folders (the nearest existing ancestor found by one step up, and a
    folder made without its parents, survived every test: each path had at most one missing folder)."""
    check_writable(tmp_path / "c" / "d" / "m.json", "--out")
    assert os.listdir(tmp_path) == []
    with atomic_path(tmp_path / "a" / "b" / "m.json") as tmp:
        tmp.write_text("{}")
    assert (tmp_path / "a" / "b" / "m.json").read_text() == "{}"


def test_a_links_folder_is_its_targets_and_a_filled_cache_is_only_read(tmp_path, monkeypatch):
    """A folder that refuses new files (a read-only mount, faked): an output linked into it is refused
    up front, though the link's own folder takes files (checking the link's folder survived every
    test); an existing cache folder there passes, since a filled cache is only read (refusing it
    survived too), as does an output-free run from inside the cache."""
    import tempfile

    plain = tempfile.TemporaryFile

    def refuse_in(folder):
        def temporary_file(*args, dir=None, **kwargs):
            if dir is not None and os.path.samefile(dir, folder):
                raise PermissionError(30, "Read-only file system")
            return plain(*args, dir=dir, **kwargs)
        return temporary_file

    out, ro = tmp_path / "out", tmp_path / "ro"
    out.mkdir()
    ro.mkdir()
    (out / "link.json").symlink_to(ro / "m.json")
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse_in(ro))
    with pytest.raises(ValueError, match=rf"^--out {out / 'link.json'} cannot be written: {ro} refuses a new file "
                                         r"\(Read-only file system\)$"):
        check_writable(out / "link.json", "--out")
    check_writable(out / "m.json", "--out")
    check_cache_dir(ro, {"--out": out / "m.json"})
    monkeypatch.chdir(ro)
    check_cache_dir(ro, {"--plot": None})


def test_a_path_that_is_no_link_is_named_as_given(tmp_path, monkeypatch):
    """A relative path is no link: the error names it as given, without '(a link to ...)' (every path
    taken through realpath survived every test)."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^--out sub is a folder, not a file path$"):
        check_writable("sub", "--out")


def test_a_rename_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    """The block succeeds and the rename fails (the output made a folder meanwhile, a full disk...):
    the error passes, the old file stays and the temporary file is removed (removing it only when
    the block raised survived every test); mkstemp's descriptor is closed (left open survived too)."""
    import tempfile

    made, plain = [], tempfile.mkstemp

    def mkstemp(**kwargs):
        made.append(plain(**kwargs))
        return made[-1]

    def refuse(*args):
        raise OSError(28, "No space left on device")

    out = tmp_path / "m.json"
    out.write_text("old")
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"), atomic_path(out) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "old" and os.listdir(tmp_path) == ["m.json"]
    with pytest.raises(OSError):
        os.fstat(made[0][0])
