/* A minimal test harness: CHECK records a failure and goes on; each test file's main runs its
 * cases through RUN and ends with check_summary(), which prints "N passed, N failed" and returns
 * the exit code. Multi-process helpers live in proc.h. */
#ifndef WSYNC_TEST_CHECK_H
#define WSYNC_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

extern int check_failures;   /* failures in the current case */

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
            check_failures++;                                                                 \
        }                                                                                     \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                  \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            check_failures++;                                                                 \
        }                                                                                     \
    } while (0)

/* Status equality, printing both names and the last error on failure. */
#define CHECK_ST(expr, expected)                                                              \
    do {                                                                                      \
        wsync_status_t st_ = (expr);                                                          \
        if (st_ != (expected)) {                                                              \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__,  \
                    #expr, wsync_status_name(st_), wsync_status_name(expected),               \
                    wsync_last_error());                                                      \
            check_failures++;                                                                 \
        }                                                                                     \
    } while (0)

#define CHECK_OK(expr) CHECK_ST(expr, WSYNC_OK)

/* The last error contains `needle`. */
#define CHECK_ERR_HAS(needle)                                                                 \
    CHECK_MSG(strstr(wsync_last_error(), (needle)) != NULL, "last error \"%s\" lacks \"%s\"", \
              wsync_last_error(), (needle))

#define RUN(fn) check_run(#fn, fn)

void check_run(const char *name, void (*fn)(void));
int check_summary(void);

#endif
