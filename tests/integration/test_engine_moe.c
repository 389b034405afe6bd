/* The bundled engine on mixture-of-experts models, against HF transformers: testdata's tiny
 * Qwen3-MoE (softmax top-2 of 8 experts, renormalised) and DeepSeek-V3 (MLA with q_lora and
 * interleaved rope, sigmoid routing in 2 groups with the correction bias and the routed scaling
 * factor, a shared expert, one dense layer first).
 *  - From the files, at TP 1, 2 and 4 (experts split inside) and EP 2 and 4 (whole experts per
 *    rank, attention split by TP as much): the logits of every prompt position within 1e-3 relative error of
 *    reference_logits_f32.bin, and the greedy continuation equal to reference.json's greedy_12.
 *  - FP8 blocks: the FP8 engine's tokens are those of a bf16 engine holding its dequantized
 *    weights (q * s rounded to bf16, every quantized target, experts included), and TP 2 and
 *    EP 2 give TP 1's FP8 tokens.
 *  - Through wsync: two trainer processes hold the checkpoint FSDP-2 (dim 0 of every per-expert
 *    param; or of HF 5.x's fused expert tensors, handed to wsync unfused; or whole experts per
 *    trainer, Megatron's EP) and push version 1 (every weight changed) then version 2 (the
 *    checkpoint itself) over the ipc scheme on host memory to a TP-2 or an EP-2 engine created
 *    without weights; after
 *    version 1 every target of every rank equals, bytes and scales, that of an engine loaded from
 *    version 1's tensors, and after version 2 the tokens are reference.json's.
 *  - wsync-engine --tp 2 --ep 2 prints HF's tokens, from the files and (--sync) after the
 *    trainers' versions; an EP size other than 1 or the TP size is
 *    refused, by the library and by the command line, with a message saying why. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/hf_reference.h"
#include "tests/support/proc.h"
#include "wsync_build_config.h"

#define MAX_TOK HF_REF_MAX_TOK
#define NSENDERS 2
#define TIMEOUT_MS 30000

typedef struct {
    const char *dir;
    int block;                     /* FP8 block that divides every partition of the model */
    hf_ref_t r;                    /* HF's prompt, tokens and logits */
} model_ref_t;

static model_ref_t qwen = {WSYNC_TESTDATA "/hf_qwen3_moe_tiny", 32, {{0}, {0}, 0, 0, NULL, 0}};
static model_ref_t dsv3 = {WSYNC_TESTDATA "/hf_deepseek_v3_tiny", 16, {{0}, {0}, 0, 0, NULL, 0}};

/* Every prompt position's logits against HF's, then greedy_12. */
static void check_engine(const model_ref_t *m, wsync_engine_t *e, const char *what)
{
    const float *logits = NULL;
    int32_t out[MAX_TOK];
    wsync_engine_result_t res;
    double worst = 0;

    for (int i = 0; i < m->r.nprompt; i++) {
        wsync_status_t st = wsync_engine_forward(e, m->r.prompt[i], i, &logits);
        CHECK_MSG(st == WSYNC_OK, "%s: %s", what, wsync_engine_last_error());
        if (st != WSYNC_OK)
            return;
        double r = hf_rel_err(logits, m->r.logits + i * m->r.V, m->r.V);
        worst = r > worst ? r : worst;
        CHECK_MSG(r < 1e-3, "%s: position %d: logits relative error %.3g", what, i, r);
    }
    CHECK_MSG(wsync_engine_generate(e, m->r.prompt, m->r.nprompt, m->r.ngreedy, out, &res) ==
                  WSYNC_OK,
              "%s: %s", what, wsync_engine_last_error());
    for (int i = 0; i < m->r.ngreedy; i++)
        CHECK_MSG(out[i] == m->r.greedy[i], "%s: token %d is %d, HF says %d", what, i, out[i],
                  m->r.greedy[i]);
    fprintf(stderr, "%s: worst logits relative error %.3g\n", what, worst);
}

/* ---- from the files: TP 1, TP 2, EP 2 ------------------------------------------------------ */

typedef struct {
    const model_ref_t *m;
    int ep;
    int fp8;
    const int32_t *want;   /* fp8: the tokens every rank must give */
} split_t;

static wsync_engine_params_t params_of(const model_ref_t *m, int rank, int tp, int ep, int fp8,
                                       wsync_engine_comm_t *comm)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    p.tp_rank = rank;
    p.tp_size = tp;
    p.comm = comm;
    p.ep = ep;
    if (fp8) {
        p.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
        p.fp8_block = m->block;
    }
    return p;
}

static int split_rank(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    const split_t *s = arg;
    wsync_engine_params_t p = params_of(s->m, rank, tp, s->ep, s->fp8, comm);
    wsync_engine_t *e = NULL;
    char what[96];

    snprintf(what, sizeof(what), "%s TP %d EP %d rank %d%s", strrchr(s->m->dir, '/') + 1, tp,
             s->ep > 1 ? s->ep : 1, rank, s->fp8 ? " FP8" : "");
    CHECK_MSG(wsync_engine_open(s->m->dir, &p, &e) == WSYNC_OK, "%s: %s", what,
              wsync_engine_last_error());
    if (e == NULL)
        return 1;
    if (s->want == NULL) {
        check_engine(s->m, e, what);
    } else {
        int32_t out[MAX_TOK];
        CHECK(wsync_engine_generate(e, s->m->r.prompt, s->m->r.nprompt, s->m->r.ngreedy, out,
                                    NULL) == WSYNC_OK);
        for (int i = 0; i < s->m->r.ngreedy; i++)
            CHECK_MSG(out[i] == s->want[i], "%s: token %d is %d, TP 1 says %d", what, i, out[i],
                      s->want[i]);
    }
    wsync_engine_free(e);
    return check_failures ? 1 : 0;
}

