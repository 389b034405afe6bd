/* cuda_ipc transport: GPU memory shared between processes of one node through CUDA IPC handles.
 * Only the run-time probe exists so far; the data path comes with the ipc scheme's CUDA side. */
#include "transports/transport.h"
#include "wsync_build_config.h"

#include <stdio.h>

#if WSYNC_HAVE_CUDA
#include <cuda_runtime_api.h>

static int cuda_ipc_probe(char *reason, size_t reason_len)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        /* No driver, no device, or a device the driver refuses: all read the same to a user. */
        snprintf(reason, reason_len, "no CUDA device: %s",
                 err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices");
        return 0;
    }
    struct cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, 0);
    if (err != cudaSuccess) {
        snprintf(reason, reason_len, "%d device%s, but device 0 cannot be queried: %s", count,
                 count == 1 ? "" : "s", cudaGetErrorString(err));
        return 0;
    }
    snprintf(reason, reason_len, "%d device%s: %s", count, count == 1 ? "" : "s", prop.name);
    return 1;
}

#define CUDA_IPC_COMPILED 1
#else
static int cuda_ipc_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_CUDA=ON (needs the CUDA toolkit: "
             "nvcc and cudart)");
    return 0;
}

#define CUDA_IPC_COMPILED 0
#endif

const wsync_transport_ops_t wsync_transport_cuda_ipc = {
    .name = "cuda_ipc",
    .compiled = CUDA_IPC_COMPILED,
    /* No data path is wired in yet, so nothing is advertised (caps must match what works). */
    .caps = 0,
    .est_gbps = 0.0,
    .probe = cuda_ipc_probe,
};
