/* forward(): one decoder step of the rank's slice, all-reduced and gathered through the
 * communicator; generate(): greedy decoding. Nothing here allocates. */
#include <math.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "engine/internal.h"

static float fp8_lut[256];
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;

static void fp8_lut_init(void)
{
    uint8_t codes[256];
    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    wsync_fp8_to_f32(codes, 256, WSYNC_DTYPE_F8E4M3FN, fp8_lut);
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* 8 running sums, so the compiler can keep them in one vector register */
static float dot_bf16(const uint16_t *w, const float *x, int64_t n)
{
    float acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += wse_bf16_to_f32(w[j + k]) * x[j + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; j++)
        s += wse_bf16_to_f32(w[j]) * x[j];
    return s;
}

static float dot_f32(const float *w, const float *x, int64_t n)
{
    float acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += w[j + k] * x[j + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; j++)
        s += w[j] * x[j];
    return s;
}

static float dot_f16(const uint16_t *w, const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++)
        s += wse_f16_to_f32(w[j]) * x[j];
    return s;
}

static float dot_fp8(const uint8_t *w, const float *x, int64_t n)
{
    float acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += fp8_lut[w[j + k]] * x[j + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; j < n; j++)
        s += fp8_lut[w[j]] * x[j];
    return s;
}

/* out[rows] = m[rows, cols] . x[cols]; FP8 blocks are dequantized one block at a time
 * (the block's dot product times its scale). */
static void matvec(float *out, const wse_mat_t *m, const float *x)
{
    const int64_t rows = m->rows, cols = m->cols;
    switch (m->dtype) {
    case WSYNC_DTYPE_BF16:
        for (int64_t i = 0; i < rows; i++)
            out[i] = dot_bf16((const uint16_t *)m->w + i * cols, x, cols);
        break;
    case WSYNC_DTYPE_F32:
        for (int64_t i = 0; i < rows; i++)
            out[i] = dot_f32((const float *)m->w + i * cols, x, cols);
        break;
    case WSYNC_DTYPE_F16:
        for (int64_t i = 0; i < rows; i++)
            out[i] = dot_f16((const uint16_t *)m->w + i * cols, x, cols);
        break;
    case WSYNC_DTYPE_F8E4M3FN: {
        const int64_t b = m->blk, nbc = (cols + b - 1) / b;
        for (int64_t i = 0; i < rows; i++) {
            const uint8_t *row = (const uint8_t *)m->w + i * cols;
            const float *s = m->s + (i / b) * nbc;
            float acc = 0.0f;
            for (int64_t bj = 0; bj < nbc; bj++) {
                int64_t c0 = bj * b, n = cols - c0 < b ? cols - c0 : b;
                acc += dot_fp8(row + c0, x + c0, n) * s[bj];
            }
            out[i] = acc;
        }
        break;
    }
    default:
        memset(out, 0, (size_t)rows * sizeof(float));
        break;
    }
}

static void add_vec(float *x, const wse_vec_t *b, int64_t n)
{
    if (b->w == NULL)
        return;
    for (int64_t i = 0; i < n; i++)
        x[i] += wse_load(b->dtype, b->w, (size_t)i);
}

/* HF's RMSNorm: x * rsqrt(mean(x^2) + eps) * weight */
static void rmsnorm(float *out, const float *x, const wse_vec_t *w, int64_t n, float eps)
{
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = wse_load(w->dtype, w->w, (size_t)i) * (x[i] * r);
}

/* HF rotate-half: pairs (i, i + D/2) */
static void rope(float *v, int64_t D, const float *cs, const float *sn)
{
    int64_t h = D / 2;
    for (int64_t i = 0; i < h; i++) {
        float a = v[i], b = v[i + h];
        v[i] = a * cs[i] - b * sn[i];
        v[i + h] = b * cs[i] + a * sn[i];
    }
}

/* Interleaved pairs (2i, 2i + 1) rotated with frequency i: DeepSeek's rope_interleave. HF
 * de-interleaves q and k alike before its rotate-half, which permutes both the same way and so
 * leaves every q.k as here. */
static void rope_interleaved(float *v, int64_t D, const float *cs, const float *sn)
{
    for (int64_t i = 0; i < D / 2; i++) {
        float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cs[i] - b * sn[i];
        v[2 * i + 1] = b * cs[i] + a * sn[i];
    }
}

