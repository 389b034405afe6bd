/* wsync-bench: time wsync on this machine against the same work done without wsync, measured in
 * the same run.
 *
 *  - ipc: one sender process and R receiver processes; times wsync_sender_push against one core's
 *    memcpy bandwidth.
 *  - store: one sender process (the store's publisher, snapshot mode) and R receiver processes
 *    over UCX or libfabric; times each receiver's wsync_receiver_fetch of a published version
 *    against a raw get loop over the same transport (1 owner process, R reader processes), the
 *    two interleaved round by round in one run (raw round k, then the store's version k + 1), so
 *    that whatever else the machine does weighs on both alike; the ratio is the median of the
 *    rounds' paired ratios.
 *
 * The parent forks every child before any wsync object exists (a process with wsync or transport
 * threads is never forked), then only watches: children send their timings back through a pipe
 * or a shared page, the receivers check the bytes they got against hashes the sender left in the
 * shared page, and the parent kills everyone if a child fails or the deadline passes. */
#include "bench/bench.h"
#include "wsync/wsync.h"
/* The one internal header of the bench: the store's baseline is, by definition, the transport
 * without wsync, so it drives the very RMA transport the store uses (transports/rma.h: open,
 * connect, register, get, flush) with no coordinator, plan, directory or lease around it. */
#include "transports/rma.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define MIB (1024.0 * 1024.0)
#define MAX_RECEIVERS 256
#define MAX_PARAMS 65536
#define MAX_VERSIONS 100000          /* store: warmup + iters, bounded by the shared page */
#define STORE_KEEP_VERSIONS 2        /* the library's default, set explicitly */
#define RAW_GET_BYTES ((size_t)1 << 20)

/* The page every process shares, mapped by the parent before forking. The sender leaves one xxh3
 * per param, then ready = 1; the store's run also meets here (see bench_store_shm_t). */
typedef struct {
    atomic_int ready;
    int nparams;
    /* store: the last version published, receivers that finished (bytes checked, receiver
     * freed), and the raw transport's words */
    atomic_int published;
    atomic_int done;
    char raw_info[256];
    uint64_t hash[];
} bench_shared_t;

/* Arrays of the store's run, in a second shared mapping (also made before forking). */
typedef struct {
    atomic_int *fetched;     /* [versions + 1]: receivers that fetched version v */
    atomic_int *raw_arrived; /* [versions]: raw readers at the start of round k (a barrier) */
    atomic_int *raw_done;    /* [versions]: raw readers done with round k */
    double *fetch_s;         /* [versions * R]: seconds of version v's fetch by receiver r */
    double *raw_s;           /* [versions * R]: seconds of raw round k by reader r */
    void *base;
    size_t len;
} bench_store_shm_t;

/* Param i of the benchmark model: a [rows, cols] bf16 matrix, params split bytes evenly. */
typedef struct {
    char name[40];
    int64_t rows, cols;
    size_t offset;           /* bytes from the start of the one block holding every param */
    size_t bytes;
} bench_param_t;

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A flush deadline `s` seconds from now. rma.h takes deadlines on wsync_now_ms's clock, which is
 * CLOCK_MONOTONIC in ms (core/util.h); computed here so as to need no second internal header. */
static int64_t rma_deadline_in(int s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + (int64_t)s * 1000;
}

/* The children wait for each other on counters of the shared page, which only grow. A waiter
 * sleeps in the kernel (a futex on the shared page), so that waiting takes no core from the
 * processes being timed: the store's sender, say, waits while its transport thread serves the
 * reads, and a 50 us polling loop cost a fifth of a core on the 2-core VM. The parent's deadline
 * bounds every wait; the timeout only makes the waiter look again now and then. */
