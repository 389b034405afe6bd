/* FP8 on the wire (issue 18, docs/fp8_wire.md) on CUDA memory.
 *
 * 1. The kernels' descriptors, on one GPU: plans compiled with FP8 on the wire (one sender, one
 *    receiver, small buckets so that chunks are split at cell rows) for block 128x128 e4m3 from
 *    bf16, block 64x128 UE8M0 from f32 with an edge cell row, per-channel e4m3 from f16 and
 *    per-channel e5m2 without saturation: every chunk packed by wsync_kernels_pack_wire_desc
 *    (launched with wsync_kernels_quantize_many) holds the codes and scales wsync_quantize_f32
 *    gives for its region alone, and the unpack copies of wsync_kernels_unpack_wire_desc fill the
 *    target and its scale matrix with what wsync_quantize_f32 gives for the whole target; a NaN
 *    is found by the workspace check and named by _finish; wrong arguments are refused.
 * 2. Groups through the public API, nccl and ipc, FSDP-N -> TP-N (N = 2 on 4 GPUs, 1 on 2 or 3
 *    for nccl, whose ranks need a GPU each; ipc colocated FSDP-2 -> TP-2), params made here:
 *    row- and column-parallel FP8 block 128x128 targets, a per-channel one, a UE8M0 one whose
 *    scales live in host memory, one whose FSDP rows cut its cells with N = 2 (then it travels
 *    plain and its receiver quantizes), and a bf16 norm every receiver takes. Each group runs
 *    with WSYNC_FP8_WIRE=1 (and WSYNC_VERIFY=1: checksums of the wire bytes) and =0; in every
 *    version every receiver's bytes and scales must equal the CPU reference (wsync_quantize_f32
 *    of the whole target), the two runs' digests must be equal, and the bytes the senders report
 *    delivered must be exactly the wire bytes the test counts (about half for FP8 targets).
 * 3. A NaN in sender N-1's shard of 'w.block' in version 2, FP8 on the wire: the version fails
 *    with WSYNC_ERR_NONFINITE naming the param and element (nccl: and the sender), every receiver
 *    fails it and keeps version 1.
 * 4. Per-tensor targets (g_tensor_params: 't.row' from every sender's rows, 't.col' from one
 *    sender's, beside a block target and the norm): the senders agree on each target's amax
 *    every version (CUDA shards: the amax kernels, then the pack kernels with the agreed amax),
 *    and every receiver's codes and its one scale must equal wsync_quantize_f32 of the whole
 *    bf16 target, FP8 on the wire on and off alike, bytes as counted (one scale a chunk); nccl
 *    and ipc (colocated and disaggregated). A NaN in sender N-1's part of 't.row' in version 2:
 *    NONFINITE naming 't.row', its element (and for nccl the sender), version 1 kept.
 *
 * usage: test_fp8_wire_gpu [--json PATH] [--no-bench] [--only ipc|nccl] [--case SUBSTRING]
 * Exit 0 when every case passed (cases that need more GPUs than are visible are skipped and
 * said so), 1 otherwise, 77 when there is no CUDA device. Not a ctest: tests/gpu/run.sh runs it
 * (step "fp8wire"). */
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/convert.h"
#include "reshard/fp8.h"
#include "reshard/plan.h"
#include "tests/support/check.h"
#include "tests/support/fp8_wire_fixtures.h"
#include "tests/gpu/gpu_cases.h"
#include "tests/gpu/cuda_check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_RANKS 4
#define VERSIONS 3
#define TIMEOUT_MS 15000
#define CHILD_LIMIT_S 90
#define GROUP_LIMIT_MS 80000
#define BUCKET_BYTES (1u << 20)


/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Element i of param `name` in version v: a finite bf16 with |x| in [2^-7, 2) (exact in f16 and
 * f32 too), new in every version. */
static uint16_t gen1(const char *name, uint64_t v, uint64_t i)
{
    uint64_t seed = XXH3_64bits_withSeed(name, strlen(name), 0xF8F8ull + v);
    uint16_t x = (uint16_t)mix64(seed ^ (i * 0xD1B54A32D192ED03ull));
    return (uint16_t)((x & 0x8000u) | ((120u + ((x >> 7) & 7u)) << 7) | (x & 0x7Fu));
}

static float bf16f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------------------------------ */
/* 1. Descriptors and kernels, one GPU                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    uint64_t rows, cols;             /* the param, held whole by the one sender */
    uint64_t c0, tcols;              /* the target: columns [c0, c0 + tcols) of every row */
    wsync_dtype_t x_dtype;           /* the param's dtype */
    wsync_dtype_t fp8;
    wsync_quant_scheme_t scheme;
    int br, bc, ue8m0, no_saturate;
    uint64_t bucket;
} kcase_t;

static void store_as(wsync_dtype_t dt, float f, uint8_t *p)
{
    if (dt == WSYNC_DTYPE_F32) {
        memcpy(p, &f, 4);
    } else {
        uint16_t h = dt == WSYNC_DTYPE_F16 ? wsync_f32_to_f16(f) : wsync_f32_to_bf16(f);
        memcpy(p, &h, 2);
    }
}

