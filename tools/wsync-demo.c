/* wsync-demo: the project's job end to end on one machine, no GPU and no files needed.
 *
 * N trainer processes hold a model FSDP-N (dim-0 shards of every param, in wsync_mem_alloc
 * memory that the receivers read in place) and change every param at every step; T engine
 * processes hold vLLM's TP-T layout of it (fused qkv_proj and gate_up_proj, row-parallel o_proj
 * and down_proj, padded vocab-parallel embeddings, bf16 or FP8 blocks) as wsync receiver
 * targets. Each step the trainers push a version, every engine rank takes it, and the engine
 * generates greedily from a fixed prompt. This process, which holds no wsync object, checks
 * each step independently: every rank's weights must hash to what the trainers' full weights
 * imply (sliced here by RESHARD_SPEC's rules, quantized by the engine's own quantizer), and the
 * tokens must equal those of a single-process engine holding the full weights.
 *
 * With --device cuda the trainers' shards are CUDA memory (trainer i on GPU i mod n), the engine
 * is the CUDA engine (rank r on GPU (r + offset) mod n), and the single-process reference engine
 * runs on CUDA too; every process sets its own GPU after the fork. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/engine.h"
#include "wsync_build_config.h"

#if WSYNC_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define PROG "wsync-demo"
#define MAX_TRAINERS 64
#define MAX_TARGETS 4096
#define MAX_NEW 256

/* The built-in model: Qwen3-shaped, small, and FP8-block friendly (every TP partition of q, k,
 * v, o, gate, up and down is a multiple of 128 for T = 1, 2 and 4). */
static const char builtin_config[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 256,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 128, \"intermediate_size\": 512, \"vocab_size\": 1000,"
    " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
    " \"tie_word_embeddings\": false, \"dtype\": \"bfloat16\"}";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " [--trainers N] [--tp T [--ep T]] [--steps S]\n"
            "                  [--scheme auto|ipc|nccl|store]\n"
            "                  [--device cpu|cuda] [--gpu-offset G] [--quant none|fp8-block]\n"
            "                  [--fp8-block B] [--model DIR] [--mode in-place|shadow]\n"
            "                  [--max-new K] [--timeout SEC] [--json]\n"
            "\n"
            "Runs wsync end to end on this machine: N trainer processes (FSDP-N senders) push a\n"
            "new version of every param at each of S steps to one inference engine of T\n"
            "tensor-parallel processes (wsync receivers whose targets are the engine's weights),\n"
            "which then generates greedily from a fixed prompt. Each step is checked: every\n"
            "engine rank's weights must hash to what the trainers' full weights imply (computed\n"
            "here, independently), and the tokens must equal those of a single-process engine\n"
            "holding the full weights. One line per step; exit status 0 only if every step\n"
            "matched.\n"
            "\n"
            "  --trainers N     trainer processes (default 2)\n"
            "  --tp T           engine tensor-parallel processes (default 2)\n"
            "  --ep E           expert parallelism of a MoE model's engine: 1 (default) splits\n"
            "                   every expert inside by TP; E = T gives each rank whole experts\n"
            "                   (vLLM's --enable-expert-parallel, linear placement)\n"
            "  --steps S        versions to push (default 3)\n"
            "  --scheme S       auto (default), ipc, nccl or store (as wsync_sender_params_t)\n"
            "  --device D       cpu (default) or cuda: the trainers' shards and the engine's\n"
            "                   weights are CUDA memory; trainer i uses GPU i mod n (n visible\n"
            "                   GPUs), engine rank r GPU (r + G) mod n, and the single-process\n"
            "                   reference engine GPU G mod n. With as many GPUs as processes each\n"
            "                   has its own (what the nccl scheme needs)\n"
            "  --gpu-offset G   first GPU of the engine with --device cuda (default: N, the\n"
            "                   number of trainers)\n"
            "  --quant Q        engine linear weights: none (bf16, default) or fp8-block\n"
            "  --fp8-block B    FP8 block size (default 128; 32 for testdata's tiny model)\n"
            "  --model DIR      start from an HF checkpoint (config.json, model.safetensors)\n"
            "                   instead of the built-in model (a tiny Qwen3-like config with\n"
            "                   deterministic random weights); each step perturbs every param.\n"
            "                   Llama, Qwen2, Qwen3, Qwen3-MoE and DeepSeek-V2/V3 checkpoints\n"
            "                   (e.g. testdata's hf_qwen3_moe_tiny, hf_deepseek_v3_tiny)\n"
            "  --mode M         in-place (default) or shadow (versions land in spare buffers)\n"
            "  --max-new K      tokens to generate per step (default 16)\n"
            "  --timeout SEC    deadline of every wait (default 60)\n"
            "  --json           end stdout with one JSON object summarizing the run\n"
            "  -h, --help       this text\n");
}

typedef struct {
    int trainers, tp, ep, steps, max_new, timeout_s, block, shadow, json, cuda, gpu_offset;
    const char *scheme, *quant, *model;
    wsync_model_config_t cfg;
    int32_t prompt[8];
    int nprompt;
    char coord[64];
} options_t;

/* ---- the weights of each version, defined once for everyone -------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* uniform in [-1, 1), a function of (param, element, step) only */
static float unif(uint32_t p, uint64_t e, uint32_t step)
{
    uint64_t h = mix64(mix64(((uint64_t)p << 32) ^ step ^ 0x5eedULL) ^ (e * 0x9e3779b97f4a7c15ULL));
    return (float)((double)(h >> 40) * 0x1p-23 - 1.0);
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    wsync_param_t *params;            /* wsync_model_params order */
    size_t nparams;
    wsync_engine_st_t *ckpt;          /* --model: the base weights */
    const wsync_engine_tensor_t **base;
} model_t;

/* Element e of param p at `step`, as bf16: the built-in model draws fresh values (norms near 1,
 * linear weights scaled by 1/sqrt(fan-in)); a checkpoint's weights are perturbed by up to 10%. */
static uint16_t weight(const model_t *m, size_t p, uint64_t e, uint32_t step)
{
    const wsync_param_t *pr = &m->params[p];
    float u = unif((uint32_t)p, e, step);

    if (m->base != NULL) {
        const wsync_engine_tensor_t *t = m->base[p];
        float w;
        if (t->dtype == WSYNC_DTYPE_BF16) {
            uint16_t b;
            memcpy(&b, (const uint8_t *)t->data + 2 * e, 2);
            w = from_bf16(b);
        } else if (t->dtype == WSYNC_DTYPE_F32) {
            memcpy(&w, (const uint8_t *)t->data + 4 * e, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const uint8_t *)t->data + 2 * e, 2);
            w = (float)h;   /* not reached: F16 checkpoints are refused at start */
        }
        return to_bf16(w * (1.0f + 0.1f * u));
    }
    if (pr->ndim == 1)
        return to_bf16(1.0f + 0.1f * u);
    if (strstr(pr->name, "embed_tokens") != NULL)
        return to_bf16(0.5f * u);
    return to_bf16(u * sqrtf(3.0f / (float)pr->shape[1]));
}

