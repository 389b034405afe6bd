#!/usr/bin/env bash
# wsync against the peers' methods on a lent 4-GPU machine (nvidia-h200-x4), in one call of the
# device tool, whose hard limit is 600 s (issue 9):
#
#   bash bench/compare.sh BUILD_DIR        (e.g. gpu-carry, made by tests/gpu/pack.sh)
#
# Scenarios: fan-out 1 -> 3 TP-1 replicas, colocated FSDP-4 -> TP-4, disaggregated FSDP-2
# (GPUs 0, 1) -> TP-2 (GPUs 2, 3), and colocated with fp8-block targets; shapes qwen3-0.6b, -8b,
# -32b. wsync runs with --scheme auto, then with each other scheme valid there (nccl refuses
# colocated groups: recorded as n/a; a forced scheme that auto chose anyway is the same run, so
# it is recorded from auto's, as "derived", instead of run twice). The peers' methods (a), (b),
# (c) run in one launch of bench/baselines/suite.py. Then a fan-out sweep over 1, 2, 3 receivers.
#
# Most of a wsync-bench run is not the sync but making the weights and checking every byte on the
# CPU (qwen3-32b fan-out: ~80 s), so not everything fits: runs go in groups by priority, and a
# run that would overrun the budget ($WSYNC_COMPARE_BUDGET, 500 s, summary included) is skipped
# and listed as such. Groups, in order: core (qwen3-8b), baselines, small (qwen3-0.6b), large
# (qwen3-32b but its fan-out), sweep, large-fanout, refusal (nccl on a colocated group, to show
# its text). $WSYNC_COMPARE_SKIP names groups to leave out, e.g. a second call with
# WSYNC_COMPARE_SKIP="core baselines small sweep" runs what the first had to skip;
# bench/report.py merges both calls' results. The peers' points of the fan-out sweep go with the
# baselines group's launch, or with the sweep group in a call that skips the baselines group.
#
# Output in $OUT (the device tool brings back at most 8 files): results.json (one array: a meta
# object, then one object per run with its status and wsync-bench's or the baseline's JSON),
# summary.txt (the table printed last) and logs.tar.gz.
set -u

BUILD=$(cd "${1:?usage: bash bench/compare.sh BUILD_DIR}" && pwd) || exit 1
BENCH=$BUILD/bin/wsync-bench
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1   # the repository: bench/baselines, bench/report.py
OUT=${OUT:-/tmp/wsync-compare-out}
BUDGET=${WSYNC_COMPARE_BUDGET:-500}
RESERVE=15                      # the summary, the merge and the tarball
ITERS=${WSYNC_COMPARE_ITERS:-5}
WARMUP=1
BASE_ITERS=${WSYNC_COMPARE_BASE_ITERS:-3}
SKIP=" ${WSYNC_COMPARE_SKIP:-} "
T0=$SECONDS
WORK=$(mktemp -d /tmp/wsync-compare.XXXXXX)
LOGS=$WORK/logs
RESULTS=$WORK/results.jsonl
mkdir -p "$OUT" "$LOGS"
: > "$RESULTS"

# NVLink multicast stays off on the lent machines (KINDS.md), in every process started here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

say() { printf '[%3d s] %s\n' "$((SECONDS - T0))" "$*"; }
left() { echo $((BUDGET - RESERVE - (SECONDS - T0))); }
wanted() { [[ $SKIP != *" $1 "* ]]; }

# record KIND GROUP SCENARIO SHAPE REPLICAS METHOD STATUS NOTE WALL_S [JSON]: one line of results
record() {
    python3 - "$@" >> "$RESULTS" <<'PY'
import json, sys
kind, group, scenario, shape, replicas, method, status, note, wall = sys.argv[1:10]
try:
    result = json.loads(sys.argv[10]) if len(sys.argv) > 10 and sys.argv[10] else None
except ValueError:
    result = None
print(json.dumps(dict(kind=kind, group=group, scenario=scenario, model_shape=shape,
                      replicas=int(replicas), method=method, status=status, note=note,
                      wall_s=float(wall), result=result)))
PY
}