static void kernel_case(const kcase_t *k)
{
    size_t esz = wsync_dtype_size(k->x_dtype);
    uint64_t R = k->rows, C = k->cols, TC = k->tcols, telems = R * TC;
    wsync_quant_t q = {k->scheme, k->br, k->bc, 0.0f, k->ue8m0, k->no_saturate, NULL,
                       WSYNC_MEM_CUDA};
    int64_t sr = 0, sc = 0;
    float *xf = malloc(R * C * sizeof(float)), *tf = malloc(telems * sizeof(float));
    uint8_t *xh = malloc(R * C * esz), *want = malloc(telems), *have = malloc(telems);
    float *want_s = NULL, *have_s = NULL;
    uint8_t *d_x = NULL, *d_bucket = NULL, *d_t = NULL;
    float *d_s = NULL;
    void *d_ws = NULL;
    wsync_shard_desc_t sd;
    wsync_target_desc_t td;
    wsync_plan_t *plan = NULL;
    wsync_kquant_t *qa = NULL;
    void **ws = NULL;
    wsync_kcopy_t *cp = NULL;
    wsync_segment_t *flat = NULL;   /* every receiver's segments */
    int sd_made = 0, td_made = 0;

    memset(&sd, 0, sizeof(sd));
    memset(&td, 0, sizeof(td));
    printf("-- kernels: %s\n", k->name);
    CHECK(xf && tf && xh && want && have);
    if (check_failures)
        goto out;
    for (uint64_t i = 0; i < R * C; i++) {
        xf[i] = bf16f(gen1(k->name, 1, i));
        store_as(k->x_dtype, xf[i], xh + i * esz);
    }
    for (uint64_t r = 0; r < R; r++)
        memcpy(tf + r * TC, xf + r * C + k->c0, TC * sizeof(float));
    CHECK_OK(wsync_quant_scales_shape(&q, (int64_t)R, (int64_t)TC, &sr, &sc));
    want_s = malloc((size_t)(sr * sc) * sizeof(float));
    have_s = malloc((size_t)(sr * sc) * sizeof(float));
    CHECK_OK(wsync_quantize_f32(k->name, tf, R, TC, TC, &q, k->fp8, want, TC, want_s));

    /* the plan: one sender holding the param, one receiver's FP8 target of its columns */
    wsync_shard_t sh = {{k->name, k->x_dtype, 2, {(int64_t)R, (int64_t)C}},
                        {{0, 0}, {(int64_t)R, (int64_t)C}}, xh, WSYNC_MEM_CUDA, 0};
    wsync_piece_t pc = {{k->name, k->x_dtype, 2, {(int64_t)R, (int64_t)C}},
                        {{0, (int64_t)k->c0}, {(int64_t)R, (int64_t)TC}}, {0, 0}};
    wsync_target_t tg = {k->name, k->fp8, 2, {(int64_t)R, (int64_t)TC}, want, WSYNC_MEM_CUDA, 0,
                         &pc, 1, q};
    CHECK_OK(wsync_shard_desc_from(&sh, 0, 0, &sd));
    sd_made = check_failures == 0;
    CHECK_OK(wsync_target_desc_from(&tg, 0, 0, &td));
    td_made = check_failures == 0;
    if (check_failures)
        goto out;
    CHECK_OK(wsync_plan_compile_opts(&sd, 1, &td, 1, 1, 1, k->bucket,
                                     &(wsync_plan_opts_t){.fp8_wire = 1}, &plan));
    if (check_failures)
        goto out;
    CHECK_MSG(plan->nrules == 1 && plan->nchunks >= 2, "%s: %u rules, %u chunks (expected 1 "
              "rule and chunks split by the %" PRIu64 "-byte buckets)", k->name, plan->nrules,
              plan->nchunks, k->bucket);
    for (uint32_t i = 0; i < plan->nchunks; i++)
        CHECK_MSG(plan->chunks[i].rule == 1, "%s: chunk %u travels plain", k->name, i);
    if (check_failures)
        goto out;
    printf("   %u chunks in %u buckets of %" PRIu64 " bytes\n", plan->nchunks, plan->nbuckets[0],
           k->bucket);

    CU_OK(cudaMalloc((void **)&d_x, R * C * esz));
    CU_OK(cudaMalloc((void **)&d_bucket, (size_t)plan->nbuckets[0] * k->bucket));
    CU_OK(cudaMalloc((void **)&d_t, telems));
    CU_OK(cudaMalloc((void **)&d_s, (size_t)(sr * sc) * sizeof(float)));
    CU_OK(cudaMalloc(&d_ws, (size_t)plan->nchunks * WSYNC_KQUANT_WS_BYTES));
    CU_OK(cudaMemcpy(d_x, xh, R * C * esz, cudaMemcpyHostToDevice));
    CU_OK(cudaMemset(d_bucket, 0xFF, (size_t)plan->nbuckets[0] * k->bucket));
    CU_OK(cudaMemset(d_t, 0xFF, telems));
    CU_OK(cudaMemset(d_s, 0xFF, (size_t)(sr * sc) * sizeof(float)));
    CU_OK(cudaMemset(d_ws, 0, (size_t)plan->nchunks * WSYNC_KQUANT_WS_BYTES));

    /* pack: every chunk in one quantize_many */
    qa = calloc(plan->nchunks, sizeof(*qa));
    ws = calloc(plan->nchunks, sizeof(*ws));
    CHECK(qa && ws);
    if (check_failures)
        goto out;
    for (uint32_t i = 0; i < plan->nchunks; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        CHECK_OK(wsync_kernels_pack_wire_desc(plan, c, d_x,
                                              d_bucket + (size_t)c->bucket * k->bucket, &qa[i]));
        qa[i].name = k->name;
        ws[i] = (uint8_t *)d_ws + (size_t)i * WSYNC_KQUANT_WS_BYTES;
    }
    if (check_failures)
        goto out;
    CHECK_OK(wsync_kernels_quantize_many(qa, plan->nchunks, ws, 0, NULL));
    for (uint32_t i = 0; i < plan->nchunks; i++)
        CHECK_OK(wsync_kernels_quantize_finish(&qa[i], ws[i], NULL));
    /* each chunk's place: the codes and scales of its region quantized alone */
    for (uint32_t i = 0; i < plan->nchunks && !check_failures; i++) {
        const wsync_chunk_t *c = &plan->chunks[i];
        uint64_t rows = c->src.rows, cols = c->src.cols, r0 = c->src.off / C;
        uint64_t wb = wsync_chunk_wire_bytes(c);
        uint8_t *place = malloc(wb), *ref = malloc(rows * cols);
        float *xs = malloc(rows * cols * sizeof(float)), *ref_s = malloc(c->ncells * sizeof(float));
        CHECK(place && ref && xs && ref_s);
        if (!check_failures) {
            for (uint64_t r = 0; r < rows; r++)
                memcpy(xs + r * cols, xf + (r0 + r) * C + c->src.off % C, cols * sizeof(float));
            CHECK_OK(wsync_quantize_f32(k->name, xs, rows, cols, cols, &q, k->fp8, ref, cols,
                                        ref_s));
            if (cudaMemcpy(place, d_bucket + (size_t)c->bucket * k->bucket + c->bucket_off, wb,
                           cudaMemcpyDeviceToHost) != cudaSuccess)
                check_failures++;
            CHECK_MSG(memcmp(place, ref, rows * cols) == 0, "%s: chunk %u (rows %" PRIu64
                      "..+%" PRIu64 "): codes differ from its region quantized alone", k->name, i,
                      r0, rows);
            CHECK_MSG(memcmp(place + wsync_wire_scales_off(rows, cols), ref_s,
                             c->ncells * sizeof(float)) == 0,
                      "%s: chunk %u: scales differ from its region quantized alone", k->name, i);
        }
        free(place);
        free(ref);
        free(xs);
        free(ref_s);
    }

    /* unpack: two copies a segment, one batch */
    cp = calloc(2 * (size_t)plan->nsegments + 1, sizeof(*cp));
    CHECK(cp != NULL);
    CHECK_OK(wsync_plan_flatten(plan, &flat));
    for (uint32_t i = 0; cp && flat && i < plan->nsegments; i++) {
        const wsync_segment_t *sg = &flat[i];
        const wsync_chunk_t *c = &plan->chunks[sg->chunk];
        CHECK_OK(wsync_kernels_unpack_wire_desc(plan, sg, c,
                                                d_bucket + (size_t)c->bucket * k->bucket, &td,
                                                d_t, d_s, &cp[2 * i]));
    }
    if (check_failures)
        goto out;
    CHECK_OK(wsync_kernels_copy(cp, 2 * plan->nsegments, NULL));
    CU_OK(cudaDeviceSynchronize());
    CU_OK(cudaMemcpy(have, d_t, telems, cudaMemcpyDeviceToHost));
    CU_OK(cudaMemcpy(have_s, d_s, (size_t)(sr * sc) * sizeof(float), cudaMemcpyDeviceToHost));
    fw_check_codes(k->name, have, want, R, TC, have_s, want_s, (uint64_t)(sr * sc));

    fw_check_wire_desc_refusals(plan, &td, d_x, d_bucket, d_t, d_s);

    /* a NaN in the first chunk's region (its row 1, column 2): the workspace check finds the
     * chunk, _finish names the element */
    {
        const wsync_chunk_t *c = &plan->chunks[0];
        uint64_t e = c->src.off + 1 * c->src.pitch + 2;
        uint8_t nanb[4];
        size_t bad = 99;
        store_as(k->x_dtype, bf16f(0x7fc0), nanb);
        CU_OK(cudaMemcpy(d_x + e * esz, nanb, esz, cudaMemcpyHostToDevice));
        CU_OK(cudaMemset(d_ws, 0, (size_t)plan->nchunks * WSYNC_KQUANT_WS_BYTES));
        CHECK_OK(wsync_kernels_quantize_many(qa, plan->nchunks, ws, 0, NULL));
        CHECK_OK(wsync_dev_quantize_check(d_ws, plan->nchunks, NULL, wsync_deadline_in(10000),
                                          &bad));
        CHECK_MSG(bad == 0, "%s: the NaN's chunk is 0, the check says %zu", k->name, bad);
        CHECK_ST(wsync_kernels_quantize_finish(&qa[0], ws[0], NULL), WSYNC_ERR_NONFINITE);
        CHECK_ERR_HAS("NaN at row 1, column 2");
    }
out:
    cudaFree(d_x);
    cudaFree(d_bucket);
    cudaFree(d_t);
    cudaFree(d_s);
    cudaFree(d_ws);
    free(qa);
    free(ws);
    free(cp);
    free(flat);
    wsync_plan_free(plan);
    if (sd_made)
        wsync_shard_desc_clear(&sd);
    if (td_made)
        wsync_target_desc_clear(&td);
    free(xf);
    free(tf);
    free(xh);
    free(want);
    free(have);
    free(want_s);
    free(have_s);
}