void bench_wait_at_least(atomic_int *word, int target)
{
    for (;;) {
        int seen = atomic_load_explicit(word, memory_order_acquire);
        if (seen >= target)
            return;
        struct timespec ts = {0, 100 * 1000 * 1000};
        syscall(SYS_futex, (int *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
}

void bench_wake_all(atomic_int *word)
{
    syscall(SYS_futex, (int *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void bench_count_up(atomic_int *word)
{
    atomic_fetch_add_explicit(word, 1, memory_order_acq_rel);
    bench_wake_all(word);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " --scheme ipc --mem host --receivers R --bytes N [options]\n"
            "       " PROG " --scheme store --transport ucx|ofi --mem host --receivers R\n"
            "                   --bytes N [options]\n"
            "       " PROG " --model-shape SHAPE --mem host|cuda --scheme nccl|ipc|store|auto\n"
            "                   [--senders N] [--tp T | --ep E] [--replicas R] [--colocated]\n"
            "                   [--fused-experts] [--quant none|fp8-block] [options]\n"
            "\n"
            "Flat runs (--bytes):\n"
            "ipc: runs one sender process and R receiver processes on this machine, pushes\n"
            "versions 1..W+K of N bytes of bf16 weights, and reports the median push time, the\n"
            "GB/s delivered to each receiver (GB = 1e9 bytes), one core's memcpy GB/s for N\n"
            "bytes measured in the same run, and their ratio.\n"
            "\n"
            "store: measures the transport without wsync (one owner process registers N bytes,\n"
            "R reader processes each get all of them at once in 1 MiB gets) and the store (one\n"
            "sender publishes versions 1..W+K as snapshots; after each publish every receiver\n"
            "times wsync_receiver_fetch of that version) in W+K rounds, each a raw round then a\n"
            "store version, all processes alive throughout. Reports the median fetch time, the\n"
            "GB/s per receiver, the raw get GB/s per reader, and the ratio: the median over the\n"
            "K timed rounds of raw seconds / store seconds, with its min and max. --pin puts\n"
            "the sender and the raw owner on the first CPU, the readers on the others.\n"
            "\n"
            "Every receiver checks its bytes against the sender's (xxh3); a mismatch fails the\n"
            "run.\n"
            "\n"
            "Model runs (--model-shape): the params of a real model's shape, random bf16 (never\n"
            "zero), held FSDP-N (dim-0 shards) by N sender processes and wanted by R replicas\n"
            "of T tensor-parallel receiver processes laid out as vLLM does (fused qkv_proj and\n"
            "gate_up_proj, vocab-parallel embeddings; with --quant fp8-block the linear weights\n"
            "are e4m3 targets with 128x128 block scales). One process per sender and receiver;\n"
            "with --mem cuda each uses one GPU: --colocated puts sender i and receiver j on GPUs\n"
            "i mod G and j mod G (G = GPUs visible); otherwise senders take GPUs 0..N-1 and\n"
            "receivers (replica-major, receiver k*T+t is TP rank t of replica k) the next T*R.\n"
            "Versions 1..W+K are pushed; the first elements (256) of every param change with\n"
            "each version. Reported: the median over the K timed versions of the time to push\n"
            "one (the slowest sender's wsync_sender_push, which returns when every receiver\n"
            "committed; the senders start each push together), the bytes the plan moves (in\n"
            "the params' dtype, summed over sender->receiver pairs), GB/s = those bytes over\n"
            "that time, and with --mem cuda:\n"
            "  links, measured in the same run before the sync starts: B_peer = median over the\n"
            "    ordered GPU pairs that carry plan bytes of cudaMemcpyPeerAsync of 1 GiB;\n"
            "    B_d2d = median over the GPUs used of a 1 GiB device-to-device cudaMemcpyAsync\n"
            "    (bytes copied per second, not read + written); and one ncclBroadcast of a\n"
            "    4 GiB buffer from sender 0's GPU over every GPU used (bytes per second).\n"
            "  floor = max over GPUs g of  max(in_g, out_g) / B_peer + local_g / B_d2d,\n"
            "    from the compiled plan's bytes per (sender, receiver) pair:\n"
            "    in_g    bytes for receivers on g from senders on other GPUs;\n"
            "    out_g   bytes from senders on g to receivers on other GPUs, a byte that\n"
            "            several replicas need counted once (a broadcast relays it);\n"
            "    local_g bytes from senders on g to receivers on g.\n"
            "  floor, all peers: the same with B_peer = the busiest GPU's max(in, out) bytes\n"
            "    over the time of every such pair's cudaMemcpyPeerAsync at once (each its\n"
            "    slice): what a GPU's links give when all its peers use them together, as a\n"
            "    colocated group's do; JSON peer_all_gbps, floor_all_seconds, ratio_floor_all.\n"
            "  ratio to floor = time / floor (1 is the best possible), and ratio to broadcast =\n"
            "    (bytes per receiver / time) / broadcast GB/s (fan-out: 1 is a broadcast's\n"
            "    speed).\n"
            "With --mem host the floor is the largest receiver's bytes at one core's memcpy.\n"
            "Mixture-of-experts shapes (tiny-moe, tiny-deepseek, qwen3-30b-a3b and its first 2\n"
            "layers qwen3-30b-a3b-2l, qwen3-235b-a22b, deepseek-v3; configs built in, with the\n"
            "published config.json's values): each MoE\n"
            "layer's experts are FusedMoE targets, w13_weight [E_local, 2*I_p, Hd] and w2_weight\n"
            "[E_local, Hd, I_p], beside a replicated router. Without --ep every receiver holds\n"
            "every expert, split inside by TP (I_p = I / T); with --ep E (E = T) receiver t of\n"
            "a replica holds whole experts (vLLM's enable_expert_parallel, linear placement)\n"
            "while attention stays split by TP. Senders hold FSDP dim-0 shards of every\n"
            "checkpoint param, one tensor per expert (each expert's rows spread over the\n"
            "senders); with --fused-experts, of the fused tensors transformers 5.x holds in\n"
            "memory (mlp.experts.gate_up_proj [E, 2I, Hd], down_proj [E, Hd, I]), so each\n"
            "sender holds whole experts, described as per-expert shards\n"
            "(wsync_layout_unfuse_experts). A run that cannot fit (the senders'\n"
            "shards, the receivers' targets and buckets on the busiest GPU, or all of them in\n"
            "host memory with --mem host) is refused before anything is allocated, naming the\n"
            "bytes needed and available (exit status 2).\n"
            "After the last version every receiver compares its targets (and FP8 scales) with\n"
            "the bytes the same generator and the CPU quantizer give on the host: a mismatch\n"
            "reports the run as WRONG (exit status 1) whatever its speed.\n"
            "\n"
            "Delta versions (--delta, with --model-shape; bf16 targets): every shard element\n"
            "has an fp32 master; version 1's is drawn about N(0, 0.02^2) (HF's initializer\n"
            "range), and each later version adds lr * d, d drawn per (param, element,\n"
            "version) with |d| uniform in [0, 1) and a random sign (an Adam-like step); the\n"
            "bf16 weight is the master rounded to nearest even. The step runs between pushes,\n"
            "outside the timed region. The same versions are pushed twice in one run, by one\n"
            "group with delta = --delta-mode and then by one with delta = off, and every\n"
            "receiver checks every version of both against its own fp32 masters, stepped the\n"
            "same way in its targets' layout. Reported per timed version (medians): the\n"
            "fraction of elements the step changed, wire bytes (the senders' push stats:\n"
            "encoded plus plain chunks) against the full version's (version 1, all plain),\n"
            "the time of each mode and their ratio, and the codec's seconds on the senders'\n"
            "own version pairs, measured apart from the sync (the schemes expose no codec\n"
            "times): --mem host, the CPU codec (core/delta.h, one thread) on every version;\n"
            "--mem cuda, the batched kernels (kernels/delta.h, CUDA events, medians) on the\n"
            "last version, the previous weights kept on the GPU for it. JSON adds delta, lr,\n"
            "changed_fraction, wire_bytes, full_wire_bytes, seconds, full_seconds, correct\n"
            "(both modes, every version, every receiver), encode_seconds, apply_seconds,\n"
            "read_both_seconds (reading both versions once: a memcpy of one on the host; on\n"
            "the GPU the faster of a device-to-device copy of one and an amax over both),\n"
            "codec_ratio = (encode + apply) / read_both, and codec_correct (the applied\n"
            "bytes equal the new ones); through the store on host memory also\n"
            "read_floor_seconds, read_floor_threads and read_floor_ratio (each receiver's\n"
            "targets read once on its reader's threads after the run, the slowest: the least\n"
            "its check of the hash can take; over full_seconds).\n"
            "Every other run pushes full versions (delta = off for every participant, whatever\n"
            "WSYNC_DELTA says): its versions repeat the same bytes, which a delta would skip.\n"
            "\n"
            "  --scheme S       ipc, nccl (model runs), store or auto (let the library choose)\n"
            "  --transport T    store only: ucx or ofi (WSYNC_STORE_TRANSPORT of every process,\n"
            "                   and the transport of the raw baseline)\n"
            "  --mem M          host, or cuda (model runs)\n"
            "  --receivers R    flat runs: receiver processes, 1..%d\n"
            "  --bytes N        flat runs: total bytes of weights; suffixes K, M, G, T (powers\n"
            "                   of 1024)\n"
            "  --model-shape S  %s\n"
            "  --senders N      FSDP senders (default 1)\n"
            "  --tp T           tensor-parallel size of each replica (default 1)\n"
            "  --ep E           MoE shapes: expert parallelism over the E ranks of a replica,\n"
            "                   which are its TP ranks (E = T; --ep alone sets T = E)\n"
            "  --fused-experts  MoE shapes: senders shard the fused expert tensors (whole\n"
            "                   experts per sender) instead of each expert's tensors\n"
            "  --replicas R     inference replicas (default 1)\n"
            "  --colocated      senders and receivers share GPUs (see above)\n"
            "  --quant Q        none (default: bf16 targets) or fp8-block\n"
            "  --fp8-wire W     on (default), off or always: FP8 on the wire, the senders' fp8_wire\n"
            "                   (1, 0, 2; on leaves it off for ipc colocated on 1 or 2 GPUs)\n"
            "                   param (WSYNC_FP8_WIRE is not read): with on, ipc and nccl groups\n"
            "                   send FP8 targets whose chunks lie on whole blocks as FP8 codes\n"
            "                   and scales made by the senders; bytes moved and the floor count\n"
            "                   the bytes as they travel (JSON fp8_wire, wire_bytes,\n"
            "                   fp8_wire_bytes, param_dtype_bytes, wire_ratio)\n"
            "  --bucket-mb B    staging bucket size in MiB (default: the library's, 256)\n"
            "  --iters K        timed pushes or fetched versions (default 5)\n"
            "  --warmup W       untimed ones first (default 1)\n"
            "  --params P       flat runs: number of params the bytes are split into (default\n"
            "                   16)\n"
            "  --timeout S      kill every process and fail after S seconds (default 600)\n"
            "  --source S       flat ipc only: shared (default): the sender's weights are in\n"
            "                   wsync_mem_alloc memory, which receivers read in place; private:\n"
            "                   malloc'd weights, staged through the buckets\n"
            "  --delta          model runs: delta versions (see below), each version timed\n"
            "                   twice in one run: the group with delta on, then off\n"
            "  --lr X           --delta: the optimizer's learning rate (default 1e-6)\n"
            "  --delta-mode M   --delta: the participants' delta param in the delta run, on\n"
            "                   (default) or auto (the group resolves it; the run says how)\n"
            "  --json           end stdout with one JSON object of the results\n"
            "  -h, --help       this text\n"
            "\n"
            "Environment: WSYNC_LOG_LEVEL, WSYNC_TIMEOUT_MS, WSYNC_HEARTBEAT_MS apply to every\n"
            "process; WSYNC_STORE_PROVIDER (a UCX_TLS list or a libfabric provider) to the store\n"
            "and to its raw baseline alike; the coordinator address, ranks, scheme, bucket and\n"
            "store transport are set by the bench. Model runs set NCCL_NVLS_ENABLE=0 unless it\n"
            "is set. CUDA_VISIBLE_DEVICES picks the GPUs.\n",
            MAX_RECEIVERS, bench_model_shape_names());
}

/* ---------------------------------------------------------------------------------------- */
/* Option parsing                                                                             */
/* ---------------------------------------------------------------------------------------- */

static int bad_option(const char *opt, const char *fmt, const char *value)
{
    fprintf(stderr, PROG ": %s: ", opt);
    fprintf(stderr, fmt, value);
    fprintf(stderr, " (see --help)\n");
    return -1;
}

static int parse_int(const char *opt, const char *text, long min, long max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, PROG ": %s: expected an integer in [%ld, %ld], got '%s'\n", opt, min,
                max, text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* "4096", "64K", "1G", "256MiB", "2GB": suffixes are powers of 1024. */
static int parse_bytes(const char *opt, const char *text, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {
        {"", 1},           {"b", 1},
        {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
        {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20},
        {"g", 1ull << 30}, {"gb", 1ull << 30}, {"gib", 1ull << 30},
        {"t", 1ull << 40}, {"tb", 1ull << 40}, {"tib", 1ull << 40},
    };
    char *end;
    if (text[0] < '0' || text[0] > '9')
        return bad_option(opt, "expected a size such as 4096, 256M or 1G, got '%s'", text);
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0)
        return bad_option(opt, "size '%s' is too large", text);
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcasecmp(end, units[i].suffix) != 0)
            continue;
        if (v > UINT64_MAX / units[i].mult)
            return bad_option(opt, "size '%s' is too large", text);
        *out = (uint64_t)v * units[i].mult;
        return 0;
    }
    return bad_option(opt, "unknown size suffix in '%s' (use K, M, G or T)", text);
}

/* The transport's RMA table, NULL when this build has it not (no side effect: a static table). */
static const wsync_rma_ops_t *rma_ops(const char *transport)
{
    return strcmp(transport, "ucx") == 0 ? wsync_rma_ucx() : wsync_rma_ofi();
}

/* The rest of a model run's command line (--model-shape given); 0 or -1 (reported). */
static int parse_model_options(bench_opts_t *o, const char *scheme, const char *mem,
                               const char *transport, const char *quant, int have_receivers,
                               int have_flat, int have_bucket, int bucket_mb)
{
    if (have_flat) {
        fprintf(stderr, PROG ": --bytes, --params and --source are for flat runs; with "
                        "--model-shape the model's params are moved\n");
        return -1;
    }
    if (have_receivers) {
        fprintf(stderr, PROG ": --receivers: with --model-shape the receivers are --tp x "
                        "--replicas\n");
        return -1;
    }
    if (!mem) {
        fprintf(stderr, PROG ": --mem is required (host or cuda)\n");
        return -1;
    }
    if (strcmp(mem, "cuda") == 0)
        o->mem_cuda = 1;
    else if (strcmp(mem, "host") != 0) {
        fprintf(stderr, PROG ": --mem: unknown memory kind '%s' (expected host or cuda)\n", mem);
        return -1;
    }
    if (!quant || strcmp(quant, "none") == 0)
        o->quant_fp8 = 0;
    else if (strcmp(quant, "fp8-block") == 0)
        o->quant_fp8 = 1;
    else {
        fprintf(stderr, PROG ": --quant: unknown '%s' (expected none or fp8-block)\n", quant);
        return -1;
    }
    o->scheme = scheme;
    o->store = strcmp(scheme, "store") == 0;
    if (o->store) {
        if (!transport || (strcmp(transport, "ucx") != 0 && strcmp(transport, "ofi") != 0)) {
            fprintf(stderr, PROG ": --scheme store needs --transport ucx or ofi\n");
            return -1;
        }
        if (rma_ops(transport) == NULL) {
            fprintf(stderr, PROG ": --transport %s: not compiled into this build\n", transport);
            return -1;
        }
        o->transport = transport;
    } else if (transport) {
        fprintf(stderr, PROG ": --transport %s: only with --scheme store\n", transport);
        return -1;
    }
    if (o->tp * o->replicas > MODEL_MAX_RANKS) {
        fprintf(stderr, PROG ": --tp %d x --replicas %d: at most %d receivers\n", o->tp,
                o->replicas, MODEL_MAX_RANKS);
        return -1;
    }
    if (o->warmup + o->iters > MODEL_MAX_VERSIONS) {
        fprintf(stderr, PROG ": --iters %d with --warmup %d: at most %d versions with "
                        "--model-shape\n",
                o->iters, o->warmup, MODEL_MAX_VERSIONS);
        return -1;
    }
    o->receivers = o->tp * o->replicas;
    o->bucket_bytes = (uint64_t)bucket_mb << 20;
    o->have_bucket = have_bucket;
    return 0;
}

/* What the command line says beyond bench_opts_t, for the checks after it is read. */
typedef struct {
    const char *scheme, *mem, *source, *transport, *quant;
    int have_receivers, have_bytes, have_bucket, bucket_mb, have_params;
    int have_layout; /* --senders, --tp, --ep, --replicas or --colocated */
    int have_tp;
    int have_lr; /* --lr or --delta-mode: only with --delta */
    int quant_opts; /* --fp8-wire: only with --model-shape */
} cmdline_t;

/* Reads the command line into *o (defaults first) and *cl, each value checked alone. Returns 0,
 * 1 when --help was asked, -1 on a bad option or value (already reported). */
static int read_options(int argc, char **argv, bench_opts_t *o, cmdline_t *cl)
{
    enum { OPT_SCHEME = 1000, OPT_MEM, OPT_RECEIVERS, OPT_BYTES, OPT_BUCKET, OPT_ITERS,
           OPT_WARMUP, OPT_PARAMS, OPT_TIMEOUT, OPT_JSON, OPT_SOURCE, OPT_TRANSPORT,
           OPT_MODEL, OPT_SENDERS, OPT_TP, OPT_REPLICAS, OPT_COLOCATED, OPT_QUANT, OPT_EP,
           OPT_FUSED, OPT_PIN, OPT_DELTA, OPT_LR, OPT_DELTA_MODE, OPT_FP8_WIRE };
    static const struct option longopts[] = {
        {"scheme", required_argument, NULL, OPT_SCHEME},
        {"transport", required_argument, NULL, OPT_TRANSPORT},
        {"mem", required_argument, NULL, OPT_MEM},
        {"receivers", required_argument, NULL, OPT_RECEIVERS},
        {"bytes", required_argument, NULL, OPT_BYTES},
        {"bucket-mb", required_argument, NULL, OPT_BUCKET},
        {"iters", required_argument, NULL, OPT_ITERS},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"params", required_argument, NULL, OPT_PARAMS},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"json", no_argument, NULL, OPT_JSON},
        {"pin", no_argument, NULL, OPT_PIN},
        {"source", required_argument, NULL, OPT_SOURCE},
        {"model-shape", required_argument, NULL, OPT_MODEL},
        {"senders", required_argument, NULL, OPT_SENDERS},
        {"tp", required_argument, NULL, OPT_TP},
        {"ep", required_argument, NULL, OPT_EP},
        {"fused-experts", no_argument, NULL, OPT_FUSED},
        {"replicas", required_argument, NULL, OPT_REPLICAS},
        {"colocated", no_argument, NULL, OPT_COLOCATED},
        {"quant", required_argument, NULL, OPT_QUANT},
        {"fp8-wire", required_argument, NULL, OPT_FP8_WIRE},
        {"delta", no_argument, NULL, OPT_DELTA},
        {"lr", required_argument, NULL, OPT_LR},
        {"delta-mode", required_argument, NULL, OPT_DELTA_MODE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *cl = (cmdline_t){.bucket_mb = 256};
    *o = (bench_opts_t){.iters = 5, .warmup = 1, .params = 16, .timeout_s = 600, .senders = 1,
                        .tp = 1, .replicas = 1, .lr = 1e-6, .delta_mode = "on",
                        .fp8_wire = 1};
    opterr = 0; /* errors are reported below, naming the option */
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_SCHEME: cl->scheme = optarg; break;
        case OPT_TRANSPORT: cl->transport = optarg; break;
        case OPT_MEM: cl->mem = optarg; break;
        case OPT_RECEIVERS:
            if (parse_int("--receivers", optarg, 1, MAX_RECEIVERS, &o->receivers) != 0)
                return -1;
            cl->have_receivers = 1;
            break;
        case OPT_BYTES:
            if (parse_bytes("--bytes", optarg, &o->bytes) != 0)
                return -1;
            cl->have_bytes = 1;
            break;
        case OPT_BUCKET:
            if (parse_int("--bucket-mb", optarg, 1, 1 << 20, &cl->bucket_mb) != 0)
                return -1;
            cl->have_bucket = 1;
            break;
        case OPT_ITERS:
            if (parse_int("--iters", optarg, 1, 1000000, &o->iters) != 0)
                return -1;
            break;
        case OPT_WARMUP:
            if (parse_int("--warmup", optarg, 0, 1000000, &o->warmup) != 0)
                return -1;
            break;
        case OPT_PARAMS:
            if (parse_int("--params", optarg, 1, MAX_PARAMS, &o->params) != 0)
                return -1;
            cl->have_params = 1;
            break;
        case OPT_MODEL:
            if (!bench_model_shape_known(optarg)) {
                fprintf(stderr, PROG ": --model-shape: unknown shape '%s' (expected one of %s)\n",
                        optarg, bench_model_shape_names());
                return -1;
            }
            o->model_shape = optarg;
            break;
        case OPT_SENDERS:
            if (parse_int("--senders", optarg, 1, MODEL_MAX_RANKS, &o->senders) != 0)
                return -1;
            cl->have_layout = 1;
            break;
        case OPT_TP:
            if (parse_int("--tp", optarg, 1, MODEL_MAX_RANKS, &o->tp) != 0)
                return -1;
            cl->have_layout = cl->have_tp = 1;
            break;
        case OPT_FUSED: o->fused_experts = 1; cl->have_layout = 1; break;
        case OPT_EP:
            if (parse_int("--ep", optarg, 1, MODEL_MAX_RANKS, &o->ep) != 0)
                return -1;
            cl->have_layout = 1;
            break;
        case OPT_REPLICAS:
            if (parse_int("--replicas", optarg, 1, MODEL_MAX_RANKS, &o->replicas) != 0)
                return -1;
            cl->have_layout = 1;
            break;
        case OPT_COLOCATED: o->colocated = 1; cl->have_layout = 1; break;
        case OPT_QUANT: cl->quant = optarg; break;
        case OPT_FP8_WIRE:
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0 &&
                strcmp(optarg, "always") != 0)
                return bad_option("--fp8-wire", "'%s' is not on, off or always", optarg);
            o->fp8_wire = strcmp(optarg, "on") == 0 ? 1 : strcmp(optarg, "always") == 0 ? 2 : 0;
            cl->quant_opts = 1;
            break;
        case OPT_TIMEOUT:
            if (parse_int("--timeout", optarg, 1, 7 * 24 * 3600, &o->timeout_s) != 0)
                return -1;
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_PIN: o->pin = 1; break;
        case OPT_DELTA: o->delta = 1; break;
        case OPT_LR: {
            char *end;
            errno = 0;
            double lr = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(lr > 0 && lr <= 1))
                return bad_option("--lr", "'%s' is not a learning rate in (0, 1]", optarg);
            o->lr = lr;
            cl->have_lr = 1;
            break;
        }
        case OPT_DELTA_MODE:
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "auto") != 0)
                return bad_option("--delta-mode", "'%s' is not on or auto", optarg);
            o->delta_mode = optarg;
            cl->have_lr = 1;
            break;
        case OPT_SOURCE:
            if (strcmp(optarg, "shared") == 0)
                o->private_mem = 0;
            else if (strcmp(optarg, "private") == 0)
                o->private_mem = 1;
            else {
                fprintf(stderr, PROG ": --source '%s': expected shared or private\n", optarg);
                return -1;
            }
            cl->source = optarg;
            break;
        case 'h': usage(stdout); return 1;
        case ':':
            fprintf(stderr, PROG ": option '%s' needs a value (see --help)\n", argv[optind - 1]);
            return -1;
        default:
            if (strncmp(argv[optind - 1], "--", 2) == 0 && strchr(argv[optind - 1], '='))
                fprintf(stderr, PROG ": option '%.*s' takes no value or is unknown (see --help)\n",
                        (int)(strchr(argv[optind - 1], '=') - argv[optind - 1]), argv[optind - 1]);
            else
                fprintf(stderr, PROG ": unknown option '%s' (see --help)\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    return 0;
}

/* The checks every run's options pass together: the scheme, the experts' layout, what --delta
 * goes with. 0 or -1 (reported). */
static int check_options(bench_opts_t *o, const cmdline_t *cl)
{
    if (!cl->scheme) {
        fprintf(stderr, PROG ": --scheme is required (ipc, nccl, store or auto)\n");
        return -1;
    }
    if (strcmp(cl->scheme, "ipc") != 0 && strcmp(cl->scheme, "auto") != 0 &&
        strcmp(cl->scheme, "store") != 0 && strcmp(cl->scheme, "nccl") != 0) {
        fprintf(stderr, PROG ": --scheme: unknown scheme '%s' (expected ipc, nccl, store or "
                        "auto)\n",
                cl->scheme);
        return -1;
    }
    if (o->model_shape && o->fused_experts && !bench_model_shape_is_moe(o->model_shape)) {
        fprintf(stderr, PROG ": --fused-experts: shape '%s' has no experts (MoE shapes: %s)\n",
                o->model_shape, bench_model_moe_shape_names());
        return -1;
    }
    if (o->model_shape && o->ep > 0) {
        /* the experts are split over the replica's own ranks (vLLM: EP = TP x DP, DP 1 here) */
        if (!cl->have_tp)
            o->tp = o->ep;
        if (o->ep != o->tp) {
            fprintf(stderr, PROG ": --ep %d with --tp %d: the experts are split over the TP "
                            "ranks of each replica, so E must equal T (vLLM's EP = TP x DP with "
                            "DP 1)\n",
                    o->ep, o->tp);
            return -1;
        }
        if (!bench_model_shape_is_moe(o->model_shape)) {
            fprintf(stderr, PROG ": --ep: shape '%s' has no experts (MoE shapes: %s)\n",
                    o->model_shape, bench_model_moe_shape_names());
            return -1;
        }
    }
    if (cl->have_lr && !o->delta) {
        fprintf(stderr, PROG ": --lr and --delta-mode: only with --delta\n");
        return -1;
    }
    if (o->delta && !o->model_shape) {
        fprintf(stderr, PROG ": --delta needs --model-shape (its updates step a model's params; "
                        "see --help)\n");
        return -1;
    }
    if (o->delta && cl->quant && strcmp(cl->quant, "none") != 0) {
        fprintf(stderr, PROG ": --delta with --quant %s: FP8 targets always take full bytes "
                        "(docs/delta.md); --delta runs bf16 targets\n",
                cl->quant);
        return -1;
    }
    if (o->delta && o->warmup < 1) {
        fprintf(stderr, PROG ": --delta with --warmup 0: version 1 always goes full (no "
                        "receiver holds a base yet), so it cannot be timed; use --warmup 1 or "
                        "more\n");
        return -1;
    }
    return 0;
}

/* The rest of a flat run's command line (no --model-shape); 0 or -1 (reported). */
static int parse_flat_options(bench_opts_t *o, const cmdline_t *cl)
{
    if (strcmp(cl->scheme, "nccl") == 0) {
        fprintf(stderr, PROG ": --scheme nccl needs --model-shape (GPU runs of a model's "
                        "shape; see --help)\n");
        return -1;
    }
    if (cl->have_layout || cl->quant || cl->quant_opts) {
        fprintf(stderr, PROG ": --senders, --tp, --ep, --fused-experts, --replicas, --colocated, "
                        "--quant and --fp8-wire need "
                        "--model-shape\n");
        return -1;
    }
    o->scheme = cl->scheme;
    o->store = strcmp(cl->scheme, "store") == 0;
    if (o->store) {
        if (!cl->transport) {
            fprintf(stderr, PROG ": --transport is required with --scheme store (ucx or ofi)\n");
            return -1;
        }
        if (strcmp(cl->transport, "ucx") != 0 && strcmp(cl->transport, "ofi") != 0) {
            fprintf(stderr, PROG ": --transport: unknown transport '%s' (expected ucx or ofi)\n",
                    cl->transport);
            return -1;
        }
        if (rma_ops(cl->transport) == NULL) {
            fprintf(stderr, PROG ": --transport %s: not compiled into this build (configure with "
                            "-DWSYNC_WITH_%s=ON; needs %s)\n",
                    cl->transport, strcmp(cl->transport, "ucx") == 0 ? "UCX" : "OFI",
                    strcmp(cl->transport, "ucx") == 0 ? "libucx-dev" : "libfabric-dev");
            return -1;
        }
        if (cl->source) {
            fprintf(stderr, PROG ": --source %s: only with --scheme ipc (the store publishes "
                            "snapshots: where the sender's weights live does not matter)\n",
                    cl->source);
            return -1;
        }
        if (cl->have_bucket) {
            fprintf(stderr, PROG ": --bucket-mb: only with --scheme ipc (the store stages "
                            "nothing in buckets)\n");
            return -1;
        }
        if (o->warmup + o->iters > MAX_VERSIONS) {
            fprintf(stderr, PROG ": --iters %d with --warmup %d: at most %d versions with "
                            "--scheme store\n",
                    o->iters, o->warmup, MAX_VERSIONS);
            return -1;
        }
        o->transport = cl->transport;
    } else if (o->pin) {
        fprintf(stderr, PROG ": --pin: only with --scheme store\n");
        return -1;
    } else if (cl->transport) {
        fprintf(stderr, PROG ": --transport %s: only with --scheme store (with --scheme %s the "
                        "library picks the transports)\n",
                cl->transport, cl->scheme);
        return -1;
    }
    if (!cl->mem) {
        fprintf(stderr, PROG ": --mem is required (host)\n");
        return -1;
    }
    if (strcmp(cl->mem, "cuda") == 0) {
        fprintf(stderr, PROG ": --mem cuda needs --model-shape (GPU runs move a model's "
                        "shape; see --help)\n");
        return -1;
    }
    if (strcmp(cl->mem, "host") != 0) {
        fprintf(stderr, PROG ": --mem: unknown memory kind '%s' (expected host or cuda)\n",
                cl->mem);
        return -1;
    }
    if (!cl->have_receivers) {
        fprintf(stderr, PROG ": --receivers is required\n");
        return -1;
    }
    if (!cl->have_bytes) {
        fprintf(stderr, PROG ": --bytes is required\n");
        return -1;
    }
    if (o->bytes % 2 != 0) {
        fprintf(stderr, PROG ": --bytes: %llu is odd; weights are bf16 (2 bytes each)\n",
                (unsigned long long)o->bytes);
        return -1;
    }
    if (o->bytes / 2 < (uint64_t)o->params) {
        fprintf(stderr, PROG ": --bytes %llu is too small for --params %d (each param needs at "
                        "least one bf16 element)\n",
                (unsigned long long)o->bytes, o->params);
        return -1;
    }
    if (o->bytes > (uint64_t)SIZE_MAX / 2) {
        fprintf(stderr, PROG ": --bytes %llu does not fit in memory\n",
                (unsigned long long)o->bytes);
        return -1;
    }
    o->bucket_bytes = (uint64_t)cl->bucket_mb << 20;
    o->have_bucket = cl->have_bucket;
    return 0;
}

/* Returns 0 to run, 1 when --help was asked, -1 on a bad command line (already reported). */
static int parse_options(int argc, char **argv, bench_opts_t *o)
{
    cmdline_t cl;
    int rc = read_options(argc, argv, o, &cl);
    if (rc == 0)
        rc = check_options(o, &cl);
    if (rc != 0)
        return rc;
    if (o->model_shape)
        return parse_model_options(o, cl.scheme, cl.mem, cl.transport, cl.quant,
                                   cl.have_receivers, cl.have_bytes || cl.have_params || cl.source,
                                   cl.have_bucket, cl.bucket_mb);
    return parse_flat_options(o, &cl);
}

/* ---------------------------------------------------------------------------------------- */
/* The model: params, their data and their hashes                                             */
/* ---------------------------------------------------------------------------------------- */

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Splits bytes/2 elements over P params (the first ones take the remainder), each a matrix
 * [elements / cols, cols] with cols the largest divisor of its size up to 4096. */
static bench_param_t *make_params(const bench_opts_t *o)
{
    bench_param_t *p = calloc((size_t)o->params, sizeof(*p));
    if (!p)
        return NULL;
    uint64_t elems = o->bytes / 2, each = elems / (uint64_t)o->params;
    uint64_t extra = elems % (uint64_t)o->params;
    size_t offset = 0;
    for (int i = 0; i < o->params; i++) {
        uint64_t n = each + ((uint64_t)i < extra ? 1 : 0);
        snprintf(p[i].name, sizeof(p[i].name), "bench.layers.%d.weight", i);
        p[i].cols = (int64_t)gcd_u64(n, 4096);
        p[i].rows = (int64_t)(n / (uint64_t)p[i].cols);
        p[i].offset = offset;
        p[i].bytes = (size_t)n * 2;
        offset += p[i].bytes;
    }
    return p;
}

static wsync_param_t param_desc(const bench_param_t *p)
{
    return (wsync_param_t){.name = p->name, .dtype = WSYNC_DTYPE_BF16, .ndim = 2,
                           .shape = {p->rows, p->cols}};
}

/* Non-zero, finite bf16 values (|x| in [2^-15, 2^17)) from a xorshift64 stream. */
static void fill_bf16(uint16_t *dst, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i += 4) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        uint64_t r = s;
        for (size_t k = 0; k < 4 && i + k < n; k++, r >>= 16) {
            uint16_t v = (uint16_t)r;
            uint16_t exponent = (uint16_t)(112 + ((v >> 7) & 0x1F));
            dst[i + k] = (uint16_t)((v & 0x8000) | (exponent << 7) | (v & 0x7F));
        }
    }
}

