#!/usr/bin/env bash
# The nccl scheme across simulated hosts (issue 19.2): every sender and receiver in a network
# namespace of its own, the namespaces joined by one bridge (veth pairs), and NCCL held to its
# socket transport as between nodes without NVLink or InfiniBand (NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=wsnet0: each namespace's one device).
# Runs FSDP-1 -> TP-1, FSDP-2 -> TP-2 and fan-out 1 -> 3 replicas, each process in the namespace
# of its own simulated host and on one GPU (CUDA_VISIBLE_DEVICES): host i takes GPU i mod G, so
# with fewer than 4 GPUs two hosts share one (a sender and a receiver, or two raw ranks). Each
# namespace is one machine to both libraries: WSYNC_HOST_ID and NCCL_HOSTID name it, as the boot
# ids of separate machines would, so neither refuses two "hosts" on one GPU, and NCCL takes its
# network transport between them as it does between nodes. In the same namespaces and with the
# same environment, raw ncclSend (host 0 -> host 1) and ncclBroadcast (over the 4 hosts) move the
# same bytes. Every receiver checks every element
# of the first and last versions (tests/gpu/netns_member.c). The NCCL log says which transport
# each channel took: a channel "via P2P" or "via SHM" fails the run.
#
#   bash tests/gpu/netns_nccl.sh [BUILD_DIR] [--mem cuda|host] [--bytes N] [--gpus G] [--dry-run]
#
# --mem host: the same namespaces and processes with host memory and the store scheme (no GPU:
# this checks the namespace set-up, the launches and the byte checks on a CPU machine; --gpus
# then only picks the scenarios). --dry-run prints what would run. Needs root and iproute2's `ip`
# (tests/gpu/run.sh puts the carried one on PATH); without them, or without a GPU, exit 77.
# Output: $OUT (default /tmp/wsync-netns-out)/netns.jsonl, one JSON line per run (kind wsync or
# raw), the logs beside it, and a table after the line "== netns results". Exit 0 when every run
# passed.
set -u

BUILD=build-gpu
MEM=cuda
DRY=0
BYTES=
GPUS=
while [ $# -gt 0 ]; do
    case $1 in
        --mem) MEM=$2; shift 2 ;;
        --bytes) BYTES=$2; shift 2 ;;
        --gpus) GPUS=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
        -*) echo "netns_nccl.sh: unknown option $1" >&2; exit 2 ;;
        *) BUILD=$1; shift ;;
    esac
done
OUT=${OUT:-/tmp/wsync-netns-out}
MEMBER=$BUILD/tests/gpu/netns_member
LIMIT=${WSYNC_NETNS_LIMIT:-180}     # seconds for one run's processes
TAG=wsn$$
NET=10.233.$(($$ % 250 + 1))
DEV=wsnet0
case $MEM in
    cuda) SCHEME=nccl; BYTES=${BYTES:-$((512 << 20))} ;;
    host) SCHEME=store; BYTES=${BYTES:-$((64 << 20))} ;;
    *) echo "netns_nccl.sh: --mem cuda or host, not $MEM" >&2; exit 2 ;;
esac

if [ -z "$GPUS" ]; then
    GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
    [ "$MEM" = host ] && [ "$GPUS" -lt 1 ] && GPUS=4   # host runs: no GPU is used
fi
if [ "$DRY" = 0 ]; then
    if [ "$(id -u)" != 0 ]; then echo "skipped: network namespaces need root"; exit 77; fi
    if ! command -v ip > /dev/null 2>&1; then echo "skipped: iproute2's ip is not on PATH"; exit 77; fi
    if [ ! -x "$MEMBER" ]; then echo "no $MEMBER: build the tests and carry the build"; exit 1; fi
fi
if [ "$GPUS" -lt 1 ]; then echo "skipped: no GPU; the nccl runs need one"; exit 77; fi
mkdir -p "$OUT"
: > "$OUT/netns.jsonl"

do_cmd() {   # run a command, or print it in a dry run
    if [ "$DRY" = 1 ]; then echo "+ $*"; return 0; fi
    "$@"
}

