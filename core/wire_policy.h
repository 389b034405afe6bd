/* Internal: whether the ipc scheme should take FP8 on the wire (fp8_wire 1, "where it pays").
 * A pure decision on figures the coordinator has, kept apart so that tests can put the measured
 * cases to it without GPUs. */
#ifndef WSYNC_CORE_WIRE_POLICY_H
#define WSYNC_CORE_WIRE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#define WSYNC_IPC_WIRE_MIN_GPUS 4                       /* colocated groups stage from here on */
#define WSYNC_IPC_WIRE_MAX_TENTHS 9ull                  /* ... when moving at most 0.9 x the bytes */
#define WSYNC_DEFAULT_BUCKET_BYTES (256ull << 20)         /* the senders' default bucket */
#define WSYNC_IPC_WIRE_BUCKET_BYTES (2048ull << 20)       /* colocated staging's, by default */

/* 1: ipc stages FP8 chunks (disaggregated groups: every byte crosses a link; colocated groups
 * on WSYNC_IPC_WIRE_MIN_GPUS GPUs or more whose wired plan moves at most
 * WSYNC_IPC_WIRE_MAX_TENTHS tenths of the plain plan's bytes). 0: otherwise; their receivers quantize
 * from the shards in place, and `why` (may be NULL) says why in one line. colocated: some
 * sender shares a GPU with some receiver; ngpus: the distinct GPUs of the group; plain, wire:
 * the bytes a version moves without and with FP8 on the wire. */
int wsync_ipc_wire_pays(int colocated, int ngpus, uint64_t plain, uint64_t wire, char *why,
                        size_t whylen);

/* The bucket size to compile a plan with FP8 on the wire for ipc: a group colocated on
 * WSYNC_IPC_WIRE_MIN_GPUS GPUs or more whose senders kept the default bucket (`asked`) gets
 * WSYNC_IPC_WIRE_BUCKET_BYTES, so that a sender's two device slots are seldom reused within a
 * version (four receivers reading each slot held it in lockstep); any other, what was asked
 * (fewer GPUs were measured only with the default). */
uint64_t wsync_ipc_wire_bucket(int colocated, int ngpus, uint64_t asked);
#endif
