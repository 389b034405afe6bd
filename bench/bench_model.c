/* wsync-bench's model runs (--model-shape): the params of a real model's shape moved from FSDP-N
 * senders to R replicas of TP-T receivers, in host or CUDA memory, timed, set against the floor
 * the compiled plan implies at link bandwidths measured in the same run, and checked byte for
 * byte on every receiver at the end.
 *
 * The parent makes no CUDA call: it computes the layouts and the plan summary (pure CPU), then
 * forks a probe child (device count, link bandwidths) and the sync's children, each of which
 * picks its GPU before any CUDA or wsync object exists. Results come back through a shared page.
 *
 * Data: element i of param P in version v is a bf16 drawn from a counter-based hash of (P's name,
 * i), except the first STRIPE elements of every param, drawn from (P's name, v, i): so each
 * version differs from the last in every param, senders make a version by rewriting a few bytes,
 * and any process can compute any element of any version without the others. Values are finite,
 * never zero, |x| in [2^-7, 2): what FP8 block quantization sees in real weights. */
#include "bench/bench_model.h"
#include "bench/bench.h"
#include "bench/bench_cuda.h"
#include "core/wire_policy.h"
/* The CPU quantizer is the reference an FP8 receiver's bytes must equal (bit for bit: the CUDA
 * kernels are checked against it); it has no public entry point of its own. */
#include "reshard/fp8.h"
#include "bench/bench_delta.h"
#include "wsync/wsync.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#define STRIPE 256                       /* leading elements of each param that change per version */
#define GEN_CHUNK_ELEMS ((size_t)64 << 20) /* host staging while filling device shards (128 MiB) */
#define PROBE_COPY_BYTES ((size_t)1 << 30)
#define PROBE_BCAST_BYTES ((size_t)4 << 30)
#define ALIGN 256

/* ---------------------------------------------------------------------------------------- */
/* Shapes                                                                                     */
/* ---------------------------------------------------------------------------------------- */


/* The published configs' sizes (config.json of Qwen/Qwen3-0.6B, -8B, -32B, -30B-A3B,
 * -235B-A22B, meta-llama/Llama-3.1-70B and deepseek-ai/DeepSeek-V3), built here rather than read
 * from tools/configs/ so that a run needs no file beside the binary. "tiny" is a small
 * Qwen3-like model whose every TP split up to 4 keeps 128-row FP8 blocks whole, for quick runs
 * and host tests; "tiny-moe" (Qwen3-MoE: 8 experts, top-2) and "tiny-deepseek" (MLA, a dense
 * first layer, 8 routed experts in 2 groups, one shared expert) are the same for the MoE
 * layouts: every TP or EP split up to 2 (tiny-moe: 4) keeps FP8 blocks whole.
 * "qwen3-30b-a3b-2l" is Qwen3-30B-A3B cut to its first 2 layers (3.7 GB): its tensors at their
 * real sizes, small enough for host memory. */
static const model_shape_t shapes[] = {
    {"tiny", WSYNC_MODEL_QWEN3, 256, 2, 4, 2, 128, 512, 1024, 0, 1, 1e6, .experts = 0},
    {"qwen3-0.6b", WSYNC_MODEL_QWEN3, 1024, 28, 16, 8, 128, 3072, 151936, 1, 1, 1e6, .experts = 0},
    {"qwen3-8b", WSYNC_MODEL_QWEN3, 4096, 36, 32, 8, 128, 12288, 151936, 0, 1, 1e6, .experts = 0},
    {"qwen3-32b", WSYNC_MODEL_QWEN3, 5120, 64, 64, 8, 128, 25600, 151936, 0, 1, 1e6, .experts = 0},
    {"llama-70b", WSYNC_MODEL_LLAMA, 8192, 80, 64, 8, 128, 28672, 128256, 0, 0, 5e5, .experts = 0},
    {"tiny-moe", WSYNC_MODEL_QWEN3_MOE, 256, 2, 4, 2, 128, 512, 1024, 0, 1, 1e6,
     .experts = 8, .topk = 2, .moe_inter = 512},
    {"tiny-deepseek", WSYNC_MODEL_DEEPSEEK_V3, 256, 2, 4, 4, 128, 512, 1024, 0, 0, 1e4,
     .experts = 8, .topk = 2, .moe_inter = 256, .shared = 1, .first_dense = 1, .q_lora = 128,
     .kv_lora = 64, .nope = 64, .rope = 64, .v_head = 64},
    {"qwen3-30b-a3b", WSYNC_MODEL_QWEN3_MOE, 2048, 48, 32, 4, 128, 6144, 151936, 0, 1, 1e6,
     .experts = 128, .topk = 8, .moe_inter = 768},
    {"qwen3-30b-a3b-2l", WSYNC_MODEL_QWEN3_MOE, 2048, 2, 32, 4, 128, 6144, 151936, 0, 1, 1e6,
     .experts = 128, .topk = 8, .moe_inter = 768},
    {"qwen3-235b-a22b", WSYNC_MODEL_QWEN3_MOE, 4096, 94, 64, 4, 128, 12288, 151936, 0, 1, 1e6,
     .experts = 128, .topk = 8, .moe_inter = 1536},
    {"deepseek-v3", WSYNC_MODEL_DEEPSEEK_V3, 7168, 61, 128, 128, 192, 18432, 129280, 0, 0, 1e4,
     .experts = 256, .topk = 8, .moe_inter = 2048, .shared = 1, .first_dense = 3,
     .q_lora = 1536, .kv_lora = 512, .nope = 128, .rope = 64, .v_head = 128},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

const char *bench_model_shape_names(void)
{
    return "tiny, qwen3-0.6b, qwen3-8b, qwen3-32b, llama-70b, tiny-moe, tiny-deepseek, "
           "qwen3-30b-a3b, qwen3-30b-a3b-2l, qwen3-235b-a22b, deepseek-v3";
}

const char *bench_model_moe_shape_names(void)
{
    return "tiny-moe, tiny-deepseek, qwen3-30b-a3b, qwen3-30b-a3b-2l, qwen3-235b-a22b, "
           "deepseek-v3";
}

static const model_shape_t *find_shape(const char *name)
{
    for (size_t i = 0; i < NSHAPES; i++)
        if (strcmp(shapes[i].name, name) == 0)
            return &shapes[i];
    return NULL;
}

int bench_model_shape_known(const char *name) { return find_shape(name) != NULL; }

int bench_model_shape_is_moe(const char *name)
{
    const model_shape_t *s = find_shape(name);
    return s != NULL && s->experts > 0;
}

/* The config a HF config.json of the shape's family gives, with transformers' defaults for
 * what the shape does not set (Qwen3MoeConfig, DeepseekV3Config). */
static wsync_model_config_t config_of(const model_shape_t *s)
{
    wsync_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.model_type = s->type;
    c.hidden_size = s->hidden;
    c.num_hidden_layers = s->layers;
    c.num_attention_heads = s->heads;
    c.num_key_value_heads = s->kv_heads;
    c.head_dim = s->head_dim;
    c.intermediate_size = s->inter;
    c.vocab_size = s->vocab;
    c.max_position_embeddings = 40960;
    c.tie_word_embeddings = s->tie;
    c.qk_norm = s->qk_norm;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = s->theta;
    c.dtype = WSYNC_DTYPE_BF16;
    if (s->experts == 0)
        return c;
    c.num_experts = s->experts;
    c.num_experts_per_tok = s->topk;
    c.moe_intermediate_size = s->moe_inter;
    c.norm_topk_prob = 1;
    if (s->type == WSYNC_MODEL_QWEN3_MOE) {
        c.decoder_sparse_step = 1; /* every layer MoE, mlp_only_layers [] */
        c.scoring_func = WSYNC_ROUTER_SOFTMAX;
        c.topk_method = WSYNC_TOPK_GREEDY;
        return c;
    }
    /* deepseek_v3: sigmoid router with the correction bias, grouped top-k, MLA */
    c.max_position_embeddings = 163840;
    c.n_shared_experts = s->shared;
    c.first_k_dense_replace = s->first_dense;
    c.moe_layer_freq = 1;
    c.n_group = s->experts >= 64 ? 8 : 2;
    c.topk_group = s->experts >= 64 ? 4 : 1;
    c.routed_scaling_factor = 2.5;
    c.scoring_func = WSYNC_ROUTER_SIGMOID;
    c.topk_method = WSYNC_TOPK_NOAUX_TC;
    c.router_bias = 1;
    c.q_lora_rank = s->q_lora;
    c.kv_lora_rank = s->kv_lora;
    c.qk_nope_head_dim = s->nope;
    c.qk_rope_head_dim = s->rope;
    c.v_head_dim = s->v_head;
    c.rope_interleave = 1;
    return c;
}

/* ---------------------------------------------------------------------------------------- */
/* Data: counter-based bf16 values, computed in parallel                                     */
/* ---------------------------------------------------------------------------------------- */

static int g_threads = 1; /* generator threads of this process */

/* Sign, exponent 120..127, 7 random mantissa bits: never zero, never non-finite. */
static inline uint16_t bf16_of(uint16_t v)
{
    return (uint16_t)((v & 0x8000u) | ((120u + ((v >> 7) & 7u)) << 7) | (v & 0x7Fu));
}

static uint64_t seed_of(const char *name, uint64_t version)
{
    return XXH3_64bits_withSeed(name, strlen(name), 0x5EEDull + version);
}

/* Elements [start, start + n) of one stream. */
static void gen_stream(uint64_t seed, uint64_t start, uint64_t n, uint16_t *out)
{
    uint64_t i = start, end = start + n;
    while (i < end) {
        uint64_t h = bench_mix64(seed + (i >> 2) * 0xD1B54A32D192ED03ull);
        for (unsigned k = (unsigned)(i & 3); k < 4 && i < end; k++, i++)
            *out++ = bf16_of((uint16_t)(h >> (16 * k)));
    }
}

/* Elements [start, start + n) (linear, row-major) of param `name` in version `version`. */
static void gen_param(const char *name, uint64_t version, uint64_t start, uint64_t n,
                      uint16_t *out)
{
    if (start < STRIPE && n > 0) {
        uint64_t m = STRIPE - start < n ? STRIPE - start : n;
        gen_stream(seed_of(name, version), start, m, out);
        start += m;
        out += m;
        n -= m;
    }
    if (n > 0)
        gen_stream(seed_of(name, 0), start, n, out);
}

/* An f32 param's values (bench_param_esz 4) are the generator's bf16 widened, exactly. */
size_t bench_param_esz(const wsync_param_t *p) { return p->dtype == WSYNC_DTYPE_F32 ? 4 : 2; }

/* bf16 values [0, n) at in, widened to f32 at out; in may be the upper half of out's own
 * n * 4 bytes (in == (uint16_t *)out + n): element i is read before bytes of later ones are
 * written, since 4 i + 3 < 2 n + 2 (i + 1) for i < n. */
static void widen_bf16(const uint16_t *in, uint32_t *out, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)in[i] << 16;
        out[i] = u;
    }
}

