/* wsync-bench: time wsync_sender_push on this machine, one sender process and R receiver
 * processes, against one core's memcpy bandwidth measured in the same run.
 *
 * The parent forks every child before any wsync object exists (a process with wsync threads is
 * never forked), then only watches: the sender child sends its timings back through a pipe, the
 * receivers check the bytes they got against hashes the sender left in a shared page, and the
 * parent kills everyone if a child fails or the deadline passes. */
#include "wsync/wsync.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define PROG "wsync-bench"
#define MIB (1024.0 * 1024.0)
#define MAX_RECEIVERS 256
#define MAX_PARAMS 65536

typedef struct {
    const char *scheme;      /* "ipc" or "auto" */
    int receivers;
    uint64_t bytes;          /* total over all params */
    uint64_t bucket_bytes;
    int iters, warmup, params;
    int json;
    int timeout_s;           /* the parent's deadline for the whole run */
    int private_mem;         /* --source private: plain malloc'd weights, staged in buckets */
} bench_opts_t;

/* What the sender leaves for the receivers: one xxh3 per param, then ready = 1. Mapped shared
 * by the parent before forking. */
typedef struct {
    atomic_int ready;
    int nparams;
    uint64_t hash[];
} bench_shared_t;

/* Param i of the benchmark model: a [rows, cols] bf16 matrix, params split bytes evenly. */
typedef struct {
    char name[40];
    int64_t rows, cols;
    size_t offset;           /* bytes from the start of the one block holding every param */
    size_t bytes;
} bench_param_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " --scheme ipc --mem host --receivers R --bytes N [options]\n"
            "\n"
            "Runs one sender process and R receiver processes on this machine, pushes versions\n"
            "1..W+K of N bytes of bf16 weights, and reports the median push time, the GB/s\n"
            "delivered to each receiver (GB = 1e9 bytes), one core's memcpy GB/s for N bytes\n"
            "measured in the same run, and their ratio. Every receiver checks its bytes against\n"
            "the sender's (xxh3); a mismatch fails the run.\n"
            "\n"
            "  --scheme S       ipc (or auto: let the library choose); nccl and store are not\n"
            "                   built yet\n"
            "  --mem M          host (cuda is not built yet)\n"
            "  --receivers R    receiver processes, 1..%d\n"
            "  --bytes N        total bytes of weights; suffixes K, M, G, T (powers of 1024)\n"
            "  --bucket-mb B    staging bucket size in MiB (default 256)\n"
            "  --iters K        timed pushes (default 5)\n"
            "  --warmup W       untimed pushes first (default 1)\n"
            "  --params P       number of params the bytes are split into (default 16)\n"
            "  --timeout S      kill every process and fail after S seconds (default 600)\n"
            "  --source S       shared (default): the sender's weights are in wsync_mem_alloc\n"
            "                   memory, which receivers read in place; private: malloc'd\n"
            "                   weights, staged through the buckets\n"
            "  --json           end stdout with one JSON object of the results\n"
            "  -h, --help       this text\n"
            "\n"
            "Environment: WSYNC_LOG_LEVEL, WSYNC_TIMEOUT_MS, WSYNC_HEARTBEAT_MS apply to every\n"
            "process; the coordinator address, ranks, scheme and bucket are set by the bench.\n",
            MAX_RECEIVERS);
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

