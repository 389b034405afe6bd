/* Per-tensor FP8 on the wire through the store: the readers' sets, the senders' lists and their
 * per-version amax exchange (schemes/store_amax.h says how they fit together). */
#include "schemes/store_amax.h"

#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/log.h"
#include "core/relay.h"
#include "core/status.h"
#include "core/util.h"

#define MEMBER_BYTES 40u             /* u32 sender, u32 shard, u64 off, rows, cols, pitch */
#define SET_MIN_BYTES (8u + 24u + 4u + MEMBER_BYTES)
#define PART_HDR 20u                 /* u64 version, u32 flags, u32 who, u32 count */
/* A refusal carries, after its header (count 0), the refusing sender's own words: at most this
 * many bytes of its error, so that every sender's error names the param and where */
#define REFUSAL_TEXT_MAX 512u
#define PART_REFUSED 1u              /* bits 8-15: the refusing sender's -wsync_status_t */
#define POISON (-1.0f)               /* a set some sender cannot make: left to its readers */

typedef struct {
    uint64_t key;
    wsync_wire_rule_t rule;          /* plain (block fields 0) */
    store_amax_member_t *mine;       /* this sender's members */
    uint32_t nmine;
} aset_t;

typedef struct {
    uint64_t key;
    uint32_t k1;                     /* the set's index + 1; 0: an empty slot */
} akey_t;

struct store_amax {
    int rank;
    uint32_t nsenders;
    aset_t *sets;
    uint32_t n, cap;
    akey_t *index;                   /* [nindex] open addressing by key (a power of 2, > 2n) */
    uint32_t nindex;
    wsync_wbuf_t fwd;                /* sender 0: sets appended since the last forward */
    uint32_t nfwd;
    uint64_t on_from;                /* the first version that exchanges (0: none yet) */
    uint64_t agreed_version;
    float *agreed;                   /* [nagreed] of agreed_version; POISON: not agreed */
    uint32_t nagreed;
    store_relayq_t kept;             /* amax relays taken before their exchange began */
};

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static int member_cmp(const void *x, const void *y)
{
    const store_amax_member_t *a = x, *b = y;
#define CMP(u, v)                                                                                \
    if ((u) != (v))                                                                              \
        return (u) < (v) ? -1 : 1
    CMP(a->sender, b->sender);
    CMP(a->shard, b->shard);
    CMP(a->g.off, b->g.off);
    CMP(a->g.rows, b->g.rows);
    CMP(a->g.cols, b->g.cols);
    CMP(a->g.pitch, b->g.pitch);
#undef CMP
    return 0;
}

static void put_rule(wsync_wbuf_t *b, const wsync_wire_rule_t *r)
{
    wsync_put_u32(b, (uint32_t)r->fp8_dtype);
    wsync_put_u32(b, (uint32_t)r->scheme);
    wsync_put_u32(b, 0);
    wsync_put_u32(b, 0);
    wsync_put_u32(b, f32_bits(r->eps));
    wsync_put_u32(b, (r->ue8m0 ? 1u : 0u) | (r->no_saturate ? 2u : 0u));
}

static void put_member(wsync_wbuf_t *b, const store_amax_member_t *x)
{
    wsync_put_u32(b, x->sender);
    wsync_put_u32(b, x->shard);
    wsync_put_u64(b, x->g.off);
    wsync_put_u64(b, x->g.rows);
    wsync_put_u64(b, x->g.cols);
    wsync_put_u64(b, x->g.pitch);
}

uint64_t wsync_store_amax_key(const wsync_wire_rule_t *rule, store_amax_member_t *mem, uint32_t n)
{
    wsync_wbuf_t b;
    uint64_t key;

    if (n > 1)
        qsort(mem, n, sizeof(*mem), member_cmp);
    wsync_wbuf_init(&b);
    put_rule(&b, rule);
    for (uint32_t i = 0; i < n; i++)
        put_member(&b, &mem[i]);
    /* out of memory: a key no sender computes, so the set is only ever quantized by readers */
    key = b.err ? 1u : XXH3_64bits(b.data, b.len);
    wsync_wbuf_free(&b);
    return key ? key : 1u;
}

