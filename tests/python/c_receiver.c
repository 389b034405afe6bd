/* A C inference rank for the Python tests: TP rank --rank of --tp of HF Qwen3-tiny, every
 * target from wsync_layout_tp_targets (bf16, vLLM's default vocab padding), in buffers poisoned
 * with 0xAB, receiving versions 1..--versions over ipc from whatever senders the group has.
 *
 * After each version every target must equal a reference built here from the full checkpoint
 * tensors with RESHARD_SPEC's formulas (vocab-parallel embed_tokens and lm_head, fused QKV,
 * merged gate_up, row-parallel o_proj and down_proj, replicated norms) and the version rule of
 * c_peer.h.
 *
 * --bad-param NAME adds a target holding a column-parallel slice of NAME, a param no sender
 * has; --expect-error TEXT then requires wait to fail with WSYNC_ERR_MISMATCH and a message
 * containing TEXT, with no target written. Exit status 0 when everything went as expected. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/python/c_peer.h"
#include "tests/support/check.h"
#include "tests/support/safetensors_min.h"
#include "wsync/wsync.h"

#define POISON 0xAB
#define MAX_TARGETS 64

typedef struct {
    st_file_t *f;
    int64_t layers, H, K, D, Hd, I, V, T;
} model_t;

static const st_tensor_t *tensor(const model_t *m, const char *name)
{
    const st_tensor_t *t = st_find(m->f, name);
    CHECK_MSG(t != NULL, "checkpoint has no tensor '%s'", name);
    return t;
}

/* rows [r0, r0+n) x cols [c0, c0+nc) of src (version v) to out rows from dst_r0, out_cols wide */
static void copy_block(uint16_t *out, int64_t out_cols, int64_t dst_r0, const st_tensor_t *src,
                       int64_t r0, int64_t n, int64_t c0, int64_t nc, int v)
{
    int64_t cols = src->ndim == 2 ? src->shape[1] : 1;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < nc; j++)
            out[(dst_r0 + i) * out_cols + j] =
                peer_version_value(peer_load_u16(src->data + 2 * ((r0 + i) * cols + c0 + j)), v);
}

/* Reference contents (bf16 bits) of target `name` on TP rank r for version v; *elems is set.
 * Returns NULL for a name this model's TP layout does not have. */
static uint16_t *reference(const model_t *m, const char *name, int r, int v, size_t *elems)
{
    char p[256];
    int layer = -1, used = 0;
    const char *sfx;
    uint16_t *out = NULL;
    const st_tensor_t *t;

    if (strcmp(name, "model.embed_tokens.weight") == 0 || strcmp(name, "lm_head.weight") == 0) {
        int64_t vp = (m->V + 63) / 64 * 64, vr = vp / m->T;
        int64_t lo = r * vr, hi = lo + vr < m->V ? lo + vr : m->V;
        if ((t = tensor(m, name)) == NULL)
            return NULL;
        *elems = (size_t)(vr * m->Hd);
        out = calloc(*elems, 2);
        if (hi > lo)
            copy_block(out, m->Hd, 0, t, lo, hi - lo, 0, m->Hd, v);
        return out;
    }
    if (strcmp(name, "model.norm.weight") == 0) {
        if ((t = tensor(m, name)) == NULL)
            return NULL;
        *elems = (size_t)t->shape[0];
        out = malloc(*elems * 2);
        copy_block(out, 1, 0, t, 0, t->shape[0], 0, 1, v);
        return out;
    }
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 ||
        layer >= m->layers)
        return NULL;
    sfx = name + used;
