"""Mutation testing of the CUDA-only paths, which no CPU test reaches: the CUDA graphs of the static
loops (wmtp/graphs.py; the graph state of static_decode.py, static_lockstep.py, static_batched.py),
``capture_graph`` and NOTE [Failed capture] (wmtp/device.py), the capture guard of the RoPE frequencies
(wmtp/block.py), bench_timing.py's graph timings and the benches' CUDA paths (bench attention's CUDA
timings, the graph loop of bench decode, depth and batch) (arXiv 2607.21535, Sec. 4: graphs are what
leave the draft-KV tax in view). Each hand-made mutant is applied in turn, the CUDA tests that reach it are
run, and the file is restored. From the repository root of a CUDA machine:

    python3 scripts/gpu_mutants.py --out DIR [--budget-s S] [--only NAME ...] [--tests TEST ...]

writes DIR/gpu-mutants.json (each mutant: killed or not, seconds, pytest's summary lines) and
DIR/gpu-mutants.log (each run's output, cut). ``--tests`` runs those tests for every chosen mutant
instead of its own (to check that a new test kills the survivors). Session 38's run, and the tests
that closed its survivors: metrics/gpu-tests-h200.txt ("GPU mutation run M8"); the benches' mutants
(``bench_*``) were written in session 39 with the tests that kill them ("GPU mutation run M9")."""

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

SD = "tests/test_static_decode.py::test_cuda_is_lossless"
SDP = "tests/test_static_decode.py::test_cuda_graphs_of_a_run_share_one_pool_and_replay_in_any_order"
SL = "tests/test_static_lockstep.py::test_every_row_is_its_dense_greedy_decoding_on_cuda"
SB = "tests/test_static_batched.py::test_each_row_is_its_prompt_alone_on_cuda"
GA = "tests/test_gate.py::test_cuda_gated_is_lossless"
RI = "tests/test_ringcache.py::test_cuda_ring_is_lossless"
PF = "tests/test_prefill.py::test_one_prefill_serves_every_arm_and_loop_on_cuda"
GL = "tests/test_generate.py::test_marks_in_the_cuda_graph_loop"
GM = "tests/test_generate.py::test_marks_on_cuda"
BT = "tests/test_bench_timing.py"
RO = "tests/test_rope.py::test_frequencies_first_asked_for_in_a_capture_are_not_kept"
TC = "tests/test_cuda_graphs.py"  # written after session 38's run, to kill its survivors
ALL = [SD, SDP, SL, SB, GA, RI, PF, GL]
BA = "tests/test_bench_attention.py::test_read_floor_is_timed_on_the_window_draft_rows"
BAS = "tests/test_bench_attention.py::test_step_ms_is_gated_by_graph_ms"
BD = "tests/test_cli_bench_decode.py::test_bench_decode_on_cuda_times_both_loops"
BP = "tests/test_cli_bench_depth.py::test_bench_depth_on_cuda_in_the_graph_loop"
BB = "tests/test_bench_batch.py::test_bench_batch_on_cuda_in_both_loops"

CAPTURE_ORDER = """        if draft_key not in self.drafts:
            self.drafts[draft_key] = runner(lambda: self.draft_phase(*draft_key), (), self.graph, self.pool)
        if k not in self.verifies:
            self.verifies[k] = runner(lambda: self.verify_phase(k), self.state, self.graph, self.pool)
"""
SWAPPED = """        if k not in self.verifies:
            self.verifies[k] = runner(lambda: self.verify_phase(k), self.state, self.graph, self.pool)
        if draft_key not in self.drafts:
            self.drafts[draft_key] = runner(lambda: self.draft_phase(*draft_key), (), self.graph, self.pool)
"""
STATE = "(h_next, t_next, n_prev, accepted), graph, clock)"


def m(name, file, edits, tests):
    return {"name": name, "file": file, "edits": edits, "tests": tests}


