/* Megatron-Core trainers as senders, end to end through the ipc scheme on host memory. Each sender
 * process is one Megatron rank: it builds, from the tiny HF checkpoint, the tensors that rank holds
 * by Megatron's rules written here (linear_qkv = the per-group [q heads; k; v] rows chunked by TP,
 * linear_fc1 = [gate chunk; up chunk], dim-1 chunks of linear_proj / linear_fc2, a vocabulary
 * padded to a multiple of 128 * T and chunked, TEGroupedMLP expert i = ep_rank * E/EP + i chunked
 * by ETP), describes them with wsync_layout_megatron_tensors + wsync_layout_tensor_shards (read
 * in place) and pushes. Two receivers hold vLLM's TP-2 (or EP-2) targets; every byte of every
 * target must equal the checkpoint's, placed as the target's pieces say.
 * Cases: dense Qwen3, TP-2 senders; Qwen3-MoE, 4 senders TP-2 x EP-2 with ETP-2 (etp_rank =
 * tp_rank), to TP-2 and to EP-2 receivers. */
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "tests/support/safetensors_min.h"
#include "wsync/wsync.h"
#include "wsync/wsync_layout.h"

#define DENSE WSYNC_TESTDATA "/hf_qwen3_tiny"
#define MOE WSYNC_TESTDATA "/hf_qwen3_moe_tiny"
#define TIMEOUT_MS 20000
#define NRECEIVERS 2
#define MAX_SENDERS 4
#define ES 2   /* bf16 */

static char coord_addr[64];

typedef struct {
    const char *model;
    int rank, nsenders;
    int tp_rank, tp, ep_rank, ep, etp_rank, etp;
    int ep_receivers;
} role_t;

static const st_tensor_t *need(const st_file_t *f, const char *name)
{
    const st_tensor_t *t = st_find(f, name);
    CHECK_MSG(t != NULL, "the checkpoint has no '%s'", name);
    return t;
}

static size_t row_bytes(const st_tensor_t *t)
{
    return t->ndim == 1 ? ES : (size_t)t->nbytes / (size_t)t->shape[0];
}

/* Copy rows [r0, r0 + n) of checkpoint tensor `name` to dst; returns the bytes copied. */
static size_t copy_rows(const st_file_t *f, const char *name, int64_t r0, int64_t n, uint8_t *dst)
{
    const st_tensor_t *t = need(f, name);
    if (t == NULL)
        return 0;
    const size_t rb = row_bytes(t);
    memcpy(dst, t->data + (size_t)r0 * rb, (size_t)n * rb);
    return (size_t)n * rb;
}

/* Megatron-Core's tensor `name` on this rank, by Megatron's rules (malloc'd, *nbytes); NULL for a
 * name this test does not know (a failure). */
