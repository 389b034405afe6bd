/* wsync-bench's CUDA and NCCL calls (bench_cuda.c), so that the rest of the bench includes no
 * CUDA header. Every function prints what failed ("wsync-bench: cudaMalloc(4294967296 bytes) on
 * GPU 2: out of memory") and returns -1; 0 on success. In a build without CUDA each one says so
 * and returns -1. Call them only in the bench's children: the parent never touches CUDA, so that
 * its children start with no CUDA state inherited through fork. */
#ifndef WSYNC_BENCH_CUDA_H
#define WSYNC_BENCH_CUDA_H

#include "bench/bench.h"

#include <stddef.h>
#include <stdint.h>

/* 1 when this build has CUDA (and NCCL for the broadcast reference). */
int bcuda_compiled(void);
int bcuda_nccl_compiled(void);

int bcuda_device_count(int *n);
int bcuda_set_device(int dev);
int bcuda_device_name(int dev, char *buf, size_t len);
/* Free and total bytes of GPU dev's memory now (cudaMemGetInfo; leaves dev current). */
int bcuda_mem_info(int dev, size_t *free_bytes, size_t *total_bytes);
int bcuda_malloc(void **p, size_t bytes);
void bcuda_free(void *p);
int bcuda_memset(void *p, int byte, size_t bytes);
int bcuda_h2d(void *dst, const void *src, size_t bytes);
int bcuda_d2h(void *dst, const void *src, size_t bytes);

int bcuda_d2d(void *dst, const void *src, size_t bytes);

/* --delta on CUDA memory: the codec of kernels/delta.h timed on one sender's version pair. */
typedef struct {
    size_t off;        /* the chunk's first byte, in both versions' blocks */
    uint64_t n;        /* elements, contiguous */
    uint32_t esize;    /* 2 (bf16) or 4 (f32) */
} bench_codec_chunk_t;

typedef struct {
    /* seconds per version: for each batch of chunks the median of `reps` launches timed with
     * CUDA events (after one untimed), summed over the batches */
    double encode_s;   /* the batched encode against the old values, as a scheme runs it */
    double apply_s;    /* the batched apply with the hash, onto a copy of the old values */
    double copy_s;     /* a device-to-device copy of the new values (reads and writes a version) */
    double amax_s;     /* an amax over the old values and one over the new (reads both) */
    uint64_t sent;     /* each chunk's encoding, or its plain bytes where that is not smaller */
    uint64_t changed;  /* elements that differ */
    int correct;       /* every applied chunk equals the new values byte for byte, no fault, and
                          the hash after applying equals the encoder's */
    char wrong[192];   /* the first thing found wrong */
} bench_codec_res_t;

/* The codec on chunks c[0, n) (in ascending off, not overlapping) of dnew (the new version) and
 * dold (the old), device memory of the current GPU; neither is written. Batches of chunks up to
 * 256 MiB; device scratch of about twice that, freed before it returns. 0 with *res filled (a
 * wrong result is res->correct = 0, not a failure), -1 told. */
int bcuda_delta_codec(const char *dnew, const char *dold, const bench_codec_chunk_t *c, size_t n,
                      int reps, bench_codec_res_t *res);

/* What the link probe measures. GPUs are CUDA ordinals. */
typedef struct {
    int ngpus;
    int gpus[MODEL_MAX_GPUS];         /* the GPUs the run uses */
    int npairs;
    int pair_src[MODEL_MAX_GPUS * MODEL_MAX_GPUS], pair_dst[MODEL_MAX_GPUS * MODEL_MAX_GPUS];
    int bcast_root;                   /* the GPU the broadcast starts from */
    size_t copy_bytes;                /* peer and device-to-device copies (>= 1 GiB) */
    size_t bcast_bytes;               /* the broadcast buffer (4 GiB) */
} bench_probe_req_t;

typedef struct {
    double d2d_gbps[MODEL_MAX_GPUS];                        /* by index into req->gpus */
    double peer_gbps[MODEL_MAX_GPUS * MODEL_MAX_GPUS];      /* by pair index */
    /* every pair of req at once (several pairs only), each copying its slice of copy_bytes /
     * ngpus: the busiest GPU's bytes (the larger of what it sends and what it receives) over
     * the time all took, i.e. what one GPU's links give when all of its peers use them at once,
     * as a colocated group's peer reads do; 0: not measured */
    double peer_all_gbps;
    double peer_all_s;
    double bcast_gbps;                                      /* 0: not measured */
    double bcast_s;
    char bcast_note[160];                                   /* why not, or what */
} bench_probe_res_t;

/* Measures every link of req into *res (each a median of 5 timed copies after one untimed),
 * then, with several pairs, all pairs at once (peer_all_gbps).
 * The broadcast is skipped, with a note, for fewer than 2 GPUs or without NCCL; a failure of
 * the broadcast alone is noted, not returned. */
int bcuda_probe(const bench_probe_req_t *req, bench_probe_res_t *res);

#endif