static wsync_status_t allreduce(wsync_engine_t *e, float *x, int64_t n)
{
    if (e->p.tp_size == 1)
        return WSYNC_OK;
    return wse_comm_allreduce(e->p.comm, e->p.tp_rank, x, (size_t)n);
}

/* ---- forward ------------------------------------------------------------------------------ */

static wsync_status_t ready(const wsync_engine_t *e)
{
    if (e->sleeping)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d is asleep (level %d): wake it first",
                       e->p.tp_rank, e->sleeping);
    if (!e->sets[e->active].valid)
        return wse_err(WSYNC_ERR_STATE, "TP rank %d has no weights yet (load them or take a "
                       "version)", e->p.tp_rank);
    return WSYNC_OK;
}

/* The same step on the rank's GPU (engine/forward_cuda.cu); the logits come back to the host. */
static wsync_status_t forward_cuda(wsync_engine_t *e, int32_t token, int pos, const float **logits)
{
    wse_cuda_coll_t coll;
    wsync_status_t st;

    memset(&coll, 0, sizeof(coll));
    if (e->tpdev != NULL && (st = wse_tpdev_coll(e->tpdev, &coll)) != WSYNC_OK)
        return st;
    if ((st = wse_cuda_forward(e->cuda, &e->w, token, pos, &coll, e->logits)) != WSYNC_OK)
        return st;
    if (logits != NULL)
        *logits = e->logits;
    return WSYNC_OK;
}

/* q.k over the cached positions [0, pos], softmax, and the v-weighted sum: one head. k_t and
 * v_t are kstride / vstride floats apart in the cache. */
static void attend(float *out, float *att, const float *q, const float *kc, const float *vc,
                   int64_t kstride, int64_t vstride, int64_t dk, int64_t dv, int pos, float scale)
{
    float mx = -INFINITY, sum = 0.0f;

    for (int t = 0; t <= pos; t++) {
        const float *kt = kc + (size_t)t * (size_t)kstride;
        float s = 0.0f;
        for (int64_t i = 0; i < dk; i++)
            s += q[i] * kt[i];
        att[t] = s * scale;
        mx = att[t] > mx ? att[t] : mx;
    }
    for (int t = 0; t <= pos; t++) {
        att[t] = expf(att[t] - mx);
        sum += att[t];
    }
    memset(out, 0, (size_t)dv * sizeof(float));
    for (int t = 0; t <= pos; t++) {
        const float *vt = vc + (size_t)t * (size_t)vstride;
        float a = att[t] / sum;
        for (int64_t i = 0; i < dv; i++)
            out[i] += a * vt[i];
    }
}

/* Grouped-query attention of layer l (xb: the normed input) into e->xb2, this rank's part. */
static void attention_gqa(wsync_engine_t *e, const wse_layer_t *ly, int64_t l, int pos,
                          const float *cs, const float *sn)
{
    const int64_t D = e->D, Hr = e->Hr, Kr = e->Kr, kvd = Kr * D, group = e->H / e->K;
    const float eps = (float)e->cfg.rms_norm_eps;
    float *q = e->qkv, *k = e->qkv + Hr * D, *v = k + kvd;
    float *kc = e->kcache + ((size_t)l * (size_t)e->max_seq) * (size_t)kvd;
    float *vc = e->vcache + ((size_t)l * (size_t)e->max_seq) * (size_t)kvd;

    matvec(e->qkv, &ly->qkv, e->xb);
    add_vec(e->qkv, &ly->qkv_b, (Hr + 2 * Kr) * D);
    for (int64_t h = 0; h < Hr; h++) {
        if (ly->q_norm.w != NULL)
            rmsnorm(q + h * D, q + h * D, &ly->q_norm, D, eps);
        rope(q + h * D, D, cs, sn);
    }
    for (int64_t h = 0; h < Kr; h++) {
        if (ly->k_norm.w != NULL)
            rmsnorm(k + h * D, k + h * D, &ly->k_norm, D, eps);
        rope(k + h * D, D, cs, sn);
    }
    memcpy(kc + (size_t)pos * (size_t)kvd, k, (size_t)kvd * sizeof(float));
    memcpy(vc + (size_t)pos * (size_t)kvd, v, (size_t)kvd * sizeof(float));
    for (int64_t h = 0; h < Hr; h++) {
        /* global q head rank*Hr + h reads kv head (rank*Hr + h) / group, held locally at
         * that minus the rank's first kv head */
        int64_t kvh = (e->p.tp_rank * Hr + h) / group - e->kr * Kr;
        attend(e->att_out + h * D, e->att + h * e->max_seq, q + h * D, kc + kvh * D,
               vc + kvh * D, kvd, kvd, D, D, pos, e->attn_scale);
    }
    matvec(e->xb2, &ly->o, e->att_out);
}