G, D, B = "wmtp/graphs.py", "wmtp/device.py", "wmtp/bench_timing.py"
BAF, BC = "wmtp/bench_attention.py", "wmtp/bench_common.py"
MUTANTS = [
    m("runner_no_restore", G, [("    for t, s in zip(state, saved):\n        t.copy_(s)\n", "")], ALL),
    m("runner_no_clone", G, [("saved = [t.clone() for t in state]", "saved = list(state)")], ALL),
    m("phases_pool_none", G, [("self.pool = graph_pool() if graph else None", "self.pool = None")], ALL),
    m("phases_draft_key_ignores_keyset", G, [
        ("if draft_key not in self.drafts:\n            self.drafts[draft_key] = runner",
         "if draft_key[:2] not in self.drafts:\n            self.drafts[draft_key[:2]] = runner"),
        ("self.drafts[draft_key]()", "self.drafts[draft_key[:2]]()")], [GA, SD, RI, TC]),
    m("phases_one_verify_graph", G, [
        ("if k not in self.verifies:\n            self.verifies[k] = runner",
         "if 0 not in self.verifies:\n            self.verifies[0] = runner"),
        ("self.verifies[k]()", "self.verifies[0]()")], ALL),
    m("phases_capture_order_swapped", G, [(CAPTURE_ORDER, SWAPPED)], ALL),
    m("clock_spans_reversed", G, [("return [a.elapsed_time(b) / 1e3 for a, b in zip(m, m[1:])]",
                                   "return [b.elapsed_time(a) / 1e3 for a, b in zip(m, m[1:])]")], [GL, GA, SD]),
    m("use_graph_default_ignores_impl", G, [('return device.type == "cuda" and impl == "triton"',
                                             'return device.type == "cuda"')], ALL + [GM]),
    m("use_graph_default_never", G, [('return device.type == "cuda" and impl == "triton"', "return False")],
      ALL + [GM, TC]),
    m("capture_no_warmup", D, [("    with torch.cuda.stream(side):  # warm up off the default stream, as capture "
                                "requires\n        fn()\n", "")], ALL + [BT, TC]),
    m("capture_pool_dropped", D, [("with torch.cuda.graph(graph, pool=pool):", "with torch.cuda.graph(graph):")],
      ALL + [TC]),
    m("capture_no_recover", D, [("        _recover_from_failed_capture(caller)\n", "")], [BT]),
    m("recover_no_set_stream", D, [("    torch.cuda.set_stream(caller)\n", "")], [BT]),
    m("recover_no_epilogue_op", D, [("            x.add_(1)\n    except", "            pass\n    except")], [BT]),
    m("greedy_state_no_slot", "wmtp/static_decode.py", [("run = runner(step, (tok, pos, slot), graph)",
                                                          "run = runner(step, (tok, pos), graph)")], [SD, SL, PF]),
    m("greedy_state_no_tok", "wmtp/static_decode.py", [("run = runner(step, (tok, pos, slot), graph)",
                                                         "run = runner(step, (pos, slot), graph)")], [SD, SL, PF]),
    m("spec_state_no_n_prev", "wmtp/static_decode.py", [(STATE, "(h_next, t_next, accepted), graph, clock)")],
      [SD, SDP, GA, RI, PF, GL]),
    m("spec_state_no_accepted", "wmtp/static_decode.py", [(STATE, "(h_next, t_next, n_prev), graph, clock)")],
      [SD, SDP, GA, RI, PF, GL]),
    m("spec_state_no_h_next", "wmtp/static_decode.py", [(STATE, "(t_next, n_prev, accepted), graph, clock)")],
      [SD, SDP, GA, RI, PF, GL, TC]),
    m("lockstep_state_no_t_next", "wmtp/static_lockstep.py", [(STATE, "(h_next, n_prev, accepted), graph, clock)")],
      [SL]),
    m("batched_state_no_h_next", "wmtp/static_batched.py", [(STATE, "(t_next, n_prev, accepted), graph, clock)")],
      [SB]),
    m("batched_state_no_accepted", "wmtp/static_batched.py", [(STATE, "(h_next, t_next, n_prev), graph, clock)")],
      [SB, TC]),
    m("rope_freqs_kept_in_capture", "wmtp/block.py", [
        ("if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):", "if True:")], [RO]),
    m("graph_replay_ms_no_graph", B, [("return timed_ms(capture_graph(fn).replay)", "return timed_ms(fn)")], [BT]),
    m("replay_ms_no_sync", B, [("    end.synchronize()\n", "")], [BT]),
    m("step_ms_graphs_swapped", B, [('times[name].append(_replay_ms(graphs[name]))',
                                     'times[name].append(_replay_ms(graphs["both"]))')], [BT]),
    m("bench_no_host_ms", BAF, [('            row["host_ms"] = host_ms(fn, c.q.device)\n', "")], [BA]),
    m("bench_no_graph_floor", BAF, [("floor = graph_floor_ms(device, timed_ms) if", "floor = None if")], [BA]),
    m("bench_step_ungated", BAF, [("stepped = isinstance(graph, float) and graph <= STEP_MAX_MS",
                                   "stepped = isinstance(graph, float)")], [BAS]),
    m("bench_read_floor_every_triton", BAF, [('if name == "triton_window":', 'if name.startswith("triton"):')], [BA]),
    m("bench_graph_loop_dense_eager", BC, [("static_greedy_generate(*a, cuda_graph=True, **k)",
                                            "static_greedy_generate(*a, cuda_graph=False, **k)")], [BD, BP]),
    m("bench_graph_loop_spec_eager", BC, [("static_speculative_generate(*a, cuda_graph=True, **k)",
                                           "static_speculative_generate(*a, cuda_graph=False, **k)")], [BD, BP]),
    m("bench_batch_graph_loop_eager", "wmtp/bench_batch.py", [('{"cuda_graph": True} if loop == "graph"',
                                                               '{"cuda_graph": False} if loop == "graph"')], [BB]),
]


