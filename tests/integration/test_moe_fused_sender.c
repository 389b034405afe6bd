/* MoE trainers' layouts end to end, through the ipc scheme on host memory, on the tiny HF
 * Qwen3-MoE model: two senders hold FSDP dim-0 shards of the params as a transformers 5.x model
 * holds them in memory (experts fused: gate_up_proj [E, 2I, Hd] stacked here from the
 * checkpoint's per-expert tensors, down_proj [E, Hd, I]) and describe them unfused
 * (wsync_layout_unfuse_experts); or two senders hold whole experts by expert parallelism
 * (wsync_layout_ep_shards). Two receivers hold vLLM's TP-2 or EP-2 targets
 * (wsync_layout_tp_targets); every byte of every target must equal the checkpoint's, placed as
 * the target's pieces say. */
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

#define MODEL WSYNC_TESTDATA "/hf_qwen3_moe_tiny"
#define TIMEOUT_MS 20000
#define NSENDERS 2
#define NRECEIVERS 2

static char coord_addr[64];

typedef enum { SEND_FUSED_FSDP, SEND_EP } send_layout_t;

typedef struct {
    int rank;
    send_layout_t send;
    int ep_receivers;          /* receivers: EP-2 (1) or TP-2 (0) */
} role_t;

static const st_tensor_t *need(const st_file_t *f, const char *name)
{
    const st_tensor_t *t = st_find(f, name);
    CHECK_MSG(t != NULL, "the checkpoint has no '%s'", name);
    return t;
}

/* The bytes of `box` of the fused tensor `p` (gate_up_proj [E, 2I, Hd] or down_proj [E, Hd, I]
 * of layer prefix "...mlp.experts."), stacked from the checkpoint's per-expert tensors. */
static uint8_t *fused_box(const st_file_t *f, const wsync_param_t *p, const wsync_box_t *b,
                          int gate_up, size_t prefix_len)
{
    const size_t es = 2;   /* bf16 */
    const int64_t I = gate_up ? p->shape[1] / 2 : 0;
    uint8_t *out = malloc((size_t)(b->len[0] * b->len[1] * b->len[2]) * es + 1);
    uint8_t *w = out;
    char name[160];

    for (int64_t e = b->start[0]; e < b->start[0] + b->len[0]; e++) {
        for (int64_t j = b->start[1]; j < b->start[1] + b->len[1]; j++) {
            const char *proj = !gate_up ? "down_proj" : j < I ? "gate_proj" : "up_proj";
            int64_t row = gate_up && j >= I ? j - I : j;
            snprintf(name, sizeof(name), "%.*s%lld.%s.weight", (int)prefix_len, p->name,
                     (long long)e, proj);
            const st_tensor_t *t = need(f, name);
            if (t == NULL)
                continue;
            memcpy(w, t->data + ((size_t)row * (size_t)t->shape[1] + (size_t)b->start[2]) * es,
                   (size_t)b->len[2] * es);
            w += (size_t)b->len[2] * es;
        }
    }
    return out;
}

/* The tiny model's config, its checkpoint and a context, as every process starts: 0, or -1
 * with the failure recorded. */
