/* wsync_plan_summarize and the wsync-plan tool, checked against byte counts computed here from
 * the tiny Qwen3 config and RESHARD_SPEC's layouts, independently of reshard/layout.c and the
 * plan compiler: a receiver's bytes from a sender are the rows of each param both hold times
 * the columns the receiver needs. */
#include "wsync/wsync.h"

#include "tests/support/check.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define CONFIG WSYNC_TESTDATA "/hf_qwen3_tiny/config.json"
#define TOOL WSYNC_BIN_DIR "/wsync-plan"

/* hf_qwen3_tiny/config.json, as written there */
enum { HD = 128, LAYERS = 2, H = 4, K = 2, D = 32, I = 384, V = 384 };
#define BF16 2u
#define NSEND 3
#define TP 2
#define NQUANT_PER_LAYER 4       /* qkv_proj, o_proj, gate_up_proj, down_proj */

typedef enum { VOCAB, REPL, Q, KV, COLS, ROWPAR } kind_t;

typedef struct {
    kind_t kind;
    int64_t rows, cols;          /* cols 1 for a 1-D param */
    int quantized;               /* lands in an FP8 target when quant is on */
} ref_param_t;

/* The checkpoint's params (order does not matter here). */
static size_t ref_params(ref_param_t *p)
{
    size_t n = 0;
    p[n++] = (ref_param_t){VOCAB, V, HD, 0};                 /* embed_tokens */
    for (int l = 0; l < LAYERS; l++) {
        p[n++] = (ref_param_t){REPL, HD, 1, 0};              /* input_layernorm */
        p[n++] = (ref_param_t){Q, H * D, HD, 1};             /* q_proj */
        p[n++] = (ref_param_t){KV, K * D, HD, 1};            /* k_proj */
        p[n++] = (ref_param_t){KV, K * D, HD, 1};            /* v_proj */
        p[n++] = (ref_param_t){ROWPAR, HD, H * D, 1};        /* o_proj */
        p[n++] = (ref_param_t){REPL, D, 1, 0};               /* q_norm */
        p[n++] = (ref_param_t){REPL, D, 1, 0};               /* k_norm */
        p[n++] = (ref_param_t){REPL, HD, 1, 0};              /* post_attention_layernorm */
        p[n++] = (ref_param_t){COLS, I, HD, 1};              /* gate_proj */
        p[n++] = (ref_param_t){COLS, I, HD, 1};              /* up_proj */
        p[n++] = (ref_param_t){ROWPAR, HD, I, 1};            /* down_proj */
    }
    p[n++] = (ref_param_t){REPL, HD, 1, 0};                  /* norm */
    p[n++] = (ref_param_t){VOCAB, V, HD, 0};                 /* lm_head (untied) */
    return n;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Rows [*r0, *r1) and column count TP rank r of T needs of p (RESHARD_SPEC). */
static void needed(const ref_param_t *p, int r, int t, int64_t pad, int64_t *r0, int64_t *r1,
                   int64_t *ncols)
{
    *r0 = 0;
    *r1 = p->rows;
    *ncols = p->cols;
    switch (p->kind) {
    case VOCAB: {
        int64_t vp = (V + pad - 1) / pad * pad, vr = vp / t;
        *r0 = min64((int64_t)r * vr, V);     /* rows >= V are padding: nothing moves */
        *r1 = min64((int64_t)(r + 1) * vr, V);
        break;
    }
    case REPL: break;
    case Q: *r0 = (int64_t)r * (H / t) * D; *r1 = *r0 + (H / t) * D; break;
    case KV: {
        int64_t kr = K >= t ? K / t : 1, rep = K >= t ? 1 : t / K, ks = r / rep;
        *r0 = ks * kr * D;
        *r1 = *r0 + kr * D;
        break;
    }
    case COLS: *r0 = (int64_t)r * (p->rows / t); *r1 = *r0 + p->rows / t; break;
    case ROWPAR: *ncols = p->cols / t; break;
    }
}

/* Elements receiver r needs from FSDP sender s of n: rows both hold x needed columns.
 * quantized: 1 counts only FP8-target params, 0 only the others, -1 all. */
static uint64_t ref_pair_elems(int s, int n, int r, int t, int64_t pad, int quantized)
{
    ref_param_t p[64];
    size_t np = ref_params(p);
    uint64_t e = 0;
    for (size_t i = 0; i < np; i++) {
        if (quantized >= 0 && p[i].quantized != quantized)
            continue;
        int64_t r0, r1, nc, c = (p[i].rows + n - 1) / n;
        needed(&p[i], r, t, pad, &r0, &r1, &nc);
        int64_t a = max64(r0, s * c), b = min64(r1, min64(p[i].rows, (s + 1) * c));
        if (b > a)
            e += (uint64_t)((b - a) * nc);
    }
    return e;
}

/* Elements receiver r needs from FSDP sender s of n, of the params of one kind only. */
static uint64_t ref_kind_elems(int s, int n, int r, int t, int64_t pad, kind_t kind)
{
    ref_param_t p[64];
    size_t np = ref_params(p);
    uint64_t e = 0;
    for (size_t i = 0; i < np; i++) {
        if (p[i].kind != kind)
            continue;
        int64_t r0, r1, nc, c = (p[i].rows + n - 1) / n;
        needed(&p[i], r, t, pad, &r0, &r1, &nc);
        int64_t a = max64(r0, s * c), b = min64(r1, min64(p[i].rows, (s + 1) * c));
        if (b > a)
            e += (uint64_t)((b - a) * nc);
    }
    return e;
}

/* FP8 on the wire with 32 x 32 blocks: one byte per element and a 4-byte scale per 1,024
 * elements, when every region travelling so is whole blocks (its element count a multiple of
 * 1,024, its codes of 4) */
static uint64_t ref_wire32(uint64_t elems)
{
    return elems + elems / 1024 * 4;
}

static uint64_t ref_receiver_bytes(int r, int t, int64_t pad)
{
    uint64_t e = 0;
    for (int s = 0; s < NSEND; s++)
        e += ref_pair_elems(s, NSEND, r, t, pad, -1);
    return e * BF16;
}

static uint64_t ref_naive_bytes(void)
{
    ref_param_t p[64];
    size_t np = ref_params(p);
    uint64_t e = 0;
    for (size_t i = 0; i < np; i++)
        e += (uint64_t)(p[i].rows * p[i].cols);
    return e * BF16;
}

/* ------------------------------------------------------------------------------------------ */
/* Building the group from the public layouts                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int nsend;
    wsync_shard_t *shards[NSEND];
    size_t nshards[NSEND];
    wsync_target_t *targets[TP];
    size_t ntargets[TP];
    wsync_shard_t *all_shards;     /* flat shallow copies */
    int *shard_sender;
    size_t nsh;
    wsync_target_t *all_targets;
    int *target_receiver;
    size_t ntg;
} group_t;

