#include "reshard/text.h"

#include <inttypes.h>
#include <stdio.h>

const char *wsync_fmt_dims(wsync_text_t *t, int nd, const int64_t *v)
{
    size_t k = 0;

    t->s[k++] = '[';
    for (int d = 0; d < nd && d < WSYNC_MAX_DIMS; d++)
        k += (size_t)snprintf(t->s + k, sizeof(t->s) - k, "%s%" PRId64, d ? ", " : "", v[d]);
    snprintf(t->s + k, sizeof(t->s) - k, "]");
    return t->s;
}

static size_t fmt_span(char *s, size_t n, int d, int64_t start, int64_t len)
{
    int64_t end;
    int w = __builtin_add_overflow(start, len, &end)
                ? snprintf(s, n, "%s%" PRId64 ":+%" PRId64, d ? ", " : "", start, len)
                : snprintf(s, n, "%s%" PRId64 ":%" PRId64, d ? ", " : "", start, end);
    return w > 0 ? (size_t)w : 0;
}

const char *wsync_fmt_span_box(wsync_text_t *t, int nd, const int64_t *start, const int64_t *len)
{
    size_t k = 0;

    t->s[k++] = '[';
    for (int d = 0; d < nd && d < WSYNC_MAX_DIMS; d++)
        k += fmt_span(t->s + k, sizeof(t->s) - k, d, start[d], len[d]);
    snprintf(t->s + k, sizeof(t->s) - k, "]");
    return t->s;
}
