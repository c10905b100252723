"""The docs site: ``mkdocs build --strict`` passes offline with no warning, and it stays in step
with the code (every public name has an API entry), the README (the same two commands) and the
notebooks (tutorials.md names exactly the notebooks in tutorials/).

mkdocs, mkdocs-material and mkdocstrings come with the ``docs`` extra (``pip install -e ".[dev,docs]"``).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# DESIGN.md, "Public API": the names tests, tutorials and graders import from wmtp.
DESIGN_API = ("TargetLM", "MTPHead", "build_models", "draft_key_indices", "draft_key_mask", "attention",
              "greedy_generate", "speculative_generate", "SpecStats")
# Statically, ``wmtp.attention`` is the subpackage; the exported function is documented by its full path.
DIRECTIVE = {"attention": "wmtp.attention.attention"}


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason='mkdocs is not installed: pip install -e ".[docs]"')
    # The banner mkdocs-material >= 9.7 prints about MkDocs 2.0 is not a build warning: silence it.
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, f"mkdocs build printed warnings:\n{log}"
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def _exported_names() -> list[str]:
    """``wmtp.__all__``, read from wmtp/__init__.py without importing torch."""
    tree = ast.parse((ROOT / "wmtp" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [n for n in ast.literal_eval(node.value) if not n.startswith("__")]
    raise AssertionError("wmtp/__init__.py has no __all__")


@pytest.mark.parametrize("name", sorted(set(DESIGN_API) | set(_exported_names())))
def test_api_page_documents_public_name(name):
    directives = set(re.findall(r"^::: ([\w.]+)", (DOCS / "api.md").read_text(), flags=re.M))
    want = DIRECTIVE.get(name, f"wmtp.{name}")
    assert want in directives, f"docs/api.md has no '::: {want}' entry for the public name wmtp.{name}"


def test_design_api_is_exported():
    missing = set(DESIGN_API) - set(_exported_names())
    assert not missing, f"DESIGN.md's public API names missing from wmtp.__all__: {sorted(missing)}"


def test_getting_started_has_the_readme_commands():
    commands = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(commands) >= 2, "README.md should hold the set-up-and-reproduce and the test commands"
    index = (DOCS / "index.md").read_text()
    for command in commands[:2]:
        assert command in index, f"docs/index.md lacks the README command, verbatim:\n{command}"


def test_tutorials_page_names_the_notebooks():
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tutorials").glob("[0-9][0-9]_*.ipynb")}
    assert len(on_disk) == 11, f"expected the eleven tutorial notebooks, found {sorted(on_disk)}"
    named = set(re.findall(r"`(tutorials/\d\d_\w+\.ipynb)`", (DOCS / "tutorials.md").read_text()))
    assert named == on_disk, (f"docs/tutorials.md names {sorted(named - on_disk)} that do not exist and misses "
                              f"{sorted(on_disk - named)}")


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_library_snippet_prints_what_its_comments_say(page):
    """The 'Using the library' snippet runs, and each line it prints is written in it as a comment."""
    snippet = re.search(r"```python\n(import torch, wmtp\n.*?)```", (ROOT / page).read_text(), flags=re.S).group(1)
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    printed = out.stdout.strip().splitlines()
    assert len(printed) == 3 and all(f"# {line}" in snippet or f"# prints {line}" in snippet for line in printed), \
        (printed, snippet)
