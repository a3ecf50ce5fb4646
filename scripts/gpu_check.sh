#!/usr/bin/env bash
# Every check that needs a real NVIDIA GPU, in one run of at most ~9 minutes: versions, the
# CPU kernels compiled once (4 processes in parallel, one shared cache), the GPU tests and the
# CUDA kernel tests on the device, compute-sanitizer (memcheck, racecheck) over every kernel,
# scripts/gpu_diagnose.py (the parity gate's verdict, SASS op counts, elementwise arithmetic),
# Nsight Compute on one 10,000-stream step (scripts/gpu_profile.py) and benchmarks/bench_cuda.py.
# Tests and benchmarks run with the parity gate off, so that they show the differences rather
# than a refusal. Logs and the JSON record (8 files) go to OUTDIR (default $OUT); the summary
# is printed last. Python packages the machine lacks (msgspec, tenacity, pytest-timeout;
# numba-cuda 0.30 where it has another release) may travel as wheels in .whl/.
#
#   bash scripts/gpu_check.sh [OUTDIR] [BUDGET_SECONDS]
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/gpu-check}}
BUDGET=${2:-540}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
stamp() { echo "[$SECONDS s] $*" | tee -a "$OUT_DIR/machine.txt"; }
left() { echo $((BUDGET - SECONDS)); }

