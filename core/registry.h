/* Internal: the static registries of transports and schemes, and scheme negotiation. */
#ifndef WSYNC_CORE_REGISTRY_H
#define WSYNC_CORE_REGISTRY_H

#include "schemes/scheme.h"
#include "transports/transport.h"

#define WSYNC_NTRANSPORTS 6
#define WSYNC_NSCHEMES 3

extern const wsync_transport_ops_t *const wsync_transports[WSYNC_NTRANSPORTS];
extern const wsync_scheme_ops_t *const wsync_schemes[WSYNC_NSCHEMES];

/* Index of a transport by name, -1 if unknown. */
int wsync_transport_index(const char *name);
const wsync_scheme_ops_t *wsync_scheme_find(const char *name);

/* Pick the scheme for a group: the user's explicit choice if it can serve (else an error naming
 * why), otherwise the best score, in DESIGN.md's order (ipc, nccl, store). Writes one line per
 * scheme into explain ("ipc: chosen: ..." / "nccl: refused: ..."). */
wsync_status_t wsync_negotiate(const wsync_group_info_t *g, const char *choice,
                               const wsync_scheme_ops_t **chosen, char *explain, size_t len);
/* The transports a participant asking for `scheme` probes, as bits of wsync_transports: those the
 * scheme can use, plus shm and tcp (microseconds each). NULL, "auto" or an unknown name: all. */
uint32_t wsync_scheme_transports(const char *scheme);
/* wsync_negotiate, telling a transport a participant did not probe from one it lacks: a
 * participant whose HELLO names a scheme probed only that scheme's transports
 * (wsync_scheme_transports), so a scheme refused only for want of those is explained as "not
 * probed", naming who asked for what; a group of "auto" participants reads as before. */
wsync_status_t wsync_negotiate_probed(const wsync_group_info_t *g, const char *choice,
                                      const wsync_scheme_ops_t **chosen, char *explain,
                                      size_t len);

#endif
