/* The fp8_wire sender param and WSYNC_FP8_WIRE: values 0, 1, 2 taken, anything else refused with
 * an error naming the param or the variable (core/config.c), before any group starts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/check.h"
#include "wsync/wsync.h"

/* Create a one-sender group's rank 0 with fp8_wire = v (-1: unset) and return the status. */
static wsync_status_t create_with(int v)
{
    wsync_ctx_t *ctx = NULL;
    wsync_sender_t *s = NULL;
    wsync_sender_params_t p = WSYNC_SENDER_PARAMS_INIT;
    wsync_status_t st;

    p.coordinator = "127.0.0.1:0";
    p.rank = 0;
    p.nranks = 1;
    p.nreceivers = 1;
    p.fp8_wire = v;
    if (wsync_ctx_create(NULL, &ctx) != WSYNC_OK)
        return WSYNC_ERR_INTERNAL;
    st = wsync_sender_create(ctx, &p, &s);
    wsync_sender_free(s);
    wsync_ctx_free(ctx);
    return st;
}

static void case_param_values(void)
{
    unsetenv("WSYNC_FP8_WIRE");
    {
        wsync_sender_params_t init = WSYNC_SENDER_PARAMS_INIT;
        CHECK(init.fp8_wire == -1);
    }
    CHECK_OK(create_with(-1));
    CHECK_OK(create_with(0));
    CHECK_OK(create_with(1));
    CHECK_OK(create_with(2));
    CHECK_ST(create_with(3), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("fp8_wire = 3");
}

static void case_env_values(void)
{
    setenv("WSYNC_FP8_WIRE", "2", 1);
    CHECK_OK(create_with(-1));
    setenv("WSYNC_FP8_WIRE", "yes", 1);
    CHECK_ST(create_with(-1), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("WSYNC_FP8_WIRE");
    CHECK_OK(create_with(0));      /* a param set in code wins over the variable */
    setenv("WSYNC_FP8_WIRE", "3", 1);
    CHECK_ST(create_with(-1), WSYNC_ERR_INVALID);
    CHECK_ERR_HAS("WSYNC_FP8_WIRE");
    unsetenv("WSYNC_FP8_WIRE");
}

int main(void)
{
    RUN(case_param_values);
    RUN(case_env_values);
    return check_summary();
}
