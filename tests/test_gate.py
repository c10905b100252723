"""Context gating (wmtp/policy.py ``gated_key_set``): a step drafts with the full causal set while
its context is at most ``gate`` tokens, with the sink+window set past it; the output stays dense
greedy's (``torch.equal``) in every loop, at every depth, wherever the gate falls in the run.

The key set of each step is checked call by call against literal lists (a spy around the draft),
and the two ends of the gate against ungated runs: a gate past the run's last context drafts as the
native draft, one below its first as the windowed draft, their statistics equal.
"""

import copy
import os

import pytest
import torch
from decode_harness import DeviceOracle, HeadProxy, random_prompt, same_counts

import wmtp
from wmtp.config import KeySetConfig, parse_keyset
from wmtp.grading import harness_models
from wmtp.policy import check_gate, gated_key_set
from wmtp.sampling import sample_generate, speculative_sample
from wmtp.static_decode import static_speculative_generate

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
LOOPS = {
    "eager": wmtp.speculative_generate,
    "eager-loop-verifier": lambda *a, **k: wmtp.speculative_generate(*a, verifier="loop", **k),
    "static": static_speculative_generate,
}


@pytest.fixture(scope="module")
def models():
    return harness_models()


@pytest.mark.parametrize("context, gate, keys", [
    (4096, 4096, (None, None)), (4097, 4096, (8, 64)), (1, 4096, (None, None)), (1, 1, (None, None)),
    (2, 1, (8, 64)), (1, None, (8, 64)), (10**6, None, (8, 64)),
])
def test_gated_key_set_literal(context, gate, keys):
    assert gated_key_set(context, 8, 64, gate) == keys


def test_gated_key_set_keeps_the_key_set_it_gates():
    assert gated_key_set(9, None, 4, 8) == (None, 4)  # n_sink=None stays None: it reads as 0 everywhere
    assert gated_key_set(9, 0, 1, 9) == (None, None)


@pytest.mark.parametrize("gate, window, match", [
    (0, 64, "gate must be a positive integer"), (-3, 64, "gate must be"), (True, 64, "gate must be"),
    (2.5, 64, "gate must be"), ("8", 64, "gate must be"), (8, None, "native key set"),
])
def test_bad_gates_are_value_errors(gate, window, match):
    with pytest.raises(ValueError, match=match):
        check_gate(gate, window)
    with pytest.raises(ValueError, match=match):
        KeySetConfig(n_sink=8, window=window, gate=gate)


@pytest.mark.parametrize("context", [0, -1, True, 3.0])
def test_a_bad_context_is_a_value_error(context):
    with pytest.raises(ValueError, match="context must be a positive integer"):
        gated_key_set(context, 8, 64, 100)


def test_parse_and_label():
    assert parse_keyset("8:64@4096") == KeySetConfig(8, 64, 4096)
    assert parse_keyset("8:64") == KeySetConfig(8, 64, None)
    assert KeySetConfig(8, 64, 4096).label == "sink8+win64+gate4096"
    assert KeySetConfig(8, 64).label == "sink8+win64" and KeySetConfig(0, None).label == "native"
    assert KeySetConfig(None, 64) == KeySetConfig(0, 64) and KeySetConfig(None, 64).label == "sink0+win64"
    for bad, match in [("8:64@", "SINK:WINDOW@GATE"), ("8:64@x", "SINK:WINDOW@GATE"), ("8@64", "SINK:WINDOW@GATE"),
                       ("8:64@0", "gate must be"), ("8:64@4@5", "SINK:WINDOW@GATE")]:
        with pytest.raises(ValueError, match=match):
            parse_keyset(bad)


def test_parse_keyset_takes_each_number_at_its_edge():
    """``parse_keyset``'s range checks at their edges (mutation round 15): a sink count of 0 and of 2**62, a
    window of 1 and of 2**62 and a gate of 1 are taken; one past 2**62 is refused in the command line's
    words, naming the flag given (``--keysets`` by default), the text and the value."""
    assert parse_keyset("0:1@1") == KeySetConfig(0, 1, 1)
    assert parse_keyset("4611686018427387904:4611686018427387904") == KeySetConfig(2**62, 2**62, None)
    with pytest.raises(ValueError) as sink:
        parse_keyset("4611686018427387905:1")
    assert str(sink.value) == ("--keysets 4611686018427387905:1: the sink count must be an integer from 0 to 2**62, "
                               "got 4611686018427387905")
    with pytest.raises(ValueError) as window:
        parse_keyset("0:4611686018427387905", "--keyset")
    assert str(window.value) == ("--keyset 0:4611686018427387905: the window must be an integer from 1 to 2**62, "
                                 "got 4611686018427387905")


class Spy(HeadProxy):
    """A draft that records each call's positions and key set, then answers as ``head``."""

    def __init__(self, head):
        self.head, self.calls = head, []

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        self.calls.append((tuple(pos.tolist()), n_sink, window))
        return self.head(hidden, next_ids, pos, cache, n_sink, window, impl)


