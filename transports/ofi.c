/* ofi transport: one-sided RMA through libfabric providers, for the store scheme.
 * Only the run-time probe exists so far; endpoints, registration and the data path come with
 * the store scheme. */
#include "transports/transport.h"
#include "wsync_build_config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if WSYNC_HAVE_OFI
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

/* Providers the probe asks for: the two that work on any Linux machine. */
static const char *const ofi_providers[] = {"tcp", "shm"};

/* printf-style append at *pos, keeping buf terminated and never running past len. */
__attribute__((format(printf, 4, 5))) static void ofi_append(char *buf, size_t len, size_t *pos,
                                                           const char *fmt, ...)
{
    if (*pos + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *pos, len - *pos, fmt, ap);
    va_end(ap);
    if (n > 0)
        *pos += (size_t)n < len - *pos ? (size_t)n : len - *pos - 1;
}

/* Asks one provider for RMA-capable endpoints. On success copies the name the answer carries
 * ("tcp;ofi_rxm" when a utility provider is layered on top) into found. Returns 0 or a negative
 * libfabric error. */
static int ofi_ask(uint32_t version, const char *prov, char *found, size_t found_len)
{
    struct fi_info *hints = fi_allocinfo();
    if (!hints)
        return -FI_ENOMEM;
    hints->caps = FI_RMA;
    /* Accept any mode and memory-registration rule: the probe only asks who is there. */
    hints->mode = ~0ULL;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT |
                                  FI_MR_ENDPOINT;
    hints->fabric_attr->prov_name = strdup(prov); /* freed by fi_freeinfo */
    if (!hints->fabric_attr->prov_name) {
        fi_freeinfo(hints);
        return -FI_ENOMEM;
    }
    struct fi_info *info = NULL;
    int ret = fi_getinfo(version, NULL, NULL, 0, hints, &info);
    fi_freeinfo(hints);
    if (ret != 0)
        return ret < 0 ? ret : -ret;
    if (!info)
        return -FI_ENODATA;
    const char *name = info->fabric_attr && info->fabric_attr->prov_name
                           ? info->fabric_attr->prov_name
                           : prov;
    snprintf(found, found_len, "%s", name);
    fi_freeinfo(info);
    return 0;
}

static int ofi_probe(char *reason, size_t reason_len)
{
    uint32_t runtime = fi_version();
    /* Ask with the older of the headers' and the library's API version. */
    uint32_t version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
    if (runtime < version)
        version = runtime;

    char answered[160] = "", refused[256] = "";
    size_t apos = 0, rpos = 0;
    for (size_t i = 0; i < sizeof(ofi_providers) / sizeof(ofi_providers[0]); i++) {
        char found[64];
        int ret = ofi_ask(version, ofi_providers[i], found, sizeof(found));
        if (ret == 0 && strcmp(found, ofi_providers[i]) == 0)
            ofi_append(answered, sizeof(answered), &apos, "%s%s", apos ? ", " : "", found);
        else if (ret == 0)
            ofi_append(answered, sizeof(answered), &apos, "%s%s (%s)", apos ? ", " : "",
                       ofi_providers[i], found);
        else
            ofi_append(refused, sizeof(refused), &rpos, "%s%s: %s", rpos ? "; " : "",
                       ofi_providers[i], fi_strerror(-ret));
    }

    unsigned major = FI_MAJOR(runtime), minor = FI_MINOR(runtime);
    if (apos == 0) {
        snprintf(reason, reason_len, "libfabric %u.%u: no provider answered for RMA (%s)", major,
                 minor, refused);
        return 0;
    }
    if (rpos == 0)
        snprintf(reason, reason_len, "libfabric %u.%u: RMA from %s", major, minor, answered);
    else
        snprintf(reason, reason_len, "libfabric %u.%u: RMA from %s (not %s)", major, minor,
                 answered, refused);
    return 1;
}

#define OFI_COMPILED 1
#else
static int ofi_probe(char *reason, size_t reason_len)
{
    snprintf(reason, reason_len,
             "not compiled in: configure with -DWSYNC_WITH_OFI=ON (needs libfabric headers and "
             "pkg-config file: libfabric-dev)");
    return 0;
}

#define OFI_COMPILED 0
#endif

const wsync_transport_ops_t wsync_transport_ofi = {
    .name = "ofi",
    .compiled = OFI_COMPILED,
    /* No data path is wired in yet, so nothing is advertised (caps must match what works). */
    .caps = 0,
    .est_gbps = 0.0,
    .probe = ofi_probe,
};
