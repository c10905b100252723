"""Test configuration. Environment set here, before anything imports triton or datasets:
HF_DATASETS_OFFLINE=1 always (no hub in tests), TRITON_INTERPRET=1 only without a CUDA device."""

import os

os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