static void group_free(group_t *g)
{
    for (int s = 0; s < g->nsend; s++)
        wsync_layout_shards_free(g->shards[s], g->nshards[s]);
    for (int r = 0; r < TP; r++)
        wsync_layout_targets_free(g->targets[r], g->ntargets[r]);
    free(g->all_shards);
    free(g->shard_sender);
    free(g->all_targets);
    free(g->target_receiver);
    memset(g, 0, sizeof(*g));
}

/* Data pointers stay NULL: a summary needs geometry only. nsend FSDP senders; receiver r is TP
 * rank tp_rank[r] of TP with quant[r] (blocks of `block`, 0: the default 128). */
static int group_build_of(group_t *g, int nsend, const wsync_quant_scheme_t *quant,
                          const int *tp_rank, int block, int64_t pad)
{
    wsync_model_config_t cfg;
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;

    memset(g, 0, sizeof(*g));
    g->nsend = nsend;
    if (wsync_model_config_load(CONFIG, &cfg) != WSYNC_OK)
        return -1;
    /* the reference above is written from these numbers */
    CHECK(cfg.hidden_size == HD && cfg.num_hidden_layers == LAYERS &&
          cfg.num_attention_heads == H && cfg.num_key_value_heads == K && cfg.head_dim == D &&
          cfg.intermediate_size == I && cfg.vocab_size == V && !cfg.tie_word_embeddings &&
          cfg.qk_norm && !cfg.attention_bias && !cfg.mlp_bias);
    opt.vocab_pad = pad;
    opt.quant.block_rows = opt.quant.block_cols = block;
    for (int s = 0; s < nsend; s++) {
        if (wsync_layout_fsdp_shards(&cfg, (wsync_dtype_t)0, s, nsend, &g->shards[s],
                                     &g->nshards[s]) != WSYNC_OK)
            return -1;
        g->nsh += g->nshards[s];
    }
    for (int r = 0; r < TP; r++) {
        opt.quant.scheme = quant[r];
        if (wsync_layout_tp_targets(&cfg, tp_rank[r], TP, &opt, &g->targets[r],
                                    &g->ntargets[r]) != WSYNC_OK)
            return -1;
        g->ntg += g->ntargets[r];
    }
    g->all_shards = calloc(g->nsh, sizeof(*g->all_shards));
    g->shard_sender = calloc(g->nsh, sizeof(*g->shard_sender));
    g->all_targets = calloc(g->ntg, sizeof(*g->all_targets));
    g->target_receiver = calloc(g->ntg, sizeof(*g->target_receiver));
    if (!g->all_shards || !g->shard_sender || !g->all_targets || !g->target_receiver)
        return -1;
    size_t k = 0;
    for (int s = 0; s < nsend; s++)
        for (size_t i = 0; i < g->nshards[s]; i++, k++) {
            g->all_shards[k] = g->shards[s][i];
            g->shard_sender[k] = s;
        }
    k = 0;
    for (int r = 0; r < TP; r++)
        for (size_t j = 0; j < g->ntargets[r]; j++, k++) {
            g->all_targets[k] = g->targets[r][j];
            g->target_receiver[k] = r;
        }
    return 0;
}

static int group_build(group_t *g, wsync_quant_scheme_t quant, int64_t pad)
{
    const wsync_quant_scheme_t q[TP] = {quant, quant};
    const int rank[TP] = {0, 1};
    return group_build_of(g, NSEND, q, rank, 0, pad);
}

static wsync_status_t summarize(group_t *g, size_t bucket, wsync_plan_summary_t **out)
{
    return wsync_plan_summarize(g->all_shards, g->shard_sender, g->nsh, g->all_targets,
                                g->target_receiver, g->ntg, NSEND, TP, bucket, out);
}

static wsync_status_t summarize_wire(group_t *g, size_t bucket, int fp8_wire,
                                     wsync_plan_summary_t **out)
{
    return wsync_plan_summarize_wire(g->all_shards, g->shard_sender, g->nsh, g->all_targets,
                                     g->target_receiver, g->ntg, g->nsend, TP, bucket, fp8_wire,
                                     out);
}

/* The wire forms' figures agree with each other and with the rest of the summary. */
static void check_forms(const wsync_plan_summary_t *s)
{
    uint64_t by = 0, pb = 0, fb[WSYNC_WIRE_NFORMS] = {0}, fp[WSYNC_WIRE_NFORMS] = {0};
    for (int f = 0; f < WSYNC_WIRE_NFORMS; f++) {
        by += s->form_bytes[f];
        pb += s->form_param_bytes[f];
    }
    CHECK_MSG(by == s->total_bytes, "forms %" PRIu64 ", total %" PRIu64, by, s->total_bytes);
    CHECK(pb == s->total_param_bytes);
    CHECK(s->fp8_wire_bytes == s->form_bytes[WSYNC_WIRE_FP8]);
    for (size_t j = 0; j < s->ntargets; j++) {
        int f = s->target_form[j];
        CHECK(f >= 0 && f < WSYNC_WIRE_NFORMS);
        if (f < 0 || f >= WSYNC_WIRE_NFORMS)
            return;
        fb[f] += s->target_bytes[j];
        fp[f] += s->target_param_bytes[j];
    }
    CHECK(memcmp(fb, s->form_bytes, sizeof(fb)) == 0);
    CHECK(memcmp(fp, s->form_param_bytes, sizeof(fp)) == 0);
}