void wsync_store_amax_rule_keyed(wsync_wire_rule_t *r, uint64_t key)
{
    r->block_rows = (int32_t)(uint32_t)key;
    r->block_cols = (int32_t)(uint32_t)(key >> 32);
}

uint64_t wsync_store_amax_rule_key(const wsync_wire_rule_t *r)
{
    return (uint64_t)(uint32_t)r->block_rows | (uint64_t)(uint32_t)r->block_cols << 32;
}

void wsync_store_amax_rule_plain(wsync_wire_rule_t *r)
{
    r->block_rows = 0;
    r->block_cols = 0;
}

void wsync_store_amax_put_set(wsync_wbuf_t *b, uint64_t key, const wsync_wire_rule_t *rule,
                              const store_amax_member_t *mem, uint32_t n)
{
    wsync_put_u64(b, key);
    put_rule(b, rule);
    wsync_put_u32(b, n);
    for (uint32_t i = 0; i < n; i++)
        put_member(b, &mem[i]);
}

void wsync_store_relayq_push(store_relayq_t *q, wsync_msg_t *msg, const wsync_relay_t *rl,
                             const char *lost)
{
    if (q->n == q->cap) {
        uint32_t nc = q->cap ? q->cap * 2 : 8;
        struct store_relayq_item *it = realloc(q->items, (size_t)nc * sizeof(*it));
        if (it == NULL) {
            WSYNC_LOG_W("store: no memory to keep a relay of tag %u from %s %d (%s lost)",
                        rl->tag, rl->role == WSYNC_ROLE_RECEIVER ? "reader" : "sender", rl->rank,
                        lost);
            wsync_msg_free(msg);
            return;
        }
        q->items = it;
        q->cap = nc;
    }
    q->items[q->n++] = (struct store_relayq_item){msg, *rl};
}

int wsync_store_relayq_pop(store_relayq_t *q, wsync_msg_t **msg, wsync_relay_t *rl)
{
    if (q->n == 0)
        return 0;
    *msg = q->items[0].msg;
    *rl = q->items[0].rl;
    memmove(&q->items[0], &q->items[1], (size_t)(--q->n) * sizeof(*q->items));
    return 1;
}

void wsync_store_relayq_clear(store_relayq_t *q)
{
    for (uint32_t i = 0; i < q->n; i++)
        wsync_msg_free(q->items[i].msg);
    q->n = 0;
}

void wsync_store_relayq_free(store_relayq_t *q)
{
    wsync_store_relayq_clear(q);
    free(q->items);
    q->items = NULL;
    q->cap = 0;
}