if compgen -G ".whl/*.whl" >/dev/null; then
  wheels=$(ls .whl/*.whl | grep -v numba_cuda)
  # numba-cuda only where the machine's is not the verified release line (ptx_guard.py)
  if ! $PY -c "import numba_cuda as m, sys; sys.exit(not m.__version__.startswith('0.30.'))" 2>/dev/null; then
    wheels="$wheels $(ls .whl/numba_cuda*.whl 2>/dev/null)"
  fi
  # shellcheck disable=SC2086
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/atc-site $wheels
  export PYTHONPATH=/tmp/atc-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ATC_STREAM_CACHE_DIR=${ATC_STREAM_CACHE_DIR:-/tmp/atc-kernel-cache}
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)

nvidia-smi >"$OUT_DIR/machine.txt" 2>&1
head -12 "$OUT_DIR/machine.txt"
$PY - >>"$OUT_DIR/machine.txt" 2>&1 <<'EOF'
import os, platform
def show(label, fn):
    try:
        print(label, fn())
    except Exception as exc:
        print(label, "unavailable:", type(exc).__name__, exc)
show("python", platform.python_version)
show("cpus", os.cpu_count)
for name in ("numpy", "numba", "llvmlite", "numba_cuda", "cupy", "msgspec"):
    show(name, lambda name=name: __import__(name).__version__)
show("host cpu", lambda: __import__("llvmlite.binding").binding.get_host_cpu_name())
def device():
    from numba import cuda
    dev = cuda.get_current_device()
    return (dev.name, dev.compute_capability, dev.MULTIPROCESSOR_COUNT,
            cuda.cudadrv.driver.driver.get_version(), cuda.runtime.get_version())
show("device (name, cc, SMs, driver, runtime)", device)
show("cuda_available", lambda: __import__("atc_stream.kernels", fromlist=["x"]).cuda_available())
EOF
echo "sanitizer: ${SANITIZER:-none}" >>"$OUT_DIR/machine.txt"
tail -12 "$OUT_DIR/machine.txt"

stamp "compiling the CPU kernels (4 processes)"
compile_pids=()
for part in "atc 1" "atc 16" "strategy 1" "strategy 16"; do
  # shellcheck disable=SC2086
  set -- $part
  timeout 240 $PY - "$1" "$2" >>/tmp/atc-compile.log 2>&1 <<'EOF' &
import sys, time
from atc_stream import Engine
from atc_stream.engine import exercise
part, threads = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
if part == "atc":
    exercise.exercise_kernels(Engine, threads, lambda: None, strategies=False)
else:
    exercise._exercise_strategy_kernels(Engine, threads, lambda: None)
print(f"compiled {part} kernels, {threads} threads: {time.perf_counter() - started:.1f} s")
EOF
  compile_pids+=($!)
done
for pid in "${compile_pids[@]}"; do wait "$pid"; done
cat /tmp/atc-compile.log

# the diagnosis runs beside the tests and sanitizers (none of them is timed)
timeout 200 $PY scripts/gpu_diagnose.py >"$OUT_DIR/diagnosis.txt" 2>&1 &
diagnosis_pid=$!
export ATC_STREAM_CUDA_PARITY_CHECK=off

# Nsight Compute on one steady 10,000-stream step kernel (registers, occupancy, throughput;
# beside the untimed tests, so its durations are not the benchmark's)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  (timeout 150 "$NCU" --clock-control none --kernel-name regex:step_kernel --launch-skip 1 \
    --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    $PY scripts/gpu_profile.py 10000 >"$OUT_DIR/ncu.txt" 2>&1; echo "ncu rc $?" >>"$OUT_DIR/ncu.txt") &
  ncu_pid=$!
fi

stamp "GPU and CUDA kernel tests on the device; memcheck and racecheck beside them"
sanitizer_pids=()
for tool in memcheck racecheck; do
  if [ -n "$SANITIZER" ]; then
    timeout 200 "$SANITIZER" --tool "$tool" --error-exitcode 3 $PY scripts/gpu_sanitize.py \
      >"$OUT_DIR/$tool.log" 2>&1 &
    sanitizer_pids+=($!)
  fi
done
ATC_STREAM_CUDA_TESTS=device timeout 200 $PY -m pytest -q -ra -p no:cacheprovider \
  -m "gpu or cudasim" tests/test_cuda_gpu.py tests/test_cuda_sim.py tests/test_snapshot.py \
  tests/test_paper_trading.py tests/test_backtest_kernels.py tests/test_snapshot_parts_cudasim.py \
  >"$OUT_DIR/gpu_tests.log" 2>&1
tests_rc=$?
# the PTX and parity-gate tests, where nvJitLink really is installed
timeout 120 $PY -m pytest -q -ra -p no:cacheprovider tests/test_cuda_ptx.py \
  tests/test_cuda_parity.py >>"$OUT_DIR/gpu_tests.log" 2>&1 || tests_rc=$?
memcheck_rc=skipped
racecheck_rc=skipped
if [ -n "$SANITIZER" ]; then
  wait "${sanitizer_pids[0]}"
  memcheck_rc=$?
  wait "${sanitizer_pids[1]}"
  racecheck_rc=$?
fi

wait "$diagnosis_pid"
diagnosis_rc=$?
[ -n "${ncu_pid:-}" ] && wait "$ncu_pid"

stamp "bench_cuda.py ($(left) s left)"
timeout "$(left)" $PY benchmarks/bench_cuda.py --no-host-costs --repeats 5 \
  --step-sizes 1000,10000,100000,1000000 --backtest-sweep 2500,4,5000 \
  --json "$OUT_DIR/bench_cuda.json" >"$OUT_DIR/bench.log" 2>&1
bench_rc=$?

stamp "done"
echo "== diagnosis (rc $diagnosis_rc)"; grep -v Warning "$OUT_DIR/diagnosis.txt" | head -40
echo "== tests (rc $tests_rc)"; tail -25 "$OUT_DIR/gpu_tests.log"
echo "== memcheck (rc $memcheck_rc)"; tail -6 "$OUT_DIR/memcheck.log" 2>/dev/null
echo "== racecheck (rc $racecheck_rc)"; tail -6 "$OUT_DIR/racecheck.log" 2>/dev/null
echo "== ncu"; grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Block Limit|Waves Per SM|Stall|ncu rc" "$OUT_DIR/ncu.txt" 2>/dev/null | head -24
echo "== bench (rc $bench_rc)"; grep -v "^$" "$OUT_DIR/bench.log" | tail -60
