"""What the decoding tests share (tests/test_lossless.py, test_static_decode.py, test_prefill.py, the
lockstep and batched tests): the vocabulary of ``wmtp.grading.harness_models``, seeded random
prompts, the counts that two runs of one request must agree on, a scripted depth policy, a fake
clock, the base of every stand-in draft head, a head that records its logits, a device-side oracle
draft and two per-row ones that check what they are fed (one of them in device ops only)."""

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


class StepClock:
    """A fake ``time.perf_counter`` whose n-th reading is 0 + 1 + ... + n: consecutive readings lie
    1, 2, 3, ... apart, so each span says which two readings it is between."""

    def __init__(self):
        self.calls = 0

    def perf_counter(self):
        self.calls += 1
        return (self.calls - 1) * self.calls / 2


class HeadProxy:
    """A stand-in draft head over the real ``head``: its caches are the head's (``new_cache`` and
    ``write_cache``, the draft protocol of NOTE [Shared draft prefill] in wmtp/prefill.py, forward to
    it); a subclass's ``__call__`` records or scripts what a test needs."""

    def __init__(self, head):
        self.head = head

    def new_cache(self, *args, **kwargs):
        return self.head.new_cache(*args, **kwargs)

    def write_cache(self, *args):
        return self.head.write_cache(*args)


class LogitsRecorder(HeadProxy):
    """The head, recording every call's logits (copies: the static loop's buffers change in place). The
    untrained head accepts no draft, so two runs' tokens and counts agree whatever its cache held; its
    logits tell (``same_drafts``)."""

    def __init__(self, head):
        self.head, self.target, self.logits = head, head.target, []

    def __call__(self, *args, **kwargs):  # kwargs: ``positions`` where a run asks for it
        logits, g = self.head(*args, **kwargs)
        self.logits.append(logits.clone())
        return logits, g


def same_drafts(a: LogitsRecorder, b: LogitsRecorder, msg: str = "") -> None:
    """Assert two runs called their heads equally often with the same logits (1e-12: the cache reads
    of two layouts may sum in another order)."""
    assert len(a.logits) == len(b.logits) > 0, msg
    for i, (x, y) in enumerate(zip(a.logits, b.logits)):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-12, msg=f"{msg} call {i}")


class DeviceOracle(HeadProxy):
    """Right for the first ``j`` drafts of every step, then wrong; device ops only, every row.

    Its hidden output carries the draft index (``SENTINEL + index``), so a recursive call knows which
    draft it makes; rows fed target hidden states (the extend) make draft 0. A row at position ``t``
    guesses the token at ``t + 2`` of ``sequence``.
    """

    SENTINEL = 1e6

    def __init__(self, head, sequence: torch.Tensor, j: int):
        self.head, self.seq, self.j = head, sequence, j

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