# ---- the LAN: a bridge in namespace ${TAG}sw, host i in ${TAG}h$i with device wsnet0 at $NET.(i+1).
# Where the kernel has no bridge (or WSYNC_NETNS_ROUTED=1), the same addresses through a router
# instead: ${TAG}sw forwards, answers ARP for the others (proxy ARP) and routes each /32 to its veth.
NHOSTS=0
lan_up() {   # number of hosts
    local routed=${WSYNC_NETNS_ROUTED:-0}
    do_cmd ip netns add "${TAG}sw" || return 1
    if [ "$routed" = 0 ] && ! do_cmd ip -n "${TAG}sw" link add br0 type bridge; then
        echo "== no bridge here: a routed star instead"
        routed=1
    fi
    if [ "$routed" = 0 ]; then
        do_cmd ip -n "${TAG}sw" link set br0 up || return 1
    else
        do_cmd ip netns exec "${TAG}sw" sysctl -qw net.ipv4.ip_forward=1 || return 1
    fi
    for ((i = 0; i < $1; i++)); do
        NHOSTS=$((i + 1))
        do_cmd ip netns add "${TAG}h$i" || return 1
        # made in the namespaces directly: no name is ever taken in the root namespace
        do_cmd ip link add "$DEV" netns "${TAG}h$i" type veth peer name "p$i" netns "${TAG}sw" || return 1
        if [ "$routed" = 0 ]; then
            do_cmd ip -n "${TAG}sw" link set "p$i" master br0 up || return 1
        else
            do_cmd ip -n "${TAG}sw" addr add "$NET.254/32" dev "p$i" || return 1
            do_cmd ip -n "${TAG}sw" link set "p$i" up || return 1
            do_cmd ip -n "${TAG}sw" route add "$NET.$((i + 1))/32" dev "p$i" || return 1
            do_cmd ip netns exec "${TAG}sw" sysctl -qw "net.ipv4.conf.p$i.proxy_arp=1" || return 1
        fi
        do_cmd ip -n "${TAG}h$i" addr add "$NET.$((i + 1))/24" dev "$DEV" || return 1
        do_cmd ip -n "${TAG}h$i" link set "$DEV" up || return 1
        do_cmd ip -n "${TAG}h$i" link set lo up || return 1
    done
    [ "$DRY" = 1 ] && return 0
    # every host reaches every other before anything starts
    for ((i = 1; i < $1; i++)); do
        # a closed port of host 0 answers "refused" when it is reachable
        if ! ip netns exec "${TAG}h$i" timeout 5 bash -c "exec 3<>/dev/tcp/$NET.1/9" 2>&1 |
             grep -q refused; then
            echo "host $i cannot reach host 0 ($NET.1)"
            return 1
        fi
    done
}
lan_down() {
    for ((i = 0; i < NHOSTS; i++)); do do_cmd ip netns del "${TAG}h$i" 2> /dev/null; done
    do_cmd ip netns del "${TAG}sw" 2> /dev/null
    NHOSTS=0
}
trap lan_down EXIT

# the environment of every process: NCCL between "hosts", the store's transports on the bridge
ENVS=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=$DEV
      NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
      UCX_NET_DEVICES=$DEV UCX_TLS=tcp FI_TCP_IFACE=$DEV WSYNC_TIMEOUT_MS=120000)

PIDS=()
NAMES=()
launch() {   # log name, host, GPU, then netns_member arguments
    local name=$1 host=$2 gpu=$3
    shift 3
    # XENV: one more VAR=value for this run's processes (the delta run's WSYNC_DELTA=on)
    local cmd=(ip netns exec "${TAG}h$host" env "${ENVS[@]}" ${XENV:-} CUDA_VISIBLE_DEVICES=$gpu
               WSYNC_HOST_ID="${TAG}-host$host" NCCL_HOSTID="${TAG}-host$host"
               timeout -k 5 "$LIMIT" "$MEMBER" "$@")
    if [ "$DRY" = 1 ]; then echo "+ ${cmd[*]} > $WORK/$name.log &"; return; fi
    "${cmd[@]}" > "$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    NAMES+=("$name")
}
reap() {   # run name: waits for every launched process; 0 when all exited 0
    local run=$1 bad=0 i rc
    for i in "${!PIDS[@]}"; do
        wait "${PIDS[$i]}"
        rc=$?
        if [ "$rc" != 0 ]; then
            echo "   ${NAMES[$i]}: exit $rc"
            tail -n 5 "$WORK/${NAMES[$i]}.log" | sed 's/^/      /'
            bad=1
        fi
    done
    PIDS=()
    NAMES=()
    [ "$DRY" = 1 ] && return 0
    # NCCL's word on the transport: sockets between the namespaces, nothing else
    local logs=("$WORK/$run".*.log)
    if [ "$MEM" = cuda ]; then
        if grep -h -E 'via (P2P|SHM)' "${logs[@]}" > /dev/null 2>&1; then
            echo "   $run: NCCL used P2P or SHM:"; grep -h -E 'via (P2P|SHM)' "${logs[@]}" | head -n 3
            bad=1
        elif ! grep -h 'via NET/Socket' "${logs[@]}" > /dev/null 2>&1; then
            echo "   $run: no NCCL channel 'via NET/Socket' in the logs"
            bad=1
        fi
    fi
    return $bad
}

