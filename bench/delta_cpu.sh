#!/usr/bin/env bash
# Delta versions on host memory (issue 17.4), for the "Delta versions" section of
# docs/benchmarks.md:
#
#   bash bench/delta_cpu.sh [BUILD_DIR] [OUT_JSONL]     (defaults: build, docs/bench/delta-host.jsonl)
#
# wsync-bench --delta at each learning rate of $DELTA_LRS (1e-6 1e-5 1e-4) over ipc, and the
# store over UCX and over libfabric (loopback TCP here), FSDP-1 -> TP-1 of $DELTA_SHAPE
# (qwen3-0.6b: the Qwen3-8B shape's 16 GB of bf16 weights, with fp32 masters on both sides, do
# not fit a small machine; wsync-bench refuses what does not fit, naming the bytes). Each run
# pushes the same versions with delta on and then off ($DELTA_ITERS timed after one warm-up) and
# checks every version on the receiver. Writes one JSON line per run ({"run", "rc", "args",
# "result"}) after a meta line (machine, date, commit, load average before and after); render it
# with `python3 bench/report.py`.
set -u
BUILD=${1:-build}
DEST=${2:-docs/bench/delta-host.jsonl}
SHAPE=${DELTA_SHAPE:-qwen3-0.6b}
LRS=${DELTA_LRS:-1e-6 1e-5 1e-4}
ITERS=${DELTA_ITERS:-3}
RUNS=${DELTA_RUNS:-ipc store-ucx store-ofi}
BENCH=$BUILD/bin/wsync-bench
[ -x "$BENCH" ] || { echo "no $BENCH: build first (cmake -B build && cmake --build build -j2)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/wsync-delta.XXXXXX)
: > "$WORK/runs.jsonl"
LOAD_BEFORE=$(cut -d ' ' -f 1 /proc/loadavg)   # the machine may be shared: say how busy it was

for run in $RUNS; do
    case $run in
        ipc) args=(--scheme ipc) ;;
        store-ucx) args=(--scheme store --transport ucx) ;;
        store-ofi) args=(--scheme store --transport ofi) ;;
        *) echo "unknown run $run (ipc, store-ucx, store-ofi)" >&2; exit 1 ;;
    esac
    for lr in $LRS; do
        name="$run $lr"
        timeout -k 5 1800 "$BENCH" --model-shape "$SHAPE" --mem host "${args[@]}" --delta \
            --lr "$lr" --iters "$ITERS" --warmup 1 --timeout 1750 --json > "$WORK/$run.$lr.log" 2>&1
        rc=$?
        line=$(grep '^{' "$WORK/$run.$lr.log" | tail -n 1)
        echo "$name: exit $rc $(cut -c 1-160 <<< "$line")" >&2
        [ $rc = 0 ] || tail -n 5 "$WORK/$run.$lr.log" >&2
        python3 - "$name" "$rc" "${args[*]} --lr $lr" "$line" >> "$WORK/runs.jsonl" <<'PY'
import json, sys
name, rc, args, line = sys.argv[1:5]
print(json.dumps(dict(run=name, rc=int(rc), args=args, result=json.loads(line) if line else None)))
PY
    done
done

python3 - "$LOAD_BEFORE" "$(cut -d ' ' -f 1 /proc/loadavg)" "$SHAPE" "$ITERS" > "$WORK/meta.json" <<'PY'
import json, os, platform, subprocess, sys, time
cpu = "?"
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"):
        cpu = l.split(":", 1)[1].strip()
        break
mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "core", "schemes", "bench",
                       "transports", "reshard"]).returncode != 0:
        commit += "+uncommitted"
except OSError:
    commit = "?"
print(json.dumps(dict(kind="meta", machine="%d cores (%s), %.0f GiB, %s" % (
    os.cpu_count(), cpu, mem, platform.platform()), date=time.strftime("%Y-%m-%d %H:%M UTC",
    time.gmtime()), commit=commit, load_before=sys.argv[1], load_after=sys.argv[2],
    note="%s FSDP-1 -> TP-1, %s timed versions after 1 warm-up, each mode." % (sys.argv[3],
                                                                             sys.argv[4]))))
PY
mkdir -p "$(dirname "$DEST")"
cat "$WORK/meta.json" "$WORK/runs.jsonl" > "$DEST"
echo "wrote $DEST (logs in $WORK)" >&2
