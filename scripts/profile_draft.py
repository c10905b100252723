"""Run the windowed draft kernel at the benchmark's shapes, for a profiler to watch (CUDA only).

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \\
        --kernel-name regex:"_attention_kernel|_merge_kernel" --launch-skip 12 --launch-count 12 \\
        python3 scripts/profile_draft.py

Shapes Hq16/Hkv2/D256 and Hq32/Hkv8/D128, bf16, a 1M-position cache, one query at the end, sink 64 +
window 4096 (arXiv 2607.21535, Sec. 3: the draft's key set). Each call launches two kernels (the
attention and the split merge). Three warm-up calls per shape come first (12 launches, compiles
included), then three calls per shape (the 12 launches to profile), so the profiler splits each
call's device time between the two kernels.
"""

import torch

from wmtp.attention.triton_attention import attention_triton

S = 1 << 20
cases = []
gen = torch.Generator(device="cuda").manual_seed(0)
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
    cases.append((f"Hq{Hq}/Hkv{Hkv}/D{D}", q, k, v))
pos = torch.tensor([S - 1], device="cuda")
for phase in ("warm-up", "profiled"):
    for name, q, k, v in cases:
        for _ in range(3):
            attention_triton(q, k, v, pos, 64, 4096)
        torch.cuda.synchronize()
        print(f"{phase}: {name}, 3 calls", flush=True)
