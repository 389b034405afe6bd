/* Sender layouts of MoE trainers: a box of HF transformers 5.x's fused expert tensors split into
 * boxes of the per-expert checkpoint params (wsync_layout_unfuse_experts), the fused param list
 * (wsync_model_fused_params) and expert-parallel shards (wsync_layout_ep_shards). The bytes each
 * unfused shard points at are compared with per-expert tensors written here from the fused
 * layout's definition ([E, 2I, Hd], gate rows first; [E, Hd, I]); every element of a box must be
 * covered exactly once. */
#include "wsync/wsync.h"
#include "wsync/wsync_layout.h"

#include "tests/support/check.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_CONFIG WSYNC_TESTDATA "/hf_qwen3_moe_tiny/config.json"
#define DENSE_CONFIG WSYNC_TESTDATA "/hf_qwen3_tiny/config.json"
#define DEEPSEEK_CONFIG WSYNC_TESTDATA "/hf_deepseek_v3_tiny/config.json"

/* Element (e, j, k) of a fused tensor, as f32 (exact for these sizes): the test's own values. */
static float fused_value(int64_t e, int64_t j, int64_t k)
{
    return (float)(e * 1000000 + j * 1000 + k);
}

/* Element (i, k) of expert e's per-expert param `proj` (0 gate, 1 up, 2 down), written from the
 * definition of the fused layouts rather than from the unfusing code's arithmetic. */
static float expert_value(int proj, int64_t e, int64_t I, int64_t i, int64_t k)
{
    switch (proj) {
    case 0: return fused_value(e, i, k);          /* gate_proj [I, Hd] = gate_up[e, i, k] */
    case 1: return fused_value(e, I + i, k);      /* up_proj [I, Hd] = gate_up[e, I + i, k] */
    default: return fused_value(e, i, k);         /* down_proj [Hd, I] = down[e, i, k] */
    }
}

/* The dense bytes a sender holding `box` of a fused [E, R, C] f32 tensor has. */
static float *fused_box_data(const wsync_box_t *b)
{
    float *d = malloc(sizeof(float) * (size_t)(b->len[0] * b->len[1] * b->len[2] + 1));
    size_t n = 0;
    for (int64_t e = b->start[0]; e < b->start[0] + b->len[0]; e++)
        for (int64_t j = b->start[1]; j < b->start[1] + b->len[1]; j++)
            for (int64_t k = b->start[2]; k < b->start[2] + b->len[2]; k++)
                d[n++] = fused_value(e, j, k);
    return d;
}

/* Unfuse `box` of a fused tensor (gate_up: [E, 2I, Hd]; else down: [E, Hd, I]) and check each
 * result's name, shape, box and the values at its data, and that the results cover every element
 * of the box exactly once. */
