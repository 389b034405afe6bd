/* The copies of a colocated FSDP-1 -> TP-1 version of the Qwen3-8B shape, as
 * schemes/ipc_cuda_rx.c issues them, without wsync's control plane: every tensor's rows from a
 * source into the same place of a target (the fused qkv and gate_up targets are their sources in
 * order), cut into 62 batches of equal bytes, odd batches on a second stream, each grid capped
 * at N blocks per SM or not. Timed (medians of 20) against one cudaMemcpyAsync of the same bytes
 * over the same buffers, and the targets compared with the sources byte for byte.
 *
 * It measures what the copy kernels give when nothing else differs, and, by its options, whether
 * what differs in a real version matters: the sources in another process's memory (opened by
 * IPC handle, directly or through transports/cuda_ipc as a sender shares its shards), allocated
 * while we allocate, or in 2 MiB holes; random bits; events polled after every batch; idle
 * time before each version; the distance between sources and targets; a cudaMalloc per tensor.
 * docs/benchmarks.md ("One GPU: where the time goes") has what it found.
 *
 * Not a ctest (CI has no GPU): run on a GPU machine. Exit 0 when every byte check passed, 1
 * otherwise, 77 when there is no CUDA device, 2 for a bad option. */
#include "tests/support/check.h"
#include "transports/cuda_ipc.h"
#include "core/util.h"
#include "kernels/kernels.h"
#include "tests/gpu/cuda_check.h"

#include <cuda_runtime_api.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


#define ITERS 20
#define NBATCH 62
#define MAXT (7 * 36 + 2)              /* tensors of the shape */
#define MiB (UINT64_C(1) << 20)

enum { IPC_NONE, IPC_CUDA, IPC_WSYNC };

static struct {
    int ipc, concurrent, fragment, random, events, gap_ms, separate;
    uint64_t pad_mb;
} opt;

typedef struct {
    uint64_t rows, cols;
} shape_t;

typedef struct {
    wsync_kcopy_batch_t *b[NBATCH + 8];
    int nb, streams;
    uint32_t cap;
    cudaStream_t s[2];
    cudaEvent_t fork, join;
    cudaEvent_t ev[NBATCH + 8];        /* --events: one after each batch, polled */
} batches_t;

typedef void (*launch_fn)(void *ctx);

/* Median seconds of one launch: back to back, or each after the GPU idled --gap-ms. */
static double time_it(launch_fn fn, void *ctx)
{
    cudaEvent_t a, b;
    float ms[ITERS];
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    fn(ctx);
    for (int i = 0; i < ITERS; i++) {
        if (opt.gap_ms > 0) {
            CU(cudaDeviceSynchronize());
            usleep((useconds_t)opt.gap_ms * 1000);
        }
        CU(cudaEventRecord(a, NULL));
        fn(ctx);
        CU(cudaEventRecord(b, NULL));
        CU(cudaEventSynchronize(b));
        CU(cudaEventElapsedTime(&ms[i], a, b));
    }
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return cu_median_seconds(ms, ITERS);
}

static struct {
    void *a, *b;
    size_t bytes;
} d2d;

static void d2d_launch(void *ctx)
{
    (void)ctx;
    CU(cudaMemcpyAsync(d2d.b, d2d.a, d2d.bytes, cudaMemcpyDeviceToDevice, NULL));
}

static void launch_one(void *ctx)
{
    if (wsync_kernels_batch_launch((wsync_kcopy_batch_t *)ctx, NULL) != WSYNC_OK) {
        fprintf(stderr, "batch launch: %s\n", wsync_last_error());
        exit(2);
    }
}

/* Every batch, odd ones on the second stream; with --events, as the ipc receiver does: an event
 * after each batch, every pending one queried after each launch, then polled until all are done. */
