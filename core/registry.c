/* The static registries of transports and schemes, and how a scheme is chosen. */
#include "core/registry.h"

#include <stdio.h>
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
