"""Losslessness: speculative greedy output equals dense greedy output, token for token.

Three kinds of draft (STYLE.md lesson 7): an oracle right for exactly ``j`` tokens per step then
wrong (every accept length 0..K), a random untrained MTP head, and a trained one; full and
windowed key sets; depths 1..8; prompts of length 1, n_sink, n_sink+window±1; stop conditions.
Float64 on CPU (decode.py NOTE [Exactness]). The same checks run on every backend: the Triton
kernel under its CPU interpreter (a subset: it is slow), and both impls on CUDA (every arm and depth).
"""

import copy
import dataclasses
import os

import pytest
import torch
from decode_harness import Cycling, StepClock, V, random_prompt
from op_impls import spy_attention_plans

import wmtp
from wmtp import grading
from wmtp.decode import verify_greedy, verify_greedy_loop
from wmtp.grading import harness_models

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KEYSETS = [(0, None), (4, 16), (0, 1), (2, 3), (4, 1000)]  # native, windowed, self only, tiny, > context


@pytest.fixture(scope="module")
def models():
    """A tiny float64 target with weights drawn wide enough that greedy output varies, and a random head."""
    return harness_models()


def OracleDraft(head, sequence, j):  # noqa: N802 - reads like the class it builds
    return grading.OracleDraft(head, sequence, j, V)


@pytest.mark.parametrize("depth", [1, 3, 8])
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_oracle_draft_every_accept_length(models, depth, n_sink, window):
    target, head = models
    prompt = random_prompt(12)
    ref = wmtp.greedy_generate(target, prompt, 40)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for j in range(depth + 1):
        out, stats = wmtp.speculative_generate(target, OracleDraft(head, seq, j), prompt, 40, depth, n_sink, window)
        assert torch.equal(out, ref), f"j={j}"
        # every full step accepts exactly j drafts (the last step may be cut by max_new_tokens)
        assert stats.accept_length_histogram[j] >= stats.steps - 1
        assert stats.accepted >= j * (stats.steps - 1)


@pytest.mark.parametrize("depth", range(1, 9))
@pytest.mark.parametrize("n_sink,window", KEYSETS)
def test_random_head_is_lossless(models, depth, n_sink, window):
    target, head = models
    prompt = random_prompt(20, seed=depth)
    ref = wmtp.greedy_generate(target, prompt, 24)
    out, stats = wmtp.speculative_generate(target, head, prompt, 24, depth, n_sink, window)
    assert torch.equal(out, ref)
    assert stats.proposed == stats.steps * depth and len(out) == 24


def test_draft_equal_to_target_accepts_everything(models):
    """An oracle right for all K drafts accepts all of them: AL = K + 1 (51 tokens: the prefill's
    and 10 whole steps of 5, none cut)."""
    target, head = models
    prompt, depth = random_prompt(9), 4
    ref = wmtp.greedy_generate(target, prompt, 51)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    out, stats = wmtp.speculative_generate(target, OracleDraft(head, seq, depth), prompt, 51, depth)
    assert torch.equal(out, ref)
    assert stats.accept_length_histogram[depth] == stats.steps == 10
    assert stats.mean_accept_length == depth + 1


@pytest.mark.parametrize("max_new, eos_at", [(3, None), (7, None), (40, 5), (3, 5)])  # (3, 5): an eos past the cut
def test_accept_length_counts_only_tokens_kept(models, max_new, eos_at):
    """A last step that accepts drafts past max_new_tokens (or past eos_id) is cut; AL counts what is
    kept: 1 (the prefill's token) + AL x steps = len(out). An oracle right for all 8 drafts: AL 9
    while steps are whole, less in a cut last step."""
    target, head = models
    prompt, depth = random_prompt(9), 8
    ref = wmtp.greedy_generate(target, prompt, 40)
    eos = int(ref[eos_at]) if eos_at is not None else None
    ref = wmtp.greedy_generate(target, prompt, max_new, eos_id=eos)
    seq = torch.cat([prompt, wmtp.greedy_generate(target, prompt, 40), torch.zeros(depth + 2, dtype=torch.long)])
    out, stats = wmtp.speculative_generate(target, OracleDraft(head, seq, depth), prompt, max_new, depth, eos_id=eos)
    assert torch.equal(out, ref)
    assert 1 + stats.committed == len(out) and stats.mean_accept_length == stats.committed / stats.steps
    assert stats.accepted == depth * stats.steps  # the verifier accepted every draft, cut or not
    assert stats.mean_accept_length < depth + 1  # 3 -> 2 tokens in one step; 7 -> 6; eos at 5 -> 5


