/* Internal: the control-plane frame. Every message on every wsync socket is one frame:
 *
 *   offset size  field
 *   0      4     magic "WSYN"
 *   4      2     protocol version (WSYNC_PROTO_VERSION)
 *   6      2     message type (core/proto.h)
 *   8      4     flags (0 so far)
 *   12     4     payload length (<= WSYNC_FRAME_MAX)
 *   16     8     xxh3-64 of the payload
 *   24     ...   payload
 *
 * little-endian. A frame that breaks any rule closes the connection it came on. */
#ifndef WSYNC_CORE_FRAME_H
#define WSYNC_CORE_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "wsync/wsync.h"

#define WSYNC_FRAME_MAGIC 0x4e595357u      /* "WSYN" read as little-endian u32 */
#define WSYNC_PROTO_VERSION 2
#define WSYNC_FRAME_HDR 24
#define WSYNC_FRAME_MAX (64u << 20)        /* largest payload: a plan for a very large model */

typedef struct {
    uint16_t version;
    uint16_t type;
    uint32_t flags;
    uint32_t len;
    uint64_t checksum;
} wsync_frame_hdr_t;

void wsync_frame_hdr_encode(uint16_t type, uint32_t flags, const void *payload, uint32_t len,
                            uint8_t out[WSYNC_FRAME_HDR]);
/* Parse and check magic, version, type range and length cap. On failure writes why into
 * `why` and returns WSYNC_ERR_PROTOCOL. */
wsync_status_t wsync_frame_hdr_decode(const uint8_t in[WSYNC_FRAME_HDR], wsync_frame_hdr_t *hdr,
                                      char *why, size_t why_len);
/* Check a received payload against its header's checksum. */
int wsync_frame_checksum_ok(const wsync_frame_hdr_t *hdr, const void *payload);

#endif
