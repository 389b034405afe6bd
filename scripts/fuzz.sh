#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and UBSan into
# build-fuzz/ and runs their ctests (label fuzz): each target fuzzes for WSYNC_FUZZ_SECONDS
# seconds (default 60) from its seed corpus (tests/fuzz/corpus/<name>/; what it finds that is new
# stays in build-fuzz/fuzz/corpus/<name>/), then replays tests/fuzz/regressions/<name>/. A crash
# fails the test; libFuzzer writes the input to build-fuzz/fuzz/artifacts/<name>/ and prints it.
# Longer runs: WSYNC_FUZZ_SECONDS=900 bash scripts/fuzz.sh, or build-fuzz/bin/fuzz_<name> with
# libFuzzer's own options. The exit status is ctest's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CC=${WSYNC_FUZZ_CC:-clang} cmake -B build-fuzz -S . -DWSYNC_FUZZ=ON -DWSYNC_BUILD_TESTS=OFF \
    -DWSYNC_WERROR=ON -DWSYNC_FUZZ_SECONDS="${WSYNC_FUZZ_SECONDS:-60}"
cmake --build build-fuzz -j "$(nproc)" --target wsync_fuzzers
cd build-fuzz
ctest --output-on-failure -L fuzz
