#!/usr/bin/env bash
# Rewrites the binary seeds of tests/fuzz/corpus (request_handler/,
# frame_reader/) with fuzz_corpus_seeds (make_corpus.cc), built in the
# `fuzz` preset's tree. The text seeds (config/, replay_trace/) are
# committed as written: a config is packaging/kvtierd.toml, trace lines
# come from tests/data/replay/, each behind the one byte replay_trace_fuzz
# reads first (block size and form: see replay_trace_fuzz.cc).
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset fuzz >/dev/null
nice -n 5 cmake --build build/fuzz --target fuzz_corpus_seeds -j "${FUZZ_JOBS:-$(nproc)}"
rm -rf tests/fuzz/corpus/request_handler tests/fuzz/corpus/frame_reader
build/fuzz/tests/fuzz/fuzz_corpus_seeds tests/fuzz/corpus
du -sh tests/fuzz/corpus
