/* Sender layouts of mixture-of-experts trainers (issue 16): expert-parallel shards (whole experts
 * per rank, Megatron's linear placement), the fused expert tensors HF transformers 5.x holds in
 * memory, and the split of a box of a fused tensor into boxes of the per-expert checkpoint params
 * the receivers' targets are made of. Built on wsync_model_params: a routed expert's param is
 * recognised by its name, "<prefix>.mlp.experts.<e>.<proj>.weight". */
#include "core/status.h"
#include "core/util.h"
#include "wsync/wsync.h"
#include "wsync/wsync_layout.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPERTS ".mlp.experts."
#define FUSED_GATE_UP "gate_up_proj"
#define FUSED_DOWN "down_proj"

/* If `name` is a routed expert's param, "<layer prefix>.mlp.experts.<e>.<rest>": 1, with
 * *prefix_len the length of "<layer prefix>.mlp.experts.", *expert = e and *rest pointing after
 * the dot that follows e. 0 otherwise. */
static int expert_param_name(const char *name, size_t *prefix_len, int64_t *expert,
                             const char **rest)
{
    const char *at = strstr(name, EXPERTS);
    const char *p;
    int64_t e = 0;

    if (at == NULL)
        return 0;
    p = at + strlen(EXPERTS);
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (e > (INT64_MAX - 9) / 10)
            return 0;
        e = e * 10 + (*p - '0');
    }
    if (*p != '.')
        return 0;
    *prefix_len = (size_t)(at - name) + strlen(EXPERTS);
    *expert = e;
    *rest = p + 1;
    return 1;
}

/* 1 when `name` ends in ".mlp.experts.<fused>" (fused = "gate_up_proj" or "down_proj"); then
 * *prefix_len is the length of the name up to and including ".mlp.experts.". */