static void *alloc_block(size_t bytes)
{
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    return aligned_alloc(4096, rounded ? rounded : 4096);
}

/* ---------------------------------------------------------------------------------------- */
/* Baseline: one core's memcpy                                                                */
/* ---------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median GB/s of single-threaded memcpy of `bytes` between pre-touched buffers; each sample
 * repeats small copies so that it lasts long enough to time. 0 on allocation failure. */
double bench_memcpy_gbps(size_t bytes)
{
    enum { SAMPLES = 5 };
    char *src = alloc_block(bytes), *dst = alloc_block(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0.0;
    }
    memset(src, 0x5A, bytes);
    memset(dst, 0, bytes);
    size_t reps = bytes >= (64u << 20) ? 1 : (64u << 20) / bytes;
    memcpy(dst, src, bytes); /* one untimed copy */
    double gbps[SAMPLES];
    for (int s = 0; s < SAMPLES; s++) {
        double t0 = bench_now_s();
        for (size_t r = 0; r < reps; r++) {
            memcpy(dst, src, bytes);
            __asm__ volatile("" : : "r"(dst) : "memory"); /* keep every copy */
        }
        double dt = bench_now_s() - t0;
        gbps[s] = (double)bytes * (double)reps / dt / 1e9;
    }
    free(src);
    free(dst);
    qsort(gbps, SAMPLES, sizeof(double), cmp_double);
    return gbps[SAMPLES / 2];
}

