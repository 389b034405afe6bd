/* The engine's model: its targets (wsync's TP layout of the rank), the weight sets that hold
 * them, loading full checkpoint tensors into them, and the views forward reads. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/internal.h"

#define ALIGN 64
#define DEFAULT_BLOCK 128
#define DEFAULT_MAX_SEQ 4096

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* ---- FP8 block quantization -------------------------------------------------------------- */

wsync_status_t wsync_engine_quantize_block(const char *name, const float *x, int64_t rows,
                                           int64_t cols, int block, uint8_t *q, float *scales)
{
    int64_t nbr, nbc;
    float y[256];

    if (x == NULL || q == NULL || scales == NULL || rows < 0 || cols < 0 || block < 1 ||
        block > 256)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_quantize_block: bad argument (%s)",
                       name != NULL ? name : "?");
    nbr = (rows + block - 1) / block;
    nbc = (cols + block - 1) / block;
    for (int64_t bi = 0; bi < nbr; bi++) {
        int64_t r0 = bi * block, r1 = r0 + block < rows ? r0 + block : rows;
        for (int64_t bj = 0; bj < nbc; bj++) {
            int64_t c0 = bj * block, c1 = c0 + block < cols ? c0 + block : cols;
            float amax = 0.0f, s, inv;
            for (int64_t i = r0; i < r1; i++) {
                for (int64_t j = c0; j < c1; j++) {
                    float a = fabsf(x[i * cols + j]);
                    if (!isfinite(a))
                        return wse_err(WSYNC_ERR_NONFINITE, "%s: %s at row %lld, column %lld",
                                       name != NULL ? name : "?",
                                       isnan(a) ? "NaN" : "Inf", (long long)i, (long long)j);
                    amax = a > amax ? a : amax;
                }
            }
            if (amax < 1e-4f)
                amax = 1e-4f;
            s = amax / 448.0f;
            if (!(s >= 0x1p-126f))
                s = 1.0f;
            inv = 1.0f / s;
            scales[bi * nbc + bj] = s;
            for (int64_t i = r0; i < r1; i++) {
                for (int64_t j = c0; j < c1; j++)
                    y[j - c0] = x[i * cols + j] * inv;
                wsync_fp8_from_f32(y, (size_t)(c1 - c0), WSYNC_DTYPE_F8E4M3FN, 1,
                                   q + i * cols + c0);
            }
        }
    }
    return WSYNC_OK;
}

/* ---- targets and slots ------------------------------------------------------------------- */

static void shape_text(char *buf, size_t len, int ndim, const int64_t *shape);

static const struct {
    const char *suffix;
    wse_role_t role;
} layer_roles[] = {
    {"input_layernorm.weight", WSE_IN_NORM},
    {"post_attention_layernorm.weight", WSE_POST_NORM},
    {"self_attn.q_norm.weight", WSE_Q_NORM},
    {"self_attn.k_norm.weight", WSE_K_NORM},
    {"self_attn.qkv_proj.weight", WSE_QKV},
    {"self_attn.qkv_proj.bias", WSE_QKV_B},
    {"self_attn.o_proj.weight", WSE_O},
    {"self_attn.o_proj.bias", WSE_O_B},
    {"mlp.gate_up_proj.weight", WSE_GATE_UP},
    {"mlp.gate_up_proj.bias", WSE_GATE_UP_B},
    {"mlp.down_proj.weight", WSE_DOWN},
    {"mlp.down_proj.bias", WSE_DOWN_B},
    /* MLA (wsync_layout_tp_targets' deepseek names) */
    {"self_attn.fused_qkv_a_proj.weight", WSE_QKV_A},
    {"self_attn.kv_a_proj_with_mqa.weight", WSE_QKV_A},   /* without q_lora */
    {"self_attn.q_a_layernorm.weight", WSE_Q_A_NORM},
    {"self_attn.q_b_proj.weight", WSE_Q_B},
    {"self_attn.q_proj.weight", WSE_Q_B},                 /* without q_lora */
    {"self_attn.kv_a_layernorm.weight", WSE_KV_A_NORM},
    {"self_attn.kv_b_proj.weight", WSE_KV_B},
    /* MoE (vLLM FusedMoE) */
    {"mlp.gate.weight", WSE_ROUTER},
    {"mlp.gate.e_score_correction_bias", WSE_ROUTER_BIAS},
    {"mlp.experts.w13_weight", WSE_W13},
    {"mlp.experts.w2_weight", WSE_W2},
    {"mlp.shared_experts.gate_up_proj.weight", WSE_SH_GATE_UP},
    {"mlp.shared_experts.down_proj.weight", WSE_SH_DOWN},
};

/* the layers' roles are checked as bits of an unsigned */
_Static_assert(WSE_NROLES <= 32, "too many roles for the role masks");

static wsync_status_t role_of(const wsync_engine_t *e, const char *name, wse_role_t *role,
                              int *layer)
{
    int l = -1, used = 0;

    *layer = -1;
    if (strcmp(name, "model.embed_tokens.weight") == 0)
        return *role = WSE_EMBED, WSYNC_OK;
    if (strcmp(name, "lm_head.weight") == 0)
        return *role = WSE_LM_HEAD, WSYNC_OK;
    if (strcmp(name, "model.norm.weight") == 0)
        return *role = WSE_NORM, WSYNC_OK;
    if (sscanf(name, "model.layers.%d.%n", &l, &used) == 1 && used > 0 && l >= 0 && l < e->L) {
        for (size_t k = 0; k < sizeof(layer_roles) / sizeof(layer_roles[0]); k++) {
            if (strcmp(name + used, layer_roles[k].suffix) == 0) {
                *role = layer_roles[k].role;
                *layer = l;
                return WSYNC_OK;
            }
        }
    }
    return wse_err(WSYNC_ERR_UNSUPPORTED, "target '%s' is not one the engine knows", name);
}

/* The view of slot i in a set based at `base`. */
static void bind_slot(wsync_engine_t *e, size_t i, uint8_t *base)
{
    const wse_slot_t *sl = &e->slots[i];
    const wsync_target_t *t = &e->targets[i];
    void *data = base != NULL ? base + sl->offset : NULL;
    wse_vec_t v = {t->dtype, data};
    /* a 3-D target (w13, w2) is the [prod(leading dims), last dim] matrix its scales describe */
    int64_t rows = 1, cols = t->ndim > 1 ? t->shape[t->ndim - 1] : 1;
    for (int d = 0; d < (t->ndim > 1 ? t->ndim - 1 : 1); d++)
        rows *= t->shape[d];
    wse_mat_t m = {t->dtype, data, NULL, rows, cols, 0};
    wse_layer_t *ly = sl->layer >= 0 ? &e->layers[sl->layer] : NULL;

    if (sl->nscales > 0) {
        m.s = base != NULL ? (const float *)(base + sl->scales_offset) : NULL;
        m.blk = e->blk;
    }
    switch (sl->role) {
    case WSE_EMBED:
        e->w.embed = m;
        if (e->cfg.tie_word_embeddings)
            e->w.lm_head = m;
        break;
    case WSE_LM_HEAD: e->w.lm_head = m; break;
    case WSE_NORM: e->w.norm = v; break;
    case WSE_IN_NORM: ly->in_norm = v; break;
    case WSE_POST_NORM: ly->post_norm = v; break;
    case WSE_Q_NORM: ly->q_norm = v; break;
    case WSE_K_NORM: ly->k_norm = v; break;
    case WSE_QKV: ly->qkv = m; break;
    case WSE_QKV_B: ly->qkv_b = v; break;
    case WSE_O: ly->o = m; break;
    case WSE_O_B: ly->o_b = v; break;
    case WSE_GATE_UP: ly->gate_up = m; break;
    case WSE_GATE_UP_B: ly->gate_up_b = v; break;
    case WSE_DOWN: ly->down = m; break;
    case WSE_DOWN_B: ly->down_b = v; break;
    case WSE_QKV_A: ly->qkv_a = m; break;
    case WSE_Q_B: ly->q_b = m; break;
    case WSE_KV_B: ly->kv_b = m; break;
    case WSE_Q_A_NORM: ly->q_a_norm = v; break;
    case WSE_KV_A_NORM: ly->kv_a_norm = v; break;
    case WSE_ROUTER: ly->router = m; break;
    case WSE_ROUTER_BIAS: ly->router_bias = v; break;
    case WSE_W13: ly->w13 = m; break;
    case WSE_W2: ly->w2 = m; break;
    case WSE_SH_GATE_UP: ly->gate_up = m; break;
    case WSE_SH_DOWN: ly->down = m; break;
    case WSE_NROLES: break;
    }
}

