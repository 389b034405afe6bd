/* nccl transport: send/recv and broadcast groups between GPUs, on one node or many.
 * Only the run-time probe exists so far; the communicator and data path come with the nccl
 * scheme. */
#include "transports/transport.h"
#include "wsync_build_config.h"

#include <stdio.h>

#if WSYNC_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

/* NCCL encodes versions as X*1000+Y*100+Z up to 2.8 and X*10000+Y*100+Z from 2.9 on. */
static void nccl_version_text(int code, char *buf, size_t len)
{
    if (code >= 10000)
        snprintf(buf, len, "%d.%d.%d", code / 10000, (code / 100) % 100, code % 100);
    else
        snprintf(buf, len, "%d.%d.%d", code / 1000, (code / 100) % 10, code % 100);
}

static int nccl_probe(char *reason, size_t reason_len)
{
    int code = 0;
    ncclResult_t res = ncclGetVersion(&code);
    if (res != ncclSuccess) {
        snprintf(reason, reason_len, "ncclGetVersion failed: %s", ncclGetErrorString(res));
        return 0;
    }
    char version[32];
    nccl_version_text(code, version, sizeof(version));

    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        snprintf(reason, reason_len, "NCCL %s, but no CUDA device: %s", version,
                 err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices");
        return 0;
    }
    snprintf(reason, reason_len, "NCCL %s, %d CUDA device%s", version, count,
             count == 1 ? "" : "s");
    return 1;
}

#define NCCL_COMPILED 1
#else
static int nccl_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_NCCL=ON (needs nccl.h and libnccl, "
             "and CUDA)");
    return 0;
}

#define NCCL_COMPILED 0
#endif

const wsync_transport_ops_t wsync_transport_nccl = {
    .name = "nccl",
    .compiled = NCCL_COMPILED,
    /* No data path is wired in yet, so nothing is advertised (caps must match what works). */
    .caps = 0,
    .est_gbps = 0.0,
    .probe = nccl_probe,
};