/* The latent norms of HF's DeepseekV2/V3 attention are built without the config's eps:
 * DeepseekV3RMSNorm(q_lora_rank) keeps its default. */
#define MLA_NORM_EPS 1e-6f

/* Multi-head latent attention of layer l (xb: the normed input) into e->xb2, this rank's heads.
 * The latent and k_pe come from the replicated qkv_a; q and kv_b are this rank's heads. Keys and
 * values are cached expanded per head: k = [k_nope | k_pe] (k_pe shared by the heads), v. */
static void attention_mla(wsync_engine_t *e, const wse_layer_t *ly, int64_t l, int pos,
                          const float *cs, const float *sn)
{
    const int64_t Hr = e->Hr, qk = e->qk, nope = e->nope, rope_d = e->rope, vd = e->vd;
    const int64_t kvl = e->kv_lora, ql = e->q_lora;
    float *a = e->mla_a, *q = e->qkv, *kv = e->mla_kv;
    float *kpe = a + ql + kvl;   /* [rope], after [q_a | kv_a latent] */
    float *kc = e->kcache + ((size_t)l * (size_t)e->max_seq + (size_t)pos) * (size_t)e->kdim;
    float *vc = e->vcache + ((size_t)l * (size_t)e->max_seq + (size_t)pos) * (size_t)e->vdim;
    float *k0 = e->kcache + (size_t)l * (size_t)e->max_seq * (size_t)e->kdim;
    float *v0 = e->vcache + (size_t)l * (size_t)e->max_seq * (size_t)e->vdim;

    matvec(a, &ly->qkv_a, e->xb);
    if (ql > 0) {
        rmsnorm(e->mla_c, a, &ly->q_a_norm, ql, MLA_NORM_EPS);
        matvec(q, &ly->q_b, e->mla_c);
    } else {
        matvec(q, &ly->q_b, e->xb);
    }
    rmsnorm(e->mla_c, a + ql, &ly->kv_a_norm, kvl, MLA_NORM_EPS);
    matvec(kv, &ly->kv_b, e->mla_c);
    if (e->rope_interleave)
        rope_interleaved(kpe, rope_d, cs, sn);
    else
        rope(kpe, rope_d, cs, sn);
    for (int64_t h = 0; h < Hr; h++) {
        float *qh = q + h * qk, *kh = kc + h * qk;
        if (e->rope_interleave)
            rope_interleaved(qh + nope, rope_d, cs, sn);
        else
            rope(qh + nope, rope_d, cs, sn);
        memcpy(kh, kv + h * (nope + vd), (size_t)nope * sizeof(float));
        memcpy(kh + nope, kpe, (size_t)rope_d * sizeof(float));
        memcpy(vc + h * vd, kv + h * (nope + vd) + nope, (size_t)vd * sizeof(float));
    }
    for (int64_t h = 0; h < Hr; h++)
        attend(e->att_out + h * vd, e->att + h * e->max_seq, q + h * qk, k0 + h * qk,
               v0 + h * vd, e->kdim, e->vdim, qk, vd, pos, e->attn_scale);
    matvec(e->xb2, &ly->o, e->att_out);
}

/* out[Hd] = down . (silu(gate) * up), gate_up [2 * n, Hd] holding gate rows then up rows. */
static void swiglu(wsync_engine_t *e, float *out, const wse_mat_t *gate_up, const wse_vec_t *gub,
                   const wse_mat_t *down, int64_t n)
{
    matvec(e->hb, gate_up, e->xb);
    if (gub != NULL)
        add_vec(e->hb, gub, 2 * n);
    for (int64_t i = 0; i < n; i++) {
        float g = e->hb[i];
        e->hb2[i] = g / (1.0f + expf(-g)) * e->hb[n + i];
    }
    matvec(out, down, e->hb2);
}