/* ---------------------------------------------------------------------------------------- */
/* Children                                                                                   */
/* ---------------------------------------------------------------------------------------- */

int bench_wsync_failed(const char *who, const char *call, wsync_status_t st)
{
    fprintf(stderr, PROG ": %s: %s failed: %s (%s)\n", who, call, wsync_status_name(st),
            wsync_last_error());
    return 1;
}

int bench_push(const char *who, wsync_sender_t *sender, int v, double *dt)
{
    const double t0 = bench_now_s();
    const wsync_status_t st = wsync_sender_push(sender, (uint64_t)v);
    *dt = bench_now_s() - t0;
    if (st != WSYNC_OK) {
        char call[64];
        snprintf(call, sizeof(call), "wsync_sender_push(version %d)", v);
        return bench_wsync_failed(who, call, st);
    }
    return 0;
}

/* One target per param, one piece covering it, in `block` at the param's offset. */
static int add_targets(const char *who, wsync_receiver_t *receiver, const bench_param_t *params,
                       int nparams, char *block)
{
    wsync_status_t st;
    for (int i = 0; i < nparams; i++) {
        wsync_piece_t piece = {
            .param = param_desc(&params[i]),
            .src = {.start = {0, 0}, .len = {params[i].rows, params[i].cols}},
            .dst_start = {0, 0},
        };
        wsync_target_t target = {
            .name = params[i].name,
            .dtype = WSYNC_DTYPE_BF16,
            .ndim = 2,
            .shape = {params[i].rows, params[i].cols},
            .data = block + params[i].offset,
            .mem = WSYNC_MEM_HOST,
            .pieces = &piece,
            .npieces = 1,
        };
        if ((st = wsync_receiver_add_target(receiver, &target)) != WSYNC_OK)
            return bench_wsync_failed(who, "wsync_receiver_add_target", st);
    }
    return 0;
}

/* Compares each param's xxh3 with the sender's; 0 when all match. */
static int verify(const char *who, uint64_t version, const bench_param_t *params, int nparams,
                  const char *block, const bench_shared_t *shared)
{
    if (!atomic_load_explicit(&shared->ready, memory_order_acquire)) {
        fprintf(stderr, PROG ": %s: got version %llu but the sender's hashes are missing\n", who,
                (unsigned long long)version);
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < nparams; i++) {
        uint64_t h = XXH3_64bits(block + params[i].offset, params[i].bytes);
        if (h != shared->hash[i]) {
            if (bad < 5)
                fprintf(stderr,
                        PROG ": %s: version %llu: param %s (%zu bytes) has xxh3 %016llx, the "
                             "sender's is %016llx\n",
                        who, (unsigned long long)version, params[i].name, params[i].bytes,
                        (unsigned long long)h, (unsigned long long)shared->hash[i]);
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr, PROG ": %s: %d of %d params differ from the sender's\n", who, bad,
                nparams);
        return 1;
    }
    return 0;
}

/* Sender: rank 0 of 1 and the coordinator. Timings go to res_fd as text lines:
 * "scheme NAME", one "time SECONDS" per timed push, then "end". */