static int kernels_main(void *arg)
{
    (void)arg;
    static const kcase_t cases[] = {
        {"block 128x128 e4m3 from bf16, a column slice", 640, 512, 256, 256, WSYNC_DTYPE_BF16,
         WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_BLOCK, 128, 128, 0, 0, 64u << 10},
        {"block 64x128 ue8m0 e4m3 from f32, an edge cell row", 300, 384, 0, 384, WSYNC_DTYPE_F32,
         WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_BLOCK, 64, 128, 1, 0, 96u << 10},
        {"channel e4m3 from f16, a column slice", 200, 320, 64, 256, WSYNC_DTYPE_F16,
         WSYNC_DTYPE_F8E4M3FN, WSYNC_QUANT_CHANNEL, 0, 0, 0, 0, 16u << 10},
        {"channel e5m2 from bf16, no saturation", 130, 128, 0, 128, WSYNC_DTYPE_BF16,
         WSYNC_DTYPE_F8E5M2, WSYNC_QUANT_CHANNEL, 0, 0, 0, 1, 8u << 10},
    };
    check_failures = 0;
    if (cudaSetDevice(0) != cudaSuccess)
        return 1;
    int total = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int before = check_failures;
        kernel_case(&cases[i]);
        printf("-- kernels: %s: %s\n", cases[i].name, check_failures == before ? "pass" : "FAIL");
        total += check_failures - before;
    }
    return total ? 1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* 2, 3. Groups                                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum { ROWPAR = 0, COLPAR = 1, REPL = 2 };

typedef struct {
    const char *name;
    int kind;                        /* ROWPAR: a receiver takes a slice of columns; COLPAR: of
                                        rows; REPL: 1-D, every receiver all of it (bf16) */
    int64_t rows, cols;              /* REPL: cols elements */
    wsync_quant_scheme_t scheme;
    int br, bc, ue8m0, host_scales;
} gparam_t;

/* Every FSDP split up to 2 and TP split up to 2 keeps 128-row cells whole, but for 'w.cut'
 * (192 rows a sender with 2 senders): its target travels plain then. 'w.colpar' is large enough
 * for its FP8 chunks to be ops of their own (above WSYNC_NCCL_DIRECT_MIN). 'w.block' comes
 * first: its chunks are in every sender's first bucket. 'w.late' comes last and fills each
 * sender's last bucket alone with FSDP-2 -> TP-2, for receiver j = sender j only: receiver 1 - j
 * has all it takes from sender j before sender j checks that bucket's FP8 values. */