RESULTS=()
record() {   # run name, rc
    RESULTS+=("$1 $2")
    local line
    line=$(grep -h '^{' "$WORK/$1".*.log 2> /dev/null | tail -n 1)
    [ -n "$line" ] && echo "$line" >> "$OUT/netns.jsonl"
}

# one wsync run: name, layout, senders, receivers (host i, GPU i mod $GPUS; senders first)
wsync_run() {
    local name=$1 layout=$2 ns=$3 nr=$4 port=$((29000 + RANDOM % 2000))
    echo "== $name: $ns sender(s) -> $nr receiver(s), $layout, $MEM memory, scheme $SCHEME"
    do_cmd rm -rf "$WORK/$name.d"
    do_cmd mkdir -p "$WORK/$name.d"
    local common=(--senders "$ns" --receivers "$nr" --coord "$NET.1:$port" --mem "$MEM"
                  --scheme "$SCHEME" --layout "$layout" --bytes "$BYTES" --dir "$WORK/$name.d"
                  --name "$name" --device 0)
    for ((i = 0; i < ns; i++)); do
        launch "$name.s$i" "$i" "$((i % GPUS))" --role sender --rank "$i" "${common[@]}"
    done
    for ((i = 0; i < nr; i++)); do
        launch "$name.r$i" "$((ns + i))" "$(((ns + i) % GPUS))" --role receiver --rank "$i" \
            "${common[@]}"
    done
    reap "$name"
    local rc=$?
    record "$name" "$rc"
    [ "$DRY" = 1 ] || grep -h 'elements differ' "$WORK/$name".r*.log | sed 's/^/   /'
}

# raw NCCL: name, op (send or bcast), ranks (rank i on host i, GPU i mod $GPUS)
raw_run() {
    local name=$1 op=$2 n=$3
    echo "== $name: raw $op over $n namespaces"
    do_cmd rm -rf "$WORK/$name.d"
    do_cmd mkdir -p "$WORK/$name.d"
    for ((i = 0; i < n; i++)); do
        launch "$name.k$i" "$i" "$((i % GPUS))" --role raw --op "$op" --rank "$i" --nranks "$n" \
            --bytes "$BYTES" --dir "$WORK/$name.d" --name "$name" --device 0
    done
    reap "$name"
    record "$name" "$?"
}

WORK=$OUT/logs
do_cmd mkdir -p "$WORK"
if ! lan_up 4; then
    echo "skipped: could not make the network namespaces"
    exit 77
fi

wsync_run fsdp1-tp1 tp 1 1
# delta versions asked for explicitly (issue 17: nccl carries them; auto also turns them on for
# a group that spans namespaces)
[ "$MEM" = cuda ] && XENV=WSYNC_DELTA=on wsync_run fsdp1-tp1-delta tp 1 1
[ "$MEM" = cuda ] && raw_run raw-send send 2
wsync_run fsdp2-tp2 tp 2 2
wsync_run fanout-1-3 fanout 1 3
[ "$MEM" = cuda ] && raw_run raw-bcast-4 bcast 4
[ "$DRY" = 1 ] && exit 0

echo "== netns results ($MEM memory, $BYTES bytes, 4 hosts on $GPUS GPU(s), NCCL sockets on $DEV)"
python3 - "$OUT/netns.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
raw = {r["run"]: r for r in rows if r["kind"] == "raw"}
send = raw.get("raw-send")
print("%-12s %-14s %-22s %10s %9s %9s" % ("run", "how", "layout", "seconds", "GB/s/recv", "x raw"))
for r in rows:
    if r["kind"] == "raw":
        print("%-12s %-14s %-22s %10.5f %9.2f %9s" % (r["run"], r["op"], "%d ranks" % r["ranks"],
              r["seconds"], r["gbps_per_receiver"], "-"))
        continue
    # against the raw op that moves the same bytes the same way: a send to one, a broadcast to many
    base = send if r["layout"] == "tp" else next((b for b in raw.values() if b["op"] == "ncclBroadcast"), None)
    ratio = "%.3f" % (r["gbps_per_receiver"] / base["gbps_per_receiver"]) if base else "-"
    print("%-12s %-14s %-22s %10.5f %9.2f %9s" % (r["run"], "wsync " + r["scheme"],
          "%s %d -> %d" % (r["layout"], r["senders"], r["receivers"]), r["seconds"],
          r["gbps_per_receiver"], ratio))
EOF
fail=0
for r in "${RESULTS[@]}"; do
    set -- $r
    printf '%-14s %s\n' "$1" "$([ "$2" = 0 ] && echo pass || echo "FAIL ($2)")"
    [ "$2" = 0 ] || fail=1
done
exit $fail