void wse_weights_bind(wsync_engine_t *e)
{
    uint8_t *base = e->sets[e->active].base;
    for (size_t i = 0; i < e->ntargets; i++)
        bind_slot(e, i, base);
}

wsync_status_t wse_set_alloc(wsync_engine_t *e, int s)
{
    void *p;

    if (e->sets[s].base != NULL)
        return WSYNC_OK;
    if (e->cuda != NULL) {
        wsync_status_t st = wse_cuda_alloc(e->cuda, e->set_bytes, &p);
        if (st == WSYNC_OK && (st = wse_cuda_zero(e->cuda, p, e->set_bytes)) != WSYNC_OK)
            wse_cuda_release(e->cuda, p);
        if (st != WSYNC_OK)
            return st;
        e->sets[s].base = p;
        e->sets[s].valid = 0;
        e->sets[s].version = 0;
        return WSYNC_OK;
    }
    p = mmap(NULL, e->set_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return wse_err(WSYNC_ERR_NOMEM, "TP rank %d: cannot map %zu bytes of weights: %s",
                       e->p.tp_rank, e->set_bytes, strerror(errno));
    e->sets[s].base = p;
    e->sets[s].valid = 0;
    e->sets[s].version = 0;
    return WSYNC_OK;
}

void wse_set_free(wsync_engine_t *e, int s)
{
    if (e->sets[s].base != NULL && e->cuda != NULL)
        wse_cuda_release(e->cuda, e->sets[s].base);
    else if (e->sets[s].base != NULL)
        munmap(e->sets[s].base, e->set_bytes);
    e->sets[s].base = NULL;
    e->sets[s].valid = 0;
}

/* Shape checks that keep forward's indexing safe whatever the layout returned. */
static wsync_status_t check_slot_shape(const wsync_engine_t *e, size_t i)
{
    const wsync_target_t *t = &e->targets[i];
    int64_t want[3] = {0, 0, 0}, Hr = e->Hr;
    int nd = 1, ok;
    char a[96], b[96];

    switch (e->slots[i].role) {
    case WSE_EMBED: case WSE_LM_HEAD: want[0] = e->Vr; want[1] = e->Hd; nd = 2; break;
    case WSE_NORM: case WSE_IN_NORM: case WSE_POST_NORM: case WSE_O_B: case WSE_DOWN_B:
        want[0] = e->Hd; break;
    case WSE_Q_NORM: case WSE_K_NORM: want[0] = e->D; break;
    case WSE_QKV: want[0] = (Hr + 2 * e->Kr) * e->D; want[1] = e->Hd; nd = 2; break;
    case WSE_QKV_B: want[0] = (Hr + 2 * e->Kr) * e->D; break;
    case WSE_O: want[0] = e->Hd; want[1] = e->kv_lora ? Hr * e->vd : Hr * e->D; nd = 2; break;
    case WSE_GATE_UP: want[0] = 2 * e->Ir; want[1] = e->Hd; nd = 2; break;
    case WSE_GATE_UP_B: want[0] = 2 * e->Ir; break;
    case WSE_DOWN: want[0] = e->Hd; want[1] = e->Ir; nd = 2; break;
    case WSE_QKV_A: want[0] = e->q_lora + e->kv_lora + e->rope; want[1] = e->Hd; nd = 2; break;
    case WSE_Q_B: want[0] = Hr * e->qk; want[1] = e->q_lora ? e->q_lora : e->Hd; nd = 2; break;
    case WSE_KV_B: want[0] = Hr * (e->nope + e->vd); want[1] = e->kv_lora; nd = 2; break;
    case WSE_Q_A_NORM: want[0] = e->q_lora; break;
    case WSE_KV_A_NORM: want[0] = e->kv_lora; break;
    case WSE_ROUTER: want[0] = e->E; want[1] = e->Hd; nd = 2; break;
    case WSE_ROUTER_BIAS: want[0] = e->E; break;
    case WSE_W13: want[0] = e->E_local; want[1] = 2 * e->Ip; want[2] = e->Hd; nd = 3; break;
    case WSE_W2: want[0] = e->E_local; want[1] = e->Hd; want[2] = e->Ip; nd = 3; break;
    case WSE_SH_GATE_UP: want[0] = 2 * e->Is; want[1] = e->Hd; nd = 2; break;
    case WSE_SH_DOWN: want[0] = e->Hd; want[1] = e->Is; nd = 2; break;
    case WSE_NROLES: break;
    }
    ok = t->ndim == nd;
    for (int d = 0; ok && d < nd; d++)
        ok = t->shape[d] == want[d];
    /* the experts may also come as their flattened [E_local * rows, cols] matrices */
    if (!ok && nd == 3 && t->ndim == 2)
        ok = t->shape[0] == want[0] * want[1] && t->shape[1] == want[2];
    if (!ok) {
        shape_text(a, sizeof(a), t->ndim, t->shape);
        shape_text(b, sizeof(b), nd, want);
        return wse_err(WSYNC_ERR_CONFIG, "target '%s' has an unexpected shape %s (expected %s)",
                       t->name, a, b);
    }
    if (t->dtype != WSYNC_DTYPE_BF16 && t->dtype != WSYNC_DTYPE_F16 &&
        t->dtype != WSYNC_DTYPE_F32 && t->dtype != WSYNC_DTYPE_F8E4M3FN)
        return wse_err(WSYNC_ERR_UNSUPPORTED, "target '%s' is %s, which the engine cannot compute "
                       "with", t->name, wsync_dtype_name(t->dtype));
    if (t->dtype == WSYNC_DTYPE_F8E4M3FN && nd == 1)
        return wse_err(WSYNC_ERR_UNSUPPORTED, "target '%s' is a quantized vector, which the engine "
                       "cannot compute with", t->name);
    return WSYNC_OK;
}

/* A CUDA engine: its GPU, device run state and KV cache; its targets become CUDA memory. */
static wsync_status_t cuda_setup(wsync_engine_t *e)
{
    wse_cuda_dims_t d;
    wsync_status_t st;

    memset(&d, 0, sizeof(d));
    d.Hd = e->Hd;
    d.H = e->H;
    d.K = e->K;
    d.D = e->D;
    d.Hr = e->Hr;
    d.Kr = e->Kr;
    d.kr = e->kr;
    d.Ir = e->Ir;
    d.Vr = e->Vr;
    d.L = e->L;
    d.tp_rank = e->p.tp_rank;
    d.tp_size = e->p.tp_size;
    d.max_seq = e->max_seq;
    d.eps = (float)e->cfg.rms_norm_eps;
    d.q_lora = e->q_lora;
    d.kv_lora = e->kv_lora;
    d.nope = e->nope;
    d.rope = e->rope;
    d.vd = e->vd;
    d.rope_interleave = e->rope_interleave;
    d.attn_scale = e->attn_scale;
    d.E = e->E;
    d.E_local = e->E_local;
    d.e_first = e->e_first;
    d.Ip = e->Ip;
    d.topk = e->topk;
    d.n_group = e->cfg.n_group;
    d.topk_group = e->cfg.topk_group;
    d.scoring = (int)e->cfg.scoring_func;
    d.topk_method = (int)e->cfg.topk_method;
    d.norm_topk = e->norm_topk;
    d.routed_scale = e->routed_scale;
    st = wse_cuda_create(e->p.gpu, &d, e->rope_cos, e->rope_sin, &e->cuda);
    if (st != WSYNC_OK) {
        /* name the rank, keep the detail (without its status prefix, which wse_err adds) */
        char detail[1024];
        const char *d = wsync_engine_last_error(), *pre = wsync_status_str(st);
        size_t n = strlen(pre);
        if (strncmp(d, pre, n) == 0 && d[n] == ':' && d[n + 1] == ' ')
            d += n + 2;
        snprintf(detail, sizeof(detail), "%s", d);
        return wse_err(st, "TP rank %d on CUDA: %s", e->p.tp_rank, detail);
    }
    for (size_t i = 0; i < e->ntargets; i++) {
        e->targets[i].mem = WSYNC_MEM_CUDA;
        e->targets[i].device = wse_cuda_gpu(e->cuda);
        if (e->slots[i].nscales > 0)
            e->targets[i].quant.scales_mem = WSYNC_MEM_CUDA;
    }
    if (e->p.tp_size > 1 && (st = wse_tpdev_create(e, &e->tpdev)) != WSYNC_OK)
        return st;
    wse_info("TP rank %d of %d: GPU %d (%s), %zu bytes of weights per set, %d KV positions",
             e->p.tp_rank, e->p.tp_size, wse_cuda_gpu(e->cuda), wse_cuda_gpu_name(e->cuda),
             e->set_bytes, e->max_seq);
    return WSYNC_OK;
}

void wse_kv_free(wsync_engine_t *e)
{
    if (e->cuda != NULL)
        wse_cuda_kv_free(e->cuda);
    free(e->kcache);
    free(e->vcache);
    e->kcache = e->vcache = NULL;
}

wsync_status_t wsync_engine_cuda_devices(int *count)
{
    if (count == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_cuda_devices: NULL argument");
    return wse_cuda_device_count(count);
}

static wsync_status_t runstate_alloc(wsync_engine_t *e)
{
    int64_t nq = (e->Hr + 2 * e->Kr) * e->D, natt = e->Hr * e->D;
    int64_t nh = 2 * (e->Ir > e->Ip ? e->Ir : e->Ip);
    size_t half = (size_t)(e->rd / 2);

    if (e->kv_lora > 0) {
        nq = e->Hr * e->qk;
        natt = e->Hr * e->vd;
    }
    nh = nh > 2 * e->Is ? nh : 2 * e->Is;
    struct { float **p; size_t n; } bufs[] = {
        {&e->x, (size_t)e->Hd}, {&e->xb, (size_t)e->Hd}, {&e->xb2, (size_t)e->Hd},
        {&e->qkv, (size_t)nq}, {&e->att_out, (size_t)natt},
        {&e->att, (size_t)e->Hr * (size_t)e->max_seq}, {&e->hb, (size_t)nh},
        {&e->hb2, (size_t)(nh / 2)}, {&e->logits_local, (size_t)e->Vr},
        {&e->logits, (size_t)(e->Vr * e->p.tp_size)},
        {&e->mla_a, (size_t)(e->q_lora + e->kv_lora + e->rope)},
        {&e->mla_c, (size_t)(e->q_lora > e->kv_lora ? e->q_lora : e->kv_lora)},
        {&e->mla_kv, (size_t)(e->Hr * (e->nope + e->vd))},
        {&e->router, (size_t)(4 * e->E)}, {&e->moe_out, (size_t)e->Hd},
        {&e->moe_wt, (size_t)e->topk},
        {&e->rope_cos, (size_t)e->max_seq * half}, {&e->rope_sin, (size_t)e->max_seq * half},
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        *bufs[i].p = calloc(bufs[i].n ? bufs[i].n : 1, sizeof(float));
        if (*bufs[i].p == NULL)
            return wse_err(WSYNC_ERR_NOMEM, "no memory for the run state");
    }
    e->moe_sel = calloc((size_t)(e->topk ? e->topk : 1), sizeof(int64_t));
    if (e->moe_sel == NULL)
        return wse_err(WSYNC_ERR_NOMEM, "no memory for the run state");
    /* HF's default RoPE: inv_freq[i] = theta^(-2i/rd), angle = pos * inv_freq[i] in float32.
     * inv_freq is a module buffer, so a model loaded in bf16 (or f16) holds it in that dtype
     * and upcasts it; HF's reference logits agree to 1e-6 only with that rounding. With MLA
     * the rotary part is qk_rope_head_dim wide (HF's config sets head_dim to it). */
    for (int pos = 0; pos < e->max_seq; pos++) {
        for (size_t i = 0; i < half; i++) {
            double inv = pow(e->cfg.rope_theta, -(double)(2 * i) / (double)e->rd);
            float freq = (float)inv;
            if (e->cfg.dtype == WSYNC_DTYPE_BF16)
                freq = wse_bf16_to_f32(wse_f32_to_bf16(freq));
            else if (e->cfg.dtype == WSYNC_DTYPE_F16)
                freq = wse_f16_to_f32(wse_f32_to_f16(freq));
            float ang = (float)pos * freq;   /* float32, as HF computes it */
            e->rope_cos[(size_t)pos * half + i] = cosf(ang);
            e->rope_sin[(size_t)pos * half + i] = sinf(ang);
        }
    }
    if (e->p.device == WSYNC_ENGINE_CUDA)
        return cuda_setup(e);
    return wse_kv_alloc(e);
}

wsync_status_t wse_kv_alloc(wsync_engine_t *e)
{
    size_t per = (size_t)e->L * (size_t)e->max_seq * sizeof(float);

    if (e->cuda != NULL)
        return wse_cuda_kv_alloc(e->cuda);
    if (e->kcache != NULL)
        return WSYNC_OK;
    e->k_bytes = per * (size_t)e->kdim;
    e->v_bytes = per * (size_t)e->vdim;
    e->kcache = malloc(e->k_bytes ? e->k_bytes : 1);
    e->vcache = malloc(e->v_bytes ? e->v_bytes : 1);
    if (e->kcache == NULL || e->vcache == NULL) {
        free(e->kcache);
        free(e->vcache);
        e->kcache = e->vcache = NULL;
        return wse_err(WSYNC_ERR_NOMEM, "no memory for the KV cache (%zu bytes)",
                       e->k_bytes + e->v_bytes);
    }
    return WSYNC_OK;
}

/* The MLA and MoE shapes of rank tp_rank (zeros for a dense GQA model). The layout refuses
 * what does not divide; these are checked against its targets' shapes. */
static wsync_status_t mla_moe_dims(wsync_engine_t *e)
{
    const wsync_model_config_t *c = &e->cfg;
    const int T = e->p.tp_size, r = e->p.tp_rank;

    e->rd = e->D;
    e->attn_scale = 1.0f / sqrtf((float)e->D);
    e->ep = e->p.ep > 1 ? e->p.ep : 1;
    if (c->kv_lora_rank > 0) {
        e->q_lora = c->q_lora_rank;
        e->kv_lora = c->kv_lora_rank;
        e->nope = c->qk_nope_head_dim;
        e->rope = c->qk_rope_head_dim;
        e->vd = c->v_head_dim;
        e->qk = e->nope + e->rope;
        e->rd = e->rope;
        /* HF DeepseekV2 rotates the interleaved pairs always (complex multiply) */
        e->rope_interleave = c->model_type == WSYNC_MODEL_DEEPSEEK_V2 ? 1 : c->rope_interleave;
        e->attn_scale = (float)(1.0 / sqrt((double)e->qk));   /* HF: qk_head_dim ** -0.5 */
        e->kdim = e->Hr * e->qk;
        e->vdim = e->Hr * e->vd;
        if (e->nope < 1 || e->rope < 2 || e->vd < 1)
            return wse_err(WSYNC_ERR_CONFIG, "MLA needs qk_nope_head_dim, qk_rope_head_dim and "
                           "v_head_dim >= 1 (got %lld, %lld, %lld)", (long long)e->nope,
                           (long long)e->rope, (long long)e->vd);
    } else {
        e->kdim = e->vdim = e->Kr * e->D;
    }
    e->routed_scale = 1.0f;
    if (c->num_experts > 0) {
        int64_t base, extra;
        e->E = c->num_experts;
        e->topk = c->num_experts_per_tok;
        if (e->topk < 1 || e->topk > e->E)
            return wse_err(WSYNC_ERR_CONFIG, "num_experts_per_tok %lld is outside [1, %lld]",
                           (long long)e->topk, (long long)e->E);
        if (c->topk_method != WSYNC_TOPK_GREEDY &&
            (c->n_group < 1 || e->E % c->n_group != 0 || c->topk_group < 1 ||
             c->topk_group > c->n_group ||
             (c->topk_method == WSYNC_TOPK_NOAUX_TC && e->E / c->n_group < 2)))
            return wse_err(WSYNC_ERR_CONFIG, "grouped routing needs n_group dividing the %lld "
                           "experts, 1 <= topk_group <= n_group (and 2 experts a group for "
                           "noaux_tc); got n_group %lld, topk_group %lld", (long long)e->E,
                           (long long)c->n_group, (long long)c->topk_group);
        /* HF DeepseekV2Moe scales and never renormalises; V3 and Qwen3-MoE follow the config */
        e->norm_topk = c->model_type == WSYNC_MODEL_DEEPSEEK_V2 ? 0 : c->norm_topk_prob;
        if (c->model_type == WSYNC_MODEL_DEEPSEEK_V2 || c->model_type == WSYNC_MODEL_DEEPSEEK_V3)
            e->routed_scale = (float)c->routed_scaling_factor;
        if (e->ep > 1) {
            /* vLLM determine_expert_map, linear: the first E % EP ranks hold one more */
            base = e->E / e->ep;
            extra = e->E % e->ep;
            e->E_local = base + (r < extra ? 1 : 0);
            e->e_first = r * base + (r < extra ? r : extra);
            e->Ip = c->moe_intermediate_size;
        } else {
            e->E_local = e->E;
            e->e_first = 0;
            e->Ip = c->moe_intermediate_size / T;
        }
        e->Is = c->n_shared_experts * c->moe_intermediate_size / T;
        /* forward takes each expert's rows of w13 / w2 as a matrix of its own */
        if (e->blk > 0 && ((2 * e->Ip) % e->blk != 0 || e->Hd % e->blk != 0))
            return wse_err(WSYNC_ERR_CONFIG, "FP8 blocks of %d rows straddle experts: each "
                           "expert's w13 has %lld rows and w2 %lld (both must be multiples)",
                           e->blk, (long long)(2 * e->Ip), (long long)e->Hd);
    }
    return WSYNC_OK;
}

/* The engine parameters (defaults already applied) make sense on their own. */
static wsync_status_t check_engine_params(const wsync_engine_params_t *p)
{
    int T = p->tp_size, r = p->tp_rank;

    if (T < 1 || T > WSYNC_ENGINE_MAX_TP || r < 0 || r >= T)
        return wse_err(WSYNC_ERR_INVALID, "TP rank %d of %d: need 1 <= tp_size <= %d and "
                       "0 <= tp_rank < tp_size", r, T, WSYNC_ENGINE_MAX_TP);
    if (T > 1 && p->comm == NULL)
        return wse_err(WSYNC_ERR_INVALID, "TP size %d needs a communicator "
                       "(wsync_engine_comm_create before fork)", T);
    if (p->quant != WSYNC_ENGINE_QUANT_NONE && p->quant != WSYNC_ENGINE_QUANT_FP8_BLOCK)
        return wse_err(WSYNC_ERR_INVALID, "unknown quantization %d", (int)p->quant);
    if (p->fp8_block < 0 || p->fp8_block > 256)
        return wse_err(WSYNC_ERR_INVALID, "fp8_block %d is outside [1, 256]", p->fp8_block);
    if (p->mode != WSYNC_ENGINE_IN_PLACE && p->mode != WSYNC_ENGINE_SHADOW)
        return wse_err(WSYNC_ERR_INVALID, "unknown mode %d", (int)p->mode);
    if (p->max_seq < 0)
        return wse_err(WSYNC_ERR_INVALID, "max_seq %d is negative", p->max_seq);
    if (p->device != WSYNC_ENGINE_CPU && p->device != WSYNC_ENGINE_CUDA)
        return wse_err(WSYNC_ERR_INVALID, "unknown device %d (CPU or CUDA)", (int)p->device);
    if (p->ep < 0 || (p->ep > 1 && p->ep != T))
        return wse_err(WSYNC_ERR_INVALID, "ep %d: expert parallelism is 0 or 1 (experts split "
                       "inside by TP) or the TP size %d (whole experts spread over the TP ranks)",
                       p->ep, T);
    return WSYNC_OK;
}

/* Give every target its slot: role, layer, and where its bytes (and FP8 scales) lie in a weight
 * set; *off ends at the set's size. */
static wsync_status_t lay_out_slots(wsync_engine_t *e, size_t *off)
{
    wsync_status_t st;

    for (size_t i = 0; i < e->ntargets; i++) {
        wse_slot_t *sl = &e->slots[i];
        if ((st = role_of(e, e->targets[i].name, &sl->role, &sl->layer)) != WSYNC_OK ||
            (st = check_slot_shape(e, i)) != WSYNC_OK)
            return st;
        sl->bytes = wsync_target_bytes(&e->targets[i]);
        sl->offset = *off;
        *off += align_up(sl->bytes);
        if (e->targets[i].dtype == WSYNC_DTYPE_F8E4M3FN) {
            const wsync_target_t *t = &e->targets[i];
            int64_t rows = 1, cols = t->shape[t->ndim - 1];
            for (int d = 0; d < t->ndim - 1; d++)
                rows *= t->shape[d];
            sl->nscales = wsync_target_scale_count(t);
            /* forward reads the scales of the [prod(leading dims), last dim] matrix */
            if (t->quant.scheme != WSYNC_QUANT_BLOCK ||
                sl->nscales != (size_t)(((rows + e->blk - 1) / e->blk) *
                                        ((cols + e->blk - 1) / e->blk))) {
                return wse_err(WSYNC_ERR_CONFIG, "target '%s': %zu scales, not the %lld x %lld "
                               "blocks of its [%lld, %lld] matrix", t->name, sl->nscales,
                               (long long)((rows + e->blk - 1) / e->blk),
                               (long long)((cols + e->blk - 1) / e->blk), (long long)rows,
                               (long long)cols);
            }
            sl->scales_offset = *off;
            *off += align_up(sl->nscales * sizeof(float));
        }
    }
    return WSYNC_OK;
}

/* Every weight forward reads has a target: the model's embedding, head and norm, and each
 * layer's attention (MLA or not) and MLP (MoE or dense) weights. */
static wsync_status_t check_roles_present(const wsync_engine_t *e)
{
    unsigned model_roles = 0, *seen = calloc((size_t)e->L, sizeof(unsigned));
    const char *missing = NULL;
    int64_t ml = -1;
    if (seen == NULL)
        return wse_err(WSYNC_ERR_NOMEM, "no memory for the weights");
    for (size_t i = 0; i < e->ntargets; i++) {
        if (e->slots[i].layer >= 0)
            seen[e->slots[i].layer] |= 1u << e->slots[i].role;
        else
            model_roles |= 1u << e->slots[i].role;
    }
    if (!(model_roles & 1u << WSE_EMBED))
        missing = "model.embed_tokens.weight";
    else if (!e->cfg.tie_word_embeddings && !(model_roles & 1u << WSE_LM_HEAD))
        missing = "lm_head.weight";
    else if (!(model_roles & 1u << WSE_NORM))
        missing = "model.norm.weight";
    for (int64_t l = 0; l < e->L && missing == NULL; l++) {
        unsigned need = 1u << WSE_IN_NORM | 1u << WSE_POST_NORM | 1u << WSE_O;
        if (e->kv_lora > 0) {
            need |= 1u << WSE_QKV_A | 1u << WSE_Q_B | 1u << WSE_KV_B | 1u << WSE_KV_A_NORM;
            if (e->q_lora > 0)
                need |= 1u << WSE_Q_A_NORM;
        } else {
            need |= 1u << WSE_QKV;
            if (e->cfg.qk_norm)
                need |= 1u << WSE_Q_NORM | 1u << WSE_K_NORM;
        }
        if (wsync_model_layer_is_moe(&e->cfg, l)) {
            need |= 1u << WSE_ROUTER | 1u << WSE_W13 | 1u << WSE_W2;
            if (e->cfg.router_bias)
                need |= 1u << WSE_ROUTER_BIAS;
            if (e->Is > 0)
                need |= 1u << WSE_SH_GATE_UP | 1u << WSE_SH_DOWN;
        } else {
            need |= 1u << WSE_GATE_UP | 1u << WSE_DOWN;
        }
        if ((seen[l] & need) != need) {
            missing = "a layer's weights";
            ml = l;
        }
    }
    free(seen);
    if (missing != NULL)
        return ml >= 0 ? wse_err(WSYNC_ERR_CONFIG, "the layout gave no target for some of "
                                 "layer %lld's weights", (long long)ml)
                       : wse_err(WSYNC_ERR_CONFIG, "the layout gave no target for %s", missing);
    return WSYNC_OK;
}

wsync_status_t wsync_engine_create(const wsync_model_config_t *cfg,
                                   const wsync_engine_params_t *params, wsync_engine_t **out)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_tp_options_t opts = WSYNC_TP_OPTIONS_INIT;
    wsync_engine_t *e;
    wsync_status_t st;
    size_t off = 0;
    int T, r;

    if (cfg == NULL || out == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_create: NULL argument");
    if (params != NULL)
        p = *params;
    T = p.tp_size;
    r = p.tp_rank;
    if ((st = check_engine_params(&p)) != WSYNC_OK)
        return st;
    st = wsync_model_config_check(cfg);
    if (st != WSYNC_OK)
        return wse_err_wsync(st, "model config");

    e = calloc(1, sizeof(*e));
    if (e == NULL)
        return wse_err(WSYNC_ERR_NOMEM, "no memory for an engine");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->cfg = *cfg;
    e->p = p;
    e->Hd = cfg->hidden_size;
    e->H = cfg->num_attention_heads;
    e->K = cfg->num_key_value_heads;
    e->D = cfg->head_dim;
    e->I = cfg->intermediate_size;
    e->V = cfg->vocab_size;
    e->L = cfg->num_hidden_layers;
    {
        int64_t pad = p.vocab_pad > 0 ? p.vocab_pad : 64;
        e->Vp = (e->V + pad - 1) / pad * pad;
    }
    /* the layout refuses what does not divide; these are only used once it accepted */
    e->Vr = e->Vp / T;
    e->Hr = e->H / T;
    e->Kr = e->K >= T ? e->K / T : 1;
    e->kr = e->K >= T ? r : r / (T / e->K);
    e->Ir = e->I / T;
    e->blk = p.quant == WSYNC_ENGINE_QUANT_FP8_BLOCK ? (p.fp8_block ? p.fp8_block : DEFAULT_BLOCK) : 0;
    e->max_seq = p.max_seq > 0 ? p.max_seq
                 : (int)(cfg->max_position_embeddings < DEFAULT_MAX_SEQ
                             ? cfg->max_position_embeddings : DEFAULT_MAX_SEQ);
    e->nsets = p.mode == WSYNC_ENGINE_SHADOW ? 2 : 1;
    if ((st = mla_moe_dims(e)) != WSYNC_OK)
        goto err;
    if (e->rd % 2 != 0) {
        st = wse_err(WSYNC_ERR_CONFIG, "%s %lld is odd; rotary embeddings need it even",
                     e->kv_lora ? "qk_rope_head_dim" : "head_dim", (long long)e->rd);
        goto err;
    }

    opts.param_dtype = p.param_dtype;
    opts.dtype = p.dtype ? p.dtype : WSYNC_DTYPE_BF16;
    opts.vocab_pad = p.vocab_pad;
    if (e->ep > 1) {
        opts.ep_size = e->ep;
        opts.ep_rank = r;
        opts.expert_placement = WSYNC_EXPERT_LINEAR;
    }
    if (e->blk) {
        opts.quant.scheme = WSYNC_QUANT_BLOCK;
        opts.quant.block_rows = opts.quant.block_cols = e->blk;
        opts.quant_dtype = WSYNC_DTYPE_F8E4M3FN;
    }
    st = wsync_layout_tp_targets(cfg, r, T, &opts, &e->targets, &e->ntargets);
    if (st != WSYNC_OK) {
        char what[96];
        snprintf(what, sizeof(what), "TP rank %d of %d%s", r, T,
                 e->blk ? " with FP8 blocks" : "");
        wse_err_wsync(st, what);
        goto err;
    }
    e->layers = calloc((size_t)e->L, sizeof(*e->layers));
    e->slots = calloc(e->ntargets, sizeof(*e->slots));
    e->w.layers = e->layers;
    if (e->layers == NULL || e->slots == NULL) {
        st = wse_err(WSYNC_ERR_NOMEM, "no memory for the weights");
        goto err;
    }
    if ((st = lay_out_slots(e, &off)) != WSYNC_OK)
        goto err;
    e->set_bytes = off ? off : ALIGN;
    /* every weight forward reads must exist */
    if ((st = check_roles_present(e)) != WSYNC_OK)
        goto err;
    /* the run state first: on CUDA it picks the GPU the weight sets live on */
    if ((st = runstate_alloc(e)) != WSYNC_OK)
        goto err;
    for (int s = 0; s < e->nsets; s++)
        if ((st = wse_set_alloc(e, s)) != WSYNC_OK)
            goto err;
    e->active = 0;
    wse_weights_bind(e);
    if (T > 1) {
        size_t need = (size_t)(e->Hd > e->Vr ? e->Hd : e->Vr) * sizeof(float);
        if (need > wse_comm_slot_bytes(p.comm)) {
            st = wse_err(WSYNC_ERR_INVALID, "the communicator's slots hold %zu bytes, TP rank %d "
                         "needs %zu (was it made for this model and vocab_pad?)",
                         wse_comm_slot_bytes(p.comm), r, need);
            goto err;
        }
        if ((st = wse_comm_join(p.comm, r)) != WSYNC_OK)
            goto err;
    }
    *out = e;
    return WSYNC_OK;
err:
    wsync_engine_free(e);
    return st;
}

/* ---- loading full tensors ---------------------------------------------------------------- */

static const wsync_engine_tensor_t *find_tensor(const wsync_engine_tensor_t *t, size_t n,
                                                const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].name != NULL && strcmp(t[i].name, name) == 0)
            return &t[i];
    return NULL;
}

