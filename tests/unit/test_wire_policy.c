/* When ipc takes FP8 on the wire with fp8_wire 1 (core/wire_policy.c): disaggregated groups
 * always, colocated ones never (their receivers quantize from the shards in place), with the
 * reason the explanation prints. */
#include <stdio.h>
#include <string.h>

#include "core/wire_policy.h"
#include "tests/support/check.h"

static void case_disaggregated_always(void)
{
    char why[300] = "";
    CHECK(wsync_ipc_wire_pays(0, 4, why, sizeof(why)) == 1);
    CHECK(wsync_ipc_wire_pays(0, 2, why, sizeof(why)) == 1);
    CHECK_MSG(why[0] == '\0', "no reason when taken: %s", why);
}

static void case_colocated_never(void)
{
    char why[300];
    /* one, two and four GPUs: 4 x H100, Qwen3-8B FSDP-4 -> TP-4, 6.04 ms in place against 6.62
     * staged */
    for (int g = 1; g <= 8; g *= 2) {
        char want[64];
        snprintf(want, sizeof(want), "ipc colocated on %d GPU(s)", g);
        CHECK(wsync_ipc_wire_pays(1, g, why, sizeof(why)) == 0);
        CHECK_MSG(strstr(why, want) != NULL && strstr(why, "quantize from the shards in place"),
                  "%s", why);
    }
    /* no room for the reason is not an error */
    CHECK(wsync_ipc_wire_pays(1, 4, NULL, 0) == 0);
    CHECK(wsync_ipc_wire_pays(1, 1, why, 0) == 0);
}

int main(void)
{
    RUN(case_disaggregated_always);
    RUN(case_colocated_never);
    return check_summary();
}
