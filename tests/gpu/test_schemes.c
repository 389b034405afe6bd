/* The ipc and nccl schemes end to end on CUDA memory, through the public API: FSDP-N senders to
 * TP-T receivers (fused qkv_proj and gate_up_proj, vocab-parallel embeddings) with bf16 and
 * FP8-block targets, colocated (sender i and receiver i on GPU i mod G) and disaggregated
 * (senders and receivers on different GPUs), one process each. Every version has fresh data
 * (a hash of the param name, the version and the element index), the receivers' targets and
 * scales are poisoned (0xFF: NaN in bf16 and e4m3) before each version, and after each version
 * every receiver compares every byte with what the host computes: the same generator, and for
 * FP8 targets the CPU quantizer (reshard/fp8.h, the reference the CUDA kernels are checked
 * against). Three versions; each wait must report the version pushed.
 *
 * Mixture of experts (cases named "moe ..."): the tiny Qwen3-MoE and DeepSeek-V3 of
 * ../shared/testdata (configs built in) FSDP-2 -> TP-2 and -> EP-2, FusedMoE w13/w2 targets of 3
 * dims checked byte for byte against the per-expert params they slice, bf16 and FP8-block.
 *
 * Also: sender shards in memory from cuMemCreate (POSIX file descriptor handles, what PyTorch's
 * expandable segments use), through the driver API got at run time (no libcuda link); shards in
 * cudaMallocAsync memory, which no process can export, are staged through device buckets and must
 * arrive byte for byte; a host pointer described as WSYNC_MEM_CUDA must be refused with
 * WSYNC_ERR_INVALID naming the shard (and every other participant must get an error, not hang);
 * nccl groups where two participants share a GPU (colocated) must fail on every participant with
 * WSYNC_ERR_UNSUPPORTED naming the shared GPU (NCCL allows one rank per GPU); and a receiver
 * SIGKILLed in the middle of a push must make every survivor return an error that names it,
 * within the deadline.
 *
 * usage: test_schemes [--json PATH] [--no-bench] [--only ipc|nccl] [--case SUBSTRING]
 * Exit 0 when every case passed, 1 otherwise, 77 when there is no CUDA device. Needs no more
 * than one GPU; cases that need more say so and are skipped. Not a ctest: tests/gpu/run.sh runs
 * it on a GPU machine. --no-bench is accepted (run.sh passes it) and changes nothing. */
#include "reshard/fp8.h"
#include "tests/support/check.h"
#include "tests/gpu/gpu_cases.h"
#include "tests/gpu/cuda_check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_RANKS 16
#define VERSIONS 3
#define TIMEOUT_MS 15000       /* every wsync wait; the kill case uses KILL_TIMEOUT_MS */
#define KILL_TIMEOUT_MS 5000
#define CHILD_LIMIT_S 75       /* alarm in every child */
#define GROUP_LIMIT_MS 60000   /* the parent's wait for a group */

/* ------------------------------------------------------------------------------------------ */
/* Models                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Small Qwen3-like shapes: every TP split up to 4 keeps 128-row FP8 blocks inside one weight. */
static wsync_model_config_t model_small(void)
{
    wsync_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.model_type = WSYNC_MODEL_QWEN3;
    c.hidden_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 128;
    c.intermediate_size = 512;
    c.vocab_size = 1000; /* not a multiple of 64: vocab padding rows, zeroed once */
    c.max_position_embeddings = 4096;
    c.qk_norm = 1;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.dtype = WSYNC_DTYPE_BF16;
    return c;
}

/* About 120 MB of bf16: a push that lasts long enough to be interrupted. */
static wsync_model_config_t model_kill(void)
{
    wsync_model_config_t c = model_small();
    c.hidden_size = 1024;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.intermediate_size = 4096;
    c.vocab_size = 16384;
    return c;
}

/* The tiny mixtures of experts of ../shared/testdata, their config.json's values built here (no
 * file needed on the GPU machine): Qwen3-MoE (hf_qwen3_moe_tiny: 8 experts, top-2, moe_I 64)
 * and DeepSeek-V3 (hf_deepseek_v3_tiny: MLA with q_lora 64, kv_lora 32, a dense layer 0, 8
 * routed experts in 2 groups, one shared expert, the router's correction bias). Their widths
 * are below a 128-row FP8 block, so FP8 runs use model_moe_fp8: the Qwen3-MoE layout with
 * every TP or EP split up to 2 keeping blocks whole. */
static wsync_model_config_t model_qwen3_moe(void)
{
    wsync_model_config_t c = model_small();
    c.model_type = WSYNC_MODEL_QWEN3_MOE;
    c.vocab_size = 384;
    c.hidden_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.intermediate_size = 256;
    c.max_position_embeddings = 256;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 64;
    c.norm_topk_prob = 1;
    c.decoder_sparse_step = 1;
    return c;
}

static wsync_model_config_t model_deepseek_v3(void)
{
    wsync_model_config_t c = model_qwen3_moe();
    c.model_type = WSYNC_MODEL_DEEPSEEK_V3;
    c.num_hidden_layers = 3;
    c.num_key_value_heads = 4;
    c.qk_norm = 0;
    c.q_lora_rank = 64;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.head_dim = 48;            /* nope + rope, as the parser sets it for MLA */
    c.v_head_dim = 32;
    c.rope_interleave = 1;
    c.decoder_sparse_step = 0;
    c.n_shared_experts = 1;
    c.first_k_dense_replace = 1;
    c.moe_layer_freq = 1;
    c.n_group = 2;
    c.topk_group = 1;
    c.routed_scaling_factor = 2.5;
    c.scoring_func = WSYNC_ROUTER_SIGMOID;
    c.topk_method = WSYNC_TOPK_NOAUX_TC;
    c.router_bias = 1;
    return c;
}

static wsync_model_config_t model_moe_fp8(void)
{
    wsync_model_config_t c = model_qwen3_moe();
    c.hidden_size = 256;
    c.head_dim = 128;
    c.moe_intermediate_size = 256;
    return c;
}

typedef enum {
    MODEL_SMALL,
    MODEL_KILL,
    MODEL_QWEN3_MOE,
    MODEL_DEEPSEEK_V3,
    MODEL_MOE_FP8,
} model_id_t;