def _oracle_run(models, loop, gate, j=1):
    target, head = models
    prompt = random_prompt(10)
    ref = wmtp.greedy_generate(target, prompt, 12)
    spy = Spy(DeviceOracle(head, torch.cat([prompt, ref, torch.zeros(4, dtype=torch.long)]), j))
    out, stats = LOOPS[loop](target, spy, prompt, 12, 2, 4, 16, gate=gate)
    assert torch.equal(out, ref)
    return spy.calls, stats


def test_each_step_drafts_over_its_gated_key_set_literal(models):
    """Depth 2, every step accepting one draft (two tokens): the prompt's 10 tokens, then steps at
    contexts 11, 13, 15, 17, 19, 21. With gate 13 the first two draft natively, the rest over 4+16."""
    calls, stats = _oracle_run(models, "eager", 13)
    assert stats.steps == 6 and stats.accepted == 6
    assert calls == [
        ((9,), None, None), ((10,), None, None),  # context 11: the extend of x's predecessor, one recursive draft
        ((10, 11), None, None), ((12,), None, None),  # context 13 <= gate: still native
        ((12, 13), 4, 16), ((14,), 4, 16),  # context 15 > gate
        ((14, 15), 4, 16), ((16,), 4, 16),
        ((16, 17), 4, 16), ((18,), 4, 16),
        ((18, 19), 4, 16), ((20,), 4, 16),
    ]
    # the keys counted are the key sets read: a native query at t reads t + 1 keys, a windowed one min(t + 1, 20)
    assert stats.draft_keys_read == (10 + 11) + (11 + 12 + 13) + (13 + 14 + 15) + (15 + 16 + 17) + (17 + 18 + 19) + (
        19 + 20 + 20)


def test_the_static_loop_gates_the_same_steps(models):
    """The static loop's extend runs more rows (NOTE [Static extend]); its steps' key sets are the eager loop's."""
    eager, _ = _oracle_run(models, "eager", 13)
    static, stats = _oracle_run(models, "static", 13)
    assert [keys for _, *keys in static] == [keys for _, *keys in eager]
    assert [pos for pos, *_ in static[:4]] == [(9,), (10,), (10, 11, 12), (12,)]
    assert stats.steps == 6


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_gate_past_the_run_is_the_native_draft_and_one_before_it_the_window(models, loop):
    target, head = models
    prompt = random_prompt(20, seed=3)
    run = lambda **kw: LOOPS[loop](target, head, prompt, 24, 3, **kw)  # noqa: E731
    native, windowed = run()[1], run(n_sink=4, window=16)[1]
    for gate, same in [(20 + 24, native), (20, windowed), (1, windowed)]:  # the steps' contexts: 21 .. 43
        stats = run(n_sink=4, window=16, gate=gate)[1]
        same_counts(stats, same)
        assert (stats.draft_keys_read, stats.draft_queries) == (same.draft_keys_read, same.draft_queries), gate
    for gate in (21, 30):
        crossing = run(n_sink=4, window=16, gate=gate)[1]
        assert windowed.draft_keys_read < crossing.draft_keys_read < native.draft_keys_read, gate


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("depth", [1, 3, 8])
@pytest.mark.parametrize("n_sink, window", [(4, 16), (0, 1), (2, 3)])
def test_gated_runs_are_lossless(models, loop, depth, n_sink, window):
    """Gates that cross inside the run (after its first step, and mid-run: contexts 21 .. 43); the random
    head and drafts right for exactly j tokens. A gate below the run drafts as the windowed run, one past
    it as the native run (the test above), whose every loop, depth and key set is lossless on its own
    (test_lossless.py, test_static_decode.py); gates 5, 26 and 100, dropped, were three fifths of the runs."""
    target, head = models
    prompt = random_prompt(20, seed=depth)
    ref = wmtp.greedy_generate(target, prompt, 24)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long)])
    drafts = [(None, head), (0, DeviceOracle(head, seq, 0)), (depth, DeviceOracle(head, seq, depth))]
    for gate in (21, 33):
        for j, draft in drafts:
            out, stats = LOOPS[loop](target, draft, prompt, 24, depth, n_sink, window, gate=gate)
            assert torch.equal(out, ref), (gate, j)
            if j is not None:
                assert stats.accept_length_histogram[j] >= stats.steps - 1, (gate, j)


