/* The receiver: an inference rank's view. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/delta_state.h"
#include "core/doorbell.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/objects.h"
#include "core/util.h"
#include "kernels/device.h"
#include "reshard/exec.h"
#include "reshard/fp8.h"

/* ---- CUDA targets ------------------------------------------------------------------------------ */

/* Elements of a target (product of its shape). */
static uint64_t target_elems(const wsync_target_t *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* The dtype a quantized CUDA target lands in (Contract 2): its pieces' param dtype when they all
 * share one of bf16/f16/f32 (the copy kernels cast nothing then, and the staging is smallest),
 * else f32. */
static wsync_dtype_t cuda_land_dtype(const wsync_target_t *t)
{
    wsync_dtype_t d = t->npieces > 0 ? t->pieces[0].param.dtype : WSYNC_DTYPE_F32;
    for (int i = 1; i < t->npieces; i++)
        if (t->pieces[i].param.dtype != d)
            return WSYNC_DTYPE_F32;
    return d == WSYNC_DTYPE_BF16 || d == WSYNC_DTYPE_F16 || d == WSYNC_DTYPE_F32 ? d : WSYNC_DTYPE_F32;
}

/* The CUDA device a pointer given as `mem = WSYNC_MEM_CUDA` must be on. */
static wsync_status_t check_cuda_ptr(const wsync_receiver_t *r, const char *name, const char *field,
                                     const void *p, int device)
{
    wsync_dev_ptr_t info;
    wsync_status_t st = wsync_dev_ptr_info(p, &info);

    if (st != WSYNC_OK)
        return st;
    if (info.kind == WSYNC_DEV_PTR_MANAGED)
        return WSYNC_OK;
    if (info.kind != WSYNC_DEV_PTR_DEVICE)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s': %s %p is host memory, but "
                         "the target says CUDA memory of device %d", r->m.rank, name, field, p,
                         device);
    if (info.device != device)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s': %s %p is memory of CUDA "
                         "device %d, but the target says device %d", r->m.rank, name, field, p,
                         info.device, device);
    return WSYNC_OK;
}

/* Among the pieces whose destination holds the leading index `idx` (all dims but the last), the
 * column span [*lo, *hi) with the smallest start that ends after `from`; 0 when none (as the CPU
 * executor finds it). */
static int next_span(const wsync_target_desc_t *t, const int64_t *idx, int64_t from, int64_t *lo,
                     int64_t *hi)
{
    int nd = t->ndim, found = 0;

    for (uint32_t i = 0; i < t->npieces; i++) {
        const wsync_piece_desc_t *p = &t->pieces[i];
        int in = 1;
        int64_t s = 0, e = 0;
        for (int d = 0; d < nd && in; d++) {
            s = p->dst_start[d];
            in = p->src.len[d] > 0 && !__builtin_add_overflow(s, p->src.len[d], &e) &&
                 (d == nd - 1 || (idx[d] >= s && idx[d] < e));
        }
        if (!in)
            continue;
        if (e > from && (!found || s < *lo)) {
            *lo = s;
            *hi = e;
            found = 1;
        }
    }
    return found;
}

/* wsync_exec_zero_uncovered on device memory: the gaps, merged into as few runs as they allow
 * (vocab padding rows are one run), each zeroed with a memset on the receiver's stream. */
static wsync_status_t zero_uncovered_dev(wsync_receiver_t *r, const wsync_target_desc_t *t,
                                         wsync_dtype_t dtype, void *data)
{
    size_t esz = wsync_dtype_size(dtype);
    int64_t idx[WSYNC_MAX_DIMS] = {0}, width;
    uint64_t row = 0, run_lo = 0, run_hi = 0, runs = 0;
    wsync_status_t st = WSYNC_OK;

    if (t->ndim < 1 || esz == 0)
        return WSYNC_OK;
    width = t->shape[t->ndim - 1];
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] <= 0)
            return WSYNC_OK;
#define ZERO_GAP(a, b)                                                                            \
    do {                                                                                          \
        uint64_t a_ = (a), b_ = (b);                                                              \
        if (a_ == run_hi && run_hi > run_lo) {                                                    \
            run_hi = b_;                                                                          \
        } else {                                                                                  \
            if (run_hi > run_lo && st == WSYNC_OK) {                                              \
                st = wsync_dev_memset_async((uint8_t *)data + run_lo, 0, run_hi - run_lo,         \
                                            r->dev_stream);                                       \
                runs++;                                                                           \
            }                                                                                     \
            run_lo = a_;                                                                          \
            run_hi = b_;                                                                          \
        }                                                                                         \
    } while (0)
    for (;;) {
        int64_t c = 0, lo = 0, hi = 0;
        uint64_t base = row * (uint64_t)width * esz;
        while (c < width) {
            if (!next_span(t, idx, c, &lo, &hi)) {
                ZERO_GAP(base + (uint64_t)c * esz, base + (uint64_t)width * esz);
                break;
            }
            if (lo > c)
                ZERO_GAP(base + (uint64_t)c * esz, base + (uint64_t)WSYNC_MIN(lo, width) * esz);
            c = WSYNC_MAX(c, hi);
        }
        row++;
        int d = t->ndim - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
        if (d < 0)
            break;
    }
    ZERO_GAP(0, 0);   /* flush the last run */
#undef ZERO_GAP
    if (st == WSYNC_OK && runs > 0)
        st = wsync_dev_stream_sync(r->dev_stream, wsync_deadline_in(r->m.timeout_ms),
                                   "zeroing a target's uncovered elements");
    return st;
}