static void shape_text(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

/* Copy piece pc of a target from tensor src into dst (the target's row-major array of dtype
 * dd). A piece keeps its dims; should its param have fewer dims than the target (a per-expert
 * [I, Hd] param in a [E_local, 2 I_p, Hd] w13), they are the target's trailing dims. */
static wsync_status_t copy_piece(const wsync_target_t *t, const wsync_piece_t *pc,
                                 const wsync_engine_tensor_t *src, wsync_dtype_t dd, void *dst)
{
    const int tn = t->ndim, pn = src->ndim, lead = tn - pn;
    int64_t len[WSYNC_MAX_DIMS], sstride[WSYNC_MAX_DIMS], dstride[WSYNC_MAX_DIMS];
    int64_t idx[WSYNC_MAX_DIMS] = {0}, nrows = 1, nc;
    size_t esz = wsync_dtype_size(dd), ssz = wsync_dtype_size(src->dtype);

    if (tn < 1 || tn > WSYNC_MAX_DIMS || pn < 1 || lead < 0)
        return wse_err(WSYNC_ERR_UNSUPPORTED, "target '%s' (%d dims) cannot take param '%s' "
                       "(%d dims)", t->name, tn, src->name, pn);
    /* strides in elements, over the target's dims */
    for (int d = tn - 1; d >= 0; d--) {
        int pd = d - lead;
        len[d] = pd >= 0 ? pc->src.len[pd] : 1;
        dstride[d] = d == tn - 1 ? 1 : dstride[d + 1] * t->shape[d + 1];
        sstride[d] = pd < 0 ? 0 : pd == pn - 1 ? 1 : sstride[d + 1] * src->shape[pd + 1];
        if (pd >= 0 && (pc->src.start[pd] < 0 || len[d] < 0 ||
                        pc->src.start[pd] + len[d] > src->shape[pd]))
            return wse_err(WSYNC_ERR_CONFIG, "target '%s': a piece of '%s' lies outside it",
                           t->name, src->name);
        if (pc->dst_start[d] < 0 || pc->dst_start[d] + len[d] > t->shape[d])
            return wse_err(WSYNC_ERR_CONFIG, "target '%s': a piece of '%s' lies outside the "
                           "target", t->name, src->name);
    }
    nc = len[tn - 1];
    for (int d = 0; d < tn - 1; d++)
        nrows *= len[d];
    for (int64_t row = 0; row < nrows && nc > 0; row++) {
        int64_t so = 0, doff = 0;
        for (int d = 0; d < tn; d++) {
            int pd = d - lead;
            so += ((pd >= 0 ? pc->src.start[pd] : 0) + idx[d]) * sstride[d];
            doff += (pc->dst_start[d] + idx[d]) * dstride[d];
        }
        const uint8_t *sp = (const uint8_t *)src->data + (size_t)so * ssz;
        if (src->dtype == dd)
            memcpy((uint8_t *)dst + (size_t)doff * esz, sp, (size_t)nc * esz);
        else
            for (int64_t j = 0; j < nc; j++)
                wse_store(dd, dst, (size_t)(doff + j), wse_load(src->dtype, sp, (size_t)j));
        for (int d = tn - 2; d >= 0; d--) {   /* next row of the box */
            if (++idx[d] < len[d])
                break;
            idx[d] = 0;
        }
    }
    return WSYNC_OK;
}

wsync_status_t wse_load_into(wsync_engine_t *e, int s, const wsync_engine_tensor_t *tensors,
                             size_t n)
{
    uint8_t *base = e->sets[s].base, *host_set = NULL;
    float *stage = NULL;
    size_t stage_cap = 0;
    wsync_status_t st = WSYNC_OK;
    char a[96], b[96];

    if (base == NULL)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d: the weights are freed (asleep)", e->p.tp_rank);
    e->sets[s].valid = 0;
    if (e->cuda != NULL) {
        /* built on the host, then copied to the GPU in one piece */
        host_set = calloc(1, e->set_bytes);
        if (host_set == NULL)
            return wse_err(WSYNC_ERR_NOMEM, "TP rank %d: no memory to stage %zu bytes of weights",
                           e->p.tp_rank, e->set_bytes);
        base = host_set;
    }
    for (size_t i = 0; i < e->ntargets && st == WSYNC_OK; i++) {
        const wsync_target_t *t = &e->targets[i];
        const wse_slot_t *sl = &e->slots[i];
        int fp8 = t->dtype == WSYNC_DTYPE_F8E4M3FN;
        int64_t cols = t->ndim > 1 ? t->shape[t->ndim - 1] : 1, rows = 1;
        void *dst = base + sl->offset;
        size_t elems;

        for (int d = 0; d < (t->ndim > 1 ? t->ndim - 1 : 1); d++)
            rows *= t->shape[d];
        elems = (size_t)rows * (size_t)cols;

        if (fp8) {
            if (elems > stage_cap) {
                free(stage);
                stage_cap = elems;
                stage = malloc(stage_cap * sizeof(float));
                if (stage == NULL) {
                    st = wse_err(WSYNC_ERR_NOMEM, "no memory to quantize '%s'", t->name);
                    break;
                }
            }
            memset(stage, 0, elems * sizeof(float));
            dst = stage;
        } else {
            memset(dst, 0, sl->bytes);   /* rows no piece covers (vocab padding) are zero */
        }
        for (int k = 0; k < t->npieces && st == WSYNC_OK; k++) {
            const wsync_piece_t *pc = &t->pieces[k];
            const wsync_engine_tensor_t *src = find_tensor(tensors, n, pc->param.name);
            int same = src != NULL && src->ndim == pc->param.ndim;
            for (int d = 0; same && d < src->ndim; d++)
                same = src->shape[d] == pc->param.shape[d];
            if (src == NULL) {
                st = wse_err(WSYNC_ERR_NOT_FOUND, "the checkpoint has no tensor '%s' (needed for "
                             "target '%s')", pc->param.name, t->name);
            } else if (src->dtype != WSYNC_DTYPE_BF16 && src->dtype != WSYNC_DTYPE_F16 &&
                       src->dtype != WSYNC_DTYPE_F32) {
                st = wse_err(WSYNC_ERR_UNSUPPORTED, "tensor '%s' has dtype %s, which the engine "
                             "cannot read (BF16, F16 or F32)", src->name,
                             src->dtype_name != NULL ? src->dtype_name
                                                     : wsync_dtype_name(src->dtype));
            } else if (!same) {
                shape_text(a, sizeof(a), src->ndim, src->shape);
                shape_text(b, sizeof(b), pc->param.ndim, pc->param.shape);
                st = wse_err(WSYNC_ERR_CONFIG, "tensor '%s' is %s in the checkpoint, but the "
                             "config implies %s", src->name, a, b);
            } else if (src->data == NULL && src->nbytes > 0) {
                st = wse_err(WSYNC_ERR_INVALID, "tensor '%s' has no data", src->name);
            } else {
                st = copy_piece(t, pc, src, fp8 ? WSYNC_DTYPE_F32 : t->dtype, dst);
            }
        }
        if (st == WSYNC_OK && fp8)
            st = wsync_engine_quantize_block(t->name, stage, rows, cols, e->blk,
                                             base + sl->offset,
                                             (float *)(base + sl->scales_offset));
    }
    free(stage);
    if (st == WSYNC_OK && host_set != NULL)
        st = wse_cuda_upload(e->cuda, e->sets[s].base, host_set, e->set_bytes);
    free(host_set);
    if (st == WSYNC_OK) {
        e->sets[s].valid = 1;
        e->sets[s].version = 0;
    }
    return st;
}

/* Keep the descriptions of the source (not its data) for a reload after a level-2 sleep. */
static wsync_status_t keep_source(wsync_engine_t *e, const wsync_engine_tensor_t *t, size_t n)
{
    size_t bytes = 0;
    wsync_engine_tensor_t *copy;
    char *names, *p;

    if (t == e->src)
        return WSYNC_OK;
    for (size_t i = 0; i < n; i++)
        bytes += (t[i].name != NULL ? strlen(t[i].name) : 0) + 1;
    copy = calloc(n ? n : 1, sizeof(*copy));
    names = malloc(bytes ? bytes : 1);
    if (copy == NULL || names == NULL) {
        free(copy);
        free(names);
        return wse_err(WSYNC_ERR_NOMEM, "no memory for %zu tensor descriptions", n);
    }
    p = names;
    for (size_t i = 0; i < n; i++) {
        copy[i] = t[i];
        strcpy(p, t[i].name != NULL ? t[i].name : "");
        copy[i].name = p;
        p += strlen(p) + 1;
    }
    free(e->src);
    free(e->src_names);
    e->src = copy;
    e->src_names = names;
    e->nsrc = n;
    return WSYNC_OK;
}

wsync_status_t wsync_engine_load(wsync_engine_t *e, const wsync_engine_tensor_t *tensors, size_t n)
{
    wsync_status_t st;

    if (e == NULL || (tensors == NULL && n > 0))
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_load: NULL argument");
    if (e->sleeping >= 2)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d is asleep (level 2): wake it first",
                       e->p.tp_rank);
    if (e->thread_running)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d: cannot load from tensors while attached in "
                       "shadow mode", e->p.tp_rank);
    if ((st = keep_source(e, tensors, n)) != WSYNC_OK)
        return st;
    st = wse_load_into(e, e->active, e->src, e->nsrc);
    if (st == WSYNC_OK)
        wse_weights_bind(e);
    return st;
}