@pytest.mark.parametrize("prompt_len", [1, 9, 30])
@pytest.mark.parametrize("depth", [1, 3])
def test_requests_up_to_the_last_cache_position(models, prompt_len, depth):
    """Greedy writes positions up to P + max_new - 2, speculative up to P + max_new + depth - 2: both
    take every request that fits the cache exactly (a 40-position cache here) and refuse one more."""
    import dataclasses

    target, head = models
    L = 40
    small = wmtp.TargetLM(dataclasses.replace(target.config, max_seq_len=L)).double()
    small.load_state_dict(target.state_dict())
    small_head = wmtp.MTPHead(head.config, small).double()
    small_head.load_state_dict(head.state_dict())
    prompt = random_prompt(prompt_len, seed=prompt_len)
    greedy_max, spec_max = L + 1 - prompt_len, L + 1 - prompt_len - depth
    assert len(wmtp.greedy_generate(small, prompt, greedy_max)) == greedy_max
    with pytest.raises(ValueError, match="KV cache"):
        wmtp.greedy_generate(small, prompt, greedy_max + 1)
    ref = wmtp.greedy_generate(small, prompt, spec_max)
    out, _ = wmtp.speculative_generate(small, small_head, prompt, spec_max, depth, 2, 3)
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="KV cache"):
        wmtp.speculative_generate(small, small_head, prompt, spec_max + 1, depth)
    if prompt_len == 30:  # a prompt that fills the cache: one new token (the prefill's) and no step fit
        full = random_prompt(L, seed=1)
        for max_new in (0, 1):
            out, stats = wmtp.speculative_generate(small, small_head, full, max_new, depth)
            assert torch.equal(out, wmtp.greedy_generate(small, full, max_new)) and stats.steps == 0


def test_a_draft_head_of_another_target_config_is_a_value_error(models):
    target, head = models
    wide = wmtp.TargetLM(dataclasses.replace(target.config, d_model=2 * target.config.d_model)).double()
    with pytest.raises(ValueError, match="another config"):  # was a RuntimeError deep in the head
        wmtp.speculative_generate(target, wmtp.MTPHead(head.config, wide).double(), random_prompt(5), 4, 2)


def test_a_draft_head_of_another_target_of_this_config_is_a_value_error(models):
    """It would draft with the other target's embedding and output head: the output stays the target's,
    the acceptance is another model's (it ran without complaint)."""
    target, head = models
    twin = wmtp.TargetLM(target.config).double()  # same config, its own weights
    other_head = wmtp.MTPHead(head.config, twin).double()
    with pytest.raises(ValueError, match="built on another target"):
        wmtp.speculative_generate(target, other_head, random_prompt(5), 4, 2)
    with pytest.raises(ValueError, match="built on another target"):
        wmtp.prefill_prompt(target, random_prompt(5), 40, draft=other_head)


class CallOnly:
    """A draft with the head's call and ``new_cache`` but no ``write_cache`` (the prefill's)."""

    def __init__(self, head):
        self.head = head

    def new_cache(self, *args, **kwargs):
        return self.head.new_cache(*args, **kwargs)

    def __call__(self, *args):
        return self.head(*args)