static uint8_t *megatron_tensor(const st_file_t *f, const wsync_model_config_t *c,
                                const role_t *rk, const char *name, size_t *nbytes)
{
    const int64_t H = c->num_attention_heads, G = c->num_key_value_heads, D = c->head_dim;
    const int64_t Hd = c->hidden_size;
    char rest[100], a[160], b[160], v[160];
    int64_t l = -1, i = -1;
    int n = 0, fc = 0;
    uint8_t *t;

    if (strcmp(name, "embedding.word_embeddings.weight") == 0 ||
        strcmp(name, "output_layer.weight") == 0) {
        const int64_t V = c->vocab_size, mult = 128 * rk->tp;
        const int64_t Vr = (V + mult - 1) / mult * mult / rk->tp, r0 = rk->tp_rank * Vr;
        *nbytes = (size_t)(Vr * Hd) * ES;
        t = calloc(1, *nbytes);   /* padding rows are zero */
        if (r0 < V)
            copy_rows(f, name[0] == 'e' ? "model.embed_tokens.weight" : "lm_head.weight", r0,
                      V - r0 < Vr ? V - r0 : Vr, t);
        return t;
    }
    if (strcmp(name, "decoder.final_layernorm.weight") == 0) {
        *nbytes = (size_t)Hd * ES;
        t = malloc(*nbytes);
        copy_rows(f, "model.norm.weight", 0, Hd, t);
        return t;
    }
    if (sscanf(name, "decoder.layers.%" SCNd64 ".%99s%n", &l, rest, &n) != 2 ||
        n != (int)strlen(name))
        return NULL;
    const char *whole = strcmp(rest, "self_attention.linear_qkv.layer_norm_weight") == 0
                            ? "input_layernorm.weight"
                        : strcmp(rest, "self_attention.q_layernorm.weight") == 0
                            ? "self_attn.q_norm.weight"
                        : strcmp(rest, "self_attention.k_layernorm.weight") == 0
                            ? "self_attn.k_norm.weight"
                        : strcmp(rest, "mlp.linear_fc1.layer_norm_weight") == 0 ||
                                  strcmp(rest, "pre_mlp_layernorm.weight") == 0
                            ? "post_attention_layernorm.weight"
                        : strcmp(rest, "mlp.router.weight") == 0 ? "mlp.gate.weight"
                                                                 : NULL;
    if (whole != NULL) {
        snprintf(a, sizeof(a), "model.layers.%" PRId64 ".%s", l, whole);
        const st_tensor_t *s = need(f, a);
        if (s == NULL)
            return NULL;
        *nbytes = s->nbytes;
        t = malloc(*nbytes);
        memcpy(t, s->data, *nbytes);
        return t;
    }
    if (strcmp(rest, "self_attention.linear_qkv.weight") == 0) {
        /* the whole fused weight is G groups of [H/G q heads; k head; v head] rows; rank r holds
         * rows [r * all/T, (r + 1) * all/T) of it */
        const int64_t per = (H / G + 2) * D, all = G * per, mine = all / rk->tp;
        uint8_t *full = malloc((size_t)(all * Hd) * ES), *w = full;
        snprintf(a, sizeof(a), "model.layers.%" PRId64 ".self_attn.q_proj.weight", l);
        snprintf(b, sizeof(b), "model.layers.%" PRId64 ".self_attn.k_proj.weight", l);
        snprintf(v, sizeof(v), "model.layers.%" PRId64 ".self_attn.v_proj.weight", l);
        for (int64_t g = 0; g < G; g++) {
            w += copy_rows(f, a, g * (H / G) * D, (H / G) * D, w);
            w += copy_rows(f, b, g * D, D, w);
            w += copy_rows(f, v, g * D, D, w);
        }
        *nbytes = (size_t)(mine * Hd) * ES;
        t = malloc(*nbytes);
        memcpy(t, full + (size_t)(rk->tp_rank * mine * Hd) * ES, *nbytes);
        free(full);
        return t;
    }
    const char *gate = NULL, *up = NULL, *down = NULL;
    int s = rk->tp_rank, S = rk->tp;
    if (strcmp(rest, "mlp.linear_fc1.weight") == 0) {
        snprintf(a, sizeof(a), "model.layers.%" PRId64 ".mlp.gate_proj.weight", l);
        snprintf(b, sizeof(b), "model.layers.%" PRId64 ".mlp.up_proj.weight", l);
        gate = a;
        up = b;
    } else if (strcmp(rest, "mlp.linear_fc2.weight") == 0) {
        snprintf(a, sizeof(a), "model.layers.%" PRId64 ".mlp.down_proj.weight", l);
        down = a;
    } else if (strcmp(rest, "self_attention.linear_proj.weight") == 0) {
        snprintf(a, sizeof(a), "model.layers.%" PRId64 ".self_attn.o_proj.weight", l);
        down = a;
    } else if (sscanf(rest, "mlp.experts.linear_fc%d.weight%" SCNd64 "%n", &fc, &i, &n) == 2 &&
               n == (int)strlen(rest) && (fc == 1 || fc == 2)) {
        const int64_t e = rk->ep_rank * (c->num_experts / rk->ep) + i;
        snprintf(a, sizeof(a), "model.layers.%" PRId64 ".mlp.experts.%" PRId64 ".%s.weight", l, e,
                 fc == 1 ? "gate_proj" : "down_proj");
        snprintf(b, sizeof(b), "model.layers.%" PRId64 ".mlp.experts.%" PRId64 ".up_proj.weight",
                 l, e);
        if (fc == 1) {
            gate = a;
            up = b;
        } else {
            down = a;
        }
        s = rk->etp_rank;
        S = rk->etp;
    } else {
        return NULL;
    }
    if (gate != NULL) {   /* [gate.chunk(S)[s]; up.chunk(S)[s]] */
        const st_tensor_t *g = need(f, gate);
        if (g == NULL)
            return NULL;
        const int64_t per = g->shape[0] / S;
        *nbytes = 2 * (size_t)per * row_bytes(g);
        t = malloc(*nbytes);
        size_t at = copy_rows(f, gate, s * per, per, t);
        copy_rows(f, up, s * per, per, t + at);
        return t;
    }
    const st_tensor_t *d = need(f, down);   /* d.chunk(S, dim=1)[s] */
    if (d == NULL)
        return NULL;
    const int64_t R = d->shape[0], N = d->shape[1], per = N / S;
    *nbytes = (size_t)(R * per) * ES;
    t = malloc(*nbytes);
    for (int64_t r = 0; r < R; r++)
        memcpy(t + (size_t)(r * per) * ES, d->data + (size_t)(r * N + s * per) * ES,
               (size_t)per * ES);
    return t;
}

