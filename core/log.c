#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_int log_level = WSYNC_LOG_WARN;

void wsync_log_set_level(wsync_log_level_t level)
{
    if (level != WSYNC_LOG_UNSET)
        atomic_store(&log_level, (int)level);
}

wsync_log_level_t wsync_log_get_level(void)
{
    return (wsync_log_level_t)atomic_load(&log_level);
}

wsync_log_level_t wsync_log_parse_level(const char *text)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char *end;
    long v;

    if (text == NULL || *text == '\0')
        return WSYNC_LOG_UNSET;
    for (int i = 0; i < 4; i++)
        if (strcasecmp(text, names[i]) == 0)
            return (wsync_log_level_t)i;
    v = strtol(text, &end, 10);
    if (*end == '\0' && v >= 0 && v <= 3)
        return (wsync_log_level_t)v;
    return WSYNC_LOG_UNSET;
}

void wsync_log(wsync_log_level_t level, const char *fmt, ...)
{
    static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[2048];
    va_list ap;
    int n;

    if ((int)level > atomic_load(&log_level))
        return;
    n = snprintf(line, sizeof(line), "wsync[%d] %s: ", (int)getpid(), tags[level]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* one write per line so lines of several processes do not interleave */
    n = (int)strlen(line);
    if (n < (int)sizeof(line) - 1) {
        line[n++] = '\n';
        line[n] = '\0';
    }
    fputs(line, stderr);
}