wsync_status_t wsync_store_amax_create(int rank, uint32_t nsenders, store_amax_t **out)
{
    store_amax_t *a = calloc(1, sizeof(*a));

    if (a == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    a->rank = rank;
    a->nsenders = nsenders;
    wsync_wbuf_init(&a->fwd);
    *out = a;
    return WSYNC_OK;
}

void wsync_store_amax_free(store_amax_t *a)
{
    if (a == NULL)
        return;
    for (uint32_t k = 0; k < a->n; k++)
        free(a->sets[k].mine);
    free(a->sets);
    free(a->index);
    free(a->agreed);
    wsync_store_relayq_free(&a->kept);
    wsync_wbuf_free(&a->fwd);
    free(a);
}

/* Where `key` is in the index, or the empty slot where it would go (nindex > 0). Linear probing
 * over a hash of the key: a set's lookup costs O(1) whatever the number of sets (tens of
 * thousands of MoE experts' targets), where a sorted index moved O(n) per append. */
static uint32_t index_slot(const store_amax_t *a, uint64_t key)
{
    uint32_t mask = a->nindex - 1;
    uint32_t at = (uint32_t)((key ^ key >> 31) * 0x9e3779b97f4a7c15ull >> 32) & mask;
    while (a->index[at].k1 != 0 && a->index[at].key != key)
        at = (at + 1) & mask;
    return at;
}

/* The set keyed `key` (the last appended of that key), or UINT32_MAX. */
static uint32_t index_find(const store_amax_t *a, uint64_t key)
{
    if (a->nindex == 0)
        return UINT32_MAX;
    const akey_t *x = &a->index[index_slot(a, key)];
    return x->k1 != 0 ? x->k1 - 1 : UINT32_MAX;
}

/* Room in the index for one more set (kept under half full). */
static wsync_status_t index_room(store_amax_t *a)
{
    if ((uint64_t)(a->n + 1) * 2 < a->nindex)
        return WSYNC_OK;
    uint32_t nc = a->nindex ? a->nindex * 2 : 64;
    akey_t *old = a->index, *ix = calloc(nc, sizeof(*ix));
    uint32_t nold = a->nindex;
    if (ix == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for per-tensor sets");
    a->index = ix;
    a->nindex = nc;
    for (uint32_t i = 0; i < nold; i++)
        if (old[i].k1 != 0)
            a->index[index_slot(a, old[i].key)] = old[i];
    free(old);
    return WSYNC_OK;
}

/* Append a set to the list (its members: this sender's only). */
static wsync_status_t append(store_amax_t *a, uint64_t key, const wsync_wire_rule_t *rule,
                             const store_amax_member_t *mem, uint32_t n)
{
    if (a->n == a->cap) {
        uint32_t nc = a->cap ? a->cap * 2 : 16;
        aset_t *s = realloc(a->sets, (size_t)nc * sizeof(*s));
        if (s == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for per-tensor sets");
        a->sets = s;
        a->cap = nc;
    }
    wsync_status_t rc = index_room(a);
    if (rc != WSYNC_OK)
        return rc;
    aset_t *s = &a->sets[a->n];
    memset(s, 0, sizeof(*s));
    s->key = key;
    s->rule = *rule;
    for (uint32_t i = 0; i < n; i++)
        s->nmine += mem[i].sender == (uint32_t)a->rank;
    if (s->nmine > 0 && (s->mine = malloc((size_t)s->nmine * sizeof(*s->mine))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for per-tensor sets");
    for (uint32_t i = 0, j = 0; i < n; i++)
        if (mem[i].sender == (uint32_t)a->rank)
            s->mine[j++] = mem[i];
    /* a key appended again (only sender 0's forward could): the last one wins, as before */
    a->index[index_slot(a, key)] = (akey_t){key, a->n + 1};
    a->n++;
    return WSYNC_OK;
}

/* One set of a relay: *ok 0 when it is malformed (the rest of the relay cannot be read then). */
static wsync_status_t take_set(store_amax_t *a, wsync_rbuf_t *rb, int from_reader, int *ok)
{
    uint64_t key = wsync_get_u64(rb);
    wsync_wire_rule_t rule;
    uint32_t eps, flags, n;
    store_amax_member_t *mem;
    wsync_status_t rc = WSYNC_OK;

    memset(&rule, 0, sizeof(rule));
    rule.fp8_dtype = (wsync_dtype_t)wsync_get_u32(rb);
    rule.scheme = (wsync_quant_scheme_t)wsync_get_u32(rb);
    (void)wsync_get_u32(rb);
    (void)wsync_get_u32(rb);
    eps = wsync_get_u32(rb);
    memcpy(&rule.eps, &eps, 4);
    flags = wsync_get_u32(rb);
    rule.ue8m0 = (uint8_t)(flags & 1u);
    rule.no_saturate = (uint8_t)((flags >> 1) & 1u);
    n = wsync_get_count(rb, MEMBER_BYTES);
    *ok = !rb->err && n > 0 && rule.scheme == WSYNC_QUANT_TENSOR &&
          (rule.fp8_dtype == WSYNC_DTYPE_F8E4M3FN || rule.fp8_dtype == WSYNC_DTYPE_F8E5M2);
    if (!*ok)
        return WSYNC_OK;
    if ((mem = malloc((size_t)n * sizeof(*mem))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for a per-tensor set of %u regions",
                         n);
    for (uint32_t i = 0; i < n; i++) {
        mem[i].sender = wsync_get_u32(rb);
        mem[i].shard = wsync_get_u32(rb);
        mem[i].g.off = wsync_get_u64(rb);
        mem[i].g.rows = wsync_get_u64(rb);
        mem[i].g.cols = wsync_get_u64(rb);
        mem[i].g.pitch = wsync_get_u64(rb);
        *ok &= mem[i].sender < a->nsenders;
    }
    *ok &= !rb->err;
    if (*ok && from_reader) {
        /* sender 0 keeps what the key says (a reader computes it the same way), once */
        if (wsync_store_amax_key(&rule, mem, n) != key) {
            WSYNC_LOG_W("store: sender 0: a reader's per-tensor set %016llx does not match its "
                        "key: left to its readers", (unsigned long long)key);
        } else if (index_find(a, key) == UINT32_MAX) {
            rc = append(a, key, &rule, mem, n);
            if (rc == WSYNC_OK) {
                wsync_store_amax_put_set(&a->fwd, key, &rule, mem, n);
                a->nfwd++;
            }
        }
    } else if (*ok) {
        rc = append(a, key, &rule, mem, n);
    }
    free(mem);
    return rc;
}

wsync_status_t wsync_store_amax_take(store_amax_t *a, const wsync_relay_t *rl)
{
    wsync_rbuf_t rb;
    int reader = rl->role == WSYNC_ROLE_RECEIVER, ok = 1;
    wsync_status_t rc = WSYNC_OK;

    if (reader && a->rank != 0) {   /* a reader's mistake costs that reader only */
        WSYNC_LOG_W("store: sender %d: per-tensor sets from reader %d, which go to sender 0: "
                    "left out", a->rank, rl->rank);
        return WSYNC_OK;
    }
    if (!reader && (a->rank == 0 || rl->rank != 0))
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: per-tensor sets from sender %d",
                         a->rank, rl->rank);
    wsync_rbuf_init(&rb, rl->data, rl->len);
    if (!reader) {
        uint64_t from = wsync_get_u64(&rb);
        if (a->on_from == 0)
            a->on_from = from;
    }
    uint32_t n = wsync_get_count(&rb, SET_MIN_BYTES);
    for (uint32_t i = 0; i < n && ok && rc == WSYNC_OK; i++)
        rc = take_set(a, &rb, reader, &ok);
    if (rc != WSYNC_OK)
        return rc;
    if (!ok || rb.err || wsync_rbuf_left(&rb) != 0) {
        if (!reader)   /* the lists would part: every exchange after this one would be wrong */
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: sender 0's per-tensor sets "
                             "are malformed", a->rank);
        WSYNC_LOG_W("store: sender 0: reader %d's per-tensor sets are malformed (the rest left to "
                    "that reader)", rl->rank);
    }
    return WSYNC_OK;
}

void wsync_store_amax_keep(store_amax_t *a, wsync_msg_t *msg, const wsync_relay_t *rl)
{
    /* lost: its exchange then names the sender it did not hear from */
    wsync_store_relayq_push(&a->kept, msg, rl, "per-tensor amaxes");
}

wsync_status_t wsync_store_amax_forward(store_amax_t *a, wsync_member_t *m, uint64_t version)
{
    wsync_status_t rc = WSYNC_OK;

    if (a->rank != 0 || a->nfwd == 0)
        return WSYNC_OK;
    if (a->fwd.err)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for per-tensor sets");
    if (a->on_from == 0)
        a->on_from = version + 1;
    /* in relays of at most WSYNC_RELAY_MAX bytes, whole sets each */
    wsync_rbuf_t rb;
    wsync_rbuf_init(&rb, a->fwd.data, a->fwd.len);
    while (wsync_rbuf_left(&rb) > 0 && rc == WSYNC_OK) {
        const uint8_t *start = rb.p;
        uint32_t k = 0;
        while (wsync_rbuf_left(&rb) > 0) {
            const uint8_t *at = rb.p;
            wsync_rbuf_t peek = rb;
            (void)wsync_get_bytes(&peek, 8u + 24u);
            uint32_t nm = wsync_get_u32(&peek);
            (void)wsync_get_bytes(&peek, (size_t)nm * MEMBER_BYTES);
            if (peek.err || (size_t)(peek.p - start) + 12u > WSYNC_RELAY_MAX) {
                if (k == 0)
                    return wsync_err(WSYNC_ERR_RANGE, "store: sender 0: a per-tensor set of %u "
                                     "regions exceeds one relay", nm);
                rb.p = at;
                break;
            }
            rb = peek;
            k++;
        }
        wsync_wbuf_t b;
        wsync_wbuf_init(&b);
        wsync_put_u64(&b, a->on_from);
        wsync_put_u32(&b, k);
        wsync_put_bytes(&b, start, (size_t)(rb.p - start));
        if (b.err)
            rc = wsync_err(WSYNC_ERR_NOMEM, "store: no memory for per-tensor sets");
        for (uint32_t s = 1; s < a->nsenders && rc == WSYNC_OK; s++)
            rc = wsync_member_relay_send(m, WSYNC_ROLE_SENDER, (int)s, STORE_AMAX_SETS_TAG,
                                         b.data, (uint32_t)b.len);
        wsync_wbuf_free(&b);
    }
    if (rc == WSYNC_OK) {
        WSYNC_LOG_D("store: sender 0: %u per-tensor sets forwarded at version %llu (%u in all; "
                    "exchanged from version %llu)", a->nfwd, (unsigned long long)version, a->n,
                    (unsigned long long)a->on_from);
        a->fwd.len = 0;
        a->nfwd = 0;
    }
    return rc;
}

uint32_t wsync_store_amax_nsets(const store_amax_t *a)
{
    return a != NULL ? a->n : 0;
}

const store_amax_member_t *wsync_store_amax_members(const store_amax_t *a, uint32_t k, uint32_t *n)
{
    *n = a->sets[k].nmine;
    return a->sets[k].mine;
}

const wsync_wire_rule_t *wsync_store_amax_rule(const store_amax_t *a, uint32_t k)
{
    return &a->sets[k].rule;
}

int wsync_store_amax_due(const store_amax_t *a, uint64_t version)
{
    return a != NULL && a->on_from != 0 && version >= a->on_from;
}

static void part_encode(wsync_wbuf_t *b, uint64_t version, uint32_t flags, uint32_t who,
                        const float *v, uint32_t n, const char *text)
{
    wsync_put_u64(b, version);
    wsync_put_u32(b, flags);
    wsync_put_u32(b, who);
    wsync_put_u32(b, n);
    for (uint32_t k = 0; k < n; k++)
        wsync_put_u32(b, f32_bits(v[k]));
    if (text != NULL)
        wsync_put_bytes(b, text, strnlen(text, REFUSAL_TEXT_MAX));
}

/* This sender's refusal in its own words: the last error without its status prefix, into buf
 * (REFUSAL_TEXT_MAX + 1 bytes). */
static void refusal_text(wsync_status_t why, char *buf)
{
    const char *e = wsync_last_error(), *prefix = wsync_status_str(why);
    size_t plen = strlen(prefix);
    if (strncmp(e, prefix, plen) == 0 && e[plen] == ':' && e[plen + 1] == ' ')
        e += plen + 2;
    snprintf(buf, REFUSAL_TEXT_MAX + 1, "%s", e);
}

uint32_t wsync_store_amax_refused_flags(wsync_status_t why)
{
    if (why == WSYNC_OK)
        return 0;
    uint32_t code = why < 0 && why >= -255 ? (uint32_t)-why : (uint32_t)-WSYNC_ERR_INTERNAL;
    return PART_REFUSED | code << 8;
}

wsync_status_t wsync_store_amax_flags_status(uint32_t flags)
{
    if (!(flags & PART_REFUSED))
        return WSYNC_OK;
    uint32_t code = (flags >> 8) & 0xffu;
    return code ? (wsync_status_t)-(int)code : WSYNC_ERR_INTERNAL;
}

wsync_status_t wsync_store_amax_refusal(uint32_t who, wsync_status_t why, const char *text,
                                        uint32_t tlen)
{
    const char *sep = tlen > 0 ? ": " : "";
    /* only a NaN or Inf is about the weights: a timeout or a device error is not */
    if (why == WSYNC_ERR_NONFINITE)
        return wsync_err(WSYNC_ERR_NONFINITE, "sender %u found a NaN or Inf in its part of a "
                         "per-tensor target%s%.*s", who, sep, (int)tlen, tlen ? text : "");
    return wsync_err(WSYNC_ERR_ABORTED, "sender %u failed its part of the per-tensor amaxes: %s "
                     "(%s)%s%.*s", who, wsync_status_name(why), wsync_status_str(why), sep,
                     (int)tlen, tlen ? text : "");
}

/* A partial or agreed message of `version` from `from`: its flags, who, count and values; a
 * refusal's text (no values) in *v, *tlen bytes. */
static wsync_status_t part_decode(const wsync_relay_t *rl, uint64_t version, const char *from,
                                  uint32_t *flags, uint32_t *who, uint32_t *n, const uint8_t **v,
                                  uint32_t *tlen)
{
    wsync_rbuf_t rb;
    wsync_rbuf_init(&rb, rl->data, rl->len);
    uint64_t ver = wsync_get_u64(&rb);
    *flags = wsync_get_u32(&rb);
    *who = wsync_get_u32(&rb);
    *n = wsync_get_u32(&rb);
    *v = rb.p;
    *tlen = 0;
    if (!rb.err && (*flags & PART_REFUSED) && *n == 0 &&
        wsync_rbuf_left(&rb) <= REFUSAL_TEXT_MAX) {
        *tlen = (uint32_t)wsync_rbuf_left(&rb);
        return ver == version ? WSYNC_OK
                              : wsync_err(WSYNC_ERR_PROTOCOL, "store: per-tensor amaxes from %s: "
                                          "version %" PRIu64 "; expected version %" PRIu64,
                                          from, ver, version);
    }
    if (rb.err || ver != version || (uint64_t)*n * 4u != wsync_rbuf_left(&rb))
        return wsync_err(WSYNC_ERR_PROTOCOL, "store: per-tensor amaxes from %s: version %" PRIu64
                         ", %u values in %u bytes; expected version %" PRIu64, from, ver, *n,
                         rl->len, version);
    for (uint32_t k = 0; k < *n; k++) {
        float x;
        memcpy(&x, *v + 4u * k, 4);
        if (!((x >= 0.0f && x <= FLT_MAX) || x == POISON))
            return wsync_err(WSYNC_ERR_PROTOCOL, "store: per-tensor amaxes from %s: set %u's "
                             "amax %g is not finite and >= 0", from, k, (double)x);
    }
    return WSYNC_OK;
}

static uint64_t relay_version(const wsync_relay_t *rl)
{
    uint64_t v = 0;
    if (rl->len >= 8)
        memcpy(&v, rl->data, 8);
    return v;
}

/* The next partial (sender 0) or agreed message (the others) of this version; sets relays taken
 * in passing, older versions' messages skipped, other relays deferred. */
static wsync_status_t recv_part(store_amax_t *a, wsync_member_t *m, uint64_t version,
                                int64_t deadline_ms, wsync_store_amax_defer_fn defer, void *arg,
                                wsync_msg_t **msg, wsync_relay_t *rl)
{
    for (;;) {
        wsync_status_t st = WSYNC_OK;
        /* those that came first, in their order */
        if (!wsync_store_relayq_pop(&a->kept, msg, rl))
            st = wsync_member_relay_recv(m, deadline_ms, msg, rl);
        if (st != WSYNC_OK)
            return st;
        if (rl->tag == STORE_AMAX_SETS_TAG) {
            st = wsync_store_amax_take(a, rl);
            wsync_msg_free(*msg);
            if (st != WSYNC_OK)
                return st;
            continue;
        }
        if (rl->tag != STORE_AMAX_PART_TAG || rl->role != WSYNC_ROLE_SENDER) {
            defer(arg, *msg, rl);
            continue;
        }
        if (relay_version(rl) < version) {   /* left by a version that failed */
            wsync_msg_free(*msg);
            continue;
        }
        if ((a->rank == 0 && (rl->rank <= 0 || (uint32_t)rl->rank >= a->nsenders)) ||
            (a->rank != 0 && rl->rank != 0)) {
            st = wsync_err(WSYNC_ERR_PROTOCOL, "store: sender %d: version %" PRIu64 ": "
                           "per-tensor amaxes from sender %d", a->rank, version, rl->rank);
            wsync_msg_free(*msg);
            return st;
        }
        return WSYNC_OK;
    }
}

static wsync_status_t send_all(store_amax_t *a, wsync_member_t *m, uint32_t skip,
                               const wsync_wbuf_t *b)
{
    wsync_status_t rc = b->err ? wsync_err(WSYNC_ERR_NOMEM, "store: no memory") : WSYNC_OK;
    for (uint32_t s = 1; s < a->nsenders && rc == WSYNC_OK; s++)
        if (s != skip)
            rc = wsync_member_relay_send(m, WSYNC_ROLE_SENDER, (int)s, STORE_AMAX_PART_TAG,
                                         b->data, (uint32_t)b->len);
    return rc;
}

static wsync_status_t keep_agreed(store_amax_t *a, uint64_t version, const float *v, uint32_t n)
{
    float *p = realloc(a->agreed, (size_t)(n ? n : 1) * sizeof(*p));
    if (p == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u per-tensor amaxes", n);
    memcpy(p, v, (size_t)n * sizeof(*p));
    a->agreed = p;
    a->nagreed = n;
    a->agreed_version = version;
    return WSYNC_OK;
}

/* Sender 0: every other sender's partials, their max over the prefix all reported, sent back. */
static wsync_status_t agree_root(store_amax_t *a, wsync_member_t *m, uint64_t version,
                                 float *acc, uint32_t count, wsync_status_t refused,
                                 int64_t deadline_ms, wsync_store_amax_defer_fn defer, void *arg)
{
    uint8_t *heard = calloc(a->nsenders, 1);
    uint32_t due = a->nsenders - 1, who = 0;
    wsync_status_t st = WSYNC_OK;
    wsync_wbuf_t b;
    char text[REFUSAL_TEXT_MAX + 1] = "";   /* the refusing sender's words */

    if (refused != WSYNC_OK)
        refusal_text(refused, text);

    if (heard == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "store: no memory");
    while (refused == WSYNC_OK && due > 0 && st == WSYNC_OK) {
        wsync_msg_t *msg = NULL;
        wsync_relay_t rl;
        uint32_t flags, w, n, tlen;
        const uint8_t *v;
        char from[32];
        st = recv_part(a, m, version, deadline_ms, defer, arg, &msg, &rl);
        if (st == WSYNC_ERR_TIMEOUT) {
            char list[256] = "";
            size_t len = 0;
            for (uint32_t s = 1; s < a->nsenders && len + 16 < sizeof(list); s++)
                if (!heard[s])
                    len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%u",
                                            len ? ", " : "", s);
            st = wsync_err(WSYNC_ERR_TIMEOUT, "no per-tensor amaxes from sender %s by the "
                           "version's deadline", list);
            break;
        }
        if (st != WSYNC_OK)
            break;
        snprintf(from, sizeof(from), "sender %d", (int)rl.rank);
        if (heard[rl.rank])
            st = wsync_err(WSYNC_ERR_PROTOCOL, "per-tensor amaxes from %s twice", from);
        else
            st = part_decode(&rl, version, from, &flags, &w, &n, &v, &tlen);
        if (st == WSYNC_OK && (flags & PART_REFUSED)) {
            refused = wsync_store_amax_flags_status(flags);
            who = (uint32_t)rl.rank;
            snprintf(text, sizeof(text), "%.*s", (int)tlen, (const char *)v);
        } else if (st == WSYNC_OK) {
            heard[rl.rank] = 1;
            due--;
            count = WSYNC_MIN(count, n);
            for (uint32_t k = 0; k < count; k++) {
                float x;
                memcpy(&x, v + 4u * k, 4);
                acc[k] = x == POISON || acc[k] == POISON ? POISON : WSYNC_MAX(acc[k], x);
            }
        }
        wsync_msg_free(msg);
    }
    free(heard);
    if (st != WSYNC_OK)
        return st;
    wsync_wbuf_init(&b);
    part_encode(&b, version, wsync_store_amax_refused_flags(refused), who, acc,
                refused != WSYNC_OK ? 0 : count, refused != WSYNC_OK ? text : NULL);
    st = send_all(a, m, refused != WSYNC_OK && who != 0 ? who : UINT32_MAX, &b);
    wsync_wbuf_free(&b);
    if (st == WSYNC_OK && refused != WSYNC_OK && who != 0)
        st = wsync_store_amax_refusal(who, refused, text, (uint32_t)strlen(text));
    if (st == WSYNC_OK && refused == WSYNC_OK)
        st = keep_agreed(a, version, acc, count);
    return st;
}

wsync_status_t wsync_store_amax_agree(store_amax_t *a, wsync_member_t *m, uint64_t version,
                                      const float *part, uint32_t nsets, wsync_status_t refused,
                                      int64_t deadline_ms, wsync_store_amax_defer_fn defer,
                                      void *arg)
{
    wsync_status_t st;
    wsync_wbuf_t b;

    a->nagreed = 0;
    a->agreed_version = 0;
    if (nsets > (WSYNC_RELAY_MAX - PART_HDR) / 4u)
        return wsync_err(WSYNC_ERR_RANGE, "store: %u per-tensor targets exceed one relay", nsets);
    if (a->rank == 0) {
        float *acc = malloc((size_t)(nsets ? nsets : 1) * sizeof(*acc));
        if (acc == NULL)
            return wsync_err(WSYNC_ERR_NOMEM, "store: no memory for %u per-tensor amaxes", nsets);
        memcpy(acc, part, (size_t)nsets * sizeof(*acc));
        st = agree_root(a, m, version, acc, nsets, refused, deadline_ms, defer, arg);
        free(acc);
        return st;
    }
    char text[REFUSAL_TEXT_MAX + 1] = "";
    if (refused != WSYNC_OK)
        refusal_text(refused, text);
    wsync_wbuf_init(&b);
    part_encode(&b, version, wsync_store_amax_refused_flags(refused), (uint32_t)a->rank, part,
                refused != WSYNC_OK ? 0 : nsets, refused != WSYNC_OK ? text : NULL);
    st = b.err ? wsync_err(WSYNC_ERR_NOMEM, "store: no memory")
               : wsync_member_relay_send(m, WSYNC_ROLE_SENDER, 0, STORE_AMAX_PART_TAG, b.data,
                                         (uint32_t)b.len);
    wsync_wbuf_free(&b);
    if (st != WSYNC_OK || refused != WSYNC_OK)
        return st;
    wsync_msg_t *msg = NULL;
    wsync_relay_t rl;
    uint32_t flags, who, n, tlen;
    const uint8_t *v;
    st = recv_part(a, m, version, deadline_ms, defer, arg, &msg, &rl);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "no per-tensor amaxes from sender 0 by the version's deadline");
    if (st != WSYNC_OK)
        return st;
    st = part_decode(&rl, version, "sender 0", &flags, &who, &n, &v, &tlen);
    if (st == WSYNC_OK && (flags & PART_REFUSED))
        st = wsync_store_amax_refusal(who, wsync_store_amax_flags_status(flags), (const char *)v,
                                      tlen);
    else if (st == WSYNC_OK && n > nsets)
        st = wsync_err(WSYNC_ERR_PROTOCOL, "sender 0 agreed on %u per-tensor sets; we reported "
                       "%u", n, nsets);
    if (st == WSYNC_OK) {
        float *tmp = malloc((size_t)(n ? n : 1) * sizeof(*tmp));
        st = tmp == NULL ? wsync_err(WSYNC_ERR_NOMEM, "store: no memory") : WSYNC_OK;
        if (tmp != NULL) {
            memcpy(tmp, v, (size_t)n * 4u);
            st = keep_agreed(a, version, tmp, n);
            free(tmp);
        }
    }
    wsync_msg_free(msg);
    return st;
}

int wsync_store_amax_agreed(const store_amax_t *a, uint64_t key, float *amax)
{
    uint32_t k;

    if (a == NULL || a->nagreed == 0 || (k = index_find(a, key)) == UINT32_MAX)
        return 0;
    if (k >= a->nagreed || a->agreed[k] == POISON)
        return 0;
    *amax = a->agreed[k];
    return 1;
}
