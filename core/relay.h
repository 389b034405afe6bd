/* Internal: a scheme's side data through the coordinator (SCHEME_SETUP / SCHEME_RELAY in
 * core/proto.h): what a scheme needs every member, or one member, to know at setup or per version
 * (nccl: the communicator's unique id and each member's GPU; checksums under WSYNC_VERIFY), with
 * no data connection of its own. The coordinator forwards the bytes and names their author. */
#ifndef WSYNC_CORE_RELAY_H
#define WSYNC_CORE_RELAY_H

#include "core/objects.h"

/* Send len bytes under `tag` to member (to_role, to_rank), or with to_role WSYNC_ROLE_NONE to
 * every member but this one. Only once the plan came (the coordinator refuses it before).
 * len <= WSYNC_RELAY_MAX. */
wsync_status_t wsync_member_relay_send(wsync_member_t *m, wsync_role_t to_role, int to_rank,
                                       uint32_t tag, const void *data, uint32_t len);

/* Take the next SCHEME_RELAY from the inbox, waiting until deadline_ms. On WSYNC_OK *msg owns
 * the payload that *r borrows from (wsync_msg_free it after use) and r->role/rank name the
 * author. WSYNC_ERR_TIMEOUT (no last error set: the caller says what it waited for), the group's
 * failure, or WSYNC_ERR_PROTOCOL for a malformed relay. */
wsync_status_t wsync_member_relay_recv(wsync_member_t *m, int64_t deadline_ms, wsync_msg_t **msg,
                                       wsync_relay_t *r);

#endif
