#include "core/util.h"

#include <ctype.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t wsync_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int wsync_ms_left(int64_t deadline_ms)
{
    int64_t left = deadline_ms - wsync_now_ms();

    if (left < 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

char *wsync_strdup(const char *s)
{
    return s == NULL ? NULL : strdup(s);
}

int wsync_parse_size(const char *text, uint64_t *out)
{
    char *end;
    unsigned long long v;
    uint64_t mult = 1;

    if (text == NULL || !isdigit((unsigned char)*text))
        return -1;
    v = strtoull(text, &end, 10);
    while (*end == ' ')
        end++;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': mult = 1ull << 10; end++; break;
    case 'M': mult = 1ull << 20; end++; break;
    case 'G': mult = 1ull << 30; end++; break;
    case 'T': mult = 1ull << 40; end++; break;
    default: return -1;
    }
    if (mult > 1) {
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
    } else if (*end == 'B' || *end == 'b') {
        end++;
    }
    if (*end != '\0')
        return -1;
    if (wsync_mul_u64(v, mult, out) != 0)
        return -1;
    return 0;
}

static char host_id[160];
static pthread_once_t host_id_once = PTHREAD_ONCE_INIT;

static void host_id_init(void)
{
    char boot[64] = "", netns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    ssize_t n;

    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    if (boot[0] == '\0')
        gethostname(boot, sizeof(boot) - 1);
    /* a host id with a '/' would split elsewhere on the other side */
    const char *over = getenv("WSYNC_HOST_ID");
    if (over != NULL && *over != '\0')
        snprintf(boot, sizeof(boot), "%s", over);
    for (char *c = boot; *c != '\0'; c++)
        if (*c == '/')
            *c = '_';
    n = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
    netns[n > 0 ? n : 0] = '\0';
    snprintf(host_id, sizeof(host_id), "%s/%s", boot, netns);
}

const char *wsync_host_id(void)
{
    pthread_once(&host_id_once, host_id_init);
    return host_id;
}

size_t wsync_host_len(const char *id)
{
    return id == NULL ? 0 : strcspn(id, "/");
}

const char *wsync_host_netns(const char *id)
{
    size_t n = wsync_host_len(id);

    return id == NULL || id[n] == '\0' ? "" : id + n + 1;
}

int wsync_host_same(const char *a, const char *b)
{
    size_t na = wsync_host_len(a);

    return na == wsync_host_len(b) && (na == 0 || memcmp(a, b, na) == 0);
}

int wsync_host_same_netns(const char *a, const char *b)
{
    return wsync_host_same(a, b) && strcmp(wsync_host_netns(a), wsync_host_netns(b)) == 0;
}

static int host_cmp(const void *x, const void *y)
{
    const char *a = *(const char *const *)x, *b = *(const char *const *)y;
    size_t na = wsync_host_len(a), nb = wsync_host_len(b);
    int c = memcmp(a ? a : "", b ? b : "", na < nb ? na : nb);

    if (c != 0 || na != nb)
        return c != 0 ? c : na < nb ? -1 : 1;
    return strcmp(wsync_host_netns(a), wsync_host_netns(b));
}

int wsync_host_count(const char *const *ids, size_t n, uint32_t *hosts, uint32_t *spaces)
{
    const char **v = malloc((n ? n : 1) * sizeof(*v));
    uint32_t nh = 0, ns = 0;

    if (v == NULL)
        return -1;
    memcpy(v, ids, n * sizeof(*v));
    /* sorted by (host, netns): equal hosts are adjacent, and within them equal namespaces */
    qsort(v, n, sizeof(*v), host_cmp);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || !wsync_host_same(v[i - 1], v[i]))
            nh++;
        if (i == 0 || !wsync_host_same_netns(v[i - 1], v[i]))
            ns++;
    }
    free(v);
    *hosts = nh;
    *spaces = ns;
    return 0;
}