static uint64_t numel(const wsync_param_t *p)
{
    uint64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= (uint64_t)p->shape[d];
    return n;
}

static int model_open(const options_t *o, model_t *m)
{
    memset(m, 0, sizeof(*m));
    if (wsync_model_params(&o->cfg, WSYNC_DTYPE_BF16, &m->params, &m->nparams) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_last_error());
        return -1;
    }
    if (o->model == NULL)
        return 0;
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.safetensors", o->model);
    if (wsync_engine_st_open(path, &m->ckpt) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_engine_last_error());
        return -1;
    }
    m->base = calloc(m->nparams, sizeof(*m->base));
    for (size_t p = 0; p < m->nparams; p++) {
        const wsync_engine_tensor_t *t = wsync_engine_st_find(m->ckpt, m->params[p].name);
        int same = t != NULL && t->ndim == m->params[p].ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == m->params[p].shape[d];
        if (!same || (t->dtype != WSYNC_DTYPE_BF16 && t->dtype != WSYNC_DTYPE_F32)) {
            fprintf(stderr, PROG ": %s: tensor '%s' is %s\n", path, m->params[p].name,
                    t == NULL ? "missing" : !same ? "not of the shape config.json implies"
                                                  : "neither BF16 nor F32");
            return -1;
        }
        m->base[p] = t;
    }
    return 0;
}

static void model_close(model_t *m)
{
    wsync_model_params_free(m->params, m->nparams);
    free(m->base);
    wsync_engine_st_close(m->ckpt);
}

/* ---- reports from the children ------------------------------------------------------------ */

typedef struct {
    int32_t step;
    uint64_t version;
    uint64_t bytes_delivered;
    double seconds;
    char scheme[16];
} trainer_report_t;

typedef struct {
    int32_t step;
    uint64_t version;      /* of the weights the generation used */
    uint64_t taken;        /* version update() took */
    int32_t ntargets, ntokens;
    double seconds;
    uint64_t hashes[MAX_TARGETS];
    int32_t tokens[MAX_NEW];
} engine_report_t;

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Read len bytes, waiting at most until deadline_ms; 0 ok, -1 EOF or error, -2 timeout. */
static int read_all(int fd, void *buf, size_t len, int64_t deadline_ms);

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int read_all(int fd, void *buf, size_t len, int64_t deadline_ms)
{
    uint8_t *p = buf;
    while (len > 0) {
        struct pollfd pf = {fd, POLLIN, 0};
        int64_t left = deadline_ms - now_ms();
        if (left <= 0)
            return -2;
        int rc = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            continue;
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---- trainer ------------------------------------------------------------------------------ */

static uint64_t target_hash(const wsync_engine_weight_t *w)
{
    XXH3_state_t *s = XXH3_createState();
    uint64_t h;
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, w->data, w->bytes);
    if (w->nscales)
        XXH3_64bits_update(s, w->scales, w->nscales * sizeof(float));
    h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* ---- trainers' GPU memory (--device cuda) --------------------------------------------------- */

/* Trainer `rank` uses GPU rank mod n: 0, or -1 with the reason on stderr. */
static int trainer_gpu_set(int rank, int *gpu)
{
#if WSYNC_HAVE_CUDA
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n < 1) {
        fprintf(stderr, PROG ": trainer %d: no CUDA device (cudaGetDeviceCount: %s)\n", rank,
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return -1;
    }
    *gpu = rank % n;
    if ((err = cudaSetDevice(*gpu)) != cudaSuccess) {
        fprintf(stderr, PROG ": trainer %d: cudaSetDevice(%d): %s\n", rank, *gpu,
                cudaGetErrorString(err));
        return -1;
    }
    return 0;
#else
    (void)gpu;
    fprintf(stderr, PROG ": trainer %d: built without CUDA\n", rank);
    return -1;
#endif
}

static int trainer_gpu_alloc(int rank, int gpu, size_t bytes, uint8_t **dev)
{
#if WSYNC_HAVE_CUDA
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        fprintf(stderr, PROG ": trainer %d: cudaMalloc(%zu bytes) on GPU %d: %s\n", rank, bytes,
                gpu, cudaGetErrorString(err));
        return -1;
    }
    *dev = p;
    return 0;
#else
    (void)rank, (void)gpu, (void)bytes, (void)dev;
    return -1;
#endif
}

/* This step's weights to the GPU, complete before wsync reads them (from any stream or process). */
static int trainer_gpu_upload(int rank, int gpu, uint8_t *dev, const uint8_t *host, size_t bytes)
{
#if WSYNC_HAVE_CUDA
    cudaError_t err = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
    if (err == cudaSuccess)
        err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        fprintf(stderr, PROG ": trainer %d: copying %zu bytes to GPU %d: %s\n", rank, bytes, gpu,
                cudaGetErrorString(err));
        return -1;
    }
    return 0;
#else
    (void)rank, (void)gpu, (void)dev, (void)host, (void)bytes;
    return -1;
#endif
}

static void trainer_gpu_free(uint8_t *dev)
{
#if WSYNC_HAVE_CUDA
    if (dev != NULL)
        cudaFree(dev);
#else
    (void)dev;
#endif
}