static void check_unfuse(int gate_up, int64_t E, int64_t I, int64_t Hd, wsync_box_t box)
{
    const int64_t R = gate_up ? 2 * I : Hd, C = gate_up ? Hd : I;
    const char *name = gate_up ? "model.layers.7.mlp.experts.gate_up_proj"
                               : "model.layers.7.mlp.experts.down_proj";
    float *data = fused_box_data(&box);
    wsync_shard_t in = {{name, WSYNC_DTYPE_F32, 3, {E, R, C}}, box, data, WSYNC_MEM_HOST, 0};
    wsync_shard_t *out = NULL;
    size_t n = 0;
    uint8_t *hits = calloc((size_t)(E * R * C), 1);
    char ctx[160];

    snprintf(ctx, sizeof(ctx), "%s box [%" PRId64 "+%" PRId64 ", %" PRId64 "+%" PRId64 ", %" PRId64
             "+%" PRId64 "]", gate_up ? "gate_up" : "down", box.start[0], box.len[0],
             box.start[1], box.len[1], box.start[2], box.len[2]);
    CHECK_OK(wsync_layout_unfuse_experts(&in, &out, &n));
    for (size_t s = 0; s < n; s++) {
        const wsync_shard_t *o = &out[s];
        int64_t e = -1;
        char proj[32] = "";
        int proj_i;
        int consumed = 0;
        CHECK_MSG(sscanf(o->param.name, "model.layers.7.mlp.experts.%" SCNd64 ".%31[a-z_].weight%n",
                         &e, proj, &consumed) == 2 && consumed == (int)strlen(o->param.name),
                  "%s: unexpected name '%s'", ctx, o->param.name);
        proj_i = strcmp(proj, "gate_proj") == 0 ? 0 : strcmp(proj, "up_proj") == 0 ? 1
                 : strcmp(proj, "down_proj") == 0 ? 2 : -1;
        CHECK_MSG(gate_up ? (proj_i == 0 || proj_i == 1) : proj_i == 2, "%s: '%s' from %s", ctx,
                  o->param.name, name);
        CHECK_MSG(e >= box.start[0] && e < box.start[0] + box.len[0], "%s: expert %" PRId64
                  " outside the box", ctx, e);
        if (proj_i < 0 || e < 0 || e >= E)
            continue;
        const int64_t rows = proj_i < 2 ? I : Hd, cols = proj_i < 2 ? Hd : I;
        CHECK_MSG(o->param.ndim == 2 && o->param.shape[0] == rows && o->param.shape[1] == cols &&
                  o->param.dtype == WSYNC_DTYPE_F32, "%s: %s is [%" PRId64 ", %" PRId64 "]", ctx,
                  o->param.name, o->param.shape[0], o->param.shape[1]);
        CHECK_MSG(o->box.len[0] > 0 && o->box.len[1] > 0 && o->box.start[0] >= 0 &&
                  o->box.start[1] >= 0 && o->box.start[0] + o->box.len[0] <= rows &&
                  o->box.start[1] + o->box.len[1] <= cols, "%s: %s box outside the param", ctx,
                  o->param.name);
        CHECK(o->mem == WSYNC_MEM_HOST && o->device == 0);
        /* the pointer must lie in the fused shard's bytes */
        const float *p = o->data;
        CHECK_MSG(p >= data && p + o->box.len[0] * o->box.len[1] <=
                                   data + box.len[0] * box.len[1] * box.len[2],
                  "%s: %s's data outside the fused shard", ctx, o->param.name);
        if (p < data || p + o->box.len[0] * o->box.len[1] > data + box.len[0] * box.len[1] *
                                                                  box.len[2])
            continue;
        size_t wrong = 0;
        for (int64_t i = 0; i < o->box.len[0]; i++) {
            for (int64_t k = 0; k < o->box.len[1]; k++) {
                int64_t gi = o->box.start[0] + i, gk = o->box.start[1] + k;
                wrong += p[i * o->box.len[1] + k] != expert_value(proj_i, e, I, gi, gk);
                int64_t fj = proj_i == 1 ? I + gi : gi;   /* back to the fused coordinates */
                hits[(e * R + fj) * C + gk]++;
            }
        }
        CHECK_MSG(wrong == 0, "%s: %s: %zu of %" PRId64 " elements differ from the per-expert "
                  "tensor", ctx, o->param.name, wrong, o->box.len[0] * o->box.len[1]);
    }
    size_t bad = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < R; j++)
            for (int64_t k = 0; k < C; k++) {
                int inside = e >= box.start[0] && e < box.start[0] + box.len[0] &&
                             j >= box.start[1] && j < box.start[1] + box.len[1] &&
                             k >= box.start[2] && k < box.start[2] + box.len[2];
                bad += hits[(e * R + j) * C + k] != (inside ? 1 : 0);
            }
    CHECK_MSG(bad == 0, "%s: %zu elements covered other than once inside the box, or at all "
              "outside it", ctx, bad);
    wsync_layout_shards_free(out, n);
    free(hits);
    free(data);
}

/* Boxes a trainer holds: FSDP dim-0, Shard(1), Shard(2) at several world sizes (ceil rule), the
 * whole tensor, and odd boxes cutting every dim at once. */
