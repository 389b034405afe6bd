#!/usr/bin/env bash
# Same-machine A/B of wsync-bench builds: two or more builds run alternately, round after round,
# with the arguments bench/compare.sh gives them (Qwen3-0.6B shape, CUDA memory, 10 timed
# versions), so that a change in a small version's fixed cost shows against the machine's own
# noise; then one run of each without grid caps and one debug run (stage timings), and
# WSYNC_DOORBELL=0 on the second build. Written for the small-ipc-version slowdown of issue 21
# (docs/bench/sections/21_four_gpu_runs.md; its results: docs/bench/ab-small-ipc-4gpu.jsonl).
#
#   bash bench/ab.sh ROUNDS LABEL=BENCH [LABEL=BENCH ...]
#   e.g. OUT=/tmp/ab bash bench/ab.sh 3 old=/path/wsync-bench-70a8dfb new=build-gpu/wsync-bench
#
# 4 GPUs: colocated FSDP-4 -> TP-4 and disaggregated FSDP-2 -> TP-2 over ipc, disaggregated over
# nccl (control). Fewer GPUs: colocated FSDP-1 -> TP-1 with the local grid cap pinned to 1 block
# per SM. Writes $OUT/ab.jsonl and each run's stderr; prints one line per run and a summary
# (median over rounds of each run's median).
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] || [ $# -lt 2 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -lt 2 ] && [ "${1:-}" != "-h" ] && [ "${1:-}" != "--help" ] && exit 2
    exit 0
fi
set -u
ROUNDS=${1:?usage: ab.sh ROUNDS LABEL=BENCH ...}
shift
LABELS=()
declare -A BIN
for a in "$@"; do
    LABELS+=("${a%%=*}")
    BIN[${a%%=*}]=$(readlink -f "${a#*=}")
done
OUT=${OUT:-/tmp/wsync-ab}
mkdir -p "$OUT"
: > "$OUT/ab.jsonl"
export NCCL_NVLS_ENABLE=0
if ldd "${BIN[${LABELS[0]}]}" 2>/dev/null | grep -q 'libcudart.*not found'; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13.0/lib64; do
        [ -e "$d/libcudart.so.13" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
    done
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) x $NGPU; $(nproc) cores; $(date -u)"

one() {   # scenario label env shape args...
    local sc=$1 lab=$2 envs=$3 shape=$4 line
    shift 4
    line=$(env $envs timeout -k 5 120 "${BIN[$lab]}" --model-shape "$shape" --mem cuda --iters 10 \
        --warmup 2 --timeout 110 --json "$@" 2> "$OUT/$sc-$lab.err" | grep '^{' | tail -n 1)
    [ -n "$line" ] || line=null
    echo "{\"scenario\": \"$sc\", \"build\": \"$lab\", \"env\": \"$envs\", \"result\": $line}" >> "$OUT/ab.jsonl"
    printf '%-26s %-5s %s\n' "$sc" "$lab" "$(python3 -c 'import json,sys
r = json.loads(sys.argv[1])
print("failed" if not r else "median %.3f ms  min %.3f  x floor %.2f  %s  correct %s  times %s" % (
    r["seconds"] * 1e3, r["seconds_min"] * 1e3, r["ratio_floor"], r["scheme"], r["correct"],
    " ".join("%.2f" % (t * 1e3) for t in r["times"])))' "$line")"
}

if [ "$NGPU" -ge 4 ]; then
    for r in $(seq 1 "$ROUNDS"); do
        for lab in "${LABELS[@]}"; do
            one colocated-0.6b "$lab" "" qwen3-0.6b --scheme ipc --senders 4 --tp 4 --colocated
            one disagg-0.6b "$lab" "" qwen3-0.6b --scheme ipc --senders 2 --tp 2
            one disagg-0.6b-nccl "$lab" "" qwen3-0.6b --scheme nccl --senders 2 --tp 2
        done
    done
    for lab in "${LABELS[@]}"; do
        one colocated-0.6b-nocap "$lab" "WSYNC_IPC_BLOCKS_LOCAL=0 WSYNC_IPC_BLOCKS_PEER=0 WSYNC_IPC_PEER_PRIORITY=0" \
            qwen3-0.6b --scheme ipc --senders 4 --tp 4 --colocated
        one colocated-0.6b-debug "$lab" "WSYNC_LOG_LEVEL=debug" qwen3-0.6b --scheme ipc --senders 4 \
            --tp 4 --colocated
    done
    [ "${#LABELS[@]}" -ge 2 ] && one colocated-0.6b-nobells "${LABELS[1]}" "WSYNC_DOORBELL=0" \
        qwen3-0.6b --scheme ipc --senders 4 --tp 4 --colocated
else
    for r in $(seq 1 "$ROUNDS"); do
        for lab in "${LABELS[@]}"; do
            one colocated1-0.6b "$lab" "WSYNC_IPC_BLOCKS_LOCAL=1" qwen3-0.6b --scheme ipc \
                --senders 1 --tp 1 --colocated
        done
    done
    for lab in "${LABELS[@]}"; do
        one colocated1-0.6b-debug "$lab" "WSYNC_IPC_BLOCKS_LOCAL=1 WSYNC_LOG_LEVEL=debug" \
            qwen3-0.6b --scheme ipc --senders 1 --tp 1 --colocated
    done
fi
echo "--- median over rounds of each run's median (ms)"
python3 - "$OUT/ab.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
seen = []
for r in rows:
    k = (r["scenario"], r["build"])
    if k not in seen:
        seen.append(k)
for sc, b in seen:
    v = [r["result"]["seconds"] * 1e3 for r in rows
         if (r["scenario"], r["build"]) == (sc, b) and r["result"]]
    if v:
        print("%-26s %-5s %.3f  (%s)" % (sc, b, statistics.median(v), " ".join("%.3f" % x for x in v)))
PY
echo "--- stage timings of the debug runs, version 6 (sender: READY sent by, last RELEASE at)"
for f in "$OUT"/*debug*.err; do
    [ -e "$f" ] || continue
    echo "== $(basename "$f" .err)"
    grep -E 'version 6:' "$f" | sed 's/^wsync\[[0-9]*\] DEBUG: //' | head -n 16
done