static wsync_model_config_t model_by_id(model_id_t id)
{
    switch (id) {
    case MODEL_KILL: return model_kill();
    case MODEL_QWEN3_MOE: return model_qwen3_moe();
    case MODEL_DEEPSEEK_V3: return model_deepseek_v3();
    case MODEL_MOE_FP8: return model_moe_fp8();
    default: return model_small();
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Data                                                                                         */
/* ------------------------------------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The nccl delta cases (issue 17) set this in their children: 0, every element takes a new
 * value in every version; N, from version 2 on about one element in N does, the others keep the
 * value they had (what an RL step does to most bf16 weights). */
static uint32_t g_sparse;

/* The version whose value element i of a param holds in version v, under g_sparse. */
static uint64_t sparse_version(uint64_t i, uint64_t v)
{
    while (v > 1 && mix64((i << 8) ^ v ^ 0x5D1A7Aull) % g_sparse != 0)
        v--;
    return v;
}

/* Elements [start, start+n) of param `name` in version v: finite, non-zero bf16 with
 * |x| in [2^-7, 2), different in every version (g_sparse: only some, each version). */
static void gen(const char *name, uint64_t v, uint64_t start, uint64_t n, uint16_t *out)
{
    uint64_t seed = XXH3_64bits_withSeed(name, strlen(name), 0xC0FFEEull + v);
    if (g_sparse) {   /* element by element (slow, small models only) */
        for (uint64_t i = start; i < start + n; i++) {
            uint64_t u = sparse_version(i, v);
            uint64_t sd = XXH3_64bits_withSeed(name, strlen(name), 0xC0FFEEull + u);
            uint16_t x = (uint16_t)(mix64(sd + (i >> 2) * 0xD1B54A32D192ED03ull) >> (16 * (i & 3)));
            *out++ = (uint16_t)((x & 0x8000u) | ((120u + ((x >> 7) & 7u)) << 7) | (x & 0x7Fu));
        }
        return;
    }
    for (uint64_t i = start; i < start + n; i++) {
        uint16_t x = (uint16_t)(mix64(seed + (i >> 2) * 0xD1B54A32D192ED03ull) >> (16 * (i & 3)));
        *out++ = (uint16_t)((x & 0x8000u) | ((120u + ((x >> 7) & 7u)) << 7) | (x & 0x7Fu));
    }
}

static uint64_t elems_of(const wsync_param_t *p, const wsync_box_t *b)
{
    uint64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= (uint64_t)b->len[d];
    return n;
}

/* Bytes of one element of a param: bf16, or f32 where a family keeps one (a router's correction
 * bias); an f32 param holds the generator's bf16 values widened, exactly. */
static size_t esz_of(const wsync_param_t *p) { return p->dtype == WSYNC_DTYPE_F32 ? 4 : 2; }

/* gen() in the param's dtype. */
static void gen_as(const wsync_param_t *p, uint64_t v, uint64_t start, uint64_t n, void *out)
{
    if (esz_of(p) == 2) {
        gen(p->name, v, start, n, out);
        return;
    }
    uint16_t *tmp = malloc((n ? n : 1) * 2);
    if (!tmp)
        abort();
    gen(p->name, v, start, n, tmp);
    for (uint64_t i = 0; i < n; i++)
        ((uint32_t *)out)[i] = (uint32_t)tmp[i] << 16;
    free(tmp);
}

/* The bytes target t holds after version v (out: wsync_target_bytes; scales: FP8 only).
 * A piece's param dims are the target's last ones: a [I, Hd] expert weight lands in a
 * [E_local, 2 I_p, Hd] FusedMoE w13 target at dst_start {j, r, 0}. FP8 targets of 3 dims are
 * quantized as their [prod(leading dims), last dim] matrix. */
static int expected(const wsync_target_t *t, uint64_t v, uint8_t *out, float *scales)
{
    uint64_t elems = wsync_target_bytes(t) / wsync_dtype_size(t->dtype);
    int fp8 = t->dtype == WSYNC_DTYPE_F8E4M3FN;
    int td = t->ndim;
    uint64_t tstride[WSYNC_MAX_DIMS];
    uint16_t *dense = calloc(elems ? elems : 1, 2);
    if (!dense)
        return -1;
    tstride[td - 1] = 1;
    for (int d = td - 2; d >= 0; d--)
        tstride[d] = tstride[d + 1] * (uint64_t)t->shape[d + 1];
    for (int k = 0; k < t->npieces; k++) {
        const wsync_piece_t *p = &t->pieces[k];
        int pd = p->param.ndim, lead = td - pd;
        if (pd < 1 || lead < 0) {
            fprintf(stderr, "%s piece %d: param %s has %d dims, the target %d\n", t->name, k,
                    p->param.name, pd, td);
            free(dense);
            return -1;
        }
        if (elems_of(&p->param, &p->src) == 0)
            continue;
        uint64_t pstride[WSYNC_MAX_DIMS], rows = 1;
        pstride[pd - 1] = 1;
        for (int d = pd - 2; d >= 0; d--)
            pstride[d] = pstride[d + 1] * (uint64_t)p->param.shape[d + 1];
        for (int d = 0; d < pd - 1; d++)
            rows *= (uint64_t)p->src.len[d];
        for (uint64_t r = 0; r < rows; r++) {
            uint64_t idx[WSYNC_MAX_DIMS] = {0}, rest = r, src = 0, dst = 0;
            for (int d = pd - 2; d >= 0; d--) {
                idx[d] = rest % (uint64_t)p->src.len[d];
                rest /= (uint64_t)p->src.len[d];
            }
            for (int d = 0; d < pd; d++)
                src += ((uint64_t)p->src.start[d] + idx[d]) * pstride[d];
            for (int d = 0; d < td; d++)
                dst += ((uint64_t)p->dst_start[d] + (d >= lead ? idx[d - lead] : 0)) * tstride[d];
            gen(p->param.name, v, src, (uint64_t)p->src.len[pd - 1], dense + dst);
        }
    }
    if (t->dtype == WSYNC_DTYPE_F32) {
        for (uint64_t i = 0; i < elems; i++)
            ((uint32_t *)(void *)out)[i] = (uint32_t)dense[i] << 16;
        free(dense);
        return 0;
    }
    if (!fp8) {
        memcpy(out, dense, elems * 2);
        free(dense);
        return 0;
    }
    float *x = malloc(elems * sizeof(float));
    uint64_t cols = (uint64_t)t->shape[td - 1], rows = elems / cols;
    int rc = -1;
    if (x) {
        for (uint64_t i = 0; i < elems; i++) {
            uint32_t u = (uint32_t)dense[i] << 16;
            memcpy(&x[i], &u, 4);
        }
        wsync_status_t st = wsync_quantize_f32(t->name, x, rows, cols, cols, &t->quant, t->dtype,
                                               out, cols, scales);
        rc = st == WSYNC_OK ? 0 : -1;
        if (st != WSYNC_OK)
            fprintf(stderr, "reference quantization of %s: %s\n", t->name, wsync_last_error());
    }
    free(x);
    free(dense);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* CUDA helpers                                                                                 */
/* ------------------------------------------------------------------------------------------ */


/* Device memory from cuMemCreate with POSIX fd handles, mapped read-write on `dev`. */
typedef struct {
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 addr_free;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
} vmm_api_t;

typedef struct {
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle handle;
} vmm_block_t;

static int vmm_load(vmm_api_t *api)
{
    static const struct {
        const char *name;
        size_t off;
    } syms[] = {
        {"cuMemCreate", offsetof(vmm_api_t, create)},
        {"cuMemRelease", offsetof(vmm_api_t, release)},
        {"cuMemAddressReserve", offsetof(vmm_api_t, reserve)},
        {"cuMemAddressFree", offsetof(vmm_api_t, addr_free)},
        {"cuMemMap", offsetof(vmm_api_t, map)},
        {"cuMemUnmap", offsetof(vmm_api_t, unmap)},
        {"cuMemSetAccess", offsetof(vmm_api_t, set_access)},
        {"cuMemGetAllocationGranularity", offsetof(vmm_api_t, granularity)},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion(syms[i].name, &fn, 10020,
                                                         cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL) {
            fprintf(stderr, "cudaGetDriverEntryPointByVersion(%s): %s (query %d)\n",
                    syms[i].name, cudaGetErrorString(e), (int)q);
            return -1;
        }
        memcpy((char *)api + syms[i].off, &fn, sizeof(fn));
    }
    return 0;
}

static int vmm_alloc(const vmm_api_t *api, int dev, size_t bytes, vmm_block_t *b)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CUresult r = api->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || gran == 0) {
        fprintf(stderr, "cuMemGetAllocationGranularity: error %d\n", (int)r);
        return -1;
    }
    b->size = (bytes + gran - 1) / gran * gran;
    if ((r = api->create(&b->handle, b->size, &prop, 0)) != CUDA_SUCCESS) {
        fprintf(stderr, "cuMemCreate(%zu bytes, POSIX fd handles) on GPU %d: error %d\n",
                b->size, dev, (int)r);
        return -1;
    }
    if ((r = api->reserve(&b->ptr, b->size, gran, 0, 0)) != CUDA_SUCCESS ||
        (r = api->map(b->ptr, b->size, 0, b->handle, 0)) != CUDA_SUCCESS) {
        fprintf(stderr, "cuMemAddressReserve/cuMemMap: error %d\n", (int)r);
        return -1;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = api->set_access(b->ptr, b->size, &acc, 1)) != CUDA_SUCCESS) {
        fprintf(stderr, "cuMemSetAccess: error %d\n", (int)r);
        return -1;
    }
    return 0;
}

static void vmm_free(const vmm_api_t *api, vmm_block_t *b)
{
    if (b->ptr) {
        api->unmap(b->ptr, b->size);
        api->addr_free(b->ptr, b->size);
    }
    if (b->handle)
        api->release(b->handle);
}

/* ------------------------------------------------------------------------------------------ */
/* Groups                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* ALLOC_HOST: plain malloc memory described as WSYNC_MEM_CUDA (must be refused) */
typedef enum { ALLOC_MALLOC, ALLOC_VMM, ALLOC_ASYNC, ALLOC_HOST } alloc_kind_t;

typedef struct {
    const char *name;
    const char *scheme;
    int nsenders, tp, replicas, colocated, fp8, scales_host;
    alloc_kind_t sender_alloc;
    int kill_receiver;         /* -1: none */
    int expect_error;          /* every participant must fail with an error, none hang */
    wsync_status_t error_status; /* expect_error: some participant fails with this status... */
    const char *error_has;     /* ...and an error text containing this */
    int big;                   /* model_kill() instead of model_small() */
    model_id_t model;          /* when big is 0: MODEL_SMALL or a mixture of experts */
    int ep;                    /* receivers hold whole experts (EP = TP) */
    int nan_v2;                /* sender 1 puts a NaN in layer 0's down_proj in version 2 */
    int in_place;              /* store: snapshot = 0 (the shards themselves are published) */
    int ngpu;
    int port;
    int rank;                  /* in the child: sender rank, or receiver rank */
} group_t;

/* Shared with every child of a group. */
typedef struct {
    atomic_int pushing;              /* version sender 0 is pushing now */
    atomic_llong killed_ms;          /* when the victim died */
    atomic_int joined;               /* receivers whose wsync_receiver_create returned */
    long long error_ms[2 * MAX_RANKS];
    int error_status[2 * MAX_RANKS];
    char error_text[2 * MAX_RANKS][400];
    int versions_right[MAX_RANKS];
} shared_t;

static shared_t *g_shared;
static char coord[64];

static int gpu_of_sender(const group_t *g, int i) { return g->colocated ? i % g->ngpu : i; }
static int gpu_of_receiver(const group_t *g, int j)
{
    return g->colocated ? j % g->ngpu : g->nsenders + j;
}

static void note_error(int slot, wsync_status_t st)
{
    g_shared->error_ms[slot] = proc_now_ms();
    g_shared->error_status[slot] = (int)st;
    snprintf(g_shared->error_text[slot], sizeof(g_shared->error_text[slot]), "%s",
             wsync_last_error());
}

#define NAN_PARAM "model.layers.0.mlp.down_proj.weight"

/* store groups: until every receiver checked `v` versions (bounded by the group's limit). */
static void store_wait_readers(const group_t *g, int v)
{
    long long until = proc_now_ms() + GROUP_LIMIT_MS;
    int nr = g->tp * g->replicas, low = 0;
    if (strcmp(g->scheme, "store") != 0 || v <= 0)
        return;
    while (proc_now_ms() < until) {
        low = v;
        for (int r = 0; r < nr; r++)
            if (g_shared->versions_right[r] < low)
                low = g_shared->versions_right[r];
        if (low >= v)
            return;
        usleep(2000);
    }
}

