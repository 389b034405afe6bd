/* When colocated ipc takes FP8 on the wire with fp8_wire 1 (core/wire_policy.c): the cases
 * measured on H200s put to the rule, with the reason it gives when it says no. */
#include <stdio.h>
#include <string.h>

#include "core/wire_policy.h"
#include "tests/support/check.h"

#define GB 1000000000ull

static void case_disaggregated_always(void)
{
    char why[300] = "";
    /* every byte crosses: taken whatever the share, even where little is saved */
    CHECK(wsync_ipc_wire_pays(0, 4, 16382 * GB / 1000, 9438 * GB / 1000, why, sizeof(why)) == 1);
    CHECK(wsync_ipc_wire_pays(0, 2, 100, 95, why, sizeof(why)) == 1);
    CHECK_MSG(why[0] == '\0', "no reason when taken: %s", why);
}

static void case_few_gpus(void)
{
    char why[300];
    /* Qwen3-8B colocated on one and on two GPUs: plain was faster (13.9 / 8.8 ms against
     * 15.4 / 9.5 ms), although the bytes fall to 0.58 x */
    CHECK(wsync_ipc_wire_pays(1, 1, 16382 * GB / 1000, 9438 * GB / 1000, why, sizeof(why)) == 0);
    CHECK_MSG(strstr(why, "ipc colocated on 1 GPU(s)") != NULL, "%s", why);
    CHECK(wsync_ipc_wire_pays(1, 2, 16382 * GB / 1000, 9438 * GB / 1000, why, sizeof(why)) == 0);
    CHECK_MSG(strstr(why, "ipc colocated on 2 GPU(s)") != NULL, "%s", why);
}

static void case_share(void)
{
    char why[300];
    /* 4 GPUs, dense Qwen3-8B: 0.576 x the bytes, 5.6 ms against 6.5 plain: taken */
    CHECK(wsync_ipc_wire_pays(1, 4, 16383320064ull, 9438936064ull, why, sizeof(why)) == 1);
    /* 4 GPUs, Qwen3-30B-A3B EP-4: 0.827 x, 54.7 ms against 47.5 plain: left to the receivers */
    CHECK(wsync_ipc_wire_pays(1, 4, 61141008384ull, 50573942784ull, why, sizeof(why)) == 0);
    CHECK_MSG(strstr(why, "0.827 x the bytes") != NULL && strstr(why, "0.70 x") != NULL, "%s",
              why);
    /* the boundary is inclusive */
    CHECK(wsync_ipc_wire_pays(1, 4, 1000, 700, why, sizeof(why)) == 1);
    CHECK(wsync_ipc_wire_pays(1, 4, 1000, 701, why, sizeof(why)) == 0);
    /* nothing to move: nothing saved */
    CHECK(wsync_ipc_wire_pays(1, 8, 0, 0, why, sizeof(why)) == 0);
    /* no room for the reason is not an error */
    CHECK(wsync_ipc_wire_pays(1, 4, 1000, 900, NULL, 0) == 0);
    CHECK(wsync_ipc_wire_pays(1, 1, 1000, 500, why, 0) == 0);
}

int main(void)
{
    RUN(case_disaggregated_always);
    RUN(case_few_gpus);
    RUN(case_share);
    return check_summary();
}
