"""Run the windowed draft kernel at the benchmark's shapes, for a profiler to watch (CUDA only).

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \\
        --kernel-name regex:"_attention_kernel|_merge_kernel" --launch-skip 4 python3 scripts/profile_draft.py

Per shape (Hq16/Hkv2/D256 and Hq32/Hkv8/D128, bf16, 1M-position cache, one query at the end, sink 64 +
window 4096), three warm-up calls then three profiled ones; the profiler splits each call's time
between the attention kernel and the split merge (arXiv 2607.21535, Sec. 3: the draft's key set).
"""

import torch

from wmtp.attention.triton_attention import attention_triton

S = 1 << 20
for Hq, Hkv, D in ((16, 2, 256), (32, 8, 128)):
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    v = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hkv, S, D)
    q = torch.randn(1, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)  # (1, Hq, 1, D)
    pos = torch.tensor([S - 1], device="cuda")
    for _ in range(6):
        attention_triton(q, k, v, pos, 64, 4096)
    torch.cuda.synchronize()
    print(f"Hq{Hq}/Hkv{Hkv}/D{D}: 6 calls done", flush=True)