/* The summary's own figures agree with each other. */
static void check_consistent(const wsync_plan_summary_t *s)
{
    uint64_t tot = 0, staged = 0, landed = 0;
    const int ns = s->nsenders;
    CHECK(s->nreceivers == TP);
    for (int r = 0; r < TP; r++) {
        uint64_t in = 0;
        for (int sn = 0; sn < ns; sn++)
            in += s->pair_bytes[sn * TP + r];
        CHECK_MSG(in == s->bytes_per_receiver[r], "receiver %d: %" PRIu64 " vs %" PRIu64, r, in,
                  s->bytes_per_receiver[r]);
        landed += s->bytes_landed_per_receiver[r];
    }
    for (int sn = 0; sn < ns; sn++) {
        uint64_t out = 0;
        for (int r = 0; r < TP; r++)
            out += s->pair_bytes[sn * TP + r];
        CHECK(out == s->bytes_per_sender[sn]);
        tot += out;
        staged += s->staged_bytes_per_sender[sn];
        CHECK(s->buckets_per_sender[sn] >= 1);
        /* the bucket holds each shared chunk once; alignment adds < 64 bytes per chunk */
        CHECK(s->staged_bytes_per_sender[sn] <= s->bytes_per_sender[sn] + 64 * s->nchunks);
        CHECK(s->staged_bytes_per_sender[sn] <= s->buckets_per_sender[sn] * s->bucket_bytes);
    }
    CHECK(tot == s->total_bytes);
    CHECK(staged == s->total_staged_bytes);
    CHECK(landed == s->total_landed_bytes);
    CHECK(s->nchunks >= 1 && s->nsegments >= s->nchunks);
}

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void summary_matches_reference(void)
{
    /* pad 64: Vp = V; pad 256: Vp = 512, rank 1 holds 128 real rows and 128 of padding */
    static const int64_t pads[] = {64, 256};
    for (size_t pi = 0; pi < 2; pi++) {
        group_t g;
        wsync_plan_summary_t *s = NULL;
        CHECK(group_build(&g, WSYNC_QUANT_NONE, pads[pi]) == 0);
        CHECK_OK(summarize(&g, 0, &s));
        if (s) {
            check_consistent(s);
            CHECK(s->bucket_bytes == (uint64_t)256 << 20);
            CHECK(s->fingerprint != 0);
            for (int r = 0; r < TP; r++) {
                uint64_t want = ref_receiver_bytes(r, TP, pads[pi]);
                CHECK_MSG(s->bytes_per_receiver[r] == want,
                          "pad %" PRId64 " receiver %d: %" PRIu64 " bytes, reference %" PRIu64,
                          pads[pi], r, s->bytes_per_receiver[r], want);
                /* bf16 into bf16 targets: what lands is what moved */
                CHECK(s->bytes_landed_per_receiver[r] == want);
                for (int sn = 0; sn < NSEND; sn++)
                    CHECK_MSG(s->pair_bytes[sn * TP + r] ==
                                  ref_pair_elems(sn, NSEND, r, TP, pads[pi], -1) * BF16,
                              "pad %" PRId64 " pair (%d, %d)", pads[pi], sn, r);
            }
            if (pads[pi] == 256)   /* padding rows are not moved */
                CHECK(s->bytes_per_receiver[1] < s->bytes_per_receiver[0]);
        }
        wsync_plan_summary_free(s);
        group_free(&g);
    }
}

/* WSYNC_PLAN_WIRE_CHECK=1: the plan goes through encode -> decode -> every participant's check,
 * and the summary says so; without it, nothing is checked. wire_bytes is the version 2 encoding,
 * far smaller than the 53 + 48 bytes per chunk and segment of version 1. */
static void summary_wire_check(void)
{
    group_t g;
    wsync_plan_summary_t *plain = NULL, *checked = NULL;
    CHECK(group_build(&g, WSYNC_QUANT_NONE, 64) == 0);
    unsetenv("WSYNC_PLAN_WIRE_CHECK");
    CHECK_OK(summarize(&g, 4096, &plain));
    setenv("WSYNC_PLAN_WIRE_CHECK", "1", 1);
    CHECK_OK(summarize(&g, 4096, &checked));
    unsetenv("WSYNC_PLAN_WIRE_CHECK");
    if (plain && checked) {
        CHECK(plain->wire_checked == 0 && checked->wire_checked == 1);
        CHECK(checked->wire_check_seconds > 0);
        CHECK(checked->fingerprint == plain->fingerprint);
        CHECK(checked->wire_bytes == plain->wire_bytes);
        uint64_t v1 = 28 + 53 * plain->nchunks + 4 + 48 * plain->nsegments + 8;
        CHECK_MSG(plain->wire_bytes > 32 && plain->wire_bytes < v1 / 4,
                  "%" PRIu64 " bytes for %" PRIu64 " chunks, %" PRIu64 " segments",
                  plain->wire_bytes, plain->nchunks, plain->nsegments);
    }
    wsync_plan_summary_free(plain);
    wsync_plan_summary_free(checked);
    group_free(&g);
}

static void summary_small_buckets(void)
{
    group_t g;
    wsync_plan_summary_t *big = NULL, *small = NULL;
    CHECK(group_build(&g, WSYNC_QUANT_NONE, 64) == 0);
    CHECK_OK(summarize(&g, 0, &big));
    CHECK_OK(summarize(&g, 4096, &small));
    if (big && small) {
        check_consistent(small);
        CHECK(small->bucket_bytes == 4096);
        CHECK(memcmp(small->pair_bytes, big->pair_bytes, NSEND * TP * sizeof(uint64_t)) == 0);
        for (int sn = 0; sn < NSEND; sn++)   /* ~330 kB per sender in 4 kB buckets */
            CHECK(small->buckets_per_sender[sn] >= small->staged_bytes_per_sender[sn] / 4096);
        CHECK(small->nchunks > big->nchunks);
        CHECK(small->fingerprint != big->fingerprint);
    }
    wsync_plan_summary_free(big);
    wsync_plan_summary_free(small);
    group_free(&g);
}

