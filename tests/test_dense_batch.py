"""The dense batch of prompts of different lengths (``batched_greedy_generate`` in wmtp/lockstep.py,
``static_batched_greedy_generate`` in wmtp/static_lockstep.py): padded at their ends, each row at
its own positions, every row must be its prompt's ``greedy_generate`` alone, token for token
(float64 on the CPU, reference ops: NOTE [Batch exactness] in wmtp/lockstep.py). The harness models'
wide weights give varied greedy output, so a row read at another row's positions would differ."""

import copy
import os

import pytest
import torch
from decode_harness import prompts_of

import wmtp
from wmtp.grading_checks import harness_models
from wmtp.lockstep import batched_greedy_generate, first_positions
from wmtp.static_lockstep import static_batched_greedy_generate

LENGTHS = [1, 9, 23, 17]


@pytest.fixture(scope="module")
def target():
    return harness_models()[0]


def alone(target, prompts, new, eos_id=None, impl="torch"):
    return [wmtp.greedy_generate(target, p, new, eos_id=eos_id, impl=impl).tolist() for p in prompts]


def test_first_positions():
    """One shared position when the prompts share a length (lockstep's batch), else a row's own."""
    assert torch.equal(first_positions(torch.tensor([5, 5, 5])), torch.tensor([5]))
    assert torch.equal(first_positions(torch.tensor([5, 2, 9])), torch.tensor([[5], [2], [9]]))


@pytest.mark.parametrize("generate", [batched_greedy_generate, static_batched_greedy_generate])
def test_each_row_is_its_prompt_alone(target, generate):
    prompts = prompts_of(LENGTHS, seed=11)
    want = alone(target, prompts, 20)
    assert len({tuple(w) for w in want}) == len(want)  # the rows differ: a mix-up would show
    assert [o.tolist() for o in generate(target, prompts, 20, impl="torch")] == want


@pytest.mark.parametrize("generate", [batched_greedy_generate, static_batched_greedy_generate])
def test_a_row_stops_at_its_eos(target, generate):
    """Row 1 stops at its eos, the others run to ``max_new_tokens``; its output is cut after the eos."""
    prompts = prompts_of([4, 13, 7], seed=12)
    free = alone(target, prompts, 24)
    eos = free[1][3]
    outs = generate(target, prompts, 24, eos_id=eos, impl="torch")
    assert [o.tolist() for o in outs] == alone(target, prompts, 24, eos_id=eos)
    assert len(outs[1]) <= 4


@pytest.mark.parametrize("generate", [batched_greedy_generate, static_batched_greedy_generate])
def test_step_and_prefill_times_count_the_passes(target, generate):
    times: list[float] = []
    prefills: list[float] = []
    generate(target, prompts_of([3, 8], seed=13), 9, impl="torch", step_times=times, prefill_times=prefills)
    assert len(times) == 8 and all(t > 0 for t in times)
    assert len(prefills) == 1 and prefills[0] > 0


def test_short_requests(target):
    prompts = prompts_of([1, 1, 6], seed=14)
    for new in (1, 2, 5):
        for generate in (batched_greedy_generate, static_batched_greedy_generate):
            assert [o.tolist() for o in generate(target, prompts, new, impl="torch")] == alone(target, prompts, new)


def test_triton_under_the_interpreter(target):
    if os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available():
        pytest.skip("the Triton kernels under the CPU interpreter")
    prompts = prompts_of([3, 10], seed=15)
    for generate in (batched_greedy_generate, static_batched_greedy_generate):
        assert [o.tolist() for o in generate(target, prompts, 6, impl="triton")] == alone(target, prompts, 6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels and graphs on the GPU")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_each_row_is_its_prompt_alone_on_cuda(impl):
    """float64 on the GPU; with the Triton impl the static loop's step is a CUDA graph."""
    gpu = copy.deepcopy(harness_models()[0]).cuda()
    prompts = [p.cuda() for p in prompts_of([4, 30, 17], seed=16)]
    want = alone(gpu, prompts, 20, impl=impl)
    for generate in (batched_greedy_generate, static_batched_greedy_generate):
        assert [o.tolist() for o in generate(gpu, prompts, 20, impl=impl)] == want


@pytest.mark.parametrize("prompts, match", [
    ([], "non-empty"), (torch.zeros(3, dtype=torch.long), "non-empty"), ([torch.zeros(0, dtype=torch.long)], "row 0"),
    ([torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long, device="meta")], "one device"),
])
@pytest.mark.parametrize("generate", [batched_greedy_generate, static_batched_greedy_generate])
def test_bad_prompts_are_value_errors(target, generate, prompts, match):
    with pytest.raises(ValueError, match=match):
        generate(target, prompts, 4, impl="torch")


@pytest.mark.parametrize("kwargs, match", [  # AttributeErrors before (the timings: after the prefill's work)
    (dict(step_times=5), "step_times must be None or a list"), (dict(prefill_times=5), "prefill_times must be None"),
    (dict(target=None), "^target must be a wmtp.TargetLM, got NoneType"),  # not as "prompts row 0"'s error
])
@pytest.mark.parametrize("generate", [batched_greedy_generate, static_batched_greedy_generate])
def test_bad_arguments_are_value_errors(target, generate, kwargs, match):
    args = dict(target=target, prompts=[torch.zeros(2, dtype=torch.long)], max_new_tokens=4, impl="torch") | kwargs
    with pytest.raises(ValueError, match=match):
        generate(**args)
