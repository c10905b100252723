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
import triton
from attention_truth import make_inputs
from triton.compiler import CompiledKernel

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


class FakeKernel(CompiledKernel):  # only its type is CompiledKernel's: what the cache accepts
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
    mode = triton.knobs.compilation.instrumentation_mode
    aligned = ("s", 0, False, mode, (torch.float32, True), (torch.float32, True))
    assert fn.key((a, b, 7), "s", 2) == fn.key((b, a, 7), "s", 2) == aligned
    assert fn.key((a, off, 7), "s", 2) != fn.key((a, b, 7), "s", 2)  # alignment
    assert fn.key((a, b.double(), 7), "s", 2) != fn.key((a, b, 7), "s", 2)  # dtype
    assert fn.key((a, b, 7), "t", 2) != fn.key((a, b, 7), "s", 2)  # static
    assert fn.key((a, off, 7), "s", 1) == fn.key((a, b.double(), 7), "s", 1)  # past `keyed`: the caller vouches


def test_key_follows_the_runtime_settings_triton_keys_on(device0, monkeypatch):
    fn, x = CachedLaunch(FakeJit(["X"], {})), torch.zeros(4)
    plain = fn.key((x,), "s", 1)
    monkeypatch.setattr(triton.knobs.runtime, "debug", True)
    assert fn.key((x,), "s", 1) != plain
    monkeypatch.setattr(triton.knobs.runtime, "debug", False)
    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "fpsan")
    assert fn.key((x,), "s", 1) != plain


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


def test_a_miss_checks_that_tensors_past_keyed_are_aligned(device0):
    fn = CachedLaunch(FakeJit(["X", "Y", "n"], {}))
    buf = torch.zeros(64)
    a, off = buf[:16], buf[1:17]  # 16-byte aligned, and 4 bytes past it
    with pytest.raises(AssertionError, match="16-byte aligned"):
        fn.launch((1,), (a, off, 5), {}, "s", 2, keyed=1)  # unkeyed and unaligned: the key could not tell
    fn.launch((1,), (off, a, 5), {}, "s", 2, keyed=1)  # a keyed tensor may be unaligned
    assert list(fn.kernels) == [fn.key((off, a, 5), "s", 1)]


