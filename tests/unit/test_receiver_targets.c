/* wsync_receiver_add_target's refusals (core/receiver.c): each names the receiver and the target
 * (or "?" for a target without a name), returns the documented code, and leaves the receiver's
 * targets as they were, so that a corrected target can be added after. A receiver of a group not
 * yet formed (its sender, rank 0, holds the coordinator in this process). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/objects.h"
#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

#define ROWS 4
#define COLS 8

static uint16_t g_data[ROWS * COLS], g_other[ROWS * COLS];
static uint8_t g_codes[ROWS * COLS];
static float g_scales[1];

static wsync_target_t plain_target(const char *name, void *data, const wsync_piece_t *pc)
{
    wsync_target_t t = {name, WSYNC_DTYPE_BF16, 2, {ROWS, COLS}, data, WSYNC_MEM_HOST, 0, pc, 1,
                        {0}};
    return t;
}

/* The call's code, and its message holding every one of the NULL-ended needles. */
static void expect(wsync_status_t st, wsync_status_t want, const char *what, ...)
{
    CHECK_MSG(st == want, "%s: %s, expected %s", what, wsync_status_name(st),
              wsync_status_name(want));
    const char *msg = wsync_last_error();
    va_list ap;
    va_start(ap, what);
    for (const char *n = va_arg(ap, const char *); n != NULL; n = va_arg(ap, const char *))
        CHECK_MSG(strstr(msg, n) != NULL, "%s: '%s' not in \"%s\"", what, n, msg);
    va_end(ap);
}

static void test_refusals_name_the_target(void)
{
    char addr[64];
    wsync_ctx_t *sctx = NULL, *rctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_receiver_t *r = NULL;
    wsync_sender_params_t sp = WSYNC_SENDER_PARAMS_INIT;
    wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
    wsync_piece_t pc = {{"w", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, {0, 0}};
    wsync_piece_t pq = {{"q", WSYNC_DTYPE_BF16, 2, {ROWS, COLS}}, {{0, 0}, {ROWS, COLS}}, {0, 0}};

    snprintf(addr, sizeof(addr), "127.0.0.1:%d", proc_free_port());
    CHECK_OK(wsync_ctx_create(NULL, &sctx));
    CHECK_OK(wsync_ctx_create(NULL, &rctx));
    sp.coordinator = addr;
    sp.nreceivers = 1;
    sp.scheme = "ipc";
    sp.timeout_ms = 10000;
    CHECK_OK(wsync_sender_create(sctx, &sp, &s));
    rp.coordinator = addr;
    rp.nreceivers = 1;
    rp.timeout_ms = 10000;
    CHECK_OK(wsync_receiver_create(rctx, &rp, &r));
    if (s == NULL || r == NULL)
        goto out;

    wsync_target_t t = plain_target("w", g_data, &pc);
    expect(wsync_receiver_add_target(NULL, &t), WSYNC_ERR_INVALID, "NULL receiver",
           "wsync_receiver_add_target: NULL argument", NULL);
    expect(wsync_receiver_add_target(r, NULL), WSYNC_ERR_INVALID, "NULL target",
           "NULL argument", NULL);

    t = plain_target("w", NULL, &pc);
    expect(wsync_receiver_add_target(r, &t), WSYNC_ERR_INVALID, "no buffer", "receiver 0",
           "target 'w' has no buffer (data is NULL)", NULL);

    t = plain_target("w", g_data, &pc);
    t.mem = (wsync_mem_t)7;
    expect(wsync_receiver_add_target(r, &t), WSYNC_ERR_INVALID, "unknown memory",
           "target 'w' has an unknown memory kind 7", NULL);

    /* CUDA memory: without CUDA in the build, or without a device this process can use, or a
     * host pointer passed as CUDA memory: refused either way, naming the target */
    t = plain_target("w", g_data, &pc);
    t.mem = WSYNC_MEM_CUDA;
    wsync_status_t st = wsync_receiver_add_target(r, &t);
    CHECK_MSG(st == WSYNC_ERR_UNSUPPORTED || st == WSYNC_ERR_INVALID, "a host buffer as CUDA "
              "memory: %s", wsync_status_name(st));
    CHECK_MSG(strstr(wsync_last_error(), "'w'") != NULL, "not named: %s", wsync_last_error());

    /* FP8: a scales buffer is needed, and host codes take host scales; a target without a name
     * is named "?" in these messages */
    wsync_target_t q = plain_target("q", g_codes, &pq);
    q.dtype = WSYNC_DTYPE_F8E4M3FN;
    q.quant.scheme = WSYNC_QUANT_TENSOR;
    expect(wsync_receiver_add_target(r, &q), WSYNC_ERR_INVALID, "FP8 without scales",
           "FP8 target 'q' has no scales buffer (quant.scales is NULL)", NULL);
    q.name = NULL;
    expect(wsync_receiver_add_target(r, &q), WSYNC_ERR_INVALID, "FP8 without a name or scales",
           "FP8 target '?' has no scales buffer", NULL);
    q.name = "q";
    q.quant.scales = g_scales;
    q.quant.scales_mem = WSYNC_MEM_CUDA;
    expect(wsync_receiver_add_target(r, &q), WSYNC_ERR_UNSUPPORTED, "host codes, CUDA scales",
           "FP8 target 'q' is in host memory but has its scales in CUDA memory", NULL);
    CHECK(r->ntargets == 0);

    /* what was refused left nothing behind: the corrected targets go in, a name only once */
    t = plain_target("w", g_data, &pc);
    CHECK_OK(wsync_receiver_add_target(r, &t));
    q.quant.scales_mem = WSYNC_MEM_HOST;
    CHECK_OK(wsync_receiver_add_target(r, &q));
    CHECK(r->ntargets == 2);
    t = plain_target("w", g_other, &pc);
    expect(wsync_receiver_add_target(r, &t), WSYNC_ERR_INVALID, "added twice",
           "receiver 0: target 'w' added twice", NULL);
    CHECK(r->ntargets == 2);
    CHECK(r->target_data[0] == g_data && r->land[0] == g_data);
    /* an FP8 host target lands in f32 staging, quantized at commit */
    CHECK(r->target_data[1] == g_codes && r->land[1] != g_codes &&
          r->land_dtype[1] == WSYNC_DTYPE_F32);
out:
    wsync_receiver_free(r);
    wsync_sender_free(s);
    wsync_ctx_free(rctx);
    wsync_ctx_free(sctx);
}

int main(void)
{
    RUN(test_refusals_name_the_target);
    return check_summary();
}
