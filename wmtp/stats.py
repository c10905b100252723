"""The counters of one speculative generation: what every report of acceptance (AL, acceptance
rate, accept lengths) and of time (draft and verify seconds per step) is computed from (arXiv
2607.21535, Sec. 2: AL, the mean accept length, and the step-cost model's phases).

Every loop fills one: the eager loops (wmtp/decode.py, wmtp/sampling.py) and the device-resident
ones (wmtp/static_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpecStats"]


@dataclass
class SpecStats:
    """Counters of one speculative generation. ``accept_length_histogram[a]``: steps accepting ``a``
    drafts; ``steps_by_depth[k]``: steps that drafted ``k`` (all at ``depth`` unless a depth policy,
    wmtp/policy.py, varied it: ``depth`` is then its largest)."""

    depth: int
    proposed: int = 0
    accepted: int = 0  # drafts the verifier accepted (a draft past max_new_tokens or eos_id included)
    committed: int = 0  # tokens the steps added to the output (after its cut at max_new_tokens / eos_id)
    steps: int = 0
    accept_length_histogram: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    draft_keys_read: int = 0  # keys read by draft attention while decoding (prompt prefill excluded)
    draft_queries: int = 0
    draft_kv_bytes: int = 0  # keys and values the draft's cache holds (a ring holds its key set only)
    draft_times_s: list[float] = field(default_factory=list)  # per step: draft extend + recursive drafts
    verify_times_s: list[float] = field(default_factory=list)  # per step: the target's verify pass
    steps_by_depth: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accept_length_histogram = self.accept_length_histogram or [0] * (self.depth + 1)
        self.per_position_accepted = self.per_position_accepted or [0] * self.depth
        self.steps_by_depth = self.steps_by_depth or [0] * (self.depth + 1)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts."""
        return self.accepted / max(self.proposed, 1)

    @property
    def mean_accept_length(self) -> float:
        """Tokens committed per target pass (accepted drafts + the target's token): the paper's AL.
        Counted on the output, so drafts accepted past ``max_new_tokens`` or ``eos_id`` in the last
        step, which are cut, do not count (TPOT = step time / AL must divide by tokens kept)."""
        return self.committed / max(self.steps, 1)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Fraction of steps in which draft position ``i`` (0-based) was accepted."""
        return [a / max(self.steps, 1) for a in self.per_position_accepted]

    def add_step(self, accepted: int, draft_s: float, verify_s: float, depth: int | None = None) -> None:
        """Count one step that accepted ``accepted`` of its ``depth`` drafts (default: ``self.depth``),
        and its two times."""
        depth = self.depth if depth is None else depth
        self.draft_times_s.append(draft_s)
        self.verify_times_s.append(verify_s)
        self.steps += 1
        self.proposed += depth
        self.steps_by_depth[depth] += 1
        self.accepted += accepted
        self.accept_length_histogram[accepted] += 1
        for i in range(accepted):
            self.per_position_accepted[i] += 1

    def to_dict(self) -> dict:
        keys = ("depth", "proposed", "accepted", "committed", "steps", "accept_length_histogram", "steps_by_depth",
                "draft_keys_read", "draft_kv_bytes",
                "draft_queries", "draft_times_s", "verify_times_s", "acceptance_rate",
                "mean_accept_length", "per_position_acceptance")
        return {k: getattr(self, k) for k in keys}