static int fused_name(const char *name, const char *fused, size_t *prefix_len)
{
    size_t n = strlen(name), f = strlen(fused), x = strlen(EXPERTS);

    if (n < x + f || strcmp(name + n - f, fused) != 0 ||
        strncmp(name + n - f - x, EXPERTS, x) != 0)
        return 0;
    *prefix_len = n - f;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Unfusing a shard of a fused expert tensor                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Room for one more element in the growable array *v of *cap elements of `esize` bytes, n of
 * them used: doubles it when full, `first` elements the first time. `what` names the elements
 * in the error; *v and *cap change only on success. */
static wsync_status_t vec_room(void **v, size_t *cap, size_t n, size_t esize, size_t first,
                               const char *what)
{
    if (n < *cap)
        return WSYNC_OK;
    size_t c = *cap ? 2 * *cap : first;
    void *nv = realloc(*v, c * esize);
    if (nv == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for %zu %s", c, what);
    *v = nv;
    *cap = c;
    return WSYNC_OK;
}

/* A growable shard array whose names are owned by it. */
typedef struct {
    wsync_shard_t *v;
    size_t n, cap;
} shard_vec_t;

static wsync_status_t vec_push(shard_vec_t *a, const wsync_shard_t *sh, const char *name)
{
    void *v = a->v;
    wsync_status_t st = vec_room(&v, &a->cap, a->n, sizeof(*a->v), 16, "shards");
    a->v = v;
    if (st != WSYNC_OK)
        return st;
    a->v[a->n] = *sh;
    a->v[a->n].param.name = wsync_strdup(name);
    if (a->v[a->n].param.name == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the name '%s'", name);
    a->n++;
    return WSYNC_OK;
}

/* `data` advanced by `elems` elements of `esize` bytes; NULL stays NULL (a layout not yet given
 * its memory). */
static const void *advance(const void *data, int64_t elems, size_t esize)
{
    return data == NULL ? NULL : (const char *)data + (size_t)elems * esize;
}

/* One per-expert shard: param `name` [rows, cols] of the fused shard's dtype, box rows
 * [r0, r0 + nr) x cols [c0, c0 + nc), at `data`. */
static wsync_status_t push_expert(shard_vec_t *out, const wsync_shard_t *fused, const char *name,
                                  int64_t rows, int64_t cols, int64_t r0, int64_t nr, int64_t c0,
                                  int64_t nc, const void *data)
{
    wsync_shard_t sh;

    memset(&sh, 0, sizeof(sh));
    sh.param.dtype = fused->param.dtype;
    sh.param.ndim = 2;
    sh.param.shape[0] = rows;
    sh.param.shape[1] = cols;
    sh.box.start[0] = r0;
    sh.box.len[0] = nr;
    sh.box.start[1] = c0;
    sh.box.len[1] = nc;
    sh.data = data;
    sh.mem = fused->mem;
    sh.device = fused->device;
    return vec_push(out, &sh, name);
}

static wsync_status_t check_fused_shard(const wsync_shard_t *s, const char *what)
{
    const wsync_param_t *p = &s->param;

    if (p->ndim != 3)
        return wsync_err(WSYNC_ERR_INVALID, "%s: a fused expert tensor is 3-D ([E, 2I, Hd] or "
                         "[E, Hd, I]), not %d-D", p->name, p->ndim);
    for (int d = 0; d < 3; d++) {
        if (p->shape[d] < 1)
            return wsync_err(WSYNC_ERR_INVALID, "%s: shape[%d] = %" PRId64 " must be >= 1",
                             p->name, d, p->shape[d]);
        if (s->box.start[d] < 0 || s->box.len[d] < 0 ||
            s->box.start[d] > p->shape[d] - s->box.len[d])
            return wsync_err(WSYNC_ERR_INVALID, "%s: box [%" PRId64 ", +%" PRId64 ") along dim "
                             "%d is outside its size %" PRId64, p->name, s->box.start[d],
                             s->box.len[d], d, p->shape[d]);
    }
    if (strcmp(what, FUSED_GATE_UP) == 0 && p->shape[1] % 2 != 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "] "
                         "is not [E, 2I, Hd]: %" PRId64 " rows cannot be gate then up halves",
                         p->name, p->shape[0], p->shape[1], p->shape[2], p->shape[1]);
    const size_t esize = wsync_dtype_size(p->dtype);
    if (esize == 0)
        return wsync_err(WSYNC_ERR_INVALID, "%s: unknown dtype %d", p->name, (int)p->dtype);
    /* unfuse addresses the tensor by int64 element offsets (and size_t bytes) */
    if (p->shape[1] > INT64_MAX / p->shape[2] ||
        p->shape[0] > INT64_MAX / (int64_t)esize / (p->shape[1] * p->shape[2]))
        return wsync_err(WSYNC_ERR_INVALID, "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "] "
                         "of %zu-byte elements overflows int64 bytes", p->name, p->shape[0],
                         p->shape[1], p->shape[2], esize);
    return WSYNC_OK;
}

/* The box is dense row-major [l0, l1, l2]: expert e's slab starts (e - s0) * l1 * l2 elements in,
 * and within it, fused row j starts (j - s1) * l2 elements in. A run of whole box rows of one
 * expert is itself dense row-major with row length l2 — that is the per-expert shard. */
static wsync_status_t unfuse(const wsync_shard_t *s, int gate_up, size_t prefix_len,
                             shard_vec_t *out)
{
    const int64_t *st = s->box.start, *ln = s->box.len;
    const int64_t hd_or_rows = s->param.shape[1], inner = s->param.shape[2];
    const size_t esize = wsync_dtype_size(s->param.dtype);
    char name[512];
    wsync_status_t rc;

    if (prefix_len + 48 > sizeof(name))
        return wsync_err(WSYNC_ERR_INVALID, "%s: name too long", s->param.name);
    if (ln[0] == 0 || ln[1] == 0 || ln[2] == 0)
        return WSYNC_OK;   /* an empty box misses every expert */
    for (int64_t e = st[0]; e < st[0] + ln[0]; e++) {
        const int64_t slab = (e - st[0]) * ln[1] * ln[2];
        if (!gate_up) {
            /* down_proj [E, Hd, I]: expert e's [Hd, I] box is the box's dims 1 and 2 */
            snprintf(name, sizeof(name), "%.*s%" PRId64 ".down_proj.weight", (int)prefix_len,
                     s->param.name, e);
            rc = push_expert(out, s, name, hd_or_rows, inner, st[1], ln[1], st[2], ln[2],
                             advance(s->data, slab, esize));
            if (rc != WSYNC_OK)
                return rc;
            continue;
        }
        /* gate_up_proj [E, 2I, Hd]: fused rows [0, I) are gate_proj's, [I, 2I) up_proj's */
        const int64_t I = hd_or_rows / 2;
        for (int half = 0; half < 2; half++) {
            int64_t lo = st[1] > half * I ? st[1] : half * I;
            int64_t hi = st[1] + ln[1] < (half + 1) * I ? st[1] + ln[1] : (half + 1) * I;
            if (hi <= lo)
                continue;
            snprintf(name, sizeof(name), "%.*s%" PRId64 ".%s.weight", (int)prefix_len,
                     s->param.name, e, half == 0 ? "gate_proj" : "up_proj");
            rc = push_expert(out, s, name, I, inner, lo - half * I, hi - lo, st[2], ln[2],
                             advance(s->data, slab + (lo - st[1]) * ln[2], esize));
            if (rc != WSYNC_OK)
                return rc;
        }
    }
    return WSYNC_OK;
}

wsync_status_t wsync_layout_unfuse_experts(const wsync_shard_t *shard, wsync_shard_t **shards,
                                           size_t *nshards)
{
    shard_vec_t out = {NULL, 0, 0};
    size_t prefix_len = 0;
    wsync_status_t st;

    if (shard == NULL || shards == NULL || nshards == NULL || shard->param.name == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_unfuse_experts: NULL argument");
    if (fused_name(shard->param.name, FUSED_GATE_UP, &prefix_len)) {
        st = check_fused_shard(shard, FUSED_GATE_UP);
        if (st == WSYNC_OK)
            st = unfuse(shard, 1, prefix_len, &out);
    } else if (fused_name(shard->param.name, FUSED_DOWN, &prefix_len)) {
        st = check_fused_shard(shard, FUSED_DOWN);
        if (st == WSYNC_OK)
            st = unfuse(shard, 0, prefix_len, &out);
    } else {
        st = vec_push(&out, shard, shard->param.name);
    }
    if (st != WSYNC_OK) {
        wsync_layout_shards_free(out.v, out.n);
        return st;
    }
    *shards = out.v;
    *nshards = out.n;
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Fused params                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A growable param array whose names are owned by it. */
typedef struct {
    wsync_param_t *v;
    size_t n, cap;
} param_vec_t;

static wsync_status_t pvec_push(param_vec_t *a, const wsync_param_t *p, const char *name)
{
    void *v = a->v;
    wsync_status_t st = vec_room(&v, &a->cap, a->n, sizeof(*a->v), 64, "params");
    a->v = v;
    if (st != WSYNC_OK)
        return st;
    a->v[a->n] = *p;
    a->v[a->n].name = wsync_strdup(name);
    if (a->v[a->n].name == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for the name '%s'", name);
    a->n++;
    return WSYNC_OK;
}

wsync_status_t wsync_model_fused_params(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                        wsync_param_t **params, size_t *n)
{
    wsync_param_t *all = NULL;
    size_t nall = 0;
    param_vec_t out = {NULL, 0, 0};
    wsync_status_t st;

    if (cfg == NULL || params == NULL || n == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_model_fused_params: NULL argument");
    st = wsync_model_params(cfg, dtype, &all, &nall);
    if (st != WSYNC_OK)
        return st;
    for (size_t i = 0; i < nall && st == WSYNC_OK;) {
        size_t prefix_len;
        int64_t e;
        const char *rest;
        if (!expert_param_name(all[i].name, &prefix_len, &e, &rest)) {
            st = pvec_push(&out, &all[i], all[i].name);
            i++;
            continue;
        }
        /* a layer's routed experts come together, expert by expert, gate, up, down: check that
         * they are exactly experts 0..E-1 of one shape, and fuse them */
        const wsync_param_t *g = &all[i];
        const int64_t E = cfg->num_experts, Im = g->shape[0], Hd = g->shape[1];
        size_t j = i;
        for (int64_t x = 0; x < E && st == WSYNC_OK; x++) {
            static const char *const proj[3] = {"gate_proj.weight", "up_proj.weight",
                                                "down_proj.weight"};
            for (int k = 0; k < 3 && st == WSYNC_OK; k++, j++) {
                size_t pl;
                int64_t ex;
                const char *r;
                int ok = j < nall && expert_param_name(all[j].name, &pl, &ex, &r) &&
                         pl == prefix_len && strncmp(all[j].name, g->name, pl) == 0 && ex == x &&
                         strcmp(r, proj[k]) == 0 && all[j].ndim == 2 &&
                         all[j].shape[0] == (k < 2 ? Im : Hd) &&
                         all[j].shape[1] == (k < 2 ? Hd : Im) && all[j].dtype == g->dtype;
                if (!ok)
                    st = wsync_err(WSYNC_ERR_INTERNAL, "wsync_model_fused_params: expected "
                                   "%.*s%" PRId64 ".%s [%" PRId64 ", %" PRId64 "], found '%s'",
                                   (int)prefix_len, g->name, x, proj[k], k < 2 ? Im : Hd,
                                   k < 2 ? Hd : Im, j < nall ? all[j].name : "(the end)");
            }
        }
        if (st != WSYNC_OK)
            break;
        size_t pl;
        if (j < nall && expert_param_name(all[j].name, &pl, &e, &rest) && pl == prefix_len &&
            strncmp(all[j].name, g->name, pl) == 0) {
            st = wsync_err(WSYNC_ERR_INTERNAL, "wsync_model_fused_params: '%s' beyond the %" PRId64
                           " experts of the config", all[j].name, E);
            break;
        }
        char name[512];
        wsync_param_t f = {NULL, g->dtype, 3, {E, 2 * Im, Hd}};
        snprintf(name, sizeof(name), "%.*s" FUSED_GATE_UP, (int)prefix_len, g->name);
        st = pvec_push(&out, &f, name);
        if (st == WSYNC_OK) {
            f.shape[1] = Hd;
            f.shape[2] = Im;
            snprintf(name, sizeof(name), "%.*s" FUSED_DOWN, (int)prefix_len, g->name);
            st = pvec_push(&out, &f, name);
        }
        i = j;
    }
    wsync_model_params_free(all, nall);
    if (st != WSYNC_OK) {
        wsync_model_params_free(out.v, out.n);
        return st;
    }
    *params = out.v;
    *n = out.n;
    return WSYNC_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Expert-parallel shards                                                                       */
/* ------------------------------------------------------------------------------------------ */

wsync_status_t wsync_layout_ep_shards(const wsync_model_config_t *cfg, wsync_dtype_t dtype,
                                      int rank, int nranks, int dense_dim,
                                      wsync_shard_t **shards, size_t *nshards)
{
    wsync_param_t *all = NULL;
    size_t nall = 0;
    shard_vec_t out = {NULL, 0, 0};
    wsync_status_t st;

    if (cfg == NULL || shards == NULL || nshards == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_ep_shards: NULL argument");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_layout_ep_shards: rank %d of %d is outside "
                         "[0, nranks)", rank, nranks);
    if (cfg->num_experts > 0 && cfg->num_experts % nranks != 0)
        return wsync_err(WSYNC_ERR_CONFIG, "wsync_layout_ep_shards: %" PRId64 " experts do not "
                         "split evenly over %d expert-parallel ranks (E %% EP must be 0, as "
                         "Megatron asserts)", cfg->num_experts, nranks);
    st = wsync_model_params(cfg, dtype, &all, &nall);
    if (st != WSYNC_OK)
        return st;
    /* linear placement: rank r holds experts [r * E/EP, (r + 1) * E/EP) */
    const int64_t per_rank = cfg->num_experts > 0 ? cfg->num_experts / nranks : 1;
    for (size_t i = 0; i < nall && st == WSYNC_OK; i++) {
        wsync_shard_t sh;
        size_t prefix_len;
        int64_t e;
        const char *rest;
        memset(&sh, 0, sizeof(sh));
        sh.param = all[i];
        sh.mem = WSYNC_MEM_HOST;
        if (expert_param_name(all[i].name, &prefix_len, &e, &rest)) {
            if (e >= cfg->num_experts) {
                st = wsync_err(WSYNC_ERR_INTERNAL, "wsync_layout_ep_shards: '%s' beyond the "
                               "%" PRId64 " experts of the config", all[i].name, cfg->num_experts);
                break;
            }
            for (int d = 0; d < all[i].ndim; d++)
                sh.box.len[d] = all[i].shape[d];
            if (e / per_rank != rank)
                sh.box.len[0] = 0;   /* another rank's expert: an empty box */
        } else {
            st = wsync_layout_shard_box(&all[i], dense_dim, rank, nranks, &sh.box);
        }
        if (st == WSYNC_OK)
            st = vec_push(&out, &sh, all[i].name);
    }
    wsync_model_params_free(all, nall);
    if (st != WSYNC_OK) {
        wsync_layout_shards_free(out.v, out.n);
        return st;
    }
    *shards = out.v;
    *nshards = out.n;
    return WSYNC_OK;
}