/* Elements [start, start + n) of param p in version v, in p's dtype (bf16 or f32), at out. */
static void gen_param_as(const wsync_param_t *p, uint64_t version, uint64_t start, uint64_t n,
                         void *out)
{
    if (bench_param_esz(p) == 2) {
        gen_param(p->name, version, start, n, out);
        return;
    }
    uint16_t *half = (uint16_t *)out + n;
    gen_param(p->name, version, start, n, half);
    widen_bf16(half, out, n);
}

typedef bench_range_fn range_fn;

typedef struct {
    range_fn fn;
    void *ctx;
    uint64_t lo, hi;
} par_job_t;

static void *par_thread(void *p)
{
    par_job_t *j = p;
    j->fn(j->ctx, j->lo, j->hi);
    return NULL;
}

/* fn over [0, n) split into g_threads parts (fewer when n / grain is small). */
static void par_for(uint64_t n, uint64_t grain, range_fn fn, void *ctx)
{
    int nt = g_threads;
    if (grain == 0)
        grain = 1;
    if ((uint64_t)nt > n / grain)
        nt = (int)(n / grain);
    if (nt <= 1) {
        if (n > 0)
            fn(ctx, 0, n);
        return;
    }
    pthread_t tid[64];
    par_job_t job[64];
    if (nt > 64)
        nt = 64;
    for (int t = 0; t < nt; t++) {
        job[t] = (par_job_t){fn, ctx, n * (uint64_t)t / (uint64_t)nt,
                             n * (uint64_t)(t + 1) / (uint64_t)nt};
        if (t > 0 && pthread_create(&tid[t], NULL, par_thread, &job[t]) != 0)
            job[t].fn = NULL; /* could not start: run it here */
    }
    fn(ctx, job[0].lo, job[0].hi);
    for (int t = 1; t < nt; t++) {
        if (job[t].fn)
            pthread_join(tid[t], NULL);
        else
            fn(ctx, job[t].lo, job[t].hi);
    }
}

void bench_par_for(uint64_t n, uint64_t grain, bench_range_fn fn, void *ctx)
{
    par_for(n, grain, fn, ctx);
}

typedef struct {
    const char *name;
    uint64_t version, start;
    uint16_t *out;
} gen_job_t;

static void gen_range(void *p, uint64_t lo, uint64_t hi)
{
    gen_job_t *g = p;
    gen_param(g->name, g->version, g->start + lo, hi - lo, g->out + lo);
}

static void gen_param_mt(const wsync_param_t *p, uint64_t version, uint64_t start, uint64_t n,
                         void *out)
{
    if (bench_param_esz(p) != 2) { /* only small params are f32 */
        gen_param_as(p, version, start, n, out);
        return;
    }
    gen_job_t g = {p->name, version, start, out};
    par_for(n, 1 << 20, gen_range, &g);
}

/* ---------------------------------------------------------------------------------------- */
/* The run: layouts, placement, shared page                                                  */
/* ---------------------------------------------------------------------------------------- */


/* GPU of sender i and receiver j for `ngpu` GPUs (see --help). */
static void place(model_t *m, int ngpu)
{
    m->ngpu = ngpu;
    for (int i = 0; i < m->N; i++)
        m->gpu_s[i] = m->o->colocated ? i % ngpu : i;
    for (int j = 0; j < m->NR; j++)
        m->gpu_r[j] = m->o->colocated ? j % ngpu : m->N + j;
}

static int gpus_needed(const model_t *m)
{
    return m->o->colocated ? 1 : m->N + m->NR;
}

