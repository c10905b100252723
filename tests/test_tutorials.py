"""Tutorial notebooks: each .ipynb executes on CPU, carries no outputs, and matches its .py twin.

The notebooks are edited as jupytext percent-format ``.py`` files and converted with
``jupytext --to ipynb tutorials/[0-9][0-9]_*.py``; the ``.ipynb`` is what Jupyter opens. Each is executed
with nbclient in a ``python3`` kernel, in the repository root, with ``HF_DATASETS_OFFLINE=1`` and,
without CUDA, ``TRITON_INTERPRET=1`` in the kernel's environment (the kernel inherits it).
"""

from pathlib import Path

import jupytext
import nbclient
import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = ["01_key_set", "02_target_and_mtp_head", "03_greedy_verification", "04_triton_kernel",
             "05_long_context_draft_tax", "06_ring_buffer", "07_sampled_verification", "08_reindexed_positions",
             "09_draft_depth", "10_paged_cache", "11_lockstep_batches"]
ARC = ["What you will learn", "Naive reference", "Mechanism", "Check", "Measure", "Discussion"]
CELL_TIMEOUT_S = 300  # a hang guard, not a speed bar: 07 ran 106 s alone, one cell over 120 s on busy cores


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_every_notebook_is_listed():
    assert sorted(p.stem for p in TUTORIALS.glob("*.ipynb")) == NOTEBOOKS
    assert sorted(p.stem for p in TUTORIALS.glob("[0-9][0-9]_*.py")) == NOTEBOOKS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stripped_and_matches_its_twin(name):
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: outputs committed"
    twin = jupytext.read(TUTORIALS / f"{name}.py")
    assert _cells(nb) == _cells(twin), f"{name}.ipynb is stale: run jupytext --to ipynb tutorials/{name}.py"
    headings = [line.lstrip("# ").strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")]
    assert [h for h in headings if h in ARC] == ARC, f"{name}: the arc is {ARC}, got {headings}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