#define P(s) (snprintf(p, sizeof(p), "model.layers.%d.%s", layer, (s)), p)
    if (strstr(sfx, "norm.weight") != NULL) {
        if ((t = tensor(m, P(sfx))) == NULL)
            return NULL;
        *elems = (size_t)t->shape[0];
        out = malloc(*elems * 2);
        copy_block(out, 1, 0, t, 0, t->shape[0], 0, 1, v);
        return out;
    }
    if (strcmp(sfx, "self_attn.qkv_proj.weight") == 0) {
        int64_t hr = m->H / m->T, kn = m->K >= m->T ? m->K / m->T : 1;
        int64_t kr = m->K >= m->T ? r : r / (m->T / m->K);
        *elems = (size_t)((hr + 2 * kn) * m->D * m->Hd);
        out = malloc(*elems * 2);
        copy_block(out, m->Hd, 0, tensor(m, P("self_attn.q_proj.weight")), r * hr * m->D,
                   hr * m->D, 0, m->Hd, v);
        copy_block(out, m->Hd, hr * m->D, tensor(m, P("self_attn.k_proj.weight")),
                   kr * kn * m->D, kn * m->D, 0, m->Hd, v);
        copy_block(out, m->Hd, (hr + kn) * m->D, tensor(m, P("self_attn.v_proj.weight")),
                   kr * kn * m->D, kn * m->D, 0, m->Hd, v);
        return out;
    }
    if (strcmp(sfx, "mlp.gate_up_proj.weight") == 0) {
        int64_t ir = m->I / m->T;
        *elems = (size_t)(2 * ir * m->Hd);
        out = malloc(*elems * 2);
        copy_block(out, m->Hd, 0, tensor(m, P("mlp.gate_proj.weight")), r * ir, ir, 0, m->Hd, v);
        copy_block(out, m->Hd, ir, tensor(m, P("mlp.up_proj.weight")), r * ir, ir, 0, m->Hd, v);
        return out;
    }
    if (strcmp(sfx, "self_attn.o_proj.weight") == 0 || strcmp(sfx, "mlp.down_proj.weight") == 0) {
        if ((t = tensor(m, P(sfx))) == NULL)
            return NULL;
        int64_t inr = t->shape[1] / m->T;
        *elems = (size_t)(t->shape[0] * inr);
        out = malloc(*elems * 2);
        copy_block(out, inr, 0, t, 0, t->shape[0], r * inr, inr, v);
        return out;
    }
#undef P
    return NULL;
}

static int all_poison(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != POISON)
            return 0;
    return 1;
}