/* Rows [r0, r0 + n) of m as a matrix of their own (an FP8 block row must start at r0). */
static wse_mat_t mat_rows(const wse_mat_t *m, int64_t r0, int64_t n)
{
    wse_mat_t s = *m;
    size_t esz = wsync_dtype_size(m->dtype);

    s.w = (const uint8_t *)m->w + (size_t)(r0 * m->cols) * esz;
    if (m->s != NULL)
        s.s = m->s + (r0 / m->blk) * ((m->cols + m->blk - 1) / m->blk);
    s.rows = n;
    return s;
}

/* The router's choice for xb: top-k expert ids into sel[topk] (ascending) and their weights into
 * wt[topk], by the family's rule (HF transformers 5.x):
 *  softmax (qwen3_moe, deepseek_v2): p = softmax(logits); greedy top-k of p, or
 *    group_limited_greedy: groups scored by their max p, the top topk_group kept, the others'
 *    experts masked to 0, top-k of that; weights p;
 *  sigmoid (deepseek_v3, noaux_tc): s = sigmoid(logits); c = s + e_score_correction_bias;
 *    groups scored by the sum of their top-2 c, the top topk_group kept, the others' experts'
 *    c masked to 0 (as HF's masked_fill), top-k of c; weights s (without the bias);
 *  then, with norm_topk, w /= (sum w + 1e-20) (sigmoid) or sum w (softmax); times
 *  routed_scaling_factor. Ties go to the lowest index. */
static void route(const wsync_engine_t *e, const wse_layer_t *ly, int64_t *sel, float *wt)
{
    const int64_t E = e->E, K = e->topk;
    const wsync_model_config_t *c = &e->cfg;
    /* e->router [4 E]: scores, choice scores, group scores, kept groups */
    float *p = e->router, *ch = p + E, *gs = p + 2 * E, *keep = p + 3 * E;
    int64_t G = c->topk_method == WSYNC_TOPK_GREEDY ? 1 : c->n_group, per = E / G;

    matvec(p, &ly->router, e->xb);
    if (c->scoring_func == WSYNC_ROUTER_SIGMOID) {
        for (int64_t i = 0; i < E; i++)
            p[i] = 1.0f / (1.0f + expf(-p[i]));
    } else {
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t i = 0; i < E; i++)
            mx = p[i] > mx ? p[i] : mx;
        for (int64_t i = 0; i < E; i++) {
            p[i] = expf(p[i] - mx);
            sum += p[i];
        }
        for (int64_t i = 0; i < E; i++)
            p[i] /= sum;
    }
    for (int64_t i = 0; i < E; i++)
        ch[i] = p[i] + (c->topk_method == WSYNC_TOPK_NOAUX_TC && ly->router_bias.w != NULL
                            ? wse_load(ly->router_bias.dtype, ly->router_bias.w, (size_t)i)
                            : 0.0f);
    if (G > 1) {
        for (int64_t g = 0; g < G; g++) {
            const float *x = ch + g * per;
            if (c->topk_method == WSYNC_TOPK_NOAUX_TC) {
                int64_t b1 = 0, b2 = -1;
                for (int64_t i = 1; i < per; i++)
                    if (x[i] > x[b1])
                        b1 = i;
                for (int64_t i = 0; i < per; i++)
                    if (i != b1 && (b2 < 0 || x[i] > x[b2]))
                        b2 = i;
                gs[g] = x[b1] + x[b2];
            } else {
                float m = x[0];
                for (int64_t i = 1; i < per; i++)
                    m = x[i] > m ? x[i] : m;
                gs[g] = m;
            }
            keep[g] = 0.0f;
        }
        for (int64_t k = 0; k < c->topk_group; k++) {
            int64_t best = -1;
            for (int64_t g = 0; g < G; g++)
                if (keep[g] == 0.0f && (best < 0 || gs[g] > gs[best]))
                    best = g;
            keep[best] = 1.0f;
        }
        for (int64_t i = 0; i < E; i++)
            if (keep[i / per] == 0.0f)
                ch[i] = 0.0f;
    }
    /* top-k of the choice scores, ties to the lowest index; then in ascending id order (the
     * order HF's expert loop adds them in) */
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t i = 0; i < E; i++) {
            int taken = 0;
            for (int64_t j = 0; j < k && !taken; j++)
                taken = sel[j] == i;
            if (!taken && (best < 0 || ch[i] > ch[best]))
                best = i;
        }
        sel[k] = best;
    }
    for (int64_t k = 1; k < K; k++)
        for (int64_t j = k; j > 0 && sel[j - 1] > sel[j]; j--) {
            int64_t t = sel[j];
            sel[j] = sel[j - 1];
            sel[j - 1] = t;
        }
    {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            wt[k] = p[sel[k]];
            sum += wt[k];
        }
        if (e->norm_topk) {
            if (c->scoring_func == WSYNC_ROUTER_SIGMOID)
                sum += 1e-20f;
            for (int64_t k = 0; k < K; k++)
                wt[k] /= sum;
        }
        for (int64_t k = 0; k < K; k++)
            wt[k] *= e->routed_scale;
    }
}

