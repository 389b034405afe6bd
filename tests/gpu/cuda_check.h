/* What the GPU test programs and tools (tests/gpu/) share for calling the CUDA runtime directly:
 * a call that must succeed (a tool's CU, a test's CU_OK), and the median of a run of event
 * timings. Header only. */
#ifndef WSYNC_TEST_GPU_CUDA_CHECK_H
#define WSYNC_TEST_GPU_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* A CUDA runtime call that must succeed: else where and why on stderr, and exit status 2. */
#define CU(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cudaGetErrorString(e_));                                                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

/* In a test built on tests/support/check.h: a CUDA runtime call that must succeed, else where
 * and why on stderr, one failure counted and `goto out` (the test's cleanup). */
#define CU_OK(call)                                                                           \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cudaGetErrorString(e_));                                                  \
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
