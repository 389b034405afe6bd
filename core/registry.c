/* The static registries of transports and schemes, and how a scheme is chosen. */
#include "core/registry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

const wsync_transport_ops_t *const wsync_transports[WSYNC_NTRANSPORTS] = {
    &wsync_transport_shm, &wsync_transport_tcp, &wsync_transport_cuda_ipc,
    &wsync_transport_nccl, &wsync_transport_ucx, &wsync_transport_ofi,
};

/* DESIGN.md's order of preference when the user leaves the choice to wsync. */
const wsync_scheme_ops_t *const wsync_schemes[WSYNC_NSCHEMES] = {
    &wsync_scheme_ipc, &wsync_scheme_nccl, &wsync_scheme_store,
};

int wsync_transport_index(const char *name)
{
    for (int i = 0; i < WSYNC_NTRANSPORTS; i++)
        if (strcmp(wsync_transports[i]->name, name) == 0)
            return i;
    return -1;
}

const wsync_scheme_ops_t *wsync_scheme_find(const char *name)
{
    for (int i = 0; i < WSYNC_NSCHEMES; i++)
        if (name != NULL && strcmp(wsync_schemes[i]->name, name) == 0)
            return wsync_schemes[i];
    return NULL;
}

void wsync_caps_str(unsigned caps, char *buf, size_t len)
{
    static const char *words[] = {"host", "cuda", "same-node", "cross-node",
                                  "map", "rma", "collective", "control"};
    size_t n = 0;

    buf[0] = '\0';
    for (unsigned i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (!(caps & (1u << i)))
            continue;
        int w = snprintf(buf + n, len - n, "%s%s", n ? " " : "", words[i]);
        if (w < 0 || (size_t)w >= len - n)
            break;
        n += (size_t)w;
    }
    if (n == 0)
        snprintf(buf, len, "-");
}

wsync_status_t wsync_negotiate(const wsync_group_info_t *g, const char *choice,
                               const wsync_scheme_ops_t **chosen, char *explain, size_t len)
{
    int scores[WSYNC_NSCHEMES], best = -1;
    char reasons[WSYNC_NSCHEMES][1024];   /* ipc names up to 8 pairs */
    const wsync_scheme_ops_t *want = NULL;
    size_t n = 0;

    if (choice != NULL && strcmp(choice, "auto") != 0) {
        want = wsync_scheme_find(choice);
        if (want == NULL)
            return wsync_err(WSYNC_ERR_INVALID, "unknown scheme '%s'", choice);
    }
    for (int i = 0; i < WSYNC_NSCHEMES; i++) {
        scores[i] = wsync_schemes[i]->score(g, reasons[i], sizeof(reasons[i]));
        if (scores[i] > 0 && (want == NULL || want == wsync_schemes[i]) &&
            (best < 0 || scores[i] > scores[best]))
            best = i;
    }
    for (int i = 0; i < WSYNC_NSCHEMES; i++) {
        const char *verdict = i == best ? "chosen" : scores[i] > 0 ? "not chosen" : "refused";
        if (i != best && scores[i] > 0 && want != NULL)
            verdict = "not chosen (the user asked for another scheme)";
        int w = snprintf(explain + n, len - n, "%s: %s: %s%s\n", wsync_schemes[i]->name, verdict,
                         reasons[i], i == best && want != NULL ? " (the user's choice)" : "");
        if (w > 0 && (size_t)w < len - n)
            n += (size_t)w;
    }
    if (best < 0) {
        if (want != NULL) {
            int wi = 0;
            while (wsync_schemes[wi] != want)
                wi++;
            return wsync_err(WSYNC_ERR_UNSUPPORTED, "scheme '%s' was asked for but cannot serve "
                                                    "this group: %s", choice, reasons[wi]);
        }
        return wsync_err(WSYNC_ERR_UNSUPPORTED, "no scheme can serve this group:\n%s", explain);
    }
    *chosen = wsync_schemes[best];
    return WSYNC_OK;
}

uint32_t wsync_scheme_transports(const char *scheme)
{
    /* what each scheme's score and data path look at (the schemes' files): ipc shares memfds and CUDA
     * IPC handles; nccl needs NCCL and a GPU; the store reads over UCX or libfabric, and stages
     * CUDA memory where a device is usable */
    static const struct {
        const char *scheme;
        const char *uses[3];
    } table[] = {
        {"ipc", {"cuda_ipc", NULL, NULL}},
        {"nccl", {"nccl", "cuda_ipc", NULL}},
        {"store", {"ucx", "ofi", "cuda_ipc"}},
    };
    uint32_t mask = (1u << wsync_transport_index("shm")) | (1u << wsync_transport_index("tcp"));

    for (size_t i = 0; scheme != NULL && i < sizeof(table) / sizeof(table[0]); i++) {
        if (strcmp(scheme, table[i].scheme) != 0)
            continue;
        for (int k = 0; k < 3 && table[i].uses[k] != NULL; k++) {
            int t = wsync_transport_index(table[i].uses[k]);
            if (t >= 0)
                mask |= 1u << t;
        }
        return mask;
    }
    return (1u << WSYNC_NTRANSPORTS) - 1;
}

/* Participant i of g (senders first). */
static const wsync_hello_t *probe_member(const wsync_group_info_t *g, uint32_t i)
{
    return i < g->nsenders ? &g->senders[i] : &g->receivers[i - g->nsenders];
}

/* Why a scheme that uses the transports `uses` reads refused although it might serve: the first
 * participant that did not probe some of them, the scheme it asked for, and what was not probed. */
