/* Internal: whether the ipc scheme should take FP8 on the wire (fp8_wire 1, "where it pays").
 * A pure decision on figures the coordinator has, kept apart so that tests can put the measured
 * cases to it without GPUs. */
#ifndef WSYNC_CORE_WIRE_POLICY_H
#define WSYNC_CORE_WIRE_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* Colocated ipc takes FP8 on the wire only where its bytes are at most this share of the plain
 * bytes: staging FP8 chunks costs a pack and a copy, repaid only by a large enough saving. */
#define WSYNC_IPC_WIRE_MAX_SHARE 0.70

/* 1: ipc stages FP8 chunks. 0: its receivers quantize from the shards in place, and `why` (may
 * be NULL) says why in one line. colocated: some sender shares a GPU with some receiver; ngpus:
 * the distinct GPUs of the group; plain_bytes, wire_bytes: what the plan's segments move without
 * and with FP8 on the wire. */
int wsync_ipc_wire_pays(int colocated, int ngpus, uint64_t plain_bytes, uint64_t wire_bytes,
                        char *why, size_t whylen);

#endif
