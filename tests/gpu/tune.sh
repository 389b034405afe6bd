#!/usr/bin/env bash
# Sweep the knobs that decide how copies share a GPU, on a lent 4-GPU machine (colocated1 and
# colocated1-fp8: one GPU), to choose (and re-check) their defaults: for each setting one wsync-bench run of the issue's scenarios
# (Qwen3-8B shape by default), every result byte-checked by wsync-bench itself.
#
#   bash tests/gpu/tune.sh BUILD [SCENARIO ...]     (scenarios: colocated fp8 disagg-ipc disagg-nccl
#                                                      colocated1 colocated1-fp8 colocated2 streams4
#                                                      target4 sweep4 fp8caps4 fp8wire4 sender1 alloc4
#                                                      coloc1ab alone1 final4 moe4ab)
#
# Knobs (see schemes/ipc_cuda_rx.c, sender_stream): WSYNC_IPC_BLOCKS_LOCAL / WSYNC_IPC_BLOCKS_PEER
# (blocks per SM of a sender's batch kernels when it is on our GPU / another one; 0: no cap) and
# WSYNC_IPC_PEER_PRIORITY; for nccl, NCCL's own P2P channel and chunk settings.
# $TUNE_LIMIT: seconds a run may take (default 90).
# Writes $OUT/tune.jsonl (one line per run: the setting and wsync-bench's JSON), each run's stderr
# under $OUT/logs/, and prints one line per run.
set -uo pipefail
BUILD=${1:?usage: tune.sh BUILD [SCENARIO ...]}
shift
SCEN=${*:-colocated fp8 disagg-ipc disagg-nccl}
SHAPE=${WSYNC_BENCH_SHAPE:-qwen3-8b}
OUT=${OUT:-/tmp/wsync-tune}
mkdir -p "$OUT/logs"
export NCCL_NVLS_ENABLE=0
: > "$OUT/tune.jsonl"

one() {   # label, env assignments (space separated, may be empty), then wsync-bench arguments
    local label=$1 envs=$2
    shift 2
    local line
    line=$(env $envs timeout -k 5 "${TUNE_LIMIT:-90}" "$BUILD/bin/wsync-bench" --model-shape "$SHAPE" --mem cuda \
        --iters 5 --warmup 1 --timeout 60 --json "$@" 2> "$OUT/logs/$label.err" | grep '^{' | tail -n 1)
    [ -n "$line" ] || line=null
    echo "{\"label\": \"$label\", \"env\": \"$envs\", \"result\": $line}" >> "$OUT/tune.jsonl"
    echo "$label: $(echo "$line" | python3 -c 'import json,sys
r = json.load(sys.stdin)
print("failed" if not r else "%.3f ms  x floor %.3f  correct %s" % (r["seconds"] * 1e3, r.get("ratio_floor", 0), r.get("correct")))')"
}

one_gpu_tail() {   # one GPU, each "label:env" setting once: FSDP-2 -> TP-2 bf16 (two receivers
    # on the GPU) and FSDP-1 -> TP-1 fp8-block (quantized in place); $s: the scenario
    local set
    for set in "$@"; do
        one "$s-g2-${set%%:*}" "${set#*:}" --scheme ipc --senders 2 --tp 2 --colocated
        one "$s-g1-fp8-${set%%:*}" "${set#*:}" --scheme ipc --senders 1 --tp 1 --colocated \
            --quant fp8-block
    done
}

