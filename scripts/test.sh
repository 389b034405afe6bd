#!/usr/bin/env bash
# Installs what is missing, then runs every CPU check wsync has, in three builds:
#
#   build/       warnings as errors, fault-injection hooks compiled in (for the faults suite):
#                every CPU test — unit, integration, faults, python, soak, and each fuzz target
#                replayed over its seed corpus and its regression files
#   build-asan/  the same tests under AddressSanitizer + UndefinedBehaviorSanitizer, leaks
#                checked in every process, child processes included (scripts/sanitize.sh)
#   build-fuzz/  clang + libFuzzer: each fuzz target fuzzed for WSYNC_FUZZ_SECONDS seconds
#                (default 60), then its regression files replayed (scripts/fuzz.sh)
#
# WSYNC_TEST_STAGES picks stages ("build asan fuzz" by default, e.g. WSYNC_TEST_STAGES=build for
# a quick run). Every stage runs even if one before it failed; the exit status is 0 only if all
# passed, and the last lines name the stages that failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

stages=${WSYNC_TEST_STAGES:-build asan fuzz}
failed=()

bash scripts/setup.sh

for stage in $stages; do
    start=$(date +%s)
    echo "=== test.sh: stage $stage" >&2
    case $stage in
        build)
            if ! { cmake -B build -S . -DWSYNC_WERROR=ON -DWSYNC_FAULTS=ON &&
                   cmake --build build -j "$(nproc)" &&
                   (cd build && ctest --output-on-failure); }; then
                failed+=(build)
            fi
            ;;
        asan)
            bash scripts/sanitize.sh || failed+=(asan)
            ;;
        fuzz)
            bash scripts/fuzz.sh || failed+=(fuzz)
            ;;
        *)
            echo "test.sh: unknown stage '$stage' (build, asan, fuzz)" >&2
            failed+=("$stage")
            ;;
    esac
    echo "=== test.sh: stage $stage took $(( $(date +%s) - start )) s" >&2
done

if [ ${#failed[@]} -ne 0 ]; then
    echo "test.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test.sh: every stage passed ($stages)" >&2