/* The quantization of staged CUDA target i, as the kernels take it. */
static wsync_kquant_t quant_args(const wsync_receiver_t *r, size_t i)
{
    const wsync_target_desc_t *t = &r->targets[i];
    uint64_t rows, cols;
    wsync_shape_matrix(t->ndim, t->shape, &rows, &cols);
    wsync_kquant_t a = {t->name, r->land[i], r->land_dtype[i], rows, cols, cols, r->quant[i],
                        t->dtype, r->target_data[i], cols,
                        r->dev_scales[i] != NULL ? r->dev_scales[i] : r->quant[i].scales, 0, NULL};
    return a;
}

static wsync_status_t quant_launch(wsync_receiver_t *r, size_t i)
{
    wsync_kquant_t a = quant_args(r, i);
    r->q_started[i] = 1;
    return wsync_dev_quantize_launch(&a, (uint8_t *)r->dev_ws + i * WSYNC_KQUANT_WS_BYTES,
                                     r->dev_stream);
}

/* Early quantization's bookkeeping, from the plan (once) and for a new version. */
static wsync_status_t quant_early_reset(wsync_receiver_t *r)
{
    if (r->device < 0 || r->m.plan == NULL)
        return WSYNC_OK;
    if (r->q_need == NULL) {
        r->q_need = calloc(r->ntargets + 1, sizeof(*r->q_need));
        r->q_got = calloc(r->ntargets + 1, sizeof(*r->q_got));
        r->q_started = calloc(r->ntargets + 1, 1);
        if (r->q_need == NULL || r->q_got == NULL || r->q_started == NULL) {
            free(r->q_need);
            free(r->q_got);
            free(r->q_started);
            r->q_need = r->q_got = NULL;
            r->q_started = NULL;
            return wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory", r->m.rank);
        }
        for (uint32_t i = 0; i < r->m.nsegs; i++) {
            const wsync_segment_t *sg = &r->m.segs[i];
            if (sg->target < r->ntargets)
                r->q_need[sg->target] += sg->dst.rows * sg->dst.cols;
        }
        for (size_t i = 0; i < r->ntargets; i++)
            if (r->targets[i].mem != WSYNC_MEM_CUDA ||
                !wsync_target_quantized(r->targets[i].dtype, r->quant[i].scheme) ||
                (r->wire != NULL && r->wire[i]))   /* its codes and scales come made */
                r->q_need[i] = 0;
    }
    memset(r->q_got, 0, r->ntargets * sizeof(*r->q_got));
    memset(r->q_started, 0, r->ntargets);
    return wsync_qdirect_clear(r);
}

wsync_status_t wsync_receiver_landed(wsync_receiver_t *r, uint32_t first, uint32_t end)
{
    wsync_status_t st = WSYNC_OK;

    if (r->q_need == NULL)
        return WSYNC_OK;
    for (uint32_t i = first; i < end && i < r->m.nsegs && st == WSYNC_OK; i++) {
        const wsync_segment_t *sg = &r->m.segs[i];
        uint32_t t = sg->target;
        if (t >= r->ntargets || r->q_need[t] == 0 || r->land[t] == r->target_data[t] ||
            (r->q_direct != NULL && r->q_direct[t]))
            continue;
        r->q_got[t] += sg->dst.rows * sg->dst.cols;
        if (r->q_got[t] == r->q_need[t] && !r->q_started[t])
            st = quant_launch(r, t);
    }
    return st;
}

/* A version failed: quantizations started as targets landed may still run on dev_stream, writing
 * into the caller's FP8 buffers; wait for them (bounded) before the error returns, keeping its
 * text. */
static wsync_status_t quant_drain(wsync_receiver_t *r, wsync_status_t st)
{
    char text[1024];
    int saved = -1;

    if (r->device < 0 || r->dev_stream == NULL || r->q_started == NULL)
        return st;
    snprintf(text, sizeof(text), "%s", wsync_last_error());
    if (wsync_dev_enter(r->device, &saved) == WSYNC_OK) {
        if (wsync_dev_stream_sync(r->dev_stream, wsync_deadline_in(r->m.timeout_ms),
                                  "quantizations started before the failure") != WSYNC_OK)
            WSYNC_LOG_W("receiver %d: %s", r->m.rank, wsync_last_error());
        wsync_dev_leave(r->device, saved);
    }
    return wsync_err_set_text(st, text);
}

/* Scales that live in host memory, of the CUDA FP8 targets quantized here and of those whose
 * scales came made (FP8 on the wire): copies queued on dev_stream behind the kernels, waited
 * for with the non-finite flags. *count: the copies queued. */
static wsync_status_t scales_out_dev(wsync_receiver_t *r, size_t *count)
{
    wsync_status_t st = WSYNC_OK;

    for (size_t i = 0; i < r->ntargets && st == WSYNC_OK; i++) {
        const wsync_target_desc_t *t = &r->targets[i];
        uint64_t rows, cols;
        int64_t sr = 0, sc = 0;
        if (t->mem != WSYNC_MEM_CUDA || r->dev_scales[i] == NULL ||
            (r->land[i] == r->target_data[i] && (r->wire == NULL || !r->wire[i])))
            continue;
        wsync_shape_matrix(t->ndim, t->shape, &rows, &cols);
        st = wsync_quant_scales_shape(&r->quant[i], (int64_t)rows, (int64_t)cols, &sr, &sc);
        if (st == WSYNC_OK)
            st = wsync_dev_memcpy_async(r->quant[i].scales, r->dev_scales[i],
                                        (size_t)sr * (size_t)sc * sizeof(float), r->dev_stream);
        (*count)++;
    }
    return st;
}

