# Entry points of README.md. Each target installs what it needs first.
PRESET ?= release
BUILD  := build/$(PRESET)
# One job more than cores: compiles wait on the disk now and then.
JOBS   ?= $(shell echo $$(( $$(nproc) + 1 )))
CONFIG ?=

.PHONY: deps build run test bench asan-test tsan-stress thread-safety fuzz clean

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

# Starts kvtierd in the foreground with the embedded default configuration
# (or CONFIG=path/to/kvtierd.toml). Ctrl-C / SIGTERM drains and exits.
run: build
	$(BUILD)/daemon/kvtierd $(if $(CONFIG),--config $(CONFIG),)

# In two stages, the whole suite either way: the unit tests (about 10 s)
# first, so a broken change fails within minutes of the build, then the rest.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE unit

# Host tier vs memcpy / redis-benchmark, the NVMe tier vs fio on the file
# system of $(BUILD) (BENCH_DIR=... to measure another one), then the remote
# tier vs redis-benchmark on a private loopback Redis Cluster.
BENCH_DIR ?= $(BUILD)
bench: build
	$(BUILD)/tools/kvtier bench host
	$(BUILD)/tools/kvtier bench nvme --dir $(BENCH_DIR)
	$(BUILD)/tools/kvtier bench remote

# The suite under ASan + UBSan (the asan preset, clang; without the CUDA
# parts and the Python binding, which the release suite covers, and
# without PolicyFloorTest: hit rates of every policy on every trace, pure
# arithmetic that takes 4 minutes under ASan; the release suite runs it). UBSan's
# vptr check is off: it probes memory through a pipe, so at the descriptor
# limit (which the hostile-client tests reach) it reports false positives.
asan-test: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	cd build/asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -E '^PolicyFloorTest\.'

# `kvtier stress` for STRESS_SECONDS against a kvtierd it starts, both
# built with ThreadSanitizer (the tsan preset, these two targets only):
# fails on a data race in either (halt_on_error: the daemon dies and the
# tool prints its log) and on any wrong byte served.
STRESS_SECONDS ?= 20
tsan-stress: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target kvtierd kvtier
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  build/tsan/tools/kvtier stress --spawn --kvtierd build/tsan/daemon/kvtierd \
	  --seconds $(STRESS_SECONDS) --clients 4

# The libraries and executables built by clang with its thread-safety
# analysis as errors (the thread-safety preset: -Wthread-safety -Wthread-safety-beta -Werror,
# no sanitizer, tests not built): fails on a GUARDED_BY member touched
# without its lock or a REQUIRES function called without it
# (common/thread_annotations.h). Nothing runs.
thread-safety: deps
	@cmake --preset thread-safety >/dev/null
	@cmake --build --preset thread-safety -j $(JOBS)

# The libFuzzer targets of tests/fuzz (the `fuzz` preset, clang), each for
# FUZZ_SECONDS on a copy of its seed corpus; fails on a crash, leak,
# timeout or OOM and names the input (scripts/run-fuzz.sh).
FUZZ_SECONDS ?= 60
fuzz: deps
	bash scripts/run-fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf build