static int run_sender(const bench_opts_t *o, const char *coordinator, int res_fd,
                      bench_shared_t *shared)
{
    const char *who = "sender";
    int rc = 1;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *sender = NULL;
    bench_param_t *params = make_params(o);
    char *block = NULL;
    wsync_status_t st;

    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    /* shared: weights in wsync_mem_alloc memory, which receivers read in place (how a trainer
     * keeping host weights for sync would allocate them); private: malloc'd, staged in buckets */
    if (o->private_mem)
        block = alloc_block((size_t)o->bytes);
    else if (wsync_mem_alloc(ctx, (size_t)o->bytes, (void **)&block) != WSYNC_OK)
        block = NULL;
    if (!params || !block) {
        fprintf(stderr, PROG ": sender: cannot allocate %llu bytes of weights\n",
                (unsigned long long)o->bytes);
        goto out;
    }

    /* The coordinator listens first, so receivers connect while the weights are made. */
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    sp.coordinator = coordinator;
    sp.delta = "off"; /* the versions repeat the same bytes: full versions are what is timed */
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = o->receivers;
    sp.scheme = o->scheme;
    sp.bucket_bytes = (size_t)o->bucket_bytes;
    if ((st = wsync_sender_create(ctx, &sp, &sender)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_sender_create", st);
        goto out;
    }

    for (int i = 0; i < o->params; i++) {
        uint16_t *data = (uint16_t *)(block + params[i].offset);
        fill_bf16(data, params[i].bytes / 2, (uint64_t)i + 1);
        shared->hash[i] = XXH3_64bits(data, params[i].bytes);
        wsync_shard_t shard = {
            .param = param_desc(&params[i]),
            .box = {.start = {0, 0}, .len = {params[i].rows, params[i].cols}},
            .data = data,
            .mem = WSYNC_MEM_HOST,
        };
        if ((st = wsync_sender_add_shard(sender, &shard)) != WSYNC_OK) {
            rc = bench_wsync_failed(who, "wsync_sender_add_shard", st);
            goto out;
        }
    }
    atomic_store_explicit(&shared->ready, 1, memory_order_release);

    if ((st = wsync_sender_setup(sender)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_sender_setup", st);
        goto out;
    }
    const char *chosen = wsync_sender_scheme(sender);
    dprintf(res_fd, "scheme %s\n", chosen ? chosen : "?");

    int total = o->warmup + o->iters;
    for (int v = 1; v <= total; v++) {
        double dt;
        if (bench_push(who, sender, v, &dt) != 0)
            goto out;
        int timed = v > o->warmup;
        fprintf(stderr, PROG ": push %d/%d %s %.4f s, %.3f GB/s per receiver\n", v, total,
                timed ? "timed " : "warmup", dt, (double)o->bytes / dt / 1e9);
        if (timed)
            dprintf(res_fd, "time %.9f\n", dt);
    }
    dprintf(res_fd, "end\n");
    rc = 0;
out:
    wsync_sender_free(sender);
    if (o->private_mem)
        free(block);
    else
        wsync_mem_free(ctx, block);
    wsync_ctx_free(ctx);
    free(params);
    return rc;
}

/* Receiver `rank`: one target per param, one piece covering it; waits for the last version,
 * then compares each param's xxh3 with the sender's. */
static int run_receiver(const bench_opts_t *o, const char *coordinator, int rank,
                        const bench_shared_t *shared)
{
    char who[32];
    snprintf(who, sizeof(who), "receiver %d", rank);
    int rc = 1;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *receiver = NULL;
    bench_param_t *params = make_params(o);
    char *block = alloc_block((size_t)o->bytes);
    wsync_status_t st;
    if (!params || !block) {
        fprintf(stderr, PROG ": %s: cannot allocate %llu bytes of targets\n", who,
                (unsigned long long)o->bytes);
        goto out;
    }
    memset(block, 0, (size_t)o->bytes); /* touched, and wrong until wsync fills it */

    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = coordinator;
    rp.delta = "off";
    rp.rank = rank;
    rp.nreceivers = o->receivers;
    if ((st = wsync_receiver_create(ctx, &rp, &receiver)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_receiver_create", st);
        goto out;
    }
    if (add_targets(who, receiver, params, o->params, block) != 0)
        goto out;

    /* A timeout only means no version began yet (the sender may still be making its weights);
     * the parent's deadline bounds the whole run. */
    uint64_t last = (uint64_t)(o->warmup + o->iters), version = 0;
    while (version < last) {
        st = wsync_receiver_wait(receiver, -1, &version);
        if (st == WSYNC_ERR_TIMEOUT)
            continue;
        if (st != WSYNC_OK) {
            rc = bench_wsync_failed(who, "wsync_receiver_wait", st);
            goto out;
        }
    }

    if (verify(who, version, params, o->params, block, shared) != 0)
        goto out;
    rc = 0;
out:
    wsync_receiver_free(receiver);
    wsync_ctx_free(ctx);
    free(block);
    free(params);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Store baseline: the same transport without wsync                                           */
/* ---------------------------------------------------------------------------------------- */

/* What the owner tells each reader, over their socketpair. */
typedef struct {
    uint64_t base, len, hash;
    uint32_t addr_len, key_len;
    uint8_t addr[WSYNC_RMA_BLOB_MAX], key[WSYNC_RMA_BLOB_MAX];
} raw_hello_t;

/* The same provider hint as the store's (store.c passes WSYNC_STORE_PROVIDER to open). */
static const char *raw_hint(void)
{
    return getenv("WSYNC_STORE_PROVIDER");
}

static int io_all(int fd, void *p, size_t n, int writing)
{
    for (uint8_t *b = p; n > 0;) {
        ssize_t r = writing ? write(fd, b, n) : read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

static int rma_failed(const char *who, const char *call, wsync_status_t st)
{
    fprintf(stderr, PROG ": %s: %s failed: %s (%s)\n", who, call, wsync_status_name(st),
            wsync_last_error());
    return 1;
}

/* Owner: registers N bytes of bf16 values, hands its address, the region and the packed key to
 * every reader, and stays (its transport thread serving the reads) until each said it is done. */
static int raw_owner(const bench_opts_t *o, const int *fds)
{
    const char *who = "raw owner";
    const wsync_rma_ops_t *ops = rma_ops(o->transport);
    size_t n = (size_t)o->bytes;
    wsync_rma_t *ctx = NULL;
    wsync_rma_mr_t *mr = NULL;
    wsync_status_t st;
    int rc = 1;
    raw_hello_t *h = calloc(1, sizeof(*h));
    uint8_t *region = alloc_block(n);
    if (!h || !region) {
        fprintf(stderr, PROG ": %s: cannot allocate %zu bytes\n", who, n);
        goto out;
    }
    fill_bf16((uint16_t *)region, n / 2, 0xB45E);
    size_t alen = sizeof(h->addr), klen = sizeof(h->key);
    if ((st = ops->open(raw_hint(), NULL, 0, &ctx)) != WSYNC_OK) {
        rc = rma_failed(who, "open", st);
        goto out;
    }
    if ((st = ops->address(ctx, h->addr, &alen)) != WSYNC_OK) {
        rc = rma_failed(who, "address", st);
        goto out;
    }
    if ((st = ops->reg(ctx, region, n, &mr, h->key, &klen)) != WSYNC_OK) {
        rc = rma_failed(who, "reg", st);
        goto out;
    }
    h->base = (uint64_t)(uintptr_t)region;
    h->len = n;
    h->hash = XXH3_64bits(region, n);
    h->addr_len = (uint32_t)alen;
    h->key_len = (uint32_t)klen;
    for (int r = 0; r < o->receivers; r++) {
        if (io_all(fds[r], h, sizeof(*h), 1) != 0) {
            fprintf(stderr, PROG ": %s: cannot reach raw reader %d: %s\n", who, r,
                    strerror(errno));
            goto out;
        }
    }
    for (int r = 0; r < o->receivers; r++) {
        char done;
        if (io_all(fds[r], &done, 1, 0) != 0) {
            fprintf(stderr, PROG ": %s: raw reader %d went away before it was done\n", who, r);
            goto out;
        }
    }
    rc = 0;
out:
    if (mr)
        ops->dereg(mr);
    if (ctx)
        ops->close(ctx);
    free(region);
    free(h);
    return rc;
}

/* Reader `rank`: connects to the owner, then for every round k (warmup + iters of them), once
 * the store's version k is fetched (round 0: at once) and together with the other readers (a
 * barrier on the shared page), gets all N bytes in 1 MiB gets, all in flight, and flushes; the
 * rounds' seconds go to the shared page. Checks the bytes at the end. */
static int raw_reader(const bench_opts_t *o, int fd, int rank, bench_shared_t *shared,
                      const bench_store_shm_t *ss)
{
    char who[32];
    snprintf(who, sizeof(who), "raw reader %d", rank);
    const wsync_rma_ops_t *ops = rma_ops(o->transport);
    size_t n = (size_t)o->bytes;
    wsync_rma_t *ctx = NULL;
    wsync_rma_peer_t *peer = NULL;
    wsync_rma_rkey_t *key = NULL;
    wsync_status_t st;
    char info[256] = "";
    int rc = 1;
    raw_hello_t *h = calloc(1, sizeof(*h));
    uint8_t *dst = alloc_block(n);
    if (!h || !dst) {
        fprintf(stderr, PROG ": %s: cannot allocate %zu bytes\n", who, n);
        goto out;
    }
    memset(dst, 0, n); /* fault the pages in before timing */
    if (io_all(fd, h, sizeof(*h), 0) != 0) {
        fprintf(stderr, PROG ": %s: the owner sent no address\n", who);
        goto out;
    }
    if (h->len != n || h->addr_len > sizeof(h->addr) || h->key_len > sizeof(h->key)) {
        fprintf(stderr, PROG ": %s: malformed offer from the owner\n", who);
        goto out;
    }
    if ((st = ops->open(raw_hint(), info, sizeof(info), &ctx)) != WSYNC_OK) {
        rc = rma_failed(who, "open", st);
        goto out;
    }
    if (rank == 0)
        snprintf(shared->raw_info, sizeof(shared->raw_info), "%s", info);
    if ((st = ops->connect(ctx, h->addr, h->addr_len, &peer)) != WSYNC_OK) {
        rc = rma_failed(who, "connect", st);
        goto out;
    }
    if ((st = ops->rkey_import(peer, h->key, h->key_len, &key)) != WSYNC_OK) {
        rc = rma_failed(who, "rkey_import", st);
        goto out;
    }
    int rounds = o->warmup + o->iters;
    for (int run = 0; run < rounds; run++) {
        /* interleaved: raw round k after the store's version k, before its version k + 1 */
        if (run > 0) {
            bench_wait_at_least(&ss->fetched[run], o->receivers);
            memset(dst, 0, n); /* so that the last run's bytes are its own */
        }
        bench_count_up(&ss->raw_arrived[run]);
        bench_wait_at_least(&ss->raw_arrived[run], o->receivers);
        double t0 = bench_now_s();
        for (size_t off = 0; off < n; off += RAW_GET_BYTES) {
            size_t len = n - off < RAW_GET_BYTES ? n - off : RAW_GET_BYTES;
            if ((st = ops->get(peer, key, h->base + off, dst + off, len)) != WSYNC_OK) {
                rc = rma_failed(who, "get", st);
                ops->flush(ctx, rma_deadline_in(o->timeout_s)); /* nothing left in flight */
                goto out;
            }
        }
        if ((st = ops->flush(ctx, rma_deadline_in(o->timeout_s))) != WSYNC_OK) {
            rc = rma_failed(who, "flush", st);
            goto out;
        }
        double dt = bench_now_s() - t0;
        ss->raw_s[(size_t)run * (size_t)o->receivers + (size_t)rank] = dt;
        bench_count_up(&ss->raw_done[run]);
        fprintf(stderr, PROG ": %s: run %d/%d %s %.4f s, %.3f GB/s\n", who, run + 1, rounds,
                run >= o->warmup ? "timed " : "warmup", dt, (double)n / dt / 1e9);
    }
    if (XXH3_64bits(dst, n) != h->hash) {
        fprintf(stderr, PROG ": %s: the bytes read differ from the owner's (xxh3)\n", who);
        goto out;
    }
    char done = 'd';
    if (io_all(fd, &done, 1, 1) != 0) {
        fprintf(stderr, PROG ": %s: the owner went away\n", who);
        goto out;
    }
    rc = 0;
out:
    if (key)
        ops->rkey_free(key);
    if (peer)
        ops->disconnect(peer);
    if (ctx)
        ops->close(ctx);
    free(dst);
    free(h);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Store: one publisher, R readers                                                            */
/* ---------------------------------------------------------------------------------------- */

/* Store sender: rank 0 of 1, the coordinator and the store. Publishes version v once every
 * receiver fetched v - 1 and every raw reader ended round v - 1 (so that no snapshot copy
 * overlaps a timed read), then stays, as the store, until every receiver is done. Lines to res_fd: "scheme NAME", one "publish SECONDS"
 * per timed version, then "end". */
static int store_sender(const bench_opts_t *o, const char *coordinator, int res_fd,
                        bench_shared_t *shared, const bench_store_shm_t *ss)
{
    const char *who = "sender";
    int rc = 1;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *sender = NULL;
    bench_param_t *params = make_params(o);
    char *block = alloc_block((size_t)o->bytes);
    wsync_status_t st;

    setenv("WSYNC_STORE_TRANSPORT", o->transport, 1); /* before any wsync object */
    if (!params || !block) {
        fprintf(stderr, PROG ": sender: cannot allocate %llu bytes of weights\n",
                (unsigned long long)o->bytes);
        goto out;
    }
    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    sp.coordinator = coordinator;
    sp.delta = "off"; /* the versions repeat the same bytes: full versions are what is timed */
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = o->receivers;
    sp.scheme = "store";
    sp.snapshot = 1;
    sp.keep_versions = STORE_KEEP_VERSIONS;
    if ((st = wsync_sender_create(ctx, &sp, &sender)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_sender_create", st);
        goto out;
    }
    for (int i = 0; i < o->params; i++) {
        uint16_t *data = (uint16_t *)(block + params[i].offset);
        fill_bf16(data, params[i].bytes / 2, (uint64_t)i + 1);
        shared->hash[i] = XXH3_64bits(data, params[i].bytes);
        wsync_shard_t shard = {
            .param = param_desc(&params[i]),
            .box = {.start = {0, 0}, .len = {params[i].rows, params[i].cols}},
            .data = data,
            .mem = WSYNC_MEM_HOST,
        };
        if ((st = wsync_sender_add_shard(sender, &shard)) != WSYNC_OK) {
            rc = bench_wsync_failed(who, "wsync_sender_add_shard", st);
            goto out;
        }
    }
    atomic_store_explicit(&shared->ready, 1, memory_order_release);
    if ((st = wsync_sender_setup(sender)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_sender_setup", st);
        goto out;
    }
    const char *chosen = wsync_sender_scheme(sender);
    dprintf(res_fd, "scheme %s\n", chosen ? chosen : "?");

    int total = o->warmup + o->iters;
    for (int v = 1; v <= total; v++) {
        if (v > 1)
            bench_wait_at_least(&ss->fetched[v - 1], o->receivers);
        /* interleaved: version v after raw round v - 1 (its snapshot copy overlaps neither) */
        bench_wait_at_least(&ss->raw_done[v - 1], o->receivers);
        double dt;
        if (bench_push(who, sender, v, &dt) != 0)
            goto out;
        atomic_store_explicit(&shared->published, v, memory_order_release);
        bench_wake_all(&shared->published);
        int timed = v > o->warmup;
        fprintf(stderr, PROG ": sender: published %d/%d %s in %.4f s\n", v, total,
                timed ? "(timed) " : "(warmup)", dt);
        if (timed)
            dprintf(res_fd, "publish %.9f\n", dt);
    }
    /* the store lives in this process: stay until every receiver has left */
    bench_wait_at_least(&shared->done, o->receivers);
    dprintf(res_fd, "end\n");
    rc = 0;
out:
    wsync_sender_free(sender);
    wsync_ctx_free(ctx);
    free(block);
    free(params);
    return rc;
}

/* Store receiver `rank`: for each version, once it is published, times
 * wsync_receiver_fetch(version) into its targets; checks the bytes after the last one. */
static int store_receiver(const bench_opts_t *o, const char *coordinator, int rank,
                          bench_shared_t *shared, const bench_store_shm_t *ss)
{
    char who[32];
    snprintf(who, sizeof(who), "receiver %d", rank);
    int rc = 1;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *receiver = NULL;
    bench_param_t *params = make_params(o);
    char *block = alloc_block((size_t)o->bytes);
    wsync_status_t st;
    uint64_t got = 0;

    setenv("WSYNC_STORE_TRANSPORT", o->transport, 1); /* before any wsync object */
    if (!params || !block) {
        fprintf(stderr, PROG ": %s: cannot allocate %llu bytes of targets\n", who,
                (unsigned long long)o->bytes);
        goto out;
    }
    memset(block, 0, (size_t)o->bytes); /* touched, and wrong until wsync fills it */
    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = coordinator;
    rp.delta = "off";
    rp.rank = rank;
    rp.nreceivers = o->receivers;
    if ((st = wsync_receiver_create(ctx, &rp, &receiver)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_receiver_create", st);
        goto out;
    }
    if (add_targets(who, receiver, params, o->params, block) != 0)
        goto out;

    int total = o->warmup + o->iters;
    for (int v = 1; v <= total; v++) {
        bench_wait_at_least(&shared->published, v);
        double t0 = bench_now_s();
        st = wsync_receiver_fetch(receiver, (uint64_t)v, -1, &got);
        double dt = bench_now_s() - t0;
        if (st != WSYNC_OK) {
            char call[64];
            snprintf(call, sizeof(call), "wsync_receiver_fetch(version %d)", v);
            rc = bench_wsync_failed(who, call, st);
            goto out;
        }
        if (got != (uint64_t)v) {
            fprintf(stderr, PROG ": %s: asked for version %d, got %llu\n", who, v,
                    (unsigned long long)got);
            goto out;
        }
        ss->fetch_s[(size_t)(v - 1) * (size_t)o->receivers + (size_t)rank] = dt;
        bench_count_up(&ss->fetched[v]);
        fprintf(stderr, PROG ": %s: fetch %d/%d %s %.4f s, %.3f GB/s\n", who, v, total,
                v > o->warmup ? "timed " : "warmup", dt, (double)o->bytes / dt / 1e9);
    }
    if (verify(who, got, params, o->params, block, shared) != 0)
        goto out;
    rc = 0;
out:
    wsync_receiver_free(receiver);
    wsync_ctx_free(ctx);
    free(block);
    free(params);
    if (rc == 0) /* left the group: the sender may go */
        bench_count_up(&shared->done);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Parent                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* A free TCP port on 127.0.0.1 (bind port 0, read it back, close); 0 on failure. */
static int pick_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    int port = 0;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}

/* "127.0.0.1:PORT" on a free port, picked just before the children that use it start; 0 on
 * success. */
int bench_make_coordinator(char *buf, size_t len)
{
    int port = pick_port();
    if (port == 0) {
        fprintf(stderr, PROG ": cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
        return -1;
    }
    snprintf(buf, len, "127.0.0.1:%d", port);
    return 0;
}

static int child_ok(const bench_child_t *c)
{
    return c->done && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
}

static void describe_exit(const bench_child_t *c, char *buf, size_t len)
{
    if (WIFEXITED(c->status))
        snprintf(buf, len, "%s (pid %d) exited with status %d", c->name, (int)c->pid,
                 WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        snprintf(buf, len, "%s (pid %d) was killed by signal %d (%s)", c->name, (int)c->pid,
                 WTERMSIG(c->status), strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, len, "%s (pid %d) stopped", c->name, (int)c->pid);
}

/* Reaps whatever has exited; returns how many children are still running. */
static int reap(bench_child_t *kids, int n)
{
    int running = 0;
    for (int i = 0; i < n; i++) {
        if (kids[i].done)
            continue;
        pid_t r = waitpid(kids[i].pid, &kids[i].status, WNOHANG);
        if (r == kids[i].pid)
            kids[i].done = 1;
        else
            running++;
    }
    return running;
}

static void kill_all(bench_child_t *kids, int n)
{
    for (int i = 0; i < n; i++)
        if (!kids[i].done && kids[i].pid > 0)
            kill(kids[i].pid, SIGKILL);
    for (int i = 0; i < n; i++)
        if (!kids[i].done && kids[i].pid > 0 && waitpid(kids[i].pid, &kids[i].status, 0) > 0)
            kids[i].done = 1;
}

/* Appends what the pipe holds to *buf; returns 1 at end of file, 0 otherwise, -1 on error. */
static int drain(int fd, char **buf, size_t *len, size_t *cap)
{
    for (;;) {
        if (*cap - *len < 4096) {
            size_t ncap = *cap ? *cap * 2 : 65536;
            char *nb = realloc(*buf, ncap);
            if (!nb)
                return -1;
            *buf = nb;
            *cap = ncap;
        }
        ssize_t r = read(fd, *buf + *len, *cap - *len - 1);
        if (r > 0) {
            *len += (size_t)r;
            (*buf)[*len] = '\0';
            continue;
        }
        if (r == 0)
            return 1;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN ? 0 : -1;
    }
}

/* Forks kids[0..n) (their names already set), each running body(i, ...) and exiting with its
 * result, then watches them: collects what they write to the result pipe into *text, reaps them,
 * and enforces the deadline (bench_now_s() clock). Returns 0 once all exited 0 and the pipe is at its
 * end; otherwise names the failures, kills the rest and returns 1. */
int bench_run_group(bench_child_t *kids, int n, bench_body_fn body, void *arg, double deadline,
                     int timeout_s, char **text)
{
    int res_pipe[2];
    if (pipe(res_pipe) != 0) {
        fprintf(stderr, PROG ": pipe failed: %s\n", strerror(errno));
        return 1;
    }
    pid_t parent = getpid();
    for (int i = 0; i < n; i++) {
        fflush(NULL); /* nothing buffered is written twice */
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, PROG ": fork of %s failed: %s\n", kids[i].name, strerror(errno));
            kill_all(kids, i);
            close(res_pipe[0]);
            close(res_pipe[1]);
            return 1;
        }
        if (pid == 0) {
            /* Die with the parent rather than linger holding ports and shared memory. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
            close(res_pipe[0]);
            int rc = body(i, res_pipe[1], arg);
            fflush(NULL);
            _exit(rc);
        }
        kids[i].pid = pid;
    }
    close(res_pipe[1]);
    /* Non-blocking, so that reading never keeps the parent from its deadline. */
    fcntl(res_pipe[0], F_SETFL, fcntl(res_pipe[0], F_GETFL) | O_NONBLOCK);

    size_t text_len = 0, text_cap = 0;
    int eof = 0;
    *text = NULL;
    for (;;) {
        if (!eof) {
            struct pollfd pfd = {.fd = res_pipe[0], .events = POLLIN};
            if (poll(&pfd, 1, 100) > 0) {
                int d = drain(res_pipe[0], text, &text_len, &text_cap);
                if (d != 0)
                    eof = 1; /* end of file, or an error that the caller's parse reports */
            }
        } else {
            usleep(100 * 1000);
        }
        int running = reap(kids, n), failed = 0;
        for (int i = 0; i < n; i++)
            if (kids[i].done && !child_ok(&kids[i]))
                failed = 1;
        if (failed) {
            usleep(300 * 1000); /* let the others that are failing too be reaped and named */
            reap(kids, n);
            for (int i = 0; i < n; i++) {
                if (kids[i].done && !child_ok(&kids[i])) {
                    char why[160];
                    describe_exit(&kids[i], why, sizeof(why));
                    fprintf(stderr, PROG ": %s\n", why);
                }
            }
            for (int i = 0; i < n; i++)
                if (!kids[i].done)
                    fprintf(stderr, PROG ": killing %s (pid %d)\n", kids[i].name,
                            (int)kids[i].pid);
            kill_all(kids, n);
            close(res_pipe[0]);
            return 1;
        }
        if (running == 0 && eof)
            break;
        if (bench_now_s() > deadline) {
            for (int i = 0; i < n; i++)
                if (!kids[i].done)
                    fprintf(stderr, PROG ": timeout after %d s: %s (pid %d) still running, "
                                    "killed\n",
                            timeout_s, kids[i].name, (int)kids[i].pid);
            kill_all(kids, n);
            close(res_pipe[0]);
            return 1;
        }
    }
    close(res_pipe[0]);
    return 0;
}

typedef struct {
    char scheme[32];
    double *times;
    int ntimes;
} bench_result_t;

/* Parses a sender's lines ("scheme NAME", "<key> SECONDS" per timed version, "end"); 0 when
 * complete. */
static int parse_result(char *text, const char *key, int iters, bench_result_t *res)
{
    int ended = 0;
    size_t klen = strlen(key);
    res->times = calloc((size_t)iters, sizeof(double));
    if (!res->times)
        return -1;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        double t;
        if (strncmp(line, "scheme ", 7) == 0)
            snprintf(res->scheme, sizeof(res->scheme), "%s", line + 7);
        else if (strncmp(line, key, klen) == 0 && line[klen] == ' ' &&
                 sscanf(line + klen, "%lf", &t) == 1 && res->ntimes < iters)
            res->times[res->ntimes++] = t;
        else if (strcmp(line, "end") == 0)
            ended = 1;
    }
    return ended && res->ntimes == iters ? 0 : -1;
}

bench_stats_t bench_stats_of(const double *v, int n)
{
    bench_stats_t s = {0, 0, 0};
    double *sorted = malloc((size_t)n * sizeof(double));
    if (!sorted || n <= 0) {
        free(sorted);
        return s;
    }
    memcpy(sorted, v, (size_t)n * sizeof(double));
    qsort(sorted, (size_t)n, sizeof(double), cmp_double);
    s.median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    s.min = sorted[0];
    s.max = sorted[n - 1];
    free(sorted);
    return s;
}

void bench_print_json(json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(j);
}

json_t *bench_json_reals(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_real(v[i]));
    return a;
}

static void report_ipc(const bench_opts_t *o, const bench_result_t *res, double baseline)
{
    int n = res->ntimes;
    bench_stats_t t = bench_stats_of(res->times, n);
    double median = t.median, tmin = t.min, tmax = t.max;
    double gb = (double)o->bytes / 1e9;
    double gbps = gb / median, ratio = baseline > 0 ? gbps / baseline : 0.0;

    printf("%s: scheme %s, mem host (%s), %d receiver%s, %llu bytes in %d bf16 params, bucket "
           "%.0f MiB, %d timed pushes after %d warmup\n",
           PROG, res->scheme, o->private_mem ? "private, staged" : "shared, read in place",
           o->receivers, o->receivers == 1 ? "" : "s",
           (unsigned long long)o->bytes, o->params, (double)o->bucket_bytes / MIB, o->iters,
           o->warmup);
    printf("  push seconds        median %.6f   min %.6f   max %.6f\n", median, tmin, tmax);
    printf("  GB/s per receiver   median %.4g   max %.4g   min %.4g\n", gbps, gb / tmin,
           gb / tmax);
    printf("  memcpy, 1 core      %.4g GB/s\n", baseline);
    printf("  ratio               %.4g  (per-receiver GB/s / memcpy GB/s)\n", ratio);

    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "scheme", json_string(res->scheme));
        json_object_set_new(j, "mem", json_string("host"));
        json_object_set_new(j, "source", json_string(o->private_mem ? "private" : "shared"));
        json_object_set_new(j, "receivers", json_integer(o->receivers));
        json_object_set_new(j, "bytes", json_integer((json_int_t)o->bytes));
        json_object_set_new(j, "params", json_integer(o->params));
        json_object_set_new(j, "dtype", json_string("bf16"));
        json_object_set_new(j, "bucket_bytes", json_integer((json_int_t)o->bucket_bytes));
        json_object_set_new(j, "iters", json_integer(o->iters));
        json_object_set_new(j, "warmup", json_integer(o->warmup));
        json_object_set_new(j, "seconds", json_real(median));
        json_object_set_new(j, "seconds_min", json_real(tmin));
        json_object_set_new(j, "seconds_max", json_real(tmax));
        json_object_set_new(j, "gbps_per_receiver", json_real(gbps));
        json_object_set_new(j, "gbps_per_receiver_min", json_real(gb / tmax));
        json_object_set_new(j, "gbps_per_receiver_max", json_real(gb / tmin));
        json_object_set_new(j, "baseline_gbps", json_real(baseline));
        json_object_set_new(j, "baseline", json_string("memcpy, 1 core"));
        json_object_set_new(j, "ratio", json_real(ratio));
        json_object_set_new(j, "times", bench_json_reals(res->times, n));
        bench_print_json(j);
    }
    fflush(stdout);
}

/* Median over rounds of the slowest of the R samples of a round (v: rounds x R, round-major):
 * how long one round took until every receiver or reader had all its bytes. */
static double median_round(const double *v, int rounds, int R)
{
    double *slowest = malloc((size_t)rounds * sizeof(double));
    if (!slowest)
        return 0.0;
    for (int k = 0; k < rounds; k++) {
        slowest[k] = v[(size_t)k * (size_t)R];
        for (int r = 1; r < R; r++)
            if (v[(size_t)k * (size_t)R + (size_t)r] > slowest[k])
                slowest[k] = v[(size_t)k * (size_t)R + (size_t)r];
    }
    double m = bench_stats_of(slowest, rounds).median;
    free(slowest);
    return m;
}

/* The K rounds' paired ratios (round k: raw seconds / store seconds, each the median of its R
 * samples, or with slowest set the slowest of them) into out[K]; their stats. */
static bench_stats_t paired_ratios(const double *fetch, const double *raw, int K, int R,
                                   int slowest, double *out)
{
    for (int k = 0; k < K; k++) {
        const double *f = fetch + (size_t)k * (size_t)R, *w = raw + (size_t)k * (size_t)R;
        double fs = slowest ? f[0] : bench_stats_of(f, R).median;
        double ws = slowest ? w[0] : bench_stats_of(w, R).median;
        for (int r = 1; slowest && r < R; r++) {
            fs = f[r] > fs ? f[r] : fs;
            ws = w[r] > ws ? w[r] : ws;
        }
        out[k] = fs > 0 ? ws / fs : 0.0;
    }
    return bench_stats_of(out, K);
}

/* fetch: the K x R timed fetch seconds (version-major); raw: the K x R timed raw seconds of the
 * rounds interleaved with them. The ratio is the median over rounds of the round's paired ratio
 * (raw seconds / store seconds, medians over the R): both sides of a pair ran within seconds of
 * each other, so a machine that slows down for a while slows both. Besides the per-receiver
 * figures, the aggregate ones (R x N bytes over the time until the last receiver or reader is
 * done) do not depend on how evenly the owner shares itself: over tcp loopback a UCX owner may
 * serve its readers one after the other, and the per-reader median then falls between the first
 * reader's time and the last one's. */
static void report_store(const bench_opts_t *o, const bench_result_t *res, const double *fetch,
                         const double *raw, const char *raw_info)
{
    int K = o->iters, R = o->receivers, nf = K * R;
    bench_stats_t f = bench_stats_of(fetch, nf), p = bench_stats_of(res->times, res->ntimes);
    bench_stats_t b = bench_stats_of(raw, nf);
    double gb = (double)o->bytes / 1e9;
    double gbps = gb / f.median, baseline = gb / b.median;
    double agg = gb * R / median_round(fetch, K, R);
    double agg_base = gb * R / median_round(raw, K, R);
    double *pr = calloc((size_t)K, sizeof(double)), *pa = calloc((size_t)K, sizeof(double));
    if (!pr || !pa) {
        free(pr);
        free(pa);
        fprintf(stderr, PROG ": out of memory\n");
        return;
    }
    bench_stats_t q = paired_ratios(fetch, raw, K, R, 0, pr);
    bench_stats_t qa = paired_ratios(fetch, raw, K, R, 1, pa);
    char what[96];
    snprintf(what, sizeof(what), "raw %s get, 1 owner, %d reader%s", o->transport, R,
             R == 1 ? "" : "s");

    printf("%s: scheme %s over %s, mem host (snapshots, %d kept), %d receiver%s, %llu bytes in "
           "%d bf16 params, %d timed rounds after %d warmup, each a raw round then a store "
           "version\n",
           PROG, res->scheme, o->transport, STORE_KEEP_VERSIONS, R, R == 1 ? "" : "s",
           (unsigned long long)o->bytes, o->params, K, o->warmup);
    printf("  fetch seconds       median %.6f   min %.6f   max %.6f   (%d fetch%s: %d version%s x "
           "%d receiver%s)\n",
           f.median, f.min, f.max, nf, nf == 1 ? "" : "es", K, K == 1 ? "" : "s", R,
           R == 1 ? "" : "s");
    printf("  GB/s per receiver   median %.4g   max %.4g   min %.4g\n", gbps, gb / f.min,
           gb / f.max);
    printf("  publish seconds     median %.6f   (snapshot copy and directory; not delivery)\n",
           p.median);
    printf("  %-19s %.4g GB/s per reader   max %.4g   min %.4g   (%zu KiB gets; %s)\n", "raw get",
           baseline, gb / b.min, gb / b.max, RAW_GET_BYTES >> 10, raw_info[0] ? raw_info : "?");
    printf("  ratio               %.4g  median of %d paired rounds (min %.4g, max %.4g): raw "
           "seconds / store seconds, per receiver\n", q.median, K, q.min, q.max);
    printf("  aggregate           %.4g GB/s store, %.4g GB/s raw, ratio %.4g  median of paired "
           "rounds (min %.4g, max %.4g; %d x N bytes / time until the last one is done)\n",
           agg, agg_base, qa.median, qa.min, qa.max, R);

    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "scheme", json_string(res->scheme));
        json_object_set_new(j, "transport", json_string(o->transport));
        json_object_set_new(j, "mem", json_string("host"));
        json_object_set_new(j, "snapshot", json_true());
        json_object_set_new(j, "keep_versions", json_integer(STORE_KEEP_VERSIONS));
        json_object_set_new(j, "receivers", json_integer(R));
        json_object_set_new(j, "bytes", json_integer((json_int_t)o->bytes));
        json_object_set_new(j, "params", json_integer(o->params));
        json_object_set_new(j, "dtype", json_string("bf16"));
        json_object_set_new(j, "iters", json_integer(K));
        json_object_set_new(j, "warmup", json_integer(o->warmup));
        json_object_set_new(j, "interleaved", json_true());
        json_object_set_new(j, "seconds", json_real(f.median));
        json_object_set_new(j, "seconds_min", json_real(f.min));
        json_object_set_new(j, "seconds_max", json_real(f.max));
        json_object_set_new(j, "gbps_per_receiver", json_real(gbps));
        json_object_set_new(j, "gbps_per_receiver_min", json_real(gb / f.max));
        json_object_set_new(j, "gbps_per_receiver_max", json_real(gb / f.min));
        json_object_set_new(j, "publish_seconds", json_real(p.median));
        json_object_set_new(j, "baseline_gbps", json_real(baseline));
        json_object_set_new(j, "baseline", json_string(what));
        json_object_set_new(j, "baseline_transport", json_string(raw_info));
        json_object_set_new(j, "baseline_seconds", json_real(b.median));
        json_object_set_new(j, "baseline_get_bytes", json_integer((json_int_t)RAW_GET_BYTES));
        json_object_set_new(j, "ratio", json_real(q.median));
        json_object_set_new(j, "ratio_min", json_real(q.min));
        json_object_set_new(j, "ratio_max", json_real(q.max));
        json_object_set_new(j, "ratios", bench_json_reals(pr, K));
        json_object_set_new(j, "gbps_aggregate", json_real(agg));
        json_object_set_new(j, "baseline_gbps_aggregate", json_real(agg_base));
        json_object_set_new(j, "ratio_aggregate", json_real(qa.median));
        json_object_set_new(j, "ratio_aggregate_min", json_real(qa.min));
        json_object_set_new(j, "ratio_aggregate_max", json_real(qa.max));
        json_object_set_new(j, "times", bench_json_reals(fetch, nf));
        json_object_set_new(j, "publish_times", bench_json_reals(res->times, res->ntimes));
        json_object_set_new(j, "baseline_times", bench_json_reals(raw, nf));
        bench_print_json(j);
    }
    free(pr);
    free(pa);
    fflush(stdout);
}

/* Maps `len` bytes every child shares; NULL on failure (reported). */
void *bench_map_shared(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, PROG ": mmap of %zu shared bytes failed: %s\n", len, strerror(errno));
        return NULL;
    }
    return p;
}

typedef struct {
    const bench_opts_t *o;
    const char *coordinator;
    bench_shared_t *shared;
    bench_store_shm_t *ss;
    int (*sv)[2];            /* raw: [R] socketpairs, owner end 0, reader end 1 */
    int *owner_fds;          /* raw: sv[r][0] for every r */
} bench_group_arg_t;

static int ipc_body(int i, int res_fd, void *varg)
{
    bench_group_arg_t *a = varg;
    if (i == 0)
        return run_sender(a->o, a->coordinator, res_fd, a->shared);
    close(res_fd);
    return run_receiver(a->o, a->coordinator, i - 1, a->shared);
}

/* The store's run, one group: [0] the store's sender (its results on res_fd), [1, R] its
 * receivers, [R + 1] the raw owner, [R + 2, 2R + 1] the raw readers. */
/* --pin: the store's sender and the raw owner on the first CPU this process may use, the
 * receivers and raw readers spread over the others (receiver r and raw reader r together: they
 * never run at once), so that the owners' serving threads never wait for a reader's core. */
static void pin_child(int i, int R)
{
    cpu_set_t allowed, one;
    int cpus[CPU_SETSIZE], n = 0;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[n++] = c;
    if (n < 2)
        return;
    int owner = i == 0 || i == R + 1, reader = i <= R ? i - 1 : i - R - 2;
    CPU_ZERO(&one);
    CPU_SET(owner ? cpus[0] : cpus[1 + reader % (n - 1)], &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0)
        fprintf(stderr, PROG ": --pin: sched_setaffinity: %s\n", strerror(errno));
}

static int store_body(int i, int res_fd, void *varg)
{
    bench_group_arg_t *a = varg;
    int R = a->o->receivers;
    if (a->o->pin)
        pin_child(i, R);
    if (i == 0)
        return store_sender(a->o, a->coordinator, res_fd, a->shared, a->ss);
    close(res_fd);
    /* each child keeps only its own end of the raw socketpairs */
    for (int r = 0; r < R; r++) {
        if (i != R + 1)
            close(a->sv[r][0]);
        if (i != R + 2 + r)
            close(a->sv[r][1]);
    }
    if (i <= R)
        return store_receiver(a->o, a->coordinator, i - 1, a->shared, a->ss);
    if (i == R + 1)
        return raw_owner(a->o, a->owner_fds);
    return raw_reader(a->o, a->sv[i - R - 2][1], i - R - 2, a->shared, a->ss);
}

static int main_ipc(const bench_opts_t *o, bench_shared_t *shared)
{
    /* Before any child exists, so nothing else competes for the memory bus. */
    fprintf(stderr, PROG ": measuring memcpy of %llu bytes on one core\n",
            (unsigned long long)o->bytes);
    double baseline = bench_memcpy_gbps((size_t)o->bytes);
    if (baseline <= 0) {
        fprintf(stderr, PROG ": cannot allocate 2 x %llu bytes for the memcpy baseline\n",
                (unsigned long long)o->bytes);
        return 1;
    }
    fprintf(stderr, PROG ": memcpy, 1 core: %.3f GB/s\n", baseline);

    char coordinator[32];
    if (bench_make_coordinator(coordinator, sizeof(coordinator)) != 0)
        return 1;
    int nkids = 1 + o->receivers;
    bench_child_t *kids = calloc((size_t)nkids, sizeof(*kids));
    if (!kids) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (int i = 0; i < nkids; i++) {
        if (i == 0)
            snprintf(kids[i].name, sizeof(kids[i].name), "sender");
        else
            snprintf(kids[i].name, sizeof(kids[i].name), "receiver %d", i - 1);
    }
    bench_group_arg_t arg = {.o = o, .coordinator = coordinator, .shared = shared};
    char *text = NULL;
    /* the deadline starts after the memcpy baseline */
    int rc = bench_run_group(kids, nkids, ipc_body, &arg, bench_now_s() + o->timeout_s, o->timeout_s, &text);
    bench_result_t res = {.scheme = "?"};
    if (rc == 0 && (!text || parse_result(text, "time", o->iters, &res) != 0)) {
        fprintf(stderr, PROG ": the sender exited cleanly but its results are incomplete (%d of "
                        "%d timings)\n",
                res.ntimes, o->iters);
        rc = 1;
    }
    if (rc == 0)
        report_ipc(o, &res, baseline);
    free(res.times);
    free(text);
    free(kids);
    return rc;
}

/* The raw baseline and the store, interleaved round by round in one group of processes; the
 * deadline covers both. */
static int main_store(const bench_opts_t *o, bench_shared_t *shared)
{
    double deadline = bench_now_s() + o->timeout_s;
    char coordinator[32] = "";
    int R = o->receivers, versions = o->warmup + o->iters, rc = 1, nkids = 2 + 2 * R;
    bench_store_shm_t ss = {0};
    bench_child_t *kids = calloc((size_t)nkids, sizeof(*kids));
    int (*sv)[2] = calloc((size_t)R, sizeof(*sv));
    int *owner_fds = calloc((size_t)R, sizeof(int));
    char *text = NULL;
    bench_result_t res = {.scheme = "?"};
    if (!kids || !sv || !owner_fds) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    for (int r = 0; r < R; r++)
        sv[r][0] = sv[r][1] = -1;

    size_t counters = (size_t)(3 * versions + 1) * sizeof(atomic_int);
    size_t off_fetch_s = (counters + 63) & ~63ul;
    size_t off_raw_s = (off_fetch_s + (size_t)versions * (size_t)R * sizeof(double) + 63) & ~63ul;
    ss.len = off_raw_s + (size_t)versions * (size_t)R * sizeof(double);
    if (!(ss.base = bench_map_shared(ss.len)))
        goto out;
    ss.fetched = (atomic_int *)ss.base;
    ss.raw_arrived = ss.fetched + versions + 1;
    ss.raw_done = ss.raw_arrived + versions;
    ss.fetch_s = (double *)((char *)ss.base + off_fetch_s);
    ss.raw_s = (double *)((char *)ss.base + off_raw_s);
    for (int v = 0; v < 3 * versions + 1; v++)
        atomic_init(&ss.fetched[v], 0);

    for (int r = 0; r < R; r++) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r]) != 0) {
            fprintf(stderr, PROG ": socketpair failed: %s\n", strerror(errno));
            goto out;
        }
        owner_fds[r] = sv[r][0];
    }
    if (bench_make_coordinator(coordinator, sizeof(coordinator)) != 0)
        goto out;
    snprintf(kids[0].name, sizeof(kids[0].name), "sender");
    for (int r = 0; r < R; r++) {
        snprintf(kids[1 + r].name, sizeof(kids[1 + r].name), "receiver %d", r);
        snprintf(kids[R + 2 + r].name, sizeof(kids[R + 2 + r].name), "raw reader %d", r);
    }
    snprintf(kids[R + 1].name, sizeof(kids[R + 1].name), "raw owner");
    fprintf(stderr, PROG ": %d rounds, each the raw %s get (1 owner, %d reader%s of %llu bytes) "
            "then a store version\n", versions, o->transport, R, R == 1 ? "" : "s",
            (unsigned long long)o->bytes);
    bench_group_arg_t arg = {.o = o, .coordinator = coordinator, .shared = shared, .ss = &ss,
                             .sv = sv, .owner_fds = owner_fds};
    if (bench_run_group(kids, nkids, store_body, &arg, deadline, o->timeout_s, &text) != 0)
        goto out;
    if (!text || parse_result(text, "publish", o->iters, &res) != 0) {
        fprintf(stderr, PROG ": the sender exited cleanly but its results are incomplete (%d of "
                        "%d timings)\n",
                res.ntimes, o->iters);
        goto out;
    }
    /* the timed rounds: raw rounds W..W+K-1 and versions W+1..W+K, every receiver and reader */
    report_store(o, &res, ss.fetch_s + (size_t)o->warmup * (size_t)R,
                 ss.raw_s + (size_t)o->warmup * (size_t)R, shared->raw_info);
    rc = 0;
out:
    for (int r = 0; sv && r < R; r++) {
        if (sv[r][0] >= 0)
            close(sv[r][0]);
        if (sv[r][1] >= 0)
            close(sv[r][1]);
    }
    if (ss.base)
        munmap(ss.base, ss.len);
    free(res.times);
    free(text);
    free(owner_fds);
    free(sv);
    free(kids);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts_t o;
    int pr = parse_options(argc, argv, &o);
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (o.model_shape)
        return bench_model_main(&o);

    size_t shared_len = sizeof(bench_shared_t) + (size_t)o.params * sizeof(uint64_t);
    bench_shared_t *shared = bench_map_shared(shared_len);
    if (!shared)
        return 1;
    atomic_init(&shared->ready, 0);
    atomic_init(&shared->published, 0);
    atomic_init(&shared->done, 0);
    shared->nparams = o.params;

    int rc;
    if (o.store)
        rc = main_store(&o, shared);
    else
        rc = main_ipc(&o, shared);
    munmap(shared, shared_len);
    return rc;
}
