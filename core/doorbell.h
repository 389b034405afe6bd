/* Internal: doorbells, the per-version control plane between participants on the coordinator's
 * host (issue 19, part 3). Each version's BEGIN (every sender began it), COMMIT (a receiver has
 * it) and DONE (every receiver has it) cost two TCP round trips through the coordinator's thread
 * and each participant's progress thread, about 0.1 ms a version even with one receiver. With
 * doorbells they are words in one page of shared memory (a memfd the coordinator creates) that
 * participants set, and futexes they sleep on:
 *   - a sender stores the version it begins in its line and counts itself into `nbegin`; the
 *     last sender of a version (the count reaches nsenders x k for the k-th version) checks that
 *     every sender began the same version and no receiver left, publishes it in `version`, sets
 *     `begin_seq` = k and wakes every receiver (one futex wake for all of them);
 *   - a receiver sleeps on `begin_seq` until it reaches its next k, receives, stores the version
 *     in its line and counts itself into `ncommit`; the last one sets `done_seq` = k and wakes
 *     the senders, which sleep on it.
 * The coordinator reads the lines when it must say on whom the group waits, and marks a receiver
 * that left. Every wait has its deadline and wakes at least every WSYNC_BELL_SLICE_MS to look
 * at the member's inbox: a lost peer is still found by heartbeats and connection ends, and the
 * group's failure reaches a waiter as before (the member's progress thread also rings the page
 * when the failure arrives, so that no slice is waited out).
 *
 * The page is offered in WELCOME to participants on the coordinator's host; they map it through
 * /proc/<coordinator pid>/fd/<fd> and mark their line attached. At the plan, the coordinator
 * turns the page on (mode 1) only when every participant attached, the scheme is synchronous
 * (not the store), and fault injection is off (the faults suite drives the messages); otherwise
 * the messages go as before. WSYNC_DOORBELL=0 on any side turns doorbells off. A wait polls a
 * few times, never sched_yield()s (on a busy core that costs a scheduler tick, see doorbell.c),
 * then sleeps on the futex in slices: the member's progress thread kicks the page
 * when a failure arrives; the slice bounds the one race (a kick between the waiter's look at
 * its inbox and its sleep), and costs an idle receiver ten wakeups a second. */
#ifndef WSYNC_CORE_DOORBELL_H
#define WSYNC_CORE_DOORBELL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/loop.h"

#define WSYNC_BELL_MAGIC 0x4c4c4542u  /* "BELL" */
#define WSYNC_BELL_SLICE_MS 100

/* The page: this header, then one line per sender (rank order), then one per receiver. Words
 * that are written often sit on lines of their own. */
typedef struct {
    _Atomic uint32_t magic, nsenders, nreceivers, mode;
    uint8_t pad0[48];
    _Atomic uint32_t begin_seq;      /* futex: versions begun since the group was set up */
    uint8_t pad1[60];
    _Atomic uint64_t version;        /* the version begin_seq counts last */
    _Atomic uint64_t begin_ns;       /* wsync_now_ns() when it began (CLOCK_MONOTONIC: one clock
                                        for every process of the host) */
    _Atomic uint32_t nbegin;         /* senders' begins, summed over versions */
    uint8_t pad2[44];
    _Atomic uint32_t done_seq;       /* futex: versions every receiver committed */
    uint8_t pad3[60];
    _Atomic uint32_t ncommit;        /* receivers' commits, summed over versions */
    uint8_t pad4[4];
    _Atomic uint64_t commit_ns;      /* when the last receiver committed version */
    uint8_t pad5[48];
} wsync_bell_hdr_t;

typedef struct {
    _Atomic uint32_t attached;       /* 1: the participant mapped the page */
    _Atomic uint32_t left;           /* 1: the coordinator saw it leave (receivers) */
    _Atomic uint64_t version;        /* sender: last version begun; receiver: last committed */
    uint8_t pad[48];
} wsync_bell_line_t;

typedef struct wsync_bells {
    wsync_bell_hdr_t *hdr;           /* the mapping */
    size_t bytes;
    int fd;                          /* the memfd (creator only), else -1 */
    uint32_t nsenders, nreceivers;
} wsync_bells_t;

/* 1 unless WSYNC_DOORBELL is "0" (or "off") or faults are injected (WSYNC_FAULT set). */
int wsync_bells_wanted(void);
/* Create the page for a group (the coordinator). */
wsync_status_t wsync_bells_create(uint32_t nsenders, uint32_t nreceivers, wsync_bells_t **out);
/* Map the page the coordinator (process pid) holds as descriptor fd, checking its size and
 * header against the group's. */
wsync_status_t wsync_bells_attach(uint32_t pid, int32_t fd, uint64_t bytes, uint32_t nsenders,
                                  uint32_t nreceivers, wsync_bells_t **out);
/* Unmap (and close). NULL is a no-op. */
void wsync_bells_free(wsync_bells_t *b);

/* Line of sender `rank` (role sender) or receiver `rank`. */
wsync_bell_line_t *wsync_bells_line(const wsync_bells_t *b, int sender, uint32_t rank);

/* Set *word (already stored by the caller) and wake everyone sleeping on it. */
void wsync_bell_ring(_Atomic uint32_t *word);
/* Wake the sleepers of both sequence words, without changing them (a failure to look at). */
void wsync_bells_kick(wsync_bells_t *b);
/* Sleep until *word reaches `target` (sequence order, wrapping), the inbox records the group's
 * failure (returned, with its text), or deadline_ms passes (WSYNC_ERR_TIMEOUT, no last error:
 * the caller says what it waited for). */
wsync_status_t wsync_bell_wait(_Atomic uint32_t *word, uint32_t target, int64_t deadline_ms,
                               wsync_inbox_t *inbox);

/* The member's side of one version (core/member.c), once m->bells_on. Sender: begin version
 * v (the last sender to begin checks the group and wakes the receivers), then, after the
 * scheme's push, wait until every receiver committed it (until deadline_ms). Receiver: wait for
 * the next version to begin (*v: which), and commit it. Errors name the version and the peers;
 * TIMEOUT carries no last error (the caller says what it waited for). */
#include "core/objects.h"
wsync_status_t wsync_member_bell_begin(wsync_member_t *m, uint64_t v);
wsync_status_t wsync_member_bell_done(wsync_member_t *m, int64_t deadline_ms);
wsync_status_t wsync_member_bell_next(wsync_member_t *m, int64_t deadline_ms, uint64_t *v);
void wsync_member_bell_commit(wsync_member_t *m, uint64_t v);

#endif
