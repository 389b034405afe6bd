#!/bin/sh
# Run the PyTorch baselines (a), (b), (c) on a lent 4-GPU machine, every scenario and shape, in
# one torch.distributed.run launch (suite.py: a launch costs 10-20 s). Writes under
# ${OUT:-./baselines-out}: baselines/runs.jsonl (one JSON line per run) and baselines/suite.log,
# baselines.json (the same runs as one array) and baselines-logs.tar.gz. Not run by CI.
#
#   bench/baselines/run.sh [SHAPE ...]      (default: qwen3-0.6b qwen3-8b qwen3-32b)
#
# Arguments that are not model shapes are ignored (tests/gpu/run.sh passes its build folder).
# Environment: ITERS (5), WARMUP (1), PYTHON (python3), NCCL_NVLS_ENABLE (0), and
# BASELINES_LIMIT (seconds for the whole launch, 600).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-./baselines-out}/baselines
mkdir -p "$out"
py=${PYTHON:-python3}
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
shapes=
for a in "$@"; do
    case $a in
        tiny | qwen3-0.6b | qwen3-8b | qwen3-32b) shapes="$shapes $a" ;;
        *) echo "baselines: '$a' is not a model shape: ignored" >&2 ;;
    esac
done
shapes=${shapes:-qwen3-0.6b qwen3-8b qwen3-32b}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -lt 4 ]; then
    echo "baselines: $ngpu GPU(s); the scenarios need 4: skipped" >&2
    exit 77
fi

runs=c:fanout:4G
for s in $shapes; do
    runs="$runs,a:colocated:$s,a:fanout:$s,a:disaggregated:$s,b:colocated:$s"
    runs="$runs,c:fanout:$s,c:disaggregated:$s"
done
echo "== baselines: $runs" >&2
: >"$out/runs.jsonl"
timeout -k 10 "${BASELINES_LIMIT:-600}" "$py" -m torch.distributed.run --standalone --nproc-per-node 4 \
    "$here/suite.py" --runs "$runs" --iters "${ITERS:-5}" --warmup "${WARMUP:-1}" \
    --json-out "$out/runs.jsonl" >"$out/suite.log" 2>&1
rc=$?
[ $rc -ne 0 ] && { echo "   FAILED (exit $rc): tail of $out/suite.log:" >&2; tail -n 15 "$out/suite.log" >&2; }

# one array for the report and the plots; the logs in a tarball (a lent machine gives back at
# most 8 files)
"$py" - "$out/runs.jsonl" >"$out/../baselines.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(rows, sys.stdout, indent=1)
print("\n%-34s %10s %10s %12s" % ("run", "seconds", "GB/s", "GB/s model"), file=sys.stderr)
for r in rows:
    print("%-34s %10.4f %10.1f %12.1f" % (r["run"], r["seconds"], r["gbps_per_receiver"],
          r["gbps_model"]), file=sys.stderr)
PY
tar -C "$out/.." -czf "$out/../baselines-logs.tar.gz" "$(basename "$out")"
exit $rc