static int trainer_main(const options_t *o, int rank, int go_fd, int out_fd)
{
    model_t m;
    wsync_shard_t *shards = NULL;
    size_t nshards = 0, total = 0;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    uint8_t *mem = NULL, *dev = NULL;   /* dev: the shards on the GPU; mem then stages them */
    size_t *offs = NULL;
    wsync_status_t st;
    int rc = 1, gpu = 0;

    if (model_open(o, &m) != 0)
        return 1;
    if (o->cuda && trainer_gpu_set(rank, &gpu) != 0) {
        model_close(&m);
        return 1;
    }
    if (wsync_layout_fsdp_shards(&o->cfg, WSYNC_DTYPE_BF16, rank, o->trainers, &shards,
                                 &nshards) != WSYNC_OK ||
        wsync_ctx_create(NULL, &ctx) != WSYNC_OK)
        goto fail;
    sp.coordinator = o->coord;
    sp.rank = rank;
    sp.nranks = o->trainers;
    sp.nreceivers = o->tp;
    sp.scheme = o->scheme;
    sp.timeout_ms = o->timeout_s * 1000;
    if ((st = wsync_sender_create(ctx, &sp, &s)) != WSYNC_OK)
        goto fail;
    offs = calloc(nshards + 1, sizeof(*offs));
    for (size_t i = 0; i < nshards; i++) {
        uint64_t row = numel(&shards[i].param) / (uint64_t)shards[i].param.shape[0];
        offs[i] = total;
        total += (size_t)(shards[i].box.len[0] * (int64_t)row) * 2;
    }
    if (o->cuda) {
        /* CUDA shards: the ipc scheme maps them into the receivers, nccl sends them */
        if ((mem = malloc(total ? total : 1)) == NULL ||
            trainer_gpu_alloc(rank, gpu, total, &dev) != 0)
            goto done;
    } else if (wsync_mem_alloc(ctx, total ? total : 1, (void **)&mem) != WSYNC_OK) {
        goto fail;   /* shared memory: same-node receivers copy straight from it */
    }
    for (size_t i = 0; i < nshards; i++) {
        shards[i].data = (dev != NULL ? dev : mem) + offs[i];
        if (dev != NULL) {
            shards[i].mem = WSYNC_MEM_CUDA;
            shards[i].device = gpu;
        }
        if (wsync_sender_add_shard(s, &shards[i]) != WSYNC_OK)
            goto fail;
    }
    /* plan and scheme once, so that each step's push times the version alone */
    if (wsync_sender_setup(s) != WSYNC_OK)
        goto fail;
    for (int step = 1; step <= o->steps; step++) {
        trainer_report_t rep;
        wsync_push_stats_t stats;
        int32_t go;
        /* this step's weights: every element of the rows this rank holds */
        for (size_t i = 0; i < nshards; i++) {
            uint64_t row = numel(&shards[i].param) / (uint64_t)shards[i].param.shape[0];
            uint64_t e0 = (uint64_t)shards[i].box.start[0] * row;
            uint64_t n = (uint64_t)shards[i].box.len[0] * row;
            uint16_t *dst = (uint16_t *)(mem + offs[i]);
            for (uint64_t k = 0; k < n; k++)
                dst[k] = weight(&m, i, e0 + k, (uint32_t)step);
        }
        if (dev != NULL && trainer_gpu_upload(rank, gpu, dev, mem, total) != 0)
            goto done;
        if (read_all(go_fd, &go, sizeof(go), now_ms() + 3600000) != 0 || go != step)
            goto out;   /* the demo is over */
        if ((st = wsync_sender_push(s, (uint64_t)step)) != WSYNC_OK ||
            (st = wsync_sender_stats(s, &stats)) != WSYNC_OK)
            goto fail;
        memset(&rep, 0, sizeof(rep));
        rep.step = step;
        rep.version = stats.version;
        rep.bytes_delivered = stats.bytes_delivered;
        rep.seconds = stats.seconds;
        snprintf(rep.scheme, sizeof(rep.scheme), "%s",
                 wsync_sender_scheme(s) ? wsync_sender_scheme(s) : "?");
        if (write_all(out_fd, &rep, sizeof(rep)) != 0)
            goto out;
    }
    {
        /* stay in the group until the conductor has every report: sender 0 is the coordinator,
         * and leaving first could cut another trainer's last push short */
        int32_t go;
        read_all(go_fd, &go, sizeof(go), now_ms() + (int64_t)o->timeout_s * 1000 * 4);
    }
out:
    rc = 0;
    goto done;
fail:
    fprintf(stderr, PROG ": trainer %d: %s\n", rank, wsync_last_error());
done:
    wsync_sender_free(s);
    if (dev != NULL) {
        trainer_gpu_free(dev);
        free(mem);
    } else if (mem != NULL && o->cuda) {
        free(mem);
    } else if (mem != NULL) {
        wsync_mem_free(ctx, mem);
    }
    wsync_ctx_free(ctx);
    wsync_layout_shards_free(shards, nshards);
    free(offs);
    model_close(&m);
    return rc;
}

/* ---- engine rank -------------------------------------------------------------------------- */

static wsync_engine_params_t engine_params(const options_t *o, int rank, int tp,
                                           wsync_engine_comm_t *comm)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    p.tp_rank = rank;
    p.tp_size = tp;
    p.comm = comm;
    p.ep = tp > 1 ? o->ep : 0;   /* the single-process reference holds every expert */
    p.param_dtype = WSYNC_DTYPE_BF16;
    p.mode = o->shadow ? WSYNC_ENGINE_SHADOW : WSYNC_ENGINE_IN_PLACE;
    p.max_seq = o->nprompt + o->max_new;
    if (o->cuda) {
        p.device = WSYNC_ENGINE_CUDA;
        p.gpu = rank + o->gpu_offset;   /* modulo the visible GPUs, in the engine */
    }
    if (strcmp(o->quant, "fp8-block") == 0) {
        p.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
        p.fp8_block = o->block;
    }
    return p;
}

static int engine_main(const options_t *o, int rank, wsync_engine_comm_t *comm, int go_fd,
                       int out_fd)
{
    wsync_engine_params_t p = engine_params(o, rank, o->tp, comm);
    wsync_engine_t *e = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    engine_report_t *rep = calloc(1, sizeof(*rep));
    int rc = 1;

    if (wsync_engine_create(&o->cfg, &p, &e) != WSYNC_OK) {
        fprintf(stderr, PROG ": engine rank %d: %s\n", rank, wsync_engine_last_error());
        goto out;
    }
    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK) {
        fprintf(stderr, PROG ": engine rank %d: %s\n", rank, wsync_last_error());
        goto out;
    }
    rp.coordinator = o->coord;
    rp.timeout_ms = o->timeout_s * 1000;
    if (wsync_engine_attach(e, ctx, &rp) != WSYNC_OK ||
        wsync_engine_weight_count(e) > MAX_TARGETS)
        goto fail;
    for (int step = 1; step <= o->steps; step++) {
        wsync_engine_result_t res;
        uint64_t v = 0;
        if (wsync_engine_update(e, o->timeout_s * 1000, &v) != WSYNC_OK)
            goto fail;
        memset(rep, 0, sizeof(*rep));
        rep->step = step;
        rep->taken = v;
        rep->ntargets = (int32_t)wsync_engine_weight_count(e);
        for (int i = 0; i < rep->ntargets; i++) {
            wsync_engine_weight_t w;
            if (wsync_engine_weight(e, (size_t)i, &w) != WSYNC_OK)
                goto fail;
            if (w.mem == WSYNC_MEM_CUDA) {
                /* a CUDA engine's weights: hashed from a host copy */
                void *data = malloc(w.bytes ? w.bytes : 1);
                float *scales = w.nscales ? malloc(w.nscales * sizeof(float)) : NULL;
                int ok = data != NULL && (w.nscales == 0 || scales != NULL) &&
                         wsync_engine_weight_read(e, (size_t)i, data, scales) == WSYNC_OK;
                w.data = data;
                w.scales = scales;
                if (ok)
                    rep->hashes[i] = target_hash(&w);
                free(data);
                free(scales);
                if (!ok)
                    goto fail;
            } else {
                rep->hashes[i] = target_hash(&w);
            }
        }
        if (wsync_engine_generate(e, o->prompt, o->nprompt, o->max_new, rep->tokens, &res) !=
            WSYNC_OK)
            goto fail;
        rep->version = res.version;
        rep->ntokens = res.ntokens;
        rep->seconds = res.seconds;
        if (write_all(out_fd, rep, sizeof(*rep)) != 0)
            break;
    }
    {
        int32_t go;   /* leave when the conductor is done (it closes the pipe) */
        read_all(go_fd, &go, sizeof(go), now_ms() + (int64_t)o->timeout_s * 1000 * 4);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, PROG ": engine rank %d: %s\n", rank, wsync_engine_last_error());