static int sender_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = gpu_of_sender(g, rank);
    wsync_model_config_t cfg = model_by_id(g->big ? MODEL_KILL : g->model);
    wsync_shard_t *shards = NULL;
    size_t n = 0, bytes = 0;
    size_t *off = NULL;
    uint8_t *block = NULL;
    uint8_t *host = NULL; /* off[] are byte offsets: keep this a byte pointer */
    vmm_api_t api;
    vmm_block_t vb = {0};
    cudaStream_t stream = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_status_t st;
    int failed_at = 0;

    check_failures = 0; /* a fresh count: the parent's is inherited through fork */
    CU_OK(cudaSetDevice(dev));
    CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, rank, g->nsenders, &shards, &n));
    off = calloc(n + 1, sizeof(size_t));
    for (size_t k = 0; k < n; k++) {
        off[k] = bytes;
        bytes += (elems_of(&shards[k].param, &shards[k].box) * esz_of(&shards[k].param) + 255) &
                 ~(size_t)255;
    }
    host = malloc(bytes + 2);
    if (g->sender_alloc == ALLOC_VMM) {
        CHECK(vmm_load(&api) == 0);
        CHECK(vmm_alloc(&api, dev, bytes + 256, &vb) == 0);
        block = (uint8_t *)(uintptr_t)vb.ptr;
    } else if (g->sender_alloc == ALLOC_HOST) {
        block = malloc(bytes + 256);
    } else if (g->sender_alloc == ALLOC_ASYNC) {
        CU_OK(cudaStreamCreate(&stream));
        CU_OK(cudaMallocAsync((void **)&block, bytes + 256, stream));
        CU_OK(cudaStreamSynchronize(stream));
    } else {
        CU_OK(cudaMalloc((void **)&block, bytes + 256));
    }
    if (check_failures || !block || !host)
        goto out;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = g->nsenders;
    sp.nreceivers = g->tp * g->replicas;
    sp.scheme = g->scheme;
    sp.timeout_ms = g->kill_receiver >= 0 ? KILL_TIMEOUT_MS : TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    if (g->big)
        sp.bucket_bytes = 4 << 20;
    int store = strcmp(g->scheme, "store") == 0;
    if (store)
        sp.snapshot = !g->in_place;
    if (store && g->fp8)
        sp.delta = "off";   /* a store resolves delta versions on, which keep FP8 on the wire off */
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    if (check_failures)
        goto out;
    for (size_t k = 0; k < n; k++) {
        wsync_shard_t sh = shards[k];
        sh.data = block + off[k];
        sh.mem = WSYNC_MEM_CUDA;
        sh.device = dev;
        st = wsync_sender_add_shard(s, &sh);
        if (st != WSYNC_OK && g->expect_error) { /* refused as soon as it is described */
            note_error(rank, st);
            if (g->sender_alloc == ALLOC_HOST) {
                const char *name = sh.param.name ? sh.param.name : "?";
                CHECK_MSG(st == WSYNC_ERR_INVALID, "sender %d: host memory as CUDA: %s, expected "
                          "WSYNC_ERR_INVALID (%s)", rank, wsync_status_name(st),
                          g_shared->error_text[rank]);
                CHECK_MSG(strstr(g_shared->error_text[rank], name) != NULL,
                          "sender %d: error \"%s\" does not name shard '%s'", rank,
                          g_shared->error_text[rank], name);
            }
            failed_at = -1;
            break;
        }
        CHECK_OK(st);
    }
    for (int v = 1; v <= VERSIONS && failed_at == 0; v++) {
        /* the store: receivers fetch the newest version when they like; lockstep here (every
         * receiver checked v - 1 before v is written), so that each takes every version */
        store_wait_readers(g, v - 1);
        /* fresh data: every element of every shard */
        for (size_t k = 0; k < n; k++) {
            uint64_t cnt = elems_of(&shards[k].param, &shards[k].box), rowe = 1;
            for (int d = 1; d < shards[k].param.ndim; d++)
                rowe *= (uint64_t)shards[k].param.shape[d];
            gen_as(&shards[k].param, (uint64_t)v, (uint64_t)shards[k].box.start[0] * rowe, cnt,
                   host + off[k]);
        }
        if (g->nan_v2 && v == 2 && rank == 1) {
            /* row 3, column 5 of this sender's rows of the weight: bf16 NaN */
            for (size_t k = 0; k < n; k++)
                if (strcmp(shards[k].param.name, NAN_PARAM) == 0)
                    ((uint16_t *)(void *)(host + off[k]))[3 * shards[k].param.shape[1] + 5] = 0x7fc0;
        }
        CU_OK(cudaMemcpy(block, host, bytes, cudaMemcpyHostToDevice));
        if (v == 1) {
            st = wsync_sender_setup(s);
            if (st != WSYNC_OK) {
                note_error(rank, st);
                failed_at = v;
                break;
            }
        }
        if (rank == 0)
            atomic_store(&g_shared->pushing, v);
        st = wsync_sender_push(s, (uint64_t)v);
        if (st != WSYNC_OK) {
            note_error(rank, st);
            failed_at = v;
            break;
        }
        if (store && g->fp8 && v >= 2) {
            /* FP8 on the wire: every reader told us its FP8 chunks (it read v - 1 first), so
             * this version's codes and scales were made here, beside the snapshot copied from
             * the GPU (in place: from the shards themselves); the readers check every byte */
            wsync_push_stats_t ps;
            uint64_t snap = 0;
            for (size_t k = 0; k < n && !g->in_place; k++)
                snap += (elems_of(&shards[k].param, &shards[k].box) *
                             wsync_dtype_size(shards[k].param.dtype) + 63) / 64 * 64;
            CHECK_OK(wsync_sender_stats(s, &ps));
            CHECK_MSG(ps.bytes_packed > snap, "store sender %d version %d: %llu bytes packed, the "
                      "snapshot alone is %llu: no FP8 codes and scales were made", rank, v,
                      (unsigned long long)ps.bytes_packed, (unsigned long long)snap);
            printf("   store sender %d version %d: %llu bytes of FP8 codes and scales\n", rank,
                   v, (unsigned long long)(ps.bytes_packed - snap));
            if (rank == 0 && v == 2)
                CHECK_MSG(wsync_sender_explain(s) != NULL &&
                              strstr(wsync_sender_explain(s), "FP8 on the wire: the store's") !=
                                  NULL,
                          "store sender 0: the explanation does not say FP8 on the wire:\n%s",
                          wsync_sender_explain(s) ? wsync_sender_explain(s) : "(none)");
        }
    }
    if (failed_at == 0) /* the store lives in the senders: stay until the readers are done */
        store_wait_readers(g, VERSIONS);
    if (g->kill_receiver < 0 && !g->expect_error && failed_at)
        fprintf(stderr, "sender %d: version %d failed: %s\n", rank, failed_at,
                g_shared->error_text[rank]);
    CHECK(g->kill_receiver >= 0 || g->expect_error || failed_at == 0);
    if ((g->kill_receiver >= 0 || g->expect_error) && failed_at == 0)
        CHECK_MSG(0, "sender %d: every push succeeded; expected an error", rank);
    if (rank == 0 && failed_at) {
        /* the coordinator stays until every receiver has joined (bounded), and a moment more,
         * so that late starters learn why rather than find nobody listening */
        long long until = proc_now_ms() + 10000;
        while (atomic_load(&g_shared->joined) < g->tp * g->replicas && proc_now_ms() < until)
            usleep(10000);
        usleep(1000000);
    }
out:
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    if (g->kill_receiver >= 0 && failed_at && strcmp(g->scheme, "nccl") == 0) {
        /* NCCL's kernels may still wait on the dead receiver (ncclCommAbort need not return
         * while one is gone): cudaFree would wait for them forever, so exit without it, as an
         * application would after such an error */
        wsync_layout_shards_free(shards, n);
        free(off);
        free(host);
        return check_failures ? 1 : 0;
    }
    if (g->sender_alloc == ALLOC_VMM)
        vmm_free(&api, &vb);
    else if (g->sender_alloc == ALLOC_ASYNC && block)
        cudaFreeAsync(block, stream);
    else if (g->sender_alloc == ALLOC_HOST)
        free(block);
    else if (block)
        cudaFree(block);
    wsync_layout_shards_free(shards, n);
    free(off);
    free(host);
    return check_failures ? 1 : 0;
}

static void on_progress_kill(void *arg, uint64_t version, uint64_t done, uint64_t total)
{
    (void)arg;
    (void)total;
    if (version == 2 && done > 0) {
        atomic_store(&g_shared->killed_ms, proc_now_ms());
        raise(SIGKILL); /* die with part of version 2 landed */
    }
}

/* The victim's second way to die mid-push, for schemes that report no progress: shortly after
 * sender 0 starts pushing version 2. */
static void *killer_thread(void *arg)
{
    (void)arg;
    while (atomic_load(&g_shared->pushing) < 2)
        usleep(200);
    usleep(3000);
    atomic_store(&g_shared->killed_ms, proc_now_ms());
    raise(SIGKILL);
    return NULL;
}