static int open_model(wsync_model_config_t *cfg, st_file_t **f, wsync_ctx_t **ctx)
{
    char err[256];

    CHECK_OK(wsync_model_config_load(MODEL "/config.json", cfg));
    CHECK_MSG(st_open(MODEL "/model.safetensors", f, err, sizeof(err)) == 0, "%s", err);
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
    uint8_t **owned = NULL;
    size_t nowned = 0, described = 0;

    if (open_model(&cfg, &f, &ctx) != 0)
        return 1;
    sp.coordinator = coord_addr;
    sp.rank = r->rank;
    sp.nranks = NSENDERS;
    sp.nreceivers = NRECEIVERS;
    sp.scheme = "ipc";
    sp.timeout_ms = TIMEOUT_MS;
    sp.heartbeat_ms = 200;
    CHECK_OK(wsync_sender_create(ctx, &sp, &s));
    if (s == NULL)
        return 1;
    if (r->send == SEND_FUSED_FSDP) {
        wsync_param_t *params = NULL;
        size_t n = 0, nfused = 0;
        CHECK_OK(wsync_model_fused_params(&cfg, 0, &params, &n));
        owned = calloc(n + 1, sizeof(*owned));
        for (size_t i = 0; i < n; i++) {
            const wsync_param_t *p = &params[i];
            wsync_shard_t sh = {*p, {{0}, {0}}, NULL, WSYNC_MEM_HOST, 0};
            size_t plen = strlen(p->name);
            int gate_up = plen > 12 && strcmp(p->name + plen - 12, "gate_up_proj") == 0;
            int down = !gate_up && strstr(p->name, ".mlp.experts.down_proj") != NULL;
            CHECK_OK(wsync_layout_shard_box(p, 0, r->rank, NSENDERS, &sh.box));
            if (gate_up || down) {
                size_t prefix_len = plen - (gate_up ? 12 : 9);
                owned[nowned] = fused_box(f, p, &sh.box, gate_up, prefix_len);
                sh.data = owned[nowned++];
                nfused++;
            } else {
                /* rows [start, start + len) of the checkpoint tensor, read in place */
                const st_tensor_t *t = need(f, p->name);
                if (t == NULL)
                    continue;
                sh.data = t->data + (size_t)sh.box.start[0] * (t->nbytes / (size_t)t->shape[0]);
            }
            wsync_shard_t *out = NULL;
            size_t nout = 0;
            CHECK_OK(wsync_layout_unfuse_experts(&sh, &out, &nout));
            for (size_t k = 0; k < nout; k++)
                CHECK_OK(wsync_sender_add_shard(s, &out[k]));
            described += nout;
            wsync_layout_shards_free(out, nout);
        }
        CHECK_MSG(nfused == 2 * (size_t)cfg.num_hidden_layers, "%zu fused params", nfused);
        wsync_model_params_free(params, n);
    } else {
        wsync_shard_t *shards = NULL;
        size_t n = 0;
        CHECK_OK(wsync_layout_ep_shards(&cfg, 0, r->rank, NSENDERS, 0, &shards, &n));
        for (size_t i = 0; i < n; i++) {
            const st_tensor_t *t = need(f, shards[i].param.name);
            if (t == NULL)
                continue;
            size_t row = t->nbytes / (size_t)t->shape[0];
            shards[i].data = t->data + (size_t)shards[i].box.start[0] * row;
            CHECK_OK(wsync_sender_add_shard(s, &shards[i]));
            described++;
        }
        wsync_layout_shards_free(shards, n);
    }
    CHECK(described > 0);
    wsync_status_t st = wsync_sender_push(s, 1);
    CHECK_OK(st);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    for (size_t i = 0; i < nowned; i++)
        free(owned[i]);
    free(owned);
    st_close(f);
    return check_failures ? 1 : 0;
}

/* What a target must hold: each piece's box of the checkpoint tensor at its dst_start; zero
 * where no piece lands. Targets here are 1-D or 2-D (vLLM's 3-D expert params as matrices). */
