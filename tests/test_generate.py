"""Text generation with the accepted drafts marked (wmtp/generate.py): the marks from literal accept
counts, the text cut at token boundaries (a character split across byte-level tokens included), and
a generation whose marks follow an oracle draft right for exactly j tokens a step."""

import pytest
import torch
from decode_harness import V, random_prompt

import wmtp
from wmtp import grading
from wmtp.generate import drafted_marks, generate, styled_text, token_pieces
from wmtp.grading import harness_models
from wmtp.tokenizer import _train_bpe, decode

F, T = False, True


@pytest.mark.parametrize("accepts,n,marks", [
    ([], 1, [F]),  # only the prefill's token
    ([0, 0], 3, [F, F, F]),
    ([2, 0, 1], 7, [F, T, T, F, F, T, F]),
    ([2, 0, 1], 6, [F, T, T, F, F, T]),  # cut at max_new_tokens (or eos) inside the last step
    ([3], 2, [F, T]),
])
def test_drafted_marks_literal(accepts, n, marks):
    assert drafted_marks(accepts, n) == marks


def test_drafted_marks_bad_counts():
    with pytest.raises(ValueError, match=">= 0"):
        drafted_marks([1, -1], 2)
    with pytest.raises(ValueError, match="fewer than"):
        drafted_marks([1], 4)