static int open_model(const char *model, wsync_model_config_t *cfg, st_file_t **f,
                      wsync_ctx_t **ctx)
{
    char path[256], err[256];

    snprintf(path, sizeof(path), "%s/config.json", model);
    CHECK_OK(wsync_model_config_load(path, cfg));
    snprintf(path, sizeof(path), "%s/model.safetensors", model);
    CHECK_MSG(st_open(path, f, err, sizeof(err)) == 0, "%s", err);
    if (*f == NULL)
        return -1;
    CHECK_OK(wsync_ctx_create(NULL, ctx));
    return *ctx != NULL ? 0 : -1;
}

static int sender_main(void *arg)
{
    const role_t *r = arg;
    wsync_model_config_t cfg;
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    st_file_t *f = NULL;
    wsync_target_t *ts = NULL;
    size_t nt = 0, described = 0;

    if (open_model(r->model, &cfg, &f, &ctx) != 0)
        return 1;
    sp.coordinator = coord_addr;
    sp.rank = r->rank;
    sp.nranks = r->nsenders;
    sp.nreceivers = NRECEIVERS;
    sp.scheme = "ipc";
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    CHECK_OK(wsync_layout_megatron_tensors(&cfg, 0, r->tp_rank, r->tp, r->ep_rank, r->ep,
                                           r->etp_rank, r->etp, 0, &ts, &nt));
    if (s == NULL || ts == NULL)
        return 1;
    uint8_t **mem = calloc(nt, sizeof(*mem));
    for (size_t k = 0; k < nt; k++) {
        size_t nbytes = 0;
        mem[k] = megatron_tensor(f, &cfg, r, ts[k].name, &nbytes);
        CHECK_MSG(mem[k] != NULL && nbytes == wsync_target_bytes(&ts[k]),
                  "rank %d: Megatron tensor %s: %zu bytes, the layout says %zu", r->rank,
                  ts[k].name, nbytes, wsync_target_bytes(&ts[k]));
        if (mem[k] == NULL)
            continue;
        wsync_shard_t *sh = NULL;
        size_t ns = 0;
        CHECK_OK(wsync_layout_tensor_shards(&ts[k], mem[k], WSYNC_MEM_HOST, 0, &sh, &ns));
        for (size_t j = 0; j < ns; j++)
            CHECK_OK(wsync_sender_add_shard(s, &sh[j]));
        described += ns;
        wsync_layout_shards_free(sh, ns);
    }
    CHECK(described > nt / 2);
    CHECK_OK(wsync_sender_push(s, 1));
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    for (size_t k = 0; k < nt; k++)
        free(mem[k]);
    free(mem);
    wsync_layout_targets_free(ts, nt);
    st_close(f);
    return check_failures ? 1 : 0;
}

/* What a 1-D or 2-D target must hold: each piece's box of the checkpoint tensor at dst_start. */
static uint8_t *expected_target(const st_file_t *f, const wsync_target_t *t)
{
    uint8_t *want = calloc(1, wsync_target_bytes(t) + 1);
    const int64_t tcols = t->ndim == 2 ? t->shape[1] : t->shape[0];

    for (int i = 0; i < t->npieces; i++) {
        const wsync_piece_t *pc = &t->pieces[i];
        const st_tensor_t *src = need(f, pc->param.name);
        if (src == NULL)
            continue;
        const int two = pc->param.ndim == 2;
        const int64_t scols = two ? src->shape[1] : src->shape[0];
        const int64_t rows = two ? pc->src.len[0] : 1, cols = two ? pc->src.len[1] : pc->src.len[0];
        const int64_t r0 = two ? pc->src.start[0] : 0;
        const int64_t c0 = two ? pc->src.start[1] : pc->src.start[0];
        const int64_t d0 = t->ndim == 2 ? pc->dst_start[0] : 0;
        const int64_t d1 = t->ndim == 2 ? pc->dst_start[1] : pc->dst_start[0];
        for (int64_t y = 0; y < rows; y++)
            memcpy(want + (size_t)((d0 + y) * tcols + d1) * ES,
                   src->data + (size_t)((r0 + y) * scols + c0) * ES, (size_t)cols * ES);
    }
    return want;
}

