/* Fault injection (core/fault.h): the WSYNC_FAULT parser and the registry of rules it fills. The
 * registry is process-wide on purpose — a fault is a property of the process, like its log level —
 * and exists only in builds with WSYNC_FAULTS=ON. */
#include "core/fault.h"

#include <stdlib.h>

#include "core/log.h"

#if defined(WSYNC_FAULTS) && WSYNC_FAULTS

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/proto.h"

#define MAX_RULES 16

static const char *const point_names[WSYNC_FAULT_NPOINTS] = {
    [WSYNC_FAULT_PUSH_BUCKET] = "push.bucket",   [WSYNC_FAULT_RECV_UNPACK] = "recv.unpack",
    [WSYNC_FAULT_CTRL_SEND] = "ctrl.send",       [WSYNC_FAULT_CTRL_RECV] = "ctrl.recv",
    [WSYNC_FAULT_STORE_PUBLISH] = "store.publish", [WSYNC_FAULT_STORE_GET] = "store.get",
    [WSYNC_FAULT_COMMIT] = "commit",             [WSYNC_FAULT_DELTA_CORRUPT] = "delta.encoded",
    [WSYNC_FAULT_BELL_WAIT] = "bell.wait",
};

typedef enum { ACT_KILL, ACT_STOP, ACT_DELAY, ACT_DROP, ACT_CORRUPT, ACT_FAIL } act_t;

typedef struct {
    wsync_fault_point_t point;
    int msg_type;                    /* -1: any frame */
    act_t act;
    long delay_ms;
    unsigned long long at;           /* 0: every hit */
    atomic_ullong hits;
    char text[64];                   /* the token, for messages */
} rule_t;

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t parsed_pid;             /* the process the rules were parsed in (0: none yet) */
static wsync_status_t parse_status;
static char parse_text[512];
static rule_t rules[MAX_RULES];
static atomic_int nrules;

/* The rule and hit behind this thread's last FAIL, for wsync_fault_err. */
static _Thread_local const rule_t *failed_rule;
static _Thread_local unsigned long long failed_hit;

static int parse_ull(const char *s, const char *end, unsigned long long *out)
{
    unsigned long long v = 0;

    if (s == end)
        return -1;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9' || v > (ULLONG_MAX - 9) / 10)
            return -1;
        v = v * 10 + (unsigned long long)(*s - '0');
    }
    *out = v;
    return 0;
}

/* One "<point>[/<MSG>]:<action>[@N]" token into r; on error, writes why. */
static int parse_token(const char *tok, size_t len, rule_t *r, char *why, size_t why_len)
{
    const char *end = tok + len, *colon = memchr(tok, ':', len), *slash, *at, *act, *act_end;
    size_t plen;
    int p;

    if (colon == NULL) {
        snprintf(why, why_len, "no ':' between point and action");
        return -1;
    }
    slash = memchr(tok, '/', (size_t)(colon - tok));
    plen = (size_t)((slash != NULL ? slash : colon) - tok);
    for (p = 0; p < WSYNC_FAULT_NPOINTS; p++)
        if (strlen(point_names[p]) == plen && strncmp(tok, point_names[p], plen) == 0)
            break;
    if (p == WSYNC_FAULT_NPOINTS) {
        snprintf(why, why_len, "unknown point '%.*s' (push.bucket, recv.unpack, ctrl.send, "
                 "ctrl.recv, store.publish, store.get, commit, delta.encoded, bell.wait)",
                 (int)plen, tok);
        return -1;
    }
    r->point = (wsync_fault_point_t)p;
    r->msg_type = -1;
    if (slash != NULL) {
        size_t mlen = (size_t)(colon - slash - 1);
        if (p != WSYNC_FAULT_CTRL_SEND && p != WSYNC_FAULT_CTRL_RECV) {
            snprintf(why, why_len, "only ctrl.send and ctrl.recv take a message type");
            return -1;
        }
        for (unsigned t = 1; t < WSYNC_MSG_COUNT_; t++)
            if (t != WSYNC_MSG_HEARTBEAT && strlen(wsync_msg_name(t)) == mlen &&
                strncasecmp(slash + 1, wsync_msg_name(t), mlen) == 0)
                r->msg_type = (int)t;
        if (r->msg_type < 0) {
            snprintf(why, why_len, "unknown message type '%.*s'", (int)mlen, slash + 1);
            return -1;
        }
    }
    act = colon + 1;
    at = memchr(act, '@', (size_t)(end - act));
    act_end = at != NULL ? at : end;
    r->at = 0;
    if (at != NULL && (parse_ull(at + 1, end, &r->at) != 0 || r->at == 0)) {
        snprintf(why, why_len, "'@%.*s' is not a hit number >= 1", (int)(end - at - 1), at + 1);
        return -1;
    }
#define IS(word) ((size_t)(act_end - act) == strlen(word) && strncmp(act, word, strlen(word)) == 0)
    if (IS("kill")) {
        r->act = ACT_KILL;
    } else if (IS("stop")) {
        r->act = ACT_STOP;
    } else if (IS("drop")) {
        r->act = ACT_DROP;
    } else if (IS("corrupt")) {
        r->act = ACT_CORRUPT;
    } else if (IS("fail")) {
        r->act = ACT_FAIL;
    } else if ((size_t)(act_end - act) > 6 && strncmp(act, "delay=", 6) == 0) {
        const char *num = act + 6, *unit = num;
        unsigned long long v;
        while (unit < act_end && *unit >= '0' && *unit <= '9')
            unit++;
        int ms = (size_t)(act_end - unit) == 2 && strncmp(unit, "ms", 2) == 0;
        int s = (size_t)(act_end - unit) == 1 && *unit == 's';
        if (parse_ull(num, unit, &v) != 0 || (!ms && !s) || v > 3600000) {
            snprintf(why, why_len, "delay wants a duration such as 200ms or 5s");
            return -1;
        }
        r->act = ACT_DELAY;
        r->delay_ms = (long)(s ? v * 1000 : v);
    } else {
        snprintf(why, why_len, "unknown action '%.*s' (kill, stop, delay=<ms>ms|<s>s, drop, "
                 "corrupt, fail, each optionally @N)", (int)(act_end - act), act);
        return -1;
    }
#undef IS
    if (r->act == ACT_DROP && p != WSYNC_FAULT_CTRL_SEND && p != WSYNC_FAULT_CTRL_RECV) {
        snprintf(why, why_len, "drop applies to ctrl.send and ctrl.recv only");
        return -1;
    }
    if (r->act == ACT_CORRUPT && p != WSYNC_FAULT_PUSH_BUCKET && p != WSYNC_FAULT_RECV_UNPACK &&
        p != WSYNC_FAULT_STORE_GET && p != WSYNC_FAULT_DELTA_CORRUPT) {
        snprintf(why, why_len, "corrupt applies to push.bucket, recv.unpack, store.get and "
                 "delta.encoded only");
        return -1;
    }
    snprintf(r->text, sizeof(r->text), "%.*s", (int)len, tok);
    return 0;
}