static int receiver_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = gpu_of_receiver(g, rank), slot = MAX_RANKS + rank;
    int victim = g->kill_receiver == rank;
    wsync_model_config_t cfg = model_by_id(g->big ? MODEL_KILL : g->model);
    wsync_target_t *tg = NULL;
    size_t n = 0;
    uint8_t **data = NULL;
    float **scales = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_status_t st;
    int failed = 0;

    check_failures = 0;
    CU_OK(cudaSetDevice(dev));
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    if (g->fp8) {
        opt.quant.scheme = WSYNC_QUANT_BLOCK;
        opt.quant_dtype = WSYNC_DTYPE_F8E4M3FN;
    }
    if (g->ep) { /* whole experts over the replica's TP ranks */
        opt.ep_size = g->tp;
        opt.ep_rank = rank % g->tp;
    }
    CHECK_OK(wsync_layout_tp_targets(&cfg, rank % g->tp, g->tp, &opt, &tg, &n));
    if (check_failures)
        goto out;
    data = calloc(n, sizeof(*data));
    scales = calloc(n, sizeof(*scales));
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    rp.coordinator = coord;
    rp.rank = rank;
    rp.nreceivers = g->tp * g->replicas;
    rp.timeout_ms = g->kill_receiver >= 0 ? KILL_TIMEOUT_MS : TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    if (victim) {
        pthread_t th;
        rp.progress = on_progress_kill;
        pthread_create(&th, NULL, killer_thread, NULL);
    }
    st = wsync_receiver_create(ctx, &rp, &rv);
    atomic_fetch_add(&g_shared->joined, 1);
    if (st != WSYNC_OK && g->expect_error) { /* the failing sender may already have gone */
        note_error(slot, st);
        goto out;
    }
    CHECK_OK(st);
    if (check_failures)
        goto out;
    for (size_t k = 0; k < n; k++) {
        wsync_target_t t = tg[k];
        size_t ns = wsync_target_scale_count(&t);
        CU_OK(cudaMalloc((void **)&data[k], wsync_target_bytes(&t)));
        t.data = data[k];
        t.mem = WSYNC_MEM_CUDA;
        t.device = dev;
        if (t.quant.scheme != WSYNC_QUANT_NONE) {
            if (g->scales_host) {
                scales[k] = malloc(ns * sizeof(float));
                t.quant.scales_mem = WSYNC_MEM_HOST;
            } else {
                CU_OK(cudaMalloc((void **)&scales[k], ns * sizeof(float)));
                t.quant.scales_mem = WSYNC_MEM_CUDA;
            }
            t.quant.scales = scales[k];
        }
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    for (int v = 1; v <= VERSIONS && !failed; v++) {
        /* poison: a byte this version does not write cannot pass for data */
        for (size_t k = 0; k < n; k++) {
            /* the library zeroes what no piece covers (vocab padding) once, at setup: poison it
             * before the first version only, and afterwards only the pieces' boxes */
            if (v == 1 || tg[k].ndim > 2)
                CU_OK(cudaMemset(data[k], 0xFF, wsync_target_bytes(&tg[k])));
            else
                for (int p = 0; p < tg[k].npieces; p++) {
                    const wsync_piece_t *pc = &tg[k].pieces[p];
                    size_t esz = wsync_dtype_size(tg[k].dtype);
                    size_t cols = tg[k].ndim == 2 ? (size_t)tg[k].shape[1] : 0;
                    if (tg[k].ndim == 1)
                        CU_OK(cudaMemset((uint8_t *)data[k] + (size_t)pc->dst_start[0] * esz, 0xFF,
                                         (size_t)pc->src.len[0] * esz));
                    else
                        CU_OK(cudaMemset2D((uint8_t *)data[k] +
                                               ((size_t)pc->dst_start[0] * cols +
                                                (size_t)pc->dst_start[1]) * esz,
                                           cols * esz, 0xFF, (size_t)pc->src.len[1] * esz,
                                           (size_t)pc->src.len[0]));
                }
            if (scales[k] && g->scales_host)
                memset(scales[k], 0xFF, wsync_target_scale_count(&tg[k]) * sizeof(float));
            else if (scales[k])
                CU_OK(cudaMemset(scales[k], 0xFF, wsync_target_scale_count(&tg[k]) * 4));
        }
        CU_OK(cudaDeviceSynchronize());
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, -1, &got);
        if (st != WSYNC_OK) {
            note_error(slot, st);
            failed = v;
            break;
        }
        CHECK_MSG(got == (uint64_t)v, "receiver %d: wait reported version %llu, expected %d",
                  rank, (unsigned long long)got, v);
        CHECK(wsync_receiver_version(rv) == (uint64_t)v);
        int wrong = 0;
        for (size_t k = 0; k < n; k++) {
            size_t bytes = wsync_target_bytes(&tg[k]), ns = scales[k] ?
                                                                wsync_target_scale_count(&tg[k]) : 0;
            uint8_t *want = malloc(bytes), *have = malloc(bytes);
            float *want_s = malloc((ns + 1) * 4), *have_s = malloc((ns + 1) * 4);
            CHECK(expected(&tg[k], (uint64_t)v, want, want_s) == 0);
            CU_OK(cudaMemcpy(have, data[k], bytes, cudaMemcpyDeviceToHost));
            if (ns && g->scales_host)
                memcpy(have_s, scales[k], ns * 4);
            else if (ns)
                CU_OK(cudaMemcpy(have_s, scales[k], ns * 4, cudaMemcpyDeviceToHost));
            if (memcmp(want, have, bytes) != 0 || (ns && memcmp(want_s, have_s, ns * 4) != 0)) {
                size_t i = 0;
                while (i < bytes && want[i] == have[i])
                    i++;
                if (wrong++ < 4)
                    fprintf(stderr,
                            "receiver %d (GPU %d) version %d: target %s differs (%s byte %zu of "
                            "%zu: 0x%02x, expected 0x%02x)\n",
                            rank, dev, v, tg[k].name, i < bytes ? "first" : "scales; bytes equal,",
                            i < bytes ? i : 0, bytes, i < bytes ? have[i] : 0,
                            i < bytes ? want[i] : 0);
            }
            free(want);
            free(have);
            free(want_s);
            free(have_s);
        }
        CHECK_MSG(wrong == 0, "receiver %d: %d targets differ in version %d", rank, wrong, v);
        if (!wrong)
            g_shared->versions_right[rank]++;
    }
    if (g->kill_receiver < 0 && !g->expect_error && failed)
        fprintf(stderr, "receiver %d: version %d failed: %s\n", rank, failed,
                g_shared->error_text[slot]);
    CHECK(g->kill_receiver >= 0 || g->expect_error || !failed);
    if (g->expect_error && !failed)
        CHECK_MSG(0, "receiver %d: every version arrived; expected an error", rank);
out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    /* after a peer died under NCCL, its kernels may never end: no cudaFree (see sender_main) */
    for (size_t k = 0; data && k < n && !(g->kill_receiver >= 0 && failed &&
                                           strcmp(g->scheme, "nccl") == 0); k++) {
        cudaFree(data[k]);
        if (scales[k] && g->scales_host)
            free(scales[k]);
        else if (scales[k])
            cudaFree(scales[k]);
    }
    free(data);
    free(scales);
    wsync_layout_targets_free(tg, n);
    return check_failures ? 1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static gpu_cases_t g_cases;   /* the command line, the GPU count, the table of cases */

static int wanted(const group_t *g)
{
    if (g_cases.only && strcmp(g_cases.only, g->scheme) != 0)
        return 0;
    if (g_cases.match && !strstr(g->name, g_cases.match))
        return 0;
    return 1;
}

static int gpus_needed(const group_t *g)
{
    return g->colocated ? 1 : g->nsenders + g->tp * g->replicas;
}

/* Runs one group; returns 0 if every check passed. */
static void run_group(group_t g)
{
    gpu_case_t *row = gpu_cases_add(&g_cases);
    snprintf(row->name, sizeof(row->name), "%s", g.name);
    if (gpus_needed(&g) > g_cases.ngpu) {
        row->result = "skipped";
        snprintf(row->why, sizeof(row->why), "needs %d GPUs, %d visible", gpus_needed(&g),
                 g_cases.ngpu);
        printf("-- %s: skipped (%s)\n", g.name, row->why);
        fflush(stdout);
        return;
    }
    g.ngpu = g_cases.ngpu;
    memset(g_shared, 0, sizeof(*g_shared));
    g.port = proc_free_port();
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", g.port);
    int nr = g.tp * g.replicas, np = g.nsenders + nr, codes[2 * MAX_RANKS];
    pid_t pids[2 * MAX_RANKS];
    group_t cfg[2 * MAX_RANKS];
    long long t0 = proc_now_ms();
    printf("-- %s: %d sender%s -> %d receiver%s, scheme %s\n", g.name, g.nsenders,
           g.nsenders == 1 ? "" : "s", nr, nr == 1 ? "" : "s", g.scheme);
    fflush(stdout);
    for (int i = 0; i < np; i++) {
        cfg[i] = g;
        cfg[i].rank = i < g.nsenders ? i : i - g.nsenders;
        pids[i] = proc_spawn(i < g.nsenders ? sender_main : receiver_main, &cfg[i],
                             CHILD_LIMIT_S);
    }
    proc_wait_all(pids, np, GROUP_LIMIT_MS, codes);
    row->seconds = (double)(proc_now_ms() - t0) / 1000.0;
    int before = check_failures;
    char victim[32] = "";
    if (g.kill_receiver >= 0)
        snprintf(victim, sizeof(victim), "receiver %d", g.kill_receiver);
    for (int i = 0; i < np; i++) {
        int is_recv = i >= g.nsenders, r = is_recv ? i - g.nsenders : i;
        int slot = is_recv ? MAX_RANKS + r : r;
        char who[32];
        snprintf(who, sizeof(who), "%s %d", is_recv ? "receiver" : "sender", r);
        if (is_recv && r == g.kill_receiver) {
            CHECK_MSG(codes[i] == 128 + SIGKILL, "%s exited with %d, expected SIGKILL", who,
                      codes[i]);
            continue;
        }
        CHECK_MSG(codes[i] == 0, "%s exited with %d", who, codes[i]);
        if (g.kill_receiver >= 0) {
            const char *text = g_shared->error_text[slot];
            long long dt = g_shared->error_ms[slot] - atomic_load(&g_shared->killed_ms);
            CHECK_MSG(g_shared->error_status[slot] != 0, "%s saw no error", who);
            CHECK_MSG(strstr(text, victim) != NULL, "%s: error \"%s\" does not name %s", who,
                      text, victim);
            CHECK_MSG(dt < KILL_TIMEOUT_MS + 5000, "%s learned of the loss %lld ms after it", who,
                      dt);
            printf("   %s: %s after %lld ms: %s\n", who,
                   wsync_status_name((wsync_status_t)g_shared->error_status[slot]), dt, text);
        } else if (g.expect_error) {
            const char *text = g_shared->error_text[slot];
            CHECK_MSG(g_shared->error_status[slot] != 0, "%s saw no error", who);
            CHECK_MSG(text[0] != '\0', "%s: empty error text", who);
            printf("   %s: %s: %s\n", who,
                   wsync_status_name((wsync_status_t)g_shared->error_status[slot]), text);
        } else if (is_recv) {
            CHECK_MSG(g_shared->versions_right[r] == VERSIONS, "%s: %d of %d versions right",
                      who, g_shared->versions_right[r], VERSIONS);
        }
    }
    if (g.expect_error) {
        /* at least one participant says what is wrong, with the expected status */
        int found = 0;
        for (int i = 0; i < np && !found; i++) {
            int is_recv = i >= g.nsenders, r = is_recv ? i - g.nsenders : i;
            int slot = is_recv ? MAX_RANKS + r : r;
            found = g_shared->error_status[slot] == (int)g.error_status &&
                    strstr(g_shared->error_text[slot], g.error_has) != NULL;
        }
        CHECK_MSG(found, "no participant failed with %s and an error containing \"%s\"",
                  wsync_status_name(g.error_status), g.error_has);
    }
    row->result = check_failures == before ? "pass" : "FAIL";
    printf("-- %s: %s in %.1f s\n", g.name, row->result, row->seconds);
    fflush(stdout);
}