@pytest.mark.parametrize("run", ["speculative", "lockstep", "prefill"])
def test_a_draft_without_write_cache_is_a_value_error_before_any_prefill(models, run, monkeypatch):
    """The draft protocol (NOTE [Shared draft prefill] in wmtp/prefill.py), checked up front."""
    target, head = models
    monkeypatch.setattr(target, "forward", lambda *a, **k: pytest.fail("prefilled before refusing"))
    calls = {"speculative": lambda d: wmtp.speculative_generate(target, d, random_prompt(5), 4, 2),
             "lockstep": lambda d: wmtp.lockstep_generate(target, d, random_prompt(5)[None], 4, 2),
             "prefill": lambda d: wmtp.prefill_prompt(target, random_prompt(5), 16, draft=d)}
    with pytest.raises(ValueError, match="CallOnly has no write_cache$"):
        calls[run](CallOnly(head))
    with pytest.raises(ValueError, match="object has no __call__, new_cache, write_cache$"):
        calls[run](object())


def test_any_integer_dtype_of_prompt_decodes_as_int64(models):
    target, head = models
    prompt = random_prompt(9) % 120  # ids that fit int8
    ref = wmtp.greedy_generate(target, prompt, 6)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint16, torch.uint32, torch.uint64):
        assert torch.equal(wmtp.greedy_generate(target, prompt.to(dtype), 6), ref)
        assert torch.equal(wmtp.speculative_generate(target, head, prompt.to(dtype), 6, 2)[0], ref)
    with pytest.raises(ValueError, match=r"prompt token ids must lie in \[0, 512\)"):  # a uint64 id past 2**63 too
        wmtp.greedy_generate(target, torch.tensor([3, 2**63 + 5], dtype=torch.uint64), 6)


@pytest.mark.parametrize("prompt_len", [1, 4, 4 + 16 - 1, 4 + 16, 4 + 16 + 1])
@pytest.mark.parametrize("n_sink,window", [(4, 16), (0, None)])
def test_prompt_lengths_around_the_window(models, prompt_len, n_sink, window):
    target, head = models
    prompt = random_prompt(prompt_len, seed=prompt_len)
    ref = wmtp.greedy_generate(target, prompt, 30)
    out, _ = wmtp.speculative_generate(target, head, prompt, 30, 3, n_sink, window)
    assert torch.equal(out, ref)


def test_max_new_tokens_mid_acceptance(models):
    """A step that accepts past max_new_tokens is cut exactly at max_new_tokens."""
    target, head = models
    prompt, depth = random_prompt(7), 6
    ref = wmtp.greedy_generate(target, prompt, 40)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for n in [1, 2, 5, 9, 10, 13]:
        out, _ = wmtp.speculative_generate(target, OracleDraft(head, seq, depth), prompt, n, depth, 4, 16)
        assert torch.equal(out, ref[:n])
    assert wmtp.speculative_generate(target, head, prompt, 0, depth)[0].numel() == 0


def test_eos_inside_an_accepted_run(models):
    """EOS produced inside an accepted run ends the output right after it, as in dense decoding."""
    target, head = models
    prompt, depth = random_prompt(7), 5
    ref = wmtp.greedy_generate(target, prompt, 40)
    eos = int(ref[9])  # first occurrence decides where dense decoding stops
    dense = wmtp.greedy_generate(target, prompt, 40, eos_id=eos)
    assert dense[-1] == eos and len(dense) < 40
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    for j in [0, 2, depth]:
        out, _ = wmtp.speculative_generate(target, OracleDraft(head, seq, j), prompt, 40, depth, 4, 16, eos_id=eos)
        assert torch.equal(out, dense), f"j={j}"


def test_an_eos_as_the_first_token_ends_the_run(models):
    """The prefill's token is an eos: the output is that token alone and no step is drafted, in both
    loops (mutation round 4: the speculative loop checking the eos only from its first step survived)."""
    target, head = models
    prompt = random_prompt(7)
    eos = int(wmtp.greedy_generate(target, prompt, 1)[0])
    assert wmtp.greedy_generate(target, prompt, 10, eos_id=eos).tolist() == [eos]
    out, stats = wmtp.speculative_generate(target, head, prompt, 10, 3, 4, 16, eos_id=eos)
    assert out.tolist() == [eos] and stats.steps == 0 and stats.committed == 0


