"""The CUDA timings of wmtp/bench_timing.py: ``step_ms``'s arithmetic and order on scripted replay
times (on CPU, CUDA graphs replaced by fakes), its errors, and on a CUDA GPU the real graphs.
No timing is asserted: figures come from the GPU run, never from tests (DESIGN.md)."""

import pytest
import torch

from wmtp import bench_timing as bt


def _fake_graphs(monkeypatch, script: dict[str, list[float]]):
    """capture_graph -> fakes named "both", "only" in capture order, each running the captured body once
    into ``log``; _replay_ms -> the next scripted time of that graph, the order into ``order``."""
    made, log, order = [], [], []

    class Graph:
        def __init__(self, name):
            self.name, self.untimed = name, 0

        def replay(self):
            self.untimed += 1

    def capture(body):
        made.append(Graph(("both", "only")[len(made)]))
        log.append(made[-1].name)
        body()
        return made[-1]

    def replay_ms(graph):
        order.append(graph.name)
        return script[graph.name][order.count(graph.name) - 1]

    monkeypatch.setattr(bt, "capture_graph", capture)
    monkeypatch.setattr(bt, "_replay_ms", replay_ms)
    return made, log, order


def test_step_ms_is_the_difference_of_medians_per_call(monkeypatch):
    script = {"both": [10.0, 11.0, 30.0, 12.0, 10.5], "only": [4.0, 4.5, 4.2, 20.0, 4.1]}  # an outlier each
    made, log, order = _fake_graphs(monkeypatch, script)
    got = bt.step_ms(lambda: log.append("call"), lambda: log.append("flush"), calls=3, replays=5)
    assert got == pytest.approx((11.0 - 4.2) / 3)  # medians 11.0 and 4.2, per call
    assert log == ["both", "flush", "call", "flush", "call", "flush", "call", "only", "flush", "flush", "flush"]
    assert order == ["both", "only", "only", "both", "both", "only", "only", "both", "both", "only"]  # alternating
    assert [g.untimed for g in made] == [1, 1]  # one untimed replay each (the graph's upload)


def test_step_ms_returns_an_error_string(monkeypatch):
    def capture(body):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(bt, "capture_graph", capture)
    assert bt.step_ms(lambda: None, lambda: None) == "RuntimeError: operation not permitted when stream is capturing"


def test_empty_kernels_ms_times_one_kernel_then_two_on_one_element():
    ran = lambda fn: float(fn().item())  # noqa: E731 - a "timer" that runs fn once and reads its element
    assert bt.empty_kernels_ms(torch.device("cpu"), ran) == {"one_kernel": 1.0, "two_kernels": 3.0}
    assert bt.empty_kernels_ms(torch.device("cpu"), lambda fn: "capture failed") == {
        "one_kernel": "capture failed", "two_kernels": "capture failed"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_graph_floor_times_one_and_two_kernel_graphs():
    from triton.testing import do_bench

    timed_ms = lambda fn: float(do_bench(fn, warmup=5, rep=20, return_mode="median"))  # noqa: E731
    floor = bt.graph_floor_ms(torch.device("cuda"), timed_ms)
    assert set(floor) == {"one_kernel", "two_kernels"}
    assert all(isinstance(ms, float) and ms > 0 for ms in floor.values()), floor


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_step_ms_on_real_graphs_and_a_call_that_cannot_be_captured():
    x = torch.zeros(1, device="cuda")
    flush = bt.l2_flush(torch.device("cuda"), nbytes=1 << 20)
    assert isinstance(bt.step_ms(lambda: x.add_(1), flush, calls=4, replays=3), float)
    err = bt.step_ms(lambda: x.add_(1).item(), flush, calls=4, replays=3)  # a host sync: not capturable
    assert isinstance(err, str) and "captur" in err, err
    assert torch.randn(2, device="cuda").shape == (2,)  # NOTE [Failed capture] (wmtp/device.py)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_a_failed_capture_leaves_random_ops_working():
    """NOTE [Failed capture] (wmtp/device.py): capture_graph re-raises the failure, the caller is back
    on its own stream, and the device's default generator draws again, the same numbers as after a
    capture that succeeded."""
    from wmtp.device import capture_graph

    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with pytest.raises(RuntimeError):
            capture_graph(lambda: x.add_(1).item())  # a host sync: not capturable
        assert torch.cuda.current_stream() == side  # the caller's stream, not the capture's
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    torch.cuda.manual_seed(7)
    after_failure = torch.randn(4, device="cuda")
    capture_graph(lambda: x.add_(1))
    torch.cuda.manual_seed(7)
    assert torch.equal(after_failure, torch.randn(4, device="cuda"))


def test_host_ms_is_the_median_of_its_calls_in_ms(monkeypatch):
    """The host's time inside each of ``calls`` calls, the device synchronized around them, as a median
    in ms (on CPU: a fake clock and no-op synchronizes; mutation round 4: a mean survived)."""
    readings = iter([0.0, 0.001, 1.0, 1.004, 2.0, 2.100])  # (t0, t1) per call: 1, 4 and 100 ms
    synced = []
    monkeypatch.setattr(bt.time, "perf_counter", lambda: next(readings))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    calls = []
    got = bt.host_ms(lambda: calls.append(1), torch.device("cuda"), calls=3)
    assert got == pytest.approx(4.0) and len(calls) == 3 and len(synced) == 4  # before each call, and after all


def test_graph_replay_ms_times_the_captured_graphs_replay(monkeypatch):
    """``timed_ms`` gets the captured graph's replay, not the plain call; a failed capture is a string."""
    class Graph:
        def replay(self):
            return "replayed"

    captured = []
    monkeypatch.setattr(bt, "capture_graph", lambda fn: captured.append(fn) or Graph())
    call = lambda: "plain call"  # noqa: E731
    assert bt.graph_replay_ms(call, lambda fn: fn()) == "replayed" and captured == [call]

    def refuse(fn):
        raise RuntimeError("not capturable")

    monkeypatch.setattr(bt, "capture_graph", refuse)
    assert bt.graph_replay_ms(call, lambda fn: 1.0) == "graph capture: RuntimeError: not capturable"