static void run_cases(void)
{
    static const char *schemes[] = {"ipc", "nccl"};
    for (int si = 0; si < 2; si++) {
        const char *sc = schemes[si];
        for (int fp8 = 0; fp8 <= 1; fp8++) {
            /* colocated: FSDP-G -> TP-G on the same G GPUs (2 -> 2 on one GPU) */
            int c = g_cases.ngpu >= 4 ? 4 : g_cases.ngpu >= 2 ? 2 : 2;
            group_t g = {.scheme = sc, .nsenders = c, .tp = c, .replicas = 1, .colocated = 1,
                         .fp8 = fp8, .kill_receiver = -1};
            int nccl = strcmp(sc, "nccl") == 0;
            if (nccl) { /* one rank per GPU: refused on every participant, naming the GPU */
                g.expect_error = 1;
                g.error_status = WSYNC_ERR_UNSUPPORTED;
                g.error_has = "share GPU";
            }
            char name[96];
            snprintf(name, sizeof(name), "%s colocated FSDP-%d -> TP-%d %s%s", sc, c, c,
                     fp8 ? "fp8-block" : "bf16", nccl ? ": clear error (GPU shared)" : "");
            g.name = strdup(name);
            if (wanted(&g))
                run_group(g);
            /* disaggregated: FSDP-2 -> TP-2 on 4 GPUs, FSDP-1 -> TP-1 on 2 */
            int d = g_cases.ngpu >= 4 ? 2 : 1;
            g = (group_t){.scheme = sc, .nsenders = d, .tp = d, .replicas = 1, .fp8 = fp8,
                          .kill_receiver = -1};
            snprintf(name, sizeof(name), "%s disaggregated FSDP-%d -> TP-%d %s", sc, d, d,
                     fp8 ? "fp8-block" : "bf16");
            g.name = strdup(name);
            if (wanted(&g))
                run_group(g);
        }
        /* fan-out: one sender to 3 replicas (TP-1) on their own GPUs, FP8 scales on the host */
        group_t f = {.scheme = sc, .nsenders = 1, .tp = 1, .replicas = 3, .fp8 = 1,
                     .scales_host = 1, .kill_receiver = -1};
        char name[96];
        snprintf(name, sizeof(name), "%s fan-out 1 -> 3 replicas fp8-block, host scales", sc);
        f.name = strdup(name);
        if (wanted(&f))
            run_group(f);
        /* a receiver killed mid-push (nccl: on GPUs of their own, since nccl refuses a shared
         * GPU: FSDP-2 -> TP-2 on 4, FSDP-1 -> TP-1 on 2 or 3, the sender the only survivor) */
        int kn = strcmp(sc, "nccl") != 0 || g_cases.ngpu >= 4 ? 2 : 1;
        group_t k = {.scheme = sc, .nsenders = kn, .tp = kn, .replicas = 1,
                     .colocated = strcmp(sc, "nccl") != 0, .kill_receiver = kn - 1, .big = 1};
        snprintf(name, sizeof(name), "%s receiver %d killed mid-push", sc, kn - 1);
        k.name = strdup(name);
        if (wanted(&k))
            run_group(k);
    }
    /* the store on CUDA memory (issue 19.6), FSDP-2 -> TP-2 sharing GPUs: snapshots copied from
     * the GPU (bf16 and fp8-block targets) and the shards published in place (registered where
     * UCX/libfabric take CUDA memory, else staged); fp8-block with FP8 on the wire (delta off):
     * the senders quantize from the snapshot, or in place from the shards by way of the host,
     * and the readers copy codes and scales to the GPU */
    for (int c = 0; c < 4; c++) {
        group_t g = {.scheme = "store", .nsenders = 2, .tp = 2, .replicas = 1, .colocated = 1,
                     .fp8 = c == 1 || c == 3, .in_place = c >= 2, .kill_receiver = -1};
        char name[96];
        snprintf(name, sizeof(name), "store colocated FSDP-2 -> TP-2 %s, %s",
                 g.fp8 ? "fp8-block" : "bf16", g.in_place ? "in place" : "snapshots");
        g.name = strdup(name);
        if (wanted(&g))
            run_group(g);
    }
    /* mixture of experts (issue 16), the tiny Qwen3-MoE and DeepSeek-V3: FSDP-2 -> TP-2 (every
     * expert split inside, I_p = I / 2) and -> EP-2 (whole experts per receiver, 3-D FusedMoE
     * w13/w2 targets) through ipc colocated, and through nccl disaggregated (FSDP-2 -> EP-2 on
     * 4 GPUs, FSDP-1 -> EP-1 on 2 or 3); FP8-block targets on the wider model_moe_fp8 */
    static const struct {
        model_id_t id;
        const char *name;
        int fp8;
    } moes[] = {{MODEL_QWEN3_MOE, "qwen3-moe-tiny", 0},
                {MODEL_DEEPSEEK_V3, "deepseek-v3-tiny", 0},
                {MODEL_MOE_FP8, "qwen3-moe-fp8", 1}};
    for (size_t mi = 0; mi < sizeof(moes) / sizeof(moes[0]); mi++) {
        for (int ep = moes[mi].fp8; ep <= 1; ep++) {
            group_t g = {.scheme = "ipc", .nsenders = 2, .tp = 2, .replicas = 1, .colocated = 1,
                         .fp8 = moes[mi].fp8, .model = moes[mi].id, .ep = ep,
                         .kill_receiver = -1};
            char name[96];
            snprintf(name, sizeof(name), "moe ipc colocated FSDP-2 -> %s-2 %s %s",
                     ep ? "EP" : "TP", moes[mi].name, moes[mi].fp8 ? "fp8-block" : "bf16");
            g.name = strdup(name);
            if (wanted(&g))
                run_group(g);
        }
        int d = g_cases.ngpu >= 4 ? 2 : 1;
        group_t g = {.scheme = "nccl", .nsenders = d, .tp = d, .replicas = 1,
                     .fp8 = moes[mi].fp8, .model = moes[mi].id, .ep = 1, .kill_receiver = -1};
        char name[96];
        snprintf(name, sizeof(name), "moe nccl disaggregated FSDP-%d -> EP-%d %s %s", d, d,
                 moes[mi].name, moes[mi].fp8 ? "fp8-block" : "bf16");
        g.name = strdup(name);
        if (wanted(&g))
            run_group(g);
    }
    /* ipc, FP8 targets quantized straight from the senders' shards: a NaN in version 2 must
     * fail it with NONFINITE naming the target and the element in the target's own rows (sender
     * 1 holds rows 128.. of down_proj: its row 3 is row 131; receiver 0 takes columns 0..255) */
    group_t nanc = {.name = "ipc colocated FSDP-2 -> TP-2 fp8-block, NaN in version 2: NONFINITE",
                    .scheme = "ipc", .nsenders = 2, .tp = 2, .replicas = 1, .colocated = 1,
                    .fp8 = 1, .kill_receiver = -1, .nan_v2 = 1, .expect_error = 1,
                    .error_status = WSYNC_ERR_NONFINITE,
                    .error_has = NAN_PARAM ": NaN at row 131, column 5"};
    if (wanted(&nanc))
        run_group(nanc);
    /* ipc: shards in cuMemCreate memory (POSIX fds); in cudaMallocAsync memory, which cannot be
     * exported and is staged through device buckets; and host memory said to be CUDA memory */
    group_t v = {.name = "ipc cuMemCreate (POSIX fd) shards, FSDP-2 -> TP-2 fp8-block",
                 .scheme = "ipc", .nsenders = 2, .tp = 2, .replicas = 1, .colocated = 1,
                 .fp8 = 1, .sender_alloc = ALLOC_VMM, .kill_receiver = -1};
    if (wanted(&v))
        run_group(v);
    group_t a = {.name = "ipc cudaMallocAsync shards (staged), FSDP-1 -> TP-1 bf16",
                 .scheme = "ipc", .nsenders = 1, .tp = 1, .replicas = 1, .colocated = 1,
                 .sender_alloc = ALLOC_ASYNC, .kill_receiver = -1};
    if (wanted(&a))
        run_group(a);
    group_t h = {.name = "ipc host pointer as WSYNC_MEM_CUDA: clear error", .scheme = "ipc",
                 .nsenders = 1, .tp = 1, .replicas = 1, .colocated = 1,
                 .sender_alloc = ALLOC_HOST, .kill_receiver = -1, .expect_error = 1,
                 .error_status = WSYNC_ERR_INVALID, .error_has = "host memory"};
    if (wanted(&h))
        run_group(h);
}

/* ------------------------------------------------------------------------------------------ */
/* nccl delta versions (issue 17)                                                               */
/* ------------------------------------------------------------------------------------------ */

/* FSDP-d -> TP-d on GPUs of their own (senders 0 .. d-1, receivers d .. 2d-1), delta = on,
 * DELTA_VERSIONS versions of which about one element in DELTA_SPARSE changes each time; every
 * version byte-compared with expected() (the same generator), and the sender's stats must show
 * deltas: from version 2 on the base is the version before and the wire carries under a quarter
 * of the bytes delivered. Variants: a receiver that re-points a target after version 2 (poisoned
 * 0xFF: version 3 must come to it in full, or it fails its hash), and a corrupted delta (fault
 * delta.encoded:corrupt@1 on sender 0: version 2 must fail with INTEGRITY naming the param on
 * the receiver that took it; a new group then takes version 3 right). */
#define DELTA_VERSIONS 4
#define DELTA_SPARSE 50
enum { DELTA_BASIC = 0, DELTA_REPOINT = 1, DELTA_CORRUPT = 2 };
static int g_delta_variant;
static char coord2[64];                /* DELTA_CORRUPT: the group made after the failure */

