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

static wsync_status_t forward_step(wsync_engine_t *e, int32_t token, int pos, const float **logits)
{
    const int64_t Hd = e->Hd, D = e->D, Hr = e->Hr, Kr = e->Kr, Ir = e->Ir, kvd = Kr * D;
    const int64_t group = e->H / e->K, half = D / 2;
    const float eps = (float)e->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)D);
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
        float *q = e->qkv, *k = e->qkv + Hr * D, *v = k + kvd;
        float *kc = e->kcache + ((size_t)l * (size_t)e->max_seq) * (size_t)kvd;
        float *vc = e->vcache + ((size_t)l * (size_t)e->max_seq) * (size_t)kvd;

        /* attention */
        rmsnorm(e->xb, e->x, &ly->in_norm, Hd, eps);
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
            int64_t kvh = (rank * Hr + h) / group - e->kr * Kr;
            const float *qh = q + h * D;
            float *att = e->att + h * e->max_seq, mx = -INFINITY, sum = 0.0f;
            for (int t = 0; t <= pos; t++) {
                const float *kt = kc + (size_t)t * (size_t)kvd + (size_t)(kvh * D);
                float s = 0.0f;
                for (int64_t i = 0; i < D; i++)
                    s += qh[i] * kt[i];
                att[t] = s * scale;
                mx = att[t] > mx ? att[t] : mx;
            }
            for (int t = 0; t <= pos; t++) {
                att[t] = expf(att[t] - mx);
                sum += att[t];
            }
            float *o = e->att_out + h * D;
            memset(o, 0, (size_t)D * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *vt = vc + (size_t)t * (size_t)kvd + (size_t)(kvh * D);
                float a = att[t] / sum;
                for (int64_t i = 0; i < D; i++)
                    o[i] += a * vt[i];
            }
        }
        matvec(e->xb2, &ly->o, e->att_out);
        if (rank == 0)   /* a row-parallel bias is added once, before the all-reduce */
            add_vec(e->xb2, &ly->o_b, Hd);
        if ((st = allreduce(e, e->xb2, Hd)) != WSYNC_OK)
            return st;
        for (int64_t i = 0; i < Hd; i++)
            e->x[i] += e->xb2[i];

        /* SwiGLU MLP: gate_up = [gate; up] rows of this rank */
        rmsnorm(e->xb, e->x, &ly->post_norm, Hd, eps);
        matvec(e->hb, &ly->gate_up, e->xb);
        add_vec(e->hb, &ly->gate_up_b, 2 * Ir);
        for (int64_t i = 0; i < Ir; i++) {
            float g = e->hb[i];
            e->hb2[i] = g / (1.0f + expf(-g)) * e->hb[Ir + i];
        }
        matvec(e->xb2, &ly->down, e->hb2);
        if (rank == 0)
            add_vec(e->xb2, &ly->down_b, Hd);
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