static int run(const peer_opts_t *o)
{
    char err[512];
    model_t m;
    wsync_model_config_t cfg;
    wsync_target_t *targets = NULL;
    size_t ntargets = 0, nall;
    void *bufs[MAX_TARGETS + 1] = {0};
    size_t bytes[MAX_TARGETS + 1] = {0};
    wsync_ctx_t *ctx = NULL;
    wsync_receiver_t *rv = NULL;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_piece_t extra_piece;
    wsync_target_t extra;
    wsync_status_t st;

    memset(&m, 0, sizeof(m));
    if (st_open(PEER_CKPT, &m.f, err, sizeof(err)) != 0) {
        CHECK_MSG(0, "%s", err);
        return 1;
    }
    CHECK_OK(wsync_model_config_load(PEER_CONFIG, &cfg));
    m.layers = cfg.num_hidden_layers;
    m.H = cfg.num_attention_heads;
    m.K = cfg.num_key_value_heads;
    m.T = o->tp;
    {
        const st_tensor_t *q = tensor(&m, "model.layers.0.self_attn.q_proj.weight");
        const st_tensor_t *g = tensor(&m, "model.layers.0.mlp.gate_proj.weight");
        const st_tensor_t *e = tensor(&m, "model.embed_tokens.weight");
        if (q == NULL || g == NULL || e == NULL)
            goto out;
        m.D = q->shape[0] / m.H;
        m.Hd = q->shape[1];
        m.I = g->shape[0];
        m.V = e->shape[0];
    }
    st = wsync_layout_tp_targets(&cfg, o->rank, o->tp, NULL, &targets, &ntargets);
    CHECK_OK(st);
    CHECK_MSG(ntargets <= MAX_TARGETS, "%zu targets", ntargets);
    if (st != WSYNC_OK || ntargets > MAX_TARGETS)
        goto out;
    for (size_t i = 0; i < ntargets; i++) {
        size_t elems = 0;
        uint16_t *ref = reference(&m, targets[i].name, o->rank, 0, &elems);
        CHECK_MSG(ref != NULL, "no reference for target '%s'", targets[i].name);
        bytes[i] = wsync_target_bytes(&targets[i]);
        CHECK_MSG(ref == NULL || bytes[i] == elems * 2, "target '%s' has %zu bytes, the "
                  "reference %zu", targets[i].name, bytes[i], elems * 2);
        free(ref);
        bufs[i] = malloc(bytes[i]);
        memset(bufs[i], POISON, bytes[i]);
        targets[i].data = bufs[i];
    }
    nall = ntargets;
    if (check_failures)
        goto out;

    CHECK_OK(wsync_ctx_create(NULL, &ctx));
    rp.coordinator = o->coordinator;
    rp.rank = o->rank;
    rp.nreceivers = o->receivers;
    rp.timeout_ms = o->timeout_ms;
    rp.heartbeat_ms = 200;
    st = wsync_receiver_create(ctx, &rp, &rv);
    if (st != WSYNC_OK && o->expect_error != NULL) {
        CHECK_ERR_HAS(o->expect_error);
        fprintf(stderr, "c_receiver %d: create: %s\n", o->rank, wsync_last_error());
        goto out;
    }
    CHECK_OK(st);
    if (st != WSYNC_OK)
        goto out;
    for (size_t i = 0; i < ntargets; i++)
        CHECK_OK(wsync_receiver_add_target(rv, &targets[i]));
    if (o->bad_param != NULL) {
        int64_t ir = m.I / m.T;
        memset(&extra_piece, 0, sizeof(extra_piece));
        extra_piece.param = (wsync_param_t){o->bad_param, WSYNC_DTYPE_BF16, 2, {m.I, m.Hd}};
        extra_piece.src.start[0] = o->rank * ir;
        extra_piece.src.len[0] = ir;
        extra_piece.src.len[1] = m.Hd;
        memset(&extra, 0, sizeof(extra));
        extra.name = "unknown.param.slice";
        extra.dtype = WSYNC_DTYPE_BF16;
        extra.ndim = 2;
        extra.shape[0] = ir;
        extra.shape[1] = m.Hd;
        extra.mem = WSYNC_MEM_HOST;
        extra.pieces = &extra_piece;
        extra.npieces = 1;
        bytes[nall] = wsync_target_bytes(&extra);
        bufs[nall] = malloc(bytes[nall]);
        memset(bufs[nall], POISON, bytes[nall]);
        extra.data = bufs[nall];
        nall++;
        CHECK_OK(wsync_receiver_add_target(rv, &extra));
    }
    if (check_failures)
        goto out;

    for (int v = 1; v <= o->versions; v++) {
        uint64_t got = 0;
        st = wsync_receiver_wait(rv, o->timeout_ms, &got);
        if (o->expect_error != NULL) {
            CHECK_MSG(st == WSYNC_ERR_MISMATCH, "c_receiver %d: wait returned %s (%s), expected "
                      "WSYNC_ERR_MISMATCH naming %s", o->rank, wsync_status_name(st),
                      wsync_last_error(), o->expect_error);
            CHECK_ERR_HAS(o->expect_error);
            fprintf(stderr, "c_receiver %d saw: %s: %s\n", o->rank, wsync_status_name(st),
                    wsync_last_error());
            CHECK(wsync_receiver_version(rv) == 0);
            for (size_t i = 0; i < nall; i++)
                CHECK_MSG(all_poison(bufs[i], bytes[i]), "target %zu written although the "
                          "group failed", i);
            break;
        }
        CHECK_OK(st);
        if (st != WSYNC_OK)
            break;
        CHECK_MSG(got == (uint64_t)v, "got version %llu, expected %d", (unsigned long long)got, v);
        CHECK(!wsync_receiver_torn(rv));
        for (size_t i = 0; i < ntargets; i++) {
            size_t elems = 0;
            uint16_t *ref = reference(&m, targets[i].name, o->rank, v, &elems);
            const uint16_t *b = bufs[i];
            if (ref == NULL)
                continue;
            for (size_t k = 0; k < elems; k++) {
                if (b[k] != ref[k]) {
                    CHECK_MSG(0, "c_receiver %d version %d: %s element %zu is 0x%04x, expected "
                              "0x%04x", o->rank, v, targets[i].name, k, b[k], ref[k]);
                    break;
                }
            }
            free(ref);
        }
    }
    if (o->expect_error == NULL && check_failures == 0)
        fprintf(stderr, "c_receiver %d: %d versions, %zu targets equal to the reference (%s)\n",
                o->rank, o->versions, ntargets, wsync_receiver_scheme(rv));

out:
    wsync_receiver_free(rv);
    wsync_ctx_free(ctx);
    for (size_t i = 0; i <= MAX_TARGETS; i++)
        free(bufs[i]);
    for (size_t i = 0; i < ntargets; i++)
        targets[i].data = NULL;
    wsync_layout_targets_free(targets, ntargets);
    st_close(m.f);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    peer_opts_t o;

    signal(SIGPIPE, SIG_IGN);
    if (peer_parse(argc, argv, &o) != 0)
        return 2;
    return run(&o);
}