/* Quantize the staged CUDA FP8 targets on the device that have not started yet: every launch
 * first, then the copies of the scales that live in host memory, then one copy of all
 * non-finite flags with one wait (with the deadline); a flagged target is looked at again
 * (NONFINITE names the target and element, as on the CPU). No synchronization per target. */
static wsync_status_t quantize_staged_dev(wsync_receiver_t *r)
{
    wsync_status_t st = WSYNC_OK;
    size_t n = 0, early = 0, bad = 0, ncopies = 0;
    uint64_t t0 = wsync_now_ns(), t1, t2;

    if (r->q_started == NULL)
        st = quant_early_reset(r);
    for (size_t i = 0; i < r->ntargets && st == WSYNC_OK; i++) {
        const wsync_target_desc_t *t = &r->targets[i];
        if (t->mem != WSYNC_MEM_CUDA || r->land[i] == r->target_data[i])
            continue;
        n++;
        if (r->q_started[i] || (r->q_direct != NULL && r->q_direct[i]))
            early++;   /* started as it landed, or by the scheme's runs */
        else
            st = quant_launch(r, i);
    }
    if (st == WSYNC_OK)
        st = scales_out_dev(r, &ncopies);
    if ((n == 0 && ncopies == 0) || st != WSYNC_OK)
        return st;
    t1 = wsync_now_ns();
    /* one copy of every workspace's non-finite flag (untouched ones stay zero from setup),
     * waiting for the stream once; only a target that saw a non-finite value is looked at
     * again, by _finish, which names the element */
    if (st == WSYNC_OK)
        st = wsync_dev_quantize_check(r->dev_ws, r->ntargets, r->dev_stream,
                                      wsync_deadline_in(r->m.timeout_ms), &bad);
    if (st != WSYNC_OK) {
        char text[1024];
        snprintf(text, sizeof(text), "quantizing the FP8 targets: %s", wsync_last_error());
        return wsync_err_set_text(st, text);
    }
    if (st == WSYNC_OK && bad == r->ntargets)
        st = wsync_qdirect_check(r);
    if (st != WSYNC_OK)
        return st;
    t2 = wsync_now_ns();
    if (bad < r->ntargets) {
        const wsync_target_desc_t *t = &r->targets[bad];
        wsync_kquant_t a = quant_args(r, bad);
        st = wsync_dev_quantize_finish(&a, (uint8_t *)r->dev_ws + bad * WSYNC_KQUANT_WS_BYTES,
                                       r->dev_stream);
        if (st == WSYNC_OK)
            st = wsync_err(WSYNC_ERR_NONFINITE, "receiver %d: target '%s': non-finite value "
                           "while quantizing", r->m.rank, t->name);
        return st;
    }
    WSYNC_LOG_D("receiver %d: quantized %zu FP8 targets on the GPU (%zu started as they "
                "landed): %.3f ms to queue the rest, %.3f ms waiting for the kernels", r->m.rank,
                n, early, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6);
    return WSYNC_OK;
}