def test_token_pieces_join_to_the_text_and_split_no_character():
    tok = _train_bpe("ascii words and more words\n" * 20 + "café naïve 日本語 ☃\n" * 3, 270)
    text = "words café 日本語 ☃ naïve"
    ids = tok.encode(text, add_special_tokens=False).ids
    dec = lambda x: decode(tok, x)  # noqa: E731
    pieces = token_pieces(dec, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == dec(ids) == text
    assert all("\ufffd" not in p for p in pieces) and "" in pieces  # some token ends inside a character
    ascii_ids = tok.encode("and more words", add_special_tokens=False).ids
    assert token_pieces(dec, ascii_ids) == [dec([i]) for i in ascii_ids]
    assert token_pieces(dec, []) == []


def test_token_pieces_give_whole_characters_to_the_token_that_completes_them():
    vocab = [b"x\xc3", b"\xa9", b"y"]  # byte-level tokens: "x" and the first byte of "é", its second, "y"
    dec = lambda ids: b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")  # noqa: E731
    assert token_pieces(dec, [0, 1, 2]) == ["x", "é", "y"]
    assert token_pieces(dec, [2, 0]) == ["y", "x\ufffd"]  # cut inside a character: its bytes stay visible


def test_styled_text_marks_the_drafts():
    text = styled_text(["a", "b", "c"], [True, False, True], "p ")
    assert text.plain == "p abc" and str(text.style) == "dim"
    assert [(s.start, s.end, str(s.style)) for s in text.spans] == [(2, 3, "bold green"), (4, 5, "bold green")]
    with pytest.raises(ValueError):
        styled_text(["a"], [True, False])


@pytest.mark.parametrize("j", [0, 2, 3])
def test_marks_follow_a_draft_right_for_j_tokens(j):
    """An oracle draft right for j of 3 drafts a step: each step commits j drafts, then the target's."""
    target, head = harness_models()
    prompt = random_prompt(20, seed=j)
    dense = wmtp.greedy_generate(target, prompt, 17)
    oracle = grading.OracleDraft(head, torch.cat([prompt, dense, torch.zeros(5, dtype=torch.long)]), j, V)
    steps = []
    g = generate(target, oracle, prompt, 17, 3, 2, 4, on_step=steps.append)
    assert torch.equal(g.ids, dense) and g.dense_equal is True and g.seconds > 0
    # each step's j drafts and the target's token; the last step's (fewer near the end) reach the 17th token
    assert len(steps) == g.stats.steps and steps[:-1] == [j + 1] * (len(steps) - 1)
    assert 1 + sum(steps[:-1]) < 17 <= 1 + sum(steps)
    assert g.drafted == ([F] + ([T] * j + [F]) * 17)[:17]
    assert g.stats.steps == len([m for m in g.drafted[1:] if not m]) + (g.drafted[-1] is T)
    assert generate(target, head, prompt, 5, 2, 0, None, check=False).dense_equal is None
    assert generate(target, oracle, prompt, 17, 3, 2, 4, reference=dense).dense_equal is True
    assert generate(target, oracle, prompt, 17, 3, 2, 4, reference=dense.flip(0)).dense_equal is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_marks_on_cuda(impl):
    import copy

    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompt = random_prompt(20, seed=7).cuda()
    dense = wmtp.greedy_generate(target, prompt, 17, impl=impl)
    seq = torch.cat([prompt, dense, torch.zeros(5, dtype=torch.long, device="cuda")])
    g = generate(target, grading.OracleDraft(head, seq, 2, V), prompt, 17, 3, 2, 4, impl=impl)
    assert torch.equal(g.ids, dense) and g.dense_equal is True
    assert g.drafted == ([F] + [T, T, F] * 6)[:17]


def test_loops_and_bad_loops():
    target, head = harness_models()
    prompt = random_prompt(12, seed=3)
    with pytest.raises(ValueError, match="loop must be"):
        generate(target, head, prompt, 5, 2, loop="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):  # the CUDA-graph loop, off CUDA
            generate(target, head, prompt, 5, 2, loop="graph")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_marks_in_the_cuda_graph_loop():
    import copy

    from test_static_decode import DeviceOracle

    target, head = (m.cuda() for m in copy.deepcopy(harness_models()))
    prompt = random_prompt(20, seed=7).cuda()
    dense = wmtp.greedy_generate(target, prompt, 17, impl="triton")
    seq = torch.cat([prompt, dense, torch.zeros(5, dtype=torch.long, device="cuda")])
    g = generate(target, DeviceOracle(head, seq, 2), prompt, 17, 3, 2, 4, impl="triton", loop="graph")
    assert torch.equal(g.ids, dense) and g.dense_equal is True
    assert g.drafted == ([F] + [T, T, F] * 6)[:17] and min(g.stats.draft_times_s) > 0


def test_generate_passes_eos_and_gate_to_both_runs():
    """An eos stops the speculative run and the dense reference alike (so they still agree), a gate
    reaches the speculative run (its keys read), and ``check=False`` means no verdict even with a
    ``reference`` (mutation round 4: dropping either argument, or a verdict without check, survived)."""
    target, head = harness_models()
    prompt = random_prompt(30, seed=4)
    eos = int(wmtp.greedy_generate(target, prompt, 20)[6])
    dense = wmtp.greedy_generate(target, prompt, 20, eos_id=eos)
    g = generate(target, head, prompt, 20, 3, 2, 6, eos_id=eos, gate=40)
    assert torch.equal(g.ids, dense) and len(g.ids) < 20 and g.dense_equal is True
    _, gated = wmtp.speculative_generate(target, head, prompt, 20, 3, 2, 6, eos_id=eos, gate=40)
    _, plain = wmtp.speculative_generate(target, head, prompt, 20, 3, 2, 6, eos_id=eos)
    assert g.stats.draft_keys_read == gated.draft_keys_read != plain.draft_keys_read
    assert generate(target, head, prompt, 5, 2, check=False, reference=dense[:5]).dense_equal is None


def test_generate_takes_a_fixed_depth_only():
    """Marks are recorded through a FixedDepth, so a depth policy is a one-line ValueError naming it
    (the docstring says so), before any decoding."""
    target, head = harness_models()
    with pytest.raises(ValueError, match="^depth must be a positive integer, got <wmtp.policy.AdaptiveDepth"):
        generate(target, head, random_prompt(8, seed=0), 4, wmtp.AdaptiveDepth(3))
