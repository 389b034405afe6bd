#!/usr/bin/env bash
# Runs the example trainer and inference workers on this machine: SENDERS trainer ranks
# (examples/c/trainer) push VERSIONS versions to RECEIVERS workers (examples/c/worker, TP size
# TP), which check every element they receive. The coordinator listens on 127.0.0.1, on a port
# the first trainer picks (a free one) and writes to a file the others read.
#
#   examples/run_pair.sh BIN_DIR [WORKER_BIN_DIR]
#
# BIN_DIR holds trainer and worker, as examples/c/CMakeLists.txt builds them (WORKER_BIN_DIR:
# take the workers from another build, e.g. one linked statically). Variables:
#   SENDERS (2), RECEIVERS (2), TP (2), VERSIONS (3), CONFIG (a config.json; default the
#   programs' small built-in shape), TIMEOUT (seconds per process, 120),
#   PY_RECEIVERS (0): the last PY_RECEIVERS receivers run examples/python/receiver.py --check
#     instead of the C worker (needs PYTHON, default python3, to import wsync: PYTHONPATH and
#     WSYNC_LIBRARY as its docstring says),
#   SKEW (0): the trainers write version v + SKEW's weights as v (a worker must say WRONG),
#   PY_PAIR (auto): also run examples/python/trainer.py (torchrun, SENDERS ranks) into
#     receiver.py; auto runs it when torch, transformers and torchrun are there, 0 never.
# Every process's output is printed with its name; the exit status is 0 only if all succeeded.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${1:?usage: run_pair.sh BIN_DIR [WORKER_BIN_DIR]}
wbin=${2:-$bin}
SENDERS=${SENDERS:-2} RECEIVERS=${RECEIVERS:-2} TP=${TP:-2} VERSIONS=${VERSIONS:-3}
TIMEOUT=${TIMEOUT:-120} PY_RECEIVERS=${PY_RECEIVERS:-0} SKEW=${SKEW:-0} PY_PAIR=${PY_PAIR:-auto}
PYTHON=${PYTHON:-python3}
cfg=()
[ -n "${CONFIG:-}" ] && cfg=(--config "$CONFIG")

work=$(mktemp -d)
pids=()
cleanup() {   # on any exit: stop what is still running (only the processes started here)
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT

# start NAME COMMAND...: runs it in the background, its output in $work/NAME.log
start() {
    local name=$1; shift
    timeout "$TIMEOUT" "$@" >"$work/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}
# finish: waits for every process started; prints each one's output; 0 if all exited 0
finish() {
    local rc=0 i
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            echo "run_pair: ${names[$i]} failed" >&2
            rc=1
        fi
    done
    for i in "${!names[@]}"; do sed "s/^/[${names[$i]}] /" "$work/${names[$i]}.log"; done
    pids=() names=()
    return $rc
}

# --- the C trainer into C workers (and Python receivers) -------------------------------------
names=()
start trainer0 "$bin/trainer" --coordinator 127.0.0.1:0 --rank 0 --senders "$SENDERS" \
    --receivers "$RECEIVERS" --versions "$VERSIONS" --skew "$SKEW" \
    --address-file "$work/address" "${cfg[@]}"
for _ in $(seq 100); do   # up to 10 s, unless trainer 0 is gone
    { [ -s "$work/address" ] || ! kill -0 "${pids[0]}" 2>/dev/null; } && break
    sleep 0.1
done
if [ ! -s "$work/address" ]; then
    echo "run_pair: trainer 0 wrote no coordinator address" >&2
    finish
    exit 1
fi
addr=$(cat "$work/address")
echo "run_pair: coordinator on $addr: $SENDERS trainers, $RECEIVERS receivers (TP $TP)"
for ((i = 1; i < SENDERS; i++)); do
    start "trainer$i" "$bin/trainer" --coordinator "$addr" --rank "$i" --senders "$SENDERS" \
        --receivers "$RECEIVERS" --versions "$VERSIONS" --skew "$SKEW" "${cfg[@]}"
done
for ((r = 0; r < RECEIVERS; r++)); do
    if ((r >= RECEIVERS - PY_RECEIVERS)); then
        start "pyreceiver$r" "$PYTHON" "$here/python/receiver.py" --check --coordinator "$addr" \
            --rank "$r" --receivers "$RECEIVERS" --tp "$TP" --versions "$VERSIONS" "${cfg[@]}"
    else
        start "worker$r" "$wbin/worker" --coordinator "$addr" --rank "$r" \
            --receivers "$RECEIVERS" --tp "$TP" --versions "$VERSIONS" "${cfg[@]}"
    fi
done
finish || exit 1

# --- the Python FSDP2 trainer into Python receivers, where PyTorch is ----------------------
if [ "$PY_PAIR" = 0 ]; then exit 0; fi
if ! command -v torchrun >/dev/null ||
   ! "$PYTHON" -c 'import torch, transformers, wsync; from torch.distributed.fsdp import fully_shard' 2>/dev/null; then
    echo "run_pair: Python pair skipped (needs torch 2.6+, transformers, wsync and torchrun)"
    exit 0
fi
# the C programs' built-in shape as an HF config (receiver.py's BUILTIN_CONFIG), unless CONFIG
pycfg=${CONFIG:-$work/model/config.json}
if [ -z "${CONFIG:-}" ]; then
    mkdir -p "$work/model"
    PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -c 'import json, sys; sys.path.insert(0, sys.argv[1]); import receiver
c = dict(receiver.BUILTIN_CONFIG, architectures=["Qwen3ForCausalLM"])
json.dump(c, open(sys.argv[2], "w"))' "$here/python" "$pycfg" || exit 1
fi
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "run_pair: Python pair on 127.0.0.1:$port"
start pytrainer torchrun --standalone --nproc-per-node "$SENDERS" "$here/python/trainer.py" \
    --config "$pycfg" --coordinator "127.0.0.1:$port" --receivers "$RECEIVERS" --steps "$VERSIONS"
for ((r = 0; r < RECEIVERS; r++)); do
    start "pyreceiver$r" "$PYTHON" "$here/python/receiver.py" --coordinator "127.0.0.1:$port" \
        --rank "$r" --receivers "$RECEIVERS" --tp "$TP" --versions "$VERSIONS" --config "$pycfg"
done
finish
