/* fp8_wire_fixtures: see fp8_wire_fixtures.h. */
#include "tests/support/fp8_wire_fixtures.h"

#include "core/status.h"
#include "kernels/kernels.h"
#include "tests/support/check.h"

#include <inttypes.h>
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

void fw_check_codes(const char *name, const uint8_t *have, const uint8_t *want, uint64_t rows,
                    uint64_t cols, const float *have_s, const float *want_s, uint64_t nscales)
{
    uint64_t n = rows * cols, i = 0;

    while (i < n && have[i] == want[i])
        i++;
    CHECK_MSG(i == n, "%s: target code %" PRIu64 " (row %" PRIu64 ", column %" PRIu64 ") is "
              "0x%02x, wsync_quantize_f32 of the whole target gives 0x%02x", name, i, i / cols,
              i % cols, i < n ? have[i] : 0, i < n ? want[i] : 0);
    CHECK_MSG(memcmp(have_s, want_s, nscales * sizeof(float)) == 0,
              "%s: target scales differ from wsync_quantize_f32's", name);
}

void fw_check_wire_desc_refusals(const wsync_plan_t *plan, const wsync_target_desc_t *td,
                                 const void *shard, uint8_t *bucket, uint8_t *target,
                                 float *scales)
{
    const wsync_segment_t *sg = NULL;   /* the plan's first segment */
    uint32_t nsg = 0;
    wsync_kquant_t a;
    wsync_kcopy_t two[2];
    wsync_chunk_t c = plan->chunks[0];
    wsync_target_desc_t other = *td;

    for (uint32_t r = 0; r < plan->nreceivers && nsg == 0; r++)
        CHECK_OK(wsync_plan_segments(plan, r, &sg, &nsg));
    if (nsg == 0)
        return;
    c.rule = 0;
    CHECK_ST(wsync_kernels_pack_wire_desc(plan, &c, shard, bucket, &a), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("travels plain");
    c.rule = plan->nrules + 1;
    CHECK_ST(wsync_kernels_pack_wire_desc(plan, &c, shard, bucket, &a), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("no such rule");
    c = plan->chunks[0];
    c.ncells += 1;
    CHECK_ST(wsync_kernels_pack_wire_desc(plan, &c, shard, bucket, &a), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("cells");
    c = plan->chunks[0];
    c.bucket_off += 2;
    CHECK_ST(wsync_kernels_pack_wire_desc(plan, &c, shard, bucket, &a), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("4-byte aligned");
    CHECK_ST(wsync_kernels_pack_wire_desc(plan, &plan->chunks[0], NULL, bucket, &a),
             WSYNC_ERR_INVALID);
    /* a target whose rule is not the chunk's */
    other.dtype = td->dtype == WSYNC_DTYPE_F8E4M3FN ? WSYNC_DTYPE_F8E5M2 : WSYNC_DTYPE_F8E4M3FN;
    CHECK_ST(wsync_kernels_unpack_wire_desc(plan, sg, &plan->chunks[sg->chunk], bucket, &other,
                                            target, scales, two),
             WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS(td->name);
    CHECK_ST(wsync_kernels_unpack_wire_desc(plan, sg, &plan->chunks[sg->chunk], bucket, td,
                                            target, NULL, two),
             WSYNC_ERR_INVALID);
}