out:
    wsync_engine_free(e);
    wsync_ctx_free(ctx);
    free(rep);
    return rc;
}

/* ---- the independent check ------------------------------------------------------------------ */

static size_t find_param(const model_t *m, const char *name)
{
    for (size_t p = 0; p < m->nparams; p++)
        if (strcmp(m->params[p].name, name) == 0)
            return p;
    return (size_t)-1;
}

/* out[dst_row + i][j] = param[src_row + i][src_col + j] (as float) */
static int put_rows(const model_t *m, uint16_t *const *full, const char *name, float *out,
                    int64_t out_cols, int64_t dst_row, int64_t src_row, int64_t nrows,
                    int64_t src_col, int64_t ncols)
{
    size_t p = find_param(m, name);
    if (p == (size_t)-1)
        return -1;
    int64_t cols = m->params[p].ndim > 1 ? m->params[p].shape[1] : 1;
    for (int64_t i = 0; i < nrows; i++)
        for (int64_t j = 0; j < ncols; j++)
            out[(dst_row + i) * out_cols + j] = from_bf16(full[p][(src_row + i) * cols + src_col + j]);
    return 0;
}

/* Target `name` of TP rank r, built from the full weights by RESHARD_SPEC's rules (not by the
 * layout's pieces), as floats [rows, cols]. Returns -1 for a name it does not know. */
static int expected_target(const options_t *o, const model_t *m, uint16_t *const *full,
                           const char *name, int r, float *out, int64_t rows, int64_t cols)
{
    const wsync_model_config_t *c = &o->cfg;
    const int T = o->tp;
    const int64_t H = c->num_attention_heads, K = c->num_key_value_heads, D = c->head_dim;
    const int64_t Hd = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    char pname[256], base[200];
    int layer = -1, used = 0;
    const char *suffix;

    memset(out, 0, (size_t)(rows * cols) * sizeof(float));
    if (strcmp(name, "model.embed_tokens.weight") == 0 || strcmp(name, "lm_head.weight") == 0) {
        int64_t vr = (V + 63) / 64 * 64 / T, lo = r * vr, hi = lo + vr < V ? lo + vr : V;
        return hi > lo ? put_rows(m, full, name, out, Hd, 0, lo, hi - lo, 0, Hd) : 0;
    }
    if (strcmp(name, "model.norm.weight") == 0)
        return put_rows(m, full, name, out, 1, 0, 0, rows, 0, 1);
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) != 1 || used == 0)
        return -1;
    suffix = name + used;
    snprintf(base, sizeof(base), "model.layers.%d.", layer);
#define P(s) (snprintf(pname, sizeof(pname), "%s%s", base, (s)), pname)
    if (strstr(suffix, "norm.weight") != NULL || strcmp(suffix, "self_attn.o_proj.bias") == 0 ||
        strcmp(suffix, "mlp.down_proj.bias") == 0)
        return put_rows(m, full, name, out, 1, 0, 0, rows, 0, 1);
    if (strncmp(suffix, "self_attn.qkv_proj.", 19) == 0) {
        const char *kind = suffix + 19;   /* weight or bias */
        int64_t w = strcmp(kind, "weight") == 0 ? Hd : 1;
        int64_t hr = H / T, kr_n = K >= T ? K / T : 1, kr = K >= T ? r : r / (T / K);
        char q[64], k[64], v[64];
        snprintf(q, sizeof(q), "self_attn.q_proj.%s", kind);
        snprintf(k, sizeof(k), "self_attn.k_proj.%s", kind);
        snprintf(v, sizeof(v), "self_attn.v_proj.%s", kind);
        if (put_rows(m, full, P(q), out, w, 0, r * hr * D, hr * D, 0, w) ||
            put_rows(m, full, P(k), out, w, hr * D, kr * kr_n * D, kr_n * D, 0, w) ||
            put_rows(m, full, P(v), out, w, hr * D + kr_n * D, kr * kr_n * D, kr_n * D, 0, w))
            return -1;
        return 0;
    }
    if (strncmp(suffix, "mlp.gate_up_proj.", 17) == 0) {
        const char *kind = suffix + 17;
        int64_t w = strcmp(kind, "weight") == 0 ? Hd : 1, ir = I / T;
        char g[64], u[64];
        snprintf(g, sizeof(g), "mlp.gate_proj.%s", kind);
        snprintf(u, sizeof(u), "mlp.up_proj.%s", kind);
        if (put_rows(m, full, P(g), out, w, 0, r * ir, ir, 0, w) ||
            put_rows(m, full, P(u), out, w, ir, r * ir, ir, 0, w))
            return -1;
        return 0;
    }
    /* mixture of experts (vLLM FusedMoE): the router whole; expert e's gate rows then up rows
     * of this rank in w13, its down columns in w2; whole experts e_first.. under --ep */
    if (strcmp(suffix, "mlp.gate.weight") == 0 ||
        strcmp(suffix, "mlp.gate.e_score_correction_bias") == 0)
        return put_rows(m, full, name, out, cols, 0, 0, rows, 0, cols);
    if (strcmp(suffix, "mlp.experts.w13_weight") == 0 ||
        strcmp(suffix, "mlp.experts.w2_weight") == 0) {
        const int64_t E = c->num_experts, ep = o->ep > 1 ? o->ep : 1;
        const int64_t nloc = E / ep + (r < E % ep), first = ep > 1 ? r * (E / ep) +
                             (r < E % ep ? r : E % ep) : 0;
        const int64_t ip = c->moe_intermediate_size / (ep > 1 ? 1 : T), ri = ep > 1 ? 0 : r;
        int w13 = strstr(suffix, "w13") != NULL;
        for (int64_t j = 0; j < nloc; j++) {
            char g[96], u[96], d[96], pg[256], pu[256];
            snprintf(g, sizeof(g), "mlp.experts.%lld.gate_proj.weight", (long long)(first + j));
            snprintf(u, sizeof(u), "mlp.experts.%lld.up_proj.weight", (long long)(first + j));
            snprintf(d, sizeof(d), "mlp.experts.%lld.down_proj.weight", (long long)(first + j));
            snprintf(pg, sizeof(pg), "%s%s", base, g);
            snprintf(pu, sizeof(pu), "%s%s", base, u);
            if (w13 ? put_rows(m, full, pg, out, Hd, j * 2 * ip, ri * ip, ip, 0, Hd) ||
                          put_rows(m, full, pu, out, Hd, j * 2 * ip + ip, ri * ip, ip, 0, Hd)
                    : put_rows(m, full, P(d), out, ip, j * Hd, 0, Hd, ri * ip, ip))
                return -1;
        }
        return 0;
    }
    if (strcmp(suffix, "mlp.shared_experts.gate_up_proj.weight") == 0) {
        int64_t is = c->n_shared_experts * c->moe_intermediate_size / T;
        char pg[256];
        snprintf(pg, sizeof(pg), "%smlp.shared_experts.gate_proj.weight", base);
        if (put_rows(m, full, pg, out, Hd, 0, r * is, is, 0, Hd) ||
            put_rows(m, full, P("mlp.shared_experts.up_proj.weight"), out, Hd, is, r * is, is, 0,
                     Hd))
            return -1;
        return 0;
    }
    if (strcmp(suffix, "mlp.shared_experts.down_proj.weight") == 0) {
        int64_t is = c->n_shared_experts * c->moe_intermediate_size / T;
        return put_rows(m, full, name, out, is, 0, 0, Hd, r * is, is);
    }
    /* MLA: q_a and kv_a whole (fused), q / q_b and kv_b by heads, o by the heads' v columns */
    if (c->kv_lora_rank > 0) {
        const int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim, hr = H / T;
        const int64_t kva = c->kv_lora_rank + c->qk_rope_head_dim;
        if (strcmp(suffix, "self_attn.fused_qkv_a_proj.weight") == 0) {
            char pq[256];
            snprintf(pq, sizeof(pq), "%sself_attn.q_a_proj.weight", base);
            return put_rows(m, full, pq, out, Hd, 0, 0, c->q_lora_rank, 0, Hd) ||
                           put_rows(m, full, P("self_attn.kv_a_proj_with_mqa.weight"), out, Hd,
                                    c->q_lora_rank, 0, kva, 0, Hd) ? -1 : 0;
        }
        if (strcmp(suffix, "self_attn.kv_a_proj_with_mqa.weight") == 0)
            return put_rows(m, full, name, out, Hd, 0, 0, kva, 0, Hd);
        if (strcmp(suffix, "self_attn.q_b_proj.weight") == 0 ||
            strcmp(suffix, "self_attn.q_proj.weight") == 0)
            return put_rows(m, full, name, out, cols, 0, r * hr * qk, hr * qk, 0, cols);
        if (strcmp(suffix, "self_attn.kv_b_proj.weight") == 0) {
            int64_t per = c->qk_nope_head_dim + c->v_head_dim;
            return put_rows(m, full, name, out, cols, 0, r * hr * per, hr * per, 0, cols);
        }
        if (strcmp(suffix, "self_attn.o_proj.weight") == 0)
            return put_rows(m, full, name, out, cols, 0, 0, Hd, r * hr * c->v_head_dim,
                            hr * c->v_head_dim);
    }
    if (strcmp(suffix, "self_attn.o_proj.weight") == 0)
        return put_rows(m, full, name, out, cols, 0, 0, Hd, r * (H * D / T), H * D / T);
    if (strcmp(suffix, "mlp.down_proj.weight") == 0)
        return put_rows(m, full, name, out, cols, 0, 0, Hd, r * (I / T), I / T);