static void unprobed_reason(const wsync_group_info_t *g, uint32_t uses, char *buf, size_t len)
{
    const wsync_hello_t *first = NULL;
    uint32_t others = 0, missing = 0;
    char names[128] = "";
    size_t n = 0;

    for (uint32_t i = 0; i < g->nsenders + g->nreceivers; i++) {
        const wsync_hello_t *h = probe_member(g, i);
        uint32_t lack = uses & ~wsync_scheme_transports(h->scheme);
        if (lack == 0)
            continue;
        missing |= lack;
        if (first == NULL)
            first = h;
        else
            others++;
    }
    for (int t = 0; t < WSYNC_NTRANSPORTS; t++) {
        if (!(missing & (1u << t)))
            continue;
        int w = snprintf(names + n, sizeof(names) - n, "%s%s", n ? ", " : "",
                         wsync_transports[t]->name);
        if (w < 0 || (size_t)w >= sizeof(names) - n)
            break;
        n += (size_t)w;
    }
    if (first == NULL) {   /* not reached: the caller found someone */
        snprintf(buf, len, "not probed");
        return;
    }
    snprintf(buf, len, "not probed: %s %d asked for scheme '%s' and probed only its transports "
                       "(%s not probed by %u participant%s)",
             first->role == WSYNC_ROLE_SENDER ? "sender" : "receiver", first->rank, first->scheme,
             names, others + 1, others ? "s" : "");
}

wsync_status_t wsync_negotiate_probed(const wsync_group_info_t *g, const char *choice,
                                      const wsync_scheme_ops_t **chosen, char *explain,
                                      size_t len)
{
    const uint32_t all = wsync_scheme_transports(NULL);
    uint32_t n = g->nsenders + g->nreceivers, partial = 0;
    wsync_status_t st = wsync_negotiate(g, choice, chosen, explain, len);
    char first_error[2048];
    char want_refused[1024] = "";   /* the asked-for scheme's reason when refused either way */

    for (uint32_t i = 0; i < n; i++)
        partial += wsync_scheme_transports(probe_member(g, i)->scheme) != all;
    if (partial == 0 || len == 0)
        return st;   /* everyone probed everything: the explanation stands as it is */
    snprintf(first_error, sizeof(first_error), "%s", wsync_last_error());

    /* The same group as if every transport not probed were there: a scheme refused now but
     * accepted then was refused for what some participants did not look for. */
    wsync_hello_t *filled = malloc((n ? n : 1) * sizeof(*filled));
    char *out = malloc(len), *reason = malloc(1024);
    if (filled == NULL || out == NULL || reason == NULL) {
        free(filled);
        free(out);
        free(reason);
        return st;   /* the plain explanation is still right about what is known */
    }
    for (uint32_t i = 0; i < n; i++) {
        filled[i] = *probe_member(g, i);
        filled[i].transports |= all & ~wsync_scheme_transports(filled[i].scheme);
    }
    wsync_group_info_t g2 = *g;
    g2.senders = filled;
    g2.receivers = filled + g->nsenders;

    size_t used = 0;
    const char *line = explain;
    int want_unprobed = 0;
    out[0] = '\0';
    for (int k = 0; k < WSYNC_NSCHEMES && *line != '\0'; k++) {
        const wsync_scheme_ops_t *s = wsync_schemes[k];
        const char *end = strchr(line, '\n');
        size_t llen = end != NULL ? (size_t)(end - line) + 1 : strlen(line);
        int w;
        const int now = s->score(g, reason, 1024);
        if (now == 0 && s->score(&g2, reason, 1024) > 0) {
            unprobed_reason(g, wsync_scheme_transports(s->name), reason, 1024);
            w = snprintf(out + used, len - used, "%s: refused: %s\n", s->name, reason);
            if (choice != NULL && strcmp(choice, s->name) == 0)
                want_unprobed = 1;
        } else if (now == 0) {
            /* refused either way: g2's reason, which holds whatever was probed (g's may name a
             * transport some participant never looked for as one it lacks) */
            w = snprintf(out + used, len - used, "%s: refused: %s\n", s->name, reason);
            if (choice != NULL && strcmp(choice, s->name) == 0)
                snprintf(want_refused, sizeof(want_refused), "%s", reason);
        } else {
            w = snprintf(out + used, len - used, "%.*s", (int)llen, line);
        }
        if (w > 0 && (size_t)w < len - used)
            used += (size_t)w;
        line += llen;
    }
    snprintf(out + used, len - used, "%s", line);   /* anything after the schemes' lines */
    snprintf(explain, len, "%s", out);
    if (st != WSYNC_OK && want_unprobed) {
        unprobed_reason(g, wsync_scheme_transports(choice), reason, 1024);
        st = wsync_err(st, "scheme '%s' was asked for but cannot serve this group: %s", choice,
                       reason);
    } else if (st != WSYNC_OK && (choice == NULL || strcmp(choice, "auto") == 0)) {
        st = wsync_err(st, "no scheme can serve this group:\n%s", explain);
    } else if (st != WSYNC_OK && want_refused[0] != '\0') {
        st = wsync_err(st, "scheme '%s' was asked for but cannot serve this group: %s", choice,
                       want_refused);
    } else if (st != WSYNC_OK) {
        st = wsync_err_set_text(st, first_error);   /* as wsync_negotiate said it, prefix and all */
    }
    free(filled);
    free(out);
    free(reason);
    return st;
}