@pytest.mark.parametrize("method", ["gumbel", "rejection"])
def test_gated_sampling(models, method):
    """Sampled verification with a gate: gumbel equals dense sampling token for token; both methods
    draft as the native run with a gate past the run and as the windowed run with one below it."""
    target, head = models
    prompt = random_prompt(20, seed=5)
    ref = sample_generate(target, prompt, 24, temperature=1.0, seed=7)
    run = lambda **kw: speculative_sample(target, head, prompt, 24, 3, temperature=1.0, seed=7,  # noqa: E731
                                          method=method, **kw)
    (native_out, native), (windowed_out, windowed) = run(), run(n_sink=4, window=16)
    for gate, out_same, same in [(20 + 24, native_out, native), (20, windowed_out, windowed)]:
        out, stats = run(n_sink=4, window=16, gate=gate)
        assert torch.equal(out, out_same) and stats.draft_keys_read == same.draft_keys_read, gate
        same_counts(stats, same)
    for gate in (21, 30):
        out, stats = run(n_sink=4, window=16, gate=gate)
        assert windowed.draft_keys_read < stats.draft_keys_read < native.draft_keys_read, gate
        if method == "gumbel":
            assert torch.equal(out, ref), gate


@pytest.mark.parametrize("generator", ["greedy", "static", "sampled"])
def test_a_list_of_prompts_takes_the_gate(models, generator):
    target, head = models
    prompts = [random_prompt(20, seed=1), random_prompt(27, seed=2)]
    run = {"greedy": wmtp.speculative_generate, "static": static_speculative_generate,
           "sampled": lambda *a, **k: speculative_sample(*a, temperature=0.0, **k)}[generator]
    outs, stats = run(target, head, prompts, 12, 2, 4, 16, gate=30)
    for prompt, out, s in zip(prompts, outs, stats):
        alone, s_alone = run(target, head, prompt, 12, 2, 4, 16, gate=30)
        assert torch.equal(out, alone) and s.draft_keys_read == s_alone.draft_keys_read
    _, ungated = run(target, head, prompts, 12, 2, 4, 16)
    assert [s.draft_keys_read for s in stats] != [s.draft_keys_read for s in ungated]


@pytest.mark.parametrize("loop", ["eager", "static"])
def test_a_ring_or_a_native_gate_is_refused(models, loop):
    target, head = models
    with pytest.raises(ValueError, match="draft_cache='full'"):
        LOOPS[loop](target, head, random_prompt(5), 4, 2, 4, 16, draft_cache="ring", gate=8)
    with pytest.raises(ValueError, match="native key set"):
        LOOPS[loop](target, head, random_prompt(5), 4, 2, gate=8)
    with pytest.raises(ValueError, match="gate must be"):
        LOOPS[loop](target, head, random_prompt(5), 4, 2, 4, 16, gate=0)


@pytest.mark.skipif(not INTERPRETED or CUDA, reason="the Triton kernels under the CPU interpreter")
def test_triton_interpreter_gated_is_lossless(models):
    target, head = models
    prompt = random_prompt(10)
    ref = wmtp.greedy_generate(target, prompt, 8)
    for loop in ("eager", "static"):
        out, _ = LOOPS[loop](target, head, prompt, 8, 3, 4, 16, impl="triton", gate=13)
        assert torch.equal(out, ref), loop


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl, graph", [("torch", False), ("triton", False), ("triton", True)])
@pytest.mark.parametrize("depth", [1, 3])
def test_cuda_gated_is_lossless(impl, graph, depth):
    """Float64 on the GPU; through the CUDA graphs too (a draft phase captured per key set)."""
    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompt = random_prompt(30, seed=depth).cuda()
    ref = wmtp.greedy_generate(target, prompt, 33, impl=impl)
    seq = torch.cat([prompt, ref, torch.zeros(depth + 2, dtype=torch.long, device="cuda")])
    for j, draft in [(None, head)] + [(j, DeviceOracle(head, seq, j)) for j in range(depth + 1)]:
        out, stats = static_speculative_generate(target, draft, prompt, 33, depth, 4, 16, impl=impl,
                                                 cuda_graph=graph, gate=40)
        assert out.device.type == "cuda" and torch.equal(out, ref), f"j={j}"
        eager, _ = wmtp.speculative_generate(target, draft, prompt, 33, depth, 4, 16, impl=impl, gate=40)
        assert torch.equal(eager, ref), f"eager, j={j}"
    if graph:  # wmtp generate's loop: the marks and the check through the CUDA graphs
        from wmtp.generate import generate

        g = generate(target, head, prompt, 33, depth, 4, 16, impl, loop="graph", gate=40)
        assert g.dense_equal and torch.equal(g.ids, ref)


def test_the_draft_attention_bench_times_a_gated_key_set_at_its_context():
    """bench.py's attention timing (reproduce's draft_attention): a gated key set is timed over the key set a
    decode step at that context reads: every key up to its gate, its window past it."""
    from wmtp.bench import bench_draft_attention
    from wmtp.config import get_preset

    keysets = (KeySetConfig(0, None), KeySetConfig(4, 16), KeySetConfig(4, 16, gate=100), KeySetConfig(4, 16, gate=10))
    rows = bench_draft_attention(get_preset("tiny").model, (64,), keysets, repeats=2)
    assert [(r["keyset"], r["gate"], r["keys_read"]) for r in rows] == [
        ("native", None, 64), ("sink4+win16", None, 20), ("sink4+win16+gate100", 100, 64),
        ("sink4+win16+gate10", 10, 20)]