/* Returns 0 to run, 1 when --help was asked, -1 on a bad command line (already reported). */
static int parse_options(int argc, char **argv, bench_opts_t *o)
{
    enum { OPT_SCHEME = 1000, OPT_MEM, OPT_RECEIVERS, OPT_BYTES, OPT_BUCKET, OPT_ITERS,
           OPT_WARMUP, OPT_PARAMS, OPT_TIMEOUT, OPT_JSON, OPT_SOURCE };
    static const struct option longopts[] = {
        {"scheme", required_argument, NULL, OPT_SCHEME},
        {"mem", required_argument, NULL, OPT_MEM},
        {"receivers", required_argument, NULL, OPT_RECEIVERS},
        {"bytes", required_argument, NULL, OPT_BYTES},
        {"bucket-mb", required_argument, NULL, OPT_BUCKET},
        {"iters", required_argument, NULL, OPT_ITERS},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"params", required_argument, NULL, OPT_PARAMS},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"json", no_argument, NULL, OPT_JSON},
        {"source", required_argument, NULL, OPT_SOURCE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *scheme = NULL, *mem = NULL;
    int have_receivers = 0, have_bytes = 0, bucket_mb = 256;

    *o = (bench_opts_t){.iters = 5, .warmup = 1, .params = 16, .timeout_s = 600};
    opterr = 0; /* errors are reported below, naming the option */
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_SCHEME: scheme = optarg; break;
        case OPT_MEM: mem = optarg; break;
        case OPT_RECEIVERS:
            if (parse_int("--receivers", optarg, 1, MAX_RECEIVERS, &o->receivers) != 0)
                return -1;
            have_receivers = 1;
            break;
        case OPT_BYTES:
            if (parse_bytes("--bytes", optarg, &o->bytes) != 0)
                return -1;
            have_bytes = 1;
            break;
        case OPT_BUCKET:
            if (parse_int("--bucket-mb", optarg, 1, 1 << 20, &bucket_mb) != 0)
                return -1;
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
            break;
        case OPT_TIMEOUT:
            if (parse_int("--timeout", optarg, 1, 7 * 24 * 3600, &o->timeout_s) != 0)
                return -1;
            break;
        case OPT_JSON: o->json = 1; break;
        case OPT_SOURCE:
            if (strcmp(optarg, "shared") == 0)
                o->private_mem = 0;
            else if (strcmp(optarg, "private") == 0)
                o->private_mem = 1;
            else {
                fprintf(stderr, PROG ": --source '%s': expected shared or private\n", optarg);
                return -1;
            }
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

    if (!scheme) {
        fprintf(stderr, PROG ": --scheme is required (ipc)\n");
        return -1;
    }
    if (strcmp(scheme, "nccl") == 0 || strcmp(scheme, "store") == 0) {
        fprintf(stderr, PROG ": --scheme %s: not built yet (only ipc can be benchmarked now)\n",
                scheme);
        return -1;
    }
    if (strcmp(scheme, "ipc") != 0 && strcmp(scheme, "auto") != 0) {
        fprintf(stderr, PROG ": --scheme: unknown scheme '%s' (expected ipc or auto)\n", scheme);
        return -1;
    }
    o->scheme = scheme;
    if (!mem) {
        fprintf(stderr, PROG ": --mem is required (host)\n");
        return -1;
    }
    if (strcmp(mem, "cuda") == 0) {
        fprintf(stderr, PROG ": --mem cuda: not built yet (only host memory can be benchmarked "
                        "now)\n");
        return -1;
    }
    if (strcmp(mem, "host") != 0) {
        fprintf(stderr, PROG ": --mem: unknown memory kind '%s' (expected host)\n", mem);
        return -1;
    }
    if (!have_receivers) {
        fprintf(stderr, PROG ": --receivers is required\n");
        return -1;
    }
    if (!have_bytes) {
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
    o->bucket_bytes = (uint64_t)bucket_mb << 20;
    return 0;
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
static double memcpy_gbps(size_t bytes)
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
        double t0 = now_s();
        for (size_t r = 0; r < reps; r++) {
            memcpy(dst, src, bytes);
            __asm__ volatile("" : : "r"(dst) : "memory"); /* keep every copy */
        }
        double dt = now_s() - t0;
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

static int wsync_failed(const char *who, const char *call, wsync_status_t st)
{
    fprintf(stderr, PROG ": %s: %s failed: %s (%s)\n", who, call, wsync_status_name(st),
            wsync_last_error());
    return 1;
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
        rc = wsync_failed(who, "wsync_ctx_create", st);
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
    sp.rank = 0;
    sp.nranks = 1;
    sp.nreceivers = o->receivers;
    sp.scheme = o->scheme;
    sp.bucket_bytes = (size_t)o->bucket_bytes;
    if ((st = wsync_sender_create(ctx, &sp, &sender)) != WSYNC_OK) {
        rc = wsync_failed(who, "wsync_sender_create", st);
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
            rc = wsync_failed(who, "wsync_sender_add_shard", st);
            goto out;
        }
    }
    atomic_store_explicit(&shared->ready, 1, memory_order_release);

    if ((st = wsync_sender_setup(sender)) != WSYNC_OK) {
        rc = wsync_failed(who, "wsync_sender_setup", st);
        goto out;
    }
    const char *chosen = wsync_sender_scheme(sender);
    dprintf(res_fd, "scheme %s\n", chosen ? chosen : "?");

    int total = o->warmup + o->iters;
    for (int v = 1; v <= total; v++) {
        double t0 = now_s();
        st = wsync_sender_push(sender, (uint64_t)v);
        double dt = now_s() - t0;
        if (st != WSYNC_OK) {
            char call[64];
            snprintf(call, sizeof(call), "wsync_sender_push(version %d)", v);
            rc = wsync_failed(who, call, st);
            goto out;
        }
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
        rc = wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = coordinator;
    rp.rank = rank;
    rp.nreceivers = o->receivers;
    if ((st = wsync_receiver_create(ctx, &rp, &receiver)) != WSYNC_OK) {
        rc = wsync_failed(who, "wsync_receiver_create", st);
        goto out;
    }
    for (int i = 0; i < o->params; i++) {
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
        if ((st = wsync_receiver_add_target(receiver, &target)) != WSYNC_OK) {
            rc = wsync_failed(who, "wsync_receiver_add_target", st);
            goto out;
        }
    }

    /* A timeout only means no version began yet (the sender may still be making its weights);
     * the parent's deadline bounds the whole run. */
    uint64_t last = (uint64_t)(o->warmup + o->iters), version = 0;
    while (version < last) {
        st = wsync_receiver_wait(receiver, -1, &version);
        if (st == WSYNC_ERR_TIMEOUT)
            continue;
        if (st != WSYNC_OK) {
            rc = wsync_failed(who, "wsync_receiver_wait", st);
            goto out;
        }
    }

    if (!atomic_load_explicit(&shared->ready, memory_order_acquire)) {
        fprintf(stderr, PROG ": %s: got version %llu but the sender's hashes are missing\n", who,
                (unsigned long long)version);
        goto out;
    }
    int bad = 0;
    for (int i = 0; i < o->params; i++) {
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
                o->params);
        goto out;
    }
    rc = 0;
out:
    wsync_receiver_free(receiver);
    wsync_ctx_free(ctx);
    free(block);
    free(params);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Parent                                                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    char name[32];
    int done;       /* reaped */
    int status;     /* from waitpid */
} bench_child_t;

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

typedef struct {
    char scheme[32];
    double *times;
    int ntimes;
} bench_result_t;

/* Parses the sender's lines; 0 when complete. */
static int parse_result(char *text, int iters, bench_result_t *res)
{
    int ended = 0;
    res->times = calloc((size_t)iters, sizeof(double));
    if (!res->times)
        return -1;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        double t;
        if (strncmp(line, "scheme ", 7) == 0)
            snprintf(res->scheme, sizeof(res->scheme), "%s", line + 7);
        else if (sscanf(line, "time %lf", &t) == 1 && res->ntimes < iters)
            res->times[res->ntimes++] = t;
        else if (strcmp(line, "end") == 0)
            ended = 1;
    }
    return ended && res->ntimes == iters ? 0 : -1;
}

