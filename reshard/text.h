/* Internal: shapes and boxes as text, for error messages that name what is wrong. */
#ifndef WSYNC_RESHARD_TEXT_H
#define WSYNC_RESHARD_TEXT_H

#include <stdint.h>

#include "wsync/wsync.h"

typedef struct {
    char s[256];            /* 4 dims of "start:end" int64 pairs fit with room to spare */
} wsync_text_t;

/* "[4096, 128]" */
const char *wsync_fmt_dims(wsync_text_t *t, int nd, const int64_t *v);
/* "[0:1024, 0:4096]"; "start:+len" for a dim whose end overflows (bad input) */
const char *wsync_fmt_span_box(wsync_text_t *t, int nd, const int64_t *start, const int64_t *len);
static inline const char *wsync_fmt_box(wsync_text_t *t, int nd, const wsync_box_t *b)
{
    return wsync_fmt_span_box(t, nd, b->start, b->len);
}

#endif