static void launch_all(void *ctx)
{
    batches_t *m = ctx;
    CU(cudaEventRecord(m->fork, NULL));
    for (int i = 0; i < m->streams; i++)
        CU(cudaStreamWaitEvent(m->s[i], m->fork, 0));
    for (int i = 0; i < m->nb; i++) {
        wsync_kernels_batch_limit(m->b[i], m->cap);
        if (wsync_kernels_batch_launch(m->b[i], m->s[i % m->streams]) != WSYNC_OK) {
            fprintf(stderr, "batch launch: %s\n", wsync_last_error());
            exit(2);
        }
        if (opt.events) {
            CU(cudaEventRecord(m->ev[i], m->s[i % m->streams]));
            for (int j = 0; j <= i; j++)
                (void)cudaEventQuery(m->ev[j]);
        }
    }
    for (int busy = opt.events; busy;) {
        busy = 0;
        for (int j = 0; j < m->nb; j++)
            busy |= cudaEventQuery(m->ev[j]) == cudaErrorNotReady;
        if (busy)
            sched_yield();
    }
    for (int i = 0; i < m->streams; i++) {
        CU(cudaEventRecord(m->join, m->s[i]));
        CU(cudaStreamWaitEvent(NULL, m->join, 0));
    }
}

/* The shape's bf16 tensors in the order a sender holds them: embeddings, 36 layers of q, k, v,
 * o, gate, up, down, lm_head (norms left out: a few KiB). */
static int model_shape(shape_t *t)
{
    const uint64_t H = 4096, I = 12288, V = 151936, Q = 4096, KV = 1024;
    int n = 0;
    t[n++] = (shape_t){V, H};
    for (int l = 0; l < 36; l++) {
        t[n++] = (shape_t){Q, H};
        t[n++] = (shape_t){KV, H};
        t[n++] = (shape_t){KV, H};
        t[n++] = (shape_t){H, Q};
        t[n++] = (shape_t){I, H};
        t[n++] = (shape_t){I, H};
        t[n++] = (shape_t){H, I};
    }
    t[n++] = (shape_t){V, H};
    return n;
}

/* Bytes [off, off + bytes) of the whole source, each 4-byte word a function of its place: a
 * multiplicative sequence, or with --random a hash of the word's number (random bits, the same
 * however the source is cut). */
static void fill(unsigned char *dev, uint64_t off, uint64_t bytes)
{
    uint32_t *h = malloc(64 * MiB);
    for (uint64_t o = 0; o < bytes; o += 64 * MiB) {
        uint64_t n = bytes - o < 64 * MiB ? bytes - o : 64 * MiB;
        for (uint64_t k = 0; k < n / 4; k++) {
            uint64_t x = (off + o) / 4 + k;
            if (opt.random) {
                x *= UINT64_C(0x9E3779B97F4A7C15);
                x ^= x >> 31;
                x *= UINT64_C(0xD6E8FEB86659FD93);
                x ^= x >> 32;
                h[k] = (uint32_t)x;
            } else {
                h[k] = (uint32_t)(x * 2654435761u);
            }
        }
        CU(cudaMemcpy(dev + o, h, n, cudaMemcpyHostToDevice));
    }
    free(h);
}

/* Tensors t[0, nt) from srcs[i] to dsts[i], cut at batch boundaries by rows into NBATCH batches
 * of equal bytes (m), and all of them in one (*all). */
static void make_batches(const shape_t *t, int nt, unsigned char **srcs, unsigned char **dsts,
                         uint64_t total, batches_t *m, wsync_kcopy_batch_t **all)
{
    const uint64_t per = total / NBATCH + 1;
    wsync_kcopy_t *cd = malloc(4096 * sizeof(*cd)), *every = malloc(4096 * sizeof(*every));
    int nc = 0, ne = 0;
    uint64_t inb = 0;
    m->nb = 0;
    for (int i = 0; i < nt; i++) {
        uint64_t rb = t[i].cols * 2, r0 = 0;
        while (r0 < t[i].rows) {
            uint64_t room = (per - inb) / rb, r = t[i].rows - r0 < room ? t[i].rows - r0 : room;
            if (r == 0)
                r = 1;
            cd[nc++] = (wsync_kcopy_t){srcs[i], dsts[i], r0 * rb / 2, t[i].cols, r0 * rb / 2,
                                       t[i].cols, r, t[i].cols, WSYNC_DTYPE_BF16, WSYNC_DTYPE_BF16};
            every[ne++] = cd[nc - 1];
            inb += r * rb;
            r0 += r;
            if (inb + rb > per || (i == nt - 1 && r0 == t[i].rows)) {
                CHECK_OK(wsync_kernels_batch_create(cd, (uint32_t)nc, &m->b[m->nb++]));
                nc = 0;
                inb = 0;
            }
        }
    }
    CHECK_OK(wsync_kernels_batch_create(every, (uint32_t)ne, all));
    free(cd);
    free(every);
}