static size_t align_up(size_t v) { return (v + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

uint64_t bench_box_elems(const wsync_param_t *p, const wsync_box_t *b)
{
    uint64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= (uint64_t)b->len[d];
    return n;
}

uint64_t bench_row_elems(const wsync_param_t *p)
{
    uint64_t n = 1;
    for (int d = 1; d < p->ndim; d++)
        n *= (uint64_t)p->shape[d];
    return n;
}

/* What the run is, for messages: "qwen3-30b-a3b FSDP-2 -> 1 replica x EP-2". */
void bench_model_run_words(const model_t *m, char *buf, size_t len)
{
    snprintf(buf, len, "%s FSDP-%d -> %d replica%s x %s-%d%s", m->shape->name, m->N, m->R,
             m->R == 1 ? "" : "s", m->o->ep > 1 ? "EP" : "TP", m->T,
             m->o->colocated ? " colocated" : "");
}

/* Host memory this machine could give now (MemAvailable), 0 when unknown. */
static uint64_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* --mem host: every sender's shards and every receiver's targets live in this machine's
 * memory at once; refuse (0 or -1, reported) before any is allocated when they cannot. */
static int host_fits(const model_t *m)
{
    uint64_t s = 0, r = 0, avail = host_available(), d = 0;
    for (int i = 0; i < m->N; i++)
        s += m->sender_bytes[i];
    for (int j = 0; j < m->NR; j++)
        r += m->receiver_bytes[j];
    if (m->o->delta) {
        /* fp32 masters on both sides (receivers: of their targets' elements), the senders'
         * previous weights (host) or host image of their weights (CUDA), and the store's
         * snapshots */
        d = m->shard_elems * 4 + s;
        for (int j = 0; j < m->NR; j++)
            d += m->receiver_bytes[j] * 2;
        if (m->o->store) /* its snapshots: keep_versions (2) copies of the shards */
            d += 2 * s;
        if (m->o->mem_cuda)
            s = r = 0; /* on the GPUs */
    }
    if (avail == 0 || s + r + d <= avail)
        return 0;
    char what[160];
    bench_model_run_words(m, what, sizeof(what));
    fprintf(stderr,
            PROG ": %s does not fit in host memory: it needs %.2f GB (senders' shards %.2f GB, "
                 "receivers' targets %.2f GB, --delta's masters and copies %.2f GB), %.2f GB "
                 "available (MemAvailable); use fewer replicas, a smaller shape or --mem cuda\n",
            what, (double)(s + r + d) / 1e9, (double)s / 1e9, (double)r / 1e9, (double)d / 1e9,
            (double)avail / 1e9);
    return -1;
}

/* --fused-experts: sender `rank` holds FSDP dim-0 shards of the params as transformers 5.x
 * holds them (mlp.experts.gate_up_proj [E, 2I, Hd] and down_proj [E, Hd, I]: dim 0 is the
 * experts, so a rank holds whole experts), each described to wsync as the per-expert checkpoint
 * params it holds (wsync_layout_unfuse_experts). Data pointers stay NULL here: the sender gives
 * every shard its own slot, which moves the same bytes as one fused buffer would. */
static int fused_expert_shards(model_t *m, int rank)
{
    wsync_param_t *fp = NULL;
    wsync_shard_t *fs = NULL, *out = NULL;
    size_t nf = 0, nfs = 0, n = 0, cap = 0;
    wsync_status_t st;
    int rc = 1;
    if ((st = wsync_model_fused_params(&m->cfg, WSYNC_DTYPE_BF16, &fp, &nf)) != WSYNC_OK)
        return bench_wsync_failed("parent", "wsync_model_fused_params", st);
    if ((st = wsync_layout_shards(fp, nf, 0, rank, m->N, &fs, &nfs)) != WSYNC_OK) {
        rc = bench_wsync_failed("parent", "wsync_layout_shards (fused experts)", st);
        goto out;
    }
    for (size_t k = 0; k < nfs; k++) {
        wsync_shard_t *u = NULL;
        size_t nu = 0;
        if ((st = wsync_layout_unfuse_experts(&fs[k], &u, &nu)) != WSYNC_OK) {
            rc = bench_wsync_failed("parent", "wsync_layout_unfuse_experts", st);
            goto out;
        }
        if (n + nu > cap) {
            size_t c = (n + nu) * 2;
            wsync_shard_t *g = realloc(out, c * sizeof(*out));
            if (!g) {
                wsync_layout_shards_free(u, nu);
                fprintf(stderr, PROG ": out of memory\n");
                goto out;
            }
            out = g;
            cap = c;
        }
        /* the names move into out (freed by wsync_layout_shards_free); the array goes */
        memcpy(out + n, u, nu * sizeof(*u));
        n += nu;
        free(u);
    }
    m->shards[rank] = out;
    m->nshards[rank] = n;
    out = NULL;
    n = 0;
    rc = 0;
out:
    wsync_layout_shards_free(out, n);
    wsync_layout_shards_free(fs, nfs);
    wsync_model_params_free(fp, nf);
    return rc;
}

static int model_build(model_t *m)
{
    const bench_opts_t *o = m->o;
    wsync_status_t st;
    m->cfg = config_of(m->shape);
    if ((st = wsync_model_config_check(&m->cfg)) != WSYNC_OK)
        return bench_wsync_failed("parent", "wsync_model_config_check", st);
    m->N = o->senders;
    m->T = o->tp;
    m->R = o->replicas;
    m->NR = m->T * m->R;
    for (int i = 0; i < m->N; i++) {
        if (o->fused_experts) {
            if (fused_expert_shards(m, i) != 0)
                return 1;
            continue;
        }
        st = wsync_layout_fsdp_shards(&m->cfg, WSYNC_DTYPE_BF16, i, m->N, &m->shards[i],
                                      &m->nshards[i]);
        if (st != WSYNC_OK)
            return bench_wsync_failed("parent", "wsync_layout_fsdp_shards", st);
    }
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    opt.param_dtype = WSYNC_DTYPE_BF16;
    if (o->quant_fp8) {
        opt.quant.scheme = WSYNC_QUANT_BLOCK;
        opt.quant.block_rows = opt.quant.block_cols = 128;
        opt.quant_dtype = WSYNC_DTYPE_F8E4M3FN;
    }
    for (int j = 0; j < m->NR; j++) {
        if (o->ep > 1) { /* whole experts over the replica's TP ranks */
            opt.ep_size = m->T;
            opt.ep_rank = j % m->T;
        }
        st = wsync_layout_tp_targets(&m->cfg, j % m->T, m->T, &opt, &m->targets[j],
                                     &m->ntargets[j]);
        if (st != WSYNC_OK)
            return bench_wsync_failed("parent", "wsync_layout_tp_targets", st);
    }
    {
        /* every checkpoint param once (with --fused-experts a rank lists only its experts) */
        wsync_param_t *ps = NULL;
        size_t np = 0;
        if ((st = wsync_model_params(&m->cfg, WSYNC_DTYPE_BF16, &ps, &np)) != WSYNC_OK)
            return bench_wsync_failed("parent", "wsync_model_params", st);
        for (size_t k = 0; k < np; k++) {
            uint64_t e = 1;
            for (int d = 0; d < ps[k].ndim; d++)
                e *= (uint64_t)ps[k].shape[d];
            m->param_elems += e;
            m->param_bytes += e * bench_param_esz(&ps[k]);
        }
        m->param_count = np;
        wsync_model_params_free(ps, np);
    }
    for (int i = 0; i < m->N; i++)
        for (size_t k = 0; k < m->nshards[i]; k++) {
            const wsync_shard_t *s = &m->shards[i][k];
            uint64_t e = bench_box_elems(&s->param, &s->box);
            m->sender_bytes[i] += align_up(e * bench_param_esz(&s->param));
            m->shard_elems += e;
        }
    for (int j = 0; j < m->NR; j++)
        for (size_t k = 0; k < m->ntargets[j]; k++) {
            const wsync_target_t *t = &m->targets[j][k];
            m->receiver_bytes[j] += align_up(wsync_target_bytes(t));
            if (t->quant.scheme != WSYNC_QUANT_NONE)
                m->receiver_bytes[j] += align_up(wsync_target_scale_count(t) * sizeof(float));
        }
    if ((!o->mem_cuda || o->delta) && host_fits(m) != 0)
        return 2;

    /* the plan, as the coordinator will compile it */
    size_t ns = 0, nt = 0;
    for (int i = 0; i < m->N; i++)
        ns += m->nshards[i];
    for (int j = 0; j < m->NR; j++)
        nt += m->ntargets[j];
    wsync_shard_t *all_s = calloc(ns, sizeof(*all_s));
    wsync_target_t *all_t = calloc(nt, sizeof(*all_t));
    int *rank_s = calloc(ns, sizeof(int)), *rank_t = calloc(nt, sizeof(int));
    if (!all_s || !all_t || !rank_s || !rank_t) {
        free(all_s);
        free(all_t);
        free(rank_s);
        free(rank_t);
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    ns = nt = 0;
    for (int i = 0; i < m->N; i++)
        for (size_t k = 0; k < m->nshards[i]; k++) {
            all_s[ns] = m->shards[i][k];
            rank_s[ns++] = i;
        }
    for (int j = 0; j < m->NR; j++)
        for (size_t k = 0; k < m->ntargets[j]; k++) {
            all_t[nt] = m->targets[j][k];
            rank_t[nt++] = j;
        }
    st = wsync_plan_summarize(all_s, rank_s, ns, all_t, rank_t, nt, m->N, m->NR,
                              o->have_bucket ? (size_t)o->bucket_bytes : 0, &m->sum);
    /* the plan an ipc or nccl group compiles with FP8 on the wire (core/coordinator.c's
     * wire_wanted): the report counts it when the scheme resolves to one of those */
    if (st == WSYNC_OK && o->fp8_wire && o->quant_fp8 && !o->store && !o->delta)
        st = wsync_plan_summarize_wire(all_s, rank_s, ns, all_t, rank_t, nt, m->N, m->NR,
                                       o->have_bucket ? (size_t)o->bucket_bytes : 0, 1,
                                       &m->sum_wire);
    free(all_s);
    free(all_t);
    free(rank_s);
    free(rank_t);
    if (st != WSYNC_OK)
        return bench_wsync_failed("parent", "wsync_plan_summarize", st);
    return 0;
}

static void model_free(model_t *m)
{
    for (int i = 0; i < m->N; i++)
        wsync_layout_shards_free(m->shards[i], m->nshards[i]);
    for (int j = 0; j < m->NR; j++)
        wsync_layout_targets_free(m->targets[j], m->ntargets[j]);
    wsync_plan_summary_free(m->sum);
    wsync_plan_summary_free(m->sum_wire);
}

/* The plan the group moved: FP8 on the wire where it was asked for and the scheme the group
 * chose sends it (ipc, nccl; ipc not when colocated on fewer than 4 GPUs or saving too little:
 * the explanation says so), else every chunk plain. */
const wsync_plan_summary_t *bench_model_moved(const model_t *m)
{
    if (m->sum_wire != NULL && m->sh != NULL && !m->sh->wire_off &&
        (strcmp(m->sh->scheme, "ipc") == 0 || strcmp(m->sh->scheme, "nccl") == 0))
        return m->sum_wire;
    return m->sum;
}

/* ---------------------------------------------------------------------------------------- */
/* Probe child                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Per process beside its buffers: a CUDA context and, for schemes that stage, two buckets. */
#define CUDA_CONTEXT_BYTES ((uint64_t)600 << 20)

/* --delta on the GPU, per sender: the scheme's baselines of its shards (device memory by
 * default), the previous weights the codec's figures keep for the last version, and the codec's
 * scratch (a copy and encode buffers of one 256 MiB batch) */
#define DELTA_CODEC_SCRATCH ((uint64_t)640 << 20)

/* --mem cuda: each GPU must hold its senders' shards, its receivers' targets and scales, and
 * per process a context and two buckets (and --delta's copies); refuse (-1, reported, naming the
 * GPU and the bytes) before any sync process starts when one cannot. */
static int gpus_fit(const model_t *m)
{
    int bad = 0;
    for (int g = 0; g < m->ngpu; g++) {
        uint64_t s = 0, r = 0, d = 0;
        int procs = 0;
        for (int i = 0; i < m->N; i++)
            if (m->gpu_s[i] == g) {
                s += m->sender_bytes[i];
                if (m->o->delta)
                    d += 2 * m->sender_bytes[i] + DELTA_CODEC_SCRATCH;
                procs++;
            }
        for (int j = 0; j < m->NR; j++)
            if (m->gpu_r[j] == g) {
                r += m->receiver_bytes[j];
                procs++;
            }
        if (procs == 0)
            continue;
        /* a colocated group may take FP8 on the wire, in the coordinator's larger buckets
         * (core/wire_policy.h) */
        uint64_t bucket = m->o->bucket_bytes;
        if (m->o->colocated && m->o->quant_fp8 && m->o->fp8_wire != 0)
            bucket = wsync_ipc_wire_bucket(1, m->ngpu, bucket);
        uint64_t extra = (uint64_t)procs * (CUDA_CONTEXT_BYTES + 2 * bucket);
        size_t fr = 0, tot = 0;
        if (bcuda_mem_info(g, &fr, &tot) != 0)
            return -1;
        if (s + r + d + extra <= fr)
            continue;
        char what[160];
        bench_model_run_words(m, what, sizeof(what));
        fprintf(stderr,
                PROG ": %s does not fit on GPU %d: it needs %.2f GB (senders' shards %.2f GB, "
                     "receivers' targets %.2f GB, --delta's baselines, previous weights and "
                     "codec scratch %.2f GB, %d process%s x (context + 2 buckets) %.2f GB), "
                     "%.2f GB free of %.2f GB\n",
                what, g, (double)(s + r + d + extra) / 1e9, (double)s / 1e9, (double)r / 1e9,
                (double)d / 1e9, procs, procs == 1 ? "" : "es", (double)extra / 1e9,
                (double)fr / 1e9, (double)tot / 1e9);
        bad = 1;
    }
    if (bad)
        fprintf(stderr, PROG ": use more senders or receivers (more GPUs), a smaller shape or "
                        "fewer replicas\n");
    return bad ? -1 : 0;
}

static int probe_body(int i, int res_fd, void *arg)
{
    model_t *m = arg;
    model_shared_t *sh = m->sh;
    (void)i;
    close(res_fd);
    int ngpu = 0;
    if (bcuda_device_count(&ngpu) != 0)
        return 1;
    if (ngpu < 1) {
        fprintf(stderr, PROG ": no CUDA device visible\n");
        return 1;
    }
    if (ngpu > MODEL_MAX_GPUS)
        ngpu = MODEL_MAX_GPUS;
    sh->ngpu = ngpu;
    if (gpus_needed(m) > ngpu) {
        fprintf(stderr,
                PROG ": %d sender%s and %d receivers on their own GPUs need %d GPUs; %d visible "
                     "(use --colocated to share them)\n",
                m->N, m->N == 1 ? "" : "s", m->NR, gpus_needed(m), ngpu);
        return 1;
    }
    bcuda_device_name(0, sh->gpu_name, sizeof(sh->gpu_name));
    place(m, ngpu);
    if (gpus_fit(m) != 0) {
        sh->refused = 1;
        return 1;
    }

    bench_probe_req_t *q = &sh->probe_req;
    memset(q, 0, sizeof(*q));
    int used[MODEL_MAX_GPUS] = {0};
    for (int s = 0; s < m->N; s++)
        used[m->gpu_s[s]] = 1;
    for (int r = 0; r < m->NR; r++)
        used[m->gpu_r[r]] = 1;
    for (int g = 0; g < ngpu; g++)
        if (used[g])
            q->gpus[q->ngpus++] = g;
    int seen[MODEL_MAX_GPUS][MODEL_MAX_GPUS] = {{0}};
    for (int s = 0; s < m->N; s++)
        for (int r = 0; r < m->NR; r++) {
            int a = m->gpu_s[s], b = m->gpu_r[r];
            if (a == b || seen[a][b] || m->sum->pair_bytes[s * m->NR + r] == 0)
                continue;
            seen[a][b] = 1;
            q->pair_src[q->npairs] = a;
            q->pair_dst[q->npairs++] = b;
        }
    q->bcast_root = m->gpu_s[0];
    q->copy_bytes = PROBE_COPY_BYTES;
    q->bcast_bytes = PROBE_BCAST_BYTES;
    return bcuda_probe(q, &sh->probe) == 0 ? 0 : 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Senders                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Writes the STRIPE leading elements of version v wherever shard k holds them. Shards are
 * FSDP dim-0 boxes: their elements are one contiguous linear range of the param. */
static int write_stripes(const model_t *m, int rank, void *const *data, uint64_t v)
{
    const wsync_shard_t *sh = m->shards[rank];
    uint32_t buf[STRIPE]; /* room for f32 */
    for (size_t k = 0; k < m->nshards[rank]; k++) {
        uint64_t n = bench_box_elems(&sh[k].param, &sh[k].box);
        uint64_t lo = (uint64_t)sh[k].box.start[0] * bench_row_elems(&sh[k].param);
        if (n == 0 || lo >= STRIPE)
            continue;
        uint64_t cnt = STRIPE - lo < n ? STRIPE - lo : n;
        size_t esz = bench_param_esz(&sh[k].param);
        gen_param_as(&sh[k].param, v, lo, cnt, buf);
        if (m->o->mem_cuda) {
            if (bcuda_h2d(data[k], buf, cnt * esz) != 0)
                return -1;
        } else {
            memcpy(data[k], buf, cnt * esz);
        }
    }
    return 0;
}

/* Shards below this are made many at a time, one per thread. */
#define SMALL_SHARD_BYTES ((uint64_t)4 << 20)

typedef struct {
    const wsync_shard_t *shards;  /* a run of consecutive shards */
    const size_t *off;            /* their offsets in the sender's block */
    char *base;                   /* where offset `base_off` lands (the block or a host mirror) */
    size_t base_off;
} fill_job_t;

/* shards [lo, hi) of the run: version 1's elements of each, in place */
static void fill_shards(void *arg, uint64_t lo, uint64_t hi)
{
    fill_job_t *f = arg;
    for (uint64_t i = lo; i < hi; i++) {
        const wsync_shard_t *s = &f->shards[i];
        uint64_t cnt = bench_box_elems(&s->param, &s->box);
        uint64_t first = (uint64_t)s->box.start[0] * bench_row_elems(&s->param);
        if (cnt > 0)
            gen_param_as(&s->param, 1, first, cnt, f->base + (f->off[i] - f->base_off));
    }
}

/* The parameters of sender `rank` for the options chosen. */
static wsync_sender_params_t sender_params(const model_t *m, int rank)
{
    const bench_opts_t *o = m->o;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;

    sp.coordinator = m->coordinator;
    sp.rank = rank;
    sp.nranks = m->N;
    sp.nreceivers = m->NR;
    sp.scheme = o->scheme;
    if (o->have_bucket)
        sp.bucket_bytes = (size_t)o->bucket_bytes;
    if (o->store) {
        sp.snapshot = 1;
        sp.keep_versions = 2;
    }
    sp.delta = m->delta_param ? m->delta_param : "off"; /* full versions unless --delta */
    sp.fp8_wire = o->fp8_wire;                          /* rank 0's decides (the coordinator) */
    return sp;
}

/* Version 1 of the sender's n shards, in its block at offsets off (bytes in all); data[k] is
 * where shard k lies. Host shards are made in place; GPU shards through the host buffer chunk
 * (GEN_CHUNK_ELEMS * 4 bytes), one copy per chunk. Returns 0 or -1 (a copy failed). */
static int make_shards(const model_t *m, int rank, const size_t *off, size_t bytes, char *block,
                       uint16_t *chunk, void **data)
{
    size_t n = m->nshards[rank];

    for (size_t k = 0; k < n;) {
        const wsync_shard_t *s = &m->shards[rank][k];
        uint64_t cnt = bench_box_elems(&s->param, &s->box);
        uint64_t lo = (uint64_t)s->box.start[0] * bench_row_elems(&s->param);
        size_t esz = bench_param_esz(&s->param);
        data[k] = block + off[k];
        if (cnt * esz < SMALL_SHARD_BYTES) {
            /* a run of small shards (a MoE model's thousands of expert tensors): one thread per
             * shard rather than per slice of one, then one copy to the GPU */
            size_t k2 = k + 1;
            while (k2 < n) {
                const wsync_shard_t *s2 = &m->shards[rank][k2];
                uint64_t b2 = bench_box_elems(&s2->param, &s2->box) * bench_param_esz(&s2->param);
                if (off[k2] - off[k] + align_up(b2) > GEN_CHUNK_ELEMS * 4 ||
                    b2 >= SMALL_SHARD_BYTES)
                    break;
                k2++;
            }
            size_t span = (k2 < n ? off[k2] : bytes) - off[k];
            fill_job_t fj = {m->shards[rank] + k, off + k, m->o->mem_cuda ? (char *)chunk : block,
                             m->o->mem_cuda ? off[k] : 0};
            par_for(k2 - k, 1, fill_shards, &fj);
            for (size_t i = k; i < k2; i++)
                data[i] = block + off[i];
            if (m->o->mem_cuda && bcuda_h2d(block + off[k], chunk, span) != 0)
                return -1;
            k = k2;
            continue;
        }
        k++;
        if (!m->o->mem_cuda) {
            gen_param_mt(&s->param, 1, lo, cnt, data[k - 1]);
            continue;
        }
        for (uint64_t done = 0; done < cnt;) {
            uint64_t c = cnt - done < GEN_CHUNK_ELEMS ? cnt - done : GEN_CHUNK_ELEMS;
            gen_param_mt(&s->param, 1, lo + done, c, chunk);
            if (bcuda_h2d((char *)data[k - 1] + done * esz, chunk, c * esz) != 0)
                return -1;
            done += c;
        }
    }
    return 0;
}

/* Hand the sender its shards, each at data[k]. Returns 0, or 1 once the failure is told. */
static int add_shards(const model_t *m, int rank, wsync_sender_t *sender, void *const *data,
                      const char *who)
{
    size_t n = m->nshards[rank];
    wsync_status_t st;

    for (size_t k = 0; k < n; k++) {
        wsync_shard_t s = m->shards[rank][k];
        s.data = data[k];
        s.mem = m->o->mem_cuda ? WSYNC_MEM_CUDA : WSYNC_MEM_HOST;
        s.device = m->o->mem_cuda ? m->gpu_s[rank] : 0;
        if ((st = wsync_sender_add_shard(sender, &s)) != WSYNC_OK)
            return bench_wsync_failed(who, "wsync_sender_add_shard", st);
    }
    return 0;
}

/* The block that holds sender `rank`'s shards, `bytes` of them: CUDA memory on its GPU, or host
 * memory from ctx (registered for the transports). 0, or 1 with the error printed. */
static int alloc_shard_block(const model_t *m, wsync_ctx_t *ctx, const char *who, size_t bytes,
                             char **block)
{
    const bench_opts_t *o = m->o;

    if (o->mem_cuda) {
        /* rounded up to 2 MiB as a caching allocator's segments are (PyTorch's): a colocated
         * receiver reads an odd-sized allocation up to a quarter slower (transports/cuda_ipc.c
         * warn_odd_size); WSYNC_BENCH_ALLOC_ROUND=N rounds to N bytes instead, 1 not at all */
        const char *ar = getenv("WSYNC_BENCH_ALLOC_ROUND");
        char *end = NULL;
        unsigned long long round = (unsigned long long)2 << 20;
        if (ar != NULL) {
            errno = 0;
            round = strtoull(ar, &end, 10);
            if (errno != 0 || end == ar || *end != '\0' || ar[0] == '-' || round == 0 ||
                round > ((unsigned long long)1 << 40)) {
                fprintf(stderr, PROG ": %s: WSYNC_BENCH_ALLOC_ROUND='%s': expected a number of "
                        "bytes in [1, 2^40] to round the shards' allocation up to (1: exact)\n",
                        who, ar);
                return 1;
            }
        }
        if (bcuda_malloc((void **)block, (bytes + round - 1) / round * round) != 0)
            return 1;
    } else if (wsync_mem_alloc(ctx, bytes ? bytes : ALIGN, (void **)block) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s: wsync_mem_alloc(%zu) failed: %s\n", who, bytes,
                wsync_last_error());
        return 1;
    }
    return 0;
}

/* Versions 1 .. warm-up + iters pushed by sender `rank`, each made first (--delta: the
 * masters stepped and the codec timed) and started with every sender's, the times and push stats
 * into m->sh. 0, or 1 (or a wsync status' exit code) with the error printed. */
static int push_versions(model_t *m, int rank, wsync_sender_t *sender, bench_delta_tx_t *dtx,
                         char *block, void **data, const char *who)
{
    const bench_opts_t *o = m->o;
    model_shared_t *shp = m->sh;
    const int total = o->warmup + o->iters;
    wsync_status_t st;

    for (int v = 1; v <= total; v++) {
        if (o->delta && v > 1) {
            /* every receiver checked v - 1 (so no fetch of it is still timed): step, outside
             * the timed region, then the codec's figures on what the step made */
            bench_wait_at_least(&shp->d.checked[v - 1], m->NR);
            double a = bench_now_s();
            uint64_t ch = bench_delta_tx_step(dtx, block, (uint64_t)v);
            if (ch == UINT64_MAX)
                return 1;
            shp->d.changed[v - 1][rank] = ch;
            shp->d.update_s[v - 1][rank] = bench_now_s() - a;
            if (bench_delta_tx_codec(dtx, block, rank, (uint64_t)v, &shp->d) != 0)
                return 1;
        } else if (v > 1 && write_stripes(m, rank, data, (uint64_t)v) != 0) {
            return 1;
        }
        if (o->store && v > 1) /* no snapshot copy overlaps a timed fetch */
            bench_wait_at_least(&shp->fetched[v - 1], m->NR);
        bench_count_up(&shp->arrived[v]);
        bench_wait_at_least(&shp->arrived[v], m->N);
        double dt;
        if (bench_push(who, sender, v, &dt) != 0)
            return 1;
        shp->push_s[v - 1][rank] = dt;
        if (o->delta) {
            wsync_push_stats_t ps;
            if ((st = wsync_sender_stats(sender, &ps)) != WSYNC_OK)
                return bench_wsync_failed(who, "wsync_sender_stats", st);
            shp->d.wire[v - 1][rank] = ps.bytes_wire;
            shp->d.encoded[v - 1][rank] = ps.bytes_encoded;
            shp->d.plain[v - 1][rank] = ps.bytes_plain;
            shp->d.base[v - 1][rank] = ps.base_version;
        }
        bench_count_up(&shp->pushed[v]);
        if (rank == 0)
            fprintf(stderr, PROG ": push %d/%d %s %.4f s (sender 0)\n", v, total,
                    v > o->warmup ? "timed " : "warmup", dt);
    }
    return 0;
}

static int run_sender(model_t *m, int rank)
{
    const bench_opts_t *o = m->o;
    model_shared_t *shp = m->sh;
    char who[32];
    snprintf(who, sizeof(who), "sender %d", rank);
    int rc = 1;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *sender = NULL;
    wsync_status_t st;
    size_t n = m->nshards[rank], bytes = 0;
    size_t *off = calloc(n ? n : 1, sizeof(size_t));
    void **data = calloc(n ? n : 1, sizeof(void *));
    uint16_t *chunk = NULL;
    char *block = NULL;
    bench_delta_tx_t *dtx = NULL; /* --delta: the shards' masters */
    if (!off || !data)
        goto oom;
    for (size_t k = 0; k < n; k++) {
        off[k] = bytes;
        bytes += align_up(bench_box_elems(&m->shards[rank][k].param, &m->shards[rank][k].box) *
                          bench_param_esz(&m->shards[rank][k].param));
    }
    if (o->delta && bench_delta_tx_create(o, m->shards[rank], n, off, bytes, &dtx) != 0)
        goto oom;
    if (o->store)
        setenv("WSYNC_STORE_TRANSPORT", o->transport, 1);
    if (o->mem_cuda && bcuda_set_device(m->gpu_s[rank]) != 0)
        goto out;
    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    if (alloc_shard_block(m, ctx, who, bytes, &block) != 0)
        goto out;

    /* the coordinator listens first, so that the others connect while weights are made */
    wsync_sender_params_t sp = sender_params(m, rank);
    if ((st = wsync_sender_create(ctx, &sp, &sender)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_sender_create", st);
        goto out;
    }

    double t0 = bench_now_s();
    if (o->mem_cuda && !(chunk = malloc(GEN_CHUNK_ELEMS * 4)))
        goto oom;
    if (o->delta) {
        for (size_t k = 0; k < n; k++)
            data[k] = block + off[k];
        if (bench_delta_tx_step(dtx, block, 1) == UINT64_MAX)
            goto out;
    } else if (make_shards(m, rank, off, bytes, block, chunk, data) != 0) {
        goto out;
    }
    shp->fill_s[rank] = bench_now_s() - t0;
    fprintf(stderr, PROG ": %s: %zu shards, %.3f GB %s on %s %d, made in %.1f s\n", who, n,
            (double)bytes / 1e9, "bf16", o->mem_cuda ? "GPU" : "host", o->mem_cuda ?
            m->gpu_s[rank] : 0, shp->fill_s[rank]);
    if (add_shards(m, rank, sender, data, who) != 0)
        goto out;
    t0 = bench_now_s();
    if ((st = wsync_sender_setup(sender)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_sender_setup", st);
        goto out;
    }
    if (rank == 0) {
        const char *chosen = wsync_sender_scheme(sender);
        snprintf(shp->scheme, sizeof(shp->scheme), "%s", chosen ? chosen : "?");
        fprintf(stderr, PROG ": setup took %.3f s; scheme %s\n%s\n", bench_now_s() - t0,
                shp->scheme, wsync_sender_explain(sender) ? wsync_sender_explain(sender) : "");
        bench_delta_line_of(wsync_sender_explain(sender), shp->d.delta_line,
                            sizeof(shp->d.delta_line));
        shp->wire_off = wsync_sender_explain(sender) != NULL &&
                        strstr(wsync_sender_explain(sender), "FP8 on the wire: off") != NULL;
    }

    if ((rc = push_versions(m, rank, sender, dtx, block, data, who)) != 0)
        goto out;
    if (o->store) /* the store lives in the senders: stay until every receiver has left */
        bench_wait_at_least(&shp->receivers_done, m->NR);
    rc = 0;
    goto out;
oom:
    fprintf(stderr, PROG ": %s: out of host memory\n", who);
out:
    wsync_sender_free(sender);
    if (block) {
        if (o->mem_cuda)
            bcuda_free(block);
        else
            wsync_mem_free(ctx, block);
    }
    wsync_ctx_free(ctx);
    free(chunk);
    free(off);
    free(data);
    bench_delta_tx_free(dtx);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Receivers: the expected bytes of a target, and the check                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    const wsync_target_t *t;
    const wsync_piece_t *p;
    uint64_t version;
    uint16_t *dense;   /* the target's elements as bf16 */
} piece_job_t;

/* The rows of a piece: its box's indices over every dim but the last, row-major (a 1-D piece is
 * one row). The param's pd dims are the target's last pd dims: a [I, Hd] expert weight lands in
 * a [E_local, 2 I_p, Hd] w13 target at dst_start {j, r, 0} (the target's leading dims take
 * dst_start alone). piece_map: the strides of both, once per piece. */
typedef struct {
    int pd, td, lead;
    uint64_t pstride[WSYNC_MAX_DIMS], tstride[WSYNC_MAX_DIMS];
} piece_map_t;

static void piece_map(const wsync_target_t *t, const wsync_piece_t *p, piece_map_t *pm)
{
    int pd = p->param.ndim, td = t->ndim;
    pm->pd = pd;
    pm->td = td;
    pm->lead = td - pd;
    pm->pstride[pd - 1] = 1;
    for (int d = pd - 2; d >= 0; d--)
        pm->pstride[d] = pm->pstride[d + 1] * (uint64_t)p->param.shape[d + 1];
    pm->tstride[td - 1] = 1;
    for (int d = td - 2; d >= 0; d--)
        pm->tstride[d] = pm->tstride[d + 1] * (uint64_t)t->shape[d + 1];
}

/* Row r of a piece (as piece_rows counts them): its first element's linear index in the param
 * (*src) and in the target (*dst); the row is p->src.len[last] elements long in both. */
static void piece_row_at(const wsync_piece_t *p, const piece_map_t *pm, uint64_t r,
                         uint64_t *src, uint64_t *dst)
{
    uint64_t idx[WSYNC_MAX_DIMS] = {0}, rest = r;
    for (int d = pm->pd - 2; d >= 0; d--) {
        idx[d] = rest % (uint64_t)p->src.len[d];
        rest /= (uint64_t)p->src.len[d];
    }
    uint64_t s = 0, t = 0;
    for (int d = 0; d < pm->pd; d++)
        s += ((uint64_t)p->src.start[d] + idx[d]) * pm->pstride[d];
    for (int d = 0; d < pm->td; d++)
        t += ((uint64_t)p->dst_start[d] + (d >= pm->lead ? idx[d - pm->lead] : 0)) *
             pm->tstride[d];
    *src = s;
    *dst = t;
}

/* Rows [lo, hi) of a piece: the generator's bf16 values into the target's dense image. */
static void piece_rows(void *arg, uint64_t lo, uint64_t hi)
{
    piece_job_t *j = arg;
    const wsync_piece_t *p = j->p;
    piece_map_t pm;
    piece_map(j->t, p, &pm);
    for (uint64_t r = lo; r < hi; r++) {
        uint64_t src, dst;
        piece_row_at(p, &pm, r, &src, &dst);
        gen_param(p->param.name, j->version, src, (uint64_t)p->src.len[pm.pd - 1], j->dense + dst);
    }
}

/* Rows of a piece as piece_rows counts them. */
static uint64_t piece_row_count(const wsync_piece_t *pc)
{
    uint64_t rows = 1;
    for (int d = 0; d < pc->param.ndim - 1; d++)
        rows *= (uint64_t)pc->src.len[d];
    return rows;
}

typedef struct {
    const wsync_target_t *t;
    uint64_t version;
    uint16_t *dense;
} pieces_job_t;

/* pieces [lo, hi) of a target, each whole (pieces never overlap in the target) */
static void piece_run(void *arg, uint64_t lo, uint64_t hi)
{
    pieces_job_t *pj = arg;
    for (uint64_t k = lo; k < hi; k++) {
        const wsync_piece_t *pc = &pj->t->pieces[k];
        piece_job_t j = {pj->t, pc, pj->version, pj->dense};
        if (bench_box_elems(&pc->param, &pc->src) > 0)
            piece_rows(&j, 0, piece_row_count(pc));
    }
}

typedef struct {
    const uint16_t *in;
    float *out;
} widen_job_t;

static void widen(void *arg, uint64_t lo, uint64_t hi)
{
    widen_job_t *w = arg;
    widen_bf16(w->in + lo, (uint32_t *)(void *)(w->out + lo), hi - lo);
}

typedef struct {
    const wsync_target_t *t;
    const float *x;
    uint8_t *q;
    float *scales;
    uint64_t rows, cols, scols, br;
    wsync_status_t st;
    pthread_mutex_t lock;
} quant_job_t;

/* block-rows [lo, hi) of an FP8 block target: each is quantized alone (its scales are its own) */
static void quant_rows(void *arg, uint64_t lo, uint64_t hi)
{
    quant_job_t *j = arg;
    uint64_t r0 = lo * j->br, r1 = hi * j->br < j->rows ? hi * j->br : j->rows;
    wsync_status_t st = wsync_quantize_f32(j->t->name, j->x + r0 * j->cols, r1 - r0, j->cols,
                                           j->cols, &j->t->quant, j->t->dtype,
                                           j->q + r0 * j->cols, j->cols,
                                           j->scales + lo * j->scols);
    if (st != WSYNC_OK) {
        pthread_mutex_lock(&j->lock);
        j->st = st;
        pthread_mutex_unlock(&j->lock);
    }
}

/* Columns of a target seen as a matrix: its last dim (a 3-D FusedMoE target quantizes as its
 * [prod(leading dims), last dim] matrix, as wsync_layout_tp_targets says). */
static uint64_t target_cols(const wsync_target_t *t)
{
    return t->ndim >= 2 ? (uint64_t)t->shape[t->ndim - 1] : 1;
}

/* The bytes target t holds after version v: *out (target bytes) and, for FP8, *scales
 * (wsync_target_scale_count floats). bf16 and f32 targets hold the generator's values (f32:
 * widened, as the senders hold an f32 param); FP8 targets the CPU quantizer's bytes. */
static int expected_target(const wsync_target_t *t, uint64_t v, uint8_t *out, float *scales)
{
    uint64_t elems = wsync_target_bytes(t) / wsync_dtype_size(t->dtype);
    int fp8 = t->dtype == WSYNC_DTYPE_F8E4M3FN || t->dtype == WSYNC_DTYPE_F8E5M2;
    int f32 = t->dtype == WSYNC_DTYPE_F32;
    if (!fp8 && !f32 && t->dtype != WSYNC_DTYPE_BF16) {
        fprintf(stderr, PROG ": %s: a %s target cannot be checked (bf16, f32 or FP8 only)\n",
                t->name, wsync_dtype_name(t->dtype));
        return -1;
    }
    uint16_t *dense = fp8 || f32 ? calloc(elems ? elems : 1, 2) : (uint16_t *)out;
    if (!dense)
        return -1;
    if (!fp8 && !f32)
        memset(out, 0, elems * 2);
    for (int k = 0; k < t->npieces; k++) {
        const wsync_piece_t *pc = &t->pieces[k];
        if (pc->param.ndim < 1 || pc->param.ndim > t->ndim) {
            fprintf(stderr, PROG ": %s piece %d: param %s has %d dims, the target %d\n",
                    t->name, k, pc->param.name, pc->param.ndim, t->ndim);
            if (dense != (uint16_t *)out)
                free(dense);
            return -1;
        }
    }
    if (t->npieces >= 2 * g_threads) {
        /* many pieces (a FusedMoE target: two per expert): a thread per run of pieces */
        pieces_job_t pj = {t, v, dense};
        par_for((uint64_t)t->npieces, 1, piece_run, &pj);
    } else {
        for (int k = 0; k < t->npieces; k++) {
            const wsync_piece_t *pc = &t->pieces[k];
            piece_job_t j = {t, pc, v, dense};
            if (bench_box_elems(&pc->param, &pc->src) > 0)
                par_for(piece_row_count(pc), 64, piece_rows, &j);
        }
    }
    if (f32) {
        widen_bf16(dense, (uint32_t *)(void *)out, elems);
        free(dense);
        return 0;
    }
    if (!fp8)
        return 0;
    int rc = -1;
    float *x = malloc(elems * sizeof(float));
    uint64_t cols = target_cols(t), rows = cols ? elems / cols : 0;
    if (x && t->ndim >= 2 && t->quant.scheme == WSYNC_QUANT_BLOCK) {
        widen_job_t w = {dense, x};
        par_for(elems, 1 << 20, widen, &w);
        int64_t srows, scols;
        uint64_t br = t->quant.block_rows > 0 ? (uint64_t)t->quant.block_rows : 128;
        if (wsync_quant_scales_shape(&t->quant, (int64_t)rows, (int64_t)cols, &srows, &scols) ==
            WSYNC_OK) {
            quant_job_t q = {t, x, out, scales, rows, cols, (uint64_t)scols, br,
                             WSYNC_OK, PTHREAD_MUTEX_INITIALIZER};
            par_for((uint64_t)srows, 1, quant_rows, &q);
            rc = q.st == WSYNC_OK ? 0 : -1;
            if (q.st != WSYNC_OK)
                fprintf(stderr, PROG ": reference quantization of %s failed: %s\n", t->name,
                        wsync_last_error());
        }
    } else if (x) {
        fprintf(stderr, PROG ": %s: only block FP8 targets of 2 or more dims are checked\n",
                t->name);
    }
    free(x);
    free(dense);
    return rc;
}

/* Index of the first differing element of size esz, or -1. */
static int64_t first_diff(const uint8_t *a, const uint8_t *b, size_t bytes, size_t esz)
{
    if (memcmp(a, b, bytes) == 0)
        return -1;
    for (size_t i = 0; i < bytes; i++)
        if (a[i] != b[i])
            return (int64_t)(i / esz);
    return -1;
}

/* Compares every target (and FP8 scales) of receiver j with the expected bytes of version v;
 * 0 when all are right, 1 when some are wrong (recorded in the shared page), -1 on a failure. */
static int check_receiver(model_t *m, int j, uint64_t v, uint8_t *const *data,
                          float *const *scales)
{
    const bench_opts_t *o = m->o;
    model_shared_t *sh = m->sh;
    XXH3_state_t *hs = XXH3_createState();
    size_t maxb = 0, maxs = 0;
    int rc = -1, wrong = 0;
    uint8_t *exp = NULL, *got = NULL;
    float *exps = NULL, *gots = NULL;
    if (!hs)
        return -1;
    XXH3_64bits_reset(hs);
    for (size_t k = 0; k < m->ntargets[j]; k++) {
        const wsync_target_t *t = &m->targets[j][k];
        if (wsync_target_bytes(t) > maxb)
            maxb = wsync_target_bytes(t);
        if (wsync_target_scale_count(t) > maxs)
            maxs = wsync_target_scale_count(t);
    }
    exp = malloc(maxb ? maxb : 1);
    got = o->mem_cuda ? malloc(maxb ? maxb : 1) : NULL;
    exps = malloc((maxs ? maxs : 1) * sizeof(float));
    gots = malloc((maxs ? maxs : 1) * sizeof(float));
    if (!exp || (o->mem_cuda && !got) || !exps || !gots) {
        fprintf(stderr, PROG ": receiver %d: no host memory to check the targets\n", j);
        goto out;
    }
    for (size_t k = 0; k < m->ntargets[j]; k++) {
        const wsync_target_t *t = &m->targets[j][k];
        size_t bytes = wsync_target_bytes(t), ns = wsync_target_scale_count(t);
        int fp8 = t->dtype == WSYNC_DTYPE_F8E4M3FN || t->dtype == WSYNC_DTYPE_F8E5M2;
        if (!fp8)
            ns = 0;
        const uint8_t *g = data[k];
        if (o->mem_cuda) {
            if (bcuda_d2h(got, data[k], bytes) != 0)
                goto out;
            g = got;
        }
        const float *gs = scales[k];
        if (ns && o->mem_cuda) {
            if (bcuda_d2h(gots, scales[k], ns * sizeof(float)) != 0)
                goto out;
            gs = gots;
        }
        XXH3_64bits_update(hs, g, bytes);
        if (ns)
            XXH3_64bits_update(hs, gs, ns * sizeof(float));
        if (expected_target(t, v, exp, exps) != 0)
            goto out;
        size_t esz = wsync_dtype_size(t->dtype);
        int64_t d = first_diff(exp, g, bytes, esz);
        int64_t ds = ns ? first_diff((const uint8_t *)exps, (const uint8_t *)gs,
                                     ns * sizeof(float), sizeof(float))
                        : -1;
        if (d < 0 && ds < 0)
            continue;
        if (wrong++ == 0 || wrong <= 5) {
            char line[256];
            if (d >= 0) {
                int64_t cols = (int64_t)target_cols(t);
                uint32_t e = 0, h = 0;
                memcpy(&e, exp + (size_t)d * esz, esz);
                memcpy(&h, g + (size_t)d * esz, esz);
                snprintf(line, sizeof(line),
                         "%s [%s %lld elems]: element %lld (row %lld, col %lld) is 0x%x, "
                         "expected 0x%x",
                         t->name, wsync_dtype_name(t->dtype), (long long)(bytes / esz),
                         (long long)d, (long long)(d / cols), (long long)(d % cols), h, e);
            } else {
                snprintf(line, sizeof(line), "%s: scale %lld is %g, expected %g", t->name,
                         (long long)ds, (double)gs[ds], (double)exps[ds]);
            }
            fprintf(stderr, PROG ": receiver %d: version %llu: %s\n", j, (unsigned long long)v,
                    line);
            if (wrong == 1)
                snprintf(sh->first_wrong[j], sizeof(sh->first_wrong[j]), "%s", line);
        }
    }
    sh->wrong_targets[j] = wrong;
    sh->digest[j] = XXH3_64bits_digest(hs);
    rc = wrong ? 1 : 0;
out:
    XXH3_freeState(hs);
    free(exp);
    free(got);
    free(exps);
    free(gots);
    return rc;
}

/* ---- --delta, receiver side -------------------------------------------------------------- */

typedef struct {
    const wsync_piece_t *p;
    const piece_map_t *pm;
    uint64_t seed, version;
    float lr;
    float *mirror;  /* the target's masters, in its layout */
} delta_rx_job_t;

static void delta_rx_rows(void *arg, uint64_t lo, uint64_t hi)
{
    delta_rx_job_t *j = arg;
    uint64_t n = (uint64_t)j->p->src.len[j->pm->pd - 1];
    for (uint64_t r = lo; r < hi; r++) {
        uint64_t src, dst;
        piece_row_at(j->p, j->pm, r, &src, &dst);
        bench_delta_row(j->seed, src, n, j->version, j->lr, j->mirror + dst);
    }
}

typedef struct {
    const float *mirror;
    uint8_t *out;
    size_t esz;
} delta_round_job_t;

static void delta_round(void *arg, uint64_t lo, uint64_t hi)
{
    delta_round_job_t *j = arg;
    bench_delta_round(j->mirror + lo, hi - lo, j->esz, j->out + lo * j->esz);
}

/* Receiver j after `got` landed (its masters hold version `from`): step every target's masters
 * to `got` (each version in turn) and compare the targets with them rounded. Returns the wrong
 * targets (the first few told), or -1 on a failure. exp and got_buf hold the largest target. */
static int delta_check(model_t *m, int j, uint64_t from, uint64_t got, uint8_t *const *data,
                       float *mirror, const uint64_t *mo, uint8_t *exp, uint8_t *got_buf)
{
    model_shared_t *sh = m->sh;
    int wrong = 0;
    for (size_t k = 0; k < m->ntargets[j]; k++) {
        const wsync_target_t *t = &m->targets[j][k];
        size_t esz = wsync_dtype_size(t->dtype), bytes = wsync_target_bytes(t);
        for (uint64_t v = from + 1; v <= got; v++)
            for (int q = 0; q < t->npieces; q++) {
                const wsync_piece_t *pc = &t->pieces[q];
                if (bench_box_elems(&pc->param, &pc->src) == 0)
                    continue;
                piece_map_t pm;
                piece_map(t, pc, &pm);
                delta_rx_job_t dj = {pc, &pm, bench_delta_seed(pc->param.name), v, (float)m->o->lr,
                                     mirror + mo[k]};
                par_for(piece_row_count(pc), 64, delta_rx_rows, &dj);
            }
        delta_round_job_t rj = {mirror + mo[k], exp, esz};
        par_for(bytes / esz, 1 << 20, delta_round, &rj);
        const uint8_t *g = data[k];
        if (m->o->mem_cuda) {
            if (bcuda_d2h(got_buf, data[k], bytes) != 0)
                return -1;
            g = got_buf;
        }
        int64_t d = first_diff(exp, g, bytes, esz);
        if (d < 0)
            continue;
        if (++wrong <= 3) {
            uint32_t e = 0, h = 0;
            char line[256];
            memcpy(&e, exp + (size_t)d * esz, esz);
            memcpy(&h, g + (size_t)d * esz, esz);
            snprintf(line, sizeof(line), "version %llu: %s: element %lld is 0x%x, expected 0x%x",
                     (unsigned long long)got, t->name, (long long)d, h, e);
            fprintf(stderr, PROG ": receiver %d: %s\n", j, line);
            if (!sh->first_wrong[j][0])
                snprintf(sh->first_wrong[j], sizeof(sh->first_wrong[j]), "%s", line);
        }
    }
    return wrong;
}

/* --delta: receiver j holds version `got` (its masters: *held): check it, then let the senders
 * go on (they step the next version only once every receiver checked this one). 0, or -1. */
static int delta_version(model_t *m, int j, uint64_t *held, uint64_t got, uint8_t *const *data,
                         float *mirror, const uint64_t *mo, uint8_t *exp, uint8_t *got_buf)
{
    model_shared_t *sh = m->sh;
    double a = bench_now_s();
    int w = delta_check(m, j, *held, got, data, mirror, mo, exp, got_buf);
    if (w < 0)
        return -1;
    *held = got;
    sh->verify_s[j] += bench_now_s() - a;
    sh->d.checked_versions[j]++;
    if (w > 0)
        sh->d.wrong_versions[j]++;
    sh->wrong_targets[j] += w;
    bench_count_up(&sh->d.checked[got]);
    return 0;
}

/* --delta: a receiver's masters of its targets (mo[k]: target k's first), stepped as the senders
 * step theirs, the version they hold, and room for the largest target's expected and received
 * bytes. */
typedef struct {
    uint64_t *mo, held;
    float *mirror;
    uint8_t *dexp, *dgot;
} rx_delta_t;

/* Receiver j's rx_delta_t for its targets (bf16 and f32 only) into *d. 0, or -1 told (what
 * it allocated is d's, for the caller to free). */
static int rx_delta_room(const model_t *m, int j, const char *who, rx_delta_t *d)
{
    const bench_opts_t *o = m->o;
    size_t n = m->ntargets[j], most = 1;
    if (!(d->mo = calloc(n + 1, sizeof(*d->mo)))) {
        fprintf(stderr, PROG ": %s: out of host memory\n", who);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        const wsync_target_t *t = &m->targets[j][k];
        if (t->dtype != WSYNC_DTYPE_BF16 && t->dtype != WSYNC_DTYPE_F32) {
            fprintf(stderr, PROG ": %s: --delta checks bf16 and f32 targets; %s is %s\n",
                    who, t->name, wsync_dtype_name(t->dtype));
            return -1;
        }
        d->mo[k + 1] = d->mo[k] + wsync_target_bytes(t) / wsync_dtype_size(t->dtype);
        if (wsync_target_bytes(t) > most)
            most = wsync_target_bytes(t);
    }
    d->mirror = calloc(d->mo[n] ? d->mo[n] : 1, sizeof(float));
    d->dexp = malloc(most);
    d->dgot = o->mem_cuda ? malloc(most) : NULL;
    if (!d->mirror || !d->dexp || (o->mem_cuda && !d->dgot)) {
        fprintf(stderr, PROG ": %s: no host memory for the targets' fp32 masters (%.2f GB)\n",
                who, (double)d->mo[n] * 4 / 1e9);
        return -1;
    }
    return 0;
}

/* Receiver j's block of target bytes and block of scales, on its GPU or in host memory, every
 * byte poisoned. 0, or -1 told (what it allocated is in *block and *sblock, for the caller to
 * free). */
static int rx_alloc_targets(const model_t *m, int j, const char *who, size_t bytes, size_t sbytes,
                            char **block, char **sblock)
{
    if (m->o->mem_cuda) {
        if (bcuda_set_device(m->gpu_r[j]) != 0 || bcuda_malloc((void **)block, bytes) != 0 ||
            bcuda_malloc((void **)sblock, sbytes) != 0)
            return -1;
        /* poison: 0xFF is NaN in bf16 and e4m3, so no stale byte passes for data */
        if (bcuda_memset(*block, 0xFF, bytes) != 0 || bcuda_memset(*sblock, 0xFF, sbytes) != 0)
            return -1;
    } else {
        *block = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
        *sblock = aligned_alloc(4096, ((sbytes ? sbytes : 1) + 4095) & ~(size_t)4095);
        if (!*block || !*sblock) {
            fprintf(stderr, PROG ": %s: cannot allocate %zu bytes of targets\n", who, bytes);
            return -1;
        }
        memset(*block, 0xFF, bytes);
        memset(*sblock, 0xFF, sbytes);
    }
    return 0;
}

/* Receiver j takes every version: the store's fetches (timed, each once the senders pushed it)
 * or the pushed versions as they land; with --delta each is checked as it comes. *got: the
 * last version taken. 0, or -1 told. */
static int rx_take_versions(model_t *m, int j, const char *who, wsync_receiver_t *rv,
                            uint8_t *const *data, rx_delta_t *d, uint64_t *got)
{
    const bench_opts_t *o = m->o;
    model_shared_t *shp = m->sh;
    int total = o->warmup + o->iters;
    wsync_status_t st;
    if (o->store) {
        for (int v = 1; v <= total; v++) {
            bench_wait_at_least(&shp->pushed[v], m->N);
            double a = bench_now_s();
            st = wsync_receiver_fetch(rv, (uint64_t)v, -1, got);
            double dt = bench_now_s() - a;
            if (st != WSYNC_OK) {
                char call[64];
                snprintf(call, sizeof(call), "wsync_receiver_fetch(version %d)", v);
                bench_wsync_failed(who, call, st);
                return -1;
            }
            shp->fetch_s[v - 1][j] = dt;
            bench_count_up(&shp->fetched[v]);
            if (o->delta && delta_version(m, j, &d->held, *got, data, d->mirror, d->mo, d->dexp,
                                          d->dgot) != 0)
                return -1;
        }
    } else {
        /* a timeout only means no version began yet; the parent's deadline bounds the run */
        uint64_t prev = 0;
        while (*got < (uint64_t)total) {
            st = wsync_receiver_wait(rv, -1, got);
            if (st == WSYNC_ERR_TIMEOUT)
                continue;
            if (st != WSYNC_OK) {
                bench_wsync_failed(who, "wsync_receiver_wait", st);
                return -1;
            }
            if (*got != prev + 1)
                shp->skipped_versions[j]++;
            prev = *got;
            if (o->delta && delta_version(m, j, &d->held, *got, data, d->mirror, d->mo, d->dexp,
                                          d->dgot) != 0)
                return -1;
        }
    }
    return 0;
}

static int run_receiver(model_t *m, int j)
{
    const bench_opts_t *o = m->o;
    model_shared_t *shp = m->sh;
    char who[32];
    snprintf(who, sizeof(who), "receiver %d", j);
    int rc = 1;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_status_t st;
    size_t n = m->ntargets[j], bytes = 0, sbytes = 0;
    size_t *off = calloc(n ? n : 1, sizeof(size_t)), *soff = calloc(n ? n : 1, sizeof(size_t));
    uint8_t **data = calloc(n ? n : 1, sizeof(*data));
    float **scales = calloc(n ? n : 1, sizeof(*scales));
    char *block = NULL, *sblock = NULL;
    uint64_t got = 0;
    rx_delta_t dx = {0};
    if (!off || !soff || !data || !scales) {
        fprintf(stderr, PROG ": %s: out of host memory\n", who);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        off[k] = bytes;
        bytes += align_up(wsync_target_bytes(&m->targets[j][k]));
        soff[k] = sbytes;
        if (m->targets[j][k].quant.scheme != WSYNC_QUANT_NONE)
            sbytes += align_up(wsync_target_scale_count(&m->targets[j][k]) * sizeof(float));
    }
    if (o->delta && rx_delta_room(m, j, who, &dx) != 0)
        goto out;
    if (o->store)
        setenv("WSYNC_STORE_TRANSPORT", o->transport, 1);
    if (rx_alloc_targets(m, j, who, bytes, sbytes, &block, &sblock) != 0)
        goto out;
    if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_ctx_create", st);
        goto out;
    }
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = m->coordinator;
    rp.rank = j;
    rp.nreceivers = m->NR;
    rp.delta = m->delta_param ? m->delta_param : "off";
    if ((st = wsync_receiver_create(ctx, &rp, &rv)) != WSYNC_OK) {
        rc = bench_wsync_failed(who, "wsync_receiver_create", st);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        wsync_target_t t = m->targets[j][k];
        data[k] = (uint8_t *)block + off[k];
        scales[k] = (float *)(sblock + soff[k]);
        t.data = data[k];
        t.mem = o->mem_cuda ? WSYNC_MEM_CUDA : WSYNC_MEM_HOST;
        t.device = o->mem_cuda ? m->gpu_r[j] : 0;
        if (t.quant.scheme != WSYNC_QUANT_NONE) {
            t.quant.scales = scales[k];
            t.quant.scales_mem = t.mem;
        }
        if ((st = wsync_receiver_add_target(rv, &t)) != WSYNC_OK) {
            rc = bench_wsync_failed(who, "wsync_receiver_add_target", st);
            goto out;
        }
    }

    if (rx_take_versions(m, j, who, rv, data, &dx, &got) != 0)
        goto out;
    shp->final_version[j] = got;
    /* leave the group first: checking a large model takes a while */
    wsync_receiver_free(rv);
    rv = NULL;
    if (o->store)
        bench_count_up(&shp->receivers_done);
    /* --delta through the store on host memory: the floor of the reader's pass (its pool's
     * threads), on the delta group's targets */
    if (o->delta && o->store && !o->mem_cuda && strcmp(rp.delta, "off") != 0 &&
        bench_delta_read_floor(block, bytes, j, &shp->d) != 0)
        goto out;
    if (o->delta) { /* every version was checked as it came */
        shp->verdict[j] = shp->d.wrong_versions[j] == 0 ? 1 : 2;
        fprintf(stderr, PROG ": %s: %d versions checked, %d wrong\n", who,
                shp->d.checked_versions[j], shp->d.wrong_versions[j]);
        rc = 0;
        goto out;
    }
    double a = bench_now_s();
    int c = check_receiver(m, j, got, data, scales);
    shp->verify_s[j] = bench_now_s() - a;
    if (c < 0)
        goto out;
    shp->verdict[j] = c == 0 ? 1 : 2;
    fprintf(stderr, PROG ": %s: version %llu %s (checked in %.1f s)\n", who,
            (unsigned long long)got, c == 0 ? "right" : "WRONG", shp->verify_s[j]);
    rc = 0;
out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    if (o->mem_cuda) {
        bcuda_free(block);
        bcuda_free(sblock);
    } else {
        free(block);
        free(sblock);
    }
    free(off);
    free(soff);
    free(data);
    free(scales);
    free(dx.mo);
    free(dx.mirror);
    free(dx.dexp);
    free(dx.dgot);
    return rc;
}

static int sync_body(int i, int res_fd, void *arg)
{
    model_t *m = arg;
    close(res_fd);
    return i < m->N ? run_sender(m, i) : run_receiver(m, i - m->N);
}

/* ---------------------------------------------------------------------------------------- */
/* Main                                                                                       */
/* ---------------------------------------------------------------------------------------- */

int bench_model_main(const bench_opts_t *o)
{
    model_t *m = calloc(1, sizeof(*m));
    model_shared_t *shd[2] = {NULL, NULL}; /* --delta: the delta group's page, the full one's */
    bench_child_t *kids = NULL;
    char *text = NULL;
    int rc = 1;
    double memcpy_gbps = 0;
    if (!m) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    m->o = o;
    if (o->mem_cuda && !bcuda_compiled()) {
        fprintf(stderr, PROG ": --mem cuda: this wsync-bench was built without CUDA (configure "
                        "with -DWSYNC_WITH_CUDA=ON)\n");
        free(m);
        return 2;
    }
    m->shape = find_shape(o->model_shape);
    if (!m->shape)
        goto out;
    int built = model_build(m);
    if (built != 0) {
        rc = built == 2 ? 2 : 1;
        goto out;
    }
    if (!(m->sh = bench_map_shared(sizeof(model_shared_t))))
        goto out;
    if (o->delta && !(shd[1] = bench_map_shared(sizeof(model_shared_t))))
        goto out;
    shd[0] = m->sh;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* shared hosts: no NVLink multicast (DEVICE.md) */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    g_threads = (int)(ncpu / (m->N + m->NR));
    g_threads = g_threads < 1 ? 1 : g_threads > 16 ? 16 : g_threads;
    double deadline = bench_now_s() + o->timeout_s;
    fprintf(stderr, PROG ": %s: %llu params of %llu elements, plan moves %.3f GB (%llu chunks, "
                    "%llu segments), fingerprint %016llx\n",
            m->shape->name, (unsigned long long)m->param_count,
            (unsigned long long)m->param_elems, (double)m->sum->total_bytes / 1e9,
            (unsigned long long)m->sum->nchunks, (unsigned long long)m->sum->nsegments,
            (unsigned long long)m->sum->fingerprint);
    if (m->sum_wire)
        fprintf(stderr, PROG ": with FP8 on the wire (ipc, nccl) it moves %.3f GB, %.3f of them "
                        "FP8 codes and scales (fingerprint %016llx)\n",
                (double)m->sum_wire->total_bytes / 1e9, (double)m->sum_wire->fp8_wire_bytes / 1e9,
                (unsigned long long)m->sum_wire->fingerprint);

    if (o->mem_cuda) {
        bench_child_t probe = {.name = "link probe"};
        fprintf(stderr, PROG ": measuring the links (1 GiB copies, a 4 GiB broadcast)\n");
        if (bench_run_group(&probe, 1, probe_body, m, deadline, o->timeout_s, &text) != 0) {
            if (m->sh->refused)
                rc = 2;
            goto out;
        }
        free(text);
        text = NULL;
        place(m, m->sh->ngpu);
    } else {
        memcpy_gbps = bench_memcpy_gbps((size_t)256 << 20);
        place(m, 1);
    }

    int nkids = m->N + m->NR;
    if (!(kids = calloc((size_t)nkids, sizeof(*kids))))
        goto out;
    for (int i = 0; i < nkids; i++) {
        if (i < m->N)
            snprintf(kids[i].name, sizeof(kids[i].name), "sender %d", i);
        else
            snprintf(kids[i].name, sizeof(kids[i].name), "receiver %d", i - m->N);
    }
    /* --delta: the same versions twice, by a group with delta = --delta-mode, then by one with
     * delta = off (a fresh group each: the mode is the group's, fixed at setup) */
    for (int phase = 0; phase < (o->delta ? 2 : 1); phase++) {
        if (o->delta) {
            m->sh = shd[phase];
            m->delta_param = phase == 0 ? o->delta_mode : "off";
            if (phase == 1) { /* what the probe found, for both pages */
                m->sh->ngpu = shd[0]->ngpu;
                memcpy(m->sh->gpu_name, shd[0]->gpu_name, sizeof(m->sh->gpu_name));
            }
            fprintf(stderr, PROG ": --delta: %s run (delta = %s)\n",
                    phase == 0 ? "delta" : "full", m->delta_param);
        }
        if (bench_make_coordinator(m->coordinator, sizeof(m->coordinator)) != 0)
            goto out;
        for (int i = 0; i < nkids; i++)
            kids[i].done = 0;
        free(text);
        text = NULL;
        if (bench_run_group(kids, nkids, sync_body, m, deadline, o->timeout_s, &text) != 0)
            goto out;
    }
    if (o->delta)
        rc = bench_model_report_delta(m, shd);
    else
        rc = bench_model_report(m, memcpy_gbps);
out:
    free(text);
    free(kids);
    if (shd[1])
        munmap(shd[1], sizeof(model_shared_t));
    if (shd[0])
        m->sh = shd[0];
    if (m->sh)
        munmap(m->sh, sizeof(model_shared_t));
    model_free(m);
    free(m);
    return rc;
}