static void case_unfuse_boxes(void)
{
    const int64_t E = 3, I = 5, Hd = 7;
    for (int gate_up = 0; gate_up <= 1; gate_up++) {
        const int64_t shape[3] = {E, gate_up ? 2 * I : Hd, gate_up ? Hd : I};
        wsync_param_t p = {"x", WSYNC_DTYPE_F32, 3, {shape[0], shape[1], shape[2]}};
        for (int dim = -1; dim < 3; dim++) {
            for (int world = 1; world <= 4; world++) {
                for (int r = 0; r < world; r++) {
                    wsync_box_t b;
                    CHECK_OK(wsync_layout_shard_box(&p, dim < 0 ? WSYNC_REPLICATE : dim, r, world,
                                                    &b));
                    check_unfuse(gate_up, E, I, Hd, b);
                }
            }
        }
        /* sub-boxes along every dim: gate/up boundary inside, at and outside the box */
        const wsync_box_t odd[] = {
            {{1, 3, 2}, {2, 4, 3}},
            {{0, 4, 0}, {1, 2, 1}},
            {{2, 0, 6}, {1, 1, 1}},
            {{0, 5, 1}, {3, 5, 5}},
            {{1, 0, 0}, {1, 5, 7}},
        };
        for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
            wsync_box_t b = odd[i];
            for (int d = 0; d < 3; d++) {
                if (b.start[d] >= shape[d])
                    b.start[d] = shape[d] - 1;
                if (b.start[d] + b.len[d] > shape[d])
                    b.len[d] = shape[d] - b.start[d];
            }
            check_unfuse(gate_up, E, I, Hd, b);
        }
    }
}

static void case_unfuse_counts_and_passthrough(void)
{
    /* expert 1's gate rows [2, 5) and up rows [0, 1): FSDP-like cut through dim 1 */
    float buf[64];
    wsync_shard_t in = {{"model.layers.0.mlp.experts.gate_up_proj", WSYNC_DTYPE_F32, 3, {2, 10, 4}},
                        {{1, 2, 0}, {1, 4, 4}}, buf, WSYNC_MEM_CUDA, 3};
    wsync_shard_t *out = NULL;
    size_t n = 0;

    CHECK_OK(wsync_layout_unfuse_experts(&in, &out, &n));
    CHECK_MSG(n == 2, "%zu shards", n);
    if (n == 2) {
        CHECK(strcmp(out[0].param.name, "model.layers.0.mlp.experts.1.gate_proj.weight") == 0);
        CHECK(out[0].box.start[0] == 2 && out[0].box.len[0] == 3 && out[0].box.len[1] == 4);
        CHECK(out[0].data == buf);
        CHECK(strcmp(out[1].param.name, "model.layers.0.mlp.experts.1.up_proj.weight") == 0);
        CHECK(out[1].box.start[0] == 0 && out[1].box.len[0] == 1);
        CHECK(out[1].data == buf + 12);
        CHECK(out[0].mem == WSYNC_MEM_CUDA && out[1].device == 3);
    }
    wsync_layout_shards_free(out, n);

    /* an empty box (the last FSDP rank of a short tensor) misses every expert */
    in.box.len[0] = 0;
    CHECK_OK(wsync_layout_unfuse_experts(&in, &out, &n));
    CHECK_MSG(n == 0, "an empty box gave %zu shards", n);
    wsync_layout_shards_free(out, n);

    /* any other param: one copy of the shard, its name owned by the array */
    char name[] = "model.layers.0.mlp.gate.weight";
    wsync_shard_t other = {{name, WSYNC_DTYPE_BF16, 2, {8, 4}}, {{2, 0}, {3, 4}}, buf,
                           WSYNC_MEM_HOST, 0};
    CHECK_OK(wsync_layout_unfuse_experts(&other, &out, &n));
    CHECK(n == 1);
    if (n == 1) {
        CHECK(out[0].param.name != name && strcmp(out[0].param.name, name) == 0);
        CHECK(memcmp(&out[0].box, &other.box, sizeof(other.box)) == 0);
        CHECK(out[0].data == buf && out[0].param.shape[0] == 8);
    }
    wsync_layout_shards_free(out, n);
    /* per-expert names pass through too, as do names that merely contain the fused ones */
    other.param.name = "model.layers.0.mlp.experts.gate_up_proj.weight";
    CHECK_OK(wsync_layout_unfuse_experts(&other, &out, &n));
    CHECK(n == 1);
    wsync_layout_shards_free(out, n);
}

