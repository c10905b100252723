"""A request's checks (wmtp/request.py), literal: the cache positions a valid request writes, and
the token ids at both ends of the vocabulary taken (mutation round 6: refusing token 0 survived the
decoding tests, whose random prompts seldom hold it)."""

import pytest
import torch
from decode_harness import V

from wmtp.grading import harness_models
from wmtp.request import check_request, check_spec_request


@pytest.fixture(scope="module")
def models():
    return harness_models()


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.uint8])
def test_token_ids_zero_and_last_are_taken(models, dtype):
    target, _ = models
    prompt = torch.tensor([0, V - 1 if dtype != torch.uint8 else 255, 5], dtype=dtype)  # P = 3
    assert check_request(target, prompt, 4, -1, eos_id=0) == 6  # dense: positions 0 .. P + 4 - 2
    assert check_request(target, torch.zeros(1, dtype=dtype), 0, -1, eos_id=V - 1) == 1  # the prompt's own


@pytest.mark.parametrize("max_new, needed", [(0, 3), (1, 3), (2, 7), (5, 10)])
def test_a_speculative_request_writes_depth_past_its_last_token(models, max_new, needed):
    """Depth 3, P = 3: a step runs while fewer than ``max_new`` tokens are out, its verify pass
    writing up to position ``P + max_new + depth - 2``; with ``max_new <= 1`` only the prompt's."""
    target, head = models
    prompt = torch.tensor([0, V - 1, 5])
    assert check_spec_request(target, head, prompt, max_new, 3, 4, 16, None) == needed