if [ ! -x "$BENCH" ]; then
    echo "no $BENCH: pass the carried build folder (tests/gpu/pack.sh makes gpu-carry)" | tee "$OUT/summary.txt"
    exit 1
fi
# the CUDA runtime the build links, where the loader does not find it by itself
if ldd "$BENCH" 2>/dev/null | grep -q 'libcudart.*not found'; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13.0/lib64; do
        [ -e "$d/libcudart.so.13" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
    done
fi

# ---- the machine, for the report
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
LINK=$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | sort -u | head -n 1)
CPU=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
COMMIT=${WSYNC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "$COMMIT" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    COMMIT="$COMMIT+changes"
fi
MACHINE="${NGPU}x ${GPU:-no GPU}${LINK:+, NVLink $LINK}; $(nproc) CPU cores ($CPU)"
say "$MACHINE; commit $COMMIT; budget $BUDGET s"
if [ "$NGPU" -lt 4 ]; then
    echo "compare.sh needs 4 GPUs (nvidia-h200-x4); this machine has $NGPU" | tee "$OUT/summary.txt"
    exit 1
fi

# ---- wsync-bench runs
# wsync-bench's arguments for a scenario, into SARGS
scenario_args() {   # SCENARIO REPLICAS
    case $1 in
        fanout) SARGS=(--senders 1 --tp 1 --replicas "$2") ;;
        colocated) SARGS=(--senders 4 --tp 4 --colocated) ;;
        disaggregated) SARGS=(--senders 2 --tp 2) ;;
        colocated-fp8) SARGS=(--senders 4 --tp 4 --colocated --quant fp8-block) ;;
    esac
}

# Seconds a run takes on 4x H200 (tests/gpu/run.sh's qwen3-8b runs, scaled by the bytes each
# process makes or checks): ~6 s of start-up and link probe, plus the CPU making the senders'
# shards (~3.7 GB/s) and each receiver checking its bytes (~1.2 GB/s). bf16 GB of each shape.
estimate() {   # SCENARIO SHAPE
    local gb
    case $2 in qwen3-0.6b) gb=2 ;; qwen3-8b) gb=17 ;; qwen3-32b) gb=66 ;; *) gb=1 ;; esac
    case $1 in
        fanout) echo $((6 + gb * 11 / 10)) ;;            # whole model per process
        disaggregated) echo $((6 + gb * 55 / 100)) ;;    # half
        *) echo $((7 + gb * 3 / 10)) ;;                  # colocated: a quarter, 8 processes
    esac
}

CHOSEN=""   # the scheme the last run used
bench() {   # GROUP SCENARIO SHAPE REPLICAS SCHEME
    local grp=$1 sc=$2 shape=$3 rep=$4 scheme=$5
    local name="wsync-$scheme-$sc-$shape-r$rep" est limit room
    est=$(estimate "$sc" "$shape")
    room=$(left)
    CHOSEN=""
    if [ "$room" -lt "$est" ]; then
        say "skipped $name: needs ~$est s, $room s of the budget left"
        record wsync "$grp" "$sc" "$shape" "$rep" "wsync-$scheme" skipped \
            "time budget: needs ~$est s, $room s left" 0
        return
    fi
    limit=$((2 * est + 30))
    [ "$limit" -gt "$room" ] && limit=$room
    scenario_args "$sc" "$rep"
    say "$name (~$est s, limit $limit s)"
    local t=$SECONDS
    timeout -k 5 "$limit" "$BENCH" --model-shape "$shape" --mem cuda --scheme "$scheme" "${SARGS[@]}" \
        --iters "$ITERS" --warmup "$WARMUP" --timeout "$((limit > 10 ? limit - 5 : limit))" --json \
        > "$LOGS/$name.log" 2>&1
    local rc=$? line status note=""
    line=$(grep '^{' "$LOGS/$name.log" | tail -n 1)
    case $rc in
        0) status=ok ;;
        124 | 137) status=timeout note="killed after $limit s" ;;
        *) status=failed
           # the nccl scheme's refusal of a shared GPU, else the first error line
           note=$(grep -m 1 'allows one rank per GPU' "$LOGS/$name.log" ||
                  grep -m 1 -E 'WRONG|failed|error|Error|killed' "$LOGS/$name.log")
           note=${note:0:300}
           [ "$grp" = refusal ] && [[ $note == *"allows one rank per GPU"* ]] && status=refused ;;
    esac
    CHOSEN=$(sed -n 's/.*"scheme":"\([a-z_]*\)".*/\1/p' <<< "$line")
    record wsync "$grp" "$sc" "$shape" "$rep" "wsync-$scheme" "$status" "$note" "$((SECONDS - t))" "$line"
    say "  $status in $((SECONDS - t)) s$([ -n "$line" ] && python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print(": %.2f ms, %.2fx floor, scheme %s%s" % (j["seconds"] * 1e3, j["ratio_floor"], j["scheme"],
      "" if j["correct"] else ", WRONG BYTES"))' "$line")"
}