static int delta_sender_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = gpu_of_sender(g, rank), failed_at = 0;
    wsync_model_config_t cfg = model_small();
    wsync_shard_t *shards = NULL;
    size_t n = 0, bytes = 0, *off = NULL;
    uint8_t *block = NULL, *host = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_status_t st;

    check_failures = 0;
    g_sparse = DELTA_SPARSE;
    if (g_delta_variant == DELTA_CORRUPT && rank == 0)
        setenv("WSYNC_FAULT", "delta.encoded:corrupt@1", 1);
    CU_OK(cudaSetDevice(dev));
    CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, rank, g->nsenders, &shards, &n));
    off = calloc(n + 1, sizeof(size_t));
    for (size_t k = 0; k < n; k++) {
        off[k] = bytes;
        bytes += (elems_of(&shards[k].param, &shards[k].box) * esz_of(&shards[k].param) + 255) &
                 ~(size_t)255;
    }
    host = malloc(bytes + 2);
    CU_OK(cudaMalloc((void **)&block, bytes + 256));
    if (check_failures || !host)
        goto out;
    for (int v = 1; v <= DELTA_VERSIONS; v++) {
        if (s == NULL) {   /* the first group, or the one made after the corrupted version */
            wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
            sp.coordinator = v == 1 ? coord : coord2;
            sp.rank = rank;
            sp.nranks = g->nsenders;
            sp.nreceivers = g->tp;
            sp.scheme = g->scheme;   /* nccl, or ipc (run_ipc_delta_case) */
            sp.delta = "on";
            sp.timeout_ms = TIMEOUT_MS;
            sp.heartbeat_ms = 200;
            CHECK_OK(wsync_ctx_create(NULL, &ctx));
            CHECK_OK(wsync_sender_create(ctx, &sp, &s));
            for (size_t k = 0; k < n && !check_failures; k++) {
                wsync_shard_t sh = shards[k];
                sh.data = block + off[k];
                sh.mem = WSYNC_MEM_CUDA;
                sh.device = dev;
                CHECK_OK(wsync_sender_add_shard(s, &sh));
            }
            if (check_failures)
                goto out;
        }
        for (size_t k = 0; k < n; k++) {
            uint64_t cnt = elems_of(&shards[k].param, &shards[k].box), rowe = 1;
            for (int d = 1; d < shards[k].param.ndim; d++)
                rowe *= (uint64_t)shards[k].param.shape[d];
            gen_as(&shards[k].param, (uint64_t)v, (uint64_t)shards[k].box.start[0] * rowe, cnt,
                   host + off[k]);
        }
        CU_OK(cudaMemcpy(block, host, bytes, cudaMemcpyHostToDevice));
        st = wsync_sender_setup(s);   /* once per group: a no-op after the first */
        if (st == WSYNC_OK)
            st = wsync_sender_push(s, (uint64_t)v);
        if (st != WSYNC_OK) {
            note_error(rank, st);
            failed_at = v;
            if (g_delta_variant == DELTA_CORRUPT && v == 2) {   /* expected: a new group */
                wsync_sender_free(s);
                wsync_ctx_free(ctx);
                s = NULL;
                ctx = NULL;
                unsetenv("WSYNC_FAULT");
                continue;
            }
            fprintf(stderr, "delta sender %d: version %d failed: %s\n", rank, v,
                    g_shared->error_text[rank]);
            CHECK(0);
            break;
        }
        wsync_push_stats_t ps;
        CHECK_OK(wsync_sender_stats(s, &ps));
        /* after the corrupted version the new group starts full again */
        int first = v == 1 || (g_delta_variant == DELTA_CORRUPT && v == 3);
        CHECK_MSG(ps.base_version == (first ? 0 : (uint64_t)v - 1), "sender %d version %d: "
                  "base %llu", rank, v, (unsigned long long)ps.base_version);
        /* a receiver that re-pointed a target holds no version: version 3 goes full to it */
        if (!first && !(g_delta_variant == DELTA_REPOINT && v == 3))
            CHECK_MSG(ps.bytes_encoded > 0 && ps.bytes_wire * 4 < ps.bytes_delivered,
                      "sender %d version %d: %llu bytes on the wire (%llu encoded) for %llu "
                      "delivered: not a delta", rank, v, (unsigned long long)ps.bytes_wire,
                      (unsigned long long)ps.bytes_encoded,
                      (unsigned long long)ps.bytes_delivered);
        printf("   sender %d version %d: base %llu, wire %llu bytes (encoded %llu), delivered "
               "%llu\n", rank, v, (unsigned long long)ps.base_version,
               (unsigned long long)ps.bytes_wire, (unsigned long long)ps.bytes_encoded,
               (unsigned long long)ps.bytes_delivered);
        fflush(stdout);
    }
    if (g_delta_variant == DELTA_CORRUPT)
        CHECK_MSG(failed_at == 2, "sender %d: the corrupted version did not fail", rank);
out:
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    cudaFree(block);
    free(host);
    free(off);
    wsync_layout_shards_free(shards, n);
    return check_failures ? 1 : 0;
}

/* Every target of ours against expected(v); returns how many differ. */
static int delta_compare(int rank, wsync_target_t *tg, uint8_t **data, size_t n, int v)
{
    int wrong = 0;
    for (size_t k = 0; k < n; k++) {
        size_t bytes = wsync_target_bytes(&tg[k]);
        uint8_t *want = malloc(bytes), *have = malloc(bytes);
        CHECK(expected(&tg[k], (uint64_t)v, want, NULL) == 0);
        cudaError_t ce = cudaMemcpy(have, data[k], bytes, cudaMemcpyDeviceToHost);
        CHECK_MSG(ce == cudaSuccess, "cudaMemcpy: %s", cudaGetErrorString(ce));
        if ((ce != cudaSuccess || memcmp(want, have, bytes) != 0) && wrong++ < 4)
            fprintf(stderr, "delta receiver %d version %d: target %s differs\n", rank, v,
                    tg[k].name);
        free(want);
        free(have);
    }
    return wrong;
}

static int delta_receiver_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = gpu_of_receiver(g, rank), slot = MAX_RANKS + rank, failed = 0;
    wsync_model_config_t cfg = model_small();
    wsync_target_t *tg = NULL;
    size_t n = 0;
    uint8_t **data = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_status_t st;

    check_failures = 0;
    g_sparse = DELTA_SPARSE;
    CU_OK(cudaSetDevice(dev));
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    CHECK_OK(wsync_layout_tp_targets(&cfg, rank, g->tp, &opt, &tg, &n));
    if (check_failures)
        goto out;
    data = calloc(n, sizeof(*data));
    for (size_t k = 0; k < n; k++) {
        CU_OK(cudaMalloc((void **)&data[k], wsync_target_bytes(&tg[k])));
        CU_OK(cudaMemset(data[k], 0xFF, wsync_target_bytes(&tg[k])));
    }
    for (int v = 1; v <= DELTA_VERSIONS; v++) {
        if (rv == NULL) {
            wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
            rp.coordinator = v == 1 ? coord : coord2;
            rp.rank = rank;
            rp.nreceivers = g->tp;
            rp.delta = "on";
            rp.timeout_ms = TIMEOUT_MS;
            rp.heartbeat_ms = 200;
            CHECK_OK(wsync_ctx_create(NULL, &ctx));
            CHECK_OK(wsync_receiver_create(ctx, &rp, &rv));
            for (size_t k = 0; k < n && !check_failures; k++) {
                wsync_target_t t = tg[k];
                t.data = data[k];
                t.mem = WSYNC_MEM_CUDA;
                t.device = dev;
                CHECK_OK(wsync_receiver_add_target(rv, &t));
            }
            if (check_failures)
                goto out;
        }
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, -1, &got);
        if (st != WSYNC_OK) {
            note_error(slot, st);
            if (g_delta_variant == DELTA_CORRUPT && v == 2) {   /* a new group takes version 3 */
                printf("   receiver %d version 2: %s: %s\n", rank, wsync_status_name(st),
                       g_shared->error_text[slot]);
                wsync_receiver_free(rv);
                wsync_ctx_free(ctx);
                rv = NULL;
                ctx = NULL;
                failed = v;
                continue;
            }
            fprintf(stderr, "delta receiver %d: version %d failed: %s\n", rank, v,
                    g_shared->error_text[slot]);
            CHECK(0);
            break;
        }
        CHECK_MSG(got == (uint64_t)v, "receiver %d: version %llu, expected %d", rank,
                  (unsigned long long)got, v);
        int wrong = delta_compare(rank, tg, data, n, v);
        CHECK_MSG(wrong == 0, "delta receiver %d: %d targets differ in version %d", rank, wrong, v);
        if (!wrong)
            g_shared->versions_right[rank]++;
        if (g_delta_variant == DELTA_CORRUPT && v == 2) {
            /* the corrupted chunk went to another receiver: the group failed all the same (its
             * senders' pushes did), and version 3 comes from the new one */
            wsync_receiver_free(rv);
            wsync_ctx_free(ctx);
            rv = NULL;
            ctx = NULL;
        }
        if (g_delta_variant == DELTA_REPOINT && v == 2 && rank == 0) {
            /* a new buffer holding no version: the next one must come to it in full */
            uint8_t *fresh = NULL;
            CU_OK(cudaMalloc((void **)&fresh, wsync_target_bytes(&tg[0])));
            CU_OK(cudaMemset(fresh, 0xFF, wsync_target_bytes(&tg[0])));
            CU_OK(cudaDeviceSynchronize());
            CHECK_OK(wsync_receiver_set_target_data(rv, tg[0].name, fresh, NULL));
            cudaFree(data[0]);
            data[0] = fresh;
        }
    }
    if (g_delta_variant == DELTA_CORRUPT && failed == 2)
        g_shared->versions_right[rank]++;   /* the refused version counts as handled right */
out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (size_t k = 0; data && k < n; k++)
        cudaFree(data[k]);
    free(data);
    wsync_layout_targets_free(tg, n);
    return check_failures ? 1 : 0;
}

/* The corrupted-delta variants corrupt a stream through a fault point (WSYNC_FAULT): a build
 * without the hooks (-DWSYNC_FAULTS=ON) cannot, so they are skipped, saying why, not failed. */
static int corrupt_unbuilt(int variant, gpu_case_t *row)
{
#if !defined(WSYNC_FAULTS) || !WSYNC_FAULTS
    if (variant == DELTA_CORRUPT) {
        row->result = "skipped";
        snprintf(row->why, sizeof(row->why), "needs the fault hooks: a build with -DWSYNC_FAULTS=ON");
        printf("-- %s: skipped (%s)\n", row->name, row->why);
        return 1;
    }
#endif
    (void)variant;
    (void)row;
    return 0;
}