wsync_status_t wsync_receiver_create(wsync_ctx_t *ctx, const wsync_receiver_params_t *params,
                                     wsync_receiver_t **out)
{
    wsync_receiver_params_t p;
    wsync_receiver_t *r;
    wsync_status_t st;
    wsync_hello_t hello;
    char hostname[256] = "";

    if (ctx == NULL || out == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_create: ctx and receiver must not be NULL");
    st = wsync_config_receiver(params, &p);
    if (st != WSYNC_OK)
        return st;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for a receiver");
    r->m.ctx = ctx;
    r->m.role = WSYNC_ROLE_RECEIVER;
    r->m.rank = p.rank;
    r->m.nreceivers = p.nreceivers;
    r->m.timeout_ms = p.timeout_ms;
    r->m.heartbeat_ms = p.heartbeat_ms;
    r->m.coordinator = wsync_strdup(p.coordinator);
    r->progress = p.progress;
    r->progress_arg = p.progress_arg;
    r->on_version = p.on_version;
    r->on_version_arg = p.on_version_arg;
    r->delta_choice = (uint32_t)wsync_delta_mode_parse(p.delta);   /* config checked it */
    r->device = -1;
    /* the number of senders is learnt from the plan; HELLO says -1 for "as the coordinator says" */
    gethostname(hostname, sizeof(hostname) - 1);
    memset(&hello, 0, sizeof(hello));
    hello.role = WSYNC_ROLE_RECEIVER;
    hello.rank = p.rank;
    hello.nsenders = -1;
    hello.nreceivers = p.nreceivers;
    hello.pid = (uint32_t)getpid();
    /* likewise a receiver given WSYNC_SCHEME; its HELLO names the scheme, so that the coordinator
     * tells a transport it did not probe from one it lacks */
    hello.scheme = (char *)wsync_ctx_env_scheme();
    hello.transports = wsync_ctx_probe(ctx, wsync_scheme_transports(hello.scheme));
    hello.hostname = hostname;
    hello.host_id = (char *)wsync_host_id();
    hello.delta = r->delta_choice;
    st = r->m.coordinator == NULL ? wsync_err(WSYNC_ERR_NOMEM, "no memory for a receiver")
                                  : wsync_member_connect(&r->m, &hello);
    if (st != WSYNC_OK) {
        char text[1024];
        snprintf(text, sizeof(text), "%s", wsync_last_error());
        wsync_receiver_free(r);
        return wsync_err_set_text(st, text);
    }
    *out = r;
    return WSYNC_OK;
}

void wsync_receiver_free(wsync_receiver_t *r)
{
    if (r == NULL)
        return;
    if (r->m.scheme != NULL && r->m.scheme_state != NULL)
        r->m.scheme->receiver_teardown(r);
    wsync_delta_rx_free(r->delta_rx);   /* a scheme made it; the receiver owns it */
    r->delta_rx = NULL;
    wsync_member_close(&r->m);
    int saved = -1, dev = r->device >= 0 && wsync_dev_enter(r->device, &saved) == WSYNC_OK;
    if (dev && r->dev_stream != NULL &&
        wsync_dev_stream_sync(r->dev_stream, wsync_deadline_in(r->m.timeout_ms),
                              "receiver teardown") != WSYNC_OK)
        WSYNC_LOG_W("receiver %d: %s", r->m.rank, wsync_last_error());
    for (size_t i = 0; i < r->ntargets; i++) {
        if (r->land != NULL && r->land[i] != r->target_data[i]) {
            if (r->targets[i].mem == WSYNC_MEM_CUDA) {
                if (dev)
                    wsync_dev_free(r->land[i]);
            } else {
                free(r->land[i]);
            }
        }
        if (dev && r->dev_scales != NULL)
            wsync_dev_free(r->dev_scales[i]);
    }
    if (dev) {
        wsync_qdirect_free(r);
        wsync_dev_free(r->dev_ws);
        wsync_dev_stream_destroy(r->dev_stream);
        wsync_dev_leave(r->device, saved);
    }
    free(r->dev_scales);
    free(r->q_need);
    free(r->q_got);
    free(r->q_started);
    free(r->qruns);   /* wsync_qdirect_free's host half, when the device could not be entered */
    free(r->q_direct);
    free(r->wire);
    wsync_target_descs_free(r->targets, r->ntargets);
    free(r->target_data);
    free(r->land);
    free(r->land_dtype);
    free(r->quant);
    free(r);
}

/* A target's memory: a known kind, and for CUDA memory a device this process sees, the one of
 * the receiver's earlier targets, holding the buffer (and a CUDA scales buffer likewise). */
static wsync_status_t check_target_memory(wsync_receiver_t *r, const wsync_target_t *t,
                                          const char *nm)
{
    wsync_status_t st;

    if (t->mem == WSYNC_MEM_CUDA) {
        if (!wsync_dev_compiled())
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: target '%s' is in CUDA memory, but "
                             "this libwsync was built without CUDA", r->m.rank, nm);
        int ndev = 0;
        if (wsync_dev_count(&ndev) != WSYNC_OK)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: target '%s' is in CUDA memory, "
                             "but this process can use no CUDA device (%s)", r->m.rank, nm,
                             wsync_last_error());
        if (t->device < 0 || t->device >= ndev)
            return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s' is on CUDA device %d, but "
                             "this process sees devices 0 to %d", r->m.rank, nm, t->device,
                             ndev - 1);
        if (r->device >= 0 && t->device != r->device)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: target '%s' is on CUDA device %d, "
                             "but its earlier targets are on device %d: a receiver uses one CUDA "
                             "device (make one receiver per GPU)", r->m.rank, nm, t->device,
                             r->device);
        if ((st = check_cuda_ptr(r, nm, "data", t->data, t->device)) != WSYNC_OK)
            return st;
    } else if (t->mem != WSYNC_MEM_HOST) {
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s' has an unknown memory kind %d",
                         r->m.rank, nm, (int)t->mem);
    }
    if (wsync_target_quantized(t->dtype, t->quant.scheme) && t->quant.scales == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: FP8 target '%s' has no scales buffer "
                         "(quant.scales is NULL)", r->m.rank, nm);
    if (wsync_target_quantized(t->dtype, t->quant.scheme) && t->quant.scales_mem != WSYNC_MEM_HOST) {
        if (t->mem != WSYNC_MEM_CUDA)
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: FP8 target '%s' is in host memory "
                             "but has its scales in CUDA memory: put both on the GPU, or both on "
                             "the host", r->m.rank, nm);
        if ((st = check_cuda_ptr(r, nm, "quant.scales", t->quant.scales, t->device)) != WSYNC_OK)
            return st;
    }
    return WSYNC_OK;
}

/* p grown to cap elements of elem bytes, or p itself (and *bad set) when that fails or an earlier
 * array failed: the caller checks once. */
static void *grow_array(void *p, size_t cap, size_t elem, int *bad)
{
    void *q = *bad ? NULL : realloc(p, cap * elem);
    if (q == NULL) {
        *bad = 1;
        return p;
    }
    return q;
}