static int receiver_main(void *arg)
{
    const role_t *r = arg;
    wsync_model_config_t cfg;
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_tp_options_t opt = WSYNC_TP_OPTIONS_INIT;
    wsync_target_t *targets = NULL;
    size_t n = 0;
    st_file_t *f = NULL;
    uint64_t got = 0;

    if (open_model(r->model, &cfg, &f, &ctx) != 0)
        return 1;
    if (r->ep_receivers) {
        opt.ep_size = NRECEIVERS;
        opt.ep_rank = r->rank;
    }
    CHECK_OK(wsync_layout_tp_targets(&cfg, r->rank, NRECEIVERS, &opt, &targets, &n));
    rp.coordinator = coord_addr;
    rp.rank = r->rank;
    rp.nreceivers = NRECEIVERS;
    rp.timeout_ms = TIMEOUT_MS;
    rp.heartbeat_ms = 200;
    CHECK_OK(wsync_receiver_create(ctx, &rp, &rv));
    if (rv == NULL || targets == NULL)
        return 1;
    for (size_t i = 0; i < n; i++) {
        targets[i].data = calloc(1, wsync_target_bytes(&targets[i]) + 1);
        CHECK_OK(wsync_receiver_add_target(rv, &targets[i]));
    }
    CHECK_OK(wsync_receiver_wait(rv, TIMEOUT_MS, &got));
    CHECK(got == 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t *want = expected_target(f, &targets[i]);
        const size_t bytes = wsync_target_bytes(&targets[i]);
        size_t bad = 0, first = bytes;
        const uint8_t *have = targets[i].data;
        for (size_t b = 0; b < bytes; b++)
            if (have[b] != want[b] && bad++ == 0)
                first = b;
        CHECK_MSG(bad == 0, "receiver %d: target %s: %zu of %zu bytes differ from the checkpoint, "
                  "the first at byte %zu", r->rank, targets[i].name, bad, bytes, first);
        free(want);
        free(targets[i].data);
        targets[i].data = NULL;
    }
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    wsync_layout_targets_free(targets, n);
    st_close(f);
    return check_failures ? 1 : 0;
}

/* nsenders Megatron ranks of (tp, ep, etp): sender k has tp_rank k % tp, ep_rank k / tp and
 * etp_rank = tp_rank % etp. */
static void run(const char *model, int tp, int ep, int etp, int ep_receivers)
{
    role_t roles[MAX_SENDERS + NRECEIVERS];
    pid_t pids[MAX_SENDERS + NRECEIVERS];
    int codes[MAX_SENDERS + NRECEIVERS];
    const int nsenders = tp * ep;
    int n = 0;

    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    for (int k = 0; k < nsenders; k++, n++) {
        roles[n] = (role_t){model, k, nsenders, k % tp, tp, k / tp, ep, (k % tp) % etp, etp,
                            ep_receivers};
        pids[n] = proc_spawn(sender_main, &roles[n], 60);
    }
    for (int r = 0; r < NRECEIVERS; r++, n++) {
        roles[n] = (role_t){model, r, nsenders, 0, 1, 0, 1, 0, 1, ep_receivers};
        pids[n] = proc_spawn(receiver_main, &roles[n], 60);
    }
    proc_wait_all(pids, n, 60000, codes);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "%s %d exited with %d", i < nsenders ? "sender" : "receiver",
                  i < nsenders ? i : i - nsenders, codes[i]);
}

static void case_dense_tp2_to_tp2(void) { run(DENSE, 2, 1, 1, 0); }
static void case_moe_tp2_ep2_etp2_to_tp2(void) { run(MOE, 2, 2, 2, 0); }
static void case_moe_tp2_ep2_to_ep2(void) { run(MOE, 2, 2, 1, 1); }

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(case_dense_tp2_to_tp2);
    RUN(case_moe_tp2_ep2_etp2_to_tp2);
    RUN(case_moe_tp2_ep2_to_ep2);
    return check_summary();
}