#undef P
    return -1;
}

typedef struct {
    uint64_t hash[MAX_TARGETS];
    int n;
} expected_t;

/* Hashes every rank's targets must have at this step. */
static int expected_hashes(const options_t *o, const model_t *m, uint16_t *const *full, int r,
                           expected_t *ex)
{
    wsync_tp_options_t opts = WSYNC_TP_OPTIONS_INIT;
    wsync_target_t *t = NULL;
    size_t n = 0;
    int quant = strcmp(o->quant, "fp8-block") == 0;
    int rc = 0;

    opts.dtype = WSYNC_DTYPE_BF16;
    if (quant) {
        opts.quant.scheme = WSYNC_QUANT_BLOCK;
        opts.quant.block_rows = opts.quant.block_cols = o->block;
    }
    if (o->ep > 1) {
        opts.ep_size = o->ep;
        opts.ep_rank = r;
    }
    /* only the names, shapes and dtypes of the targets come from the layout */
    if (wsync_layout_tp_targets(&o->cfg, r, o->tp, &opts, &t, &n) != WSYNC_OK || n > MAX_TARGETS) {
        fprintf(stderr, PROG ": %s\n", wsync_last_error());
        return -1;
    }
    ex->n = (int)n;
    for (size_t i = 0; i < n && rc == 0; i++) {
        /* a 3-D target (w13, w2) as its [prod(leading dims), last dim] matrix */
        int64_t rows = 1, cols = t[i].ndim > 1 ? t[i].shape[t[i].ndim - 1] : 1;
        for (int d = 0; d < (t[i].ndim > 1 ? t[i].ndim - 1 : 1); d++)
            rows *= t[i].shape[d];
        size_t cnt = (size_t)(rows * cols);
        float *x = malloc(cnt * sizeof(float));
        wsync_engine_weight_t w = {0};
        if (expected_target(o, m, full, t[i].name, r, x, rows, cols) != 0) {
            fprintf(stderr, PROG ": no rule for target '%s'\n", t[i].name);
            rc = -1;
        } else if (t[i].dtype == WSYNC_DTYPE_F8E4M3FN) {
            w.bytes = cnt;
            w.data = malloc(cnt);
            w.nscales = wsync_target_scale_count(&t[i]);
            w.scales = malloc(w.nscales * sizeof(float));
            if (wsync_engine_quantize_block(t[i].name, x, rows, cols, o->block, w.data,
                                            w.scales) != WSYNC_OK) {
                fprintf(stderr, PROG ": %s\n", wsync_engine_last_error());
                rc = -1;
            }
        } else if (t[i].dtype == WSYNC_DTYPE_F32) {
            /* (DeepSeek's e_score_correction_bias: fp32 in vLLM whatever the weights are) */
            w.data = malloc(cnt * 4);
            memcpy(w.data, x, cnt * 4);
            w.bytes = cnt * 4;
        } else {
            uint16_t *b = malloc(cnt * 2);
            for (size_t k = 0; k < cnt; k++)
                b[k] = to_bf16(x[k]);
            w.data = b;
            w.bytes = cnt * 2;
        }
        if (rc == 0)
            ex->hash[i] = target_hash(&w);
        free(w.data);
        free(w.scales);
        free(x);
    }
    wsync_layout_targets_free(t, n);
    return rc;
}

/* Tokens of a single-process engine holding the full weights of this step. */
static int reference_tokens(const options_t *o, const model_t *m, uint16_t *const *full,
                            int32_t *tokens)
{
    wsync_engine_params_t p = engine_params(o, 0, 1, NULL);
    wsync_engine_tensor_t *t = calloc(m->nparams, sizeof(*t));
    wsync_engine_t *e = NULL;
    int rc = -1;

    p.mode = WSYNC_ENGINE_IN_PLACE;
    for (size_t i = 0; i < m->nparams; i++) {
        t[i].name = m->params[i].name;
        t[i].dtype = WSYNC_DTYPE_BF16;
        t[i].ndim = m->params[i].ndim;
        memcpy(t[i].shape, m->params[i].shape, sizeof(t[i].shape));
        t[i].data = full[i];
        t[i].nbytes = (size_t)numel(&m->params[i]) * 2;
    }
    if (wsync_engine_create(&o->cfg, &p, &e) == WSYNC_OK &&
        wsync_engine_load(e, t, m->nparams) == WSYNC_OK &&
        wsync_engine_generate(e, o->prompt, o->nprompt, o->max_new, tokens, NULL) == WSYNC_OK)
        rc = 0;
    else
        fprintf(stderr, PROG ": reference engine: %s\n", wsync_engine_last_error());
    wsync_engine_free(e);
    free(t);
    return rc;
}