/* ---- opening an HF directory -------------------------------------------------------------- */

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The shard files named by model.safetensors.index.json, each once. */
static wsync_status_t index_files(const char *dir, const char *index, char ***files, size_t *n)
{
    json_error_t jerr;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &jerr), *map, *v;
    const char *key;
    char **out = NULL;
    size_t cnt = 0;

    if (root == NULL)
        return wse_err(WSYNC_ERR_INVALID, "%s: not valid JSON (line %d: %s)", index, jerr.line,
                       jerr.text);
    map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return wse_err(WSYNC_ERR_INVALID, "%s: no 'weight_map' object", index);
    }
    out = calloc(json_object_size(map) + 1, sizeof(*out));
    if (out == NULL) {
        json_decref(root);
        return wse_err(WSYNC_ERR_NOMEM, "%s", index);
    }
    json_object_foreach(map, key, v) {
        const char *f = json_string_value(v);
        size_t k;
        if (f == NULL || strchr(f, '/') != NULL || f[0] == '.') {
            for (k = 0; k < cnt; k++)
                free(out[k]);
            free(out);
            json_decref(root);
            return wse_err(WSYNC_ERR_INVALID, "%s: weight_map['%s'] is not a file name in %s",
                           index, key, dir);
        }
        for (k = 0; k < cnt && strcmp(strrchr(out[k], '/') + 1, f) != 0; k++)
            ;
        if (k < cnt)
            continue;
        size_t len = strlen(dir) + strlen(f) + 2;
        out[cnt] = malloc(len);
        if (out[cnt] != NULL)
            snprintf(out[cnt++], len, "%s/%s", dir, f);
    }
    json_decref(root);
    *files = out;
    *n = cnt;
    return WSYNC_OK;
}

