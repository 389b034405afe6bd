/* Params resolution: a field set in code wins; an unset field comes from its WSYNC_* variable,
 * else from the default. A malformed variable is an error naming it, never silently ignored. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/objects.h"
#include "core/status.h"
#include "core/util.h"
#include "core/wire_policy.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_HEARTBEAT_MS 1000
#define DEFAULT_BUCKET_BYTES WSYNC_DEFAULT_BUCKET_BYTES   /* core/wire_policy.h */
#define MIN_BUCKET_BYTES 4096ull

/* Read an int variable: 1 if set and valid, 0 if unset, a status < 0 if malformed. */
static int env_int(const char *var, int min, int max, int *out)
{
    const char *s = getenv(var);
    char *end;
    long v;

    if (s == NULL || *s == '\0')
        return 0;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max)
        return wsync_err(WSYNC_ERR_INVALID, "environment variable %s='%s': expected an integer in "
                                            "[%d, %d]", var, s, min, max);
    *out = (int)v;
    return 1;
}

static const char *env_str(const char *var)
{
    const char *s = getenv(var);
    return s != NULL && *s != '\0' ? s : NULL;
}

#define RESOLVE_INT(field, unset, var, min, max, def)                                        \
    do {                                                                                      \
        if (out->field == (unset)) {                                                          \
            int v_, rc_ = env_int(var, min, max, &v_);                                        \
            if (rc_ < 0)                                                                      \
                return (wsync_status_t)rc_;                                                   \
            out->field = rc_ == 1 ? v_ : (def);                                               \
        }                                                                                     \
    } while (0)

/* A string field with a fixed set of values: code, else the variable, else the default; a value
 * outside the set names the field (or the variable) and the accepted values. */
static wsync_status_t resolve_choice(const char *who, const char *field, const char *var,
                                     const char *const *accepted, const char *def,
                                     const char **value)
{
    const char *from = field;

    if (*value == NULL) {
        *value = env_str(var);
        from = var;
    }
    if (*value == NULL) {
        *value = def;
        return WSYNC_OK;
    }
    for (int i = 0; accepted[i] != NULL; i++)
        if (strcmp(*value, accepted[i]) == 0)
            return WSYNC_OK;
    char list[128] = "";
    for (int i = 0; accepted[i] != NULL; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
                 i == 0 ? "" : accepted[i + 1] == NULL ? " or " : ", ", accepted[i]);
    return wsync_err(WSYNC_ERR_INVALID, "%s: %s = '%s', expected %s", who, from, *value, list);
}

static const char *const delta_modes[] = {"off", "on", "auto", NULL};
static const char *const delta_baselines[] = {"device", "host", NULL};

/* delta_cutoff: a fraction in (0, 1] from code, else WSYNC_DELTA_CUTOFF, else 0 (the sender picks
 * the default per memory kind: WSYNC_DELTA_CUTOFF_HOST or _CUDA, wsync/wsync.h). Negative, above
 * 1 and NaN are refused, naming the field or the variable and the value as given. */
static wsync_status_t resolve_cutoff(double *value)
{
    const char *s;
    char *end;
    double v;

    if (*value != 0.0 || isnan(*value)) {
        if (!(*value > 0.0 && *value <= 1.0))
            return wsync_err(WSYNC_ERR_INVALID, "sender: delta_cutoff = %g, expected a fraction in "
                             "(0, 1] of a chunk's plain bytes (0 = the default)", *value);
        return WSYNC_OK;
    }
    if ((s = env_str("WSYNC_DELTA_CUTOFF")) == NULL)
        return WSYNC_OK;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v > 0.0 && v <= 1.0))
        return wsync_err(WSYNC_ERR_INVALID, "environment variable WSYNC_DELTA_CUTOFF='%s' "
                         "(delta_cutoff): expected a fraction in (0, 1] of a chunk's plain bytes",
                         s);
    *value = v;
    return WSYNC_OK;
}

static wsync_status_t check_common(const char *who, int rank, int n, const char *nname,
                                   int timeout_ms, int heartbeat_ms)
{
    if (n < 1)
        return wsync_err(WSYNC_ERR_INVALID, "%s: %s = %d, must be >= 1", who, nname, n);
    if (rank < 0 || rank >= n)
        return wsync_err(WSYNC_ERR_INVALID, "%s: rank %d is outside [0, %s = %d)", who, rank,
                         nname, n);
    if (timeout_ms < 1)
        return wsync_err(WSYNC_ERR_INVALID, "%s: timeout_ms = %d, must be >= 1", who, timeout_ms);
    if (heartbeat_ms < 1)
        return wsync_err(WSYNC_ERR_INVALID, "%s: heartbeat_ms = %d, must be >= 1", who,
                         heartbeat_ms);
    return WSYNC_OK;
}

