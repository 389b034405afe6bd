/* Shared by the soak tests: what each process measures of itself as versions go by, and the
 * check that it stays flat.
 *
 * Every process (sender or receiver) samples its resident memory (VmRSS of /proc/self/status)
 * and its open file descriptors (entries of /proc/self/fd) after versions 10, 100, 200, ...,
 * SOAK_VERSIONS, and sends the samples to the parent over a pipe (one write, below PIPE_BUF, so
 * reports of several children never interleave). The parent prints them and checks that no
 * sample after version 10 exceeds version 10's by more than SOAK_RSS_TOLERANCE_KB or by any
 * descriptor. Under AddressSanitizer the memory check is reported but not enforced: its
 * quarantine holds freed memory on purpose (up to 256 MiB), so RSS grows by design there. */
#ifndef WSYNC_TESTS_SOAK_H
#define WSYNC_TESTS_SOAK_H

#include <dirent.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"

#ifndef SOAK_VERSIONS
#define SOAK_VERSIONS 1000
#endif
#define SOAK_FIRST 10                  /* the baseline: setup and warm-up are over */
#define SOAK_RSS_TOLERANCE_KB 1024
#define SOAK_MAX_SAMPLES 24

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

typedef struct {
    uint32_t version;
    uint32_t rss_kb;
    uint32_t fds;
} soak_sample_t;

typedef struct {
    char who[24];
    int32_t nsamples;
    int32_t failed;                    /* the process's own checks (bytes, statuses) */
    double seconds;                    /* from version SOAK_FIRST to the last */
    soak_sample_t s[SOAK_MAX_SAMPLES];
} soak_report_t;

static inline long soak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;

    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static inline int soak_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n - 3;                      /* ".", ".." and the directory's own descriptor */
}

static inline int soak_due(uint64_t v)
{
    return v == SOAK_FIRST || (v % 100 == 0 && v <= SOAK_VERSIONS);
}

static inline void soak_sample(soak_report_t *r, uint64_t v)
{
    if (!soak_due(v) || r->nsamples >= SOAK_MAX_SAMPLES)
        return;
    r->s[r->nsamples].version = (uint32_t)v;
    r->s[r->nsamples].rss_kb = (uint32_t)soak_rss_kb();
    r->s[r->nsamples].fds = (uint32_t)soak_fds();
    r->nsamples++;
}

static inline void soak_send(int fd, const soak_report_t *r)
{
    if (write(fd, r, sizeof(*r)) != (ssize_t)sizeof(*r))
        perror("soak: report");
}

/* Read up to n reports from the pipe's read end (the parent has closed its write end, so the
 * pipe ends when every child has gone), waiting at most timeout_ms of silence; returns how many
 * arrived. */
static inline int soak_collect(int fd, soak_report_t *out, int n, int timeout_ms)
{
    int got = 0;

    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t k;
        if (poll(&p, 1, timeout_ms) != 1)
            break;
        k = read(fd, &out[got], sizeof(out[got]));
        if (k != (ssize_t)sizeof(out[got]))
            break;                     /* every child gone (0), or a torn report */
        got++;
    }
    return got;
}

/* Print one line per process and check flatness; returns the number of failures. */
static inline int soak_check(const char *title, const soak_report_t *r, int n)
{
    int bad = 0;

    printf("%s (%d versions, baseline version %d%s)\n", title, SOAK_VERSIONS, SOAK_FIRST,
           SOAK_ASAN ? "; ASan build: RSS reported, not checked" : "");
    printf("  %-12s %10s %10s %10s %6s %6s %9s\n", "process", "rss@10 kB", "rss@last", "max +kB",
           "fds@10", "max fd", "s/1k ver");
    for (int i = 0; i < n; i++) {
        const soak_report_t *p = &r[i];
        long max_delta = 0;
        uint32_t max_fds = 0;
        if (p->nsamples < 2 || p->s[0].version != SOAK_FIRST ||
            p->s[p->nsamples - 1].version != SOAK_VERSIONS) {
            fprintf(stderr, "%s: %d samples, from version %u to %u\n", p->who, p->nsamples,
                    p->nsamples ? p->s[0].version : 0,
                    p->nsamples ? p->s[p->nsamples - 1].version : 0);
            bad++;
            continue;
        }
        for (int k = 1; k < p->nsamples; k++) {
            long d = (long)p->s[k].rss_kb - (long)p->s[0].rss_kb;
            if (d > max_delta)
                max_delta = d;
            if (p->s[k].fds > max_fds)
                max_fds = p->s[k].fds;
        }
        printf("  %-12s %10u %10u %10ld %6u %6u %9.2f\n", p->who, p->s[0].rss_kb,
               p->s[p->nsamples - 1].rss_kb, max_delta, p->s[0].fds, max_fds,
               p->seconds * 1000.0 / (SOAK_VERSIONS - SOAK_FIRST));
        for (int k = 1; k < p->nsamples; k++) {
            CHECK_MSG(p->s[k].fds <= p->s[0].fds, "%s: %u descriptors at version %u, %u at "
                      "version %d", p->who, p->s[k].fds, p->s[k].version, p->s[0].fds,
                      SOAK_FIRST);
            if (!SOAK_ASAN)
                CHECK_MSG(p->s[k].rss_kb <= p->s[0].rss_kb + SOAK_RSS_TOLERANCE_KB,
                          "%s: VmRSS %u kB at version %u, %u kB at version %d (tolerance %d kB)",
                          p->who, p->s[k].rss_kb, p->s[k].version, p->s[0].rss_kb, SOAK_FIRST,
                          SOAK_RSS_TOLERANCE_KB);
        }
        CHECK_MSG(p->failed == 0, "%s: %d of its own checks failed", p->who, p->failed);
        bad += p->failed != 0;
    }
    fflush(stdout);
    return bad;
}

#endif
