#!/usr/bin/env bash
# Run a command with the loopback interface limited to a link's rate, so that a one-host run of a
# TCP transport is bound by the link as it is across nodes (issue 17's "network-bound link"):
#
#   bash bench/shaped_link.sh GBIT COMMAND [ARGS ...]
#
# e.g. bash bench/shaped_link.sh 25 wsync-bench --model-shape qwen3-0.6b --mem host \
#          --scheme store --transport ofi --lr 1e-6 --delta --json
#
# A token bucket (tc qdisc tbf) on lo at GBIT Gbit/s for the command's life, removed afterwards,
# also when the script is interrupted or terminated (the command is then stopped too). One bucket
# for everything on lo: every direction and pair of processes shares it, where a NIC would give
# each direction its own. Unshaped, loopback TCP moves what the host's cores and memory allow:
# about 30-35 Gbit/s for libfabric's tcp provider on the 16-core hosts of the lent H200 machines,
# so a rate below that makes the link the bottleneck (docs/benchmarks.md, "The store on host
# memory over a link of 25 Gbit/s"). Needs root and tc (iproute2): $TC may name tc (and e.g.
# `env LD_LIBRARY_PATH=... /path/tc` where it is carried rather than installed). Refuses a
# loopback that already has a root qdisc other than the default, rather than replace it.
# Exit status: the command's; 2 for bad arguments; 77 when lo cannot be shaped here (no tc, not
# root, no tbf in the kernel, lo already shaped), the command not run.
set -u

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
}
case ${1:-} in
-h | --help) usage; exit 0 ;;
'') usage >&2; exit 2 ;;
esac
GBIT=$1
shift
if ! [[ $GBIT =~ ^[0-9]+([.][0-9]+)?$ ]] || ! awk -v g="$GBIT" 'BEGIN { exit !(g > 0) }'; then
    echo "shaped_link.sh: GBIT must be a positive number of Gbit/s, not '$GBIT'" >&2
    exit 2
fi
if [ $# -eq 0 ]; then
    echo "shaped_link.sh: no command to run" >&2
    exit 2
fi
TC=${TC:-tc}
if ! $TC qdisc show dev lo > /dev/null 2>&1; then
    echo "shaped_link.sh: '$TC qdisc show dev lo' failed: tc (iproute2) is needed, as root" >&2
    exit 77
fi
if $TC qdisc show dev lo | grep -q "root" && ! $TC qdisc show dev lo | grep -q "noqueue"; then
    echo "shaped_link.sh: lo already has a root qdisc: $($TC qdisc show dev lo | head -1)" >&2
    exit 77
fi
# the bucket holds 1 ms of the rate (at least 1 MB): loopback hands over 64 KiB segments, and a
# bucket near that size caps the rate well below GBIT
BURST=$(awk -v g="$GBIT" 'BEGIN { b = g * 1e9 / 8 / 1000; if (b < 1048576) b = 1048576; printf "%d", b }')
added=0
child=
unshape() {
    if [ $added = 1 ]; then
        $TC qdisc del dev lo root 2> /dev/null
        added=0
    fi
}
stop() {   # the signal's exit status; lo first, then the command (which may not stop at once)
    unshape
    [ -n "$child" ] && kill -TERM "$child" 2> /dev/null
    exit "$1"
}
trap unshape EXIT
trap 'stop 130' INT
trap 'stop 143' TERM
if ! $TC qdisc add dev lo root tbf rate "${GBIT}gbit" burst "$BURST" latency 50ms; then
    echo "shaped_link.sh: cannot add a tbf qdisc to lo (root? sch_tbf in the kernel?)" >&2
    exit 77
fi
added=1
echo "shaped_link.sh: lo limited to $GBIT Gbit/s (tbf, burst $BURST bytes)" >&2
# in the background, so that a signal to this script is handled at once, not after the command
"$@" &
child=$!
wait "$child"
rc=$?
child=
echo "shaped_link.sh: lo after the command: $($TC -s qdisc show dev lo | tr '\n' ' ')" >&2
exit $rc
