/* The bare scatter of tests/gpu/delta_floor.h. */
#include "tests/gpu/delta_floor.h"

#include <cuda_runtime.h>
#include <stdio.h>

/* A thread per changed element, four of them a thread's loads in flight: the positions and
 * values read in order (coalesced), the writes where the elements are. */
__global__ void delta_floor_scatter_kernel(uint16_t *dst, const uint32_t *__restrict__ pos,
                                           const uint16_t *__restrict__ val, uint64_t n)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint32_t p0 = pos[i], p1 = pos[i + stride], p2 = pos[i + 2 * stride],
                       p3 = pos[i + 3 * stride];
        const uint16_t v0 = val[i], v1 = val[i + stride], v2 = val[i + 2 * stride],
                       v3 = val[i + 3 * stride];
        dst[p0] = v0;
        dst[p1] = v1;
        dst[p2] = v2;
        dst[p3] = v3;
    }
    for (; i < n; i += stride)
        dst[pos[i]] = val[i];
}

extern "C" int delta_floor_scatter(uint16_t *dst, const uint32_t *pos, const uint16_t *val, uint64_t n)
{
    int sms = 0, dev = 0;
    if (n == 0)
        return 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    uint64_t blocks = (n + 4 * 256 - 1) / (4 * 256);
    if (blocks > (uint64_t)sms * 16)
        blocks = (uint64_t)sms * 16;
    delta_floor_scatter_kernel<<<(unsigned)blocks, 256>>>(dst, pos, val, n);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "delta_floor_scatter: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Two threads a sector: each reads its 16 bytes of a changed 32-byte sector and writes them
 * back, so that each changed sector is read and written whole (no partial write). */
__global__ void delta_floor_sectors_kernel(uint4 *dst, const uint32_t *__restrict__ sec, uint64_t n)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; t < 2 * n; t += stride) {
        const uint64_t v = 2 * (uint64_t)sec[t >> 1] + (t & 1);
        uint4 x = dst[v];
        asm volatile("" : "+r"(x.x));   /* a write of what was read, not folded away */
        dst[v] = x;
    }
}

extern "C" int delta_floor_sectors(uint16_t *dst, const uint32_t *sec, uint64_t n)
{
    int sms = 0, dev = 0;
    if (n == 0)
        return 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    uint64_t blocks = (2 * n + 255) / 256;
    if (blocks > (uint64_t)sms * 16)
        blocks = (uint64_t)sms * 16;
    delta_floor_sectors_kernel<<<(unsigned)blocks, 256>>>(reinterpret_cast<uint4 *>(dst), sec, n);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "delta_floor_sectors: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Both versions read once in one grid-stride pass and compared, nothing written: *out gets the
 * 16-byte vectors that differ. Each thread has four vectors of each version in flight. */
__global__ void __launch_bounds__(256) delta_floor_compare_kernel(const uint4 *__restrict__ a,
                                                                  const uint4 *__restrict__ b,
                                                                  uint64_t nv, unsigned long long *out)
{
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned n = 0;
    for (; i + 3 * stride < nv; i += 4 * stride) {
        uint4 x[4], y[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[k] = a[i + k * stride];
            y[k] = b[i + k * stride];
        }
#pragma unroll
        for (int k = 0; k < 4; k++)
            n += ((x[k].x ^ y[k].x) | (x[k].y ^ y[k].y) | (x[k].z ^ y[k].z) | (x[k].w ^ y[k].w)) != 0;
    }
    for (; i < nv; i += stride)
        n += ((a[i].x ^ b[i].x) | (a[i].y ^ b[i].y) | (a[i].z ^ b[i].z) | (a[i].w ^ b[i].w)) != 0;
    n = __reduce_add_sync(0xffffffffu, n);
    if ((threadIdx.x & 31) == 0 && n != 0)
        atomicAdd(out, (unsigned long long)n);
}

extern "C" int delta_floor_compare(const void *a, const void *b, uint64_t bytes,
                                   unsigned long long *out)
{
    int sms = 0, dev = 0, per = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, delta_floor_compare_kernel, 256, 0);
    cudaMemsetAsync(out, 0, sizeof(*out));
    delta_floor_compare_kernel<<<(unsigned)(sms * (per > 0 ? per : 1)), 256>>>(
        reinterpret_cast<const uint4 *>(a), reinterpret_cast<const uint4 *>(b), bytes / 16, out);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "delta_floor_compare: %s\n", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}
