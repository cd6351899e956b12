#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and
# runs each for SECONDS (default 60) on a copy of its seed corpus
# (tests/fuzz/corpus/<target>/, never written to), leaks detected.
# Prints per target the runs, coverage (cov:), new corpus entries and
# exec/s; exits non-zero if any target crashed, leaked, timed out (10 s
# per input) or ran out of memory (2 GiB), naming the input that did it.
#
#   scripts/run-fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/run-fuzz.sh 20 config
#
# Reproducers are kept in $FUZZ_ARTIFACTS (default build/fuzz/artifacts);
# replay one with build/fuzz/tests/fuzz/<target>_fuzz <file>.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then  # every target: one corpus folder each
  for dir in tests/fuzz/corpus/*/; do targets+=("$(basename "$dir")"); done
fi
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: $0 [SECONDS] [TARGET...]" >&2
  exit 2
fi

cmake --preset fuzz >/dev/null
nice -n 5 cmake --build --preset fuzz -j "${FUZZ_JOBS:-$(nproc)}"

artifacts=${FUZZ_ARTIFACTS:-build/fuzz/artifacts}
mkdir -p "$artifacts"
artifacts=$(cd "$artifacts" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Per-target libFuzzer flags. request_handler: a run covers so much code
# (engine, protobuf) that the entropic schedule's bookkeeping costs 8x the
# runs; the plain schedule finds more in the same time.
extra_flags() {
  case $1 in
    request_handler) echo "-entropic=0" ;;
    *) echo "" ;;
  esac
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

failed=()
summary=()
for target in "${targets[@]}"; do
  binary=build/fuzz/tests/fuzz/${target}_fuzz
  seeds=tests/fuzz/corpus/$target
  if [[ ! -x $binary || ! -d $seeds ]]; then
    echo "run-fuzz: no target $target ($binary, $seeds)" >&2
    exit 2
  fi
  corpus=$work/$target
  mkdir -p "$corpus"
  cp "$seeds"/* "$corpus"/
  seed_count=$(find "$corpus" -type f | wc -l)
  log=$work/$target.log
  echo "== $target: ${seconds}s on $seed_count seeds"
  status=0
  # shellcheck disable=SC2046  # the extra flags are words
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -detect_leaks=1 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$target-" $(extra_flags "$target") \
    "$corpus" >"$log" 2>&1 || status=$?
  # A run that stops on a seed prints no statistics: "?".
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  added=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
  cov=$({ grep -o 'cov: [0-9]*' "$log" || true; } | tail -1 | cut -d' ' -f2)
  line=$(printf '%-16s runs %-9s cov %-6s new %-5s exec/s %s' "$target" "${runs:-?}" "${cov:-?}" "${added:-?}" "${per_s:-?}")
  if ((status != 0)); then
    kind=crash
    grep -q 'ERROR: libFuzzer: timeout' "$log" && kind=timeout
    grep -q 'ERROR: libFuzzer: out-of-memory' "$log" && kind=out-of-memory
    grep -q 'ERROR: LeakSanitizer' "$log" && kind=leak
    reproducer=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "---- last lines of the $target run ----"
    tail -n 60 "$log"
    echo "----"
    line="$line  FAILED: $kind (exit $status), input: ${reproducer:-none written}"
    failed+=("$target")
  fi
  echo "$line"
  summary+=("$line")
done

echo "== fuzz summary (${seconds}s each)"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]} > 0)); then
  echo "run-fuzz: failed: ${failed[*]} (reproducers under $artifacts)" >&2
  exit 1
fi