static uint8_t *expected_target(const st_file_t *f, const wsync_target_t *t)
{
    const size_t es = 2;
    size_t bytes = wsync_target_bytes(t);
    uint8_t *want = calloc(1, bytes + 1);
    const int64_t tcols = t->ndim == 2 ? t->shape[1] : t->shape[0];

    CHECK_MSG(t->ndim == 1 || t->ndim == 2, "target %s is %d-D", t->name, t->ndim);
    for (int i = 0; i < t->npieces; i++) {
        const wsync_piece_t *pc = &t->pieces[i];
        const st_tensor_t *src = need(f, pc->param.name);
        if (src == NULL)
            continue;
        const int64_t scols = src->ndim == 2 ? src->shape[1] : src->shape[0];
        const int64_t rows = pc->param.ndim == 2 ? pc->src.len[0] : 1;
        const int64_t cols = pc->param.ndim == 2 ? pc->src.len[1] : pc->src.len[0];
        const int64_t r0 = pc->param.ndim == 2 ? pc->src.start[0] : 0;
        const int64_t c0 = pc->param.ndim == 2 ? pc->src.start[1] : pc->src.start[0];
        const int64_t d0 = t->ndim == 2 ? pc->dst_start[0] : 0;
        const int64_t d1 = t->ndim == 2 ? pc->dst_start[1] : pc->dst_start[0];
        for (int64_t y = 0; y < rows; y++)
            memcpy(want + ((size_t)(d0 + y) * (size_t)tcols + (size_t)d1) * es,
                   src->data + ((size_t)(r0 + y) * (size_t)scols + (size_t)c0) * es,
                   (size_t)cols * es);
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
    size_t n = 0, nexperts = 0;
    st_file_t *f = NULL;
    uint64_t got = 0;

    if (open_model(&cfg, &f, &ctx) != 0)
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
        CHECK(targets[i].dtype == WSYNC_DTYPE_BF16);
        targets[i].data = calloc(1, wsync_target_bytes(&targets[i]) + 1);
        CHECK_OK(wsync_receiver_add_target(rv, &targets[i]));
        nexperts += strstr(targets[i].name, "mlp.experts.w") != NULL;
    }
    CHECK_MSG(nexperts == 2 * (size_t)cfg.num_hidden_layers, "%zu expert targets", nexperts);
    CHECK_OK(wsync_receiver_wait(rv, TIMEOUT_MS, &got));
    CHECK(got == 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t *want = expected_target(f, &targets[i]);
        size_t bytes = wsync_target_bytes(&targets[i]), bad = 0, first = bytes;
        const uint8_t *have = targets[i].data;
        for (size_t b = 0; b < bytes; b++) {
            if (have[b] != want[b]) {
                bad++;
                if (first == bytes)
                    first = b;
            }
        }
        CHECK_MSG(bad == 0, "receiver %d (%s): target %s: %zu of %zu bytes differ from the "
                  "checkpoint, the first at byte %zu", r->rank, r->ep_receivers ? "EP" : "TP",
                  targets[i].name, bad, bytes, first);
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

static void run(send_layout_t send, int ep_receivers)
{
    role_t roles[NSENDERS + NRECEIVERS];
    pid_t pids[NSENDERS + NRECEIVERS];
    int codes[NSENDERS + NRECEIVERS];
    int n = 0;

    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%d", proc_free_port());
    for (int s = 0; s < NSENDERS; s++, n++) {
        roles[n] = (role_t){s, send, ep_receivers};
        pids[n] = proc_spawn(sender_main, &roles[n], 60);
    }
    for (int r = 0; r < NRECEIVERS; r++, n++) {
        roles[n] = (role_t){r, send, ep_receivers};
        pids[n] = proc_spawn(receiver_main, &roles[n], 60);
    }
    proc_wait_all(pids, n, 60000, codes);
    for (int i = 0; i < n; i++)
        CHECK_MSG(codes[i] == 0, "%s %d exited with %d", i < NSENDERS ? "sender" : "receiver",
                  i < NSENDERS ? i : i - NSENDERS, codes[i]);
}

static void case_fused_fsdp_to_tp(void) { run(SEND_FUSED_FSDP, 0); }
static void case_fused_fsdp_to_ep(void) { run(SEND_FUSED_FSDP, 1); }
static void case_ep_to_tp(void) { run(SEND_EP, 0); }

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(case_fused_fsdp_to_tp);
    RUN(case_fused_fsdp_to_ep);
    RUN(case_ep_to_tp);
    return check_summary();
}
