/* Internal: the store's reader of FP8 chunks (store_frx_t), shared by schemes/store_fp8.c (the
 * reads) and schemes/store_fp8_tensor.c (its per-tensor targets' sets and their plain reads). */
#ifndef WSYNC_SCHEMES_STORE_FP8_TENSOR_H
#define WSYNC_SCHEMES_STORE_FP8_TENSOR_H

#include <stdint.h>

#include "schemes/store_fp8.h"

#define STORE_FRX_ALIGN 64u          /* each item's codes and values in the batch buffer */

typedef struct {
    uint32_t seg;
    uint64_t wire;                   /* its codes and scales in the batch buffer */
    uint64_t plain;                  /* UINT64_MAX: packed by its sender; else its values there,
                                        quantized here */
    uint64_t hash;                   /* WSYNC_VERIFY: the sender's xxh3 of what arrived whole;
                                        0: none to check */
    float amax;                      /* per-tensor, quantized here: its whole target's */
} store_frx_item_t;

struct store_frx {
    uint32_t lo, hi;
    uint8_t *buf;
    size_t cap;
    store_frx_item_t *items;                  /* the batch on its way */
    uint32_t nitems, cap_items;
    uint32_t nsent, nlocal;          /* segments of the last version: packed by senders, here */
    uint64_t v;                      /* the version being read */
    /* per-tensor targets: each one's set (schemes/store_amax.h), by the plan's chunks */
    uint64_t *ckey;                  /* [plan->nchunks] its set's key; 0: not per-tensor */
    uint32_t *cset;                  /* [plan->nchunks] its set */
    uint32_t nsets;
    uint8_t *set_plain;              /* [nsets] this version: some chunk of it not in a table */
    uint32_t *set_off;               /* [nsets + 1] set k's segments: set_seg[set_off[k], [k + 1]) */
    uint32_t *set_seg;               /* our segments of a set, each set's ascending */
};

static inline uint64_t wsync_store_frx_align(uint64_t x)
{
    return (x + STORE_FRX_ALIGN - 1) / STORE_FRX_ALIGN * STORE_FRX_ALIGN;
}

/* store_fp8.c: the batch's items unpacked into their targets (codes and scales as sent, or
 * values quantized here); segment i's chunk's plain values, dense [rows, cols], into `to`; room
 * for `need` bytes in the batch buffer (nothing in flight: it may move). */
wsync_status_t wsync_store_frx_finish_batch(wsync_receiver_t *r, store_frx_t *f,
                                            const wsync_store_io_t *io, void *stream);
wsync_status_t wsync_store_frx_get_plain(wsync_receiver_t *r, const wsync_store_io_t *io,
                                         wsync_store_verified_fn verified, void *varg,
                                         const wsync_dir_entry_t *en, uint64_t v, uint32_t i,
                                         const wsync_chunk_t *c, uint8_t *to);
wsync_status_t wsync_store_frx_batch_room(wsync_receiver_t *r, store_frx_t *f, uint64_t need);

/* store_fp8_tensor.c: our per-tensor targets' sets (f->ckey, cset, set_off, set_seg), told to
 * sender 0 (at creation); per-tensor set k read plain, its amax over every chunk of it, each
 * quantized with it. */
wsync_status_t wsync_store_frx_sets(wsync_receiver_t *r, store_frx_t *f);
wsync_status_t wsync_store_frx_tensor_plain(wsync_receiver_t *r, store_frx_t *f,
                                            const wsync_store_io_t *io,
                                            wsync_store_verified_fn verified, void *varg,
                                            const wsync_dir_entry_t *e, uint64_t v, uint32_t k,
                                            void *stream, uint64_t *bytes);

#endif
