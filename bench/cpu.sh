#!/usr/bin/env bash
# wsync's CPU benchmarks, for anyone without a GPU (the CPU section of docs/benchmarks.md):
#
#   bash bench/cpu.sh [BUILD_DIR] [OUT_JSON]      (defaults: build, docs/bench/cpu.json)
#
# Each run is set against a baseline measured by wsync-bench in the same run, so the ratio
# means something even on a small, shared machine where absolute speeds do not:
#   ipc, host memory, 1 sender -> 2 receivers, 1 GiB: push vs one core's memcpy, with the
#     sender's weights shared (read in place) and private (staged through buckets);
#   ipc, qwen3-0.6b shape, FSDP-2 -> TP-2 on host memory: push vs the floor (the largest
#     receiver's bytes at one core's memcpy);
#   store over UCX and over libfabric, 1 GiB to 2 readers: fetch vs the same transport's raw
#     gets (loopback TCP here), interleaved round by round in one run.
# Every run is repeated $CPU_BENCH_REPS times (3): the report gives the median ratio and the
# range. Writes one JSON array (a meta object, then one object per run) to OUT_JSON; render it
# with `python3 bench/report.py`.
set -u
BUILD=${1:-build}
DEST=${2:-docs/bench/cpu.json}
REPS=${CPU_BENCH_REPS:-3}
BENCH=$BUILD/bin/wsync-bench
[ -x "$BENCH" ] || { echo "no $BENCH: build first (cmake -B build && cmake --build build -j2)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/wsync-cpu.XXXXXX)
: > "$WORK/runs.jsonl"
LOAD_BEFORE=$(cut -d ' ' -f 1 /proc/loadavg)   # the machine may be shared: say how busy it was

run() {   # NAME, then wsync-bench arguments
    local name=$1 rep rc line
    shift
    for ((rep = 1; rep <= REPS; rep++)); do
        timeout -k 5 300 "$BENCH" "$@" --timeout 280 --json > "$WORK/$name.$rep.log" 2>&1
        rc=$?
        line=$(grep '^{' "$WORK/$name.$rep.log" | tail -n 1)
        echo "$name #$rep: exit $rc $(cut -c 1-120 <<< "$line")" >&2
        python3 - "$name" "$rep" "$rc" "$*" "$line" >> "$WORK/runs.jsonl" <<'PY'
import json, sys
name, rep, rc, args, line = sys.argv[1:6]
print(json.dumps(dict(kind="cpu", run=name, rep=int(rep), rc=int(rc), args=args,
                      result=json.loads(line) if line else None)))
PY
    done
}

run ipc-shared --scheme ipc --mem host --receivers 2 --bytes 1G --source shared
run ipc-private --scheme ipc --mem host --receivers 2 --bytes 1G --source private
run ipc-model --scheme ipc --mem host --model-shape qwen3-0.6b --senders 2 --tp 2
# the store: 9 timed rounds, each a raw round then a store version (its ratio: the median of
# the rounds' paired ratios)
run store-ucx --scheme store --transport ucx --mem host --receivers 2 --bytes 1G --iters 9
run store-ofi --scheme store --transport ofi --mem host --receivers 2 --bytes 1G --iters 9

mkdir -p "$(dirname "$DEST")"
python3 - "$WORK/runs.jsonl" "$DEST" "$REPS" "$LOAD_BEFORE" <<'PY'
import json, os, platform, subprocess, sys, time
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
cpu = sh("lscpu | sed -n 's/^Model name: *//p'") or platform.processor()
mem = sh("free -g | awk '/^Mem:/ {print $2}'")
commit = sh("git rev-parse --short HEAD") or "unknown"
if commit != "unknown" and sh("git status --porcelain --untracked-files=no"):
    commit += "+changes"
load = os.getloadavg()[0]
meta = dict(kind="meta", machine="%d cores (%s), %s GiB, %s" % (os.cpu_count(), cpu, mem, platform.platform()),
            commit=commit, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), reps=int(sys.argv[3]),
            load_before=float(sys.argv[4]), load_after=round(load, 1))
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump([meta] + rows, open(sys.argv[2], "w"), indent=1)
print("wrote %s: %d runs" % (sys.argv[2], len(rows)), file=sys.stderr)
PY
tar -C "$WORK" -czf "$WORK.logs.tar.gz" . && echo "logs: $WORK.logs.tar.gz" >&2
