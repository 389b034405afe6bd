/* Internal: setting the thread's last error. */
#ifndef WSYNC_CORE_STATUS_H
#define WSYNC_CORE_STATUS_H

#include "wsync/wsync.h"

#if defined(__GNUC__)
#define WSYNC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define WSYNC_PRINTF(a, b)
#endif

/* Record "<status text>: <detail>" as the thread's last error and return status, so that error
 * paths read `return wsync_err(WSYNC_ERR_INVALID, "shard %d: ndim %d", i, nd);`. */
wsync_status_t wsync_err(wsync_status_t status, const char *fmt, ...) WSYNC_PRINTF(2, 3);

/* Record text verbatim (an error relayed from a peer, already formatted) and return status. */
wsync_status_t wsync_err_set_text(wsync_status_t status, const char *text);

void wsync_err_clear(void);

#endif