static void verify(const shape_t *t, int nt, unsigned char **srcs, unsigned char **dsts)
{
    unsigned char *a = malloc(256 * MiB), *b = malloc(256 * MiB);
    uint64_t bad = 0;
    for (int i = 0; i < nt; i++) {
        const uint64_t tb = t[i].rows * t[i].cols * 2;
        for (uint64_t o = 0; o < tb; o += 256 * MiB) {
            uint64_t n = tb - o < 256 * MiB ? tb - o : 256 * MiB;
            CU(cudaMemcpy(a, srcs[i] + o, n, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(b, dsts[i] + o, n, cudaMemcpyDeviceToHost));
            bad += memcmp(a, b, n) != 0;
        }
    }
    CHECK_MSG(bad == 0, "%" PRIu64 " pieces of 256 MiB differ", bad);
    free(a);
    free(b);
}

/* The targets poisoned, every batch once as the receiver runs them (2 streams, 2 blocks per SM),
 * and the targets compared with `want` (the bytes the sources hold). */
static void copy_checked(batches_t *m, const shape_t *t, int nt, unsigned char **want,
                         unsigned char **dsts, int sms)
{
    for (int i = 0; i < nt; i++)
        CU(cudaMemset(dsts[i], 0, t[i].rows * t[i].cols * 2));
    m->streams = 2;
    m->cap = (uint32_t)(2 * sms);
    launch_all(m);
    CU(cudaDeviceSynchronize());
    verify(t, nt, want, dsts);
}

/* One launch of batch b at 2 blocks per SM and uncapped, against the reference copy. */
static void report_one(wsync_kcopy_batch_t *b, const char *what, double t_d2d, int sms)
{
    wsync_kernels_batch_limit(b, (uint32_t)(2 * sms));
    const double t2 = time_it(launch_one, b);
    wsync_kernels_batch_limit(b, 0);
    const double t0 = time_it(launch_one, b);
    printf("  %s: 2 blocks/SM %.3f x d2d, uncapped %.3f x d2d\n", what, t2 / t_d2d, t0 / t_d2d);
}

static void report(batches_t *m, const char *what, double t_d2d, int sms)
{
    static const struct {
        int streams;
        double cap;
    } cf[] = {{2, 2}, {1, 2}, {2, 1}, {2, 3}, {2, 0}, {1, 0}};
    for (size_t i = 0; i < sizeof(cf) / sizeof(cf[0]); i++) {
        m->streams = cf[i].streams;
        m->cap = (uint32_t)(cf[i].cap * sms);
        double tk = time_it(launch_all, m);
        printf("  %s%d stream%s, %s%.0f blocks/SM: %.3f ms  %.3f x d2d\n", what, m->streams,
               m->streams > 1 ? "s" : "", cf[i].cap > 0 ? "" : "uncapped ", cf[i].cap, tk * 1e3,
               tk / t_d2d);
    }
}

/* ---- the other process: --child BYTES WFD RFD ---------------------------------------------- */

/* cudaMalloc BYTES (with --fragment in 2 MiB holes: twice its bytes in 2 MiB pieces, every other
 * one freed first), fill them, write the handle to WFD (--ipc wsync: transports/cuda_ipc's
 * description, its length first), hold the memory until RFD reads EOF. */
static int child_main(uint64_t bytes, int wfd, int rfd)
{
    unsigned char *p;
    void **frag = NULL;
    size_t nfrag = 0;
    wsync_cuda_exporter_t *ex = NULL;
    char c;

    if (opt.fragment) {
        nfrag = (size_t)(2 * bytes / (2 * MiB)) + 2;
        frag = calloc(nfrag, sizeof(*frag));
        for (size_t i = 0; i < nfrag; i++)
            CU(cudaMalloc(&frag[i], 2 * MiB));
        for (size_t i = 0; i < nfrag; i += 2) {
            CU(cudaFree(frag[i]));
            frag[i] = NULL;
        }
    }
    CU(cudaMalloc((void **)&p, bytes));
    for (size_t i = 0; i < nfrag; i++)
        if (frag[i] != NULL)
            CU(cudaFree(frag[i]));
    free(frag);
    fill(p, 0, bytes);
    CU(cudaDeviceSynchronize());
    if (opt.ipc == IPC_WSYNC) {
        wsync_wbuf_t b;
        const int *fds = NULL;
        uint32_t nfds = 0;
        if (wsync_cuda_exporter_create(0, &ex) != WSYNC_OK ||
            wsync_cuda_export_add(ex, p, bytes, "the source") != WSYNC_OK ||
            wsync_cuda_export_finish(ex) != WSYNC_OK) {
            fprintf(stderr, "copy_model child: %s\n", wsync_last_error());
            return 1;
        }
        wsync_wbuf_init(&b);
        wsync_cuda_export_encode(ex, &b, &fds, &nfds);
        uint32_t len = (uint32_t)b.len;
        if (nfds != 0 || write(wfd, &len, 4) != 4 || write(wfd, b.data, len) != (ssize_t)len)
            return 1;
        wsync_wbuf_free(&b);
    } else {
        cudaIpcMemHandle_t h;
        CU(cudaIpcGetMemHandle(&h, p));
        if (write(wfd, &h, sizeof(h)) != (ssize_t)sizeof(h))
            return 1;
    }
    while (read(rfd, &c, 1) > 0)
        ;
    wsync_cuda_exporter_free(ex);
    CU(cudaFree(p));
    return 0;
}

static const char *self;

typedef struct {
    pid_t pid;
    int from, to;                      /* its handle comes on `from`; closing `to` ends it */
} child_t;

static void child_start(uint64_t total, child_t *ch)
{
    int c2p[2], p2c[2];
    CHECK(pipe(c2p) == 0 && pipe(p2c) == 0);
    ch->pid = fork();
    if (ch->pid == 0) {
        char b[32], w[16], r[16];
        snprintf(b, sizeof(b), "%" PRIu64, total);
        snprintf(w, sizeof(w), "%d", c2p[1]);
        snprintf(r, sizeof(r), "%d", p2c[0]);
        char *args[10];
        int n = 0;
        close(c2p[0]);
        close(p2c[1]);
        args[n++] = (char *)self;
        args[n++] = opt.ipc == IPC_WSYNC ? "--ipc=wsync" : "--ipc=cuda";
        if (opt.fragment)
            args[n++] = "--fragment";
        if (opt.random)
            args[n++] = "--random";
        args[n++] = "--child";
        args[n++] = b;
        args[n++] = w;
        args[n++] = r;
        args[n] = NULL;
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(c2p[1]);
    close(p2c[0]);
    ch->from = c2p[0];
    ch->to = p2c[1];
}

/* The child's source, opened here; *im set when through transports/cuda_ipc. */
static unsigned char *child_open(child_t *ch, wsync_cuda_import_t **im)
{
    unsigned char *p = NULL;
    *im = NULL;
    if (opt.ipc == IPC_WSYNC) {
        uint32_t len = 0;
        size_t got = 0;
        CHECK(read(ch->from, &len, 4) == 4 && len < MiB);
        unsigned char *buf = malloc(len);
        while (got < len) {
            ssize_t k = read(ch->from, buf + got, len - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        CHECK(got == len);
        wsync_rbuf_t rb;
        wsync_rbuf_init(&rb, buf, len);
        CHECK_OK(wsync_cuda_import_open(&rb, NULL, 0, 0, "copy_model's child", im));
        free(buf);
        if (*im != NULL)
            p = (unsigned char *)wsync_cuda_import_base(*im, 0, NULL);
    } else {
        cudaIpcMemHandle_t h;
        CHECK(read(ch->from, &h, sizeof(h)) == (ssize_t)sizeof(h));
        CU(cudaIpcOpenMemHandle((void **)&p, h, cudaIpcMemLazyEnablePeerAccess));
    }
    return p;
}

static void child_end(child_t *ch, unsigned char *p, wsync_cuda_import_t *im)
{
    int status = 0;
    if (im != NULL)
        wsync_cuda_import_free(im);
    else
        CU(cudaIpcCloseMemHandle(p));
    close(ch->to);
    close(ch->from);
    waitpid(ch->pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the other process: status %d",
              status);
}

/* ---- the run -------------------------------------------------------------------------------- */

static void run(void)
{
    shape_t t[MAXT];
    const int nt = model_shape(t);
    uint64_t total = 0;
    for (int i = 0; i < nt; i++)
        total += t[i].rows * t[i].cols * 2;
    child_t ch = {0, -1, -1};
    if (opt.ipc != IPC_NONE && opt.concurrent)
        child_start(total, &ch);   /* it allocates while we do */

    unsigned char *src = NULL, *dst = NULL, *srcs[MAXT], *dsts[MAXT];
    void *pad = NULL;
    int sms = 0;
    CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (!opt.separate) {
        CU(cudaMalloc((void **)&src, total));
        if (opt.pad_mb > 0)
            CU(cudaMalloc(&pad, opt.pad_mb * MiB));
        CU(cudaMalloc((void **)&dst, total));
    }
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        const uint64_t tb = t[i].rows * t[i].cols * 2;
        if (opt.separate) {
            CU(cudaMalloc((void **)&srcs[i], tb));
            CU(cudaMalloc((void **)&dsts[i], tb));
        } else {
            srcs[i] = src + off;
            dsts[i] = dst + off;
        }
        fill(srcs[i], off, tb);
        off += tb;
    }
    batches_t m = {0};
    wsync_kcopy_batch_t *all;
    make_batches(t, nt, srcs, dsts, total, &m, &all);
    CU(cudaStreamCreateWithFlags(&m.s[0], cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&m.s[1], cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&m.fork, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&m.join, cudaEventDisableTiming));
    for (int i = 0; i < m.nb; i++)
        CU(cudaEventCreateWithFlags(&m.ev[i], cudaEventDisableTiming));

    /* the reference: one cudaMemcpyAsync of every byte (--separate: of 2 GiB, scaled) */
    if (opt.separate) {
        CU(cudaMalloc(&d2d.a, 2048 * MiB));
        CU(cudaMalloc(&d2d.b, 2048 * MiB));
        d2d.bytes = 2048 * MiB;
    } else {
        d2d.a = src;
        d2d.b = dst;
        d2d.bytes = total;
    }
    const double t_d2d = time_it(d2d_launch, NULL) * (double)total / (double)d2d.bytes;
    if (opt.separate) {
        CU(cudaFree(d2d.a));
        CU(cudaFree(d2d.b));
    }
    copy_checked(&m, t, nt, srcs, dsts, sms);
    printf("model copies: %.2f GB in %d batches (%s)  d2d %.3f ms (%.0f GB/s)\n", total / 1e9,
           m.nb, opt.separate ? "a cudaMalloc each" : "one cudaMalloc", t_d2d * 1e3,
           total / t_d2d / 1e9);
    report(&m, "", t_d2d, sms);
    if (!opt.separate) {
        wsync_kcopy_t one = {src, dst, 0, total / 2, 0, total / 2, 1, total / 2,
                             WSYNC_DTYPE_BF16, WSYNC_DTYPE_BF16};
        wsync_kcopy_batch_t *b1;
        CHECK_OK(wsync_kernels_batch_create(&one, 1, &b1));
        report_one(b1, "one dense copy", t_d2d, sms);
        wsync_kernels_batch_free(b1);
    }
    report_one(all, "every copy in one launch", t_d2d, sms);
    wsync_kernels_batch_free(all);

    if (opt.ipc != IPC_NONE && !opt.separate) {
        /* first our own sources again while the other process holds its context and memory,
         * then its sources, opened here */
        if (!opt.concurrent)
            child_start(total, &ch);
        wsync_cuda_import_t *im = NULL;
        unsigned char *isrc = child_open(&ch, &im), *isrcs[MAXT];
        report(&m, "other process alive: ", t_d2d, sms);
        if (isrc != NULL) {
            off = 0;
            for (int i = 0; i < nt; i++) {
                isrcs[i] = isrc + off;
                off += t[i].rows * t[i].cols * 2;
            }
            batches_t mi = m;
            make_batches(t, nt, isrcs, dsts, total, &mi, &all);
            wsync_kernels_batch_free(all);
            copy_checked(&mi, t, nt, srcs, dsts, sms);   /* the other process's bytes are ours */
            report(&mi, "opened source: ", t_d2d, sms);
            for (int i = 0; i < mi.nb; i++)
                wsync_kernels_batch_free(mi.b[i]);
        }
        child_end(&ch, isrc, im);
    }
    for (int i = 0; i < m.nb; i++) {
        wsync_kernels_batch_free(m.b[i]);
        CU(cudaEventDestroy(m.ev[i]));
    }
    for (int i = 0; opt.separate && i < nt; i++) {
        CU(cudaFree(srcs[i]));
        CU(cudaFree(dsts[i]));
    }
    if (!opt.separate) {
        CU(cudaFree(src));
        CU(cudaFree(dst));
        if (pad != NULL)
            CU(cudaFree(pad));
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: copy_model [options]\n"
            "The copy kernels' work in a colocated FSDP-1 -> TP-1 version of the Qwen3-8B shape\n"
            "(62 batches, 16.4 GB), timed against cudaMemcpyAsync of the same bytes, on GPU 0.\n"
            "  --ipc cuda|wsync  also copy from another process's memory opened here: by\n"
            "                    cudaIpcOpenMemHandle, or through transports/cuda_ipc\n"
            "  --concurrent      that process allocates while this one does\n"
            "  --fragment        its memory in 2 MiB holes\n"
            "  --random          random source bits (default: a multiplicative sequence)\n"
            "  --events          an event after each batch, polled (as the ipc receiver)\n"
            "  --gap-ms N        the GPU idles N ms before each timed run\n"
            "  --pad-mb N        N MiB allocated between the sources and the targets\n"
            "  --separate        a cudaMalloc for every tensor\n"
            "  --help\n");
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"ipc", required_argument, NULL, 'i'}, {"concurrent", no_argument, NULL, 'c'},
        {"fragment", no_argument, NULL, 'f'},  {"random", no_argument, NULL, 'r'},
        {"events", no_argument, NULL, 'e'},    {"gap-ms", required_argument, NULL, 'g'},
        {"pad-mb", required_argument, NULL, 'p'}, {"separate", no_argument, NULL, 's'},
        {"child", no_argument, NULL, 'C'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c, child = 0, count = 0, separate = 0;
    self = argv[0];
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'i':
            opt.ipc = strcmp(optarg, "cuda") == 0 ? IPC_CUDA : strcmp(optarg, "wsync") == 0 ? IPC_WSYNC : -1;
            if (opt.ipc < 0) {
                fprintf(stderr, "copy_model: --ipc takes cuda or wsync, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'c': opt.concurrent = 1; break;
        case 'f': opt.fragment = 1; break;
        case 'r': opt.random = 1; break;
        case 'e': opt.events = 1; break;
        case 'g': opt.gap_ms = atoi(optarg); break;
        case 'p': opt.pad_mb = strtoull(optarg, NULL, 0); break;
        case 's': separate = 1; break;
        case 'C': child = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (child) {   /* --child BYTES WFD RFD: child_start's */
        if (argc - optind != 3)
            return 2;
        return child_main(strtoull(argv[optind], NULL, 0), atoi(argv[optind + 1]),
                          atoi(argv[optind + 2]));
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    opt.separate = separate;
    if (opt.separate && opt.ipc != IPC_NONE) {
        fprintf(stderr, "copy_model: --ipc needs the sources in one allocation (not --separate)\n");
        return 2;
    }
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    run();
    return check_failures > 0;
}