/* ---- the conductor ------------------------------------------------------------------------ */

static int parse_int(const char *opt, const char *text, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s: '%s' is not an integer in [%ld, %ld]\n", opt, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, options_t *o)
{
    static const struct option longopts[] = {
        {"trainers", required_argument, NULL, 'n'}, {"tp", required_argument, NULL, 't'},
        {"steps", required_argument, NULL, 's'},    {"scheme", required_argument, NULL, 'S'},
        {"device", required_argument, NULL, 'd'},   {"quant", required_argument, NULL, 'q'},
        {"fp8-block", required_argument, NULL, 'b'}, {"model", required_argument, NULL, 'm'},
        {"mode", required_argument, NULL, 'M'},     {"max-new", required_argument, NULL, 'k'},
        {"timeout", required_argument, NULL, 'T'},  {"json", no_argument, NULL, 'j'},
        {"gpu-offset", required_argument, NULL, 'g'}, {"ep", required_argument, NULL, 'e'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    int c;

    o->trainers = 2;
    o->tp = 2;
    o->steps = 3;
    o->max_new = 16;
    o->timeout_s = 60;
    o->block = 0;
    o->scheme = "auto";
    o->quant = "none";
    o->gpu_offset = -1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n': if (parse_int("--trainers", optarg, 1, MAX_TRAINERS, &o->trainers)) return 2; break;
        case 't': if (parse_int("--tp", optarg, 1, WSYNC_ENGINE_MAX_TP, &o->tp)) return 2; break;
        case 'e': if (parse_int("--ep", optarg, 1, WSYNC_ENGINE_MAX_TP, &o->ep)) return 2; break;
        case 's': if (parse_int("--steps", optarg, 1, 1000000, &o->steps)) return 2; break;
        case 'k': if (parse_int("--max-new", optarg, 1, MAX_NEW, &o->max_new)) return 2; break;
        case 'T': if (parse_int("--timeout", optarg, 1, 86400, &o->timeout_s)) return 2; break;
        case 'b': if (parse_int("--fp8-block", optarg, 1, 256, &o->block)) return 2; break;
        case 'S':
            if (strcmp(optarg, "auto") && strcmp(optarg, "ipc") && strcmp(optarg, "nccl") &&
                strcmp(optarg, "store")) {
                fprintf(stderr, PROG ": --scheme: '%s' is not auto, ipc, nccl or store\n", optarg);
                return 2;
            }
            o->scheme = optarg;
            break;
        case 'd':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, PROG ": --device: '%s' is not cpu or cuda\n", optarg);
                return 2;
            }
            o->cuda = strcmp(optarg, "cuda") == 0;
            if (o->cuda && !WSYNC_HAVE_CUDA) {
                fprintf(stderr, PROG ": --device cuda: wsync was built without CUDA (use "
                        "--device cpu, or build with the CUDA toolkit)\n");
                return 2;
            }
            break;
        case 'g': if (parse_int("--gpu-offset", optarg, 0, 1 << 16, &o->gpu_offset)) return 2;
                  break;
        case 'q':
            if (strcmp(optarg, "none") && strcmp(optarg, "fp8-block")) {
                fprintf(stderr, PROG ": --quant: '%s' is not none or fp8-block\n", optarg);
                return 2;
            }
            o->quant = optarg;
            break;
        case 'm': o->model = optarg; break;
        case 'M':
            if (strcmp(optarg, "in-place") && strcmp(optarg, "shadow")) {
                fprintf(stderr, PROG ": --mode: '%s' is not in-place or shadow\n", optarg);
                return 2;
            }
            o->shadow = strcmp(optarg, "shadow") == 0;
            break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return -1;
        case ':':
            fprintf(stderr, PROG ": option '%s' needs a value (see --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, PROG ": unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (o->ep > 1 && o->ep != o->tp) {
        fprintf(stderr, PROG ": --ep %d: expert parallelism spans the engine's TP ranks, so it "
                "is 1 or --tp (%d)\n", o->ep, o->tp);
        return 2;
    }
    if (o->block == 0)
        o->block = 128;
    if (o->gpu_offset < 0)
        o->gpu_offset = o->trainers;
    return 0;
}

static int free_port(void)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void human_bytes(double b, char *buf, size_t len)
{
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) {
        b /= 1000;
        i++;
    }
    snprintf(buf, len, "%.2f %s", b, u[i]);
}

/* On a terminal one line of stderr rewritten in place; elsewhere a line per event. */
static void progress(int step, int steps, const char *what)
{
    static int tty = -1;
    if (tty < 0)
        tty = isatty(2);
    if (what == NULL) {
        if (tty)
            fprintf(stderr, "\r%40s\r", "");
        return;
    }
    fprintf(stderr, tty ? "\r[%d/%d] %s version %d ...   " : "[%d/%d] %s version %d\n", step,
            steps, what, step);
    fflush(stderr);
}

typedef struct {
    pid_t pid;
    int out_fd;     /* reports from it */
    int go_fd;      /* trainers: steps to push */
    const char *what;
    int index;
} child_t;

static child_t kids[MAX_TRAINERS + WSYNC_ENGINE_MAX_TP];
static int nkids;

static void kill_all(void)
{
    for (int i = 0; i < nkids; i++) {
        if (kids[i].pid > 0) {
            kill(kids[i].pid, SIGKILL);
            waitpid(kids[i].pid, NULL, 0);
            kids[i].pid = 0;
        }
    }
}

/* Why child i stopped talking. */
static void explain_child(child_t *k, int rc)
{
    int status;
    if (rc == -2) {
        fprintf(stderr, PROG ": %s %d sent nothing before the deadline\n", k->what, k->index);
        return;
    }
    if (waitpid(k->pid, &status, 0) == k->pid) {
        k->pid = 0;
        if (WIFEXITED(status))
            fprintf(stderr, PROG ": %s %d exited with status %d\n", k->what, k->index,
                    WEXITSTATUS(status));
        else
            fprintf(stderr, PROG ": %s %d was killed by signal %d\n", k->what, k->index,
                    WTERMSIG(status));
    }
}

/* The model's config (the folder's config.json, or the built-in one) and the fixed prompt. */
static int load_config(options_t *o)
{
    if (o->model != NULL) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/config.json", o->model);
        if (wsync_model_config_load(path, &o->cfg) != WSYNC_OK) {
            fprintf(stderr, PROG ": %s\n", wsync_last_error());
            return 1;
        }
    } else if (wsync_model_config_parse(builtin_config, strlen(builtin_config), &o->cfg) !=
               WSYNC_OK) {
        fprintf(stderr, PROG ": built-in config: %s\n", wsync_last_error());
        return 1;
    }
    o->nprompt = 8;
    for (int i = 0; i < o->nprompt; i++)
        o->prompt[i] = (int32_t)((1 + 37 * i) % o->cfg.vocab_size);
    return 0;
}

