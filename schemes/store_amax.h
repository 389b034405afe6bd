/* Internal: per-tensor FP8 on the wire through the store (docs/fp8_wire.md, "The store" and
 * section 5). A per-tensor target's scale comes from the amax over all of it, and its chunks
 * come from several senders that pack before any reader asks. So a reader names each of its
 * per-tensor targets as a SET: the target's rule and every chunk that feeds it (sender, shard,
 * region), keyed by the xxh3 of that description (wsync_store_amax_key: readers with equal
 * targets, replicas, name one set). It sends its sets to sender 0 once, at setup; sender 0
 * appends the new ones to its LIST and forwards them to every other sender, which append them in
 * the order they came (one coordinator connection each: the same order), so that every sender's
 * list is sender 0's or a prefix of it. Each version every sender with a list sends sender 0 its
 * partial amaxes (one f32 per set of its list, the max over its own members' regions, 0 where it
 * has none); sender 0 takes, over the prefix every sender reported, the max of each, and sends
 * it back: one control round trip per version, once some reader has a per-tensor target. A set
 * is AGREED for a version when it lies in that prefix; its senders pack its regions with that
 * amax (the table's row names the set: the rule's block fields carry its key), the others are
 * left to the readers, who quantize the whole target themselves to the same bytes. */
#ifndef WSYNC_SCHEMES_STORE_AMAX_H
#define WSYNC_SCHEMES_STORE_AMAX_H

#include <stdint.h>

#include "core/objects.h"
#include "core/proto.h"
#include "reshard/plan.h"

/* relay tags of the store (store_delta.c has 1, store_fp8.c 2) */
#define STORE_AMAX_SETS_TAG 3u       /* a reader's sets, to sender 0; sender 0's new ones, on */
#define STORE_AMAX_PART_TAG 4u       /* a sender's partial amaxes, or sender 0's agreed ones */

/* One chunk of a set: a region of sender `sender`'s shard `shard`. */
typedef struct {
    uint32_t sender, shard;
    wsync_region_t g;
} store_amax_member_t;

/* The set's key: xxh3 of its rule (block fields ignored) and its members, sorted here in place
 * (never 0). */
uint64_t wsync_store_amax_key(const wsync_wire_rule_t *rule, store_amax_member_t *mem,
                              uint32_t n);
/* A per-tensor rule carries the key of its set in its block fields (the table's rows, the
 * readers' regions); plain: the rule as the quantizer takes it (block fields 0). */
void wsync_store_amax_rule_keyed(wsync_wire_rule_t *r, uint64_t key);
uint64_t wsync_store_amax_rule_key(const wsync_wire_rule_t *r);
void wsync_store_amax_rule_plain(wsync_wire_rule_t *r);

/* A set as a reader encodes it: u64 key, the rule (six u32: fp8 dtype, scheme, 0, 0, eps bits,
 * flags), u32 n, then n members of u32 sender, u32 shard, u64 off, rows, cols, pitch. */
void wsync_store_amax_put_set(wsync_wbuf_t *b, uint64_t key, const wsync_wire_rule_t *rule,
                              const store_amax_member_t *mem, uint32_t n);

/* ---- relays kept for later (a sender's amaxes before their exchange, a reader's regions during
 * one) ---- */
typedef struct {
    struct store_relayq_item {
        wsync_msg_t *msg;            /* owned */
        wsync_relay_t rl;            /* points into msg */
    } *items;                        /* [n] in the order they came */
    uint32_t n, cap;
} store_relayq_t;

/* Append (msg, rl); q owns msg. Out of memory: msg is freed and a warning logged, naming the
 * relay and `lost` (what its loss costs). Zeroed q: empty. */
void wsync_store_relayq_push(store_relayq_t *q, wsync_msg_t *msg, const wsync_relay_t *rl,
                             const char *lost);
/* Take the first one (the caller owns *msg): 0 when q is empty. */
int wsync_store_relayq_pop(store_relayq_t *q, wsync_msg_t **msg, wsync_relay_t *rl);
/* Free every message kept (the storage stays for reuse); _free also the storage. */
void wsync_store_relayq_clear(store_relayq_t *q);
void wsync_store_relayq_free(store_relayq_t *q);