static const gparam_t g_params[] = {
    {"w.block", ROWPAR, 1024, 512, WSYNC_QUANT_BLOCK, 128, 128, 0, 0},
    {"w.colpar", COLPAR, 2048, 512, WSYNC_QUANT_BLOCK, 128, 128, 0, 0},
    {"w.channel", ROWPAR, 384, 512, WSYNC_QUANT_CHANNEL, 0, 0, 0, 0},
    {"w.ue8m0", ROWPAR, 256, 512, WSYNC_QUANT_BLOCK, 128, 128, 1, 1},
    {"w.cut", ROWPAR, 384, 256, WSYNC_QUANT_BLOCK, 128, 128, 0, 0},
    {"norm", REPL, 1, 512, WSYNC_QUANT_NONE, 0, 0, 0, 0},
    {"w.late", COLPAR, 4096, 512, WSYNC_QUANT_BLOCK, 128, 128, 0, 0},
};
/* 4. Per-tensor targets (one scale for the whole target: the senders agree on its amax every
 * version): 't.row' takes a column slice of every sender's rows (n chunks, one from each
 * sender, one set), 't.col' a sender's rows (one chunk), beside a block one and the norm; each
 * sender's shards fit one bucket, so no chunk is cut at a bucket's end. */
static const gparam_t g_tensor_params[] = {
    {"t.row", ROWPAR, 256, 512, WSYNC_QUANT_TENSOR, 0, 0, 0, 0},
    {"w.small", ROWPAR, 256, 256, WSYNC_QUANT_BLOCK, 128, 128, 0, 0},
    {"t.col", COLPAR, 512, 256, WSYNC_QUANT_TENSOR, 0, 0, 0, 0},
    {"norm", REPL, 1, 512, WSYNC_QUANT_NONE, 0, 0, 0, 0},
};
#define NPARAMS (sizeof(g_params) / sizeof(g_params[0]))

/* The table the next group runs (set before its children are forked) and a label for its
 * cases' names. */
static const gparam_t *g_tab = g_params;
static size_t g_np = NPARAMS;   /* at most NPARAMS: the children's arrays hold that many */
static const char *g_label = "";

typedef struct {
    const char *name;
    const char *scheme;
    int n;                           /* FSDP-n -> TP-n */
    int colocated;
    int wire;                        /* WSYNC_FP8_WIRE */
    int nan_v2;                      /* version 2 of sender n-1 holds a NaN: 1, in w.block (row
                                        3, column 5 of its shard: its first bucket); 2, in w.late
                                        (its shard's last row, column 5: its last bucket) */
    int ngpu;
    int port;
    int rank;
} group_t;

typedef struct {
    uint64_t digest[MAX_RANKS][VERSIONS + 1];
    uint64_t delivered[MAX_RANKS][VERSIONS + 1];
    int versions_right[MAX_RANKS];
    int failed_at[2 * MAX_RANKS];
    int error_status[2 * MAX_RANKS];
    char error_text[2 * MAX_RANKS][512];
    uint64_t version_after[MAX_RANKS];
    atomic_int joined;
} shared_t;

static shared_t *g_shared;
static char coord[64];

static int gpu_of_sender(const group_t *g, int i) { return g->colocated ? i % g->ngpu : i; }
static int gpu_of_receiver(const group_t *g, int j)
{
    return g->colocated ? j % g->ngpu : g->n + j;
}

static void note_error(int slot, int v, wsync_status_t st)
{
    g_shared->failed_at[slot] = v;
    g_shared->error_status[slot] = (int)st;
    snprintf(g_shared->error_text[slot], sizeof(g_shared->error_text[slot]), "%s",
             wsync_last_error());
}

/* Sender `rank` of n: rows [rank * R / n, ...) of each 2-D param, elements likewise of a 1-D. */
static void shard_box(const gparam_t *p, int rank, int n, wsync_param_t *prm, wsync_box_t *b)
{
    memset(prm, 0, sizeof(*prm));
    memset(b, 0, sizeof(*b));
    prm->name = p->name;
    prm->dtype = WSYNC_DTYPE_BF16;
    if (p->kind == REPL) {
        prm->ndim = 1;
        prm->shape[0] = p->cols;
        b->start[0] = rank * p->cols / n;
        b->len[0] = p->cols / n;
        return;
    }
    prm->ndim = 2;
    prm->shape[0] = p->rows;
    prm->shape[1] = p->cols;
    b->start[0] = rank * p->rows / n;
    b->len[0] = p->rows / n;
    b->len[1] = p->cols;
}

/* Receiver j of n: its target of param p (one piece). */
static void target_of(const gparam_t *p, int j, int n, wsync_piece_t *pc, wsync_target_t *t)
{
    memset(pc, 0, sizeof(*pc));
    memset(t, 0, sizeof(*t));
    pc->param.name = p->name;
    pc->param.dtype = WSYNC_DTYPE_BF16;
    t->name = p->name;
    t->pieces = pc;
    t->npieces = 1;
    t->mem = WSYNC_MEM_CUDA;
    if (p->kind == REPL) {
        pc->param.ndim = 1;
        pc->param.shape[0] = p->cols;
        pc->src.len[0] = p->cols;
        t->dtype = WSYNC_DTYPE_BF16;
        t->ndim = 1;
        t->shape[0] = p->cols;
        return;
    }
    pc->param.ndim = 2;
    pc->param.shape[0] = p->rows;
    pc->param.shape[1] = p->cols;
    if (p->kind == ROWPAR) {
        pc->src.start[1] = j * p->cols / n;
        pc->src.len[0] = p->rows;
        pc->src.len[1] = p->cols / n;
    } else {
        pc->src.start[0] = j * p->rows / n;
        pc->src.len[0] = p->rows / n;
        pc->src.len[1] = p->cols;
    }
    t->dtype = WSYNC_DTYPE_F8E4M3FN;
    t->ndim = 2;
    t->shape[0] = pc->src.len[0];
    t->shape[1] = pc->src.len[1];
    t->quant.scheme = p->scheme;
    t->quant.block_rows = p->br;
    t->quant.block_cols = p->bc;
    t->quant.ue8m0 = p->ue8m0;
}