/* Room for one more target in every per-target array. */
static wsync_status_t grow_targets(wsync_receiver_t *r)
{
    if (r->ntargets < r->cap)
        return WSYNC_OK;
    size_t cap = r->cap ? r->cap * 2 : 64;
    int bad = 0;
    r->targets = grow_array(r->targets, cap, sizeof(*r->targets), &bad);
    r->target_data = grow_array(r->target_data, cap, sizeof(*r->target_data), &bad);
    r->land = grow_array(r->land, cap, sizeof(*r->land), &bad);
    r->land_dtype = grow_array(r->land_dtype, cap, sizeof(*r->land_dtype), &bad);
    r->quant = grow_array(r->quant, cap, sizeof(*r->quant), &bad);
    r->dev_scales = grow_array(r->dev_scales, cap, sizeof(*r->dev_scales), &bad);
    if (bad)   /* the arrays grown so far keep their room; r->cap stays */
        return wsync_err(WSYNC_ERR_NOMEM, "no memory for target descriptions");
    r->cap = cap;
    return WSYNC_OK;
}

/* Where CUDA target i lands: in place, or (FP8) in a zeroed staging buffer on its device, and
 * its scales on the device when the user's are in host memory; the receiver's stream. */
static wsync_status_t cuda_landing(wsync_receiver_t *r, const wsync_target_t *t, size_t i)
{
    int saved = -1;
    wsync_status_t st;

    if ((st = wsync_dev_enter(t->device, &saved)) != WSYNC_OK)
        return st;
    /* above the ipc scheme's peer reads (boost 1): quantizations started while buckets
     * still land get SMs at once, instead of waiting for the copy kernels to drain */
    if (r->dev_stream == NULL)
        st = wsync_dev_stream_create_prio(&r->dev_stream, 2);
    if (st == WSYNC_OK && wsync_target_quantized(t->dtype, t->quant.scheme)) {
        /* whole-group scales need every value first: land here, quantize at commit */
        uint64_t n = target_elems(t);
        wsync_dtype_t ld = cuda_land_dtype(t);
        void *land = NULL;
        st = wsync_dev_malloc((size_t)(n ? n : 1) * wsync_dtype_size(ld), &land);
        /* zeroed whole: what no piece covers stays 0, the rest is written every version */
        if (st == WSYNC_OK &&
            (st = wsync_dev_memset_async(land, 0, (size_t)(n ? n : 1) * wsync_dtype_size(ld),
                                         r->dev_stream)) == WSYNC_OK)
            st = wsync_dev_stream_sync(r->dev_stream, wsync_deadline_in(r->m.timeout_ms),
                                       "zeroing an FP8 target's staging buffer");
        if (st == WSYNC_OK && t->quant.scales_mem == WSYNC_MEM_HOST) {
            uint64_t rows, cols;
            int64_t sr = 0, sc = 0;
            wsync_shape_matrix(t->ndim, t->shape, &rows, &cols);
            st = wsync_quant_scales_shape(&t->quant, (int64_t)rows, (int64_t)cols, &sr, &sc);
            if (st == WSYNC_OK)
                st = wsync_dev_malloc((size_t)(sr * sc) * sizeof(float),
                                      (void **)&r->dev_scales[i]);
        }
        if (st == WSYNC_OK) {
            r->land[i] = land;
            r->land_dtype[i] = ld;
        } else {
            wsync_dev_free(land);
        }
    }
    wsync_dev_leave(t->device, saved);
    if (st != WSYNC_OK) {
        char text[1024];
        snprintf(text, sizeof(text), "receiver %d: target '%s': %s", r->m.rank, t->name,
                 wsync_last_error());
        return wsync_err_set_text(st, text);
    }
    return WSYNC_OK;
}