/* ---- a sender's list ---- */
typedef struct store_amax store_amax_t;

wsync_status_t wsync_store_amax_create(int rank, uint32_t nsenders, store_amax_t **out);
void wsync_store_amax_free(store_amax_t *a);
/* A relay of STORE_AMAX_SETS_TAG: on sender 0, a reader's sets (new ones appended and kept to be
 * forwarded); on another sender, sender 0's (appended). Malformed sets are logged and left out
 * (a reader's), or fail (sender 0's: the lists would part). */
wsync_status_t wsync_store_amax_take(store_amax_t *a, const wsync_relay_t *rl);
/* An amax relay (STORE_AMAX_PART_TAG) that came before its exchange began (another sender was
 * ahead): kept for it; a owns msg. */
void wsync_store_amax_keep(store_amax_t *a, wsync_msg_t *msg, const wsync_relay_t *rl);
/* Sender 0, at version `version`'s start: forward the sets appended since the last call to every
 * other sender (before its PUBLISH of this version, so each has them before the next one). The
 * exchange runs from the version after the first forward on (the relay says which). */
wsync_status_t wsync_store_amax_forward(store_amax_t *a, wsync_member_t *m, uint64_t version);
/* The sets of the list and this sender's members of set k. */
uint32_t wsync_store_amax_nsets(const store_amax_t *a);
const store_amax_member_t *wsync_store_amax_members(const store_amax_t *a, uint32_t k,
                                                    uint32_t *n);
const wsync_wire_rule_t *wsync_store_amax_rule(const store_amax_t *a, uint32_t k);
/* Whether this version exchanges: from the version after sender 0's first forward, on every
 * sender alike. */
int wsync_store_amax_due(const store_amax_t *a, uint64_t version);
/* One version's exchange: part[nsets] holds this sender's partials on entry (nsets: its list's
 * length when it computed them). On success the agreed amaxes are kept for
 * wsync_store_amax_agreed until the next exchange. `refused` (not WSYNC_OK: this sender could not
 * compute its partials, e.g. NONFINITE, NOMEM, DEVICE, TIMEOUT): tell sender 0 that status and
 * the last error's words (which the caller leaves as its partials set it), and return at once. Relays of other tags that arrive meanwhile go to defer(arg, msg, rl), which owns
 * msg. A sender that refused fails the others as wsync_store_amax_refusal says; a sender silent
 * by deadline_ms is TIMEOUT naming it; a lost one fails the group (the coordinator's ABORT names
 * it). */
typedef void (*wsync_store_amax_defer_fn)(void *arg, wsync_msg_t *msg, const wsync_relay_t *rl);
wsync_status_t wsync_store_amax_agree(store_amax_t *a, wsync_member_t *m, uint64_t version,
                                      const float *part, uint32_t nsets, wsync_status_t refused,
                                      int64_t deadline_ms, wsync_store_amax_defer_fn defer,
                                      void *arg);
/* The flags word of a partials message that carries refusal `why` (0 for WSYNC_OK), and back
 * (WSYNC_OK when the flags say no refusal). */
uint32_t wsync_store_amax_refused_flags(wsync_status_t why);
wsync_status_t wsync_store_amax_flags_status(uint32_t flags);
/* What another sender returns when sender `who` refused with `why`: NONFINITE "sender N found a
 * NaN or Inf in its part of a per-tensor target" for NONFINITE only; any other status is ABORTED
 * naming the sender and that status (a timeout or a device error says nothing of the weights).
 * Then ": " and the refusing sender's own words, text[0 .. tlen) (which param, where), when it
 * sent them: whichever sender's failure reaches the coordinator first, the group's error says
 * what was found. Sets the last error; returns the status. */
wsync_status_t wsync_store_amax_refusal(uint32_t who, wsync_status_t why, const char *text,
                                        uint32_t tlen);
/* The agreed amax of the set keyed `key` for the version just agreed; 0 when it is not agreed. */
int wsync_store_amax_agreed(const store_amax_t *a, uint64_t key, float *amax);

#endif
