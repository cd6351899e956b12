#!/usr/bin/env bash
# gpu-check: the CUDA parts on a machine with an NVIDIA GPU, in about five
# minutes: configures build/gpu (RelWithDebInfo, KVTIER_CUDA=ON), builds the
# GPU targets (kvtier_gpu_tests, kvtier_gpu_bench), asks the bench's probe
# whether CUDA can use the device, runs `ctest -L gpu` (every test must
# run: a skip means the device is not usable) and the tier contract cases
# on the HBM tier (kvtier_unit_tests), then the GPU bench, and
# prints its figures. Fails loudly when there is no GPU.
#
#   scripts/gpu-check.sh [bench options, e.g. --reps=3]
#
# Environment: BUILD_DIR (default build/gpu), JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build/gpu}
jobs=${JOBS:-$(nproc)}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fail() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}
step() { echo "== [${SECONDS}s] $*"; }

step "probing the GPU"
command -v nvidia-smi > /dev/null || fail "no nvidia-smi: this machine has no NVIDIA driver (no GPU to check)"
nvidia-smi -L || fail "nvidia-smi sees no GPU"

step "configuring $build_dir"
timeout 120 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_CUDA=ON > "$log" 2>&1 ||
  { cat "$log"; fail "configure (KVTIER_CUDA=ON needs nvcc and the CUDA toolkit)"; }
grep 'kvtier: CUDA' "$log"

step "building kvtier_gpu_tests kvtier_gpu_bench kvtier_unit_tests (-j$jobs)"
timeout 360 cmake --build "$build_dir" -j "$jobs" --target kvtier_gpu_tests kvtier_gpu_bench kvtier_unit_tests \
  > "$log" 2>&1 ||
  { tail -50 "$log"; fail "build"; }

step "probing the device through CUDA"
"$build_dir/gpu/bench/kvtier_gpu_bench" --probe || fail "CUDA cannot use the GPU (the line above says why)"

step "ctest -L gpu"
set +e
timeout 180 ctest --test-dir "$build_dir" -L gpu --output-on-failure --timeout 120 2>&1 | tee "$log"
ctest_rc=${PIPESTATUS[0]}
set -e
[[ $ctest_rc -eq 0 ]] || fail "ctest -L gpu (exit $ctest_rc)"
if grep -q '(Skipped)' "$log"; then
  fail "GPU tests were skipped on a machine with a GPU (run one with --gtest_filter to see its reason)"
fi

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

step "done: GPU tests passed, figures above"
