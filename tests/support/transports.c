#include "tests/support/transports.h"

#include <stdio.h>
#include <string.h>

#include "wsync/wsync.h"

int test_have_transport(const char *name)
{
    wsync_ctx_t *ctx;
    int have = 0;

    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK)
        return 0;
    for (int i = 0; i < wsync_transport_count(ctx); i++) {
        wsync_component_info_t info;
        if (wsync_transport_info(ctx, i, &info) == WSYNC_OK && strcmp(info.name, name) == 0) {
            have = info.compiled && info.available;
            if (!have)
                fprintf(stderr, "skipped: transport %s: %s\n", name, info.reason);
        }
    }
    wsync_ctx_free(ctx);
    return have;
}
