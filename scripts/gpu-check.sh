#!/usr/bin/env bash
# gpu-check: the CUDA parts on a machine with an NVIDIA GPU, in about five
# minutes: configures build/gpu (RelWithDebInfo, KVTIER_CUDA=ON), builds the
# GPU targets (kvtier_gpu_tests, kvtier_gpu_bench), asks the bench's probe
# whether CUDA can use the device, runs `ctest -L gpu` (every test must
# run: a skip means the device is not usable) and the tier contract cases
# on the HBM tier (kvtier_unit_tests), then the GPU bench, and
# prints its figures. Then the vLLM connector's GPU data path: builds the
# Python binding and kvtierd, runs tests/python/test_vllm_cuda_path.py
# (every test must run) and tests/python/bench_vllm_step.py --device cuda
# (the forward step with the KV caches on the GPU, each figure beside its
# ceiling measured in the same run). Fails loudly when there is no GPU, or
# when the Python interpreter's torch cannot use it.
#
#   scripts/gpu-check.sh [bench options, e.g. --reps=3]
#
# Environment: BUILD_DIR (default build/gpu), JOBS (default nproc),
# KVTIER_PYTHON (default /usr/bin/python3: the interpreter the binding is
# built for, with a CUDA-enabled torch, 2.0 or later).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build/gpu}
jobs=${JOBS:-$(nproc)}
py=${KVTIER_PYTHON:-/usr/bin/python3}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fail() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}
step() { echo "== [${SECONDS}s] $*"; }

# run_without_skips LABEL SKIP_MARK CMD...: runs CMD, its output also in
# $log; fails when it fails or when its output shows SKIP_MARK (on a machine
# with a GPU every test must run).
run_without_skips() {
  local label=$1 skip_mark=$2 rc
  shift 2
  set +e
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  [[ $rc -eq 0 ]] || fail "$label (exit $rc)"
  if grep -qF "$skip_mark" "$log"; then
    fail "$label: skipped on a machine with a GPU"
  fi
}

step "probing the GPU"
command -v nvidia-smi > /dev/null || fail "no nvidia-smi: this machine has no NVIDIA driver (no GPU to check)"
nvidia-smi -L || fail "nvidia-smi sees no GPU"

step "configuring $build_dir"
timeout 120 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_CUDA=ON \
  -DKVTIER_PYTHON="$py" > "$log" 2>&1 ||
  { cat "$log"; fail "configure (KVTIER_CUDA=ON needs nvcc and the CUDA toolkit)"; }
grep 'kvtier: CUDA' "$log"

step "building kvtier_gpu_tests kvtier_gpu_bench kvtier_unit_tests (-j$jobs)"
timeout 360 cmake --build "$build_dir" -j "$jobs" --target kvtier_gpu_tests kvtier_gpu_bench kvtier_unit_tests \
  > "$log" 2>&1 ||
  { tail -50 "$log"; fail "build"; }

step "probing the device through CUDA"
"$build_dir/gpu/bench/kvtier_gpu_bench" --probe || fail "CUDA cannot use the GPU (the line above says why)"

step "ctest -L gpu"
run_without_skips "ctest -L gpu (run one with --gtest_filter to see a skip's reason)" '(Skipped)' \
  timeout 180 ctest --test-dir "$build_dir" -L gpu --output-on-failure --timeout 120

step "the tier contract cases on the HBM tier (device double and GPU)"
timeout 120 "$build_dir/tests/kvtier_unit_tests" --gtest_filter='EveryTier/TierContractTest.*/hbm*' 2>&1 | tee "$log" ||
  fail "tier contract on the HBM tier"
if grep -q '\[  SKIPPED \]' "$log"; then
  fail "the HBM tier's contract cases were skipped on a machine with a GPU"
fi

step "kvtier_gpu_bench $*"
set +e
timeout 150 "$build_dir/gpu/bench/kvtier_gpu_bench" "$@"
bench_rc=$?
set -e
[[ $bench_rc -eq 2 ]] && fail "the bench found no usable CUDA device"
[[ $bench_rc -eq 0 ]] || fail "kvtier_gpu_bench (exit $bench_rc)"

step "the vLLM connector on CUDA tensors: torch in $py"
"$py" -c 'import sys, torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)
sys.exit(0 if torch.cuda.is_available() else 1)' ||
  fail "$py has no torch that can use the GPU (set KVTIER_PYTHON to an interpreter with a CUDA torch)"

step "building the Python binding and kvtierd (-j$jobs)"
timeout 300 cmake --build "$build_dir" -j "$jobs" --target kvtier_python kvtier_python_package kvtierd kvtier \
  > "$log" 2>&1 ||
  { tail -50 "$log"; fail "build of the Python binding (it needs $py's headers and pybind11)"; }
python_env=(PYTHONPATH="$build_dir/python:tests/python" KVTIERD="$build_dir/daemon/kvtierd"
            KVTIER_TOOL="$build_dir/tools/kvtier" KVTIER_SOURCE_DIR="$PWD" OMP_NUM_THREADS=1)

step "pytest tests/python/test_vllm_cuda_path.py"
run_without_skips "the connector's CUDA tests (the reasons of skips are above)" 'SKIPPED' \
  timeout 300 env "${python_env[@]}" "$py" -m pytest -q -rs -p no:cacheprovider --rootdir=tests/python \
  tests/python/test_vllm_cuda_path.py

step "bench_vllm_step.py --device cuda"
timeout 300 env "${python_env[@]}" "$py" tests/python/bench_vllm_step.py --device cuda ||
  fail "bench_vllm_step.py --device cuda"

step "done: GPU tests passed, figures above"