def pytest(tests: list[str], log) -> tuple[int, list[str]]:
    """pytest over ``tests`` on 8 workers: its exit status and summary lines (FAILED/ERROR, the count)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "8", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                        "-rfE", *tests], capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    log.write(f"\n=== {tests} rc={r.returncode}\n{text[-4000:]}\n")
    log.flush()
    count = re.compile(r"(passed|failed|error).* in [0-9.]+s")
    lines = text.splitlines()
    return r.returncode, [line for line in lines if line.startswith(("FAILED", "ERROR")) or count.search(line)]


def mutated(mutant: dict) -> str:
    """The mutant's file with its edits made (each ``old`` must occur exactly once)."""
    src = pathlib.Path(mutant["file"]).read_text()
    for old, new in mutant["edits"]:
        if src.count(old) != 1:
            raise SystemExit(f"{mutant['name']}: {old!r} occurs {src.count(old)} times in {mutant['file']}")
        src = src.replace(old, new)
    return src


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--budget-s", type=float, default=float("inf"), help="start no mutant after this many seconds")
    p.add_argument("--only", nargs="+", help="these mutants (default: all)")
    p.add_argument("--tests", nargs="+", help="run these tests for every mutant instead of its own")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m["name"] in args.only]
    for m in chosen:
        mutated(m)  # every edit applies before anything runs
    t0, results = time.time(), []
    with open(args.out / "gpu-mutants.log", "a") as log:
        rc, summary = pytest(args.tests or sorted({t for m in chosen for t in m["tests"]}), log)
        results.append({"name": "unmutated", "rc": rc, "s": round(time.time() - t0), "summary": summary[-3:]})
        print("unmutated", rc, *summary[-1:], flush=True)
        if rc != 0:
            return 1
        for m in chosen:
            if time.time() - t0 > args.budget_s:
                results.append({"name": "stopped before", "next": m["name"]})
                break
            f, t = pathlib.Path(m["file"]), time.time()
            original = f.read_text()
            f.write_text(mutated(m))
            try:
                rc, summary = pytest(args.tests or m["tests"], log)
            finally:
                f.write_text(original)
            results.append({"name": m["name"], "killed": rc != 0, "rc": rc, "s": round(time.time() - t),
                            "summary": summary[-3:]})
            print(m["name"], "killed" if rc else "SURVIVED", *summary[-1:], flush=True)
            (args.out / "gpu-mutants.json").write_text(json.dumps(results, indent=1))
    (args.out / "gpu-mutants.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