static void summary_fp8_moved_vs_landed(void)
{
    group_t g;
    wsync_plan_summary_t *s = NULL;
    /* block FP8 is refused at T = 2 for this model (64 q rows per rank): per-tensor scales */
    CHECK(group_build(&g, WSYNC_QUANT_TENSOR, 64) == 0);
    CHECK_OK(summarize(&g, 0, &s));
    if (s) {
        check_consistent(s);
        for (int r = 0; r < TP; r++) {
            uint64_t plain = 0, quant = 0;
            for (int sn = 0; sn < NSEND; sn++) {
                plain += ref_pair_elems(sn, NSEND, r, TP, 64, 0);
                quant += ref_pair_elems(sn, NSEND, r, TP, 64, 1);
            }
            /* the receiver quantizes: bf16 bytes travel */
            CHECK(s->bytes_per_receiver[r] == (plain + quant) * BF16);
            /* targets hold 1 byte per FP8 element and one fp32 scale per quantized target */
            uint64_t landed = plain * BF16 + quant + LAYERS * NQUANT_PER_LAYER * 4;
            CHECK_MSG(s->bytes_landed_per_receiver[r] == landed,
                      "receiver %d landed %" PRIu64 ", reference %" PRIu64, r,
                      s->bytes_landed_per_receiver[r], landed);
        }
    }
    wsync_plan_summary_free(s);
    group_free(&g);
}

/* FSDP-2 -> TP-2 with 32 x 32 blocks: every FSDP boundary and every TP piece falls on a block
 * row, so every FP8 target travels as codes and scales (one byte per element, 4 per 1,024);
 * with FP8 on the wire off the same targets travel as bf16 and say so. Buckets of 16 kB split
 * the chunks at rows of blocks: the same bytes. */
static void summary_fp8_wire_whole(void)
{
    const wsync_quant_scheme_t q[TP] = {WSYNC_QUANT_BLOCK, WSYNC_QUANT_BLOCK};
    const int rank[TP] = {0, 1};
    group_t g;
    wsync_plan_summary_t *on = NULL, *off = NULL, *small = NULL;

    CHECK(group_build_of(&g, 2, q, rank, 32, 64) == 0);
    CHECK_OK(summarize_wire(&g, 0, 1, &on));
    CHECK_OK(summarize_wire(&g, 0, 0, &off));
    CHECK_OK(summarize_wire(&g, 16384, 1, &small));
    if (on && off && small) {
        uint64_t fp8 = 0, quant = 0, plain = 0;
        check_consistent(on);
        check_forms(on);
        check_forms(off);
        check_forms(small);
        CHECK(on->fp8_wire == 1 && off->fp8_wire == 0);
        for (int r = 0; r < TP; r++)
            for (int sn = 0; sn < 2; sn++) {
                uint64_t p = ref_pair_elems(sn, 2, r, TP, 64, 0);
                uint64_t e = ref_pair_elems(sn, 2, r, TP, 64, 1);
                CHECK_MSG(on->pair_bytes[sn * TP + r] == p * BF16 + ref_wire32(e),
                          "pair (%d, %d): %" PRIu64 ", reference %" PRIu64, sn, r,
                          on->pair_bytes[sn * TP + r], p * BF16 + ref_wire32(e));
                CHECK(off->pair_bytes[sn * TP + r] == (p + e) * BF16);
                fp8 += ref_wire32(e);
                quant += e;
                plain += p;
            }
        CHECK_MSG(on->fp8_wire_bytes == fp8, "%" PRIu64 " FP8 bytes, reference %" PRIu64,
                  on->fp8_wire_bytes, fp8);
        CHECK(on->form_param_bytes[WSYNC_WIRE_FP8] == quant * BF16);
        CHECK(on->total_param_bytes == (quant + plain) * BF16);
        CHECK(on->total_bytes == fp8 + plain * BF16);
        for (int f = WSYNC_WIRE_CUT_CELLS; f < WSYNC_WIRE_NFORMS; f++)
            CHECK(on->form_bytes[f] == 0);
        /* off: the same elements as bf16, every FP8 target saying why */
        CHECK(off->fp8_wire_bytes == 0);
        CHECK(off->form_bytes[WSYNC_WIRE_OFF] == quant * BF16);
        CHECK(off->total_bytes == off->total_param_bytes &&
              off->total_param_bytes == on->total_param_bytes);
        size_t nfp8 = 0, noff = 0;
        CHECK(on->ntargets == g.ntg && off->ntargets == g.ntg);
        for (size_t j = 0; j < g.ntg; j++) {
            int quantized = g.all_targets[j].dtype == WSYNC_DTYPE_F8E4M3FN;
            nfp8 += on->target_form[j] == WSYNC_WIRE_FP8;
            noff += off->target_form[j] == WSYNC_WIRE_OFF;
            CHECK_MSG(on->target_form[j] == (quantized ? WSYNC_WIRE_FP8 : WSYNC_WIRE_PLAIN),
                      "%s: form %d", g.all_targets[j].name, on->target_form[j]);
        }
        CHECK(nfp8 == LAYERS * NQUANT_PER_LAYER * TP && noff == nfp8);
        /* small buckets: split at rows of blocks, each part whole: the same bytes */
        CHECK(small->nchunks > on->nchunks);
        CHECK(memcmp(small->pair_bytes, on->pair_bytes, 2 * TP * sizeof(uint64_t)) == 0);
        CHECK(small->fp8_wire_bytes == fp8);
    }
    wsync_plan_summary_free(on);
    wsync_plan_summary_free(off);
    wsync_plan_summary_free(small);
    group_free(&g);
}