def prompts_of(lengths, seed: int = 0) -> list[torch.Tensor]:
    """Prompts of the given lengths (a list of 1-D tensors), drawn as ``random_prompt`` draws one."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lengths]


def scripted_counts(j, i: int, P: int, new: int) -> tuple[int, int]:
    """The steps and accepted drafts of prompt ``i`` (``P`` tokens) decoded alone to ``new`` tokens
    when each step from position ``n`` accepts ``j(i, n)`` drafts and keeps them and a target token."""
    n, kept, steps, accepted = P, 1, 0, 0
    while kept < new:
        a = j(i, n)
        kept, n, steps, accepted = kept + a + 1, n + a + 1, steps + 1, accepted + a
    return steps, accepted


class InputOracle(HeadProxy):
    """The real head with its logits replaced, a script a row, that also checks what it is fed: at a
    step whose row ``b`` verifies from ``n``, the row's drafts are right for the first ``j(b, n)``
    (default ``(7 n + 3 b) % (K + 1)``), then wrong, and any draft whose inputs are not the row's
    true ones (the next token ``seq[b, t + 1]``; for a step's first call, the target's hidden state
    at ``t``) is wrong too. A fixed depth ``K`` makes the calls an extend and ``K - 1`` recursive
    drafts a step, so a call's index in its step is its count modulo ``K`` (the prompts' chains are
    ``write_cache``'s, no call). Every column at position ``t`` of call index ``i`` is scripted as a
    draft of the step at ``n = t + 1 - i``: the extend's last real column gets its row's first
    draft, padded columns something the loop never reads."""

    def __init__(self, target, head, prompts, depth, new, j=None):
        want = [wmtp.greedy_generate(target, p, new + depth + 2, impl="torch") for p in prompts]
        T = max(p.numel() + w.numel() for p, w in zip(prompts, want))
        self.seq = prompts[0].new_zeros(len(prompts), T)  # (B, T): prompt, then greedy tokens
        for b, (p, w) in enumerate(zip(prompts, want)):
            self.seq[b, : p.numel() + w.numel()] = torch.cat([p, w])
        self.hidden = target(self.seq)[1]  # (B, T, d): the target's hidden state at every position
        self.head, self.K, self.want, self.calls = head, depth, want, 0
        self.j = j or (lambda b, n: (7 * n + 3 * b) % (depth + 1))
        self.prompts, self.who = prompts, None  # who: each batch row's prompt

    def spy(self, admit):
        """``Admitter.__call__`` (wmtp/rows.py; NOTE [Refill] in wmtp/batched.py) that tells the oracle
        which row takes which prompt (an admitted prompt's chain is ``write_cache``'s, no call)."""
        def spied(admitter, b, i):
            self.who = self.who or list(range(admitter.tcache.k.shape[1]))
            self.who[b] = i
            return admit(admitter, b, i)
        return spied

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        logits, g = self.head(hidden, next_ids, pos, cache, n_sink, window, impl)
        index, self.calls = self.calls % self.K, self.calls + 1
        B, L = next_ids.shape
        who = self.who or list(range(B))  # the prompt of each row
        seq, hid = self.seq[who], self.hidden[who]  # (B, T), (B, T, d)
        T = seq.shape[1]
        t = pos.expand(B, L)  # (B, L) each column's position
        fed = next_ids == seq.gather(1, (t + 1).clamp(max=T - 1))  # (B, L) the true next token
        if index == 0:  # the target's own hidden states (the head's own ones later in a step)
            true_h = hid.gather(1, t.clamp(max=T - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
            fed &= ((hidden - true_h).abs().amax(-1) <= 1e-8 * true_h.abs().amax())
        truth = seq.gather(1, (t + 2).clamp(max=T - 1))  # (B, L): the token a draft there guesses
        script = torch.tensor([[index < self.j(who[b], int(t[b, c]) + 1 - index) for c in range(L)]
                               for b in range(B)])
        out = torch.zeros_like(logits)  # (B, L, V)
        out.scatter_(2, torch.where(fed & script, truth, (truth + 1) % V)[..., None], 1.0)
        return out, g


class FedOracle(InputOracle):
    """``InputOracle``'s script and check in device ops only, so that a CUDA graph captures it: at a
    step whose row ``b`` verifies from ``n``, the row's drafts are right for the first ``j(b, n)``,
    ``(n (n + 1) / 2 + 3 b) % (K + 1)`` (accept lengths that change from step to step), then wrong,
    and a draft whose inputs are not the row's true ones (the next token; for an extend row, the
    target's hidden state) is wrong too. Row ``b`` holds ``prompts[b]`` (no refill).
    ``DeviceOracle``'s sentinel tells a call's draft index."""

    def __init__(self, target, head, prompts, depth, new):
        super().__init__(target, head, prompts, depth, new, j=lambda b, n: (n * (n + 1) // 2 + 3 * b) % (depth + 1))

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        S, (B, L), T = DeviceOracle.SENTINEL, next_ids.shape, self.seq.shape[1]
        lead = hidden[:, :, 0]  # (B, L)
        index = torch.where(lead >= S, (lead - S).long() + 1, torch.zeros_like(next_ids))  # (B, L) draft index
        t = pos.expand(B, L)  # (B, L) each column's position
        fed = next_ids == self.seq.gather(1, (t + 1).clamp(max=T - 1))  # (B, L) the true next token
        true_h = self.hidden.gather(1, t.clamp(max=T - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
        fed &= (index > 0) | ((hidden - true_h).abs().amax(-1) <= 1e-8 * true_h.abs().amax())
        n, b = t + 1 - index, torch.arange(B, device=t.device)[:, None]  # (B, L) the step's n, (B, 1)
        right = index < (n * (n + 1) // 2 + 3 * b) % (self.K + 1)  # (B, L) j(b, n)
        truth = self.seq.gather(1, (t + 2).clamp(max=T - 1))  # (B, L): the token a draft there guesses
        tok = torch.where(fed & right, truth, (truth + 1) % V)  # (B, L)
        logits = torch.zeros(B, L, V, dtype=hidden.dtype, device=hidden.device).scatter_(2, tok[..., None], 1.0)
        return logits, (index.to(hidden.dtype) + S)[..., None].expand_as(hidden).contiguous()
