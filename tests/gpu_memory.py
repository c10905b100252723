"""``release_cached_gpu_memory``: what tests/conftest.py does after every test on a CUDA machine.

The GPU suite runs 16 pytest-xdist workers on one card. Each worker's caching allocator keeps the
blocks its largest test asked for after that test ends: in run DL (metrics/gpu-tests-h200.txt)
15 workers held 0.7-9.5 GiB each, and a test asking for 6 GiB found 4.1 GiB free. Handing the
cache back once it passes ``CUDA_CACHE_LIMIT`` keeps a worker's share near what it is using now.
"""

from __future__ import annotations

import torch

CUDA_CACHE_LIMIT = 1 << 30  # bytes a test process may keep reserved on the GPU between tests


def release_cached_gpu_memory(limit: int = CUDA_CACHE_LIMIT) -> bool:
    """Empty the CUDA caching allocator if it holds more than ``limit`` bytes; ``True`` if it did.

    Never initializes CUDA: a process that has not used the GPU has nothing cached."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    if torch.cuda.memory_reserved() <= limit:
        return False
    torch.cuda.empty_cache()
    return True