static void run_delta_case(int variant, const char *what)
{
    int d = g_cases.ngpu >= 4 ? 2 : 1, np = 2 * d, codes[2 * MAX_RANKS];
    pid_t pids[2 * MAX_RANKS];
    group_t cfg[2 * MAX_RANKS];
    char name[128];
    snprintf(name, sizeof(name), "nccl delta FSDP-%d -> TP-%d bf16: %s", d, d, what);
    group_t g = {.name = strdup(name), .scheme = "nccl", .nsenders = d, .tp = d, .replicas = 1,
                 .kill_receiver = -1};
    if (!wanted(&g))
        return;
    gpu_case_t *row = gpu_cases_add(&g_cases);
    snprintf(row->name, sizeof(row->name), "%s", g.name);
    if (corrupt_unbuilt(variant, row))
        return;
    if (g_cases.ngpu < 2) {
        row->result = "skipped";
        snprintf(row->why, sizeof(row->why), "needs 2 GPUs, %d visible", g_cases.ngpu);
        printf("-- %s: skipped (%s)\n", g.name, row->why);
        return;
    }
    memset(g_shared, 0, sizeof(*g_shared));
    g_delta_variant = variant;
    g.ngpu = g_cases.ngpu;
    g.port = proc_free_port();
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", g.port);
    int port2 = proc_free_port();
    for (int tries = 0; port2 == g.port && tries < 10; tries++)
        port2 = proc_free_port();
    snprintf(coord2, sizeof(coord2), "127.0.0.1:%d", port2);
    long long t0 = proc_now_ms();
    printf("-- %s\n", g.name);
    fflush(stdout);
    for (int i = 0; i < np; i++) {
        cfg[i] = g;
        cfg[i].rank = i < d ? i : i - d;
        pids[i] = proc_spawn(i < d ? delta_sender_main : delta_receiver_main, &cfg[i],
                             CHILD_LIMIT_S);
    }
    proc_wait_all(pids, np, GROUP_LIMIT_MS, codes);
    row->seconds = (double)(proc_now_ms() - t0) / 1000.0;
    int before = check_failures, integrity = 0;
    for (int i = 0; i < np; i++) {
        int r = i < d ? i : i - d;
        CHECK_MSG(codes[i] == 0, "%s %d exited with %d", i < d ? "sender" : "receiver", r,
                  codes[i]);
        if (i < d)
            continue;
        CHECK_MSG(g_shared->versions_right[r] == DELTA_VERSIONS, "receiver %d: %d of %d versions "
                  "right", r, g_shared->versions_right[r], DELTA_VERSIONS);
        integrity |= g_shared->error_status[MAX_RANKS + r] == (int)WSYNC_ERR_INTEGRITY &&
                     strstr(g_shared->error_text[MAX_RANKS + r], "param '") != NULL;
    }
    if (variant == DELTA_CORRUPT)
        CHECK_MSG(integrity, "no receiver refused the corrupted delta with WSYNC_ERR_INTEGRITY "
                  "naming the param");
    row->result = check_failures == before ? "pass" : "FAIL";
    printf("-- %s: %s in %.1f s\n", g.name, row->result, row->seconds);
    fflush(stdout);
}

static void run_delta_cases(void)
{
    run_delta_case(DELTA_BASIC, "sparse versions");
    run_delta_case(DELTA_REPOINT, "re-pointed target gets full");
    run_delta_case(DELTA_CORRUPT, "corrupted delta refused");
}

/* ipc delta versions on CUDA memory (schemes/ipc_delta.c): FSDP-2 -> TP-2 with delta = on, CUDA
 * shards and targets, through delta_sender_main / delta_receiver_main (the nccl cases' checks:
 * every version byte-compared with expected(), base = v - 1 and the wire under a quarter of the
 * bytes delivered from version 2 on; a re-pointed target takes version 3 in full; a corrupted
 * delta refused with INTEGRITY naming the param, a new group right). The senders encode on the
 * device into device delta slots (every receiver reads their GPU), or pinned host ones with
 * host_slots (WSYNC_IPC_DELTA_DEVICE=0), and the receivers apply on the device from them.
 * one_gpu: all four processes share GPU 0 (colocated: the shards are read in place where
 * plain); else each its own GPU (4 needed: peer reads). */
static void run_ipc_delta_case(int variant, const char *what, int one_gpu, int host_slots)
{
    int d = 2, np = 2 * d, codes[2 * MAX_RANKS], need = one_gpu ? 1 : 2 * d;
    pid_t pids[2 * MAX_RANKS];
    group_t cfg[2 * MAX_RANKS];
    char name[128];
    snprintf(name, sizeof(name), "ipc delta FSDP-%d -> TP-%d bf16 %s%s: %s", d, d,
             one_gpu ? "on one GPU" : "on 4 GPUs", host_slots ? ", pinned host delta slots" : "",
             what);
    group_t g = {.name = strdup(name), .scheme = "ipc", .nsenders = d, .tp = d, .replicas = 1,
                 .kill_receiver = -1, .colocated = one_gpu};
    if (!wanted(&g))
        return;
    gpu_case_t *row = gpu_cases_add(&g_cases);
    snprintf(row->name, sizeof(row->name), "%s", g.name);
    if (corrupt_unbuilt(variant, row))
        return;
    if (g_cases.ngpu < need) {
        row->result = "skipped";
        snprintf(row->why, sizeof(row->why), "needs %d GPUs, %d visible", need, g_cases.ngpu);
        printf("-- %s: skipped (%s)\n", g.name, row->why);
        return;
    }
    memset(g_shared, 0, sizeof(*g_shared));
    g_delta_variant = variant;
    g.ngpu = one_gpu ? 1 : g_cases.ngpu;   /* colocated: i % 1 = GPU 0 for everyone */
    g.port = proc_free_port();
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", g.port);
    int port2 = proc_free_port();
    for (int tries = 0; port2 == g.port && tries < 10; tries++)
        port2 = proc_free_port();
    snprintf(coord2, sizeof(coord2), "127.0.0.1:%d", port2);
    long long t0 = proc_now_ms();
    printf("-- %s\n", g.name);
    fflush(stdout);
    if (host_slots)   /* the children inherit it: senders encode into pinned host slots */
        setenv("WSYNC_IPC_DELTA_DEVICE", "0", 1);
    for (int i = 0; i < np; i++) {
        cfg[i] = g;
        cfg[i].rank = i < d ? i : i - d;
        pids[i] = proc_spawn(i < d ? delta_sender_main : delta_receiver_main, &cfg[i],
                             CHILD_LIMIT_S);
    }
    proc_wait_all(pids, np, GROUP_LIMIT_MS, codes);
    unsetenv("WSYNC_IPC_DELTA_DEVICE");
    row->seconds = (double)(proc_now_ms() - t0) / 1000.0;
    int before = check_failures, integrity = 0;
    for (int i = 0; i < np; i++) {
        int r = i < d ? i : i - d;
        CHECK_MSG(codes[i] == 0, "%s %d exited with %d", i < d ? "sender" : "receiver", r,
                  codes[i]);
        if (i < d)
            continue;
        CHECK_MSG(g_shared->versions_right[r] == DELTA_VERSIONS, "receiver %d: %d of %d versions "
                  "right", r, g_shared->versions_right[r], DELTA_VERSIONS);
        integrity |= g_shared->error_status[MAX_RANKS + r] == (int)WSYNC_ERR_INTEGRITY &&
                     strstr(g_shared->error_text[MAX_RANKS + r], "param '") != NULL;
        if (g_shared->error_status[MAX_RANKS + r] != 0)
            printf("   receiver %d: %s\n", r, g_shared->error_text[MAX_RANKS + r]);
    }
    if (variant == DELTA_CORRUPT)
        CHECK_MSG(integrity, "no receiver refused the corrupted delta with WSYNC_ERR_INTEGRITY "
                  "naming the param");
    row->result = check_failures == before ? "pass" : "FAIL";
    printf("-- %s: %s in %.1f s\n", g.name, row->result, row->seconds);
    fflush(stdout);
}

static void run_ipc_delta_cases(void)
{
    run_ipc_delta_case(DELTA_BASIC, "sparse versions", 1, 0);
    run_ipc_delta_case(DELTA_BASIC, "sparse versions", 1, 1);
    run_ipc_delta_case(DELTA_BASIC, "sparse versions", 0, 0);
    run_ipc_delta_case(DELTA_REPOINT, "re-pointed target gets full", 1, 0);
    run_ipc_delta_case(DELTA_CORRUPT, "corrupted delta refused", 1, 0);
    run_ipc_delta_case(DELTA_CORRUPT, "corrupted delta refused", 1, 1);
}

/* ------------------------------------------------------------------------------------------ */

/* The store with delta = on, CUDA shards and CUDA targets (schemes/store_delta.c): FSDP-2 -> TP-2
 * on the visible GPUs (one is enough: the store reads through the network stack), shards encoded
 * by the device codec against device baselines, streams applied by the device codec from pinned
 * host memory. DELTA_VERSIONS sparse versions, each fetched by both readers and byte-compared
 * with expected(); from version 2 on every sender encodes against the version before, and each
 * reader's delta fetches read under a quarter of its full fetch's bytes (its progress). Corrupted
 * variant: delta.encoded:corrupt@1 on sender 0; the reader of that stream must refuse version 2
 * with INTEGRITY naming the param, then read version 3 in full and right, version 4 a delta. */
typedef struct {
    uint64_t bytes[DELTA_VERSIONS + 1][MAX_RANKS];
    int done[DELTA_VERSIONS + 1][MAX_RANKS];
} store_delta_sync_t;
static store_delta_sync_t *g_sds;

static void store_delta_wait(const group_t *g, int v)
{
    long long until = proc_now_ms() + GROUP_LIMIT_MS;
    for (int r = 0; r < g->tp && v > 0; r++)
        while (!__atomic_load_n(&g_sds->done[v][r], __ATOMIC_ACQUIRE) && proc_now_ms() < until)
            usleep(2000);
}

