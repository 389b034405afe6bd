/* Internal: whether the ipc scheme should take FP8 on the wire (fp8_wire 1, "where it pays").
 * A pure decision on figures the coordinator has, kept apart so that tests can put the measured
 * cases to it without GPUs. */
#ifndef WSYNC_CORE_WIRE_POLICY_H
#define WSYNC_CORE_WIRE_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* 1: ipc stages FP8 chunks (disaggregated groups: every byte crosses a link). 0: colocated; its
 * receivers quantize from the shards in place, and `why` (may be NULL) says so in one line.
 * colocated: some sender shares a GPU with some receiver; ngpus: the distinct GPUs of the
 * group. */
int wsync_ipc_wire_pays(int colocated, int ngpus, char *why, size_t whylen);
#endif
