"""Test configuration. Environment set here, before anything imports triton or datasets:
HF_DATASETS_OFFLINE=1 always (no hub in tests), TRITON_INTERPRET=1 only without a CUDA device.
On CUDA, a fixture returns each test's cached GPU memory past 1 GiB to the driver."""

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from gpu_memory import release_cached_gpu_memory  # noqa: E402


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    """After each test on CUDA, cached GPU memory past 1 GiB goes back to the driver (tests/gpu_memory.py)."""
    yield
    if CUDA:
        release_cached_gpu_memory()
