"""NOTE [Launch cache] (wmtp/attention/launch.py): a cached launch is the launch Triton would make.

On CPU, ``CachedLaunch`` runs against a scripted stand-in for a ``triton.jit`` function: what it
keys on, when it compiles, what it passes on a hit. On CUDA, every launch of the attention and
merge kernels is checked against Triton's own lookup (``fn[grid]`` returns the compiled kernel it
chose), for aligned and unaligned tensors, contiguous and paged caches, and the outputs against
launches that bypass the cache.
"""

import types

import pytest
import torch
from attention_truth import make_inputs

from wmtp.attention import launch as launch_mod
from wmtp.attention.launch import CachedLaunch

CUDA = torch.cuda.is_available()


class FakeJit:
    """A ``triton.jit`` function's interface: ``params``, ``arg_names`` and ``fn[grid](*args, **kwargs)``."""

    def __init__(self, names, defaults):
        self.params = [types.SimpleNamespace(name=n, default=defaults.get(n)) for n in names]
        self.arg_names = list(names)
        self.compiled, self.hits = [], []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            kernel = FakeKernel(self)
            self.compiled.append((grid, args, kwargs))
            return kernel
        return run


class FakeKernel:
    def __init__(self, jit):
        self.jit = jit

    def __getitem__(self, grid):  # as CompiledKernel's runner: a 3-d grid
        assert len(grid) == 3, grid
        return lambda *args: self.jit.hits.append((self, grid, args))


@pytest.fixture
def device0(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_key_is_static_device_and_each_tensors_dtype_and_alignment(device0):
    fn = CachedLaunch(FakeJit(["X", "Y", "n"], {}))
    buf = torch.zeros(64)
    a, b, off = buf[:16], buf[16:32], buf[1:17]  # 64-byte and 4-byte offsets
    aligned = ("s", 0, (torch.float32, True), (torch.float32, True))
    assert fn.key((a, b, 7), "s", 2) == fn.key((b, a, 7), "s", 2) == aligned
    assert fn.key((a, off, 7), "s", 2) != fn.key((a, b, 7), "s", 2)  # alignment
    assert fn.key((a, b.double(), 7), "s", 2) != fn.key((a, b, 7), "s", 2)  # dtype
    assert fn.key((a, b, 7), "t", 2) != fn.key((a, b, 7), "s", 2)  # static


def test_first_call_compiles_then_hits_pass_every_parameter_in_order(device0):
    jit = FakeJit(["X", "n", "BLOCK", "FLAG"], {"FLAG": False})
    fn = CachedLaunch(jit)
    x = torch.zeros(8)
    fn.launch((3, 1), (x, 5), {"BLOCK": 16, "num_warps": 4}, "static", 1)
    assert jit.compiled == [((3, 1), (x, 5), {"BLOCK": 16, "num_warps": 4})] and not jit.hits
    y = torch.ones(8)
    fn.launch((2, 1), (y, 5), {"BLOCK": 16, "num_warps": 4}, "static", 1)
    assert len(jit.compiled) == 1
    (kernel, grid, args), = jit.hits
    assert grid == (2, 1, 1) and args[0] is y and args[1:] == (5, 16, False)  # constexprs by name, then defaults
    fn.launch((2, 1), (y, 5), {"BLOCK": 32, "num_warps": 4}, "other static", 1)  # another plan compiles anew
    assert len(jit.compiled) == 2


def test_only_nvidia_cuda_launches_are_cached(monkeypatch):
    assert not launch_mod.fast_launches(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", "6.0", raising=False)
    assert not launch_mod.fast_launches(torch.device("cuda"))


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view(t.shape).copy_(t)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the launch cache is not used under the CPU interpreter")
def test_cache_hits_are_the_kernels_triton_looks_up(monkeypatch):
    from wmtp.attention import triton_attention as ta
    from wmtp.attention import triton_merge as tm
    from wmtp.attention.paged import paginate

    launches, real = [], CachedLaunch.launch

    def checked(self, grid, args, kwargs, static, n_tensors):
        real(self, grid, args, kwargs, static, n_tensors)
        kernel = self.fn[grid](*args, **kwargs)  # Triton's lookup; launching again rewrites the same values
        assert kernel is self.kernels[self.key(args, static, n_tensors)][0]
        launches.append(self.fn)

    for dtype in (torch.bfloat16, torch.float32):
        q, k, v, q_pos = make_inputs(1, 8, 2, 3, 300, 64, dtype, seed=7, device="cuda")
        k_pages, v_pages, table = paginate(k, v, 16, torch.Generator().manual_seed(7))
        cases = [(q, k, v, q_pos), (_unaligned(q), k, v, q_pos), (q, _unaligned(k), _unaligned(v), q_pos),
                 (q, k, v, q_pos.int())]
        for window in (16, None):
            for cq, ck, cv, cpos in cases:
                outs = []
                for cached in (True, False):
                    with monkeypatch.context() as patch:
                        patch.setattr(CachedLaunch, "launch", checked)
                        patch.setattr(ta, "fast_launches", lambda device, c=cached: c)
                        patch.setattr(tm, "fast_launches", lambda device, c=cached: c)
                        for _ in range(2):  # a miss, then a hit
                            outs.append(ta.attention_triton(cq, ck, cv, cpos, 4, window))
                            outs.append(ta.paged_attention_triton(cq, k_pages, v_pages, table, cpos, 4, window))
                assert all(torch.equal(o, outs[i % 2]) for i, o in enumerate(outs))
    assert {ta._attention_kernel, tm._merge_kernel} <= set(launches)
