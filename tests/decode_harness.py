"""What the decoding tests share (tests/test_lossless.py, test_static_decode.py, test_prefill.py, the lockstep tests):
the vocabulary of ``wmtp.grading.harness_models``, seeded random prompts, the counts that two
runs of one request must agree on, a scripted depth policy and a device-side oracle draft."""

import torch

import wmtp

V = 512  # the tiny preset's vocabulary, harness_models()'s


def random_prompt(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` token ids drawn uniformly from the vocabulary by a generator seeded with ``seed``."""
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def random_prompts(B: int, P: int, seed: int = 0) -> torch.Tensor:
    """``B`` prompts of ``P`` token ids ``(B, P)``, drawn as ``random_prompt`` draws one."""
    return torch.randint(0, V, (B, P), generator=torch.Generator().manual_seed(seed))


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


class DeviceOracle:
    """Right for the first ``j`` drafts of every step, then wrong; device ops only, every row.

    Its hidden output carries the draft index (``SENTINEL + index``), so a recursive call knows which
    draft it makes; rows fed target hidden states (the extend) make draft 0. A row at position ``t``
    guesses the token at ``t + 2`` of ``sequence``.
    """

    SENTINEL = 1e6

    def __init__(self, head, sequence: torch.Tensor, j: int):
        self.head, self.seq, self.j = head, sequence, j

    def new_cache(self, *args, **kwargs):
        return self.head.new_cache(*args, **kwargs)

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        lead = hidden[0, :, 0]  # (L,)
        index = torch.where(lead >= self.SENTINEL, (lead - self.SENTINEL).long() + 1, torch.zeros_like(pos))
        seq = self.seq.to(pos.device)
        truth = seq[(pos + 2).clamp(max=seq.numel() - 1)]  # (L,)
        tok = torch.where(index < self.j, truth, (truth + 1) % V)  # (L,)
        logits = torch.zeros(tok.numel(), V, dtype=hidden.dtype, device=hidden.device)
        logits.scatter_(1, tok[:, None], 1.0)
        g = (index.to(hidden.dtype) + self.SENTINEL)[None, :, None].expand_as(hidden).contiguous()
        return logits[None], g