/* FSDP-3 -> TP-2, 32 x 32 blocks: the FSDP boundaries of q, k, v, o and down (rows 43 and 86 of
 * 128, 22 and 44 of 64) cut blocks, those of gate and up (128 and 256 of 384) do not: gate_up
 * travels FP8, the rest plain for cut cells. Per-tensor scales travel FP8 (their senders agree
 * on the amax), cut or not. */
static void summary_fp8_wire_cut(void)
{
    const wsync_quant_scheme_t q[TP] = {WSYNC_QUANT_BLOCK, WSYNC_QUANT_BLOCK};
    const int rank[TP] = {0, 1};
    group_t g, gt;
    wsync_plan_summary_t *s = NULL, *t = NULL;

    CHECK(group_build_of(&g, NSEND, q, rank, 32, 64) == 0);
    CHECK_OK(summarize_wire(&g, 0, 1, &s));
    CHECK(group_build(&gt, WSYNC_QUANT_TENSOR, 64) == 0);
    CHECK_OK(summarize_wire(&gt, 0, 1, &t));
    if (s && t) {
        uint64_t fp8 = 0, cut = 0, quant = 0;
        check_consistent(s);
        check_forms(s);
        check_forms(t);
        for (int r = 0; r < TP; r++)
            for (int sn = 0; sn < NSEND; sn++) {
                uint64_t p = ref_pair_elems(sn, NSEND, r, TP, 64, 0);
                uint64_t gu = ref_kind_elems(sn, NSEND, r, TP, 64, COLS);
                uint64_t c = ref_kind_elems(sn, NSEND, r, TP, 64, Q) +
                             ref_kind_elems(sn, NSEND, r, TP, 64, KV) +
                             ref_kind_elems(sn, NSEND, r, TP, 64, ROWPAR);
                CHECK(gu + c == ref_pair_elems(sn, NSEND, r, TP, 64, 1));
                CHECK_MSG(s->pair_bytes[sn * TP + r] == (p + c) * BF16 + ref_wire32(gu),
                          "pair (%d, %d): %" PRIu64, sn, r, s->pair_bytes[sn * TP + r]);
                fp8 += ref_wire32(gu);
                cut += c * BF16;
                quant += gu + c;
            }
        CHECK(s->fp8_wire_bytes == fp8);
        CHECK_MSG(s->form_bytes[WSYNC_WIRE_CUT_CELLS] == cut, "cut cells %" PRIu64 ", reference "
                  "%" PRIu64, s->form_bytes[WSYNC_WIRE_CUT_CELLS], cut);
        CHECK(s->form_bytes[WSYNC_WIRE_SHARED] == 0 && s->form_bytes[WSYNC_WIRE_UNCOVERED] == 0);
        for (size_t j = 0; j < g.ntg; j++) {
            const char *n = g.all_targets[j].name;
            int want = g.all_targets[j].dtype != WSYNC_DTYPE_F8E4M3FN ? WSYNC_WIRE_PLAIN
                       : strstr(n, "gate_up_proj") ? WSYNC_WIRE_FP8 : WSYNC_WIRE_CUT_CELLS;
            CHECK_MSG(s->target_form[j] == want, "%s: form %d, expected %d", n,
                      s->target_form[j], want);
        }
        /* per-tensor: every FP8 target FP8 (its senders agree on the amax), whatever the
         * FSDP rows cut: its codes (a byte per element) and one f32 scale per chunk, each
         * chunk's codes padded to 4 bytes (at most 7 bytes more per segment) */
        CHECK(t->form_bytes[WSYNC_WIRE_PER_TENSOR] == 0);
        CHECK(t->form_param_bytes[WSYNC_WIRE_FP8] == quant * BF16);
        CHECK_MSG(t->fp8_wire_bytes > quant && t->fp8_wire_bytes <= quant + 8u * t->nsegments,
                  "per-tensor FP8 bytes %" PRIu64 " for %" PRIu64 " codes", t->fp8_wire_bytes,
                  quant);
        for (size_t j = 0; j < gt.ntg; j++)
            CHECK(t->target_form[j] == (gt.all_targets[j].dtype == WSYNC_DTYPE_F8E4M3FN
                                            ? WSYNC_WIRE_FP8 : WSYNC_WIRE_PLAIN));
    }
    wsync_plan_summary_free(s);
    wsync_plan_summary_free(t);
    group_free(&g);
    group_free(&gt);
}

/* Receiver 0 wants TP rank 0 in FP8 blocks, receiver 1 the same rank in bf16: every chunk of
 * receiver 0's FP8 targets feeds a bf16 target too, so they travel plain, as "shared", also when
 * small buckets split those chunks at rows that are not block rows (the summary joins the parts
 * again before judging the cells). */
static void summary_fp8_wire_shared(void)
{
    const wsync_quant_scheme_t q[TP] = {WSYNC_QUANT_BLOCK, WSYNC_QUANT_NONE};
    const int rank[TP] = {0, 0};
    static const size_t buckets[] = {0, 16384, 20000};
    group_t g;
    uint64_t whole_chunks = 0;

    CHECK(group_build_of(&g, 2, q, rank, 32, 64) == 0);
    for (size_t b = 0; b < sizeof(buckets) / sizeof(buckets[0]); b++) {
        wsync_plan_summary_t *s = NULL;
        CHECK_OK(summarize_wire(&g, buckets[b], 1, &s));
        if (s == NULL)
            continue;
        uint64_t quant = 0;
        check_forms(s);
        for (int sn = 0; sn < 2; sn++)
            quant += ref_pair_elems(sn, 2, 0, TP, 64, 1);
        CHECK(s->fp8_wire_bytes == 0);
        CHECK_MSG(s->form_bytes[WSYNC_WIRE_SHARED] == quant * BF16,
                  "bucket %zu: shared %" PRIu64 ", reference %" PRIu64 ", cut cells %" PRIu64,
                  buckets[b], s->form_bytes[WSYNC_WIRE_SHARED], quant * BF16,
                  s->form_bytes[WSYNC_WIRE_CUT_CELLS]);
        for (size_t j = 0; j < g.ntg; j++)
            CHECK(s->target_form[j] == (g.all_targets[j].dtype == WSYNC_DTYPE_F8E4M3FN
                                            ? WSYNC_WIRE_SHARED : WSYNC_WIRE_PLAIN));
        if (buckets[b] == 0)
            whole_chunks = s->nchunks;
        else   /* bf16 rows of 256 or 384 bytes: 64 or 42 to a bucket, splits mid-block */
            CHECK_MSG(s->nchunks > whole_chunks + 20, "%" PRIu64 " chunks, %" PRIu64 " unsplit",
                      s->nchunks, whole_chunks);
        wsync_plan_summary_free(s);
    }
    group_free(&g);
}