static int store_delta_sender_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = rank % g->ngpu;
    wsync_model_config_t cfg = model_small();
    wsync_shard_t *shards = NULL;
    size_t n = 0, bytes = 0, *off = NULL;
    uint8_t *block = NULL, *host = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;

    check_failures = 0;
    g_sparse = DELTA_SPARSE;
    if (g_delta_variant == DELTA_CORRUPT && rank == 0)
        setenv("WSYNC_FAULT", "delta.encoded:corrupt@1", 1);
    CU_OK(cudaSetDevice(dev));
    CHECK_OK(wsync_layout_fsdp_shards(&cfg, WSYNC_DTYPE_BF16, rank, g->nsenders, &shards, &n));
    off = calloc(n + 1, sizeof(size_t));
    for (size_t k = 0; k < n; k++) {
        off[k] = bytes;
        bytes += (elems_of(&shards[k].param, &shards[k].box) * esz_of(&shards[k].param) + 255) &
                 ~(size_t)255;
    }
    host = malloc(bytes + 2);
    CU_OK(cudaMalloc((void **)&block, bytes + 256));
    sp.coordinator = coord;
    sp.rank = rank;
    sp.nranks = g->nsenders;
    sp.nreceivers = g->tp;
    sp.scheme = "store";
    sp.delta = "on";
    sp.keep_versions = DELTA_VERSIONS + 1;
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    for (size_t k = 0; k < n && !check_failures; k++) {
        wsync_shard_t sh = shards[k];
        sh.data = block + off[k];
        sh.mem = WSYNC_MEM_CUDA;
        sh.device = dev;
        CHECK_OK(wsync_sender_add_shard(s, &sh));
    }
    for (int v = 1; v <= DELTA_VERSIONS && !check_failures && host; v++) {
        store_delta_wait(g, v - 1);   /* readers keep up: their regions reached us */
        for (size_t k = 0; k < n; k++) {
            uint64_t cnt = elems_of(&shards[k].param, &shards[k].box), rowe = 1;
            for (int d = 1; d < shards[k].param.ndim; d++)
                rowe *= (uint64_t)shards[k].param.shape[d];
            gen_as(&shards[k].param, (uint64_t)v, (uint64_t)shards[k].box.start[0] * rowe, cnt,
                   host + off[k]);
        }
        CU_OK(cudaMemcpy(block, host, bytes, cudaMemcpyHostToDevice));
        wsync_status_t st = wsync_sender_push(s, (uint64_t)v);
        CHECK_MSG(st == WSYNC_OK, "store delta sender %d: version %d: %s", rank, v,
                  wsync_last_error());
        wsync_push_stats_t ps;
        CHECK_OK(wsync_sender_stats(s, &ps));
        CHECK_MSG(ps.base_version == (uint64_t)v - 1 && (v == 1) == (ps.bytes_encoded == 0),
                  "store delta sender %d version %d: base %llu, %llu bytes encoded", rank, v,
                  (unsigned long long)ps.base_version, (unsigned long long)ps.bytes_encoded);
        printf("   store sender %d version %d: base %llu, encoded %llu, plain %llu bytes\n", rank,
               v, (unsigned long long)ps.base_version, (unsigned long long)ps.bytes_encoded,
               (unsigned long long)ps.bytes_plain);
        fflush(stdout);
    }
    store_delta_wait(g, DELTA_VERSIONS);   /* the store serves from this process */
out:
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    cudaFree(block);
    free(host);
    free(off);
    wsync_layout_shards_free(shards, n);
    return check_failures ? 1 : 0;
}

static void store_delta_progress(void *arg, uint64_t v, uint64_t done, uint64_t total)
{
    (void)total;
    if (v <= DELTA_VERSIONS)
        g_sds->bytes[v][(int)(intptr_t)arg] = done;
}

static int store_delta_receiver_main(void *arg)
{
    const group_t *g = arg;
    int rank = g->rank, dev = (g->nsenders + rank) % g->ngpu, slot = MAX_RANKS + rank;
    wsync_model_config_t cfg = model_small();
    wsync_target_t *tg = NULL;
    size_t n = 0;
    uint8_t **data = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    int failed = 0;

    check_failures = 0;
    g_sparse = DELTA_SPARSE;
    CU_OK(cudaSetDevice(dev));
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    CHECK_OK(wsync_layout_tp_targets(&cfg, rank, g->tp, &opt, &tg, &n));
    rp.coordinator = coord;
    rp.rank = rank;
    rp.nreceivers = g->tp;
    rp.delta = "on";
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    rp.progress = store_delta_progress;
    rp.progress_arg = (void *)(intptr_t)rank;
    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    CHECK_OK(wsync_receiver_create(ctx, &rp, &rv));
    data = calloc(n + 1, sizeof(*data));
    for (size_t k = 0; k < n && !check_failures; k++) {
        CU_OK(cudaMalloc((void **)&data[k], wsync_target_bytes(&tg[k])));
        CU_OK(cudaMemset(data[k], 0xFF, wsync_target_bytes(&tg[k])));
        wsync_target_t t = tg[k];
        t.data = data[k];
        t.mem = WSYNC_MEM_CUDA;
        t.device = dev;
        CHECK_OK(wsync_receiver_add_target(rv, &t));
    }
    for (int v = 1; v <= DELTA_VERSIONS && !check_failures; v++) {
        uint64_t got = 0;
        wsync_status_t st = wsync_receiver_fetch(rv, (uint64_t)v, TIMEOUT_MS, &got);
        if (st != WSYNC_OK) {
            note_error(slot, st);
            printf("   store reader %d version %d: %s: %s\n", rank, v, wsync_status_name(st),
                   g_shared->error_text[slot]);
            CHECK_MSG(g_delta_variant == DELTA_CORRUPT && v == 2 && st == WSYNC_ERR_INTEGRITY,
                      "store delta reader %d: version %d: %s", rank, v, g_shared->error_text[slot]);
            failed = v;
        } else {
            int wrong = delta_compare(rank, tg, data, n, v);
            CHECK_MSG(wrong == 0, "store delta reader %d: %d targets differ in version %d", rank,
                      wrong, v);
            if (!wrong)
                g_shared->versions_right[rank]++;
        }
        __atomic_store_n(&g_sds->done[v][rank], 1, __ATOMIC_RELEASE);
    }
    /* bytes read: a delta fetch under a quarter of a full one (version 1, and 3 after a refusal) */
    for (int v = 2; v <= DELTA_VERSIONS && !check_failures; v++) {
        if (v == failed)
            continue;
        int full = failed && v == failed + 1;
        uint64_t b = g_sds->bytes[v][rank], b1 = g_sds->bytes[1][rank];
        CHECK_MSG(full ? b == b1 : b * 4 < b1, "store delta reader %d version %d: %llu bytes read, "
                  "%llu in full", rank, v, (unsigned long long)b, (unsigned long long)b1);
    }
    if (failed == 2)
        g_shared->versions_right[rank]++;   /* the refused version counts as handled right */
out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (size_t k = 0; data && k < n; k++)
        cudaFree(data[k]);
    free(data);
    wsync_layout_targets_free(tg, n);
    return check_failures ? 1 : 0;
}

static void run_store_delta_case(int variant, const char *what)
{
    int d = 2, np = 2 * d, codes[2 * MAX_RANKS];
    pid_t pids[2 * MAX_RANKS];
    group_t cfg[2 * MAX_RANKS];
    char name[128];
    snprintf(name, sizeof(name), "store delta FSDP-%d -> TP-%d bf16: %s", d, d, what);
    group_t g = {.name = strdup(name), .scheme = "store", .nsenders = d, .tp = d, .replicas = 1,
                 .kill_receiver = -1};
    if (!wanted(&g))
        return;
    gpu_case_t *row = gpu_cases_add(&g_cases);
    snprintf(row->name, sizeof(row->name), "%s", g.name);
    if (corrupt_unbuilt(variant, row))
        return;
    memset(g_shared, 0, sizeof(*g_shared));
    if (g_sds == NULL)
        g_sds = mmap(NULL, sizeof(*g_sds), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (g_sds == MAP_FAILED) {
        g_sds = NULL;
        row->result = "FAIL";
        return;
    }
    memset(g_sds, 0, sizeof(*g_sds));
    g_delta_variant = variant;
    g.ngpu = g_cases.ngpu;
    g.port = proc_free_port();
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", g.port);
    long long t0 = proc_now_ms();
    printf("-- %s\n", g.name);
    fflush(stdout);
    for (int i = 0; i < np; i++) {
        cfg[i] = g;
        cfg[i].rank = i < d ? i : i - d;
        pids[i] = proc_spawn(i < d ? store_delta_sender_main : store_delta_receiver_main, &cfg[i],
                             CHILD_LIMIT_S);
    }
    proc_wait_all(pids, np, GROUP_LIMIT_MS, codes);
    row->seconds = (double)(proc_now_ms() - t0) / 1000.0;
    int before = check_failures, integrity = 0;
    for (int i = 0; i < np; i++) {
        int r = i < d ? i : i - d;
        CHECK_MSG(codes[i] == 0, "store %s %d exited with %d", i < d ? "sender" : "reader", r,
                  codes[i]);
        if (i < d)
            continue;
        CHECK_MSG(g_shared->versions_right[r] == DELTA_VERSIONS, "store reader %d: %d of %d "
                  "versions right", r, g_shared->versions_right[r], DELTA_VERSIONS);
        integrity |= g_shared->error_status[MAX_RANKS + r] == (int)WSYNC_ERR_INTEGRITY &&
                     strstr(g_shared->error_text[MAX_RANKS + r], "param '") != NULL;
    }
    if (variant == DELTA_CORRUPT)
        CHECK_MSG(integrity, "no store reader refused the corrupted delta with "
                  "WSYNC_ERR_INTEGRITY naming the param");
    row->result = check_failures == before ? "pass" : "FAIL";
    printf("-- %s: %s in %.1f s\n", g.name, row->result, row->seconds);
    fflush(stdout);
}

static void run_store_delta_cases(void)
{
    run_store_delta_case(DELTA_BASIC, "sparse versions");
    run_store_delta_case(DELTA_CORRUPT, "corrupted delta refused");
}

int main(int argc, char **argv)
{
    int rc = gpu_cases_args(&g_cases, argc, argv);
    if (rc != 0)
        return rc;
    gpu_cases_count_gpus(&g_cases);   /* in a child: the parent never initializes CUDA */
    if (g_cases.ngpu == 0) {
        printf("test_schemes: no CUDA device: skipped\n");
        return 77;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    g_shared = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (g_shared == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    printf("test_schemes: %d GPU(s)\n", g_cases.ngpu);
    run_cases();
    run_delta_cases();
    run_ipc_delta_cases();
    run_store_delta_cases();
    return gpu_cases_finish(&g_cases, 60);
}