def test_loop_and_batched_verifiers_agree(models):
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        k = int(torch.randint(1, 9, (1,), generator=g))
        choice = torch.randint(0, 3, (k + 1,), generator=g)
        drafts = torch.where(torch.rand(k, generator=g) < 0.7, choice[:k], torch.randint(0, 3, (k,), generator=g))
        assert verify_greedy(drafts, choice) == verify_greedy_loop(drafts, choice)
    assert verify_greedy(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4, 0])) == 2
    assert verify_greedy(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3, 0])) == 0  # no acceptance past a mismatch
    target, head = models
    prompt = random_prompt(15)
    a, sa = wmtp.speculative_generate(target, head, prompt, 20, 3, 4, 16, verifier="loop")
    b, sb = wmtp.speculative_generate(target, head, prompt, 20, 3, 4, 16, verifier="batched")
    assert torch.equal(a, b) and sa.accept_length_histogram == sb.accept_length_histogram


@pytest.mark.parametrize("verify", [verify_greedy, verify_greedy_loop])
@pytest.mark.parametrize("drafts, choice, match", [  # RuntimeError, IndexError, AttributeError or a silent answer
    ([1, 2], [1, 2, 3], "drafts must be a torch.Tensor, got list"),
    (torch.tensor([1, 2, 3]), torch.tensor([1, 2]), r"target_choice \(K\+1,\)"),  # choice too short
    (torch.tensor([1, 2]), torch.tensor([1, 2]), r"target_choice \(K\+1,\)"),  # (K,): no committed token
    (torch.tensor([[1, 2]]), torch.tensor([1, 2, 3]), r"drafts \(K,\)"),  # batched: 1, silently
    (torch.tensor(1), torch.tensor([1, 2]), r"torch.int64 \(\)"),
    (torch.tensor([1, 2]), torch.tensor([[1, 2, 3]]), r"\(1, 3\)"),
    (torch.tensor([1.5, 2.0]), torch.tensor([1, 2, 3]), "integer token ids"),  # the loop's int(1.5) == 1 accepted
    (torch.tensor([1, 2], device="meta"), torch.tensor([1, 2, 3]), "one device"),
])
def test_verifiers_refuse_bad_arguments(verify, drafts, choice, match):
    with pytest.raises(ValueError, match=match):
        verify(drafts, choice)


def test_draft_keys_read_follow_the_key_set(models):
    """Per draft query the windowed head reads min(t+1, n_sink+window) keys."""
    target, head = models
    prompt = random_prompt(60)
    _, full = wmtp.speculative_generate(target, head, prompt, 10, 2)
    _, win = wmtp.speculative_generate(target, head, prompt, 10, 2, n_sink=4, window=16)
    assert win.draft_queries == full.draft_queries
    assert win.draft_keys_read == 20 * win.draft_queries
    assert full.draft_keys_read > 60 * full.draft_queries


def test_an_oracle_runs_counters_are_literal(models):
    """Every counter of one small run, worked out by hand from the protocol, not read off the code.
    A 12-token prompt (positions 0..11), 10 new tokens, depth 2, an oracle right for the first draft
    of a step and wrong for the second: every step accepts 1 draft and keeps 2 tokens. The prefill
    gives the first token, at n = 12; the head has consumed positions 0..10. A step at n queries the
    head at its extend, head_start .. n-1 (head_start: 11, then the last step's n), and once more
    recursively at n: n = 12 queries [11, 12], then n = 14, 16, 18, 20 each [n-2, n-1, n], so
    2 + 4 * 3 = 14 queries in 5 steps (1 + 2 * 5 = 11 tokens, cut to 10: the steps kept 9, AL 9/5).
    A query at t reads t + 1 keys (full), min(t + 1, 4 + 16) with 4 sinks and a window of 16:
    full 12+13 + 13+14+15 + 15+16+17 + 17+18+19 + 19+20+21 = 229; the window clips t = 20 only: 228."""
    target, head = models
    prompt = random_prompt(12)
    ref = wmtp.greedy_generate(target, prompt, 10)
    seq = torch.cat([prompt, ref, torch.zeros(4, dtype=torch.long)])
    for (n_sink, window), keys in (((None, None), 229), ((4, 16), 228)):
        out, s = wmtp.speculative_generate(target, OracleDraft(head, seq, 1), prompt, 10, 2, n_sink, window)
        assert torch.equal(out, ref)
        assert (s.steps, s.proposed, s.accepted, s.committed, s.steps_by_depth) == (5, 10, 5, 9, [0, 0, 5])
        assert s.accept_length_histogram == [0, 5, 0] and s.per_position_accepted == [5, 0]
        assert s.acceptance_rate == 0.5 and s.per_position_acceptance == [1.0, 0.0] and s.mean_accept_length == 1.8
        assert (s.draft_queries, s.draft_keys_read) == (14, keys), (n_sink, window)


