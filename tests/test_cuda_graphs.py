"""What the CUDA graphs of the device-resident loops must keep (wmtp/graphs.py and ``capture_graph``
in wmtp/device.py; arXiv 2607.21535, Sec. 4: graphs are what leave the draft-KV tax in view): a
capture by default exactly on CUDA with the Triton impl; a capture warms its call up once, on a
side stream, and allocates from the pool it is given; a graph run drafts over each step's key set
and from the state the eager static loop drafts from, so its accept lengths are the script's.

Each test kills a mutant that passed every other CUDA test (session 38's GPU mutation run, in
metrics/gpu-tests-h200.txt): graphs captured without the default, without a warm-up or out of the
run's pool; one draft graph for both key sets of a context gate; ``h_next`` (static_decode.py) or
``accepted`` (static_batched.py) left as a capture's warm-up wrote them. The output stays dense
greedy's under each of those; only what the drafts were, and so the accept lengths, tell."""

import copy

import pytest
import torch
from decode_harness import DeviceOracle, FedOracle, prompts_of, random_prompt, same_counts, scripted_counts

import wmtp
from wmtp import graphs
from wmtp.device import capture_graph
from wmtp.grading import harness_models
from wmtp.static_batched import static_batched_speculative_generate
from wmtp.static_decode import static_speculative_generate

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


class KeySetOracle(DeviceOracle):
    """``DeviceOracle`` right for all ``depth`` drafts over a window's key set and for none over all
    keys: which graph a step replayed shows in its accept length (a graph bakes the choice in)."""

    def __init__(self, head, sequence: torch.Tensor, depth: int):
        super().__init__(head, sequence, 0)
        self.depth = depth

    def __call__(self, hidden, next_ids, pos, cache, n_sink, window, impl):
        self.j = 0 if window is None else self.depth
        return super().__call__(hidden, next_ids, pos, cache, n_sink, window, impl)


@pytest.fixture(scope="module")
def cuda_models():
    """A copy on the GPU (harness_models() is cached and shared with the CPU tests), float64."""
    target, head = copy.deepcopy(harness_models())
    return target.cuda(), head.cuda()


def test_graphs_by_default_exactly_on_cuda_with_the_triton_impl():
    devices = [torch.device(d) for d in ("cuda", "cpu", "mps")]
    assert [graphs.use_graph(None, d, impl) for d in devices for impl in ("triton", "torch")] == [
        True, False, False, False, False, False]
    assert graphs.use_graph(False, devices[0], "triton") is False
    assert graphs.use_graph(True, devices[0], "triton") is True


@needs_cuda
def test_a_capture_warms_up_once_on_a_side_stream_into_the_given_pool():
    x, streams = torch.zeros(1, device="cuda"), []

    def add():
        streams.append(torch.cuda.current_stream())
        x.add_(1)

    pool = graphs.graph_pool()
    first, second = capture_graph(add, pool), capture_graph(add, pool)
    assert x.item() == 2  # each capture ran `add` once, its warm-up; what it captured waits for a replay
    assert len(streams) == 4 and torch.cuda.default_stream() not in streams
    assert first.pool() == second.pool() == pool
    second.replay()
    assert x.item() == 3


@needs_cuda
def test_a_graph_run_drafts_over_each_steps_key_set(cuda_models):
    """A context gate of 40: contexts 31..40 draft over all keys (accept 0, one token a step), then
    over 4 sinks + 16 recent keys (accept all 3); the last step's third draft guesses the padding."""
    target, head = cuda_models
    prompt = random_prompt(30, seed=3).cuda()
    ref = wmtp.greedy_generate(target, prompt, 33, impl="triton")
    seq = torch.cat([prompt, ref, torch.zeros(5, dtype=torch.long, device="cuda")])
    runs = [static_speculative_generate(target, KeySetOracle(head, seq, 3), prompt, 33, 3, 4, 16, impl="triton",
                                        cuda_graph=graph, gate=40) for graph in (True, False)]
    assert all(torch.equal(out, ref) for out, _ in runs)
    assert runs[0][1].accept_length_histogram == [10, 0, 1, 5]
    same_counts(runs[0][1], runs[1][1])


@needs_cuda
def test_a_graph_run_drafts_from_the_state_the_eager_loop_drafts_from(cuda_models):
    """``FedOracle``: a draft is right only where its inputs are the row's true ones, so a step that
    drafted from another step's hidden states or accepted count accepts less than the script."""
    target, head = cuda_models
    prompts = [p.cuda() for p in prompts_of([30, 17], seed=5)]
    for graph in (True, False):
        oracle = FedOracle(target, head, prompts[:1], 3, 40)
        out, stats = static_speculative_generate(target, oracle, prompts[0], 40, 3, 4, 16, impl="triton",
                                                 cuda_graph=graph)
        assert torch.equal(out, wmtp.greedy_generate(target, prompts[0], 40, impl="triton")), graph
        assert (stats.steps, stats.accepted) == scripted_counts(oracle.j, 0, 30, 40) == (20, 20), graph
        oracle = FedOracle(target, head, prompts, 3, 40)
        outs, bstats = static_batched_speculative_generate(target, oracle, prompts, 40, 3, 4, 16, impl="triton",
                                                           cuda_graph=graph)
        assert all(torch.equal(o, wmtp.greedy_generate(target, p, 40, impl="triton")) for o, p in zip(outs, prompts))
        assert (bstats.live_steps, bstats.accepted) == ([20, 15], [20, 24]), graph
