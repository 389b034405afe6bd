/* wsync-bench's CUDA and NCCL calls (bench_cuda.c), so that the rest of the bench includes no
 * CUDA header. Every function prints what failed ("wsync-bench: cudaMalloc(4294967296 bytes) on
 * GPU 2: out of memory") and returns -1; 0 on success. In a build without CUDA each one says so
 * and returns -1. Call them only in the bench's children: the parent never touches CUDA, so that
 * its children start with no CUDA state inherited through fork. */
#ifndef WSYNC_BENCH_CUDA_H
#define WSYNC_BENCH_CUDA_H

#include "bench/bench.h"

#include <stddef.h>

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
    double bcast_gbps;                                      /* 0: not measured */
    double bcast_s;
    char bcast_note[160];                                   /* why not, or what */
} bench_probe_res_t;

/* Measures every link of req into *res (each a median of 5 timed copies after one untimed).
 * The broadcast is skipped, with a note, for fewer than 2 GPUs or without NCCL; a failure of
 * the broadcast alone is noted, not returned. */
int bcuda_probe(const bench_probe_req_t *req, bench_probe_res_t *res);

#endif