static uint64_t elems_of_target(const wsync_target_t *t)
{
    uint64_t e = 1;
    for (int d = 0; d < t->ndim; d++)
        e *= (uint64_t)t->shape[d];
    return e;
}

/* Whether target p of a group of n senders travels as FP8: its cells whole in every sender's
 * rows (channel cells are rows: always). */
static int travels_fp8(const gparam_t *p, int n)
{
    if (p->kind == REPL)
        return 0;
    if (p->scheme == WSYNC_QUANT_CHANNEL || p->scheme == WSYNC_QUANT_TENSOR)
        return 1;
    return (p->rows / n) % p->br == 0;   /* COLPAR: the target's rows are a sender's */
}

/* Bytes every sender together delivers a version: FP8 codes and one f32 a cell where the
 * target travels FP8, bf16 values elsewhere. */
static uint64_t expected_bytes(int n, int wire)
{
    uint64_t total = 0;
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < g_np; i++) {
            const gparam_t *p = &g_tab[i];
            wsync_piece_t pc;
            wsync_target_t t;
            target_of(p, j, n, &pc, &t);
            uint64_t e = elems_of_target(&t);
            if (!wire || !travels_fp8(p, n)) {
                total += e * 2;
                continue;
            }
            /* per-tensor: one cell a chunk, a chunk from each sender holding rows of it */
            uint64_t cells = p->scheme == WSYNC_QUANT_TENSOR ? (p->kind == ROWPAR ? (uint64_t)n : 1)
                             : p->scheme == WSYNC_QUANT_CHANNEL
                                 ? (uint64_t)t.shape[0]
                                 : (uint64_t)((t.shape[0] + p->br - 1) / p->br) *
                                       (uint64_t)((t.shape[1] + p->bc - 1) / p->bc);
            total += e + 4 * cells;
        }
    return total;
}

/* The bytes and scales target t (param p, receiver j) holds after version v. */
static int reference(const gparam_t *p, const wsync_target_t *t, uint64_t v, uint8_t *out,
                     float *scales)
{
    uint64_t e = elems_of_target(t);
    if (p->kind == REPL) {
        for (uint64_t i = 0; i < e; i++) {
            uint16_t h = gen1(p->name, v, i);
            memcpy(out + 2 * i, &h, 2);
        }
        return 0;
    }
    uint64_t R = (uint64_t)t->shape[0], C = (uint64_t)t->shape[1];
    float *x = malloc(e * sizeof(float));
    if (!x)
        return -1;
    for (uint64_t r = 0; r < R; r++)
        for (uint64_t c = 0; c < C; c++) {
            uint64_t pr = (uint64_t)t->pieces[0].src.start[0] + r;
            uint64_t pcol = (uint64_t)t->pieces[0].src.start[1] + c;
            x[r * C + c] = bf16f(gen1(p->name, v, pr * (uint64_t)p->cols + pcol));
        }
    wsync_status_t st = wsync_quantize_f32(t->name, x, R, C, C, &t->quant, t->dtype, out, C,
                                           scales);
    free(x);
    return st == WSYNC_OK ? 0 : -1;
}

static int sender_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = gpu_of_sender(g, rank), failed_at = 0;
    uint8_t *block = NULL, *host = NULL;
    size_t off[NPARAMS], bytes = 0;
    wsync_param_t prm[NPARAMS];
    wsync_box_t box[NPARAMS];
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_status_t st;

    check_failures = 0;
    /* 2: also where ipc keeps the bytes on one GPU (1 would leave those plain: it pays less) */
    setenv("WSYNC_FP8_WIRE", g->wire ? "2" : "0", 1);
    setenv("WSYNC_VERIFY", g->wire ? "1" : "0", 1);
    CU_OK(cudaSetDevice(dev));
    for (size_t i = 0; i < g_np; i++) {
        shard_box(&g_tab[i], rank, g->n, &prm[i], &box[i]);
        off[i] = bytes;
        uint64_t e = (uint64_t)box[i].len[0] * (prm[i].ndim == 2 ? (uint64_t)box[i].len[1] : 1);
        bytes += (e * 2 + 255) & ~(size_t)255;
    }
    host = malloc(bytes);
    CU_OK(cudaMalloc((void **)&block, bytes));
    CHECK(host != NULL);
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = g->n;
    sp.nreceivers = g->n;
    sp.scheme = g->scheme;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    sp.bucket_bytes = BUCKET_BYTES;
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    if (check_failures)
        goto out;
    for (size_t i = 0; i < g_np; i++) {
        wsync_shard_t sh = {prm[i], box[i], block + off[i], WSYNC_MEM_CUDA, dev};
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    if (check_failures)
        goto out;
    for (int v = 1; v <= VERSIONS && !failed_at; v++) {
        for (size_t i = 0; i < g_np; i++) {
            uint64_t rowe = prm[i].ndim == 2 ? (uint64_t)prm[i].shape[1] : 1;
            uint64_t e = (uint64_t)box[i].len[0] * rowe, first = (uint64_t)box[i].start[0] * rowe;
            for (uint64_t k = 0; k < e; k++) {
                uint16_t h = gen1(prm[i].name, (uint64_t)v, first + k);
                memcpy(host + off[i] + 2 * k, &h, 2);
            }
            if (g->nan_v2 && v == 2 && rank == g->n - 1 &&
                strcmp(prm[i].name, g->nan_v2 == 1   ? "w.block"
                                    : g->nan_v2 == 2 ? "w.late"
                                                     : "t.row") == 0) {
                uint64_t row = g->nan_v2 != 2 ? 3 : (uint64_t)box[i].len[0] - 1;
                uint16_t nan = 0x7fc0;
                memcpy(host + off[i] + 2 * (row * rowe + 5), &nan, 2);
            }
        }
        CU_OK(cudaMemcpy(block, host, bytes, cudaMemcpyHostToDevice));
        st = v == 1 ? wsync_sender_setup(s) : WSYNC_OK;
        if (st == WSYNC_OK)
            st = wsync_sender_push(s, (uint64_t)v);
        if (st != WSYNC_OK) {
            note_error(rank, v, st);
            failed_at = v;
            break;
        }
        wsync_push_stats_t ps;
        CHECK_OK(wsync_sender_stats(s, &ps));
        g_shared->delivered[rank][v] = ps.bytes_delivered;
    }
    if (failed_at && !g->nan_v2)
        fprintf(stderr, "sender %d: version %d failed: %s\n", rank, failed_at,
                g_shared->error_text[rank]);
    CHECK(g->nan_v2 || failed_at == 0);
    if (rank == 0 && failed_at) {
        /* the coordinator stays until every receiver has heard (bounded) */
        long long until = proc_now_ms() + 10000;
        while (atomic_load(&g_shared->joined) < g->n && proc_now_ms() < until)
            usleep(10000);
        usleep(1000000);
    }
out:
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    cudaFree(block);
    free(host);
    return check_failures ? 1 : 0;
}

