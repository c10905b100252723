"""Size budget (STYLE.md lesson 12): one concept per file, ~300 lines for modules, ~400 for
kernels. A file that outgrows this is a sign it holds two concepts."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "wmtp"
LIMIT, KERNEL_LIMIT = 400, 450  # headroom over the ~300/~400 aims, a hard stop against frameworks
FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_file_size_budget(path):
    lines = len(path.read_text().splitlines())
    limit = KERNEL_LIMIT if path.name.startswith("triton_") else LIMIT
    assert lines <= limit, f"{path.name} has {lines} lines (limit {limit}): split it by concept"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_module_docstring(path):
    text = path.read_text().lstrip()
    assert text.startswith('"""'), f"{path.name} needs a module docstring saying what it holds"
