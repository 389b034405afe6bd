#!/usr/bin/env bash
# Every GPU test and benchmark of wsync, in one call on a lent GPU machine (DEVICE.md).
#
#   bash tests/gpu/run.sh [BUILD_DIR]
#
# BUILD_DIR (default build-gpu, or $WSYNC_GPU_BUILD) is a build made elsewhere with CUDA on and
# carried here; its tests/gpu/test_* programs are run. Logs and JSON go to $OUT (default
# /tmp/wsync-gpu-out): summary.txt, one <test>.json per test that writes one, gpus.txt, and
# logs.tar.gz with every log (few files: the device tool brings back at most 8). The summary table
# is printed last. Adapts to the GPUs nvidia-smi lists: the full run (tests and benchmarks) on GPU
# 0, the tests alone on each other GPU at the same time. Exit status: 0 when everything passed.
set -u

BUILD=${1:-${WSYNC_GPU_BUILD:-build-gpu}}
OUT=${OUT:-/tmp/wsync-gpu-out}
WORK=$(mktemp -d /tmp/wsync-gpu.XXXXXX)
mkdir -p "$OUT"

# NVLink multicast stays off on shared hosts (KINDS.md), in every process started from here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi -L > "$WORK/gpus.txt" 2>&1
nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv >> "$WORK/gpus.txt" 2>&1
NGPU=$(grep -c '^GPU ' "$WORK/gpus.txt")
cp "$WORK/gpus.txt" "$OUT/gpus.txt"
echo "== $NGPU GPU(s); build $BUILD"
cat "$WORK/gpus.txt"

# the CUDA runtime the build links, if the loader does not find it by itself
probe=$(ls "$BUILD"/tests/gpu/test_* 2>/dev/null | head -n 1)
if [ -n "$probe" ] && ldd "$probe" | grep -q 'libcudart.*not found'; then
    for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/lib \
             $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null \
               | sed 's|$|/cuda_runtime/lib|'); do
        if ls "$d"/libcudart.so.13* > /dev/null 2>&1; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "== libcudart from $d"
            break
        fi
    done
fi

declare -a NAMES RCS SECS
run_one() {   # name, timeout seconds, command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    NAMES+=("$name")
    RCS+=("$rc")
    SECS+=("$((SECONDS - t0))")
    return $rc
}

status_word() {
    case $1 in
        0) echo pass ;;
        77) echo skipped ;;
        124 | 137) echo TIMEOUT ;;
        *) echo "FAIL ($1)" ;;
    esac
}

tests=$(ls "$BUILD"/tests/gpu/test_* 2>/dev/null)
if [ -z "$tests" ]; then
    echo "no GPU test programs under $BUILD/tests/gpu: build with CUDA and carry the build" | tee "$OUT/summary.txt"
    exit 1
fi

# tests alone on the other GPUs, in the background, while GPU 0 runs everything
pids=()
for ((g = 1; g < NGPU; g++)); do
    for t in $tests; do
        n=$(basename "$t")
        (CUDA_VISIBLE_DEVICES=$g timeout 240 "$t" --no-bench > "$WORK/$n.gpu$g.log" 2>&1
         echo $? > "$WORK/$n.gpu$g.rc") &
        pids+=($!)
    done
done

for t in $tests; do
    n=$(basename "$t")
    CUDA_VISIBLE_DEVICES=0 run_one "$n" 240 "$t" --json "$WORK/$n.json"
    [ -f "$WORK/$n.json" ] && cp "$WORK/$n.json" "$OUT/$n.json"
done
for p in "${pids[@]}"; do wait "$p"; done
for ((g = 1; g < NGPU; g++)); do
    for t in $tests; do
        n=$(basename "$t")
        NAMES+=("$n (GPU $g, tests only)")
        RCS+=("$(cat "$WORK/$n.gpu$g.rc" 2>/dev/null || echo 1)")
        SECS+=("-")
    done
done

# summary: each program's result, each program's own tables (its stdout tail), then the totals
{
    echo "== wsync GPU run: $(head -n 1 "$WORK/gpus.txt") ($NGPU GPU(s))"
    for t in $tests; do
        n=$(basename "$t")
        echo
        echo "-- $n (GPU 0)"
        sed -n '/^case  *result/,$p' "$WORK/$n.log"
        grep -E 'CHECK failed|returned|differs' "$WORK/$n.log" | head -n 20
    done
    echo
    printf '%-40s %-12s %s\n' "program" "result" "seconds"
    fail=0
    for i in "${!NAMES[@]}"; do
        printf '%-40s %-12s %s\n' "${NAMES[$i]}" "$(status_word "${RCS[$i]}")" "${SECS[$i]}"
        [ "${RCS[$i]}" = 0 ] || fail=1
    done
    echo "overall: $([ $fail = 0 ] && echo PASS || echo FAIL)"
} > "$WORK/summary.txt"
cp "$WORK/summary.txt" "$OUT/summary.txt"
tar -C "$WORK" -czf "$OUT/logs.tar.gz" . 2>/dev/null
cat "$WORK/summary.txt"
grep -q '^overall: PASS' "$WORK/summary.txt"
