/* core/doorbell.c: the page is what a second mapping (through /proc/<pid>/fd) sees, a wait wakes
 * when another process rings, keeps its deadline when nobody does, and returns the group's
 * failure recorded in the inbox; an offer that does not match the group is refused by name. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/doorbell.h"
#include "core/util.h"
#include "tests/support/check.h"
#include "wsync/wsync.h"

static void test_attach_sees_the_same_page(void)
{
    wsync_bells_t *own = NULL, *other = NULL;

    CHECK_OK(wsync_bells_create(2, 3, &own));
    if (own == NULL)
        return;
    CHECK_OK(wsync_bells_attach((uint32_t)getpid(), own->fd, own->bytes, 2, 3, &other));
    if (other != NULL) {
        /* a receiver's line written through one mapping is read through the other */
        atomic_store(&wsync_bells_line(other, 0, 2)->version, 77);
        atomic_store(&wsync_bells_line(other, 1, 1)->attached, 1);
        CHECK(atomic_load(&wsync_bells_line(own, 0, 2)->version) == 77);
        CHECK(atomic_load(&wsync_bells_line(own, 1, 1)->attached) == 1);
        CHECK(atomic_load(&wsync_bells_line(own, 0, 0)->version) == 0);
        /* lines do not overlap: sender 1 is not receiver 0 */
        CHECK((void *)wsync_bells_line(own, 1, 1) != (void *)wsync_bells_line(own, 0, 0));
    }
    wsync_bells_free(other);
    /* an offer for another group's shape is refused, naming the sizes */
    other = NULL;
    CHECK_ST(wsync_bells_attach((uint32_t)getpid(), own->fd, own->bytes, 2, 4, &other),
             WSYNC_ERR_PROTOCOL);
    CHECK_ERR_HAS("2 senders and 4 receivers");
    CHECK(other == NULL);
    CHECK_ST(wsync_bells_attach((uint32_t)getpid(), 9999, own->bytes, 2, 3, &other),
             WSYNC_ERR_IO);
    CHECK_ERR_HAS("/fd/9999");
    wsync_bells_free(own);
}

static void test_ring_wakes_another_process(void)
{
    wsync_bells_t *b = NULL;
    wsync_inbox_t inbox;

    CHECK_OK(wsync_bells_create(1, 1, &b));
    if (b == NULL)
        return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* the child rings version 1 after 200 ms */
        usleep(200000);
        atomic_store(&b->hdr->version, 5);
        atomic_store(&b->hdr->begin_seq, 1);
        wsync_bell_ring(&b->hdr->begin_seq);
        _exit(0);
    }
    wsync_inbox_init(&inbox);
    long long t0 = (long long)wsync_now_ms();
    CHECK_OK(wsync_bell_wait(&b->hdr->begin_seq, 1, wsync_now_ms() + 10000, &inbox));
    long long took = (long long)wsync_now_ms() - t0;
    CHECK(atomic_load(&b->hdr->version) == 5);
    CHECK_MSG(took >= 150 && took < 5000, "woke after %lld ms (rung at 200)", took);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    wsync_inbox_destroy(&inbox);
    wsync_bells_free(b);
}

static void test_wait_keeps_its_deadline_and_sees_failure(void)
{
    wsync_bells_t *b = NULL;
    wsync_inbox_t inbox;

    CHECK_OK(wsync_bells_create(1, 1, &b));
    if (b == NULL)
        return;
    wsync_inbox_init(&inbox);
    /* nobody rings: TIMEOUT at the deadline, not before and not long after */
    long long t0 = (long long)wsync_now_ms();
    CHECK_ST(wsync_bell_wait(&b->hdr->done_seq, 1, wsync_now_ms() + 300, &inbox),
             WSYNC_ERR_TIMEOUT);
    long long took = (long long)wsync_now_ms() - t0;
    CHECK_MSG(took >= 290 && took < 1500, "the 300 ms wait took %lld ms", took);
    /* a sequence already reached (also across the wrap of the counter) returns at once */
    atomic_store(&b->hdr->done_seq, 0u - 2u);
    CHECK_OK(wsync_bell_wait(&b->hdr->done_seq, 0u - 3u, wsync_now_ms() + 1, &inbox));
    CHECK_ST(wsync_bell_wait(&b->hdr->done_seq, 1, wsync_now_ms() + 50, &inbox),
             WSYNC_ERR_TIMEOUT);
    /* the group failed: the wait returns that failure and its text, well before its deadline */
    wsync_inbox_fail(&inbox, WSYNC_ERR_PEER_LOST, "lost receiver 3 (pid 42 on vm)");
    t0 = (long long)wsync_now_ms();
    CHECK_ST(wsync_bell_wait(&b->hdr->done_seq, 1, wsync_now_ms() + 10000, &inbox),
             WSYNC_ERR_PEER_LOST);
    CHECK_ERR_HAS("lost receiver 3");
    CHECK_MSG((long long)wsync_now_ms() - t0 < 1000, "the failure took %lld ms to show",
              (long long)wsync_now_ms() - t0);
    wsync_inbox_destroy(&inbox);
    wsync_bells_free(b);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(test_attach_sees_the_same_page);
    RUN(test_ring_wakes_another_process);
    RUN(test_wait_keeps_its_deadline_and_sees_failure);
    return check_summary();
}
