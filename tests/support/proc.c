#include "tests/support/proc.h"

#include <dirent.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/check.h"

#if defined(__SANITIZE_ADDRESS__)
#define PROC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PROC_ASAN 1
#endif
#endif
#ifdef PROC_ASAN
#include <sanitizer/lsan_interface.h>
#endif

pid_t proc_spawn(proc_fn fn, void *arg, int limit_s)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm((unsigned)limit_s);
        int rc = fn(arg);
        if (check_failures != 0 && rc == 0)
            rc = 1;
#ifdef PROC_ASAN
        /* _exit skips LeakSanitizer's exit-time check: run it here, so that what a child leaks
         * fails the test as it would in a process that returns from main */
        if (__lsan_do_recoverable_leak_check() != 0 && rc == 0)
            rc = 1;
#endif
        fflush(NULL);
        _exit(rc);
    }
    return pid;
}

long long proc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void proc_on_hang(pid_t pid)
{
    const char *cmd = getenv("WSYNC_TEST_ON_HANG");
    char line[1200];

    if (cmd == NULL || cmd[0] == '\0')
        return;
    snprintf(line, sizeof(line), "timeout -k 5 90 %s %d 1>&2", cmd, (int)pid);
    fflush(NULL);
    if (system(line) != 0)
        fprintf(stderr, "note: '%s' did not succeed\n", line);
}

int proc_wait_all(const pid_t *pids, int n, int timeout_ms, int *codes)
{
    long long deadline = proc_now_ms() + timeout_ms;
    int left = n, bad = 0;

    for (int i = 0; i < n; i++)
        codes[i] = -2;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int status;
            if (codes[i] != -2)
                continue;
            if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                left--;
            }
        }
        if (left == 0)
            break;
        if (proc_now_ms() > deadline) {
            for (int i = 0; i < n; i++) {
                if (codes[i] == -2) {
                    fprintf(stderr, "child %d (pid %d) still running at the deadline: killed\n", i,
                            (int)pids[i]);
                    proc_on_hang(pids[i]);
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    codes[i] = -1;
                }
            }
            break;
        }
        usleep(10000);
    }
    for (int i = 0; i < n; i++)
        if (codes[i] != 0)
            bad++;
    return bad;
}

int proc_free_port(void)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

void proc_list_dev_shm(char *buf, size_t len)
{
    DIR *d = opendir("/dev/shm");
    size_t n = 0;
    struct dirent *e;

    buf[0] = '\0';
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        int w = snprintf(buf + n, len - n, "%s\n", e->d_name);
        if (w < 0 || (size_t)w >= len - n)
            break;
        n += (size_t)w;
    }
    closedir(d);
}

int proc_run(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    size_t n = 0;

    out[0] = '\0';
    if (p == NULL)
        return -1;
    while (n + 1 < len) {
        size_t got = fread(out + n, 1, len - n - 1, p);
        if (got == 0)
            break;
        n += got;
    }
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void *proc_last_json_line(const char *text)
{
    const char *end = text + strlen(text), *start;
    json_error_t err;

    while (end > text && end[-1] == '\n')
        end--;
    start = end;
    while (start > text && start[-1] != '\n')
        start--;
    return json_loadb(start, (size_t)(end - start), 0, &err);
}

void proc_chan_open(proc_chan_t *c)
{
    if (pipe(c->to_child) != 0 || pipe(c->to_parent) != 0)
        abort();
}

int proc_recv_byte(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    char c;
    if (poll(&p, 1, ms) != 1 || read(fd, &c, 1) != 1)
        return -1;
    return (unsigned char)c;
}

void proc_send_byte(int fd, char c)
{
    if (write(fd, &c, 1) != 1)
        abort();
}