wsync_status_t wsync_fault_init(void)
{
    wsync_status_t st;

    pthread_mutex_lock(&init_mu);
    if (parsed_pid != getpid()) {
        const char *env = getenv("WSYNC_FAULT");
        int n = 0;

        parsed_pid = getpid();
        parse_status = WSYNC_OK;
        atomic_store(&nrules, 0);
        for (const char *p = env; p != NULL && *p != '\0';) {
            const char *comma = strchr(p, ',');
            size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
            char why[256];
            if (n == MAX_RULES) {
                parse_status = WSYNC_ERR_INVALID;
                snprintf(parse_text, sizeof(parse_text), "%s: environment variable WSYNC_FAULT: "
                         "more than %d rules", wsync_status_str(parse_status), MAX_RULES);
                break;
            }
            memset(&rules[n], 0, sizeof(rules[n]));
            if (parse_token(p, len, &rules[n], why, sizeof(why)) != 0) {
                parse_status = WSYNC_ERR_INVALID;
                snprintf(parse_text, sizeof(parse_text), "%s: environment variable WSYNC_FAULT: "
                         "bad token '%.*s': %s", wsync_status_str(parse_status), (int)len, p, why);
                break;
            }
            n++;
            p = comma != NULL ? comma + 1 : NULL;
        }
        /* a bad value injects nothing: the caller fails instead */
        atomic_store(&nrules, parse_status == WSYNC_OK ? n : 0);
        if (parse_status == WSYNC_OK && n > 0)
            WSYNC_LOG_W("fault injection armed (pid %d): WSYNC_FAULT=%s", (int)getpid(), env);
    }
    st = parse_status;
    if (st != WSYNC_OK)
        wsync_err_set_text(st, parse_text);
    pthread_mutex_unlock(&init_mu);
    return st;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

wsync_fault_act_t wsync_fault_hit(wsync_fault_point_t point, int msg_type)
{
    wsync_fault_act_t out = WSYNC_FAULT_NONE;
    int n = atomic_load(&nrules);

    if (msg_type == WSYNC_MSG_HEARTBEAT)
        return WSYNC_FAULT_NONE;
    for (int i = 0; i < n; i++) {
        rule_t *r = &rules[i];
        if (r->point != point || (r->msg_type >= 0 && r->msg_type != msg_type))
            continue;
        unsigned long long hit = atomic_fetch_add(&r->hits, 1) + 1;
        if (r->at != 0 && hit != r->at)
            continue;
        WSYNC_LOG_W("injected fault %s (pid %d, hit %llu%s%s)", r->text, (int)getpid(), hit,
                    msg_type >= 0 ? ", frame " : "",
                    msg_type >= 0 ? wsync_msg_name((unsigned)msg_type) : "");
        switch (r->act) {
        case ACT_KILL:
            raise(SIGKILL);
            break;
        case ACT_STOP:
            raise(SIGSTOP);
            break;
        case ACT_DELAY:
            sleep_ms(r->delay_ms);
            break;
        case ACT_DROP:
            out = out != WSYNC_FAULT_NONE ? out : WSYNC_FAULT_DROP;
            break;
        case ACT_CORRUPT:
            out = out != WSYNC_FAULT_NONE ? out : WSYNC_FAULT_CORRUPT;
            break;
        case ACT_FAIL:
            if (out == WSYNC_FAULT_NONE) {
                out = WSYNC_FAULT_FAIL;
                failed_rule = r;
                failed_hit = hit;
            }
            break;
        }
    }
    return out;
}

wsync_status_t wsync_fault_err(wsync_fault_point_t point, const char *where)
{
    return wsync_err(WSYNC_ERR_IO, "injected fault %s (hit %llu): %s",
                     failed_rule != NULL ? failed_rule->text : point_names[point], failed_hit,
                     where);
}

void wsync_fault_flip(void *data, size_t len)
{
    if (data != NULL && len > 0)
        ((unsigned char *)data)[len / 2] ^= 0x10;
}

#else

wsync_status_t wsync_fault_init(void)
{
    const char *env = getenv("WSYNC_FAULT");

    if (env != NULL && *env != '\0')
        WSYNC_LOG_W("WSYNC_FAULT is set, but this build has no fault injection (configure with "
                    "-DWSYNC_FAULTS=ON): ignored");
    return WSYNC_OK;
}

#endif