/* Refuse what the engine's layout refuses, before starting anyone. */
static int check_layout(const options_t *o)
{
    wsync_tp_options_t opts = WSYNC_TP_OPTIONS_INIT;
    wsync_target_t *t = NULL;
    size_t n = 0;

    if (strcmp(o->quant, "fp8-block") == 0) {
        opts.quant.scheme = WSYNC_QUANT_BLOCK;
        opts.quant.block_rows = opts.quant.block_cols = o->block;
    }
    for (int r = 0; r < o->tp; r++) {
        if (o->ep > 1) {
            opts.ep_size = o->ep;
            opts.ep_rank = r;
        }
        if (wsync_layout_tp_targets(&o->cfg, r, o->tp, &opts, &t, &n) != WSYNC_OK) {
            fprintf(stderr, PROG ": TP %d: %s\n", o->tp, wsync_last_error());
            return 1;
        }
        wsync_layout_targets_free(t, n);
    }
    return 0;
}

static void print_banner(const options_t *o, uint64_t nparams_total)
{
    char blk[32] = "";

    printf("wsync-demo: %s model (%s): hidden %lld, %lld layers, %lld heads / %lld kv, head_dim "
           "%lld, intermediate %lld, vocab %lld: %.2fM params\n",
           wsync_model_type_name(o->cfg.model_type), o->model ? o->model : "built in",
           (long long)o->cfg.hidden_size, (long long)o->cfg.num_hidden_layers,
           (long long)o->cfg.num_attention_heads, (long long)o->cfg.num_key_value_heads,
           (long long)o->cfg.head_dim, (long long)o->cfg.intermediate_size,
           (long long)o->cfg.vocab_size, (double)nparams_total / 1e6);
    if (o->cfg.num_experts > 0)
        printf("  %lld experts of width %lld, top %lld%s%s\n", (long long)o->cfg.num_experts,
               (long long)o->cfg.moe_intermediate_size, (long long)o->cfg.num_experts_per_tok,
               o->cfg.n_shared_experts > 0 ? ", shared experts" : "",
               o->cfg.kv_lora_rank > 0 ? ", multi-head latent attention" : "");
    if (strcmp(o->quant, "fp8-block") == 0)
        snprintf(blk, sizeof(blk), " %dx%d", o->block, o->block);
    printf("  %d trainer process%s (FSDP-%d, bf16) -> 1 engine of TP %d%s (%s%s, %s weights%s), "
           "%d steps, %d new tokens per step\n",
           o->trainers, o->trainers > 1 ? "es" : "", o->trainers, o->tp,
           o->ep > 1 ? " with EP" : "", o->cuda ? "CUDA, " : "", o->shadow ? "shadow" : "in place",
           strcmp(o->quant, "fp8-block") == 0 ? "FP8-E4M3 block" : "bf16", blk, o->steps,
           o->max_new);
    fflush(stdout);
}

/* Fork every trainer and engine rank (before any wsync object exists here), each with a pipe
 * for its reports and one for its steps (EOF on it means leave). */
static int spawn_all(const options_t *o, wsync_engine_comm_t *comm)
{
    fflush(NULL);
    for (int i = 0; i < o->trainers + o->tp; i++) {
        int out[2], go[2] = {-1, -1};
        int trainer = i < o->trainers;
        if (pipe(out) != 0 || pipe(go) != 0) {
            perror(PROG ": pipe");
            return 1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror(PROG ": fork");
            return 1;
        }
        if (pid == 0) {
            for (int k = 0; k < nkids; k++) {
                close(kids[k].out_fd);
                if (kids[k].go_fd >= 0)
                    close(kids[k].go_fd);
            }
            close(out[0]);
            close(go[1]);
            alarm((unsigned)(o->timeout_s * (o->steps + 2) + 60));
            int code = trainer ? trainer_main(o, i, go[0], out[1])
                               : engine_main(o, i - o->trainers, comm, go[0], out[1]);
            fflush(NULL);
            _exit(code);
        }
        close(out[1]);
        close(go[0]);
        kids[nkids].pid = pid;
        kids[nkids].out_fd = out[0];
        kids[nkids].go_fd = go[1];   /* trainers: steps to push; everyone: EOF means leave */
        kids[nkids].what = trainer ? "trainer" : "engine rank";
        kids[nkids].index = trainer ? i : i - o->trainers;
        nkids++;
    }
    return 0;
}

/* What one step left: the trainers' reports and every engine rank's. */
typedef struct {
    trainer_report_t first;      /* trainer 0's */
    double secs, bytes;          /* the slowest trainer's push; bytes delivered by all */
    engine_report_t *erep;       /* [tp] */
} step_reports_t;

/* Tell the trainers to push `step` and read every child's report. 0, or 1 with the reason on
 * stderr (a child that died or sent nothing before the deadline). */
static int collect_step(const options_t *o, int step, step_reports_t *sr)
{
    int64_t deadline = now_ms() + (int64_t)o->timeout_s * 1000 * 2;
    trainer_report_t trep;

    sr->secs = sr->bytes = 0;
    memset(&sr->first, 0, sizeof(sr->first));
    for (int i = 0; i < o->trainers; i++)
        if (write_all(kids[i].go_fd, &step, sizeof(step)) != 0)
            return 1;
    for (int i = 0; i < nkids; i++) {
        int r;
        if (i < o->trainers) {
            r = read_all(kids[i].out_fd, &trep, sizeof(trep), deadline);
            if (r == 0) {
                sr->bytes += (double)trep.bytes_delivered;
                sr->secs = trep.seconds > sr->secs ? trep.seconds : sr->secs;
                if (i == 0)
                    sr->first = trep;
            }
        } else {
            r = read_all(kids[i].out_fd, &sr->erep[i - o->trainers], sizeof(*sr->erep), deadline);
        }
        if (r != 0) {
            explain_child(&kids[i], r);
            return 1;
        }
    }
    return 0;
}

/* Check one step against the weights the definition gives (`full`, filled here): every rank
 * took this version, its targets hash as expected, and the tokens equal a single-process
 * engine's. Prints the step's line; returns 1 when it matched. */