/* Where host target i lands: in place, or (FP8) in an f32 staging buffer. */
static wsync_status_t host_landing(wsync_receiver_t *r, const wsync_target_t *t, size_t i)
{
    if (!wsync_target_quantized(t->dtype, t->quant.scheme))
        return WSYNC_OK;
    /* whole-group scales need every value first: land f32 here, quantize at commit */
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    r->land[i] = calloc(n ? n : 1, sizeof(float));
    r->land_dtype[i] = WSYNC_DTYPE_F32;
    if (r->land[i] == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory to stage FP8 target '%s' (%llu "
                         "values)", r->m.rank, t->name, (unsigned long long)n);
    return WSYNC_OK;
}

wsync_status_t wsync_receiver_add_target(wsync_receiver_t *r, const wsync_target_t *t)
{
    wsync_status_t st;

    if (r == NULL || t == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_add_target: NULL argument");
    const char *nm = t->name ? t->name : "?";
    if (r->m.state != WSYNC_STATE_CONNECTED)
        return wsync_err(WSYNC_ERR_STATE, "receiver %d: targets must be added before the first "
                         "wait (target '%s')", r->m.rank, nm);
    if (t->data == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s' has no buffer (data is NULL)",
                         r->m.rank, nm);
    if ((st = check_target_memory(r, t, nm)) != WSYNC_OK || (st = grow_targets(r)) != WSYNC_OK)
        return st;
    size_t i = r->ntargets;
    st = wsync_target_desc_from(t, (uint32_t)r->m.rank, (uint32_t)i, &r->targets[i]);
    if (st != WSYNC_OK)
        return st;
    for (size_t k = 0; k < i; k++) {
        if (strcmp(r->targets[k].name, t->name) == 0) {
            wsync_target_desc_clear(&r->targets[i]);
            return wsync_err(WSYNC_ERR_INVALID, "receiver %d: target '%s' added twice", r->m.rank,
                             t->name);
        }
    }
    r->target_data[i] = t->data;
    r->land[i] = t->data;
    r->land_dtype[i] = t->dtype;
    r->quant[i] = t->quant;
    r->dev_scales[i] = NULL;
    st = t->mem == WSYNC_MEM_CUDA ? cuda_landing(r, t, i) : host_landing(r, t, i);
    if (st != WSYNC_OK) {
        wsync_target_desc_clear(&r->targets[i]);
        return st;
    }
    if (t->mem == WSYNC_MEM_CUDA)
        r->device = t->device;
    r->ntargets++;
    return WSYNC_OK;
}

/* FP8 on the wire, once the plan is accepted: a target whose every segment comes as codes and
 * scales its senders made lands in its own buffer, so the "land[i] == target_data[i]" checks
 * skip its quantization; its staging buffer is freed. */
static wsync_status_t wire_setup(wsync_receiver_t *r)
{
    int saved = -1, dev = 0;
    wsync_status_t st;

    if (r->wire != NULL)
        return WSYNC_OK;
    r->wire = calloc(r->ntargets + 1, 1);
    if (r->wire == NULL)
        return wsync_err(WSYNC_ERR_NOMEM, "receiver %d: no memory", r->m.rank);
    st = wsync_plan_wire_targets(r->m.plan, (uint32_t)r->m.rank, r->ntargets, r->wire);
    for (size_t i = 0; i < r->ntargets && st == WSYNC_OK; i++) {
        if (!r->wire[i] || r->land[i] == r->target_data[i])
            continue;
        if (r->targets[i].mem == WSYNC_MEM_CUDA) {
            if (!dev && (st = wsync_dev_enter(r->device, &saved)) != WSYNC_OK)
                break;
            dev = 1;
            wsync_dev_free(r->land[i]);
        } else {
            free(r->land[i]);
        }
        r->land[i] = r->target_data[i];
        r->land_dtype[i] = r->targets[i].dtype;
        r->land_gen++;
    }
    if (dev)
        wsync_dev_leave(r->device, saved);
    return st;
}

/* Describe, wait for the plan and set the scheme up; resumable across calls. */
static wsync_status_t receiver_setup(wsync_receiver_t *r, int64_t plan_deadline)
{
    wsync_status_t st;

    if (r->m.state == WSYNC_STATE_CONNECTED) {
        wsync_wbuf_t b;
        wsync_wbuf_init(&b);
        wsync_targets_encode(r->targets, r->ntargets, &b);
        wsync_member_put_gpu(&b, r->device);
        st = wsync_member_describe(&r->m, &b);
        wsync_wbuf_free(&b);
        if (st != WSYNC_OK)
            return wsync_member_fail(&r->m, st);
    }
    st = wsync_member_await_plan(&r->m, plan_deadline);
    if (st == WSYNC_ERR_TIMEOUT)
        return st;                      /* not a failure: the others may not be there yet */
    if (st != WSYNC_OK)
        return st;
    st = wsync_plan_check_receiver(r->m.plan, (uint32_t)r->m.rank, r->targets, r->ntargets);
    if (st == WSYNC_OK)
        st = wire_setup(r);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    for (size_t i = 0; i < r->ntargets; i++) {
        wsync_target_desc_t landing = r->targets[i];
        landing.dtype = r->land_dtype[i];
        if (landing.mem != WSYNC_MEM_CUDA)
            wsync_exec_zero_uncovered(&landing, r->land[i]);
    }
    if (r->device >= 0) {
        /* CUDA targets: the quantization workspaces, and the uncovered elements of the targets
         * landed in directly (a staging buffer was zeroed whole) */
        int saved = -1;
        st = wsync_dev_enter(r->device, &saved);
        if (st == WSYNC_OK && r->dev_ws == NULL)
            st = wsync_dev_malloc(r->ntargets * WSYNC_KQUANT_WS_BYTES + 1, &r->dev_ws);
        if (st == WSYNC_OK)   /* flags of workspaces never used read as clear (quantize_check) */
            st = wsync_dev_memset_async(r->dev_ws, 0, r->ntargets * WSYNC_KQUANT_WS_BYTES + 1,
                                        r->dev_stream);
        for (size_t i = 0; i < r->ntargets && st == WSYNC_OK; i++)
            if (r->targets[i].mem == WSYNC_MEM_CUDA && r->land[i] == r->target_data[i])
                st = zero_uncovered_dev(r, &r->targets[i], r->land_dtype[i], r->land[i]);
        if (r->device >= 0)
            wsync_dev_leave(r->device, saved);
        if (st != WSYNC_OK)
            return wsync_member_fail(&r->m, st);
    }
    st = r->m.scheme->receiver_setup(r);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    r->m.state = WSYNC_STATE_READY;
    return WSYNC_OK;
}

/* Quantize every staged FP8 target into its buffer and scales, once all its values landed. */
static wsync_status_t quantize_staged(wsync_receiver_t *r)
{
    if (r->device >= 0) {
        int saved = -1;
        wsync_status_t st = wsync_dev_enter(r->device, &saved);
        if (st == WSYNC_OK)
            st = quantize_staged_dev(r);
        wsync_dev_leave(r->device, saved);
        if (st != WSYNC_OK)
            return st;
    }
    for (size_t i = 0; i < r->ntargets; i++) {
        const wsync_target_desc_t *t = &r->targets[i];
        uint64_t rows, cols;
        wsync_status_t st;
        if (r->land[i] == r->target_data[i] || t->mem == WSYNC_MEM_CUDA)
            continue;
        wsync_shape_matrix(t->ndim, t->shape, &rows, &cols);
        st = wsync_quantize_f32(t->name, r->land[i], rows, cols, cols, &r->quant[i], t->dtype,
                                r->target_data[i], cols, r->quant[i].scales);
        if (st != WSYNC_OK)
            return st;
    }
    return WSYNC_OK;
}

/* The group is usable and this receiver set up (resumable across calls). */
static wsync_status_t receiver_ready(wsync_receiver_t *r, int64_t deadline, int timeout_ms)
{
    wsync_status_t st = wsync_inbox_failed(&r->m.inbox);

    if (st != WSYNC_OK || r->m.state == WSYNC_STATE_READY)
        return st;
    st = receiver_setup(r, deadline);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "receiver %d: no version within %d ms (the group is still being set "
                         "up)", r->m.rank, timeout_ms);
    return st;
}

/* The commit fault point: a version landed whole, not yet committed. */
static wsync_status_t commit_point(wsync_receiver_t *r, uint64_t v)
{
    if (WSYNC_FAULT(WSYNC_FAULT_COMMIT) == WSYNC_FAULT_FAIL) {
        char where[96];
        snprintf(where, sizeof(where), "receiver %d committing version %llu", r->m.rank,
                 (unsigned long long)v);
        return wsync_fault_err(WSYNC_FAULT_COMMIT, where);
    }
    return WSYNC_OK;
}

/* The caller's per-version hook, once version v is whole in the targets and before anyone hears
 * it committed: the engine re-derives what it computes from the weights. Its failure fails the
 * version here, as a failed copy would (the targets stay torn). */
static wsync_status_t version_hook(wsync_receiver_t *r, uint64_t v)
{
    int rc;

    if (r->on_version == NULL)
        return WSYNC_OK;
    rc = r->on_version(r->on_version_arg, v);
    if (rc != 0)
        return wsync_err(WSYNC_ERR_ABORTED, "receiver %d: the on_version hook returned %d for "
                         "version %llu", r->m.rank, rc, (unsigned long long)v);
    return WSYNC_OK;
}

/* Async schemes: land a version the receiver asks for. */
static wsync_status_t receiver_fetch(wsync_receiver_t *r, uint64_t want, int timeout_ms,
                                     uint64_t *got)
{
    uint64_t v = 0;
    wsync_status_t st;

    /* the scheme sets torn once it writes into the targets */
    st = quant_early_reset(r);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    st = r->m.scheme->receiver_fetch(r, want, timeout_ms, &v);
    if (st == WSYNC_ERR_TIMEOUT || st == WSYNC_ERR_NOT_FOUND)
        return st;     /* nothing was written: the scheme writes only once it has a directory */
    if (st == WSYNC_OK) {
        r->torn = 1;
        st = quantize_staged(r);
    }
    if (st == WSYNC_OK)
        st = commit_point(r, v);
    if (st == WSYNC_OK)
        st = version_hook(r, v);
    if (st != WSYNC_OK)
        st = quant_drain(r, st);
    if (st != WSYNC_OK)
        r->delta_holds = 0;   /* the targets hold no whole version: the next one comes full */
    if (st == WSYNC_ERR_INTEGRITY)
        return st;     /* this reader's copy is bad, not the store: it may fetch again */
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    r->torn = 0;
    r->version = v;
    /* a receiver that said off takes every version in full (a store reader that came after the
     * group's mode was resolved without it) */
    r->delta_holds = r->m.planmsg.delta == WSYNC_DELTA_MODE_ON &&
                     r->delta_choice != WSYNC_DELTA_MODE_OFF ? v : 0;
    *got = v;
    return WSYNC_OK;
}

wsync_status_t wsync_receiver_wait(wsync_receiver_t *r, int timeout_ms, uint64_t *version)
{
    const uint16_t begin[] = {WSYNC_MSG_BEGIN};
    int64_t deadline;
    wsync_status_t st;
    wsync_msg_t *msg;
    uint64_t v;

    if (r == NULL || version == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_wait: NULL argument");
    if (timeout_ms < 0)
        timeout_ms = r->m.timeout_ms;
    deadline = wsync_deadline_in(timeout_ms);
    st = receiver_ready(r, deadline, timeout_ms);
    if (st != WSYNC_OK)
        return st;
    if (r->m.scheme->async)
        return receiver_fetch(r, 0, wsync_ms_left(deadline), version);
    /* on the coordinator's host, BEGIN and COMMIT are doorbells in shared memory (doorbell.h) */
    st = r->m.bells_on ? wsync_member_bell_next(&r->m, deadline, &v)
                       : wsync_inbox_pop(&r->m.inbox, begin, 1, deadline, &msg);
    if (st == WSYNC_ERR_TIMEOUT)
        return wsync_err(st, "receiver %d: no new version within %d ms (last committed: %llu)",
                         r->m.rank, timeout_ms, (unsigned long long)r->version);
    if (st != WSYNC_OK)
        return st;
    if (r->m.bells_on && v <= r->version)
        return wsync_member_fail(&r->m, wsync_err(WSYNC_ERR_PROTOCOL, "receiver %d: version %llu "
                                 "began after version %llu", r->m.rank, (unsigned long long)v,
                                 (unsigned long long)r->version));
    if (!r->m.bells_on) {
        wsync_rbuf_t rb;
        wsync_rbuf_init(&rb, msg->payload, msg->len);
        v = wsync_get_u64(&rb);
        st = rb.err || v <= r->version
                 ? wsync_err(WSYNC_ERR_PROTOCOL, "receiver %d: BEGIN of version %llu after version "
                             "%llu", r->m.rank, (unsigned long long)v,
                             (unsigned long long)r->version)
                 : WSYNC_OK;
        wsync_msg_free(msg);
        if (st != WSYNC_OK)
            return wsync_member_fail(&r->m, st);
    }
    /* the scheme sets torn once it writes into the targets */
    uint64_t t_begin = wsync_now_ns(), t_recv, t_quant;
    st = quant_early_reset(r);
    if (st == WSYNC_OK)
        st = r->m.scheme->receiver_recv(r, v);
    t_recv = wsync_now_ns();
    if (st == WSYNC_OK) {
        r->torn = 1;
        st = quantize_staged(r);
    }
    t_quant = wsync_now_ns();
    if (st == WSYNC_OK)
        st = commit_point(r, v);
    if (st == WSYNC_OK)
        st = version_hook(r, v);
    if (st != WSYNC_OK) {
        r->delta_holds = 0;   /* the targets hold no whole version: the next one comes full */
        return wsync_member_fail(&r->m, quant_drain(r, st));
    }
    r->torn = 0;
    r->version = v;
    /* a receiver that said off takes every version in full (a store reader that came after the
     * group's mode was resolved without it) */
    r->delta_holds = r->m.planmsg.delta == WSYNC_DELTA_MODE_ON &&
                     r->delta_choice != WSYNC_DELTA_MODE_OFF ? v : 0;
    if (r->m.bells_on)
        wsync_member_bell_commit(&r->m, v);
    else
        st = wsync_member_send_u64(&r->m, WSYNC_MSG_COMMIT, v);
    if (st != WSYNC_OK)
        return wsync_member_fail(&r->m, st);
    WSYNC_LOG_D("receiver %d: version %llu: scheme %.3f ms, quantize %.3f ms, commit %.3f ms "
                "(from BEGIN)", r->m.rank, (unsigned long long)v, (double)(t_recv - t_begin) / 1e6,
                (double)(t_quant - t_recv) / 1e6, (double)(wsync_now_ns() - t_quant) / 1e6);
    *version = v;
    return WSYNC_OK;
}

wsync_status_t wsync_receiver_fetch(wsync_receiver_t *r, uint64_t version, int timeout_ms,
                                    uint64_t *got)
{
    int64_t deadline;
    wsync_status_t st;

    if (r == NULL || got == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_fetch: NULL argument");
    if (timeout_ms < 0)
        timeout_ms = r->m.timeout_ms;
    deadline = wsync_deadline_in(timeout_ms);
    st = receiver_ready(r, deadline, timeout_ms);
    if (st != WSYNC_OK)
        return st;
    if (!r->m.scheme->async)
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "receiver %d: scheme '%s' delivers every version as "
                         "it is pushed; fetching a chosen version needs the store scheme",
                         r->m.rank, r->m.scheme->name);
    return receiver_fetch(r, version, wsync_ms_left(deadline), got);
}

wsync_status_t wsync_receiver_set_target_data(wsync_receiver_t *r, const char *name, void *data,
                                              float *scales)
{
    if (r == NULL || name == NULL || data == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "wsync_receiver_set_target_data: NULL argument");
    for (size_t i = 0; i < r->ntargets; i++) {
        if (strcmp(r->targets[i].name, name) != 0)
            continue;
        int direct = r->land[i] == r->target_data[i];   /* else: staged FP8, quantized at commit */
        if (r->targets[i].mem == WSYNC_MEM_CUDA) {
            wsync_status_t st = check_cuda_ptr(r, name, "data", data, r->targets[i].device);
            if (st == WSYNC_OK && scales != NULL && r->quant[i].scales_mem == WSYNC_MEM_CUDA)
                st = check_cuda_ptr(r, name, "scales", scales, r->targets[i].device);
            if (st != WSYNC_OK)
                return st;
        }
        if (direct) {
            if (r->land[i] != data)
                r->land_gen++;   /* schemes rebuild what they made from the old pointer */
            r->land[i] = data;
            /* a fresh buffer holds garbage where no piece lands (vocab padding): zero it */
            if (r->m.state == WSYNC_STATE_READY) {
                if (r->targets[i].mem == WSYNC_MEM_CUDA) {
                    int saved = -1;
                    wsync_status_t st = wsync_dev_enter(r->device, &saved);
                    if (st == WSYNC_OK)
                        st = zero_uncovered_dev(r, &r->targets[i], r->land_dtype[i], data);
                    wsync_dev_leave(r->device, saved);
                    if (st != WSYNC_OK)
                        return st;
                } else {
                    wsync_exec_zero_uncovered(&r->targets[i], data);
                }
            }
        }
        r->target_data[i] = data;
        if (scales != NULL)
            r->quant[i].scales = scales;
        /* whatever the buffer holds now (a shadow copy, memory brought back after sleep), it is
         * not known to hold the last version: the next version comes in full (docs/delta.md) */
        r->delta_holds = 0;
        return WSYNC_OK;
    }
    return wsync_err(WSYNC_ERR_NOT_FOUND, "receiver %d has no target '%s'", r->m.rank, name);
}

uint64_t wsync_receiver_version(const wsync_receiver_t *r)
{
    return r != NULL ? r->version : 0;
}

int wsync_receiver_torn(const wsync_receiver_t *r)
{
    return r != NULL ? r->torn : 0;
}

const char *wsync_receiver_scheme(const wsync_receiver_t *r)
{
    return r != NULL && r->m.plan != NULL ? r->m.planmsg.scheme : NULL;
}