static void report(const bench_opts_t *o, const bench_result_t *res, double baseline)
{
    double *sorted = malloc((size_t)res->ntimes * sizeof(double));
    if (!sorted) {
        fprintf(stderr, PROG ": out of memory\n");
        return;
    }
    memcpy(sorted, res->times, (size_t)res->ntimes * sizeof(double));
    qsort(sorted, (size_t)res->ntimes, sizeof(double), cmp_double);
    int n = res->ntimes;
    double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    double tmin = sorted[0], tmax = sorted[n - 1];
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
        json_t *times = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(times, json_real(res->times[i]));
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
        json_object_set_new(j, "times", times);
        char *text = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(j);
    }
    fflush(stdout);
    free(sorted);
}

int main(int argc, char **argv)
{
    bench_opts_t o;
    int pr = parse_options(argc, argv, &o);
    if (pr != 0)
        return pr > 0 ? 0 : 2;

    /* Before any child exists, so nothing else competes for the memory bus. */
    fprintf(stderr, PROG ": measuring memcpy of %llu bytes on one core\n",
            (unsigned long long)o.bytes);
    double baseline = memcpy_gbps((size_t)o.bytes);
    if (baseline <= 0) {
        fprintf(stderr, PROG ": cannot allocate 2 x %llu bytes for the memcpy baseline\n",
                (unsigned long long)o.bytes);
        return 1;
    }
    fprintf(stderr, PROG ": memcpy, 1 core: %.3f GB/s\n", baseline);

    int port = pick_port();
    if (port == 0) {
        fprintf(stderr, PROG ": cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
        return 1;
    }
    char coordinator[32];
    snprintf(coordinator, sizeof(coordinator), "127.0.0.1:%d", port);

    size_t shared_len = sizeof(bench_shared_t) + (size_t)o.params * sizeof(uint64_t);
    bench_shared_t *shared =
        mmap(NULL, shared_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        fprintf(stderr, PROG ": mmap of %zu shared bytes failed: %s\n", shared_len,
                strerror(errno));
        return 1;
    }
    atomic_init(&shared->ready, 0);
    shared->nparams = o.params;

    int res_pipe[2];
    if (pipe(res_pipe) != 0) {
        fprintf(stderr, PROG ": pipe failed: %s\n", strerror(errno));
        return 1;
    }

    int nkids = 1 + o.receivers;
    bench_child_t *kids = calloc((size_t)nkids, sizeof(*kids));
    if (!kids) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    pid_t parent = getpid();
    for (int i = 0; i < nkids; i++) {
        if (i == 0)
            snprintf(kids[i].name, sizeof(kids[i].name), "sender");
        else
            snprintf(kids[i].name, sizeof(kids[i].name), "receiver %d", i - 1);
        fflush(NULL); /* nothing buffered is written twice */
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, PROG ": fork of %s failed: %s\n", kids[i].name, strerror(errno));
            kill_all(kids, i);
            return 1;
        }
        if (pid == 0) {
            /* Die with the parent rather than linger holding ports and shared memory. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
            close(res_pipe[0]);
            int rc;
            if (i == 0) {
                rc = run_sender(&o, coordinator, res_pipe[1], shared);
            } else {
                close(res_pipe[1]);
                rc = run_receiver(&o, coordinator, i - 1, shared);
            }
            fflush(NULL);
            _exit(rc);
        }
        kids[i].pid = pid;
    }
    close(res_pipe[1]);
    /* Non-blocking, so that reading never keeps the parent from its deadline. */
    fcntl(res_pipe[0], F_SETFL, fcntl(res_pipe[0], F_GETFL) | O_NONBLOCK);

    /* Watch: collect the sender's lines, reap children, enforce the deadline. */
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    int eof = 0, failed = 0;
    double deadline = now_s() + o.timeout_s;
    for (;;) {
        if (!eof) {
            struct pollfd pfd = {.fd = res_pipe[0], .events = POLLIN};
            if (poll(&pfd, 1, 100) > 0) {
                int d = drain(res_pipe[0], &text, &text_len, &text_cap);
                if (d != 0)
                    eof = 1; /* end of file, or an error that the parse below reports */
            }
        } else {
            usleep(100 * 1000);
        }
        int running = reap(kids, nkids);
        for (int i = 0; i < nkids; i++)
            if (kids[i].done && !child_ok(&kids[i]))
                failed = 1;
        if (failed) {
            usleep(300 * 1000); /* let the others that are failing too be reaped and named */
            reap(kids, nkids);
            for (int i = 0; i < nkids; i++) {
                if (kids[i].done && !child_ok(&kids[i])) {
                    char why[160];
                    describe_exit(&kids[i], why, sizeof(why));
                    fprintf(stderr, PROG ": %s\n", why);
                }
            }
            for (int i = 0; i < nkids; i++)
                if (!kids[i].done)
                    fprintf(stderr, PROG ": killing %s (pid %d)\n", kids[i].name,
                            (int)kids[i].pid);
            kill_all(kids, nkids);
            return 1;
        }
        if (running == 0 && eof)
            break;
        if (now_s() > deadline) {
            for (int i = 0; i < nkids; i++)
                if (!kids[i].done)
                    fprintf(stderr, PROG ": timeout after %d s: %s (pid %d) still running, "
                                    "killed\n",
                            o.timeout_s, kids[i].name, (int)kids[i].pid);
            kill_all(kids, nkids);
            return 1;
        }
    }
    close(res_pipe[0]);

    bench_result_t res = {.scheme = "?"};
    if (!text || parse_result(text, o.iters, &res) != 0) {
        fprintf(stderr, PROG ": the sender exited cleanly but its results are incomplete (%d of "
                        "%d timings)\n",
                res.ntimes, o.iters);
        return 1;
    }
    report(&o, &res, baseline);
    free(res.times);
    free(text);
    free(kids);
    munmap(shared, shared_len);
    return 0;
}
