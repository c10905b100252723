"""What the decoding tests share (tests/test_lossless.py, test_static_decode.py, test_prefill.py):
the vocabulary of ``wmtp.grading.harness_models``, a seeded random prompt, and the counts that two
runs of one request must agree on."""

import torch

import wmtp

V = 512  # the tiny preset's vocabulary, harness_models()'s


def random_prompt(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` token ids drawn uniformly from the vocabulary by a generator seeded with ``seed``."""
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def same_counts(a: wmtp.SpecStats, b: wmtp.SpecStats) -> None:
    """Assert two runs took the same steps and accepted the same drafts (times may differ)."""
    for key in ("steps", "proposed", "accepted", "committed", "accept_length_histogram", "per_position_accepted"):
        assert getattr(a, key) == getattr(b, key), key