/* A group counted by hand: one receiver, two senders, 64 x 64 bf16 params.
 *  a8: blocks of 32 from a, whose senders hold rows [0, 16) and [16, 64): cut cells, plain;
 *  b8: channel scales from b, rows [0, 32) and [32, 64): two chunks of 32 x 64 codes and 32
 *      scales, 2,048 + 128 bytes each;
 *  c8: blocks of 32, 96 rows of which c covers 64: uncovered, plain. */
static void summary_fp8_wire_by_hand(void)
{
    wsync_shard_t sh[5];
    int sender[5] = {0, 1, 0, 1, 0};
    wsync_piece_t pc[3];
    wsync_target_t tg[3];
    wsync_plan_summary_t *s = NULL;
    static const char *names[3] = {"a", "b", "c"};
    static const int64_t a_rows[2][2] = {{0, 16}, {16, 48}}, b_rows[2][2] = {{0, 32}, {32, 32}};

    memset(sh, 0, sizeof(sh));
    memset(pc, 0, sizeof(pc));
    memset(tg, 0, sizeof(tg));
    for (int i = 0; i < 5; i++) {
        int p = i < 2 ? 0 : i < 4 ? 1 : 2;
        sh[i].param = (wsync_param_t){names[p], WSYNC_DTYPE_BF16, 2, {64, 64}};
        sh[i].box.start[0] = p == 0 ? a_rows[i][0] : p == 1 ? b_rows[i - 2][0] : 0;
        sh[i].box.len[0] = p == 0 ? a_rows[i][1] : p == 1 ? b_rows[i - 2][1] : 64;
        sh[i].box.len[1] = 64;
        sh[i].mem = WSYNC_MEM_HOST;
    }
    for (int t = 0; t < 3; t++) {
        pc[t].param = sh[2 * t].param;
        pc[t].src.len[0] = 64;
        pc[t].src.len[1] = 64;
        tg[t].name = t == 0 ? "a8" : t == 1 ? "b8" : "c8";
        tg[t].dtype = WSYNC_DTYPE_F8E4M3FN;
        tg[t].ndim = 2;
        tg[t].shape[0] = t == 2 ? 96 : 64;
        tg[t].shape[1] = 64;
        tg[t].mem = WSYNC_MEM_HOST;
        tg[t].pieces = &pc[t];
        tg[t].npieces = 1;
        tg[t].quant.scheme = t == 1 ? WSYNC_QUANT_CHANNEL : WSYNC_QUANT_BLOCK;
        tg[t].quant.block_rows = tg[t].quant.block_cols = t == 1 ? 0 : 32;
    }
    CHECK_OK(wsync_plan_summarize_wire(sh, sender, 5, tg, NULL, 3, 2, 1, 0, 1, &s));
    if (s) {
        check_forms(s);
        CHECK(s->ntargets == 3);
        CHECK(s->target_form[0] == WSYNC_WIRE_CUT_CELLS && s->target_bytes[0] == 64 * 64 * 2);
        CHECK(s->target_form[1] == WSYNC_WIRE_FP8 && s->target_bytes[1] == 2 * (2048 + 128));
        CHECK(s->target_param_bytes[1] == 64 * 64 * 2);
        CHECK(s->target_form[2] == WSYNC_WIRE_UNCOVERED && s->target_bytes[2] == 64 * 64 * 2);
        CHECK_MSG(s->pair_bytes[0] == 16 * 64 * 2 + 2176 + 8192 &&
                      s->pair_bytes[1] == 48 * 64 * 2 + 2176,
                  "pairs %" PRIu64 ", %" PRIu64, s->pair_bytes[0], s->pair_bytes[1]);
        CHECK(s->fp8_wire_bytes == 4352);
        CHECK(s->total_param_bytes == 3 * 8192);
    }
    wsync_plan_summary_free(s);
    s = NULL;
    CHECK_ST(wsync_plan_summarize_wire(sh, sender, 5, tg, NULL, 3, 2, 1, 0, 2, &s),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("fp8_wire = 2");
    CHECK(s == NULL);
}

static void summary_errors(void)
{
    wsync_model_config_t cfg;
    wsync_plan_summary_t *s = NULL;
    group_t g;

    CHECK_ST(wsync_model_config_load(WSYNC_TESTDATA "/no_such_dir/config.json", &cfg),
             WSYNC_ERR_IO);
    CHECK_ERR_HAS(WSYNC_TESTDATA "/no_such_dir/config.json");

    CHECK(group_build(&g, WSYNC_QUANT_NONE, 64) == 0);
    CHECK_ST(wsync_plan_summarize(g.all_shards, g.shard_sender, g.nsh, g.all_targets,
                                  g.target_receiver, g.ntg, NSEND, TP, 0, NULL),
             WSYNC_ERR_INVALID);
    /* a receiver rank outside [0, nreceivers) */
    CHECK_ST(wsync_plan_summarize(g.all_shards, g.shard_sender, g.nsh, g.all_targets,
                                  g.target_receiver, g.ntg, NSEND, 1, 0, &s),
             WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("receiver 1");
    /* the compiler's error passes through: without sender 0's first shard (embed_tokens
     * rows [0, 128)), receiver 0's embed_tokens piece is not covered */
    CHECK(strcmp(g.all_shards[0].param.name, "model.embed_tokens.weight") == 0);
    CHECK_ST(wsync_plan_summarize(g.all_shards + 1, g.shard_sender + 1, g.nsh - 1,
                                  g.all_targets, g.target_receiver, g.ntg, NSEND, TP, 0, &s),
             WSYNC_ERR_MISMATCH);
    CHECK_ERR_HAS("model.embed_tokens.weight");
    /* bucket below the compiler's minimum */
    CHECK_ST(summarize(&g, 8, &s), WSYNC_ERR_INVALID);
    CHECK(s == NULL);   /* outputs untouched on failure */
    group_free(&g);
    wsync_plan_summary_free(NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* The tool                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Runs cmd, returns its output (caller frees) and exit status. */
static char *run(const char *cmd, int *status)
{
    FILE *f = popen(cmd, "r");
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    if (f == NULL || buf == NULL) {
        if (f)
            pclose(f);
        free(buf);
        return NULL;
    }
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap *= 2);
            if (nb == NULL)
                break;
            buf = nb;
        }
    }
    buf[len] = '\0';
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

static const char *last_line(char *out)
{
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '\n')
        out[--n] = '\0';
    char *nl = strrchr(out, '\n');
    return nl ? nl + 1 : out;
}

static uint64_t jint(const json_t *o, const char *key)
{
    return (uint64_t)json_integer_value(json_object_get(o, key));
}

static void tool_json(void)
{
    int status = -1;
    char *out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --json", &status);
    CHECK(out != NULL);
    if (out == NULL)
        return;
    CHECK_MSG(status == 0, "exit %d: %s", status, out);
    CHECK(strstr(out, "quantized on the") != NULL);   /* the footer's honesty note */
    json_error_t err;
    json_t *j = json_loads(last_line(out), 0, &err);
    CHECK_MSG(j != NULL && json_is_object(j), "last line is not a JSON object: %s", err.text);
    if (j) {
        static const char *keys[] = {"bytes_per_receiver", "bytes_landed_per_receiver",
                                     "naive_bytes_per_receiver", "total_bytes",
                                     "naive_total_bytes", "ratio_to_naive", "floor_seconds",
                                     "pair_bytes", "config"};
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            CHECK_MSG(json_object_get(j, keys[i]) != NULL, "key %s missing", keys[i]);
        const json_t *bpr = json_object_get(j, "bytes_per_receiver");
        CHECK(json_is_array(bpr) && json_array_size(bpr) == TP);
        uint64_t sum = 0, max_in = 0, max_out = 0;
        for (int r = 0; r < TP; r++) {
            uint64_t b = (uint64_t)json_integer_value(json_array_get(bpr, (size_t)r));
            CHECK_MSG(b == ref_receiver_bytes(r, TP, 64), "receiver %d: %" PRIu64, r, b);
            sum += b;
            max_in = b > max_in ? b : max_in;
        }
        for (int s = 0; s < NSEND; s++) {
            uint64_t o = 0;
            for (int r = 0; r < TP; r++)
                o += ref_pair_elems(s, NSEND, r, TP, 64, -1) * BF16;
            max_out = o > max_out ? o : max_out;
        }
        CHECK(jint(j, "total_bytes") == sum);
        CHECK(jint(j, "naive_bytes_per_receiver") == ref_naive_bytes());
        CHECK(jint(j, "naive_total_bytes") == ref_naive_bytes() * TP);
        double ratio = json_real_value(json_object_get(j, "ratio_to_naive"));
        CHECK(fabs(ratio - (double)sum / (double)(ref_naive_bytes() * TP)) < 1e-9);
        double floor_s = json_real_value(json_object_get(j, "floor_seconds"));
        /* 400 Gb/s NICs: 50e9 bytes a second each */
        double want = (double)(max_in > max_out ? max_in : max_out) / 50e9;
        CHECK_MSG(fabs(floor_s - want) <= 1e-9 * want, "floor %g, reference %g", floor_s, want);
        const json_t *conf = json_object_get(j, "config");
        CHECK(json_integer_value(json_object_get(conf, "senders")) == NSEND);
        CHECK(json_integer_value(json_object_get(conf, "tp")) == TP);
        CHECK(json_integer_value(json_object_get(conf, "replicas")) == 1);
        CHECK(strcmp(json_string_value(json_object_get(conf, "quant")), "none") == 0);
        json_decref(j);
    }
    free(out);
}

static const json_t *jget(const json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

/* wsync-plan with FP8 on the wire, FSDP-3 -> TP-2 and 32 x 32 blocks, against the hand count of
 * summary_fp8_wire_cut: gate_up travels FP8, q/k/v, o and down plain for cut cells; the floor is
 * the busiest NIC's bytes as they travel; the per-target listing says which is which. With
 * --fp8-wire off the same targets travel as bf16 and say why. */
static void tool_fp8_wire(void)
{
    uint64_t fp8 = 0, cut = 0, quant = 0, in[TP] = {0}, out_b[NSEND] = {0}, most = 0;
    for (int r = 0; r < TP; r++)
        for (int sn = 0; sn < NSEND; sn++) {
            uint64_t p = ref_pair_elems(sn, NSEND, r, TP, 64, 0);
            uint64_t gu = ref_kind_elems(sn, NSEND, r, TP, 64, COLS);
            uint64_t c = ref_pair_elems(sn, NSEND, r, TP, 64, 1) - gu;
            uint64_t b = (p + c) * BF16 + ref_wire32(gu);
            fp8 += ref_wire32(gu);
            cut += c * BF16;
            quant += (gu + c) * BF16;
            in[r] += b;
            out_b[sn] += b;
        }
    for (int r = 0; r < TP; r++)
        most = in[r] > most ? in[r] : most;
    for (int sn = 0; sn < NSEND; sn++)
        most = out_b[sn] > most ? out_b[sn] : most;

    int status = -1;
    char *out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --quant fp8-block "
                    "--fp8-block 32 --json", &status);
    CHECK(out != NULL);
    if (out == NULL)
        return;
    CHECK_MSG(status == 0, "exit %d: %s", status, out);
    CHECK_MSG(strstr(out, "model.layers.*.mlp.gate_up_proj.weight") != NULL &&
                  strstr(out, "fp8 4") != NULL && strstr(out, "cut cells 4") != NULL,
              "per-target listing: %s", out);
    json_error_t err;
    json_t *j = json_loads(last_line(out), 0, &err);
    CHECK_MSG(j != NULL, "last line is not JSON: %s", err.text);
    if (j) {
        CHECK(json_is_true(json_object_get(j, "fp8_wire")));
        CHECK_MSG(jint(j, "fp8_wire_bytes") == fp8, "fp8_wire_bytes %" PRIu64 ", reference %"
                  PRIu64, jint(j, "fp8_wire_bytes"), fp8);
        CHECK(json_integer_value(json_object_get(jget(j, "wire_forms", "cut_cells"), "bytes")) ==
              (json_int_t)cut);
        CHECK(jint(j, "fp8_targets_bytes") == fp8 + cut);
        CHECK(jint(j, "fp8_targets_param_bytes") == quant);
        double ratio = json_real_value(json_object_get(j, "fp8_targets_ratio"));
        CHECK(fabs(ratio - (double)(fp8 + cut) / (double)quant) < 1e-9);
        double floor_s = json_real_value(json_object_get(j, "floor_seconds"));
        CHECK_MSG(fabs(floor_s - (double)most / 50e9) <= 1e-9 * floor_s, "floor %g, reference %g",
                  floor_s, (double)most / 50e9);
        CHECK(json_integer_value(jget(j, "config", "fp8_block")) == 32);
        json_decref(j);
    }
    free(out);
    out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --quant fp8-block --fp8-block 32 "
              "--fp8-wire off --json", &status);
    CHECK(out != NULL && status == 0);
    j = out ? json_loads(last_line(out), 0, &err) : NULL;
    CHECK(j != NULL);
    if (j) {
        CHECK(json_is_false(json_object_get(j, "fp8_wire")));
        CHECK(jint(j, "fp8_wire_bytes") == 0);
        CHECK(json_integer_value(json_object_get(jget(j, "wire_forms", "off"), "bytes")) ==
              (json_int_t)quant);
        CHECK(jint(j, "total_bytes") == jint(j, "total_param_bytes"));
        json_decref(j);
    }
    free(out);
}

