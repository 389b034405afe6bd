/* Status names and texts from the one table in wsync.h, and the thread's last error. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define WSYNC_LAST_ERROR_MAX 1024

static _Thread_local char last_error[WSYNC_LAST_ERROR_MAX];

const char *wsync_status_str(wsync_status_t status)
{
    switch (status) {
#define X_(name, code, text) case WSYNC_##name: return text;
    WSYNC_STATUS_MAP(X_)
#undef X_
    }
    return "unknown status";
}

const char *wsync_status_name(wsync_status_t status)
{
    switch (status) {
#define X_(name, code, text) case WSYNC_##name: return "WSYNC_" #name;
    WSYNC_STATUS_MAP(X_)
#undef X_
    }
    return "WSYNC_UNKNOWN";
}

const char *wsync_last_error(void)
{
    return last_error;
}

wsync_status_t wsync_err(wsync_status_t status, const char *fmt, ...)
{
    va_list ap;
    int n;

    /* the detail is formatted apart: it may quote the previous last error */
    char detail[WSYNC_LAST_ERROR_MAX];
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    n = snprintf(last_error, sizeof(last_error), "%s: ", wsync_status_str(status));
    if (n > 0 && (size_t)n < sizeof(last_error)) {
        size_t len = strnlen(detail, sizeof(last_error) - (size_t)n - 1);
        memcpy(last_error + n, detail, len);
        last_error[(size_t)n + len] = '\0';
    }
    return status;
}

wsync_status_t wsync_err_set_text(wsync_status_t status, const char *text)
{
    snprintf(last_error, sizeof(last_error), "%s", text);
    return status;
}

void wsync_err_clear(void)
{
    last_error[0] = '\0';
}