# auto, then each other scheme valid for the scenario; one auto already made is not redone
scenario() {   # GROUP SCENARIO SHAPE
    local grp=$1 sc=$2 shape=$3 rep=1 auto_line s
    [ "$sc" = fanout ] && rep=3
    bench "$grp" "$sc" "$shape" "$rep" auto
    local chosen=$CHOSEN
    auto_line=$(tail -n 1 "$RESULTS")
    for s in ipc nccl; do
        if [ "$s" = nccl ] && [[ $sc == colocated* ]]; then
            record wsync "$grp" "$sc" "$shape" "$rep" wsync-nccl n/a \
                "NCCL allows one rank per GPU: the nccl scheme refuses colocated groups" 0
        elif [ "$s" = "$chosen" ] && grep -q '"status": "ok"' <<< "$auto_line"; then
            python3 -c '
import json, sys
r = json.loads(sys.argv[1])
r.update(method="wsync-" + sys.argv[2], status="derived", note="the --scheme auto run, which chose " + sys.argv[2])
print(json.dumps(r))' "$auto_line" "$s" >> "$RESULTS"
        else
            bench "$grp" "$sc" "$shape" "$rep" "$s"
        fi
    done
}

# ---- the peers' methods: one launch of suite.py for every run of the groups wanted
SWEEP_BASELINES="a:fanout:qwen3-8b:1,a:fanout:qwen3-8b:2,c:fanout:qwen3-8b:1,c:fanout:qwen3-8b:2"
baselines() {   # [RUNS]: those runs alone (the sweep's, in a call that skips the baselines group)
    local runs="${1:-}" s sc
    if [ -z "$runs" ]; then
        for s in qwen3-8b qwen3-0.6b qwen3-32b; do
            case $s in qwen3-8b) wanted core || continue ;; qwen3-0.6b) wanted small || continue ;;
                       qwen3-32b) wanted large || wanted large-fanout || continue ;; esac
            for sc in colocated fanout disaggregated; do runs="$runs,a:$sc:$s"; done
            runs="$runs,b:colocated:$s"
            for sc in fanout disaggregated colocated; do runs="$runs,c:$sc:$s"; done
        done
        wanted sweep && runs="$runs,$SWEEP_BASELINES"
        runs="${runs#,},c:fanout:4G"
    fi
    local n est room limit t
    n=$(tr ',' '\n' <<< "$runs" | wc -l)
    est=$((25 + 3 * n))     # start-up, then a few seconds a run (the biggest: qwen3-32b (a), ~6 s)
    room=$(left)
    if [ "$room" -lt 40 ]; then
        say "skipped the baselines: $room s of the budget left"
        record baseline baselines - - 0 baselines skipped "time budget: $room s left" 0
        return
    fi
    limit=$((2 * est)); [ "$limit" -gt "$room" ] && limit=$room
    say "baselines: $n runs in one launch (~$est s, limit $limit s; runs that do not finish are listed as missing)"
    t=$SECONDS
    timeout -k 10 "$limit" python3 -m torch.distributed.run --standalone --nproc-per-node 4 \
        bench/baselines/suite.py --runs "$runs" --iters "$BASE_ITERS" --warmup 1 \
        --json-out "$WORK/baselines.jsonl" > "$LOGS/baselines.log" 2>&1
    local rc=$?
    say "  baselines ended (exit $rc) in $((SECONDS - t)) s"
    # one record per run asked for: its JSON line, or why there is none
    python3 - "$runs" "$WORK/baselines.jsonl" "$rc" "$((SECONDS - t))" >> "$RESULTS" <<'PY'