/* The engine computes the default RoPE only (and, with MLA, no YaRN mscale in the softmax
 * scale): a config asking for another kind is refused rather than answered wrongly. */
static wsync_status_t check_rope(const char *path)
{
    static const char *keys[] = {"rope_scaling", "rope_parameters"};
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    wsync_status_t st = WSYNC_OK;

    if (root == NULL)
        return wse_err(WSYNC_ERR_INVALID, "%s: not valid JSON (line %d: %s)", path, jerr.line,
                       jerr.text);
    for (size_t k = 0; k < 2 && st == WSYNC_OK; k++) {
        json_t *o = json_object_get(root, keys[k]), *t;
        const char *field = "rope_type";
        if (!json_is_object(o))
            continue;
        if ((t = json_object_get(o, field)) == NULL)
            t = json_object_get(o, field = "type");
        if (json_is_string(t) && strcmp(json_string_value(t), "default") != 0)
            st = wse_err(WSYNC_ERR_UNSUPPORTED, "%s: %s.%s '%s' is not implemented by the "
                         "bundled engine (default RoPE only)", path, keys[k], field,
                         json_string_value(t));
    }
    json_decref(root);
    return st;
}

wsync_status_t wsync_engine_open(const char *dir, const wsync_engine_params_t *params,
                                 wsync_engine_t **out)
{
    char path[4096], index[4096];
    wsync_model_config_t cfg;
    wsync_engine_t *e = NULL;
    wsync_engine_st_t **files = NULL;
    wsync_engine_tensor_t *all = NULL;
    char **names = NULL;
    size_t nfiles = 0, total = 0;
    wsync_status_t st;

    if (dir == NULL || out == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_open: NULL argument");
    snprintf(path, sizeof(path), "%s/config.json", dir);
    st = wsync_model_config_load(path, &cfg);
    if (st != WSYNC_OK)
        return wse_err_wsync(st, "model config");
    if ((st = check_rope(path)) != WSYNC_OK)
        return st;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(index, sizeof(index), "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        names = calloc(2, sizeof(*names));
        if (names == NULL || (names[0] = strdup(path)) == NULL) {
            free(names);
            return wse_err(WSYNC_ERR_NOMEM, "%s", path);
        }
        nfiles = 1;
    } else if (file_exists(index)) {
        if ((st = index_files(dir, index, &names, &nfiles)) != WSYNC_OK)
            return st;
    } else {
        return wse_err(WSYNC_ERR_NOT_FOUND, "%s has neither model.safetensors nor "
                       "model.safetensors.index.json", dir);
    }
    files = calloc(nfiles + 1, sizeof(*files));
    if (files == NULL) {
        st = wse_err(WSYNC_ERR_NOMEM, "%s", dir);
        goto out;
    }
    for (size_t i = 0; i < nfiles; i++) {
        if ((st = wsync_engine_st_open(names[i], &files[i])) != WSYNC_OK)
            goto out;
        total += wsync_engine_st_count(files[i]);
    }
    all = calloc(total + 1, sizeof(*all));
    if (all == NULL) {
        st = wse_err(WSYNC_ERR_NOMEM, "%s", dir);
        goto out;
    }
    total = 0;
    for (size_t i = 0; i < nfiles; i++) {
        const wsync_engine_tensor_t *t = wsync_engine_st_tensors(files[i]);
        for (size_t k = 0; k < wsync_engine_st_count(files[i]); k++) {
            if (find_tensor(all, total, t[k].name) != NULL) {
                st = wse_err(WSYNC_ERR_INVALID, "tensor '%s' is in two checkpoint files (%s)",
                             t[k].name, names[i]);
                goto out;
            }
            all[total++] = t[k];
        }
    }
    if ((st = wsync_engine_create(&cfg, params, &e)) != WSYNC_OK)
        goto out;
    if ((st = wsync_engine_load(e, all, total)) != WSYNC_OK)
        goto out;
    e->files = files;
    e->nfiles = nfiles;
    files = NULL;
    *out = e;
    e = NULL;
out:
    wsync_engine_free(e);
    if (files != NULL)
        for (size_t i = 0; i < nfiles; i++)
            wsync_engine_st_close(files[i]);
    free(files);
    free(all);
    for (size_t i = 0; names != NULL && i < nfiles; i++)
        free(names[i]);
    free(names);
    return st;
}

/* ---- accessors and teardown --------------------------------------------------------------- */

const wsync_model_config_t *wsync_engine_config(const wsync_engine_t *e)
{
    return e != NULL ? &e->cfg : NULL;
}

size_t wsync_engine_weight_count(const wsync_engine_t *e)
{
    return e != NULL ? e->ntargets : 0;
}

wsync_status_t wsync_engine_weight(const wsync_engine_t *e, size_t i, wsync_engine_weight_t *w)
{
    const wsync_target_t *t;
    uint8_t *base;

    if (e == NULL || w == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_weight: NULL argument");
    if (i >= e->ntargets)
        return wse_err(WSYNC_ERR_RANGE, "weight %zu of %zu", i, e->ntargets);
    base = e->sets[e->active].base;
    if (base == NULL)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d: the weights are freed (asleep)",
                       e->p.tp_rank);
    t = &e->targets[i];
    memset(w, 0, sizeof(*w));
    w->name = t->name;
    w->dtype = t->dtype;
    w->ndim = t->ndim;
    memcpy(w->shape, t->shape, sizeof(w->shape));
    w->data = base + e->slots[i].offset;
    w->bytes = e->slots[i].bytes;
    if (e->slots[i].nscales > 0) {
        w->scales = (float *)(base + e->slots[i].scales_offset);
        w->nscales = e->slots[i].nscales;
        w->block = e->blk;
    }
    w->mem = e->cuda != NULL ? WSYNC_MEM_CUDA : WSYNC_MEM_HOST;
    w->device = e->cuda != NULL ? wse_cuda_gpu(e->cuda) : 0;
    return WSYNC_OK;
}

wsync_status_t wsync_engine_weight_read(const wsync_engine_t *e, size_t i, void *data,
                                        float *scales)
{
    wsync_engine_weight_t w;
    wsync_status_t st;

    if (data == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_weight_read: NULL data");
    if ((st = wsync_engine_weight(e, i, &w)) != WSYNC_OK)
        return st;
    if (e->cuda == NULL) {
        memcpy(data, w.data, w.bytes);
        if (scales != NULL && w.nscales > 0)
            memcpy(scales, w.scales, w.nscales * sizeof(float));
        return WSYNC_OK;
    }
    if ((st = wse_cuda_download(e->cuda, data, w.data, w.bytes)) != WSYNC_OK)
        return st;
    if (scales != NULL && w.nscales > 0)
        st = wse_cuda_download(e->cuda, scales, w.scales, w.nscales * sizeof(float));
    return st;
}

void wsync_engine_free(wsync_engine_t *e)
{
    if (e == NULL)
        return;
    wse_shadow_stop(e);
    wsync_receiver_free(e->rv);   /* before the buffers it writes */
    for (int s = 0; s < 2; s++)
        wse_set_free(e, s);
    wse_tpdev_free(e->tpdev);
    wse_cuda_free(e->cuda);   /* after the sets, its memory */
    e->cuda = NULL;
    float *bufs[] = {e->x, e->xb, e->xb2, e->qkv, e->att_out, e->att, e->hb, e->hb2,
                     e->logits_local, e->logits, e->mla_a, e->mla_c, e->mla_kv, e->router,
                     e->moe_out, e->moe_wt, e->rope_cos, e->rope_sin, e->kcache, e->vcache};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    if (e->targets != NULL) {
        for (size_t i = 0; i < e->ntargets; i++) {
            e->targets[i].data = NULL;
            e->targets[i].quant.scales = NULL;
        }
        wsync_layout_targets_free(e->targets, e->ntargets);
    }
    free(e->moe_sel);
    free(e->slots);
    free(e->layers);
    free(e->src);
    free(e->src_names);
    for (size_t i = 0; i < e->nfiles; i++)
        wsync_engine_st_close(e->files[i]);
    free(e->files);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
