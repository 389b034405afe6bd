#!/usr/bin/env bash
# Where a hung test process waits: its state, each thread's kernel wait channel and, when
# cuda-gdb is there (the lent GPU machines have it, not gdb), every thread's stack.
#
#   bash tests/gpu/hang_dump.sh PID
#
# The GPU tests run it for a child they are about to kill (WSYNC_TEST_ON_HANG, set by
# tests/gpu/run.sh); tests/support/proc.c bounds it.
set -u
pid=${1:?usage: hang_dump.sh PID}
echo "==== hang dump of pid $pid ($(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null))"
grep -E '^(State|Threads|SigPnd|ShdPnd|SigBlk)' /proc/$pid/status 2>/dev/null
for t in /proc/$pid/task/*; do
    [ -d "$t" ] || continue
    echo "  thread ${t##*/} $(cut -d' ' -f2,3 "$t/stat" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
done
if command -v cuda-gdb > /dev/null 2>&1; then
    cuda-gdb -q -p "$pid" -batch -ex 'set pagination off' -ex 'info threads' \
        -ex 'thread apply all bt 30' 2>&1 | grep -v '^\[New LWP\|^warning: ' | head -n 400
else
    echo "  (no cuda-gdb here: no stacks)"
fi
echo "==== end of hang dump of pid $pid"
