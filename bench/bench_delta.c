/* wsync-bench --delta: the update generator, the senders' masters and the codec's figures, and
 * the report of the delta group against the full one (bench_delta.h). */
#include "bench/bench_delta.h"
#include "bench/bench_cuda.h"
/* the CPU codec, measured on each version's shards (the schemes expose no codec times) */
#include "core/delta.h"
#include "core/hash.h"
/* the reader's pool, for the floor of its pass (bench_delta_read_floor) */
#include "core/workpool.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* The update generator: fp32 master weights and an optimizer's steps                        */
/* ---------------------------------------------------------------------------------------- */

/* What an RL trainer does to the weights it sends between two syncs: every element has an fp32
 * master value; each version adds lr * d, d a unit-scale random direction drawn per (param,
 * element, version) -- |d| uniform in [0, 1), its sign a fair coin: the shape of an Adam step,
 * whose normalized update is about +-1 per element -- and the bf16 weight is the master rounded
 * to nearest even (f32 params hold the master itself). Version 1's master: about normal with
 * standard deviation DELTA_SIGMA (Irwin-Hall, four uniforms), the initializer's scale that trained LLM linear weights
 * keep; the weights' sizes set the fraction a step changes (a step of lr changes a bf16 value of
 * size |x| with odds about lr / (|x| 2^-8)), and a master lies anywhere between two bf16 values,
 * not on one. Counter-based like bench_model.c's data: a sender
 * (shard layout) and a receiver (target layout) step their own copies of the same elements and
 * agree bit for bit, since each step is a product then a sum, each rounded to fp32 (ISO C11, as
 * CMakeLists.txt sets it, contracts no a * b + c into an FMA). */

#define DELTA_SIGMA 0.02 /* version 1's masters: N(0, 0.02^2), HF's initializer_range */

uint64_t bench_delta_seed(const char *name)
{
    return XXH3_64bits_withSeed(name, strlen(name), 0xDE17A5EEDull);
}