static int check_step(const options_t *o, const model_t *m, int step, const step_reports_t *sr,
                      uint16_t *const *full, expected_t *ex)
{
    const engine_report_t *erep = sr->erep;
    int32_t ref[MAX_NEW];
    int ok = 1, weights_ok = 0, tokens_ok = 1;
    char why[256] = "", moved[32], toks[64] = "";
    size_t tn = 0;

    for (size_t p = 0; p < m->nparams; p++) {
        uint64_t n = numel(&m->params[p]);
        for (uint64_t e = 0; e < n; e++)
            full[p][e] = weight(m, p, e, (uint32_t)step);
    }
    for (int r = 0; r < o->tp; r++) {
        const engine_report_t *er = &erep[r];
        if (er->taken != (uint64_t)step || er->version != (uint64_t)step) {
            ok = 0;
            snprintf(why, sizeof(why), "rank %d took version %llu, generated with %llu", r,
                     (unsigned long long)er->taken, (unsigned long long)er->version);
            continue;
        }
        if (expected_hashes(o, m, full, r, ex) != 0 || ex->n != er->ntargets) {
            ok = 0;
            snprintf(why, sizeof(why), "rank %d: %d targets, expected %d", r, er->ntargets,
                     ex->n);
            continue;
        }
        int bad = -1;
        for (int i = 0; i < ex->n && bad < 0; i++)
            if (ex->hash[i] != er->hashes[i])
                bad = i;
        if (bad >= 0) {
            ok = 0;
            snprintf(why, sizeof(why), "rank %d: target %d's hash differs", r, bad);
        } else {
            weights_ok++;
        }
        if (er->ntokens != o->max_new || memcmp(er->tokens, erep[0].tokens,
                                                (size_t)o->max_new * sizeof(int32_t)) != 0)
            tokens_ok = 0;
    }
    if (reference_tokens(o, m, full, ref) != 0 ||
        memcmp(ref, erep[0].tokens, (size_t)o->max_new * sizeof(int32_t)) != 0)
        tokens_ok = 0;
    if (!tokens_ok && why[0] == '\0')
        snprintf(why, sizeof(why), "tokens differ from the single-process engine's");
    ok = ok && tokens_ok;
    for (int i = 0; i < o->max_new && i < 8; i++)
        tn += (size_t)snprintf(toks + tn, sizeof(toks) - tn, "%s%d", i ? " " : "",
                               erep[0].tokens[i]);
    human_bytes(sr->bytes, moved, sizeof(moved));
    printf("%4d %8llu %7s %11s %9.2f %8.2f  %-40s %s", step,
           (unsigned long long)sr->first.version, sr->first.scheme, moved, sr->secs * 1e3,
           sr->secs > 0 ? sr->bytes / sr->secs / 1e9 : 0.0, toks, ok ? "yes" : "NO");
    if (ok)
        printf(" (weights %d/%d ranks, tokens = 1-process engine)\n", weights_ok, o->tp);
    else
        printf(" (%s)\n", why);
    fflush(stdout);
    return ok;
}

/* Every child leaves when its go pipe closes (or is killed after a failure); all are reaped.
 * Returns 1 when one ended badly. */
static int reap_all(int failed, wsync_engine_comm_t *comm)
{
    for (int i = 0; i < nkids; i++)
        if (kids[i].go_fd >= 0)
            close(kids[i].go_fd);
    if (failed) {
        wsync_engine_comm_abort(comm, "the demo failed");
        kill_all();
    }
    for (int i = 0; i < nkids; i++) {
        int status;
        if (kids[i].pid <= 0)
            continue;
        if (waitpid(kids[i].pid, &status, 0) == kids[i].pid &&
            !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            fprintf(stderr, PROG ": %s %d ended with status %d\n", kids[i].what, kids[i].index,
                    WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
            failed = 1;
        }
        close(kids[i].out_fd);
    }
    return failed;
}

int main(int argc, char **argv)
{
    static options_t o;
    model_t m;
    wsync_engine_comm_t *comm = NULL;
    uint16_t **full = NULL;
    step_reports_t sr = {0};
    expected_t *ex = NULL;
    int rc, matched = 0, failed = 0;
    uint64_t nparams_total = 0;
    double total_bytes = 0, total_secs = 0;
    char scheme_seen[16] = "?";

    rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    signal(SIGPIPE, SIG_IGN);
    if (o.cuda)
        setenv("NCCL_NVLS_ENABLE", "0", 0);   /* NVLink multicast off on shared hosts */
    if (load_config(&o) != 0 || model_open(&o, &m) != 0)
        return 1;
    for (size_t p = 0; p < m.nparams; p++)
        nparams_total += numel(&m.params[p]);
    if (check_layout(&o) != 0) {
        model_close(&m);
        return 1;
    }
    print_banner(&o, nparams_total);

    /* what each step's check needs, before anyone is started */
    full = calloc(m.nparams, sizeof(*full));
    sr.erep = calloc((size_t)o.tp, sizeof(*sr.erep));
    ex = calloc(1, sizeof(*ex));
    failed = full == NULL || sr.erep == NULL || ex == NULL;
    for (size_t p = 0; !failed && p < m.nparams; p++)
        failed = (full[p] = malloc((size_t)numel(&m.params[p]) * 2)) == NULL;
    if (failed)
        fprintf(stderr, PROG ": no memory for the model's full weights (%.2fM params)\n",
                (double)nparams_total / 1e6);

    snprintf(o.coord, sizeof(o.coord), "127.0.0.1:%d", free_port());
    if (!failed && o.tp > 1 &&
        wsync_engine_comm_create(o.tp, &o.cfg, 0, o.timeout_s * 1000 + 10000, &comm) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_engine_last_error());
        failed = 1;
    }
    if (!failed)
        failed = spawn_all(&o, comm);
    if (!failed) {
        printf("%4s %8s %7s %11s %9s %8s  %-40s %s\n", "step", "version", "scheme", "moved",
               "sync ms", "GB/s", "tokens (first 8)", "match");
        fflush(stdout);
    }
    for (int step = 1; step <= o.steps && !failed; step++) {
        progress(step, o.steps, "pushing");
        failed = collect_step(&o, step, &sr);
        if (failed)
            break;
        progress(step, o.steps, "checking");
        snprintf(scheme_seen, sizeof(scheme_seen), "%s", sr.first.scheme);
        matched += check_step(&o, &m, step, &sr, full, ex);
        total_bytes += sr.bytes;
        total_secs += sr.secs;
    }
    progress(0, 0, NULL);
    failed = reap_all(failed, comm);

    rc = !failed && matched == o.steps ? 0 : 1;
    if (rc == 0)
        printf("all %d steps matched: every engine rank held exactly the trainers' weights, and "
               "generated the tokens of a single-process engine holding them\n", o.steps);
    else
        printf("%d of %d steps matched\n", matched, o.steps);
    if (o.json)
        printf("{\"ok\": %s, \"steps\": %d, \"matched\": %d, \"trainers\": %d, \"tp\": %d, \"ep\": %d, "
               "\"scheme\": \"%s\", \"quant\": \"%s\", \"mode\": \"%s\", \"device\": \"%s\", "
               "\"bytes\": %.0f, \"seconds\": %.6f, \"params\": %llu}\n",
               rc == 0 ? "true" : "false", o.steps, matched, o.trainers, o.tp,
               o.ep > 1 ? o.ep : 1, scheme_seen,
               o.quant, o.shadow ? "shadow" : "in-place", o.cuda ? "cuda" : "cpu", total_bytes,
               total_secs,
               (unsigned long long)nparams_total);
    for (size_t p = 0; full != NULL && p < m.nparams; p++)
        free(full[p]);
    free(full);
    free(sr.erep);
    free(ex);
    wsync_engine_comm_free(comm);
    model_close(&m);
    return rc;
}
