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
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["fifo"]


def test_a_failed_write_names_the_file_asked_for(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(OSError, match=r"cannot write .*f/m\.json: ") as e, atomic_path(afile / "m.json") as tmp:
        tmp.write_text("never")
    assert ".tmp" not in str(e.value)


def test_check_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    check_cache_dir(cache, {"--out": tmp_path / "m.json", "--plot": None})  # a new cache, outputs outside it
    assert not cache.exists()  # checked, not made
    with pytest.raises(ValueError, match="--out .*m.json is inside --cache-dir"):
        check_cache_dir(cache, {"--out": cache / "sub" / "m.json"})
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="--cache-dir .* not a writable folder"):
        check_cache_dir(tmp_path / "f", {})
