# Entry points of README.md. Each target installs what it needs first.
PRESET ?= release
BUILD  := build/$(PRESET)
JOBS   ?= $(shell nproc)
CONFIG ?=

.PHONY: deps build run test bench asan-test fuzz clean

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

# Starts kvtierd in the foreground with the embedded default configuration
# (or CONFIG=path/to/kvtierd.toml). Ctrl-C / SIGTERM drains and exits.
run: build
	$(BUILD)/daemon/kvtierd $(if $(CONFIG),--config $(CONFIG),)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Host tier vs memcpy / redis-benchmark, the NVMe tier vs fio on the file
# system of $(BUILD) (BENCH_DIR=... to measure another one), then the remote
# tier vs redis-benchmark on a private loopback Redis Cluster.
BENCH_DIR ?= $(BUILD)
bench: build
	$(BUILD)/tools/kvtier bench host
	$(BUILD)/tools/kvtier bench nvme --dir $(BENCH_DIR)
	$(BUILD)/tools/kvtier bench remote

asan-test: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	cd build/asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

# The libFuzzer targets of tests/fuzz (the `fuzz` preset, clang), each for
# FUZZ_SECONDS on a copy of its seed corpus; fails on a crash, leak,
# timeout or OOM and names the input (scripts/run-fuzz.sh).
FUZZ_SECONDS ?= 60
fuzz: deps
	bash scripts/run-fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf build
