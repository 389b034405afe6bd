/* fp8_wire_fixtures: see fp8_wire_fixtures.h. */
#include "tests/support/fp8_wire_fixtures.h"

#include <string.h>

wsync_pdesc_t fw_pdesc(const char *name, wsync_dtype_t dt, int64_t rows, int64_t cols)
{
    wsync_pdesc_t p;
    memset(&p, 0, sizeof(p));
    p.name = (char *)name;
    p.dtype = dt;
    p.ndim = 2;
    p.shape[0] = rows;
    p.shape[1] = cols;
    return p;
}

wsync_shard_desc_t *fw_add_shard(fw_group_t *d, uint32_t sender, const char *name,
                                 wsync_dtype_t dt, int64_t rows, int64_t cols, int64_t r0,
                                 int64_t nr)
{
    wsync_shard_desc_t *s = &d->s[d->ns];
    uint32_t index = 0;

    for (size_t i = 0; i < d->ns; i++)
        index += d->s[i].sender == sender;
    memset(s, 0, sizeof(*s));
    s->sender = sender;
    s->index = index;
    s->param = fw_pdesc(name, dt, rows, cols);
    s->box.start[0] = r0;
    s->box.len[0] = nr;
    s->box.len[1] = cols;
    s->mem = WSYNC_MEM_HOST;
    d->ns++;
    return s;
}

wsync_target_desc_t *fw_add_target(fw_group_t *d, uint32_t receiver, const char *name,
                                   wsync_dtype_t dt, int64_t rows, int64_t cols,
                                   wsync_quant_scheme_t quant, int br, int bc, int ue8m0,
                                   int no_saturate)
{
    wsync_target_desc_t *t = &d->t[d->nt];
    uint32_t index = 0;

    for (size_t i = 0; i < d->nt; i++)
        index += d->t[i].receiver == receiver;
    memset(t, 0, sizeof(*t));
    t->receiver = receiver;
    t->index = index;
    t->name = (char *)name;
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->mem = WSYNC_MEM_HOST;
    t->quant = quant;
    if (quant == WSYNC_QUANT_BLOCK) {
        t->block_rows = br;
        t->block_cols = bc;
        t->eps = 1e-4f;
        t->ue8m0 = (uint8_t)ue8m0;
    }
    t->no_saturate = (uint8_t)no_saturate;
    t->pieces = &d->p[d->np];
    d->nt++;
    return t;
}

void fw_add_piece(fw_group_t *d, const char *param, wsync_dtype_t dt, int64_t prows,
                  int64_t pcols, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t dr,
                  int64_t dc)
{
    wsync_target_desc_t *t = &d->t[d->nt - 1];
    wsync_piece_desc_t *p = &d->p[d->np++];

    memset(p, 0, sizeof(*p));
    p->param = fw_pdesc(param, dt, prows, pcols);
    p->src.start[0] = r0;
    p->src.start[1] = c0;
    p->src.len[0] = nr;
    p->src.len[1] = nc;
    p->dst_start[0] = dr;
    p->dst_start[1] = dc;
    t->npieces++;
}