static void case_unfuse_errors(void)
{
    wsync_shard_t *out = (wsync_shard_t *)&out;   /* must stay untouched on failure */
    size_t n = 12345;
    wsync_shard_t in = {{"model.layers.2.mlp.experts.gate_up_proj", WSYNC_DTYPE_BF16, 3, {4, 9, 8}},
                        {{0, 0, 0}, {4, 9, 8}}, NULL, WSYNC_MEM_HOST, 0};

    CHECK_ST(wsync_layout_unfuse_experts(&in, &out, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("model.layers.2.mlp.experts.gate_up_proj");
    CHECK_ERR_HAS("9");
    in.param.ndim = 2;
    in.param.name = "model.layers.2.mlp.experts.down_proj";
    CHECK_ST(wsync_layout_unfuse_experts(&in, &out, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("model.layers.2.mlp.experts.down_proj");
    CHECK_ERR_HAS("2-D");
    in.param.ndim = 3;
    in.box.start[2] = 1;   /* [1, 9) of 8 */
    CHECK_ST(wsync_layout_unfuse_experts(&in, &out, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("dim 2");
    CHECK_ST(wsync_layout_unfuse_experts(NULL, &out, &n), WSYNC_ERR_INVALID);
    CHECK(out == (wsync_shard_t *)&out && n == 12345);
    /* a layout without memory yet: the pointers stay NULL */
    in.box.start[2] = 0;
    in.param.shape[1] = 8;
    in.box.len[1] = 8;
    CHECK_OK(wsync_layout_unfuse_experts(&in, &out, &n));
    CHECK(n == 4 && out[0].data == NULL && out[3].data == NULL);
    wsync_layout_shards_free(out, n);
    /* a shape past int64 bytes (2 x 2^31 x 2^33): refused, not addressed with wrapped offsets */
    out = (wsync_shard_t *)&out;
    n = 12345;
    in.param.shape[0] = in.box.len[0] = 2;
    in.param.shape[1] = in.box.len[1] = (int64_t)1 << 31;
    in.param.shape[2] = in.box.len[2] = (int64_t)1 << 33;
    CHECK_ST(wsync_layout_unfuse_experts(&in, &out, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("model.layers.2.mlp.experts.down_proj: shape [2, 2147483648, 8589934592] of "
                  "2-byte elements overflows int64 bytes");
    CHECK(out == (wsync_shard_t *)&out && n == 12345);
}

/* ------------------------------------------------------------------------------------------ */

static const wsync_param_t *find_param(const wsync_param_t *p, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(p[i].name, name) == 0)
            return &p[i];
    return NULL;
}

static int is_expert_name(const char *name)
{
    int64_t l, e;
    int consumed = 0;
    return sscanf(name, "model.layers.%" SCNd64 ".mlp.experts.%" SCNd64 ".%*[a-z_].weight%n", &l,
                  &e, &consumed) == 2 && consumed == (int)strlen(name);
}

/* The fused list: the checkpoint's, the per-expert params of each MoE layer replaced by two fused
 * tensors; and unfusing each fused tensor whole gives back exactly those per-expert params. */
static void check_fused_params(const char *config)
{
    wsync_model_config_t c;
    wsync_param_t *all = NULL, *fused = NULL;
    size_t nall = 0, nfused = 0, nexpert = 0, nmoe = 0, nback = 0;

    CHECK_OK(wsync_model_config_load(config, &c));
    CHECK_OK(wsync_model_params(&c, 0, &all, &nall));
    CHECK_OK(wsync_model_fused_params(&c, 0, &fused, &nfused));
    if (all == NULL || fused == NULL)
        return;
    for (size_t i = 0; i < nall; i++)
        nexpert += is_expert_name(all[i].name);
    for (int64_t l = 0; l < c.num_hidden_layers; l++)
        nmoe += (size_t)wsync_model_layer_is_moe(&c, l);
    CHECK_MSG(nexpert == nmoe * (size_t)c.num_experts * 3, "%s: %zu per-expert params, %zu MoE "
              "layers of %" PRId64 " experts", config, nexpert, nmoe, c.num_experts);
    CHECK_MSG(nfused == nall - nexpert + 2 * nmoe, "%s: %zu fused params from %zu", config,
              nfused, nall);
    /* non-expert params in the same order, same shapes */
    size_t j = 0;
    for (size_t i = 0; i < nall; i++) {
        if (is_expert_name(all[i].name))
            continue;
        while (j < nfused && strstr(fused[j].name, ".mlp.experts.") != NULL)
            j++;
        CHECK_MSG(j < nfused && strcmp(all[i].name, fused[j].name) == 0 &&
                  memcmp(all[i].shape, fused[j].shape, sizeof(all[i].shape)) == 0,
                  "%s: '%s' vs fused list's '%s'", config, all[i].name,
                  j < nfused ? fused[j].name : "(end)");
        j++;
    }
    for (int64_t l = 0; l < c.num_hidden_layers; l++) {
        char gu[96], dn[96];
        snprintf(gu, sizeof(gu), "model.layers.%" PRId64 ".mlp.experts.gate_up_proj", l);
        snprintf(dn, sizeof(dn), "model.layers.%" PRId64 ".mlp.experts.down_proj", l);
        const wsync_param_t *a = find_param(fused, nfused, gu), *b = find_param(fused, nfused, dn);
        if (!wsync_model_layer_is_moe(&c, l)) {
            CHECK_MSG(a == NULL && b == NULL, "%s: dense layer %" PRId64 " has fused experts",
                      config, l);
            continue;
        }
        const int64_t E = c.num_experts, I = c.moe_intermediate_size, Hd = c.hidden_size;
        CHECK_MSG(a != NULL && a->ndim == 3 && a->shape[0] == E && a->shape[1] == 2 * I &&
                  a->shape[2] == Hd, "%s: %s missing or not [%" PRId64 ", %" PRId64 ", %" PRId64
                  "]", config, gu, E, 2 * I, Hd);
        CHECK_MSG(b != NULL && b->ndim == 3 && b->shape[0] == E && b->shape[1] == Hd &&
                  b->shape[2] == I, "%s: %s missing or wrong", config, dn);
        for (int k = 0; k < 2; k++) {
            const wsync_param_t *f = k == 0 ? a : b;
            if (f == NULL)
                continue;
            wsync_shard_t whole = {*f, {{0, 0, 0}, {f->shape[0], f->shape[1], f->shape[2]}}, NULL,
                                   WSYNC_MEM_HOST, 0};
            wsync_shard_t *out = NULL;
            size_t n = 0;
            CHECK_OK(wsync_layout_unfuse_experts(&whole, &out, &n));
            CHECK(n == (size_t)E * (k == 0 ? 2 : 1));
            for (size_t s = 0; s < n; s++) {
                const wsync_param_t *p = find_param(all, nall, out[s].param.name);
                CHECK_MSG(p != NULL && p->ndim == 2 && p->shape[0] == out[s].param.shape[0] &&
                          p->shape[1] == out[s].param.shape[1] && p->dtype == f->dtype &&
                          out[s].box.len[0] == p->shape[0] && out[s].box.len[1] == p->shape[1],
                          "%s: unfused '%s' is not the checkpoint's param", config,
                          out[s].param.name);
            }
            nback += n;
            wsync_layout_shards_free(out, n);
        }
    }
    CHECK_MSG(nback == nexpert, "%s: unfusing gave %zu per-expert params of %zu", config, nback,
              nexpert);
    wsync_model_params_free(all, nall);
    wsync_model_params_free(fused, nfused);
}

static void case_fused_params(void)
{
    check_fused_params(MOE_CONFIG);
    check_fused_params(DEEPSEEK_CONFIG);
    check_fused_params(DENSE_CONFIG);   /* no experts: the checkpoint list itself */
}

/* ------------------------------------------------------------------------------------------ */

/* Expert-parallel shards for each rank: expert e whole on rank e / (E / EP), empty elsewhere;
 * every other param as wsync_layout_shards along dense_dim. */
static void check_ep(const char *config, int nranks, int dense_dim)
{
    wsync_model_config_t c;
    wsync_param_t *all = NULL;
    size_t nall = 0;
    int64_t *owned = NULL;

    CHECK_OK(wsync_model_config_load(config, &c));
    CHECK_OK(wsync_model_params(&c, 0, &all, &nall));
    if (all == NULL)
        return;
    owned = calloc(nall, sizeof(*owned));
    for (int r = 0; r < nranks; r++) {
        wsync_shard_t *ep = NULL, *ref = NULL;
        size_t nep = 0, nref = 0;
        CHECK_OK(wsync_layout_ep_shards(&c, 0, r, nranks, dense_dim, &ep, &nep));
        CHECK_OK(wsync_layout_shards(all, nall, dense_dim, r, nranks, &ref, &nref));
        CHECK_MSG(nep == nall && nref == nall, "%s rank %d: %zu EP shards, %zu params", config, r,
                  nep, nall);
        for (size_t i = 0; i < nep && i < nall; i++) {
            int64_t l, e;
            int consumed = 0;
            CHECK_MSG(strcmp(ep[i].param.name, all[i].name) == 0 &&
                      memcmp(ep[i].param.shape, all[i].shape, sizeof(all[i].shape)) == 0,
                      "%s rank %d: shard %zu is '%s', param '%s'", config, r, i,
                      ep[i].param.name, all[i].name);
            CHECK(ep[i].data == NULL && ep[i].mem == WSYNC_MEM_HOST);
            if (sscanf(all[i].name, "model.layers.%" SCNd64 ".mlp.experts.%" SCNd64
                       ".%*[a-z_].weight%n", &l, &e, &consumed) == 2 &&
                consumed == (int)strlen(all[i].name)) {
                int mine = e / (c.num_experts / nranks) == r;
                int64_t elems = 1;
                for (int d = 0; d < all[i].ndim; d++)
                    elems *= ep[i].box.len[d];
                CHECK_MSG(mine ? elems == all[i].shape[0] * all[i].shape[1] &&
                                     ep[i].box.start[0] == 0 && ep[i].box.start[1] == 0
                               : elems == 0,
                          "%s rank %d of %d: expert %" PRId64 "'s %s holds %" PRId64 " elements",
                          config, r, nranks, e, all[i].name, elems);
                owned[i] += elems;
            } else {
                CHECK_MSG(memcmp(&ep[i].box, &ref[i].box, sizeof(ref[i].box)) == 0,
                          "%s rank %d: %s's box differs from wsync_layout_shards'", config, r,
                          all[i].name);
            }
        }
        wsync_layout_shards_free(ep, nep);
        wsync_layout_shards_free(ref, nref);
    }
    /* every expert param held whole by exactly one rank */
    for (size_t i = 0; i < nall; i++)
        if (is_expert_name(all[i].name))
            CHECK_MSG(owned[i] == all[i].shape[0] * all[i].shape[1], "%s: %s held %" PRId64
                      " elements over all ranks", config, all[i].name, owned[i]);
    free(owned);
    wsync_model_params_free(all, nall);
}

static void case_ep_shards(void)
{
    wsync_model_config_t c;
    wsync_shard_t *out = (wsync_shard_t *)&c;
    size_t n = 777;

    check_ep(MOE_CONFIG, 1, 0);
    check_ep(MOE_CONFIG, 2, 0);
    check_ep(MOE_CONFIG, 4, WSYNC_REPLICATE);
    check_ep(MOE_CONFIG, 8, 0);
    check_ep(DEEPSEEK_CONFIG, 2, 0);
    /* a dense model: what wsync_layout_shards gives (FSDP), for any world size */
    check_ep(DENSE_CONFIG, 3, 0);

    CHECK_OK(wsync_model_config_load(MOE_CONFIG, &c));
    CHECK_ST(wsync_layout_ep_shards(&c, 0, 0, 3, 0, &out, &n), WSYNC_ERR_CONFIG);
    CHECK_ERR_HAS("8 experts");
    CHECK_ERR_HAS("3 expert-parallel ranks");
    CHECK(out == (wsync_shard_t *)&c && n == 777);
    CHECK_ST(wsync_layout_ep_shards(&c, 0, 2, 2, 0, &out, &n), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("rank 2 of 2");
    CHECK_OK(wsync_model_config_load(DENSE_CONFIG, &c));
    CHECK_OK(wsync_layout_ep_shards(&c, 0, 0, 3, 0, &out, &n));   /* no experts to split */
    wsync_layout_shards_free(out, n);
}

int main(void)
{
    RUN(case_unfuse_boxes);
    RUN(case_unfuse_counts_and_passthrough);
    RUN(case_unfuse_errors);
    RUN(case_fused_params);
    RUN(case_ep_shards);
    return check_summary();
}