static inline float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* Round to nearest, ties to even (the values are finite and far from overflow). */
static inline uint16_t bf16_rne(float f)
{
    uint32_t u = bits_of_f32(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float delta_master1(uint64_t seed, uint64_t i)
{
    uint64_t h = bench_mix64(seed + i * 0xD1B54A32D192ED03ull);
    /* the sum of four uniforms (16 bits each), centred and scaled to unit variance: close to a
     * normal (its density at 0 is 3.5 % lower, and it has no tail past 3.46 sigma) at a tenth of
     * Box-Muller's cost (no log, no cos: version 1 of a large shape is made in seconds) */
    uint32_t sum = (uint32_t)(h & 0xFFFFu) + (uint32_t)((h >> 16) & 0xFFFFu) +
                   (uint32_t)((h >> 32) & 0xFFFFu) + (uint32_t)(h >> 48);
    double z = ((double)sum + 2.0 - 131072.0) * 0x1p-16 * 1.7320508075688772;
    return (float)(DELTA_SIGMA * z);
}

static inline float delta_dir(uint64_t seed, uint64_t i, uint64_t v)
{
    uint64_t h = bench_mix64((seed ^ (v * 0x9E3779B97F4A7C15ull)) + i * 0xD1B54A32D192ED03ull);
    float mag = (float)(h >> 40) * 0x1p-24f;
    return (h & 1u) ? -mag : mag;
}

/* Masters of elements [src, src + n) of one param at version v, in m[0, n): version 1's values,
 * or one step from version v - 1's (which m holds). */
void bench_delta_row(uint64_t seed, uint64_t src, uint64_t n, uint64_t v, float lr, float *m)
{
    if (v == 1) {
        for (uint64_t c = 0; c < n; c++)
            m[c] = delta_master1(seed, src + c);
        return;
    }
    for (uint64_t c = 0; c < n; c++) {
        float step = lr * delta_dir(seed, src + c, v);
        m[c] = m[c] + step;
    }
}

/* The weight a master gives, as an esz-byte element (bf16 rounded, or f32 itself). */
static inline void delta_weight(float master, size_t esz, void *out)
{
    if (esz == 2) {
        uint16_t b = bf16_rne(master);
        memcpy(out, &b, 2);
    } else {
        uint32_t u = bits_of_f32(master);
        memcpy(out, &u, 4);
    }
}


void bench_delta_round(const float *m, uint64_t n, size_t esz, void *out)
{
    for (uint64_t i = 0; i < n; i++)
        delta_weight(m[i], esz, (char *)out + i * esz);
}

void bench_delta_line_of(const char *explain, char *out, size_t len)
{
    const char *p = explain;
    out[0] = '\0';
    while (p && *p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (strncmp(p, "delta:", 6) == 0) {
            snprintf(out, len, "%.*s", (int)n, p);
            return;
        }
        p = e ? e + 1 : NULL;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* A sender's masters                                                                          */
/* ---------------------------------------------------------------------------------------- */

#define CODEC_PIECE ((uint64_t)4 << 20) /* elements per encoded region: a plan chunk's size */

struct bench_delta_tx {
    const bench_opts_t *o;
    const wsync_shard_t *shards;
    size_t n;
    const size_t *off;     /* shard k's weights at block + off[k] */
    size_t bytes;
    uint64_t *moff;        /* shard k's masters at master + moff[k]; moff[n] = all */
    float *master;
    char *image;           /* --mem cuda: the host image of the block */
    char *prev;            /* --mem host: the previous version's weights */
    void *cbuf;            /* --mem host: the encode buffer */
    uint64_t cap;
    char *dprev;           /* --mem cuda: the previous weights of the last version, on the GPU */
};

int bench_delta_tx_create(const bench_opts_t *o, const wsync_shard_t *shards, size_t n,
                          const size_t *off, size_t bytes, bench_delta_tx_t **out)
{
    bench_delta_tx_t *tx = calloc(1, sizeof(*tx));
    if (!tx || !(tx->moff = calloc(n + 1, sizeof(*tx->moff))))
        goto oom;
    tx->o = o;
    tx->shards = shards;
    tx->n = n;
    tx->off = off;
    tx->bytes = bytes;
    for (size_t k = 0; k < n; k++)
        tx->moff[k + 1] = tx->moff[k] + bench_box_elems(&shards[k].param, &shards[k].box);
    tx->cap = wsync_delta_max_bytes(CODEC_PIECE, 4);
    if (!(tx->master = malloc((tx->moff[n] ? tx->moff[n] : 1) * sizeof(float))))
        goto oom;
    if (o->mem_cuda ? !(tx->image = calloc(bytes ? bytes : 1, 1))
                    : !(tx->prev = malloc(bytes ? bytes : 1)) || !(tx->cbuf = malloc(tx->cap)))
        goto oom;
    *out = tx;
    return 0;
oom:
    bench_delta_tx_free(tx);
    return -1;
}

void bench_delta_tx_free(bench_delta_tx_t *tx)
{
    if (!tx)
        return;
    free(tx->moff);
    free(tx->master);
    free(tx->image);
    free(tx->prev);
    free(tx->cbuf);
    bcuda_free(tx->dprev);
    free(tx);
}

typedef struct {
    const bench_delta_tx_t *tx;
    char *w;               /* the weights: the block (host) or its host image (CUDA) */
    uint64_t version;
    float lr;
    atomic_ullong changed;
} delta_tx_job_t;


#define DELTA_ROW 4096u /* elements stepped at a time: masters in L1 while rounded */

/* Elements [lo, hi) of the sender's masters (all shards end to end): step to the job's version,
 * round, count the weights that change and write them. */
static void delta_tx_range(void *arg, uint64_t lo, uint64_t hi)
{
    delta_tx_job_t *j = arg;
    const bench_delta_tx_t *tx = j->tx;
    size_t n = tx->n, a = 0, b = n;
    while (b - a > 1) { /* the last shard whose masters start at or before lo */
        size_t mid = a + (b - a) / 2;
        if (tx->moff[mid] <= lo)
            a = mid;
        else
            b = mid;
    }
    uint64_t changed = 0;
    for (size_t k = a; k < n && tx->moff[k] < hi; k++) {
        const wsync_shard_t *s = &tx->shards[k];
        uint64_t e0 = lo > tx->moff[k] ? lo - tx->moff[k] : 0;
        uint64_t e1 = (hi < tx->moff[k + 1] ? hi : tx->moff[k + 1]) - tx->moff[k];
        uint64_t first = (uint64_t)s->box.start[0] * bench_row_elems(&s->param);
        uint64_t seed = bench_delta_seed(s->param.name);
        size_t esz = bench_param_esz(&s->param);
        float *mm = tx->master + tx->moff[k];
        char *w = j->w + tx->off[k];
        for (uint64_t e = e0; e < e1; e += DELTA_ROW) {
            uint64_t cnt = e1 - e < DELTA_ROW ? e1 - e : DELTA_ROW;
            bench_delta_row(seed, first + e, cnt, j->version, j->lr, mm + e);
            for (uint64_t c = e; c < e + cnt; c++) {
                uint32_t nw = 0, old = 0;
                delta_weight(mm[c], esz, &nw);
                memcpy(&old, w + c * esz, esz);
                if (nw != old || j->version == 1) {
                    memcpy(w + c * esz, &nw, esz);
                    changed++;
                }
            }
        }
    }
    atomic_fetch_add(&j->changed, changed);
}

uint64_t bench_delta_tx_step(bench_delta_tx_t *tx, char *block, uint64_t v)
{
    char *w = tx->image ? tx->image : block;
    delta_tx_job_t j = {tx, w, v, (float)tx->o->lr, 0};
    bench_par_for(tx->moff[tx->n], 1 << 20, delta_tx_range, &j);
    if (tx->o->mem_cuda && v > 1 && v == (uint64_t)(tx->o->warmup + tx->o->iters)) {
        /* the pair the codec's figures are taken on: the previous weights stay on the GPU */
        if (!tx->dprev && bcuda_malloc((void **)&tx->dprev, tx->bytes ? tx->bytes : 1) != 0)
            return UINT64_MAX;
        if (bcuda_d2d(tx->dprev, block, tx->bytes) != 0)
            return UINT64_MAX;
    }
    if (tx->o->mem_cuda && bcuda_h2d(block, w, tx->bytes) != 0)
        return UINT64_MAX;
    if (v == 1 && tx->prev)
        memcpy(tx->prev, block, tx->bytes);
    return (uint64_t)atomic_load(&j.changed);
}

static void codec_wrong(bench_delta_page_t *page, int rank, uint64_t v, const char *line)
{
    if (page->codec_ok[v - 1][rank] != 2)
        snprintf(page->codec_wrong[rank], sizeof(page->codec_wrong[rank]), "%s", line);
    page->codec_ok[v - 1][rank] = 2;
    fprintf(stderr, PROG ": sender %d: the codec on version %llu: %s\n", rank,
            (unsigned long long)v, line);
}

/* The pieces of CODEC_PIECE elements of every shard, as the chunks the GPU codec takes. */
static bench_codec_chunk_t *codec_chunks(const bench_delta_tx_t *tx, size_t *count)
{
    size_t n = 0, at = 0;
    for (size_t k = 0; k < tx->n; k++) {
        uint64_t ne = bench_box_elems(&tx->shards[k].param, &tx->shards[k].box);
        n += (size_t)((ne + CODEC_PIECE - 1) / CODEC_PIECE);
    }
    bench_codec_chunk_t *c = calloc(n ? n : 1, sizeof(*c));
    if (!c)
        return NULL;
    for (size_t k = 0; k < tx->n; k++) {
        uint64_t ne = bench_box_elems(&tx->shards[k].param, &tx->shards[k].box);
        uint32_t esz = (uint32_t)bench_param_esz(&tx->shards[k].param);
        for (uint64_t e = 0; e < ne; e += CODEC_PIECE)
            c[at++] = (bench_codec_chunk_t){tx->off[k] + e * esz,
                                            ne - e < CODEC_PIECE ? ne - e : CODEC_PIECE, esz};
    }
    *count = n;
    return c;
}

#define CODEC_REPS 5 /* timed launches per batch (the GPU codec), after one untimed */

/* --mem cuda: the kernels on the last version's pair (the block: new; dprev: old). */
static int codec_cuda(bench_delta_tx_t *tx, const char *block, int rank, uint64_t v,
                      bench_delta_page_t *page)
{
    size_t n = 0;
    bench_codec_res_t r;
    bench_codec_chunk_t *c = codec_chunks(tx, &n);
    if (!c) {
        fprintf(stderr, PROG ": sender %d: out of host memory\n", rank);
        return -1;
    }
    int rc = bcuda_delta_codec(block, tx->dprev, c, n, CODEC_REPS, &r);
    free(c);
    bcuda_free(tx->dprev); /* the sync's memory back before the push */
    tx->dprev = NULL;
    if (rc != 0)
        return -1;
    page->enc_s[v - 1][rank] = r.encode_s;
    page->apply_s[v - 1][rank] = r.apply_s;
    page->copy_s[v - 1][rank] = r.copy_s;
    page->amax_s[v - 1][rank] = r.amax_s;
    page->codec_bytes[v - 1][rank] = r.sent;
    page->codec_ok[v - 1][rank] = 1;
    if (!r.correct)
        codec_wrong(page, rank, v, r.wrong);
    return 0;
}

/* --mem host: the CPU codec (core/delta.c) on this version's shards, one thread: for every shard
 * (pieces of CODEC_PIECE elements) a memcpy of the new values (reading both versions' bytes
 * once: it reads one and writes one), the encode against prev (the previous weights) with the
 * piece's plain size as its bound, as core/delta_tx.c does, then what a receiver does with it
 * (core/delta_rx.c): check and apply the stream to prev with the hash, or copy a piece that
 * travels plain. prev then holds this version: its bytes and the hash must be the new ones. */
static int codec_host(bench_delta_tx_t *tx, const char *block, int rank, uint64_t v,
                      bench_delta_page_t *page)
{
    double te = 0, ta = 0, tr = 0;
    uint64_t sent = 0;
    char line[192];
    page->codec_ok[v - 1][rank] = 1;
    for (size_t k = 0; k < tx->n; k++) {
        const wsync_shard_t *s = &tx->shards[k];
        uint64_t n = bench_box_elems(&s->param, &s->box);
        uint32_t esz = (uint32_t)bench_param_esz(&s->param);
        for (uint64_t e = 0; e < n; e += CODEC_PIECE) {
            uint64_t cnt = n - e < CODEC_PIECE ? n - e : CODEC_PIECE, len = 0, h = 0, h2 = 0;
            uint64_t plain = cnt * esz;
            wsync_region_t r = {0, cnt, 1, cnt};
            const char *nw = block + tx->off[k] + e * esz;
            char *old = tx->prev + tx->off[k] + e * esz;
            double t0 = bench_now_s();
            memcpy(tx->cbuf, nw, plain);
            double a = bench_now_s();
            wsync_status_t st = wsync_delta_encode(nw, old, &r, esz, tx->cbuf, plain, &len, &h,
                                                   NULL);
            double b = bench_now_s();
            int delta = st == WSYNC_OK && len < plain;
            if (delta) {
                st = wsync_delta_check(tx->cbuf, len, cnt, esz, s->param.name);
                if (st == WSYNC_OK)
                    st = wsync_delta_apply(tx->cbuf, len, old, &r, esz, &h2);
            } else {
                memcpy(old, nw, plain);
                st = WSYNC_OK;
            }
            double c = bench_now_s();
            if (st != WSYNC_OK) {
                snprintf(line, sizeof(line), "shard %s [%llu, +%llu): %s", s->param.name,
                         (unsigned long long)e, (unsigned long long)cnt, wsync_last_error());
                codec_wrong(page, rank, v, line);
                memcpy(old, nw, plain); /* the next version's pair stays right */
            } else if ((delta && h2 != h) || memcmp(old, nw, plain) != 0) {
                snprintf(line, sizeof(line), "shard %s [%llu, +%llu): the apply does not give "
                         "the new values (hash %016llx, encoder's %016llx)", s->param.name,
                         (unsigned long long)e, (unsigned long long)cnt,
                         (unsigned long long)h2, (unsigned long long)h);
                codec_wrong(page, rank, v, line);
                memcpy(old, nw, plain);
            }
            tr += a - t0;
            te += b - a;
            ta += c - b;
            sent += delta ? len : plain;
        }
    }
    page->enc_s[v - 1][rank] = te;
    page->apply_s[v - 1][rank] = ta;
    page->copy_s[v - 1][rank] = tr;
    page->codec_bytes[v - 1][rank] = sent;
    return 0;
}

int bench_delta_tx_codec(bench_delta_tx_t *tx, const char *block, int rank, uint64_t v,
                         bench_delta_page_t *page)
{
    if (tx->prev)
        return codec_host(tx, block, rank, v, page);
    if (tx->dprev)
        return codec_cuda(tx, block, rank, v, page);
    return 0;
}

#define FLOOR_PIECE ((size_t)4 << 20)

typedef struct {
    const uint8_t *block;
    size_t bytes;
    uint64_t *sink;                  /* [pieces]: the hashes, so that no read is left out */
} floor_job_t;

static wsync_status_t floor_item(void *arg, uint32_t item, uint32_t worker)
{
    floor_job_t *j = arg;
    size_t at = (size_t)item * FLOOR_PIECE, len = j->bytes - at < FLOOR_PIECE ? j->bytes - at
                                                                               : FLOOR_PIECE;
    (void)worker;
    j->sink[item] = XXH3_64bits(j->block + at, len);
    return WSYNC_OK;
}

int bench_delta_read_floor(const void *block, size_t bytes, int rank, bench_delta_page_t *page)
{
    uint32_t nth = 1, pieces = (uint32_t)((bytes + FLOOR_PIECE - 1) / FLOOR_PIECE);
    wsync_workpool_t *pool = NULL;
    floor_job_t job = {block, bytes, calloc(pieces ? pieces : 1, sizeof(uint64_t))};
    double best = 0;
    wsync_status_t st;

    if (job.sink == NULL) {
        fprintf(stderr, PROG ": receiver %d: out of host memory\n", rank);
        return -1;
    }
    if ((st = wsync_workpool_threads("WSYNC_DELTA_THREADS", &nth)) != WSYNC_OK ||
        (st = wsync_workpool_create(nth, &pool)) != WSYNC_OK) {
        fprintf(stderr, PROG ": receiver %d: the floor's threads: %s\n", rank, wsync_last_error());
        free(job.sink);
        return -1;
    }
    for (int k = 0; k < 3 && st == WSYNC_OK; k++) {
        double t0 = bench_now_s();
        st = wsync_workpool_run(pool, pieces, floor_item, &job, INT64_MAX, "the read floor");
        double t = bench_now_s() - t0;
        best = k == 0 || t < best ? t : best;
    }
    wsync_workpool_free(pool);
    free(job.sink);
    if (st != WSYNC_OK) {
        fprintf(stderr, PROG ": receiver %d: the read floor: %s\n", rank, wsync_last_error());
        return -1;
    }
    page->read_floor_s[rank] = best;
    page->read_floor_threads[rank] = nth;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The report                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static json_t *u64s(const uint64_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

/* The codec's figures of the run: per measured version the slowest sender's (senders encode at
 * once), then the median over those versions. */
typedef struct {
    int measured, correct;
    double enc, app, copy, amax, read, ratio;
    uint64_t bytes;                  /* the last measured version's, over all senders */
    const char *read_how, *how, *wrong;
} codec_fig_t;

static void codec_figures(const bench_delta_run_t *run, const bench_delta_page_t *d,
                          codec_fig_t *f)
{
    const bench_opts_t *o = run->o;
    double enc[MODEL_MAX_VERSIONS], app[MODEL_MAX_VERSIONS], cp[MODEL_MAX_VERSIONS];
    double ax[MODEL_MAX_VERSIONS];
    int nv = 0;
    memset(f, 0, sizeof(*f));
    f->correct = 1;
    f->wrong = "";
    for (int k = 0; k < o->iters; k++) {
        int v = o->warmup + k, any = 0;
        enc[nv] = app[nv] = cp[nv] = ax[nv] = 0;
        uint64_t bytes = 0;
        for (int s = 0; s < run->N; s++) {
            if (d->codec_ok[v][s] == 0)
                continue;
            any = 1;
            if (d->codec_ok[v][s] != 1 && f->correct) {
                f->correct = 0;
                f->wrong = d->codec_wrong[s];
            }
            enc[nv] = d->enc_s[v][s] > enc[nv] ? d->enc_s[v][s] : enc[nv];
            app[nv] = d->apply_s[v][s] > app[nv] ? d->apply_s[v][s] : app[nv];
            cp[nv] = d->copy_s[v][s] > cp[nv] ? d->copy_s[v][s] : cp[nv];
            ax[nv] = d->amax_s[v][s] > ax[nv] ? d->amax_s[v][s] : ax[nv];
            bytes += d->codec_bytes[v][s];
        }
        if (any) {
            f->bytes = bytes;
            nv++;
        }
    }
    f->how = o->mem_cuda
                 ? "CUDA kernels/delta.h on the last version's pair of every sender's shards "
                   "(pieces of 4M elements, batches up to 256 MiB, median of 5 launches each), "
                   "apart from the sync"
                 : "CPU core/delta.h, one thread, on every version's pair of the shards (pieces "
                   "of 4M elements; check and apply as a receiver), apart from the sync";
    if (nv == 0)
        return;
    f->measured = 1;
    f->enc = bench_stats_of(enc, nv).median;
    f->app = bench_stats_of(app, nv).median;
    f->copy = bench_stats_of(cp, nv).median;
    f->amax = bench_stats_of(ax, nv).median;
    f->read = f->copy;
    f->read_how = o->mem_cuda ? "a device-to-device copy of one version" : "a memcpy of one version";
    if (o->mem_cuda && f->amax > 0 && f->amax < f->copy) {
        f->read = f->amax;
        f->read_how = "an amax over both versions";
    }
    f->ratio = f->read > 0 ? (f->enc + f->app) / f->read : 0;
}

/* g[0]: the group with delta = --delta-mode, g[1]: the same versions with delta = off. */
/* The run's description in the JSON line: what was asked and what ran. */
static void run_json(json_t *j, const bench_delta_run_t *run, const bench_delta_group_t *g, int on)
{
    const bench_opts_t *o = run->o;
    const bench_delta_page_t *d = g[0].page;

    json_object_set_new(j, "mode", json_string("model"));
    json_object_set_new(j, "delta", json_true());
    json_object_set_new(j, "lr", json_real(o->lr));
    json_object_set_new(j, "direction", json_string("uniform |d| in [0,1), random sign"));
    json_object_set_new(j, "delta_mode", json_string(o->delta_mode));
    json_object_set_new(j, "delta_resolved", json_string(on ? "on" : "off"));
    json_object_set_new(j, "delta_explain", json_string(d->delta_line));
    json_object_set_new(j, "model_shape", json_string(run->shape));
    json_object_set_new(j, "param_elems", json_integer((json_int_t)run->param_elems));
    json_object_set_new(j, "param_bytes", json_integer((json_int_t)run->param_bytes));
    json_object_set_new(j, "senders", json_integer(run->N));
    json_object_set_new(j, "tp", json_integer(run->T));
    json_object_set_new(j, "replicas", json_integer(run->R));
    json_object_set_new(j, "receivers", json_integer(run->NR));
    json_object_set_new(j, "colocated", json_boolean(o->colocated));
    json_object_set_new(j, "mem", json_string(o->mem_cuda ? "cuda" : "host"));
    json_object_set_new(j, "scheme_asked", json_string(o->scheme));
    json_object_set_new(j, "scheme", json_string(g[0].scheme));
    json_object_set_new(j, "transport", json_string(o->store ? o->transport : ""));
    /* the store's transport hint (WSYNC_STORE_PROVIDER: "tcp" forces TCP), "" for its
     * default choice */
    const char *hint = o->store ? getenv("WSYNC_STORE_PROVIDER") : NULL;
    json_object_set_new(j, "store_provider", json_string(hint ? hint : ""));
    json_object_set_new(j, "gpu", json_string(g[0].gpu));
    json_object_set_new(j, "iters", json_integer(o->iters));
    json_object_set_new(j, "warmup", json_integer(o->warmup));
}

/* The codec's figures in the JSON line (null where not measured). */
static void codec_json(json_t *j, const codec_fig_t *cf, int mem_cuda)
{
    json_object_set_new(j, "encode_seconds", cf->measured ? json_real(cf->enc) : json_null());
    json_object_set_new(j, "apply_seconds", cf->measured ? json_real(cf->app) : json_null());
    json_object_set_new(j, "read_both_seconds", cf->measured ? json_real(cf->read) : json_null());
    json_object_set_new(j, "read_both", json_string(cf->measured ? cf->read_how : ""));
    json_object_set_new(j, "copy_seconds", cf->measured ? json_real(cf->copy) : json_null());
    json_object_set_new(j, "amax_seconds",
                        cf->measured && mem_cuda ? json_real(cf->amax) : json_null());
    json_object_set_new(j, "codec_ratio", cf->measured ? json_real(cf->ratio) : json_null());
    json_object_set_new(j, "codec_correct", cf->measured ? json_boolean(cf->correct) : json_null());
    if (cf->measured && !cf->correct)
        json_object_set_new(j, "codec_wrong", json_string(cf->wrong));
    json_object_set_new(j, "codec_bytes", json_integer((json_int_t)cf->bytes));
    json_object_set_new(j, "codec", json_string(cf->how));
}

/* The read floor of the slowest receiver, its threads into *threads (0 s where none was
 * measured: not the store, or not host memory). */
static double slowest_read_floor(const bench_delta_run_t *run, const bench_delta_page_t *d,
                                 uint32_t *threads)
{
    double rf = 0;
    for (int j = 0; j < run->NR; j++) {
        if (d->read_floor_s[j] > rf) {
            rf = d->read_floor_s[j];
            *threads = d->read_floor_threads[j];
        }
    }
    return rf;
}

int bench_delta_report(const bench_delta_run_t *run, const bench_delta_group_t *g)
{
    const bench_opts_t *o = run->o;
    const bench_delta_page_t *d = g[0].page; /* the delta group's figures */
    int K = o->iters, W = o->warmup;
    double td[MODEL_MAX_VERSIONS], tf[MODEL_MAX_VERSIONS], frac[MODEL_MAX_VERSIONS];
    double upd[MODEL_MAX_VERSIONS];
    double ratio[MODEL_MAX_VERSIONS], wr[MODEL_MAX_VERSIONS];
    uint64_t wire[MODEL_MAX_VERSIONS], encb[MODEL_MAX_VERSIONS], plain[MODEL_MAX_VERSIONS];
    uint64_t base[MODEL_MAX_VERSIONS];
    double pd[MODEL_MAX_VERSIONS], pf[MODEL_MAX_VERSIONS];
    memcpy(td, g[0].times, sizeof(td));
    memcpy(tf, g[1].times, sizeof(tf));
    memcpy(pd, g[0].push, sizeof(pd));
    memcpy(pf, g[1].push, sizeof(pf));
    int on = strncmp(d->delta_line, "delta: on", 9) == 0;
    /* the full version's wire bytes: version 1 of the delta group (no base yet: all plain);
     * with the mode resolved off nothing is counted, and every version moves the plan's bytes */
    uint64_t full = 0;
    for (int s = 0; s < run->N; s++)
        full += d->wire[0][s];
    if (!on || full == 0)
        full = run->plan_bytes;
    for (int k = 0; k < K; k++) {
        int v = W + k;
        uint64_t ch = 0;
        wire[k] = encb[k] = plain[k] = base[k] = 0;
        upd[k] = 0;
        for (int s = 0; s < run->N; s++) {
            ch += d->changed[v][s];
            wire[k] += d->wire[v][s];
            encb[k] += d->encoded[v][s];
            plain[k] += d->plain[v][s];
            if (d->base[v][s] > base[k])
                base[k] = d->base[v][s];
            /* senders step at once: the slowest is the version's */
            if (d->update_s[v][s] > upd[k])
                upd[k] = d->update_s[v][s];
        }
        if (!on)
            wire[k] = full;
        frac[k] = run->shard_elems ? (double)ch / (double)run->shard_elems : 0;
        wr[k] = (double)wire[k] / (double)full;
        ratio[k] = tf[k] > 0 ? td[k] / tf[k] : 0;
    }
    double wired[MODEL_MAX_VERSIONS], encd[MODEL_MAX_VERSIONS], plaind[MODEL_MAX_VERSIONS];
    for (int k = 0; k < K; k++) {
        wired[k] = (double)wire[k];
        encd[k] = (double)encb[k];
        plaind[k] = (double)plain[k];
    }
    bench_stats_t sd = bench_stats_of(td, K), sf = bench_stats_of(tf, K);
    bench_stats_t sfrac = bench_stats_of(frac, K), swire = bench_stats_of(wired, K);
    bench_stats_t sr = bench_stats_of(ratio, K), swr = bench_stats_of(wr, K);
    double u = bench_stats_of(upd, K).median;
    codec_fig_t cf;
    codec_figures(run, d, &cf);
    uint32_t rft = 0;
    double rf = slowest_read_floor(run, d, &rft);
    int right_d = g[0].right, right_f = g[1].right;
    int right = right_d && right_f;
    const char *first_wrong = g[0].first_wrong[0] ? g[0].first_wrong : g[1].first_wrong;
    const char *what = run->what;
    printf("%s: --delta: %s, mem %s, scheme %s (asked %s%s%s), lr %g, %d timed versions after "
           "%d warm-up\n",
           PROG, what, o->mem_cuda ? "cuda" : "host", g[0].scheme, o->scheme,
           o->store ? ", transport " : "", o->store ? o->transport : "", o->lr, K, W);
    printf("  delta mode        asked %s: %s\n", o->delta_mode,
           d->delta_line[0] ? d->delta_line : "(no explanation line)");
    printf("  changed           %.4f %% of %llu elements per version (median; %.4f..%.4f)\n",
           100 * sfrac.median, (unsigned long long)run->shard_elems, 100 * sfrac.min,
           100 * sfrac.max);
    printf("  wire bytes        %.4f GB per version (median; encoded %.4f GB, plain %.4f GB) "
           "vs full %.4f GB: %.2f %%\n",
           swire.median / 1e9, bench_stats_of(encd, K).median / 1e9,
           bench_stats_of(plaind, K).median / 1e9, (double)full / 1e9, 100 * swr.median);
    printf("  seconds           delta %.6f (%.6f..%.6f)   full %.6f (%.6f..%.6f)   ratio %.3f "
           "(median of per-version ratios; %s)\n",
           sd.median, sd.min, sd.max, sf.median, sf.min, sf.max, sr.median,
           o->store ? "slowest receiver's fetch" : "slowest sender's push");
    if (rf > 0)
        printf("  read floor        %.6f s: a receiver's targets read once on %u threads, %.3f x "
               "full (the least its check of the new values' hash can take here)\n",
               rf, rft, sf.median > 0 ? rf / sf.median : 0);
    if (o->store)
        printf("  publish           delta %.6f   full %.6f   (the slowest sender's push, "
               "median; not in the fetch times above)\n",
               bench_stats_of(pd, K).median, bench_stats_of(pf, K).median);
    if (cf.measured)
        printf("  codec             encode %.6f s, apply %.6f s, read both %.6f s (%s): ratio "
               "%.3f; %s; %s\n",
               cf.enc, cf.app, cf.read, cf.read_how, cf.ratio,
               cf.correct ? "applied bytes right" : "applied bytes WRONG", cf.how);
    if (cf.measured && !cf.correct)
        printf("  codec wrong       %s\n", cf.wrong);
    printf("  update            %.3f s per version (the step, untimed)\n", u);
    if (right)
        printf("  correct           yes: every receiver checked all %d versions of both "
               "modes\n",
               W + K);
    else
        printf("  correct           NO (delta %s, full %s): %s\n", right_d ? "right" : "WRONG",
               right_f ? "right" : "WRONG", first_wrong[0] ? first_wrong : "a version missing");
    if (o->json) {
        json_t *j = json_object();
        run_json(j, run, g, on);
        json_object_set_new(j, "changed_fraction", json_real(sfrac.median));
        json_object_set_new(j, "changed_fractions", bench_json_reals(frac, K));
        json_object_set_new(j, "wire_bytes", json_integer((json_int_t)swire.median));
        json_object_set_new(j, "wire_bytes_per_version", u64s(wire, K));
        json_object_set_new(j, "encoded_bytes", json_integer((json_int_t)bench_stats_of(encd, K).median));
        json_object_set_new(j, "plain_bytes", json_integer((json_int_t)bench_stats_of(plaind, K).median));
        json_object_set_new(j, "base_versions", u64s(base, K));
        json_object_set_new(j, "full_wire_bytes", json_integer((json_int_t)full));
        json_object_set_new(j, "wire_ratio", json_real(swr.median));
        json_object_set_new(j, "bytes_moved", json_integer((json_int_t)run->plan_bytes));
        json_object_set_new(j, "seconds", json_real(sd.median));
        json_object_set_new(j, "seconds_min", json_real(sd.min));
        json_object_set_new(j, "seconds_max", json_real(sd.max));
        json_object_set_new(j, "times", bench_json_reals(td, K));
        json_object_set_new(j, "full_seconds", json_real(sf.median));
        json_object_set_new(j, "full_seconds_min", json_real(sf.min));
        json_object_set_new(j, "full_seconds_max", json_real(sf.max));
        json_object_set_new(j, "full_times", bench_json_reals(tf, K));
        json_object_set_new(j, "time_ratio", json_real(sr.median));
        json_object_set_new(j, "read_floor_seconds", rf > 0 ? json_real(rf) : json_null());
        json_object_set_new(j, "read_floor_threads", json_integer(rft));
        json_object_set_new(j, "read_floor_ratio",
                            rf > 0 && sf.median > 0 ? json_real(rf / sf.median) : json_null());
        json_object_set_new(j, "push_seconds", json_real(bench_stats_of(pd, K).median));
        json_object_set_new(j, "full_push_seconds", json_real(bench_stats_of(pf, K).median));
        codec_json(j, &cf, o->mem_cuda);
        json_object_set_new(j, "update_seconds", json_real(u));
        json_object_set_new(j, "correct", json_boolean(right));
        json_object_set_new(j, "correct_delta", json_boolean(right_d));
        json_object_set_new(j, "correct_full", json_boolean(right_f));
        json_object_set_new(j, "version", json_integer(W + K));
        bench_print_json(j);
    }
    fflush(stdout);
    return right ? 0 : 1;
}
