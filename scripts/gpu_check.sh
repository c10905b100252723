#!/usr/bin/env bash
# The kernel issue's GPU work in ONE device call (the device tool's $OUT collects what comes back):
#   tests    - tests/test_triton_attention.py, the launch cache's, the CUDA losslessness cases of tests/test_lossless.py
#              (its CPU-only tests run in CI and take ~100 s each beside 16 workers), the offline sm_90 compile,
#              the bench's tests and reproduce on CUDA (its evaluations' test and a tiny end-to-end run); run M:
#              663 passed in 129 s on a machine that had compiled the kernels, while a fresh one compiles them first
#              (run T, with the two reproduce tests: 292 s); then notebook 04's twin run for real on the GPU;
#   bench    - `wmtp bench attention` with $BENCH_ARGS, then scripts/tune_attention.py $TUNE_ARGS.
# With two GPUs the halves run side by side (tests on GPU 0, timings alone on GPU 1); else in turn.
# Knobs (seconds): TEST_S, TUNE_S, TUNE_BUDGET, BENCH_S; TESTS (pytest targets); SKIP_TUNE=1 skips the tuning,
# SKIP_NCU=1 the profile (NCU_ARGS replaces its metrics); FLOOR=1 runs scripts/draft_floor.py after the sweep.
# SKIP_BENCH=1 runs the tests half only (no sweep, floor or tuning; it wins over SKIP_TESTS). With two GPUs the
# timings share the host with 16 pytest workers: graph timings then read ~1.7 us high
# (metrics/draft-floor-h200-40552f1-busy-host.json); for figures to commit, time alone: SKIP_TESTS=1 runs the
# bench half only.
set -o pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-out}
mkdir -p "$OUT"
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
BENCH_GPU=$(( NGPU > 1 ? 1 : 0 ))

tests() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
    # -v lines of failures only (as they happen), and SIGINT at the limit so pytest still prints its summary
    # one torch thread a worker: 16 workers of 16 threads made CPU float64 tests over 1000x slower (run V)
    OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=0 timeout -s INT "${TEST_S:-420}" python3 -m pytest -n 16 -v -rfEs --tb=short --durations=15 \
      -p no:cacheprovider ${TESTS:-tests/test_triton_attention.py tests/test_launch_cache.py \
      tests/test_lossless.py::test_every_backend_is_lossless tests/test_kernel_sm90.py tests/test_bench_attention.py \
      tests/test_bench_read.py tests/test_bench_timing.py tests/test_train.py::test_evaluation_runs_with_models_on_the_gpu \
      tests/test_cli_reproduce.py::test_tiny_reproduce_on_cuda tests/test_static_decode.py::test_cuda_is_lossless \
      tests/test_cli_bench_decode.py::test_bench_decode_on_cuda_times_both_loops tests/test_prefill.py tests/test_ringcache.py \
      tests/test_sampling.py tests/test_policy.py} \
      | grep -v -E " PASSED | SKIPPED |^tests/[^ ]+ $"  # xdist's -v also prints each test as it starts
    echo "pytest exit $?"
    (cd tutorials && CUDA_VISIBLE_DEVICES=0 timeout 90 python3 04_triton_kernel.py)
    echo "notebook 04 exit $?"; } > "$OUT/tests.log" 2>&1
  if [ "${SKIP_NCU:-0}" != 1 ]; then  # where the draft's device time goes: attention kernel vs merge
    # shellcheck disable=SC2086  # NCU_ARGS: e.g. "--section WarpStateStats --section MemoryWorkloadAnalysis"
    CUDA_VISIBLE_DEVICES=0 timeout 90 ncu --clock-control none \
      ${NCU_ARGS:---metrics gpu__time_duration.sum,dram__bytes_read.sum} \
      --kernel-name regex:"_attention_kernel|_merge_kernel" --launch-skip 12 --launch-count 12 \
      python3 scripts/profile_draft.py > "$OUT/ncu.log" 2>&1
    echo "ncu exit $?" >> "$OUT/ncu.log"
  fi
}

bench() {
  # the sweep writes its JSON after every (S, shape), so a sweep stopped at BENCH_S keeps what it measured
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$BENCH_GPU timeout -s INT "${BENCH_S:-400}" python3 -m wmtp.cli bench attention --device cuda \
    $BENCH_ARGS --out "$OUT/bench.json" --plot "$OUT/bench.png" > "$OUT/bench.log" 2>&1
  echo "bench exit $?" >> "$OUT/bench.log"
  if [ "${FLOOR:-0}" = 1 ]; then  # the draft against its launch and read floors (scripts/draft_floor.py)
    CUDA_VISIBLE_DEVICES=$BENCH_GPU timeout 150 python3 scripts/draft_floor.py --out "$OUT/draft-floor.json" \
      > "$OUT/floor.log" 2>&1
    echo "floor exit $?" >> "$OUT/floor.log"
  fi
  if [ "${SKIP_TUNE:-0}" != 1 ]; then  # with the time left: launch options (scripts/tune_attention.py)
    CUDA_VISIBLE_DEVICES=$BENCH_GPU timeout "${TUNE_S:-260}" python3 scripts/tune_attention.py $TUNE_ARGS \
      --out "$OUT/tune.json" --budget-s "${TUNE_BUDGET:-220}" > "$OUT/tune.log" 2>&1
    echo "tune exit $?" >> "$OUT/tune.log"
  fi
}

if [ "${SKIP_BENCH:-0}" = 1 ]; then tests; elif [ "${SKIP_TESTS:-0}" = 1 ]; then bench; elif [ "$NGPU" -gt 1 ]; then tests & bench; wait; else tests; bench; fi
tail -n 30 "$OUT/tests.log" 2>/dev/null; tail -n 12 "$OUT/tune.log" 2>/dev/null; tail -n 16 "$OUT/floor.log" 2>/dev/null
tail -n 60 "$OUT/bench.log" 2>/dev/null; true
