#!/usr/bin/env bash
# Builds wsync and its tests with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-asan/ (gcc, warnings as errors, fault hooks in) and runs every CPU test there:
#  - C tests: any invalid access, undefined behaviour or leak fails the test. LeakSanitizer
#    checks each process at exit; the test children forked by tests/support/proc.c end with
#    _exit, so they run the check themselves first.
#  - python tests: python3 is not built with ASan, so the runtime is preloaded (LD_PRELOAD) for
#    the instrumented libwsync.so it loads; leaks are not checked there (CPython keeps memory at
#    exit by design, and a suppression broad enough to hide it would hide wsync's too). The C
#    peers those tests start are still checked for invalid accesses.
# UCX's memory hooks need no change: UCX 1.13 runs under ASan as is (UCX_MEM_* left alone).
# The exit status is non-zero if any test failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cmake -B build-asan -S . -DWSYNC_WERROR=ON -DWSYNC_FAULTS=ON -DWSYNC_SANITIZE=ON
cmake --build build-asan -j "$(nproc)"
cd build-asan

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
rc=0
ctest --output-on-failure -LE python || rc=1

# the ASan runtime of the compiler this build used
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' CMakeCache.txt)
if "$cc" --version 2>/dev/null | grep -qi clang; then
    asan_rt=$("$cc" -print-file-name="libclang_rt.asan-$(uname -m).so")
else
    asan_rt=$("$cc" -print-file-name=libasan.so)
fi
if [ -f "$asan_rt" ] && ctest -N -L python | grep -q 'Total Tests: [1-9]'; then
    LD_PRELOAD=$asan_rt ASAN_OPTIONS=detect_leaks=0:strict_string_checks=1 \
        ctest --output-on-failure -L python || rc=1
fi
exit $rc
