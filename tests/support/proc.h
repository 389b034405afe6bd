/* Multi-process test helpers: fork children that run a function and exit with its result, wait
 * for them all with a deadline (killing every child when it passes), pick a free TCP port. The
 * parent never creates wsync objects before forking, so children start without foreign threads. */
#ifndef WSYNC_TEST_PROC_H
#define WSYNC_TEST_PROC_H

#include <sys/types.h>

typedef int (*proc_fn)(void *arg);

/* Fork a child that runs fn(arg) and exits with its return value (killed after limit_s by alarm). */
pid_t proc_spawn(proc_fn fn, void *arg, int limit_s);
/* Wait for n children until timeout_ms. codes[i] = exit code, or 128 + signal, or -1 if it had to
 * be killed at the deadline. Returns the number of children that did not exit 0. */
int proc_wait_all(const pid_t *pids, int n, int timeout_ms, int *codes);
/* A child that is about to be killed for hanging: if $WSYNC_TEST_ON_HANG names a command, run it
 * with the pid as its last argument first (tests/gpu/hang_dump.sh prints where the process waits),
 * bounded by 90 s. proc_wait_all calls it; callers with their own wait loops should too. */
void proc_on_hang(pid_t pid);
/* A TCP port on 127.0.0.1 that was free a moment ago. */
int proc_free_port(void);
/* Milliseconds on the monotonic clock. */
long long proc_now_ms(void);
/* Run a shell command, capture its stdout into out (NUL-terminated; stderr is left alone);
 * returns its exit code, or -1 if it did not exit normally. */
int proc_run(const char *cmd, char *out, size_t len);
/* The last non-empty line of text parsed as JSON (a jansson json_t *, NULL if it is not JSON);
 * returned as void * so that this header needs no jansson. Free with json_decref. */
void *proc_last_json_line(const char *text);
/* Names of files in /dev/shm, newline-joined, into buf. */
void proc_list_dev_shm(char *buf, size_t len);

/* Step-by-step control of a child: a pipe each way, one byte a step. */
typedef struct {
    int to_child[2], to_parent[2];
} proc_chan_t;

/* Both pipes (aborts if it cannot make them: a test with no pipes cannot go on). */
void proc_chan_open(proc_chan_t *c);
/* Wait for one byte on fd; returns it, or -1 after ms milliseconds. */
int proc_recv_byte(int fd, int ms);
/* Write one byte to fd (aborts if it cannot). */
void proc_send_byte(int fd, char c);

#endif