wsync_status_t wsync_config_sender(const wsync_sender_params_t *in, wsync_sender_params_t *out)
{
    static const wsync_sender_params_t defaults = WSYNC_SENDER_PARAMS_INIT;

    *out = in != NULL ? *in : defaults;
    if (out->coordinator == NULL)
        out->coordinator = env_str("WSYNC_COORDINATOR");
    if (out->coordinator == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "sender: no coordinator address (set "
                                            "params.coordinator or WSYNC_COORDINATOR to host:port)");
    RESOLVE_INT(rank, -1, "WSYNC_SENDER_RANK", 0, INT_MAX, 0);
    RESOLVE_INT(nranks, 0, "WSYNC_SENDERS", 1, INT_MAX, 1);
    RESOLVE_INT(nreceivers, 0, "WSYNC_RECEIVERS", 1, INT_MAX, 1);
    RESOLVE_INT(timeout_ms, 0, "WSYNC_TIMEOUT_MS", 1, INT_MAX, DEFAULT_TIMEOUT_MS);
    RESOLVE_INT(heartbeat_ms, 0, "WSYNC_HEARTBEAT_MS", 1, INT_MAX, DEFAULT_HEARTBEAT_MS);
    RESOLVE_INT(snapshot, -1, "WSYNC_SNAPSHOT", 0, 1, 1);
    RESOLVE_INT(keep_versions, 0, "WSYNC_KEEP_VERSIONS", 1, 1 << 20, 2);
    RESOLVE_INT(copy_shards, -1, "WSYNC_COPY_SHARDS", 0, 1, 0);
    RESOLVE_INT(fp8_wire, -1, "WSYNC_FP8_WIRE", 0, 2, 1);
    if (out->fp8_wire < 0 || out->fp8_wire > 2)
        return wsync_err(WSYNC_ERR_INVALID, "sender: fp8_wire = %d, expected 0, 1 or 2",
                         out->fp8_wire);
    if (out->copy_shards != 0 && out->copy_shards != 1)
        return wsync_err(WSYNC_ERR_INVALID, "sender: copy_shards = %d, expected 0 or 1",
                         out->copy_shards);
    if (out->snapshot != 0 && out->snapshot != 1)
        return wsync_err(WSYNC_ERR_INVALID, "sender: snapshot = %d, expected 0 or 1", out->snapshot);
    if (out->keep_versions < 1)
        return wsync_err(WSYNC_ERR_INVALID, "sender: keep_versions = %d, must be >= 1",
                         out->keep_versions);
    if (out->scheme == NULL)
        out->scheme = env_str("WSYNC_SCHEME");
    if (out->scheme == NULL)
        out->scheme = "auto";
    if (strcmp(out->scheme, "auto") != 0 && wsync_scheme_find(out->scheme) == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "sender: unknown scheme '%s' (expected auto, ipc, nccl "
                                            "or store)", out->scheme);
    if (out->bucket_bytes == 0) {
        const char *s = env_str("WSYNC_BUCKET_BYTES");
        uint64_t v = DEFAULT_BUCKET_BYTES;
        if (s != NULL && wsync_parse_size(s, &v) != 0)
            return wsync_err(WSYNC_ERR_INVALID, "environment variable WSYNC_BUCKET_BYTES='%s': "
                                                "expected a size such as 268435456 or 256M", s);
        out->bucket_bytes = (size_t)v;
    }
    if (out->bucket_bytes < MIN_BUCKET_BYTES)
        return wsync_err(WSYNC_ERR_INVALID, "sender: bucket_bytes = %zu, must be >= %llu",
                         out->bucket_bytes, MIN_BUCKET_BYTES);
    if (out->nranks < 1)
        return wsync_err(WSYNC_ERR_INVALID, "sender: nranks = %d, must be >= 1", out->nranks);
    if (out->nreceivers < 1)
        return wsync_err(WSYNC_ERR_INVALID, "sender: nreceivers = %d, must be >= 1", out->nreceivers);
    wsync_status_t st = resolve_choice("sender", "delta", "WSYNC_DELTA", delta_modes, "auto",
                                       &out->delta);
    if (st == WSYNC_OK)
        st = resolve_choice("sender", "delta_baseline", "WSYNC_DELTA_BASELINE", delta_baselines,
                            "device", &out->delta_baseline);
    if (st == WSYNC_OK)
        st = resolve_cutoff(&out->delta_cutoff);
    if (st != WSYNC_OK)
        return st;
    return check_common("sender", out->rank, out->nranks, "nranks", out->timeout_ms,
                        out->heartbeat_ms);
}

wsync_status_t wsync_config_receiver(const wsync_receiver_params_t *in, wsync_receiver_params_t *out)
{
    static const wsync_receiver_params_t defaults = WSYNC_RECEIVER_PARAMS_INIT;

    *out = in != NULL ? *in : defaults;
    if (out->coordinator == NULL)
        out->coordinator = env_str("WSYNC_COORDINATOR");
    if (out->coordinator == NULL)
        return wsync_err(WSYNC_ERR_INVALID, "receiver: no coordinator address (set "
                                            "params.coordinator or WSYNC_COORDINATOR to host:port)");
    RESOLVE_INT(rank, -1, "WSYNC_RECEIVER_RANK", 0, INT_MAX, 0);
    RESOLVE_INT(nreceivers, 0, "WSYNC_RECEIVERS", 1, INT_MAX, 1);
    RESOLVE_INT(timeout_ms, 0, "WSYNC_TIMEOUT_MS", 1, INT_MAX, DEFAULT_TIMEOUT_MS);
    RESOLVE_INT(heartbeat_ms, 0, "WSYNC_HEARTBEAT_MS", 1, INT_MAX, DEFAULT_HEARTBEAT_MS);
    wsync_status_t st = resolve_choice("receiver", "delta", "WSYNC_DELTA", delta_modes, "auto",
                                       &out->delta);
    if (st != WSYNC_OK)
        return st;
    return check_common("receiver", out->rank, out->nreceivers, "nreceivers", out->timeout_ms,
                        out->heartbeat_ms);
}