static void run_split(const model_ref_t *m, int tp, int ep, int fp8, const int32_t *want)
{
    wsync_model_config_t cfg;
    wsync_engine_comm_t *comm = NULL;
    int codes[WSYNC_ENGINE_MAX_TP];
    split_t s = {m, ep, fp8, want};
    char path[512];

    snprintf(path, sizeof(path), "%s/config.json", m->dir);
    CHECK_OK(wsync_model_config_load(path, &cfg));
    CHECK_MSG(wsync_engine_comm_create(tp, &cfg, 0, 30000, &comm) == WSYNC_OK, "%s",
              wsync_engine_last_error());
    if (comm == NULL)
        return;
    CHECK_MSG(wsync_engine_launch(tp, comm, split_rank, &s, 60, codes) == WSYNC_OK, "%s",
              wsync_engine_last_error());
    for (int r = 0; r < tp; r++)
        CHECK_MSG(codes[r] == 0, "TP %d EP %d: rank %d exited with %d", tp, ep, r, codes[r]);
    wsync_engine_comm_free(comm);
}

static void files_case(model_ref_t *m)
{
    wsync_engine_t *e = NULL;
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    char what[96];

    snprintf(what, sizeof(what), "%s TP 1", strrchr(m->dir, '/') + 1);
    CHECK_MSG(wsync_engine_open(m->dir, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    if (e == NULL)
        return;
    check_engine(m, e, what);
    wsync_engine_free(e);
    run_split(m, 2, 0, 0, NULL);
    run_split(m, 2, 2, 0, NULL);
    /* every split the models allow: 4 heads over 4 ranks, 2 experts each */
    run_split(m, 4, 0, 0, NULL);
    run_split(m, 4, 4, 0, NULL);
}

static void case_qwen3_moe_tp1_tp2_ep2(void)
{
    files_case(&qwen);
}

static void case_deepseek_v3_tp1_tp2_ep2(void)
{
    files_case(&dsv3);
}

/* ---- FP8 ---------------------------------------------------------------------------------- */

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The FP8 engine's tokens equal those of the bf16 engine whose weights are the FP8 ones
 * dequantized; TP 2 and EP 2 give the same tokens. */
static void fp8_case(model_ref_t *m, int want_quantized)
{
    wsync_engine_params_t p8 = params_of(m, 0, 1, 0, 1, NULL), pb = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e8 = NULL, *eb = NULL;
    int32_t t8[MAX_TOK], tb[MAX_TOK];
    uint8_t codes[256];
    float lut[256];
    int nq = 0, experts = 0, routers = 0, same_as_hf = 1;

    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    wsync_fp8_to_f32(codes, 256, WSYNC_DTYPE_F8E4M3FN, lut);
    CHECK_MSG(wsync_engine_open(m->dir, &p8, &e8) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK_MSG(wsync_engine_open(m->dir, &pb, &eb) == WSYNC_OK, "%s", wsync_engine_last_error());
    if (e8 == NULL || eb == NULL)
        goto out;
    CHECK(wsync_engine_weight_count(e8) == wsync_engine_weight_count(eb));
    for (size_t i = 0; i < wsync_engine_weight_count(e8); i++) {
        wsync_engine_weight_t w8, wb;
        CHECK_OK(wsync_engine_weight(e8, i, &w8));
        CHECK_OK(wsync_engine_weight(eb, i, &wb));
        CHECK(strcmp(w8.name, wb.name) == 0);
        if (strstr(w8.name, "mlp.gate.") != NULL) {
            /* the router stays exact: it picks the experts */
            routers++;
            CHECK_MSG(w8.dtype != WSYNC_DTYPE_F8E4M3FN, "%s is quantized", w8.name);
        }
        if (w8.dtype != WSYNC_DTYPE_F8E4M3FN) {
            CHECK(w8.dtype == wb.dtype && w8.scales == NULL &&
                  memcmp(w8.data, wb.data, w8.bytes) == 0);
            continue;
        }
        nq++;
        experts += strstr(w8.name, "experts.w13") != NULL || strstr(w8.name, "experts.w2") != NULL;
        CHECK(w8.block == m->block && wb.dtype == WSYNC_DTYPE_BF16);
        int64_t rows = 1, cols = w8.shape[w8.ndim - 1], b = m->block, nbc = (cols + b - 1) / b;
        for (int d = 0; d < w8.ndim - 1; d++)
            rows *= w8.shape[d];
        CHECK(w8.nscales == (size_t)(((rows + b - 1) / b) * nbc));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                float q = lut[((uint8_t *)w8.data)[r * cols + c]];
                ((uint16_t *)wb.data)[r * cols + c] = to_bf16(q * w8.scales[(r / b) * nbc + c / b]);
            }
    }
    CHECK_MSG(nq == want_quantized, "%d quantized targets, expected %d", nq, want_quantized);
    CHECK(experts > 0 && routers > 0);
    CHECK(wsync_engine_generate(e8, m->r.prompt, m->r.nprompt, m->r.ngreedy, t8, NULL) == WSYNC_OK);
    CHECK(wsync_engine_generate(eb, m->r.prompt, m->r.nprompt, m->r.ngreedy, tb, NULL) == WSYNC_OK);
    for (int i = 0; i < m->r.ngreedy; i++) {
        CHECK_MSG(t8[i] == tb[i], "token %d: FP8 engine %d, bf16 engine on dequantized weights %d",
                  i, t8[i], tb[i]);
        same_as_hf &= t8[i] == m->r.greedy[i];
    }
    fprintf(stderr, "%s FP8 %dx%d tokens (%s HF's bf16 ones):", strrchr(m->dir, '/') + 1,
            m->block, m->block, same_as_hf ? "equal to" : "not all equal to");
    for (int i = 0; i < m->r.ngreedy; i++)
        fprintf(stderr, " %d", t8[i]);
    fprintf(stderr, "\n");
    run_split(m, 2, 0, 1, t8);
    run_split(m, 2, 2, 1, t8);
out:
    wsync_engine_free(e8);
    wsync_engine_free(eb);
}

static void case_qwen3_moe_fp8(void)
{
    /* per layer qkv, o, w13, w2 */
    fp8_case(&qwen, 2 * 4);
}

static void case_deepseek_v3_fp8(void)
{
    /* per layer fused_qkv_a, q_b, kv_b, o; the dense layer gate_up, down; the MoE layers w13,
     * w2 and the shared expert's gate_up, down */
    fp8_case(&dsv3, 3 * 4 + 2 + 2 * 4);
}

/* ---- through wsync ------------------------------------------------------------------------ */

/* How the trainers hold the model. */
enum {
    FSDP,       /* dim-0 shards of every checkpoint param (one tensor per expert) */
    FUSED,      /* dim-0 shards of HF 5.x's in-memory params (experts fused: gate_up_proj
                   [E, 2I, Hd], down_proj [E, Hd, I]), given to wsync unfused */
    EP_SENDERS, /* whole experts per trainer (Megatron EP), the rest dim-0 shards */
};

typedef struct {
    const model_ref_t *m;
    int tp, ep;
    int senders;
    int rank;                      /* of a trainer */
} group_t;

static char coord[64];
static _Atomic int *finished;

static float bf16f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Version 1 changes every weight; version 2 is the checkpoint. */
static float version_value(float w, int v)
{
    return v == 1 ? bf16f(to_bf16(w * 1.125f + 1.0f / 1024)) : w;
}

static float load_elem(wsync_dtype_t dt, const void *p, size_t i)
{
    if (dt == WSYNC_DTYPE_F32) {
        float f;
        memcpy(&f, (const uint8_t *)p + 4 * i, 4);
        return f;
    }
    uint16_t b;
    memcpy(&b, (const uint8_t *)p + 2 * i, 2);
    return bf16f(b);
}

static void store_elem(wsync_dtype_t dt, void *p, size_t i, float x)
{
    if (dt == WSYNC_DTYPE_F32) {
        memcpy((uint8_t *)p + 4 * i, &x, 4);
    } else {
        uint16_t b = to_bf16(x);
        memcpy((uint8_t *)p + 2 * i, &b, 2);
    }
}

/* Version v of every checkpoint tensor, in the checkpoint's dtypes. */
typedef struct {
    wsync_engine_st_t *ckpt;
    wsync_engine_tensor_t *t;
    uint8_t *data;
    size_t n;
} version_t;

static int version_make(const model_ref_t *m, version_t *vt, int v)
{
    char path[512];
    const wsync_engine_tensor_t *src;
    size_t total = 0, off = 0;

    memset(vt, 0, sizeof(*vt));
    snprintf(path, sizeof(path), "%s/model.safetensors", m->dir);
    if (wsync_engine_st_open(path, &vt->ckpt) != WSYNC_OK) {
        CHECK_MSG(0, "%s", wsync_engine_last_error());
        return -1;
    }
    src = wsync_engine_st_tensors(vt->ckpt);
    vt->n = wsync_engine_st_count(vt->ckpt);
    for (size_t i = 0; i < vt->n; i++)
        total += src[i].nbytes;
    vt->t = calloc(vt->n, sizeof(*vt->t));
    vt->data = malloc(total);
    for (size_t i = 0; i < vt->n; i++) {
        size_t k = src[i].nbytes / wsync_dtype_size(src[i].dtype);
        vt->t[i] = src[i];
        for (size_t e = 0; e < k; e++)
            store_elem(src[i].dtype, vt->data + off, e,
                       version_value(load_elem(src[i].dtype, src[i].data, e), v));
        vt->t[i].data = vt->data + off;
        off += src[i].nbytes;
    }
    return 0;
}

static void version_free(version_t *vt)
{
    free(vt->t);
    free(vt->data);
    wsync_engine_st_close(vt->ckpt);
}

static const wsync_engine_tensor_t *find_t(const version_t *vt, const char *name)
{
    for (size_t k = 0; k < vt->n; k++)
        if (strcmp(vt->t[k].name, name) == 0)
            return &vt->t[k];
    CHECK_MSG(0, "the checkpoint lacks '%s'", name);
    return NULL;
}

/* Fill a held shard (dense row-major box, param dtype) with version vt's values. A fused
 * expert tensor's element (e, i, h) is expert e's gate row i (i < I) or up row i - I, and
 * down_proj's (e, h, i) expert e's down_proj (h, i). */
static int fill_shard(const version_t *vt, const wsync_shard_t *sh, void *mem)
{
    const wsync_param_t *p = &sh->param;
    const wsync_box_t *b = &sh->box;
    const char *fused = strstr(p->name, "mlp.experts.gate_up_proj");
    const char *fdown = strstr(p->name, "mlp.experts.down_proj");
    size_t k = 0;

    if (p->ndim == 3 && (fused != NULL || fdown != NULL)) {
        const char *stem_end = fused != NULL ? fused : fdown;
        int stem = (int)(stem_end - p->name);
        int64_t I = fused != NULL ? p->shape[1] / 2 : p->shape[2];
        for (int64_t e = b->start[0]; e < b->start[0] + b->len[0]; e++) {
            char g[256], u[256];
            const wsync_engine_tensor_t *tg, *tu = NULL;
            snprintf(g, sizeof(g), "%.*smlp.experts.%lld.%s_proj.weight", stem, p->name,
                     (long long)e, fused != NULL ? "gate" : "down");
            snprintf(u, sizeof(u), "%.*smlp.experts.%lld.up_proj.weight", stem, p->name,
                     (long long)e);
            if ((tg = find_t(vt, g)) == NULL || (fused != NULL && (tu = find_t(vt, u)) == NULL))
                return -1;
            for (int64_t i = b->start[1]; i < b->start[1] + b->len[1]; i++)
                for (int64_t j = b->start[2]; j < b->start[2] + b->len[2]; j++) {
                    /* gate_up: (i, j) = (row of gate/up, h); down: (h, i) of down_proj */
                    const wsync_engine_tensor_t *t = fused != NULL && i >= I ? tu : tg;
                    int64_t row = fused != NULL && i >= I ? i - I : i;
                    size_t at = (size_t)(row * t->shape[1] + j);
                    store_elem(p->dtype, mem, k++, load_elem(t->dtype, t->data, at));
                }
        }
        return 0;
    }
    const wsync_engine_tensor_t *t = find_t(vt, p->name);
    if (t == NULL || p->ndim > 2)
        return -1;
    int64_t cols = p->ndim > 1 ? p->shape[1] : 1;
    int64_t c0 = p->ndim > 1 ? b->start[1] : 0, nc = p->ndim > 1 ? b->len[1] : 1;
    for (int64_t i = b->start[0]; i < b->start[0] + b->len[0]; i++)
        for (int64_t j = c0; j < c0 + nc; j++)
            store_elem(p->dtype, mem, k++, load_elem(t->dtype, t->data, (size_t)(i * cols + j)));
    return 0;
}

/* The shards this trainer holds (what it fills) per its layout. */
static wsync_status_t held_shards(const group_t *g, const wsync_model_config_t *cfg,
                                  wsync_shard_t **held, size_t *nheld)
{
    wsync_param_t *params = NULL;
    size_t n = 0;
    wsync_status_t st;

    if (g->senders == FSDP)
        return wsync_layout_fsdp_shards(cfg, WSYNC_DTYPE_BF16, g->rank, NSENDERS, held, nheld);
    if (g->senders == EP_SENDERS)
        return wsync_layout_ep_shards(cfg, WSYNC_DTYPE_BF16, g->rank, NSENDERS, 0, held, nheld);
    if ((st = wsync_model_fused_params(cfg, WSYNC_DTYPE_BF16, &params, &n)) != WSYNC_OK)
        return st;
    st = wsync_layout_shards(params, n, 0, g->rank, NSENDERS, held, nheld);
    wsync_model_params_free(params, n);
    return st;
}

static int trainer_main(void *arg)
{
    const group_t *g = arg;
    wsync_model_config_t cfg;
    wsync_shard_t *held = NULL;
    size_t nheld = 0, total = 0, *offs = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    version_t vt[2];
    uint8_t *mem = NULL;
    wsync_status_t st;
    char path[512];
    int added = 0;

    memset(vt, 0, sizeof(vt));
    snprintf(path, sizeof(path), "%s/config.json", g->m->dir);
    CHECK_OK(wsync_model_config_load(path, &cfg));
    st = held_shards(g, &cfg, &held, &nheld);
    CHECK_MSG(st == WSYNC_OK, "trainer %d: %s", g->rank, wsync_last_error());
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (check_failures || version_make(g->m, &vt[0], 1) != 0 || version_make(g->m, &vt[1], 2) != 0)
        goto out;
    sp.coordinator = coord;
    sp.rank = g->rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = g->tp;
    sp.scheme = "ipc";
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 100;
    st = wsync_sender_create(ctx, &sp, &s);
    CHECK_MSG(st == WSYNC_OK, "%s", wsync_last_error());
    if (st != WSYNC_OK)
        goto out;
    offs = calloc(nheld + 1, sizeof(*offs));
    for (size_t i = 0; i < nheld; i++) {
        size_t n = wsync_dtype_size(held[i].param.dtype);
        for (int d = 0; d < held[i].param.ndim; d++)
            n *= (size_t)held[i].box.len[d];
        offs[i] = total;
        total += (n + 63) / 64 * 64;
    }
    CHECK_OK(wsync_mem_alloc(ctx, total ? total : 64, (void **)&mem));
    for (size_t i = 0; i < nheld && mem != NULL; i++) {
        wsync_shard_t *parts = NULL;
        size_t nparts = 0;
        held[i].data = mem + offs[i];
        /* a fused expert tensor's shard goes to wsync as the per-expert shards it holds */
        st = wsync_layout_unfuse_experts(&held[i], &parts, &nparts);
        CHECK_MSG(st == WSYNC_OK, "%s", wsync_last_error());
        for (size_t k = 0; k < nparts && st == WSYNC_OK; k++) {
            st = wsync_sender_add_shard(s, &parts[k]);
            CHECK_MSG(st == WSYNC_OK, "%s", wsync_last_error());
            added++;
        }
        wsync_layout_shards_free(parts, nparts);
    }
    if (g->senders == FUSED)   /* one shard per expert and projection, not per fused tensor */
        CHECK_MSG((size_t)added > nheld, "%d shards from %zu held tensors", added, nheld);
    if (check_failures)
        goto out;
    for (int v = 1; v <= 2; v++) {
        for (size_t i = 0; i < nheld; i++)
            if (fill_shard(&vt[v - 1], &held[i], mem + offs[i]) != 0)
                goto out;
        st = wsync_sender_push(s, (uint64_t)v);
        CHECK_MSG(st == WSYNC_OK, "trainer %d: push %d: %s", g->rank, v, wsync_last_error());
        if (st != WSYNC_OK)
            break;
    }
out:
    atomic_fetch_add(finished, 1);
    {
        long long deadline = proc_now_ms() + TIMEOUT_MS;
        while (atomic_load(finished) < NSENDERS && proc_now_ms() < deadline)
            usleep(1000);
    }
    wsync_sender_free(s);
    if (mem != NULL)
        wsync_mem_free(ctx, mem);
    wsync_ctx_free(ctx);
    wsync_layout_shards_free(held, nheld);
    version_free(&vt[0]);
    version_free(&vt[1]);
    free(offs);
    return check_failures ? 1 : 0;
}

/* Every target of this rank equals, bytes and scales, that of an engine of the same split
 * loaded from version v's tensors. */
static void check_weights(const group_t *g, const wsync_model_config_t *cfg, wsync_engine_t *e,
                          int rank, int v)
{
    version_t vt;
    wsync_engine_comm_t *dummy = NULL;
    wsync_engine_params_t p;
    wsync_engine_t *ref = NULL;

    if (version_make(g->m, &vt, v) != 0)
        return;
    CHECK(wsync_engine_comm_create(g->tp, cfg, 0, 1000, &dummy) == WSYNC_OK);
    p = params_of(g->m, rank, g->tp, g->ep, 0, dummy);
    CHECK(wsync_engine_create(cfg, &p, &ref) == WSYNC_OK);
    CHECK_MSG(wsync_engine_load(ref, vt.t, vt.n) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK(wsync_engine_weight_count(ref) == wsync_engine_weight_count(e));
    for (size_t i = 0; ref != NULL && i < wsync_engine_weight_count(e); i++) {
        wsync_engine_weight_t a, b;
        CHECK_OK(wsync_engine_weight(e, i, &a));
        CHECK_OK(wsync_engine_weight(ref, i, &b));
        CHECK(strcmp(a.name, b.name) == 0 && a.bytes == b.bytes);
        CHECK_MSG(memcmp(a.data, b.data, a.bytes) == 0, "rank %d version %d: %s differs from "
                  "the engine loaded from the tensors", rank, v, a.name);
    }
    wsync_engine_free(ref);
    wsync_engine_comm_free(dummy);
    version_free(&vt);
}

static int engine_rank(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    const group_t *g = arg;
    wsync_engine_params_t p = params_of(g->m, rank, tp, g->ep, 0, comm);
    wsync_model_config_t cfg;
    wsync_engine_t *e = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_engine_result_t res;
    int32_t out[MAX_TOK];
    uint64_t v = 0;
    wsync_status_t st;
    char path[512];

    snprintf(path, sizeof(path), "%s/config.json", g->m->dir);
    CHECK_OK(wsync_model_config_load(path, &cfg));
    /* no weights but those wsync brings */
    CHECK_MSG(wsync_engine_create(&cfg, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    if (e == NULL || ctx == NULL)
        goto out;
    CHECK(wsync_engine_generate(e, g->m->r.prompt, 1, 1, out, NULL) == WSYNC_ERR_STATE);
    rp.coordinator = coord;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 100;
    st = wsync_engine_attach(e, ctx, &rp);
    CHECK_MSG(st == WSYNC_OK, "rank %d: %s", rank, wsync_engine_last_error());
    if (st != WSYNC_OK)
        goto out;
    for (int k = 1; k <= 2; k++) {
        st = wsync_engine_update(e, TIMEOUT_MS, &v);
        CHECK_MSG(st == WSYNC_OK && v == (uint64_t)k, "rank %d: update: %s (version %llu)", rank,
                  wsync_engine_last_error(), (unsigned long long)v);
        if (st != WSYNC_OK)
            break;
        check_weights(g, &cfg, e, rank, k);
        if (k < 2)
            continue;
        CHECK(wsync_engine_generate(e, g->m->r.prompt, g->m->r.nprompt, g->m->r.ngreedy, out,
                                    &res) == WSYNC_OK);
        CHECK(res.version == 2);
        for (int i = 0; i < g->m->r.ngreedy; i++)
            CHECK_MSG(out[i] == g->m->r.greedy[i], "rank %d (TP %d, EP %d) after version 2: token "
                      "%d is %d, HF says %d", rank, tp, g->ep, i, out[i], g->m->r.greedy[i]);
    }
out:
    wsync_engine_free(e);
    wsync_ctx_free(ctx);
    return check_failures ? 1 : 0;
}

static int engine_group(void *arg)
{
    const group_t *g = arg;
    wsync_model_config_t cfg;
    wsync_engine_comm_t *comm = NULL;
    int codes[WSYNC_ENGINE_MAX_TP];
    wsync_status_t st;
    char path[512];

    snprintf(path, sizeof(path), "%s/config.json", g->m->dir);
    CHECK_OK(wsync_model_config_load(path, &cfg));
    CHECK(wsync_engine_comm_create(g->tp, &cfg, 0, TIMEOUT_MS + 10000, &comm) == WSYNC_OK);
    st = wsync_engine_launch(g->tp, comm, engine_rank, (void *)g, 100, codes);
    for (int r = 0; r < g->tp; r++)
        CHECK_MSG(codes[r] == 0, "engine rank %d exited with %d", r, codes[r]);
    CHECK_MSG(st == WSYNC_OK, "%s", wsync_engine_last_error());
    wsync_engine_comm_free(comm);
    return check_failures ? 1 : 0;
}

static void run_group(const model_ref_t *m, int senders, int tp, int ep)
{
    pid_t pids[NSENDERS + 1];
    group_t g = {m, tp, ep, senders, 0}, tg[NSENDERS];
    int codes[NSENDERS + 1];

    snprintf(coord, sizeof(coord), "127.0.0.1:%d", proc_free_port());
    atomic_store(finished, 0);
    for (int s = 0; s < NSENDERS; s++) {
        tg[s] = g;
        tg[s].rank = s;
        pids[s] = proc_spawn(trainer_main, &tg[s], 110);
    }
    pids[NSENDERS] = proc_spawn(engine_group, &g, 110);
    proc_wait_all(pids, NSENDERS + 1, 120000, codes);
    for (int i = 0; i <= NSENDERS; i++)
        CHECK_MSG(codes[i] == 0, "%s exited with %d", i < NSENDERS ? "a trainer" : "the engine",
                  codes[i]);
}

static void case_qwen3_moe_fsdp2_to_tp2(void)
{
    run_group(&qwen, FSDP, 2, 0);
}

static void case_qwen3_moe_fsdp2_to_ep2(void)
{
    run_group(&qwen, FSDP, 2, 2);
}

static void case_qwen3_moe_fused_fsdp2_to_ep2(void)
{
    run_group(&qwen, FUSED, 2, 2);
}

static void case_qwen3_moe_ep2_senders_to_tp2(void)
{
    run_group(&qwen, EP_SENDERS, 2, 0);
}

static void case_deepseek_v3_fsdp2_to_tp2(void)
{
    run_group(&dsv3, FSDP, 2, 0);
}

static void case_deepseek_v3_fsdp2_to_ep2(void)
{
    run_group(&dsv3, FSDP, 2, 2);
}

static void case_deepseek_v3_fused_fsdp2_to_tp2(void)
{
    run_group(&dsv3, FUSED, 2, 0);
}

/* ---- DeepSeek-V2's rules, on the V3 model's weights ------------------------------------------ */

static char tmpdir[256];

/* A model directory whose config.json is the tiny DeepSeek-V3's edited by `edit`, and whose
 * model.safetensors is the V3 model's (a link). */
static int make_variant(const char *name, void (*edit)(json_t *, void *), void *arg, char *dir,
                        size_t len)
{
    char path[512], target[512];
    json_error_t err;
    json_t *j;

    snprintf(dir, len, "%s/%s", tmpdir, name);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return -1;
    snprintf(path, sizeof(path), "%s/config.json", dsv3.dir);
    j = json_load_file(path, 0, &err);
    CHECK_MSG(j != NULL, "%s: %s", path, err.text);
    if (j == NULL)
        return -1;
    edit(j, arg);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    CHECK(json_dump_file(j, path, JSON_INDENT(1)) == 0);
    json_decref(j);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(target, sizeof(target), "%s/model.safetensors", dsv3.dir);
    unlink(path);
    CHECK(symlink(target, path) == 0);
    return check_failures ? -1 : 0;
}

typedef struct {
    const char *topk_method;
    int topk_group, norm;
} v2_t;

static void edit_v2(json_t *j, void *arg)
{
    const v2_t *v = arg;
    json_object_set_new(j, "model_type", json_string("deepseek_v2"));
    json_object_set_new(j, "architectures", json_pack("[s]", "DeepseekV2ForCausalLM"));
    json_object_set_new(j, "scoring_func", json_string("softmax"));
    json_object_set_new(j, "topk_method", json_string(v->topk_method));
    json_object_set_new(j, "topk_group", json_integer(v->topk_group));
    json_object_set_new(j, "norm_topk_prob", json_boolean(v->norm));
    json_object_del(j, "rope_interleave");
}

/* The prompt's logits (every position, [nprompt, V]) and greedy tokens of a TP-1 engine. */
static int run_dir(const char *dir, float *logits, int32_t *tokens)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;
    const float *l;

    CHECK_MSG(wsync_engine_open(dir, &p, &e) == WSYNC_OK, "%s: %s", dir,
              wsync_engine_last_error());
    if (e == NULL)
        return -1;
    for (int i = 0; i < dsv3.r.nprompt; i++) {
        CHECK(wsync_engine_forward(e, dsv3.r.prompt[i], i, &l) == WSYNC_OK);
        memcpy(logits + i * dsv3.r.V, l, (size_t)dsv3.r.V * sizeof(float));
    }
    CHECK(wsync_engine_generate(e, dsv3.r.prompt, dsv3.r.nprompt, dsv3.r.ngreedy, tokens, NULL) ==
          WSYNC_OK);
    wsync_engine_free(e);
    return check_failures ? -1 : 0;
}

/* HF's DeepseekV2Moe: softmax scores; greedy top-k, or group_limited_greedy (groups by their
 * best score); weights times routed_scaling_factor, never renormalised. Checked as properties:
 * keeping every group is greedy, bit for bit; norm_topk_prob changes nothing; the V2 rules are
 * not V3's; TP 2 and EP 2 give TP 1's tokens. */
static void case_deepseek_v2_rules(void)
{
    char greedy[300], all_groups[300], one_group[300], normed[300];
    size_t n = (size_t)(dsv3.r.nprompt * dsv3.r.V);
    float *lg = malloc(n * sizeof(float)), *la = malloc(n * sizeof(float));
    float *l1 = malloc(n * sizeof(float)), *ln = malloc(n * sizeof(float));
    int32_t tg[MAX_TOK], ta[MAX_TOK], t1[MAX_TOK], tn[MAX_TOK];
    model_ref_t v2 = dsv3;

    if (make_variant("v2_greedy", edit_v2, &(v2_t){"greedy", 1, 0}, greedy, 300) ||
        make_variant("v2_all_groups", edit_v2, &(v2_t){"group_limited_greedy", 2, 0},
                     all_groups, 300) ||
        make_variant("v2_one_group", edit_v2, &(v2_t){"group_limited_greedy", 1, 0}, one_group,
                     300) ||
        make_variant("v2_normed", edit_v2, &(v2_t){"group_limited_greedy", 1, 1}, normed, 300) ||
        run_dir(greedy, lg, tg) || run_dir(all_groups, la, ta) || run_dir(one_group, l1, t1) ||
        run_dir(normed, ln, tn))
        goto out;
    CHECK_MSG(memcmp(lg, la, n * sizeof(float)) == 0, "group_limited_greedy keeping both groups "
              "is not greedy");
    CHECK_MSG(memcmp(l1, ln, n * sizeof(float)) == 0, "norm_topk_prob changed a DeepSeek-V2 "
              "model's logits (HF's V2 never renormalises)");
    CHECK_MSG(memcmp(lg, l1, n * sizeof(float)) != 0, "keeping one group of two changed nothing");
    CHECK_MSG(hf_rel_err(l1, dsv3.r.logits, dsv3.r.V) > 1e-2, "the V2 rules gave V3's logits");
    v2.dir = one_group;
    run_split(&v2, 2, 0, 0, t1);
    run_split(&v2, 2, 2, 0, t1);
out:
    free(lg);
    free(la);
    free(l1);
    free(ln);
}

/* A YaRN config is refused (the engine computes the default RoPE only). */
static void edit_yarn(json_t *j, void *arg)
{
    (void)arg;
    json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:f, s:i, s:f, s:f}", "type", "yarn",
                                                     "factor", 40.0,
                                                     "original_max_position_embeddings", 4096,
                                                     "mscale", 1.0, "mscale_all_dim", 1.0));
}

static void case_yarn_refused(void)
{
    char dir[300];
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;
    wsync_status_t st;

    if (make_variant("yarn", edit_yarn, NULL, dir, sizeof(dir)) != 0)
        return;
    st = wsync_engine_open(dir, &p, &e);
    CHECK_MSG(st != WSYNC_OK && e == NULL, "a YaRN config was accepted");
    CHECK_MSG(strstr(wsync_engine_last_error(), "yarn") != NULL, "%s", wsync_engine_last_error());
    fprintf(stderr, "yarn: %s\n", wsync_engine_last_error());
}

/* ---- expert parallelism's limits and the command line -------------------------------------- */

/* Loading names what is wrong with an expert's tensor: missing, or not the config's shape. */
static void case_load_errors_name_the_expert(void)
{
    const char *victim = "model.layers.2.mlp.experts.5.up_proj.weight";
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_model_config_t cfg;
    wsync_engine_t *e = NULL;
    version_t vt;
    size_t at = (size_t)-1;
    char path[512];

    snprintf(path, sizeof(path), "%s/config.json", dsv3.dir);
    CHECK_OK(wsync_model_config_load(path, &cfg));
    p.ep = 2;
    p.tp_size = 2;
    p.tp_rank = 1;   /* experts 4..7 */
    CHECK(wsync_engine_comm_create(2, &cfg, 0, 1000, &p.comm) == WSYNC_OK);
    CHECK_MSG(wsync_engine_create(&cfg, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    if (e == NULL || version_make(&dsv3, &vt, 2) != 0)
        goto out;
    for (size_t i = 0; i < vt.n; i++)
        if (strcmp(vt.t[i].name, victim) == 0)
            at = i;
    CHECK(at != (size_t)-1);
    if (at == (size_t)-1)
        goto done;
    vt.t[at].shape[0] /= 2;
    CHECK(wsync_engine_load(e, vt.t, vt.n) == WSYNC_ERR_CONFIG);
    CHECK_MSG(strstr(wsync_engine_last_error(), victim) != NULL &&
                  strstr(wsync_engine_last_error(), "[32, 128]") != NULL &&
                  strstr(wsync_engine_last_error(), "[64, 128]") != NULL,
              "%s", wsync_engine_last_error());
    vt.t[at].shape[0] *= 2;
    vt.t[at].name = "renamed";
    CHECK(wsync_engine_load(e, vt.t, vt.n) == WSYNC_ERR_NOT_FOUND);
    CHECK_MSG(strstr(wsync_engine_last_error(), victim) != NULL &&
                  strstr(wsync_engine_last_error(), "mlp.experts.w13_weight") != NULL,
              "%s", wsync_engine_last_error());
    CHECK(wsync_engine_generate(e, dsv3.r.prompt, 1, 1, (int32_t[1]){0}, NULL) == WSYNC_ERR_STATE);
done:
    version_free(&vt);
out:
    wsync_engine_free(e);
    wsync_engine_comm_free(p.comm);
}

static void case_ep_refused(void)
{
    wsync_model_config_t cfg;
    wsync_engine_comm_t *comm = NULL;
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;
    char path[512];

    snprintf(path, sizeof(path), "%s/config.json", qwen.dir);
    CHECK_OK(wsync_model_config_load(path, &cfg));
    CHECK(wsync_engine_comm_create(2, &cfg, 0, 1000, &comm) == WSYNC_OK);
    p.tp_size = 2;
    p.comm = comm;
    p.ep = 4;
    CHECK(wsync_engine_create(&cfg, &p, &e) == WSYNC_ERR_INVALID && e == NULL);
    CHECK_MSG(strstr(wsync_engine_last_error(), "ep 4") != NULL &&
                  strstr(wsync_engine_last_error(), "TP size 2") != NULL,
              "%s", wsync_engine_last_error());
    wsync_engine_comm_free(comm);
}

static char text[1 << 16];

static void case_cli_ep2(void)
{
    char cmd[1024], ids[512] = "";
    const model_ref_t *ms[2] = {&qwen, &dsv3};

    for (int k = 0; k < 2; k++) {
        const model_ref_t *m = ms[k];
        size_t n = 0;
        json_t *j, *toks;
        ids[0] = '\0';
        for (int i = 0; i < m->r.nprompt; i++)
            n += (size_t)snprintf(ids + n, sizeof(ids) - n, "%s%d", i ? "," : "", m->r.prompt[i]);
        snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/wsync-engine --model %s --tp 2 --ep 2 "
                 "--prompt-ids %s --max-new %d --json", m->dir, ids, m->r.ngreedy);
        CHECK_MSG(proc_run(cmd, text, sizeof(text)) == 0, "%s failed: %s", cmd, text);
        j = (json_t *)proc_last_json_line(text);
        CHECK_MSG(j != NULL, "no JSON from %s: %s", cmd, text);
        if (j == NULL)
            continue;
        toks = json_object_get(j, "tokens");
        CHECK(json_array_size(toks) == (size_t)m->r.ngreedy);
        for (int i = 0; i < m->r.ngreedy; i++)
            CHECK_MSG(json_integer_value(json_array_get(toks, (size_t)i)) == m->r.greedy[i],
                      "%s: token %d", cmd, i);
        CHECK(json_integer_value(json_object_get(j, "ep")) == 2 &&
              json_integer_value(json_object_get(j, "tp")) == 2);
        json_decref(j);
    }
    snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/wsync-engine --model %s --tp 2 --ep 3 "
             "--prompt-ids 1 --max-new 1 2>&1", qwen.dir);
    CHECK(proc_run(cmd, text, sizeof(text)) == 2);
    CHECK_MSG(strstr(text, "--ep 3") != NULL, "%s", text);
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-engine --help", text, sizeof(text)) == 0);
    CHECK(strstr(text, "--ep E") != NULL);
}

/* wsync-engine --sync on a MoE model: its EP-2 ranks take the two versions the trainers push,
 * and generate HF's tokens after the second (the checkpoint). */
static void case_cli_sync_ep2(void)
{
    group_t g = {&dsv3, 2, 2, FSDP, 0}, tg[NSENDERS];
    pid_t pids[NSENDERS];
    int codes[NSENDERS], rc;
    char cmd[1024], ids[256] = "", list[512] = "\"tokens\":[";
    size_t n = 0, m;
    FILE *p;

    snprintf(coord, sizeof(coord), "127.0.0.1:%d", proc_free_port());
    atomic_store(finished, 0);
    for (int s = 0; s < NSENDERS; s++) {
        tg[s] = g;
        tg[s].rank = s;
        pids[s] = proc_spawn(trainer_main, &tg[s], 110);
    }
    for (int i = 0; i < dsv3.r.nprompt; i++)
        n += (size_t)snprintf(ids + n, sizeof(ids) - n, "%s%d", i ? "," : "", dsv3.r.prompt[i]);
    snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/wsync-engine --model %s --tp 2 --ep 2 "
             "--prompt-ids %s --max-new %d --sync %s --versions 2 --timeout 30 --json", dsv3.dir,
             ids, dsv3.r.ngreedy, coord);
    p = popen(cmd, "r");
    n = p != NULL ? fread(text, 1, sizeof(text) - 1, p) : 0;
    text[n] = '\0';
    rc = p != NULL ? pclose(p) : -1;
    CHECK_MSG(rc == 0, "%s: status %d\n%s", cmd, rc, text);
    proc_wait_all(pids, NSENDERS, 60000, codes);
    for (int i = 0; i < NSENDERS; i++)
        CHECK_MSG(codes[i] == 0, "trainer %d exited with %d", i, codes[i]);
    char *last = text + n;
    while (last > text && last[-1] == '\n')
        *--last = '\0';
    while (last > text && last[-1] != '\n')
        last--;
    m = strlen(list);
    for (int i = 0; i < dsv3.r.ngreedy; i++)
        m += (size_t)snprintf(list + m, sizeof(list) - m, "%s%d", i ? "," : "", dsv3.r.greedy[i]);
    snprintf(list + m, sizeof(list) - m, "]");
    CHECK_MSG(strstr(last, "\"version\":2") != NULL && strstr(last, list) != NULL &&
                  strstr(last, "\"ep\":2") != NULL,
              "%s lacks version 2, ep 2 or %s", last, list);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    finished = mmap(NULL, sizeof(*finished), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (hf_ref_load(qwen.dir, &qwen.r) != 0 || hf_ref_load(dsv3.dir, &dsv3.r) != 0)
        return check_summary();
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/wsync_engine_moe_XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        CHECK_MSG(0, "mkdtemp: %s", strerror(errno));
        return check_summary();
    }
    RUN(case_qwen3_moe_tp1_tp2_ep2);
    RUN(case_deepseek_v3_tp1_tp2_ep2);
    RUN(case_qwen3_moe_fp8);
    RUN(case_deepseek_v3_fp8);
    RUN(case_qwen3_moe_fsdp2_to_tp2);
    RUN(case_qwen3_moe_fsdp2_to_ep2);
    RUN(case_qwen3_moe_fused_fsdp2_to_ep2);
    RUN(case_qwen3_moe_ep2_senders_to_tp2);
    RUN(case_deepseek_v3_fsdp2_to_tp2);
    RUN(case_deepseek_v3_fsdp2_to_ep2);
    RUN(case_deepseek_v3_fused_fsdp2_to_tp2);
    RUN(case_deepseek_v2_rules);
    RUN(case_yarn_refused);
    RUN(case_load_errors_name_the_expert);
    RUN(case_ep_refused);
    RUN(case_cli_ep2);
    RUN(case_cli_sync_ep2);
    {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
        CHECK(system(cmd) == 0);
    }
    return check_summary();
}