static int receiver_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = gpu_of_receiver(g, rank), slot = MAX_RANKS + rank, failed = 0;
    wsync_piece_t pcs[NPARAMS];
    wsync_target_t tg[NPARAMS];
    uint8_t *data[NPARAMS] = {0};
    float *scales[NPARAMS] = {0};
    size_t nscales[NPARAMS] = {0};
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_status_t st;

    check_failures = 0;
    CU_OK(cudaSetDevice(dev));
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = coord;
    rp.rank = rank;
    rp.nreceivers = g->n;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    st = wsync_receiver_create(ctx, &rp, &rv);
    atomic_fetch_add(&g_shared->joined, 1);
    CHECK_OK(st);
    if (check_failures)
        goto out;
    for (size_t i = 0; i < g_np; i++) {
        const gparam_t *p = &g_tab[i];
        target_of(p, rank, g->n, &pcs[i], &tg[i]);
        size_t bytes = elems_of_target(&tg[i]) * wsync_dtype_size(tg[i].dtype);
        CU_OK(cudaMalloc((void **)&data[i], bytes));
        tg[i].data = data[i];
        tg[i].device = dev;
        if (tg[i].quant.scheme != WSYNC_QUANT_NONE) {
            int64_t sr = 0, sc = 0;
            CHECK_OK(wsync_quant_scales_shape(&tg[i].quant, tg[i].shape[0], tg[i].shape[1], &sr,
                                              &sc));
            nscales[i] = (size_t)(sr * sc);
            if (p->host_scales) {
                scales[i] = malloc(nscales[i] * sizeof(float));
                tg[i].quant.scales_mem = WSYNC_MEM_HOST;
            } else {
                CU_OK(cudaMalloc((void **)&scales[i], nscales[i] * sizeof(float)));
                tg[i].quant.scales_mem = WSYNC_MEM_CUDA;
            }
            tg[i].quant.scales = scales[i];
        }
        CHECK_OK(wsync_receiver_add_target(rv, &tg[i]));
    }
    if (check_failures)
        goto out;
    for (int v = 1; v <= VERSIONS && !failed; v++) {
        /* poison: a byte this version does not write cannot pass for data */
        for (size_t i = 0; i < g_np; i++) {
            CU_OK(cudaMemset(data[i], 0xFF,
                             elems_of_target(&tg[i]) * wsync_dtype_size(tg[i].dtype)));
            if (scales[i] && g_tab[i].host_scales)
                memset(scales[i], 0xFF, nscales[i] * sizeof(float));
            else if (scales[i])
                CU_OK(cudaMemset(scales[i], 0xFF, nscales[i] * sizeof(float)));
        }
        CU_OK(cudaDeviceSynchronize());
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, -1, &got);
        if (st != WSYNC_OK) {
            note_error(slot, v, st);
            failed = v;
            break;
        }
        CHECK_MSG(got == (uint64_t)v, "receiver %d: wait reported version %llu, expected %d", rank,
                  (unsigned long long)got, v);
        XXH3_state_t *h = XXH3_createState();
        XXH3_64bits_reset(h);
        int wrong = 0;
        for (size_t i = 0; i < g_np; i++) {
            size_t bytes = elems_of_target(&tg[i]) * wsync_dtype_size(tg[i].dtype);
            uint8_t *want = malloc(bytes), *have = malloc(bytes);
            float *want_s = malloc((nscales[i] + 1) * 4), *have_s = malloc((nscales[i] + 1) * 4);
            CHECK(reference(&g_tab[i], &tg[i], (uint64_t)v, want, want_s) == 0);
            if (cudaMemcpy(have, data[i], bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
                check_failures++;
            if (nscales[i] && g_tab[i].host_scales)
                memcpy(have_s, scales[i], nscales[i] * 4);
            else if (nscales[i] &&
                     cudaMemcpy(have_s, scales[i], nscales[i] * 4, cudaMemcpyDeviceToHost) !=
                         cudaSuccess)
                check_failures++;
            XXH3_64bits_update(h, have, bytes);
            XXH3_64bits_update(h, have_s, nscales[i] * 4);
            size_t k = 0;
            while (k < bytes && want[k] == have[k])
                k++;
            int sbad = nscales[i] && memcmp(want_s, have_s, nscales[i] * 4) != 0;
            if (k < bytes || sbad) {
                if (wrong++ < 4)
                    fprintf(stderr, "receiver %d (GPU %d) version %d: target %s differs (%s byte "
                            "%zu of %zu: 0x%02x, expected 0x%02x)\n", rank, dev, v, tg[i].name,
                            k < bytes ? "first" : "scales; codes equal,", k < bytes ? k : 0,
                            bytes, k < bytes ? have[k] : 0, k < bytes ? want[k] : 0);
            }
            free(want);
            free(have);
            free(want_s);
            free(have_s);
        }
        g_shared->digest[rank][v] = XXH3_64bits_digest(h);
        XXH3_freeState(h);
        CHECK_MSG(wrong == 0, "receiver %d: %d targets differ from the CPU reference in version "
                  "%d", rank, wrong, v);
        if (!wrong)
            g_shared->versions_right[rank]++;
    }
    g_shared->version_after[rank] = wsync_receiver_version(rv);
    if (failed && !g->nan_v2)
        fprintf(stderr, "receiver %d: version %d failed: %s\n", rank, failed,
                g_shared->error_text[slot]);
    CHECK(g->nan_v2 || !failed);
out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (size_t i = 0; i < g_np; i++) {
        cudaFree(data[i]);
        if (scales[i] && g_tab[i].host_scales)
            free(scales[i]);
        else if (scales[i])
            cudaFree(scales[i]);
    }
    return check_failures ? 1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static gpu_cases_t g_cases;   /* the command line, the GPU count, the table of cases */

static int wanted(const char *scheme, const char *name)
{
    return (!g_cases.only || strcmp(g_cases.only, scheme) == 0) && (!g_cases.match || strstr(name, g_cases.match));
}

static int gpus_needed(const group_t *g) { return g->colocated ? 1 : 2 * g->n; }

/* The row of a group case named in row->name: 0 when it is not to run (not asked for: the row
 * is dropped; too few GPUs: marked skipped, saying why), else 1, the case announced. */
static int case_open(gpu_case_t *row, group_t *g)
{
    g->name = row->name;
    if (!wanted(g->scheme, row->name)) {
        g_cases.nrows--;
        return 0;
    }
    if (gpus_needed(g) > g_cases.ngpu) {
        row->result = "skipped";
        snprintf(row->why, sizeof(row->why), "needs %d GPUs, %d visible", gpus_needed(g), g_cases.ngpu);
        printf("-- %s: skipped (%s)\n", row->name, row->why);
        return 0;
    }
    printf("-- %s\n", row->name);
    fflush(stdout);
    return 1;
}

/* The case's result: pass when no check failed since `before`, its time since t0 (ms). */
static void case_close(gpu_case_t *row, long long t0, int before)
{
    row->seconds = (double)(proc_now_ms() - t0) / 1000.0;
    row->result = check_failures == before ? "pass" : "FAIL";
    printf("-- %s: %s in %.1f s%s%s%s\n", row->name, row->result, row->seconds,
           row->why[0] ? " (" : "", row->why, row->why[0] ? ")" : "");
    fflush(stdout);
}

/* Run one group; 0 when every child exited 0. The digests and counts stay in g_shared. */
static int run_group(group_t g)
{
    int np = 2 * g.n, codes[2 * MAX_RANKS], bad = 0;
    pid_t pids[2 * MAX_RANKS];
    group_t cfg[2 * MAX_RANKS];

    g.ngpu = g_cases.ngpu;
    memset(g_shared, 0, sizeof(*g_shared));
    g.port = proc_free_port();
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", g.port);
    for (int i = 0; i < np; i++) {
        cfg[i] = g;
        cfg[i].rank = i < g.n ? i : i - g.n;
        pids[i] = proc_spawn(i < g.n ? sender_main : receiver_main, &cfg[i], CHILD_LIMIT_S);
    }
    proc_wait_all(pids, np, GROUP_LIMIT_MS, codes);
    for (int i = 0; i < np; i++)
        if (codes[i] != 0) {
            fprintf(stderr, "%s (%s): %s %d exited with %d\n", g.name, g.wire ? "wire on" :
                    "wire off", i < g.n ? "sender" : "receiver", i < g.n ? i : i - g.n, codes[i]);
            bad++;
        }
    return bad;
}

/* The group with FP8 on the wire, then without: both right in every version, byte-identical,
 * and the bytes delivered exactly the count for each. */
static void case_equal(const char *scheme, int n, int colocated)
{
    gpu_case_t *row = gpu_cases_add(&g_cases);
    group_t g = {.scheme = scheme, .n = n, .colocated = colocated};
    snprintf(row->name, sizeof(row->name), "%s%s %s FSDP-%d -> TP-%d: FP8 on the wire = off, "
             "bytes halved", g_label, scheme, colocated ? "colocated" : "disaggregated", n, n);
    if (!case_open(row, &g))
        return;
    long long t0 = proc_now_ms();
    int before = check_failures;
    uint64_t digest[2][MAX_RANKS][VERSIONS + 1], bytes[2] = {0, 0};
    for (int w = 1; w >= 0; w--) {
        g.wire = w;
        CHECK_MSG(run_group(g) == 0, "%s: the run with FP8 on the wire %s failed", row->name,
                  w ? "on" : "off");
        for (int r = 0; r < n; r++)
            CHECK_MSG(g_shared->versions_right[r] == VERSIONS, "%s (wire %s): receiver %d: %d of "
                      "%d versions right", row->name, w ? "on" : "off", r,
                      g_shared->versions_right[r], VERSIONS);
        memcpy(digest[w], g_shared->digest, sizeof(digest[w]));
        for (int s = 0; s < n; s++)
            bytes[w] += g_shared->delivered[s][VERSIONS];
        uint64_t want = expected_bytes(n, w);
        CHECK_MSG(bytes[w] == want, "%s (wire %s): the senders delivered %llu bytes a version, "
                  "the count is %llu", row->name, w ? "on" : "off", (unsigned long long)bytes[w],
                  (unsigned long long)want);
    }
    for (int r = 0; r < n; r++)
        for (int v = 1; v <= VERSIONS; v++)
            CHECK_MSG(digest[0][r][v] == digest[1][r][v], "%s: receiver %d version %d: targets "
                      "and scales differ between FP8 on the wire on and off (%016llx, %016llx)",
                      row->name, r, v, (unsigned long long)digest[1][r][v],
                      (unsigned long long)digest[0][r][v]);
    double ratio = bytes[0] ? (double)bytes[1] / (double)bytes[0] : 0.0;
    snprintf(row->why, sizeof(row->why), "bytes a version: %llu on, %llu off (%.3f)",
             (unsigned long long)bytes[1], (unsigned long long)bytes[0], ratio);
    case_close(row, t0, before);
}

/* A NaN in version 2 with FP8 on the wire: refused with NONFINITE, naming the param and its
 * element; no receiver commits it. */
static void case_nan(const char *scheme, int n, int colocated, int where)
{
    gpu_case_t *row = gpu_cases_add(&g_cases);
    group_t g = {.scheme = scheme, .n = n, .colocated = colocated, .wire = 1, .nan_v2 = where};
    char has[128];
    snprintf(row->name, sizeof(row->name), "%s%s %s FSDP-%d -> TP-%d: NaN in version 2 (%s): "
             "NONFINITE, version 1 kept", g_label, scheme, colocated ? "colocated" :
             "disaggregated", n, n, where == 1 ? "first bucket" : where == 2 ? "last bucket" :
             "t.row, before the amaxes are agreed");
    if (!case_open(row, &g))
        return;
    long long t0 = proc_now_ms();
    int before = check_failures, found = 0;
    CHECK_MSG(run_group(g) == 0, "%s: a participant exited badly", row->name);
    /* w.block: sender n-1's row 3 is the param's row (n-1) * R / n + 3, receiver 0 takes
     * column 5; w.late: the last row of the param, receiver n-1's (rows are the targets') */
    if (where == 1)
        snprintf(has, sizeof(has), "w.block: NaN at row %d, column 5", (n - 1) * 1024 / n + 3);
    else if (where == 3)   /* t.row: sender n-1's chunk for receiver 0 (columns from 0) */
        snprintf(has, sizeof(has), "t.row: NaN at row %d, column 5", (n - 1) * 256 / n + 3);
    else
        snprintf(has, sizeof(has), "w.late: NaN at row 4095, column 5");
    for (int i = 0; i < 2 * n; i++) {
        int slot = i < n ? i : MAX_RANKS + i - n;
        printf("   %s %d: %s: %s\n", i < n ? "sender" : "receiver", i < n ? i : i - n,
               g_shared->error_status[slot]
                   ? wsync_status_name((wsync_status_t)g_shared->error_status[slot])
                   : "ok",
               g_shared->error_text[slot]);
        found |= g_shared->error_status[slot] == (int)WSYNC_ERR_NONFINITE &&
                 strstr(g_shared->error_text[slot], has) != NULL;
    }
    CHECK_MSG(found, "%s: no participant failed with WSYNC_ERR_NONFINITE and \"%s\"", row->name,
              has);
    if (strcmp(scheme, "nccl") == 0) {
        char who[32];
        snprintf(who, sizeof(who), "sender %d", n - 1);
        int slot = n - 1;
        CHECK_MSG(g_shared->error_status[slot] == (int)WSYNC_ERR_NONFINITE &&
                      strstr(g_shared->error_text[slot], who) != NULL &&
                      strstr(g_shared->error_text[slot], has) != NULL,
                  "%s: %s failed with %s \"%s\", expected WSYNC_ERR_NONFINITE naming it and "
                  "\"%s\"", row->name, who,
                  wsync_status_name((wsync_status_t)g_shared->error_status[slot]),
                  g_shared->error_text[slot], has);
    }
    /* no receiver taking anything from the sender that refuses may complete version 2: with the
     * NaN in its first bucket nothing of it went out; in its last bucket, the receivers done
     * with it earlier wait for its word that its FP8 values passed (nccl PACKED, ipc too) */
    for (int r = 0; r < n; r++) {
        CHECK_MSG(g_shared->failed_at[MAX_RANKS + r] == 2, "%s: receiver %d: version 2 %s",
                  row->name, r, g_shared->failed_at[MAX_RANKS + r] ? "was not the one that "
                  "failed" : "did not fail");
        CHECK_MSG(g_shared->versions_right[r] == 1 && g_shared->version_after[r] == 1,
                  "%s: receiver %d holds version %llu after the failure (%d right), expected 1",
                  row->name, r, (unsigned long long)g_shared->version_after[r],
                  g_shared->versions_right[r]);
    }
    case_close(row, t0, before);
}

int main(int argc, char **argv)
{
    int rc = gpu_cases_args(&g_cases, argc, argv);
    if (rc != 0)
        return rc;
    gpu_cases_count_gpus(&g_cases);   /* in a child: the parent never initializes CUDA */
    if (g_cases.ngpu == 0) {
        printf("test_fp8_wire_gpu: no CUDA device: skipped\n");
        return 77;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    g_shared = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (g_shared == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    printf("test_fp8_wire_gpu: %d GPU(s)\n", g_cases.ngpu);
    if (!g_cases.match || strstr("kernels: pack and unpack descriptors", g_cases.match)) {
        gpu_case_t *row = gpu_cases_add(&g_cases);
        int code = 0;
        snprintf(row->name, sizeof(row->name), "kernels: pack and unpack descriptors");
        long long t0 = proc_now_ms();
        pid_t pid = proc_spawn(kernels_main, NULL, CHILD_LIMIT_S);
        proc_wait_all(&pid, 1, GROUP_LIMIT_MS, &code);
        row->seconds = (double)(proc_now_ms() - t0) / 1000.0;
        row->result = code == 0 ? "pass" : "FAIL";
    }
    /* nccl: a GPU per rank (FSDP-2 -> TP-2 on 4, FSDP-1 -> TP-1 on 2 or 3); ipc colocated
     * FSDP-2 -> TP-2 on the GPUs there are, and disaggregated where nccl's fits */
    int d = g_cases.ngpu >= 4 ? 2 : 1;
    case_equal("nccl", d, 0);
    case_equal("ipc", 2, 1);
    case_equal("ipc", d, 0);
    case_nan("nccl", d, 0, 1);
    case_nan("nccl", d, 0, 2);
    case_nan("ipc", 2, 1, 1);
    case_nan("ipc", 2, 1, 2);
    /* 4. per-tensor targets: codes and the one scale equal to the CPU's quantization of the
     * whole bf16 target, FP8 on the wire on and off alike, and a NaN refused before any pack */
    g_tab = g_tensor_params;
    g_np = sizeof(g_tensor_params) / sizeof(g_tensor_params[0]);
    g_label = "per-tensor: ";
    case_equal("nccl", d, 0);
    case_equal("ipc", 2, 1);
    case_equal("ipc", d, 0);
    case_nan("nccl", d, 0, 3);
    case_nan("ipc", 2, 1, 3);
    return gpu_cases_finish(&g_cases, 72);
}
