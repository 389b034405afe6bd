/* Internal: logging to stderr with a level threshold. */
#ifndef WSYNC_CORE_LOG_H
#define WSYNC_CORE_LOG_H

#include "core/status.h"

/* The threshold is process-wide: logging is a property of the process, set by the most recent
 * wsync_ctx_create (or WSYNC_LOG_LEVEL). */
void wsync_log_set_level(wsync_log_level_t level);
wsync_log_level_t wsync_log_get_level(void);
/* Parse "error|warn|info|debug" (or 0..3); WSYNC_LOG_UNSET if unknown. */
wsync_log_level_t wsync_log_parse_level(const char *text);

void wsync_log(wsync_log_level_t level, const char *fmt, ...) WSYNC_PRINTF(2, 3);

#define WSYNC_LOG_E(...) wsync_log(WSYNC_LOG_ERROR, __VA_ARGS__)
#define WSYNC_LOG_W(...) wsync_log(WSYNC_LOG_WARN, __VA_ARGS__)
#define WSYNC_LOG_I(...) wsync_log(WSYNC_LOG_INFO, __VA_ARGS__)
#define WSYNC_LOG_D(...) wsync_log(WSYNC_LOG_DEBUG, __VA_ARGS__)

#endif
