"""The Triton kernels write their output and split workspace and nothing else.

``plan_call`` (attention/triton_plan.py) allocates both; here the same plan launches on stand-ins
that sit inside NaN-filled buffers with a spare region on each side, and the spare regions must
keep every NaN. On a GPU a kernel that writes past its output or workspace corrupts whatever the
caching allocator put there, silently; under the CPU interpreter it may crash the test process
instead of failing a test (tests/fences.py). Mutation round 9b's three such mutants are what this
file closes: a tile's padding row taken as real (``rows <= GROUP * Lq`` in ``_tile_rows``), the
partials' offset with the program ids swapped, and a merge grid of ``BLOCK_M`` rows
(tests/test_triton_attention.py's merge test checks the merge alone).
"""

import os

import pytest
import torch
from attention_truth import assert_kernel_close, make_inputs
from fences import fenced

from wmtp.attention.paged import paginate
from wmtp.attention.triton_plan import plan_call

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TRITON = CUDA or os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not TRITON, reason="Triton needs CUDA or its CPU interpreter (TRITON_INTERPRET=1)")


# (layout, B, Hq, Hkv, Lq, S, D, n_sink, window, num_splits)
CASES = [
    pytest.param("contiguous", 2, 4, 2, 3, 70, 32, 4, 16, 3, id="split3-gqa2-padding-rows"),
    pytest.param("paged16", 2, 4, 2, 3, 70, 32, 4, 16, 3, id="paged16-split3"),
    pytest.param("contiguous", 2, 4, 2, 3, 70, 32, None, None, 1, id="one-split-writes-out"),
    pytest.param("contiguous", 1, 4, 1, 65, 70, 32, 4, 16, 2, id="prefill-2-chunks-split2"),  # 260 rows > 256
]


@pytest.mark.parametrize("layout, B, Hq, Hkv, Lq, S, D, n_sink, window, num_splits", CASES)
def test_kernels_write_only_their_output_and_workspace(layout, B, Hq, Hkv, Lq, S, D, n_sink, window, num_splits):
    """One plan, launched with its output and workspace fenced by NaNs: the fences stay NaN, and
    the output, which starts as NaN too, has no NaN left and is the reference's (NOTE [Tolerances]).
    q sits in a buffer with spare heads, so a padding row that reads past the last query head
    reads memory that exists."""
    from wmtp.attention.triton_attention import _attention_kernel
    from wmtp.attention.triton_merge import _merge_kernel

    q, k, v, q_pos = make_inputs(B, Hq, Hkv, Lq, S, D, torch.float32, seed=Lq + S, device=DEVICE)
    q_room = torch.randn(B, 2 * Hq, Lq, D, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    q_room[:, :Hq] = q
    qv = q_room[:, :Hq]  # (B, Hq, Lq, D) with spare query heads past its end
    if layout == "contiguous":
        kc, vc, bt, page = k, v, None, 1
    else:
        page = int(layout.removeprefix("paged"))
        kc, vc, bt = paginate(k, v, page, torch.Generator().manual_seed(2))
    call = plan_call(qv, kc, vc, bt, page, q_pos, n_sink, window, (num_splits, 16, None, None, False), None)
    assert (call.merge is not None) == (num_splits > 1)
    out, out_fenced = fenced(call.out)  # (B, Hq, Lq, D), the plan's output strides
    ws, ws_fenced = (out, out_fenced) if call.merge is None else fenced(call.args[7])  # one split: ws is out
    _attention_kernel[call.grid](*call.args[:6], out, ws, *call.args[8:], **call.kwargs)
    if call.merge is not None:
        grid, args, kwargs, _ = call.merge
        _merge_kernel[grid](ws, out, *args[2:], **kwargs)
    assert out_fenced() and ws_fenced(), "a kernel wrote outside its output or workspace"
    assert not out.isnan().any(), "an output element never written, or a partial merged that no split wrote"
    assert_kernel_close(out, q, k, v, q_pos, n_sink, window)
