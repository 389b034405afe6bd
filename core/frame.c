#include "core/frame.h"

#include <stdio.h>
#include <xxhash.h>

#include "core/proto.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void wsync_frame_hdr_encode(uint16_t type, uint32_t flags, const void *payload, uint32_t len,
                            uint8_t out[WSYNC_FRAME_HDR])
{
    uint64_t sum = XXH3_64bits(payload, len);

    put32(out, WSYNC_FRAME_MAGIC);
    out[4] = WSYNC_PROTO_VERSION & 0xff;
    out[5] = WSYNC_PROTO_VERSION >> 8;
    out[6] = (uint8_t)type;
    out[7] = (uint8_t)(type >> 8);
    put32(out + 8, flags);
    put32(out + 12, len);
    put32(out + 16, (uint32_t)sum);
    put32(out + 20, (uint32_t)(sum >> 32));
}

wsync_status_t wsync_frame_hdr_decode(const uint8_t in[WSYNC_FRAME_HDR], wsync_frame_hdr_t *hdr,
                                      char *why, size_t why_len)
{
    uint32_t magic = get32(in);

    if (magic != WSYNC_FRAME_MAGIC) {
        snprintf(why, why_len, "bad magic 0x%08x (not a wsync peer?)", magic);
        return WSYNC_ERR_PROTOCOL;
    }
    hdr->version = (uint16_t)(in[4] | (in[5] << 8));
    hdr->type = (uint16_t)(in[6] | (in[7] << 8));
    hdr->flags = get32(in + 8);
    hdr->len = get32(in + 12);
    hdr->checksum = (uint64_t)get32(in + 16) | ((uint64_t)get32(in + 20) << 32);
    if (hdr->version != WSYNC_PROTO_VERSION) {
        snprintf(why, why_len, "protocol version %u, this library speaks %u", hdr->version,
                 WSYNC_PROTO_VERSION);
        return WSYNC_ERR_PROTOCOL;
    }
    if (hdr->type == 0 || hdr->type >= WSYNC_MSG_COUNT_) {
        snprintf(why, why_len, "unknown message type %u", hdr->type);
        return WSYNC_ERR_PROTOCOL;
    }
    if (hdr->len > WSYNC_FRAME_MAX) {
        snprintf(why, why_len, "payload of %u bytes exceeds the %u-byte cap", hdr->len,
                 WSYNC_FRAME_MAX);
        return WSYNC_ERR_PROTOCOL;
    }
    return WSYNC_OK;
}

int wsync_frame_checksum_ok(const wsync_frame_hdr_t *hdr, const void *payload)
{
    return XXH3_64bits(payload, hdr->len) == hdr->checksum;
}