@pytest.mark.parametrize("kwargs,match", [
    (dict(depth=0), "depth"), (dict(depth=-2), "depth"), (dict(n_sink=-1), "n_sink"),
    (dict(window=0), "window"), (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=5000), "KV cache"), (dict(impl="cuda"), "impl"), (dict(verifier="nope"), "verifier"),
    (dict(eos_id=-1), "eos_id"), (dict(eos_id="a"), "eos_id"), (dict(eos_id=10**6), "eos_id"),
    (dict(verifier=lambda d, c: -1), "verifier must return"), (dict(verifier=lambda d, c: 3), "verifier must return"),
    (dict(verifier=lambda d, c: True), "verifier must return"), (dict(prompt_ids=random_prompt(5).float()), "integer"),
    # were AttributeErrors, or torch's errors from deep inside the first pass
    (dict(target=None), "target must be a wmtp.TargetLM, got NoneType"), (dict(draft=None), "a draft needs"),
    (dict(prompt_ids=random_prompt(5).to("meta")), "prompt_ids is on meta, the target on cpu"),
])
def test_bad_arguments_raise_value_error(models, kwargs, match):
    target, head = models
    args = dict(target=target, draft=head, prompt_ids=random_prompt(5), max_new_tokens=4, depth=2) | kwargs
    with pytest.raises(ValueError, match=match):
        wmtp.speculative_generate(**args)


def test_an_eos_id_one_past_the_vocabulary_is_refused(models):
    target, head = models
    V = target.config.vocab_size
    with pytest.raises(ValueError, match=rf"eos_id must be None or a token id in \[0, {V}\), got {V}"):
        wmtp.speculative_generate(target, head, random_prompt(5), 4, 2, eos_id=V)
    out, _ = wmtp.speculative_generate(target, head, random_prompt(5), 4, 2, eos_id=V - 1)  # the last id is one
    assert len(out) <= 4


def test_a_head_in_another_dtype_than_its_target_is_refused_up_front(models):
    """A float32 head on the float64 target (built before ``target.double()``, say): a ValueError
    naming both, before any prefill (it was head_input's "w_hidden must be on cpu in torch.float64")."""
    target, head = models
    with pytest.raises(ValueError, match="the draft head is torch.float32 on cpu, the target torch.float64 on cpu"):
        wmtp.speculative_generate(target, wmtp.MTPHead(head.config, target), random_prompt(5), 4, 2)


@pytest.mark.parametrize("generate", [wmtp.greedy_generate, wmtp.static_greedy_generate])
@pytest.mark.parametrize("kwargs,match", [  # were AttributeErrors (step_times: after the first step's work)
    (dict(target=None), "target must be a wmtp.TargetLM, got NoneType"),
    (dict(target="tiny"), "target must be a wmtp.TargetLM, got str"),
    (dict(step_times=5), "step_times must be None or a list"), (dict(step_times=()), "got tuple"),
    (dict(prompt_ids=random_prompt(5).to("meta")), "prompt_ids is on meta, the target on cpu"),  # RuntimeError
])
def test_bad_dense_arguments_raise_value_error(models, generate, kwargs, match):
    target, _ = models
    args = dict(target=target, prompt_ids=random_prompt(5), max_new_tokens=4) | kwargs
    with pytest.raises(ValueError, match=match):
        generate(**args)


