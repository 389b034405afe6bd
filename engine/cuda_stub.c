/* The engine's CUDA entry points in a build without CUDA: each says so. */
#include "wsync_build_config.h"

#if !WSYNC_HAVE_CUDA

#include "engine/cuda.h"

#define NO_CUDA() wse_err(WSYNC_ERR_UNSUPPORTED, "wsync was built without CUDA (the cuda device "   \
                          "needs a build with the CUDA toolkit)")

wsync_status_t wse_cuda_device_count(int *count)
{
    (void)count;
    return NO_CUDA();
}

wsync_status_t wse_cuda_create(int gpu, const wse_cuda_dims_t *dims, const float *rope_cos,
                               const float *rope_sin, wse_cuda_t **out)
{
    (void)gpu, (void)dims, (void)rope_cos, (void)rope_sin, (void)out;
    return NO_CUDA();
}

void wse_cuda_free(wse_cuda_t *c)
{
    (void)c;
}

int wse_cuda_gpu(const wse_cuda_t *c)
{
    (void)c;
    return -1;
}

const char *wse_cuda_gpu_name(const wse_cuda_t *c)
{
    (void)c;
    return "none";
}

void *wse_cuda_stream(const wse_cuda_t *c)
{
    (void)c;
    return NULL;
}

wsync_status_t wse_cuda_enter(const wse_cuda_t *c)
{
    (void)c;
    return NO_CUDA();
}

wsync_status_t wse_cuda_alloc(wse_cuda_t *c, size_t bytes, void **ptr)
{
    (void)c, (void)bytes, (void)ptr;
    return NO_CUDA();
}

void wse_cuda_release(wse_cuda_t *c, void *ptr)
{
    (void)c, (void)ptr;
}

wsync_status_t wse_cuda_upload(wse_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    (void)c, (void)dst, (void)src, (void)bytes;
    return NO_CUDA();
}

wsync_status_t wse_cuda_zero(wse_cuda_t *c, void *dst, size_t bytes)
{
    (void)c, (void)dst, (void)bytes;
    return NO_CUDA();
}

wsync_status_t wse_cuda_download(wse_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    (void)c, (void)dst, (void)src, (void)bytes;
    return NO_CUDA();
}

wsync_status_t wse_cuda_kv_alloc(wse_cuda_t *c)
{
    (void)c;
    return NO_CUDA();
}

void wse_cuda_kv_free(wse_cuda_t *c)
{
    (void)c;
}

wsync_status_t wse_cuda_forward(wse_cuda_t *c, const wse_weights_t *w, int32_t token, int pos,
                                const wse_cuda_coll_t *coll, float *logits)
{
    (void)c, (void)w, (void)token, (void)pos, (void)coll, (void)logits;
    return NO_CUDA();
}

#else

typedef int wse_cuda_stub_unused_t;   /* ISO C wants a declaration in every file */

#endif
