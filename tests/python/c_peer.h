/* Shared by the C peers of the Python tests (c_sender.c, c_receiver.c): options, the test's
 * definition of version v of a bf16 weight, and the checkpoint paths.
 *
 * Version v of a checkpoint weight w (python/tests use the same rule):
 *   w_v = bf16(float32(w * (1 + v/8) + v/1024)), computed in float64, rounded to nearest even.
 * Assumes a little-endian host. */
#ifndef WSYNC_TESTS_PYTHON_C_PEER_H
#define WSYNC_TESTS_PYTHON_C_PEER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEER_CKPT WSYNC_TESTDATA "/hf_qwen3_tiny/model.safetensors"
#define PEER_CONFIG WSYNC_TESTDATA "/hf_qwen3_tiny/config.json"

typedef struct {
    const char *coordinator;   /* "127.0.0.1:PORT"; a sender of rank 0 may give port 0 */
    int rank;
    int senders, receivers;    /* group size */
    int tp;                    /* receivers: TP size (= receivers) */
    int versions;
    int timeout_ms;
    const char *bad_param;     /* receiver: add a target naming this absent param */
    const char *expect_error;  /* the group must fail with an error naming this */
} peer_opts_t;

static inline int peer_parse(int argc, char **argv, peer_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->senders = 2;
    o->receivers = 2;
    o->tp = 2;
    o->versions = 3;
    o->timeout_ms = 20000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "option %s needs a value\n", a);
            return -1;
        }
        if (strcmp(a, "--coordinator") == 0)
            o->coordinator = v;
        else if (strcmp(a, "--rank") == 0)
            o->rank = atoi(v);
        else if (strcmp(a, "--senders") == 0)
            o->senders = atoi(v);
        else if (strcmp(a, "--receivers") == 0)
            o->receivers = atoi(v);
        else if (strcmp(a, "--tp") == 0)
            o->tp = atoi(v);
        else if (strcmp(a, "--versions") == 0)
            o->versions = atoi(v);
        else if (strcmp(a, "--timeout-ms") == 0)
            o->timeout_ms = atoi(v);
        else if (strcmp(a, "--bad-param") == 0)
            o->bad_param = v;
        else if (strcmp(a, "--expect-error") == 0)
            o->expect_error = v;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return -1;
        }
        i++;
    }
    if (o->coordinator == NULL) {
        fprintf(stderr, "--coordinator is required\n");
        return -1;
    }
    return 0;
}

static inline double peer_bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t peer_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline uint16_t peer_version_value(uint16_t w, int v)
{
    double x = peer_bf16_to_double(w) * (1.0 + v / 8.0) + v / 1024.0;
    return peer_f32_to_bf16((float)x);
}

static inline uint16_t peer_load_u16(const uint8_t *p)
{
    uint16_t w;
    memcpy(&w, p, 2);
    return w;
}

#endif