/* The MLP of a MoE layer (xb: the normed input) into e->xb2, this rank's part: the routed
 * experts it holds, weighted, plus its slice of the shared experts. */
static void mlp_moe(wsync_engine_t *e, const wse_layer_t *ly)
{
    const int64_t Hd = e->Hd, Ip = e->Ip;
    int64_t *sel = e->moe_sel;
    float *wt = e->moe_wt;

    route(e, ly, sel, wt);
    memset(e->moe_out, 0, (size_t)Hd * sizeof(float));
    for (int64_t k = 0; k < e->topk; k++) {
        int64_t j = sel[k] - e->e_first;
        if (j < 0 || j >= e->E_local)
            continue;   /* another rank's expert: its rank adds it */
        wse_mat_t w13 = mat_rows(&ly->w13, j * 2 * Ip, 2 * Ip);
        wse_mat_t w2 = mat_rows(&ly->w2, j * Hd, Hd);
        swiglu(e, e->xb2, &w13, NULL, &w2, Ip);
        for (int64_t i = 0; i < Hd; i++)
            e->moe_out[i] += wt[k] * e->xb2[i];
    }
    if (ly->gate_up.w != NULL) {
        swiglu(e, e->xb2, &ly->gate_up, NULL, &ly->down, ly->gate_up.rows / 2);
        for (int64_t i = 0; i < Hd; i++)
            e->xb2[i] += e->moe_out[i];
    } else {
        memcpy(e->xb2, e->moe_out, (size_t)Hd * sizeof(float));
    }
}

static wsync_status_t forward_step(wsync_engine_t *e, int32_t token, int pos, const float **logits)
{
    const int64_t Hd = e->Hd, half = e->rd / 2;
    const float eps = (float)e->cfg.rms_norm_eps;
    const int rank = e->p.tp_rank;
    const float *cs, *sn;
    wsync_status_t st;

    if ((st = ready(e)) != WSYNC_OK)
        return st;
    if (token < 0 || token >= e->V)
        return wse_err(WSYNC_ERR_RANGE, "token %d is outside the vocabulary [0, %lld)", (int)token,
                       (long long)e->V);
    if (pos < 0 || pos >= e->max_seq)
        return wse_err(WSYNC_ERR_RANGE, "position %d is outside [0, %d) (max_seq)", pos,
                       e->max_seq);
    if (e->cuda != NULL)
        return forward_cuda(e, token, pos, logits);
    pthread_once(&fp8_once, fp8_lut_init);
    cs = e->rope_cos + (size_t)pos * (size_t)half;
    sn = e->rope_sin + (size_t)pos * (size_t)half;

    /* embedding: the rank holding the row contributes it, the others zeros */
    {
        int64_t lo = rank * e->Vr;
        if (token >= lo && token < lo + e->Vr)
            for (int64_t i = 0; i < Hd; i++)
                e->x[i] = wse_load(e->w.embed.dtype, e->w.embed.w, (size_t)((token - lo) * Hd + i));
        else
            memset(e->x, 0, (size_t)Hd * sizeof(float));
        if ((st = allreduce(e, e->x, Hd)) != WSYNC_OK)
            return st;
    }

    for (int64_t l = 0; l < e->L; l++) {
        const wse_layer_t *ly = &e->w.layers[l];

        /* attention */
        rmsnorm(e->xb, e->x, &ly->in_norm, Hd, eps);
        if (e->kv_lora > 0)
            attention_mla(e, ly, l, pos, cs, sn);
        else
            attention_gqa(e, ly, l, pos, cs, sn);
        if (rank == 0)   /* a row-parallel bias is added once, before the all-reduce */
            add_vec(e->xb2, &ly->o_b, Hd);
        if ((st = allreduce(e, e->xb2, Hd)) != WSYNC_OK)
            return st;
        for (int64_t i = 0; i < Hd; i++)
            e->x[i] += e->xb2[i];

        /* MLP: routed (+ shared) experts, or SwiGLU with gate_up = [gate; up] rows of this rank */
        rmsnorm(e->xb, e->x, &ly->post_norm, Hd, eps);
        if (ly->router.w != NULL) {
            mlp_moe(e, ly);
        } else {
            swiglu(e, e->xb2, &ly->gate_up, &ly->gate_up_b, &ly->down, e->Ir);
            if (rank == 0)
                add_vec(e->xb2, &ly->down_b, Hd);
        }
        if ((st = allreduce(e, e->xb2, Hd)) != WSYNC_OK)
            return st;
        for (int64_t i = 0; i < Hd; i++)
            e->x[i] += e->xb2[i];
    }

    rmsnorm(e->xb, e->x, &e->w.norm, Hd, eps);
    matvec(e->logits_local, &e->w.lm_head, e->xb);
    if (e->p.tp_size > 1) {
        st = wse_comm_allgather(e->p.comm, rank, e->logits_local, (size_t)e->Vr * sizeof(float),
                                e->logits);
        if (st != WSYNC_OK)
            return st;
    } else {
        memcpy(e->logits, e->logits_local, (size_t)e->Vr * sizeof(float));
    }
    if (logits != NULL)
        *logits = e->logits;
    return WSYNC_OK;
}

