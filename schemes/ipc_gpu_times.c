/* WSYNC_IPC_GPU_TIMES=1: the ipc receiver times each bucket's GPU work with events and logs,
 * after every version, the span from the first start to the last end and the buckets' median,
 * least and most times (slow kernels and gaps between them told apart; docs/benchmarks.md, "One
 * GPU: where the time goes"). A diagnostic: nothing here runs unless the variable is set. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/objects.h"
#include "kernels/device.h"
#include "schemes/ipc_internal.h"

int wsync_ipc_gpu_times_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("WSYNC_IPC_GPU_TIMES");
        on = v != NULL && strcmp(v, "1") == 0;
    }
    return on;
}

wsync_status_t wsync_ipc_gpu_times_mark(ipc_from_t *f, uint32_t k, int end, void *strm)
{
    wsync_status_t rc = WSYNC_OK;

    if (f->tev == NULL && (f->tev = calloc(2 * (size_t)f->nbuckets, sizeof(void *))) == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "ipc: no memory for the GPU times' events");
    void **ev = &f->tev[2 * (size_t)k + (end != 0)];
    if (*ev == NULL)
        rc = wsync_dev_event_create(1, ev);
    return rc == WSYNC_OK ? wsync_dev_event_record(*ev, strm) : rc;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void wsync_ipc_gpu_times_report(const wsync_receiver_t *r, const ipc_receiver_t *st,
                                uint64_t version)
{
    void *first = NULL;
    uint32_t n = 0, cap = 0;
    float *dur = NULL, span = 0, sum = 0;

    for (uint32_t s = 0; s < st->nsenders; s++) {
        const ipc_from_t *f = &st->from[s];
        cap += f->tev != NULL && f->gpu != NULL ? f->nbuckets : 0;
    }
    if (cap == 0 || (dur = malloc(cap * sizeof(*dur))) == NULL)
        return;
    /* times from the first bucket's start: the earliest start of all */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t s = 0; s < st->nsenders; s++) {
            const ipc_from_t *f = &st->from[s];
            for (uint32_t k = 0; f->tev != NULL && f->gpu != NULL && k < f->nbuckets; k++) {
                float a = 0, b = 0;
                if (!f->gpu[k] || f->tev[2 * k] == NULL || f->tev[2 * k + 1] == NULL)
                    continue;
                if (first == NULL)
                    first = f->tev[2 * k];
                if (wsync_dev_event_elapsed(first, f->tev[2 * k], &a) != WSYNC_OK ||
                    wsync_dev_event_elapsed(first, f->tev[2 * k + 1], &b) != WSYNC_OK)
                    continue;
                if (pass == 0 && a < 0)
                    first = f->tev[2 * k];
                if (pass == 1) {
                    dur[n++] = b - a;
                    sum += b - a;
                    span = b > span ? b : span;
                }
            }
        }
    if (n > 0) {
        qsort(dur, n, sizeof(*dur), cmp_float);
        WSYNC_LOG_I("ipc: receiver %d: version %llu: GPU work of %u buckets: %.3f ms from the "
                    "first start to the last end, each %.1f us median (%.1f-%.1f), %.3f ms "
                    "summed (WSYNC_IPC_GPU_TIMES)", r->m.rank, (unsigned long long)version, n,
                    span, 1e3 * dur[n / 2], 1e3 * dur[0], 1e3 * dur[n - 1], sum);
    }
    free(dur);
}