/* --quant fp8-tensor: every FP8 target travels FP8 (its senders agree on the amax), codes a
 * byte per element plus a few f32 scales (one per chunk); with --fp8-wire off, every one is
 * plain for its per-tensor scale. */
static void tool_fp8_tensor(void)
{
    int status = -1;
    json_error_t err;
    json_t *j;
    char *out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --quant fp8-tensor --json",
                    &status);
    CHECK(out != NULL && status == 0);
    CHECK_MSG(out && strstr(out, "fp8 4") != NULL && strstr(out, "per-tensor 4") == NULL,
              "per-target listing: %s", out ? out : "");
    j = out ? json_loads(last_line(out), 0, &err) : NULL;
    CHECK(j != NULL);
    if (j) {
        uint64_t param = jint(j, "fp8_targets_param_bytes"), fp8 = jint(j, "fp8_wire_bytes");
        CHECK(param > 0 && jint(j, "fp8_targets_bytes") == fp8);
        CHECK(json_integer_value(json_object_get(jget(j, "wire_forms", "per_tensor"), "bytes")) ==
              0);
        CHECK_MSG(fp8 > param / 2 && fp8 - param / 2 < param / 1000, "FP8 bytes %" PRIu64
                  " for %" PRIu64 " bf16 bytes", fp8, param);
        json_decref(j);
    }
    free(out);
    out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --quant fp8-tensor --fp8-wire off "
              "--json", &status);
    CHECK(out != NULL && status == 0);
    j = out ? json_loads(last_line(out), 0, &err) : NULL;
    CHECK(j != NULL);
    if (j) {
        CHECK(jint(j, "fp8_wire_bytes") == 0);
        CHECK(json_integer_value(json_object_get(jget(j, "wire_forms", "per_tensor"), "bytes")) ==
              (json_int_t)jint(j, "fp8_targets_param_bytes"));
        json_decref(j);
    }
    free(out);
}

