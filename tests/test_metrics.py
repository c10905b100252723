"""The metrics JSON's provenance (wmtp/metrics.py): the versions, git revision, CPU and device a run
records, and the JSON writer's exact text. The step-cost formulas are tested in
test_reproduce_figures.py, the recorded command line in test_cli_args.py."""

import io
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

import wmtp
from wmtp import metrics


def test_version_of_wmtp_is_the_package_s_and_a_missing_package_is_none(monkeypatch):
    """wmtp's version comes from the package itself (a checkout that is not pip-installed has no
    distribution metadata); any other package not installed is ``None``."""
    assert metrics._version("wmtp-no-such-package") is None

    def missing(pkg):
        raise metadata.PackageNotFoundError(pkg)

    monkeypatch.setattr(metrics.metadata, "version", missing)
    assert metrics._version("wmtp") == wmtp.__version__
    assert metrics._version("torch") is None


def _git(cwd, *args):
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_git_revision_is_head_dirty_only_for_changed_tracked_files(tmp_path):
    """``HEAD``'s hash; ``-dirty`` once a tracked file changes, not for an untracked one; ``None`` in a
    folder outside any repository."""
    assert metrics.git_revision(tmp_path) is None  # no repository: git fails, no empty revision
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert len(head) == 40
    assert metrics.git_revision(repo) == head
    (repo / "untracked.txt").write_text("new\n")
    assert metrics.git_revision(repo) == head  # an untracked file leaves the revision clean
    (repo / "a.txt").write_text("b\n")
    assert metrics.git_revision(repo) == head + "-dirty"


def test_git_revision_is_none_when_git_is_missing_or_hangs(monkeypatch):
    """No git (an OSError) or a git that times out: ``None``, no exception."""
    def timeout(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], 5)

    monkeypatch.setattr(metrics.subprocess, "run", timeout)
    assert metrics.git_revision() is None

    def absent(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(metrics.subprocess, "run", absent)
    assert metrics.git_revision() is None


def test_environment_records_this_run(monkeypatch):
    """Python's version number, the CPU count (not torch's threads), the device as given, the
    packages by name, and the revision of wmtp's own folder (not the current folder's)."""
    folders = []
    monkeypatch.setattr(metrics, "git_revision", lambda cwd=None: folders.append(cwd) or "abc123")
    monkeypatch.setattr(metrics.os, "cpu_count", lambda: 7)
    monkeypatch.setattr(metrics.torch, "get_num_threads", lambda: 3)
    env = metrics.environment("cpu:0")
    assert env["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert (env["cpu_count"], env["torch_threads"], env["device"]) == (7, 3, "cpu:0")
    assert list(env["versions"]) == ["torch", "triton", "datasets", "tokenizers", "numpy", "wmtp"]
    assert env["versions"]["torch"] == metadata.version("torch")
    assert env["git_revision"] == "abc123"
    assert folders == [Path(wmtp.__file__).resolve().parent]
    assert "device_name" not in env


def test_environment_names_a_cuda_device(monkeypatch):
    """On a CUDA device the environment names the card it ran on (no GPU needed: the name is faked)."""
    asked = []
    monkeypatch.setattr(metrics.torch.cuda, "get_device_name", lambda d: asked.append(d) or "Fake H100")
    monkeypatch.setattr(metrics, "git_revision", lambda cwd=None: None)
    env = metrics.environment("cuda:1")
    assert (env["device"], env["device_name"]) == ("cuda:1", "Fake H100")
    assert asked == [torch.device("cuda:1")]


def test_cpu_model_is_cpuinfo_s_model_name_else_the_platform_s(monkeypatch):
    """The ``model name`` line's value, stripped (not the ``model`` line before it); without the
    line, or without /proc/cpuinfo, ``platform.processor()``."""
    monkeypatch.setattr(metrics.platform, "processor", lambda: "x86_64")
    text = "processor\t: 0\nmodel\t\t: 85\nmodel name\t: Fake CPU 9000 @ 2.00GHz\nflags\t\t: fpu\n"
    monkeypatch.setattr(metrics, "open", lambda path: io.StringIO(text), raising=False)
    assert metrics.cpu() == {"model": "Fake CPU 9000 @ 2.00GHz",
                             "capability": torch.backends.cpu.get_cpu_capability()}
    monkeypatch.setattr(metrics, "open", lambda path: io.StringIO("processor\t: 0\n"), raising=False)
    assert metrics.cpu()["model"] == "x86_64"

    def unreadable(path):
        raise PermissionError(path)

    monkeypatch.setattr(metrics, "open", unreadable, raising=False)
    assert metrics.cpu()["model"] == "x86_64"


def test_write_json_writes_indented_json_with_a_final_newline(tmp_path):
    """Two-space indented JSON ending in a newline, at the path asked for, which it returns."""
    out = tmp_path / "m.json"
    assert metrics.write_json(out, {"a": 1, "b": [1, 2]}) == out
    assert out.read_text() == '{\n  "a": 1,\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
