"""Test configuration. Environment set here, before anything imports triton or datasets:
HF_DATASETS_OFFLINE=1 always (no hub in tests), TRITON_INTERPRET=1 only without a CUDA device, and on
x86-64 OPENBLAS_CORETYPE=Prescott (the interpreter's products keep their bits whatever a tile's rows).
On CUDA, a fixture returns each test's cached GPU memory past 1 GiB to the driver. Also the fixtures
that several test files share: ``wikitext_dir``, the small corpus the command-line tests train on
(tests/test_cli_*.py; its tests are marked ``needs_datasets``), and ``one_thread``, which the grader
tests ask for (tests/test_grading_*.py)."""

import os
import platform
import random

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
if platform.machine().lower() in ("x86_64", "amd64"):  # before torch imports numpy, which loads OpenBLAS
    # The Triton interpreter's tl.dot is numpy's matmul, so OpenBLAS. Its AVX2 (Haswell) kernels give a
    # row other bits when the product has more rows (a (64, K) @ (K, N) row differs from the same row of a
    # (32, K) product), so a tile padded to 64 rows and one of 32 disagreed in the last bit on such CPUs
    # (tests/test_query_chunks.py, bit for bit) and agreed on others. The SSE3 kernels (any x86-64 CPU)
    # give a row the same bits at 8 to 64 rows (test_query_chunks.py checks it on the machine it runs on).
    os.environ.setdefault("OPENBLAS_CORETYPE", "Prescott")

import torch  # noqa: E402

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gpu_memory import release_cached_gpu_memory  # noqa: E402

WORDS = "the of and in to a was is for on as with by he at from his an were are which it this that".split()


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    """After each test on CUDA, cached GPU memory past 1 GiB goes back to the driver (tests/gpu_memory.py)."""
    yield
    if CUDA:
        release_cached_gpu_memory()


def pytest_collection_modifyitems(items):
    """A test that reads a WikiText folder (the ``wikitext_dir`` fixture) goes through the `datasets`
    package: it is marked ``needs_datasets``. CI installs `datasets` and runs every test; the device
    machines have none, and their runs say ``-m "not needs_datasets"`` (docs/results/gpu-attention.md)."""
    for item in items:
        if "wikitext_dir" in getattr(item, "fixturenames", ()):
            item.add_marker("needs_datasets")


@pytest.fixture(scope="module")
def wikitext_dir(tmp_path_factory):
    """A small WikiText-format corpus (train/valid/test.txt) with some structure to learn."""
    root = tmp_path_factory.mktemp("wikitext")
    rng = random.Random(0)
    for split, n in [("train", 1500), ("valid", 300), ("test", 300)]:
        lines = []
        for i in range(n):
            if i % 25 == 0:
                lines.append(f" = Section {i // 25} = ")
            lines.append(" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) + " . ")
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def one_thread():
    """The harness's matrices are 64 wide: one thread is fastest and leaves the other cores alone."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