import json, os, sys
runs, path, rc, wall = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
got = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
for i, spec in enumerate(runs):
    f = spec.split(":")
    r = got[i] if i < len(got) else None   # suite.py writes them in the order asked
    status = "ok" if r and r.get("verified") is not False else "failed" if r else \
        ("timeout" if rc in (124, 137) else "failed")
    note = "" if r else "no result: the launch %s before this run ended" % (
        "was stopped at its time limit" if rc in (124, 137) else "failed (exit %d)" % rc)
    if r and r.get("verified") is False:
        note = "loaded tensors differ from their source"
    buffer = f[2] if f[2][:1].isdigit() else None   # c:fanout:4G, a buffer and not a model
    print(json.dumps(dict(kind="baseline", group="baselines", scenario=f[1],
                          model_shape=None if buffer else f[2], buffer=buffer,
                          replicas=int(f[3]) if len(f) > 3 else (3 if f[1] == "fanout" else 1),
                          method=f[0], status=status, note=note, wall_s=wall if i == 0 else 0.0,
                          result=r)))
PY
    tail -n 3 "$LOGS/baselines.log" | sed 's/^/    /'
}

# ---- the runs, by priority
SCENARIOS="fanout colocated disaggregated colocated-fp8"
if wanted core; then for sc in $SCENARIOS; do scenario core "$sc" qwen3-8b; done; fi
if wanted baselines; then baselines; fi
if wanted small; then for sc in $SCENARIOS; do scenario small "$sc" qwen3-0.6b; done; fi
if wanted large; then for sc in colocated colocated-fp8 disaggregated; do scenario large "$sc" qwen3-32b; done; fi
if wanted sweep; then
    for r in 1 2; do for s in nccl ipc; do bench sweep fanout qwen3-8b "$r" "$s"; done; done
    # the peers' points of the sweep come with the baselines group; a call that skips that group
    # runs them here, so a split over calls never leaves the sweep's chart without them
    wanted baselines || baselines "$SWEEP_BASELINES"
fi
if wanted large-fanout; then scenario large-fanout fanout qwen3-32b; fi
if wanted refusal; then
    # its text, on the smallest shape: the refusal comes once the group is formed
    bench refusal colocated tiny 1 nccl
fi

# ---- results.json: the meta object first, then every run; the summary; the logs
python3 - "$RESULTS" "$OUT/results.json" "$MACHINE" "$NGPU" "$COMMIT" "$BUDGET" "$((SECONDS - T0))" \
    "$ITERS" "$WARMUP" "$BASE_ITERS" "${WSYNC_COMPARE_SKIP:-}" <<'PY'
import json, sys, time
a = sys.argv
rows = [json.loads(l) for l in open(a[1]) if l.strip()]
meta = dict(kind="meta", machine=a[3], gpus=int(a[4]), commit=a[5],
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), budget_s=int(a[6]),
            elapsed_s=int(a[7]), iters=int(a[8]), warmup=int(a[9]), baseline_iters=int(a[10]),
            skipped_groups=a[11], nccl_nvls_enable="0")
json.dump([meta] + rows, open(a[2], "w"), indent=1)
PY
python3 bench/report.py --summary "$OUT/results.json" > "$OUT/summary.txt" 2>&1 ||
    echo "report.py --summary failed; results.json has everything" >> "$OUT/summary.txt"
echo "compare.sh: $((SECONDS - T0)) s of $BUDGET s budgeted" >> "$OUT/summary.txt"
tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs
cat "$OUT/summary.txt"