wsync_status_t wsync_engine_forward(wsync_engine_t *e, int32_t token, int pos, const float **logits)
{
    if (e == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_forward: NULL engine");
    return forward_step(e, token, pos, logits);
}

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void wsync_engine_set_token_callback(wsync_engine_t *e, wsync_engine_token_fn fn, void *arg)
{
    if (e == NULL)
        return;
    e->on_token = fn;
    e->on_token_arg = arg;
}

wsync_status_t wsync_engine_generate(wsync_engine_t *e, const int32_t *prompt, int nprompt,
                                     int max_new, int32_t *out, wsync_engine_result_t *res)
{
    const float *logits = NULL;
    double t0 = seconds_now();
    wsync_status_t st;
    uint64_t version;
    int pos = 0, n = 0;

    if (e == NULL || prompt == NULL || (out == NULL && max_new > 0))
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_generate: NULL argument");
    if (nprompt < 1 || max_new < 0)
        return wse_err(WSYNC_ERR_INVALID, "need at least one prompt token and max_new >= 0 "
                       "(got %d and %d)", nprompt, max_new);
    if ((long)nprompt + max_new > e->max_seq + 1L)
        return wse_err(WSYNC_ERR_RANGE, "%d prompt tokens + %d new ones exceed the KV cache of "
                       "%d positions", nprompt, max_new, e->max_seq);
    for (int i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->V)
            return wse_err(WSYNC_ERR_RANGE, "prompt token %d (at %d) is outside the vocabulary "
                           "[0, %lld)", (int)prompt[i], i, (long long)e->V);
    if (e->p.mode == WSYNC_ENGINE_SHADOW && e->rv != NULL && !e->sleeping) {
        int swapped = 0;
        if ((st = wse_shadow_take(e, 0, &swapped)) != WSYNC_OK)
            return st;
    }
    if ((st = ready(e)) != WSYNC_OK)
        return st;
    version = e->sets[e->active].version;

    for (int i = 0; i < nprompt; i++)
        if ((st = forward_step(e, prompt[i], pos++, &logits)) != WSYNC_OK)
            return st;
    while (n < max_new) {
        int32_t tok = argmax(logits, e->V);
        out[n++] = tok;
        if (e->on_token != NULL && e->on_token(e->on_token_arg, n - 1, tok) != 0)
            break;
        if (n == max_new)
            break;
        if ((st = forward_step(e, tok, pos++, &logits)) != WSYNC_OK)
            return st;
    }
    if (res != NULL) {
        res->version = version;
        res->ntokens = n;
        res->logits_hash = XXH3_64bits(logits, (size_t)e->V * sizeof(float));
        res->seconds = seconds_now() - t0;
    }
    return WSYNC_OK;
}

uint64_t wsync_engine_version(const wsync_engine_t *e)
{
    return e != NULL ? e->sets[e->active].version : 0;
}
