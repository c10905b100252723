"""Experiment 14: the one-query draft with K and V loaded by the Hopper tensor-memory accelerator (TMA).

Compiled offline for sm_90, the default draft issues K's global loads, stores K to shared memory
(waiting for its data) and only then issues V's loads: two memory round trips one after the other
(exp11 tried to reorder them). A TMA load is one asynchronous bulk copy into shared memory, issued
by one thread, with no registers staging it. Compiled for sm_90 (triton 3.7.1), a one-stage launch
still waits for K's copy before it issues V's (one shared buffer, reused); with ``num_stages=2``
Triton's pipeliner issues the first block's K and V copies together before the loop.

This script's kernel, ``_tma_draft``, is the default's one-query contiguous draft with only the
loads changed: K and V through host-side ``TensorDescriptor``s over the cache seen as
``(B*Hkv, S, D)`` (``RANK3``; a copy past ``S`` reads zeros) or ``(B*Hkv*S, D)``; every other step
(key plan, masks, online softmax, partials, the PDL merge of attention/triton_merge.py) is the
default's. For one query the key-set formula reduces to ``kpos < hi`` within each range; V's rows
outside it are zeroed (``MASK_V``) so that NaN in a row no query reads cannot reach the output
(NOTE [Reads]).

Run on an H200 (one device call; it ran at 01975d2, before the launcher's API changed: at later
commits ``plan_call`` takes the caches untransposed and ``call.merge`` is a ``MergeCall``):

    PYTHONPATH=$PWD python3 metrics/experiments/exp14-tma.py $OUT/exp14.json

Cells: S = 1M, q_len 1 at the end of the cache and 37 keys before it (misaligned window), bf16, both
bench shapes; each variant as the whole draft and as its attention grid alone. Timings:
``graph_ms`` (do_bench of one graph replay, the bar's) and ``step_ms`` (wmtp/bench_timing.py);
three interleaved rounds, medians; outputs compared with the default's (max abs difference).
On CPU (``TRITON_INTERPRET=1``, fp16, small S) ``--check`` compares every variant with the reference.
"""

import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from wmtp.attention import attention_torch
from wmtp.attention import triton_attention as ta
from wmtp.attention.triton_merge import merge_splits
from wmtp.attention.triton_plan import _gpu_limits, plan_call


