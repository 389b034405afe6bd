#!/bin/sh
# Run the PyTorch baselines (a), (b), (c) on a lent 4-GPU machine, writing one JSON file per run
# (and a log) under ${OUT:-./baselines-out}/baselines/, all of them in one array in
# baselines.json beside it, and baselines-logs.tar.gz. Not run by CI.
#
#   bench/baselines/run.sh [SHAPE ...]      (default: qwen3-0.6b qwen3-8b qwen3-32b)
#
# Environment: ITERS (5), WARMUP (1), PYTHON (python3), NCCL_NVLS_ENABLE (0).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-./baselines-out}/baselines
mkdir -p "$out"
py=${PYTHON:-python3}
iters=${ITERS:-5}
warmup=${WARMUP:-1}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
shapes=${*:-qwen3-0.6b qwen3-8b qwen3-32b}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -lt 4 ]; then
    echo "baselines: $ngpu GPU(s); the scenarios need 4: skipped" >&2
    exit 77
fi
fail=0

run() {  # name, script, args...
    name=$1
    script=$2
    shift 2
    echo "== $name" >&2
    if $py -m torch.distributed.run --standalone --nproc-per-node 4 "$here/$script" \
        --iters "$iters" --warmup "$warmup" --json-out "$out/$name.json" "$@" \
        >"$out/$name.log" 2>&1; then
        tail -n 1 "$out/$name.log" >&2
    else
        echo "   FAILED (exit $?): tail of $out/$name.log:" >&2
        tail -n 15 "$out/$name.log" >&2
        fail=1
    fi
}

run c-bcast-4g c_nccl_broadcast.py --scenario fanout --bytes 4G
for s in $shapes; do
    run "a-$s-colocated" a_nccl_per_tensor.py --model-shape "$s" --scenario colocated
    run "a-$s-fanout" a_nccl_per_tensor.py --model-shape "$s" --scenario fanout
    run "a-$s-disaggregated" a_nccl_per_tensor.py --model-shape "$s" --scenario disaggregated
    run "b-$s-colocated" b_ipc_bucket.py --model-shape "$s" --scenario colocated
    run "c-$s-fanout" c_nccl_broadcast.py --model-shape "$s" --scenario fanout --model-bytes
    run "c-$s-disaggregated" c_nccl_broadcast.py --model-shape "$s" --scenario disaggregated --model-bytes
done

# every result in one file (a JSON array), for the report and the plots; the logs in a tarball
# (what comes back from a lent machine is at most 8 files)
$py - "$out" >"$out/../baselines.json" <<'PY'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f))
    r["run"] = os.path.basename(f)[:-5]
    rows.append(r)
json.dump(rows, sys.stdout, indent=1)
PY
tar -C "$out/.." -czf "$out/../baselines-logs.tar.gz" "$(basename "$out")"

printf '\n%-34s %10s %10s %12s\n' run seconds GB/s "GB/s model" >&2
for f in "$out"/*.json; do
    [ -e "$f" ] || continue
    $py - "$f" <<'PY' >&2
import json, os, sys
r = json.load(open(sys.argv[1]))
print("%-34s %10.4f %10.1f %12.1f" % (os.path.basename(sys.argv[1])[:-5], r["seconds"],
      r["gbps_per_receiver"], r["gbps_model"]))
PY
done
exit $fail
