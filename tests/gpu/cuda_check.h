/* What the GPU test programs and tools (tests/gpu/) share for calling the CUDA runtime directly:
 * a call that must succeed (a tool's CU, a test's CU_OK), and the median of a run of event
 * timings. Header only. */
#ifndef WSYNC_TEST_GPU_CUDA_CHECK_H
#define WSYNC_TEST_GPU_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* 1 (said on stderr: where, the call, CUDA's reason) when a CUDA runtime call failed. */
static inline int cu_failed(cudaError_t e, const char *file, int line, const char *call)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
    return 1;
}

/* A CUDA runtime call that must succeed: else where and why on stderr, and exit status 2. */
#define CU(call)                                                                              \
    do {                                                                                      \
        if (cu_failed((call), __FILE__, __LINE__, #call))                                     \
            exit(2);                                                                          \
    } while (0)

/* In a test built on tests/support/check.h: a CUDA runtime call that must succeed, else where
 * and why on stderr, one failure counted and `goto out` (the test's cleanup). */
#define CU_OK(call)                                                                           \
    do {                                                                                      \
        if (cu_failed((call), __FILE__, __LINE__, #call)) {                                   \
            check_failures++;                                                                 \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

static inline int cu_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of n (even, > 0) times in milliseconds, in seconds; sorts ms. */
static inline double cu_median_seconds(float *ms, int n)
{
    qsort(ms, (size_t)n, sizeof(float), cu_cmp_float);
    return 0.5e-3 * (ms[n / 2 - 1] + ms[n / 2]);
}
#endif