@triton.jit
def _tma_draft(Q, Kd, Vd, QPOS, PM, PL, PACC, Hq, Hkv, S, capacity, n_sink, window, n_splits,
               GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               PDL: tl.constexpr, RANK3: tl.constexpr, MASK_V: tl.constexpr, UPCAST: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    qk_scale = tl.full([], 1.4426950408889634, tl.float32) / tl.sqrt(tl.full([], HEAD_DIM, tl.float32))
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    rows = tl.arange(0, BLOCK_M)  # row r = query head kvh * GROUP + r (one query)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_row = (b.to(tl.int64) * Hq + kvh * GROUP + rows) * HEAD_DIM  # (BLOCK_M,) q contiguous (B, Hq, 1, D)
    q = tl.load(Q + q_row[:, None] + offs_d[None, :], mask=(rows < GROUP)[:, None], other=0.0)  # (BLOCK_M, D)
    if UPCAST:
        q = q.to(tl.float32)
    t = tl.minimum(tl.maximum(tl.load(QPOS), 0), capacity - 1).to(tl.int32)
    sink_hi = tl.minimum(n_sink, t + 1)  # sinks [0, sink_hi), recent [rec_lo, t + 1): keyset.py for one query
    rec_lo = tl.minimum(tl.maximum(tl.maximum(n_sink, t - window + 1), sink_hi), t + 1)
    n_blk_sink = tl.cdiv(sink_hi, BLOCK_N)
    n_blk = n_blk_sink + tl.cdiv(t + 1 - rec_lo, BLOCK_N)
    bps = tl.cdiv(n_blk, n_splits)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for blk in range(pid_s * bps, tl.minimum(pid_s * bps + bps, n_blk)):
        sink = blk < n_blk_sink
        kpos0 = tl.where(sink, blk * BLOCK_N, rec_lo + (blk - n_blk_sink) * BLOCK_N)
        hi = tl.where(sink, sink_hi, t + 1)
        if RANK3:  # (B*Hkv, S, D): a copy past S reads zeros
            k = Kd.load([pid_bh, kpos0, 0]).reshape(BLOCK_N, HEAD_DIM)  # (BLOCK_N, D)
            v = Vd.load([pid_bh, kpos0, 0]).reshape(BLOCK_N, HEAD_DIM)
        else:  # (B*Hkv*S, D): a copy past S reads the next head's rows, masked below
            k = Kd.load([pid_bh * S + kpos0, 0])  # (BLOCK_N, D)
            v = Vd.load([pid_bh * S + kpos0, 0])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        allowed = (kpos0 + offs_n) < hi  # (BLOCK_N,) one query: the key set within the range
        if MASK_V:
            v = tl.where(allowed[:, None], v, 0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), log2 domain
        s = tl.where(allowed[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    part = (pid_bh.to(tl.int64) * n_splits + pid_s) * BLOCK_M + rows  # the default's partial layout
    real = rows < GROUP
    tl.store(PM + part, m_i, mask=real)
    tl.store(PL + part, l_i, mask=real)
    tl.store(PACC + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=real[:, None])


def tma_call(q, k, v, pos, n_sink, window, rank3=True, mask_v=True, num_warps=4, num_stages=1, merge=True,
             tuning=(None,) * 5):
    """The draft through ``_tma_draft`` with the default's plan (grid, splits, workspace) and merge."""
    B, Hq, Lq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    assert Lq == 1 and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    limits = _gpu_limits(q.device) if q.device.type == "cuda" else None
    call = plan_call(q, k.transpose(1, 2), v.transpose(1, 2), None, 1, pos, n_sink, window, tuning, limits)
    assert call.merge is not None, "the experiment needs split-K"
    pm, pl, pacc, out, _, block_m, n_splits, pdl = call.merge
    kw = call.kwargs
    if rank3:
        descs = [TensorDescriptor(x.view(B * Hkv, S, D), [B * Hkv, S, D], [S * D, D, 1], [1, kw["BLOCK_N"], D])
                 for x in (k, v)]
    else:
        descs = [TensorDescriptor(x.view(B * Hkv * S, D), [B * Hkv * S, D], [D, 1], [kw["BLOCK_N"], D]) for x in (k, v)]
    _tma_draft[call.grid](q, *descs, pos, pm, pl, pacc, Hq, Hkv, S, S, n_sink, window, n_splits,
                          GROUP=Hq // Hkv, BLOCK_M=block_m, BLOCK_N=kw["BLOCK_N"], HEAD_DIM=D, PDL=pdl,
                          RANK3=rank3, MASK_V=mask_v or not rank3, UPCAST=kw["UPCAST"], num_warps=num_warps,
                          num_stages=num_stages)
    if not merge:
        return None  # the grid alone: `out` is not written
    merge_splits(*call.merge)
    return out


def check():
    """CPU interpreter: every variant against the reference (fp16), awkward positions included."""
    gen = torch.Generator().manual_seed(0)
    for Hq, Hkv, D, S in ((4, 1, 64, 700), (8, 2, 32, 333)):
        k = torch.randn(1, Hkv, S, D, generator=gen).half()  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, generator=gen).half()
        q = torch.randn(1, Hq, 1, D, generator=gen).half()  # (1, Hq, 1, D)
        for t in (S - 1, S - 37, 70, 5):
            pos = torch.tensor([t])
            ref = attention_torch(q.double(), k.double(), v.double(), pos, 16, 128).float()
            for rank3 in (True, False):
                out = tma_call(q, k, v, pos, 16, 128, rank3=rank3, tuning=(4, 32, None, None, None)).float()
                err = (out - ref).abs().max().item()
                print(f"Hq{Hq}/Hkv{Hkv}/D{D} S={S} t={t} rank3={rank3}: max abs err {err:.2e}")
                assert err < 2e-3, err


def main(path):
    from triton.testing import do_bench

    from wmtp.bench_timing import capture_graph, l2_flush, step_ms
    from wmtp.metrics import environment

    S, N_SINK, WINDOW, ROUNDS = 1 << 20, 64, 4096, 3
    t0 = time.perf_counter()
    dev = torch.device("cuda")
    flush = l2_flush(dev)
    res = {"command": "PYTHONPATH=$PWD python3 metrics/experiments/exp14-tma.py $OUT/exp14.json",
           "environment": environment(dev), "doc": __doc__, "unit": "us", "rows": []}

    def tma(**kw):
        return lambda q, k, v, p, m: tma_call(q, k, v, p, N_SINK, WINDOW, merge=m, **kw)

    variants = {  # num_stages=2: Triton's pipeliner issues the first block's K and V copies together
        "default": lambda q, k, v, p, m: ta.attention_triton(q, k, v, p, N_SINK, WINDOW) if m else None,
        "tma3d_s1": tma(), "tma3d_s2": tma(num_stages=2), "tma3d_s2_nomaskv": tma(num_stages=2, mask_v=False),
        "tma2d_s2": tma(num_stages=2, rank3=False), "tma3d_s2_w8": tma(num_stages=2, num_warps=8),
        "tma3d_s2_n32": tma(num_stages=2, tuning=(None, 32, None, None, None)),  # 32-key blocks, 2x the splits
        "tma3d_s2_2blk": tma(num_stages=2, tuning=(33, None, None, None, None)),  # two blocks a program
    }
    gen = torch.Generator(device="cuda").manual_seed(0)
    for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
        k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
        v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
        cells = {}
        for end in (1, 37):
            pos = torch.tensor([S - end], device="cuda")
            for name, fn in variants.items():
                cells[(f"draft at S-{end}", name)] = (lambda fn=fn, pos=pos: fn(q, k, v, pos, True))
            if end == 1:
                for name, fn in variants.items():
                    def grid_only(fn=fn, pos=pos, default=name == "default"):
                        if default:
                            return ta._ATTENTION.launch(*_grid_args(q, k, v, pos, N_SINK, WINDOW))
                        return fn(q, k, v, pos, False)

                    cells[("grid alone at S-1", name)] = grid_only
        ref = {}
        runs = {c: [] for c in cells}
        for _ in range(ROUNDS):
            for c, fn in cells.items():  # interleaved: drift hits every variant alike
                try:
                    out = fn()
                    row = {"graph": float(do_bench(capture_graph(fn).replay, warmup=25, rep=100,
                                                   return_mode="median")) * 1e3,
                           "step": step_ms(fn, flush)}
                    if isinstance(row["step"], str):
                        raise RuntimeError(row["step"])
                    row["step"] *= 1e3
                    if out is not None:
                        ref.setdefault(c[0], out.float())
                        row["max_abs_vs_default"] = (out.float() - ref[c[0]]).abs().max().item()
                    runs[c].append(row)
                except Exception as e:  # noqa: BLE001
                    runs[c].append({"error": f"{type(e).__name__}: {e}"[:400]})
        for (cell, name), rs in runs.items():
            row = {"shape": f"Hq{Hq}/Hkv{Hkv}/D{D}", "cell": cell, "variant": name}
            if any("error" in x for x in rs):
                row["error"] = next(x["error"] for x in rs if "error" in x)
            else:
                row.update({m: round(statistics.median(x[m] for x in rs), 2) for m in ("graph", "step")})
                if "max_abs_vs_default" in rs[0]:
                    row["max_abs_vs_default"] = max(x["max_abs_vs_default"] for x in rs)
            res["rows"].append(row)
            print(row, flush=True)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        k = v = None
        torch.cuda.empty_cache()


def _grid_args(q, k, v, pos, n_sink, window):
    """The default draft's attention launch alone (CachedLaunch.launch's arguments)."""
    call = plan_call(q, k.transpose(1, 2), v.transpose(1, 2), None, 1, pos, n_sink, window,
                     (None, None, None, None, None), _gpu_limits(q.device))
    return call.grid, call.args, call.kwargs, call.static, 9


if __name__ == "__main__":
    check() if sys.argv[1] == "--check" else main(sys.argv[1])
