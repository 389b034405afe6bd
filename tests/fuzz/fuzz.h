/* Shared by the fuzz targets (tests/fuzz/fuzz_*.c).
 *
 * Each target defines LLVMFuzzerTestOneInput. Built with clang and -DWSYNC_FUZZ=ON it links
 * libFuzzer; otherwise replay_main.c gives it a main() that runs every file named on the command
 * line once, so the seeds and the regression files are checked by every build.
 *
 * FUZZ_ASSERT states a property the code under test promises (a decoded message encodes back to
 * the same bytes, a checked plan stays inside its buffers, no descriptor leaks): when it fails,
 * the target aborts, and libFuzzer saves the input as a crash. */
#ifndef WSYNC_TESTS_FUZZ_H
#define WSYNC_TESTS_FUZZ_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(cond, ...)                                                                \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* WSYNC_FUZZ_VERBOSE=1: targets say what became of each input (to check what seeds reach). */
static inline int fuzz_verbose(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("WSYNC_FUZZ_VERBOSE");
        v = e != NULL && *e == '1';
    }
    return v;
}

/* Open file descriptors of this process (entries of /proc/self/fd, less the one reading it). */
static inline int fuzz_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n - 3;   /* ".", ".." and the directory's own descriptor */
}

/* Little-endian reads from a fuzz input, advancing it; zeros past the end. */
typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_in_t;

static inline uint64_t fuzz_take(fuzz_in_t *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes && in->n > 0; i++, in->p++, in->n--)
        v |= (uint64_t)in->p[0] << (8 * i);
    return v;
}

#endif