for s in $SCEN; do
    case $s in
    fp8)   # the defaults, the second run with the stage timings in its log
        one fp8-default "" --scheme ipc --senders 4 --tp 4 --colocated --quant fp8-block
        one fp8-debug "WSYNC_LOG_LEVEL=debug" --scheme ipc --senders 4 --tp 4 --colocated \
            --quant fp8-block
        ;;
    colocated)
        for set in "0 0 0" "2 1 1" "1 1 1" "1 2 1" "0.5 1 1" "2 2 1" "3 3 0" "1 0.5 1"; do
            read -r l p pr <<< "$set"
            one "$s-L$l-P$p-pri$pr" "WSYNC_IPC_BLOCKS_LOCAL=$l WSYNC_IPC_BLOCKS_PEER=$p WSYNC_IPC_PEER_PRIORITY=$pr" \
                --scheme ipc --senders 4 --tp 4 --colocated
        done
        one colocated-debug "WSYNC_LOG_LEVEL=debug" --scheme ipc --senders 4 --tp 4 --colocated
        ;;
    colocated1|colocated1-fp8)   # one GPU: FSDP-1 -> TP-1 and FSDP-2 -> TP-2, local blocks per SM
        q=""
        [ "$s" = colocated1-fp8 ] && q="--quant fp8-block"
        for g in 1 2; do
            for l in 1 2 4 0; do
                one "$s-g$g-L$l" "WSYNC_IPC_BLOCKS_LOCAL=$l" --scheme ipc --senders $g --tp $g \
                    --colocated $q
            done
        done
        ;;
    streams4)   # 4 GPUs: a second stream for peer senders too, beside the peer caps; bf16, then
        # FP8 block quantized in place by the receivers (--fp8-wire off; peers' runs on a
        # fraction of the grid);
        # rounds alternate so the machine's drift falls on every setting alike
        for round in 1 2; do
            for set in "default:" "S2:WSYNC_IPC_STREAMS=2" "S2-P2:WSYNC_IPC_STREAMS=2 WSYNC_IPC_BLOCKS_PEER=2" \
                       "P2:WSYNC_IPC_BLOCKS_PEER=2" "S2-P0.5:WSYNC_IPC_STREAMS=2 WSYNC_IPC_BLOCKS_PEER=0.5"; do
                one "$s-bf16-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 --colocated
            done
            for set in "default:" "S2:WSYNC_IPC_STREAMS=2" "S2-Q1:WSYNC_IPC_STREAMS=2 WSYNC_IPC_QUANT_BLOCKS_PEER=1" \
                       "Q1:WSYNC_IPC_QUANT_BLOCKS_PEER=1" "S2-Q0.25:WSYNC_IPC_STREAMS=2 WSYNC_IPC_QUANT_BLOCKS_PEER=0.25"; do
                one "$s-fp8-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 --colocated \
                    --quant fp8-block --fp8-wire off
            done
        done
        ;;
    target4)   # 4 GPUs: issue 18's colocated targets with the defaults only, FSDP-4 -> TP-4 bf16
        # and FP8 block, 3 rounds alternating (x floor <= 1.15; fp8 / bf16 <= 1.0)
        for round in 1 2 3; do
            one "$s-bf16-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated
            one "$s-fp8-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated --quant fp8-block
        done
        ;;
    sweep4)   # 4 GPUs, FSDP-4 -> TP-4 colocated: the caps around the defaults (two streams a
        # sender, peer reads told apart), bf16 in 2 rounds alternating, fp8-block in the first;
        # then one debug run (bf16)
        for round in 1 2; do
            for set in "default:" "S1:WSYNC_IPC_STREAMS=1" "L2:WSYNC_IPC_BLOCKS_LOCAL=2" \
                       "P2:WSYNC_IPC_BLOCKS_PEER=2" "P0.5:WSYNC_IPC_BLOCKS_PEER=0.5" \
                       "nocap:WSYNC_IPC_BLOCKS_LOCAL=0 WSYNC_IPC_BLOCKS_PEER=0" "pri0:WSYNC_IPC_PEER_PRIORITY=0"; do
                one "$s-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 --colocated
                [ $round = 1 ] && one "$s-${set%%:*}-fp8-r$round" "${set#*:}" --scheme ipc \
                    --senders 4 --tp 4 --colocated --quant fp8-block
            done
        done
        one "$s-debug" "WSYNC_LOG_LEVEL=debug" --scheme ipc --senders 4 --tp 4 --colocated
        ;;
    fp8caps4)   # 4 GPUs, FSDP-4 -> TP-4 colocated: fp8-block quantized in place (--fp8-wire off)
        # beside bf16 with the defaults (peer senders sharing 1.5 blocks per SM), and the
        # in-place kernels' own caps, 2 rounds alternating
        for round in 1 2; do
            one "$s-bf16-default-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated
            for set in "default:" "Q1:WSYNC_IPC_QUANT_BLOCKS_PEER=1" "L2:WSYNC_IPC_BLOCKS_LOCAL=2" \
                       "QL0.5:WSYNC_IPC_QUANT_BLOCKS_LOCAL=0.5" "S1:WSYNC_IPC_STREAMS=1"; do
                one "$s-fp8-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 \
                    --colocated --quant fp8-block --fp8-wire off
            done
        done
        ;;
    fp8wire4)   # 4 GPUs, FSDP-4 -> TP-4 colocated, fp8-block beside bf16, 2 rounds alternating:
        # quantized in place by the receivers (--fp8-wire off; and with the local cap of 2), FP8
        # on the wire (senders quantize into their device buckets, receivers copy half the
        # bytes over NVLink) as the default takes it (2 GiB buckets) and in buckets of 256 MiB
        # (the senders' default: two slots reused in lockstep), 1 GiB and 4 GiB. (Session 34's
        # rows came from its two forerunners, fp8after4 and fp8bucket4.)
        for round in 1 2; do
            one "$s-bf16-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated
            for set in "inplace:" "inplace-L2:WSYNC_IPC_BLOCKS_LOCAL=2"; do
                one "$s-fp8-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 \
                    --colocated --quant fp8-block --fp8-wire off
            done
            one "$s-fp8-wire-default-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated \
                --quant fp8-block
            for mb in 256 1024 4096; do
                one "$s-fp8-wire-b$mb-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated \
                    --quant fp8-block --fp8-wire always --bucket-mb $mb
            done
        done
        ;;
    coloc1ab)   # one GPU, FSDP-1 -> TP-1 bf16, the senders' blocks rounded to 2 MiB: the default
        # (uncapped since 41f781b; 2 blocks per SM before) beside no cap (L0), 4 per SM and one
        # stream uncapped, 3 rounds alternating; then one_gpu_tail with the default and no cap
        for round in 1 2 3; do
            for set in "default:" "L0:WSYNC_IPC_BLOCKS_LOCAL=0" "L4:WSYNC_IPC_BLOCKS_LOCAL=4" \
                       "S1-L0:WSYNC_IPC_STREAMS=1 WSYNC_IPC_BLOCKS_LOCAL=0"; do
                one "$s-g1-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 1 --tp 1 --colocated
            done
        done
        one_gpu_tail "default:" "L0:WSYNC_IPC_BLOCKS_LOCAL=0"
        ;;
    alone1)   # one GPU with the defaults (no cap on the local copies since 41f781b) beside the
        # cap of 2 blocks per SM they had before: FSDP-1 -> TP-1 bf16, 3 rounds alternating,
        # then one_gpu_tail with both
        for round in 1 2 3; do
            for set in "default:" "L2:WSYNC_IPC_BLOCKS_LOCAL=2"; do
                one "$s-g1-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 1 --tp 1 --colocated
            done
        done
        one_gpu_tail "default:" "L2:WSYNC_IPC_BLOCKS_LOCAL=2"
        ;;
    final4)   # 4 GPUs with the defaults: issue 18's colocated targets, FSDP-4 -> TP-4 bf16 and
        # fp8-block (FP8 on the wire in 2 GiB buckets), 3 rounds alternating; then Qwen3-30B-A3B
        # FSDP-4 -> EP-4 bf16, fp8-block as the default plans it (FP8 on the wire since
        # session 35: its wired plan moves 0.83 x the bytes) and with FP8 on the wire forced
        for round in 1 2 3; do
            one "$s-bf16-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated
            one "$s-fp8-r$round" "" --scheme ipc --senders 4 --tp 4 --colocated --quant fp8-block
        done
        for q in "bf16:" "fp8:--quant fp8-block" "fp8-wire:--quant fp8-block --fp8-wire always"; do
            TUNE_LIMIT=150 one "$s-moe-ep4-${q%%:*}" "" --timeout 120 --model-shape qwen3-30b-a3b \
                --scheme ipc --senders 4 --ep 4 --colocated ${q#*:}
        done
        ;;
    moe4ab)   # 4 GPUs, Qwen3-30B-A3B FSDP-4 -> EP-4 colocated: bf16, fp8-block quantized in
        # place by the receivers (--fp8-wire off) and FP8 on the wire (--fp8-wire always: the
        # gate and up experts, whose cells the senders' rows cut, still travel plain), 2 rounds
        # alternating
        for round in 1 2; do
            for q in "bf16:" "fp8-inplace:--quant fp8-block --fp8-wire off" \
                     "fp8-wire:--quant fp8-block --fp8-wire always"; do
                TUNE_LIMIT=150 one "$s-${q%%:*}-r$round" "" --timeout 120 \
                    --model-shape qwen3-30b-a3b --scheme ipc --senders 4 --ep 4 --colocated ${q#*:}
            done
        done
        ;;
    sender1)   # one GPU, FSDP-1 -> TP-1 bf16: the sender's block rounded up to 2 MiB (wsync-bench's
        # default) against its exact size (WSYNC_BENCH_ALLOC_ROUND=1, read up to a quarter slower
        # by the receiver: docs/bench/sections/18_colocated_copies.md); one stream uncapped with
        # each batch's GPU time logged, 2 rounds, then the defaults
        for round in 1 2 3; do
            for set in "round2m:" "exact:WSYNC_BENCH_ALLOC_ROUND=1"; do
                if [ $round = 3 ]; then
                    one "$s-${set%%:*}-default" "${set#*:}" --scheme ipc --senders 1 --tp 1 --colocated
                else
                    one "$s-${set%%:*}-S1-r$round" "${set#*:} WSYNC_IPC_STREAMS=1 WSYNC_IPC_BLOCKS_LOCAL=0 WSYNC_IPC_GPU_TIMES=1 WSYNC_LOG_LEVEL=info" \
                        --scheme ipc --senders 1 --tp 1 --colocated
                fi
            done
        done
        ;;
    alloc4)   # 4 GPUs, FSDP-4 -> TP-4 colocated: the senders' blocks rounded up to 2 MiB (the
        # default) against their exact sizes, bf16 and fp8-block, 3 rounds alternating
        for round in 1 2 3; do
            for set in "round2m:" "exact:WSYNC_BENCH_ALLOC_ROUND=1"; do
                one "$s-bf16-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 --colocated
                one "$s-fp8-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 4 --tp 4 \
                    --colocated --quant fp8-block
            done
        done
        ;;
    disagg-ipc)
        for p in 0 1 2 3; do
            one "disagg-ipc-P$p" "WSYNC_IPC_BLOCKS_PEER=$p" --scheme ipc --senders 2 --tp 2
        done
        ;;
    colocated2)   # 2 GPUs: FSDP-2 -> TP-2 colocated (sender i and receiver i on GPU i), bf16 and
        # FP8 block; the defaults beside the caps the receivers applied before they told peer
        # reads apart (every sender capped as alone, 2 blocks per SM, no priority), rounds
        # alternating so the machine's drift falls on every setting alike
        for round in 1 2; do
            for q in bf16 fp8; do
                qa=""
                [ $q = fp8 ] && qa="--quant fp8-block"
                for set in "default:" "alone:WSYNC_IPC_BLOCKS_LOCAL=2 WSYNC_IPC_BLOCKS_PEER=2 WSYNC_IPC_PEER_PRIORITY=0 WSYNC_IPC_QUANT_BLOCKS_PEER=1" \
                           "L2:WSYNC_IPC_BLOCKS_LOCAL=2" "P2:WSYNC_IPC_BLOCKS_PEER=2" \
                           "pri0:WSYNC_IPC_PEER_PRIORITY=0" "S2:WSYNC_IPC_STREAMS=2" "S1:WSYNC_IPC_STREAMS=1"; do
                    one "$s-$q-${set%%:*}-r$round" "${set#*:}" --scheme ipc --senders 2 --tp 2 \
                        --colocated $qa
                done
            done
        done
        ;;
    disagg-nccl)
        one disagg-nccl-default "" --scheme nccl --senders 2 --tp 2
        one disagg-nccl-chunk2m "NCCL_P2P_NVL_CHUNKSIZE=2097152" --scheme nccl --senders 2 --tp 2
        one disagg-nccl-minch32 "NCCL_MIN_P2P_NCHANNELS=32" --scheme nccl --senders 2 --tp 2
        one disagg-nccl-minch32-chunk2m "NCCL_MIN_P2P_NCHANNELS=32 NCCL_P2P_NVL_CHUNKSIZE=2097152" \
            --scheme nccl --senders 2 --tp 2
        ;;
    *)
        echo "tune.sh: unknown scenario '$s' (colocated, fp8, disagg-ipc, disagg-nccl, colocated1, colocated1-fp8, colocated2, streams4, target4, sweep4, fp8caps4, fp8wire4, sender1, alloc4, coloc1ab, alone1, final4, moe4ab)" >&2
        exit 2
        ;;
    esac
done
