"""What the decoding tests share (tests/test_lossless.py, test_static_decode.py, test_prefill.py):
the vocabulary of ``wmtp.grading.harness_models``, a seeded random prompt, the counts that two
runs of one request must agree on, and a scripted depth policy."""

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


class Cycling:
    """A depth policy drafting ``depths[0], depths[1], ...`` in turn; it records what the loop told it:
    ``seen`` the (depth, accepted) of each step, ``positions`` the position it was asked at, ``times``
    the (draft, verify) seconds."""

    def __init__(self, depths):
        self.depths, self.max_depth, self.seen, self.positions, self.times = list(depths), max(depths), [], [], []

    def depth(self, position):
        self.positions.append(position)
        return self.depths[len(self.seen) % len(self.depths)]

    def update(self, depth, accepted, draft_s, verify_s):
        self.seen.append((depth, accepted))
        self.times.append((draft_s, verify_s))