class InterpretedJit(FakeJit):
    """The interpreter's (and async compile's) ``fn[grid]``: no CompiledKernel comes back."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def test_what_is_not_cached_and_the_bound(device0, monkeypatch):
    x = torch.zeros(8)
    fn = CachedLaunch(FakeJit(["X", "n"], {}))
    with pytest.raises(AssertionError, match="plain ints"):
        fn.launch((1,), (x, True), {}, "s", 1)  # a bool is not the int the key assumes
    interpreted = CachedLaunch(InterpretedJit(["X", "n"], {}))
    interpreted.launch((1,), (x, 5), {}, "s", 1)
    assert interpreted.kernels == {}
    monkeypatch.setattr(launch_mod, "MAX_KERNELS", 2)
    for static in ("a", "b", "c"):
        fn.launch((1,), (x, 5), {}, static, 1)
    assert list(fn.kernels) == [fn.key((x, 5), "c", 1)]  # cleared at the bound, then the new key
    monkeypatch.setattr(triton.knobs.runtime, "add_stages_inspection_hook", lambda: ("k", "h"), raising=False)
    fn.launch((1,), (x, 5), {}, "d", 1)
    assert fn.key((x, 5), "d", 1) not in fn.kernels


def test_only_tested_triton_on_nvidia_cuda_is_cached(monkeypatch):
    assert not launch_mod.fast_launches(torch.device("cpu"))
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert launch_mod.fast_launches(torch.device("cuda"))
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert not launch_mod.fast_launches(torch.device("cuda"))
    monkeypatch.setattr(triton, "__version__", "3.7.1")
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

    def checked(self, grid, args, kwargs, static, n_tensors, keyed=None):
        real(self, grid, args, kwargs, static, n_tensors, keyed)
        kernel = self.fn[grid](*args, **kwargs)  # Triton's lookup; launching again rewrites the same values
        assert kernel is self.kernels[self.key(args, static, n_tensors if keyed is None else keyed)][0]
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


def test_equal_keys_mean_equal_triton_specializations(device0):
    """NOTE [Launch cache], checked on CPU against Triton's own argument specialization (its binder
    for a CUDA sm_90 target): over random plans (GQA, query counts, contexts, dtypes, transposed and
    unaligned tensors, paged caches, int32/int64 positions, huge sinks, splits), two launches with
    one ``CachedLaunch`` key always get one Triton key."""
    import inspect
    import random

    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import KernelParam, create_function_from_signature

    from wmtp.attention import triton_attention as ta
    from wmtp.attention import triton_merge as tm
    from wmtp.attention.triton_plan import plan_call

    backend, h200 = make_backend(GPUTarget("cuda", 90, 32)), (132, 232448, True)

    def binder(fn):
        sig = inspect.signature(fn.fn)
        params = [KernelParam(i, p, False, False) for i, p in enumerate(sig.parameters.values())]
        return create_function_from_signature(sig, params, backend)

    binders = {fn: binder(fn) for fn in (ta._attention_kernel, tm._merge_kernel)}
    seen = {fn: {} for fn in binders}

    def record(fn, args, kwargs, static, keyed):
        kw = dict(kwargs, debug=triton.knobs.runtime.debug,
                  instrumentation_mode=triton.knobs.compilation.instrumentation_mode)
        _, spec, options = binders[fn](*args, **kw)
        theirs = (tuple(map(str, spec)), str(sorted(options.items())))
        ours = CachedLaunch(fn).key(args, static, keyed)
        assert seen[fn].setdefault(ours, theirs) == theirs, ours

    def unaligned(t):  # the same shape and strides, one element past a 16-byte boundary
        return torch.empty(t.untyped_storage().nbytes() // t.element_size() + 1, dtype=t.dtype)[1:].as_strided(
            t.shape, t.stride())

    rng = random.Random(0)
    for _ in range(60):
        B, Hkv, group = rng.choice([1, 2]), rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        Lq, D, S = rng.choice([1, 3, 16, 70]), rng.choice([16, 64, 128]), rng.choice([1, 16, 17, 300])
        dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32])
        n_sink, window = rng.choice([None, 1, 16, 1 << 40]), rng.choice([None, 1, 16, 4096])
        if rng.random() < 0.5:
            q = torch.empty(B, Lq, Hkv * group, D, dtype=dtype).transpose(1, 2)  # (B, Hq, Lq, D) strided
        else:
            q = torch.empty(B, Hkv * group, Lq, D, dtype=dtype)  # (B, Hq, Lq, D)
        q_pos = torch.zeros(Lq, dtype=torch.int64)
        tuning = (rng.choice([None, 1, 3]), None, None, None, None)
        if rng.random() < 0.4:
            ps = rng.choice([16, 32])
            k = torch.empty(rng.choice([4, 40]), ps, Hkv, D, dtype=dtype)  # (pages, ps, Hkv, D)
            table = torch.zeros(B, rng.choice([1, 7]), dtype=torch.int32)
        else:
            k = rng.choice([torch.empty(B, Hkv, S, D, dtype=dtype),  # (B, Hkv, S, D)
                            torch.empty(B, S, Hkv, D, dtype=dtype).transpose(1, 2)])  # the same, position-major
            table, ps = None, 1
        qs = torch.empty_like(q) if window is not None and rng.random() < 0.3 else None  # re-indexed sinks
        # one plan (one static key), tensors that differ only where the cache key must tell them apart
        cases = [(q, qs, k, k, q_pos), (unaligned(q), qs, k, k, q_pos), (q, qs, unaligned(k), k, q_pos),
                 (q, qs, k, unaligned(k), q_pos), (q, qs, k, k, q_pos.int()), (q, qs, k, k, unaligned(q_pos))]
        cases += [(q, unaligned(qs), k, k, q_pos)] if qs is not None else []
        for cq, cqs, ck, cv, cpos in cases:
            call = plan_call(cq, ck, cv, table, ps, cpos, n_sink, window, tuning, h200, cqs)
            record(ta._attention_kernel, call.args, call.kwargs, call.static, ta.KEYED)  # as _launch keys them
            if call.merge is not None:
                record(tm._merge_kernel, call.merge.args, call.merge.kwargs, call.merge.static, ta.MERGE_KEYED)
    assert len(seen[ta._attention_kernel]) > 100 and seen[tm._merge_kernel]
    assert len(set(seen[ta._attention_kernel].values())) > 100  # Triton's keys: aligned and not, int32 and not


def test_key_holds_the_current_device(monkeypatch):
    """A kernel compiled while one GPU is current is not launched for another: the key holds
    ``torch.cuda.current_device()`` (Triton compiles and caches per device), so the same plan on
    device 1 compiles anew and device 0 then hits its own."""
    jit = FakeJit(["X", "n"], {})
    fn, x = CachedLaunch(jit), torch.zeros(8)
    for device in (0, 1, 0):
        monkeypatch.setattr(torch.cuda, "current_device", lambda d=device: d)
        fn.launch((1,), (x, 5), {}, "s", 1)
    assert len(jit.compiled) == 2 and len(jit.hits) == 1
    assert [key[1] for key in fn.kernels] == [0, 1]


class AsyncJit(FakeJit):
    """An async compile's ``fn[grid]``: a handle that is not yet a CompiledKernel."""

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.compiled.append((grid, args, kwargs))
            return object()
        return run


def test_only_compiled_kernels_are_cached(device0):
    """What ``fn[grid]`` returns is cached only if it is a CompiledKernel: an async compile's handle
    (or anything else) goes through Triton's own path again on the next call."""
    jit = AsyncJit(["X", "n"], {})
    fn, x = CachedLaunch(jit), torch.zeros(8)
    for _ in range(2):
        fn.launch((1,), (x, 5), {}, "s", 1)
    assert fn.kernels == {} and len(jit.compiled) == 2


def test_a_merge_of_another_output_dtype_is_another_launch(device0):
    """NOTE [Launch cache]: the merge's tensors (ws, out) are unkeyed (``MERGE_KEYED``), so its static
    key must hold out's dtype: the same shapes in float16, bfloat16 and float32 (all with float32
    partials) are three merge launches, not one kernel compiled for the first dtype."""
    from wmtp.attention import triton_attention as ta
    from wmtp.attention import triton_merge as tm
    from wmtp.attention.triton_plan import plan_call

    meta, pos, h200 = dict(device="meta"), torch.empty(2, dtype=torch.int64, device="meta"), (132, 232448, True)
    keys = set()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q = torch.empty(1, 4, 2, 32, dtype=dtype, **meta)  # (B, Hq, Lq, D)
        k = torch.empty(1, 2, 300, 32, dtype=dtype, **meta)  # (B, Hkv, S, D)
        call = plan_call(q, k, k, None, 1, pos, 4, 64, (3, None, None, None, None), h200)  # 3 splits: a merge
        assert call.merge.args[0].dtype == torch.float32 and call.merge.args[1].dtype == dtype
        keys.add(CachedLaunch(tm._merge_kernel).key(call.merge.args, call.merge.static, ta.MERGE_KEYED))
    assert len(keys) == 3