# (device, impl, depth, n_sink, window): both impls on CUDA at every depth and arm; the kernel
# interpreted on CPU (without CUDA) at a few, since the interpreter runs ~1 ms per program-iteration.
CUDA_ONLY = pytest.mark.skipif(not CUDA, reason="CUDA only")
BACKEND_CASES = [pytest.param("cuda", impl, depth, ns, w, id=f"cuda-{impl}-K{depth}-{ns}+{w}", marks=CUDA_ONLY)
                 for impl in ("torch", "triton") for depth in range(1, 9) for ns, w in KEYSETS]
BACKEND_CASES += [pytest.param("cpu", "triton", depth, ns, w, id=f"cpu-triton-interpreted-K{depth}-{ns}+{w}",
                               marks=pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1"))
                  for depth, ns, w in [(4, 0, None), (4, 4, 16), (1, 2, 3), (3, 0, 1)]]


@pytest.fixture(scope="module")
def device_models():
    """``harness_models`` per device, built once: {device: (target, head)} (float64 everywhere)."""
    cache = {}

    def get(device):
        if device not in cache:  # a copy: harness_models() is cached and shared with the CPU tests
            target, head = copy.deepcopy(harness_models())
            cache[device] = (target.to(device), head.to(device))
        return cache[device]

    return get


@pytest.mark.parametrize("device, impl, depth, n_sink, window", BACKEND_CASES)
def test_every_backend_is_lossless(device_models, device, impl, depth, n_sink, window, monkeypatch):
    """Oracle drafts right for exactly j = 0..K tokens and the random head, on the backend's own
    draft AND verify attention: the output equals the same backend's dense greedy decoding. A spy
    on the Triton attention's launches sees the target's key sets (its global and local layers) in
    the dense run and those and the head's in the speculative one on the Triton backend, and no
    launch on the torch one (a loop that fell back to the reference passed)."""
    target, head = device_models(device)
    prompt = random_prompt(12, seed=depth).to(device)
    plans = spy_attention_plans(monkeypatch)
    ref = wmtp.greedy_generate(target, prompt, 24, impl=impl)
    dense = {(0, None), (0, target.config.local_window)} if impl == "triton" else set()
    assert {(p.n_sink, p.window) for p in plans} == dense
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long, device=device)])
    drafts = [(j, OracleDraft(head, seq, j)) for j in range(depth + 1)] + [(None, head)]
    for j, draft in drafts:
        plans.clear()
        out, stats = wmtp.speculative_generate(target, draft, prompt, 24, depth, n_sink, window, impl=impl)
        assert out.device.type == device and torch.equal(out, ref), f"j={j}"
        drafted = {(n_sink, window)} if impl == "triton" and j is None else set()  # an oracle runs no attention
        assert {(p.n_sink, p.window) for p in plans} == dense | drafted, f"j={j}"
        if j is not None:
            assert stats.accept_length_histogram[j] >= stats.steps - 1, f"j={j}"


def test_batched_ragged_prompts(models):
    """A list of prompts of different lengths returns a list: each output (and its statistics) is
    exactly that prompt's own run, and the speculative list equals the dense list token for token."""
    target, head = models
    prompts = [random_prompt(n, seed=n) for n in (1, 7, 20)]
    dense = wmtp.greedy_generate(target, prompts, 15)
    outs, stats = wmtp.speculative_generate(target, head, prompts, 15, 3, 4, 16)
    assert isinstance(dense, list) and len(dense) == len(outs) == len(stats) == 3
    for p, d, o, s in zip(prompts, dense, outs, stats):
        assert torch.equal(d, wmtp.greedy_generate(target, p, 15)) and torch.equal(o, d)
        alone, alone_stats = wmtp.speculative_generate(target, head, p, 15, 3, 4, 16)
        assert torch.equal(o, alone) and s.accept_length_histogram == alone_stats.accept_length_histogram