static void tool_errors(void)
{
    int status = 0;
    char *out = run(TOOL " --config /nonexistent/wsync/config.json --senders 3 --tp 2 2>&1",
                    &status);
    CHECK(out != NULL && status != 0);
    CHECK_MSG(out && strstr(out, "/nonexistent/wsync/config.json"), "output: %s", out);
    free(out);
    out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --quant fp9 2>&1", &status);
    CHECK(out != NULL && status == 2);
    CHECK_MSG(out && strstr(out, "--quant"), "output: %s", out);
    free(out);
    out = run(TOOL " --config '" CONFIG "' --senders 3 --tp 2 --fp8-wire maybe 2>&1", &status);
    CHECK(out != NULL && status == 2);
    CHECK_MSG(out && strstr(out, "--fp8-wire"), "output: %s", out);
    free(out);
    out = run(TOOL " --config '" CONFIG "' --senders 0 --tp 2 2>&1", &status);
    CHECK(out != NULL && status == 2);
    CHECK_MSG(out && strstr(out, "--senders"), "output: %s", out);
    free(out);
}

int main(void)
{
    RUN(summary_matches_reference);
    RUN(summary_small_buckets);
    RUN(summary_wire_check);
    RUN(summary_fp8_moved_vs_landed);
    RUN(summary_fp8_wire_whole);
    RUN(summary_fp8_wire_cut);
    RUN(summary_fp8_wire_shared);
    RUN(summary_fp8_wire_by_hand);
    RUN(summary_errors);
    RUN(tool_json);
    RUN(tool_fp8_wire);
    RUN(tool_fp8_tensor);
    RUN(tool_errors);
    return check_summary();
}