@pytest.mark.parametrize("prompts", [[], [torch.zeros(2, 3, dtype=torch.long)], (torch.tensor([1]), "text")])
def test_batched_bad_prompts_raise(models, prompts):
    target, head = models
    with pytest.raises(ValueError, match="prompt"):
        wmtp.greedy_generate(target, prompts, 3)
    with pytest.raises(ValueError, match="prompt"):
        wmtp.speculative_generate(target, head, prompts, 3, 2)


def test_times_are_the_spans_between_the_loops_marks(models, monkeypatch):
    """A speculative step reads the clock three times (t0, t1, t2: draft, then verify): step s spans
    3s+1 and 3s+2 on the fake clock, in SpecStats and as the depth policy hears them; a dense pass
    reads it twice, so pass s spans 2s+1, and ``step_times`` holds one span per one-token pass:
    ``max_new_tokens - 1`` (mutation round 4: the step times dropped, for one prompt or a list, survived
    the other tests; verify timed from t0 and the policy's times swapped fail here, and were not run
    against the rest of the suite)."""
    import wmtp.decode

    target, head = models
    prompt = random_prompt(12)
    clock = StepClock()
    monkeypatch.setattr(wmtp.decode, "time", clock)
    policy = Cycling([2])
    _, stats = wmtp.speculative_generate(target, head, prompt, 10, policy)
    steps = stats.steps
    assert steps >= 3 and clock.calls == 3 * steps
    assert stats.draft_times_s == [3 * s + 1 for s in range(steps)]
    assert stats.verify_times_s == [3 * s + 2 for s in range(steps)]
    assert policy.times == list(zip(stats.draft_times_s, stats.verify_times_s))
    for prompts in (prompt, [prompt, random_prompt(5, seed=1)]):
        clock.calls, times = 0, []
        wmtp.greedy_generate(target, prompts, 6, step_times=times)
        assert times == [2 * s + 1 for s in range(5 * (1 if prompts is prompt else 2))]


def _counts(stats):
    return {k: v for k, v in stats.to_dict().items() if not k.endswith("times_s")}


def test_a_list_of_prompts_passes_every_argument_on(models):
    """Each prompt of a list runs with every argument the call was given: the eos (prompt 0 stops at
    its 5th token), the ring draft cache (its bytes), re-indexed positions and the gate (the keys
    read): each run's counters are that prompt's own run's (mutation round 4: a list dropping
    ``eos_id``, ``draft_cache`` or ``gate`` survived every test)."""
    target, head = models
    prompts = [random_prompt(9, seed=1), random_prompt(30, seed=2)]
    eos = int(wmtp.greedy_generate(target, prompts[0], 20)[4])
    dense = wmtp.greedy_generate(target, prompts, 20, eos_id=eos)
    assert len(dense[0]) == 5 and dense[0][-1] == eos
    assert all(torch.equal(d, wmtp.greedy_generate(target, p, 20, eos_id=eos)) for d, p in zip(dense, prompts))
    for kwargs, plain in ((dict(draft_cache="ring", positions="reindexed"), "draft_kv_bytes"),
                          (dict(gate=40), "draft_keys_read")):
        outs, stats = wmtp.speculative_generate(target, head, prompts, 20, 3, 2, 6, eos_id=eos, **kwargs)
        for p, d, o, s in zip(prompts, dense, outs, stats):
            alone, alone_stats = wmtp.speculative_generate(target, head, p, 20, 3, 2, 6, eos_id=eos, **kwargs)
            assert torch.equal(o, d) and torch.equal(alone, d) and _counts(s) == _counts(alone_stats), kwargs
        _, without = wmtp.speculative_generate(target, head, prompts[1], 20, 3, 2, 6, eos_id=eos)
        assert getattr(stats[1], plain) != getattr(without, plain), kwargs  # the argument shows in the counters
