/* wsync-demo as a user runs it: `--trainers 2 --tp 2 --steps 3` passes in bf16 and FP8 block
 * (in place), and in shadow mode at TP 4 with 3 trainers; from testdata's checkpoints, the dense
 * Qwen3 in FP8, the Qwen3-MoE at EP 2 and the DeepSeek-V3 (MLA, shared expert) at TP 2 in FP8
 * and EP 2; one line per step says it matched; the JSON summary agrees; options it cannot
 * honour are refused with a clear message. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/support/check.h"
#include "wsync_build_config.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

static char out[1 << 16];

/* Run the demo with `args`; every one of `steps` step lines must say yes. */
static void demo(const char *args, int steps, const char *quant)
{
    char cmd[512];
    int rc, lines = 0;
    json_t *j;

    snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/wsync-demo %s --json", args);
    rc = proc_run(cmd, out, sizeof(out));
    fprintf(stderr, "$ %s\n%s", cmd, out);
    CHECK_MSG(rc == 0, "%s exited with %d", cmd, rc);
    for (int s = 1; s <= steps; s++) {
        char head[32];
        const char *p = out;
        int found = 0;
        snprintf(head, sizeof(head), "\n%4d %8d ", s, s);
        while ((p = strstr(p, head)) != NULL) {
            const char *eol = strchr(p + 1, '\n');
            size_t n = eol ? (size_t)(eol - p) : strlen(p);
            char line[512];
            snprintf(line, sizeof(line), "%.*s", (int)n, p + 1);
            CHECK_MSG(strstr(line, " yes ") != NULL && strstr(line, "ipc") != NULL,
                      "step %d: %s", s, line);
            found = 1;
            lines++;
            break;
        }
        CHECK_MSG(found, "no line for step %d", s);
    }
    CHECK(lines == steps);
    CHECK(strstr(out, "steps matched") != NULL);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "no JSON summary");
    if (j == NULL)
        return;
    CHECK(json_is_true(json_object_get(j, "ok")));
    CHECK(json_integer_value(json_object_get(j, "matched")) == steps);
    CHECK(json_integer_value(json_object_get(j, "steps")) == steps);
    CHECK(strcmp(json_string_value(json_object_get(j, "quant")), quant) == 0);
    CHECK(json_number_value(json_object_get(j, "bytes")) > 0);
    json_decref(j);
}

static void case_bf16(void)
{
    demo("--trainers 2 --tp 2 --steps 3", 3, "none");
}

static void case_fp8_block(void)
{
    demo("--trainers 2 --tp 2 --steps 3 --quant fp8-block", 3, "fp8-block");
}

static void case_shadow_tp4(void)
{
    demo("--trainers 3 --tp 4 --steps 3 --mode shadow", 3, "none");
}

static void case_from_checkpoint(void)
{
    demo("--trainers 2 --tp 2 --steps 2 --model " WSYNC_TESTDATA "/hf_qwen3_tiny --quant fp8-block "
         "--fp8-block 32", 2, "fp8-block");
}

static void case_moe_checkpoints(void)
{
    demo("--trainers 2 --tp 2 --ep 2 --steps 2 --model " WSYNC_TESTDATA "/hf_qwen3_moe_tiny", 2,
         "none");
    CHECK(strstr(out, "8 experts") != NULL && strstr(out, "\"ep\": 2") != NULL);
    demo("--trainers 2 --tp 2 --steps 2 --model " WSYNC_TESTDATA "/hf_deepseek_v3_tiny --quant "
         "fp8-block --fp8-block 16", 2, "fp8-block");
    CHECK(strstr(out, "multi-head latent attention") != NULL);
    demo("--trainers 3 --tp 2 --ep 2 --steps 2 --model " WSYNC_TESTDATA "/hf_deepseek_v3_tiny",
         2, "none");
}

static void case_refusals(void)
{
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-demo --help", out, sizeof(out)) == 0);
    CHECK(strstr(out, "--trainers") != NULL && strstr(out, "--scheme") != NULL &&
          strstr(out, "--quant") != NULL && strstr(out, "--model") != NULL);
#if WSYNC_HAVE_CUDA
    /* with CUDA built, a machine without a GPU says so (one with GPUs runs the demo) */
    {
        int rc = proc_run(WSYNC_BIN_DIR "/wsync-demo --device cuda --steps 1 --timeout 20 2>&1",
                          out, sizeof(out));
        CHECK_MSG(rc == 0 || (rc == 1 && strstr(out, "no CUDA device") != NULL), "rc %d: %s", rc,
                  out);
    }
#else
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-demo --device cuda 2>&1", out, sizeof(out)) == 2);
    CHECK_MSG(strstr(out, "built without CUDA") != NULL, "%s", out);
#endif
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-demo --steps zero 2>&1", out, sizeof(out)) == 2);
    CHECK_MSG(strstr(out, "--steps") != NULL, "%s", out);
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-demo --frobnicate 2>&1", out, sizeof(out)) == 2);
    CHECK_MSG(strstr(out, "--frobnicate") != NULL, "%s", out);
    /* 4 heads cannot be split 8 ways: refused before anything starts, naming the numbers */
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-demo --tp 8 2>&1", out, sizeof(out)) == 1);
    CHECK_MSG(strstr(out, "8") != NULL && strstr(out, "head") != NULL, "%s", out);
    /* expert parallelism spans the engine's TP ranks */
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-demo --tp 2 --ep 4 2>&1", out, sizeof(out)) == 2);
    CHECK_MSG(strstr(out, "--ep 4") != NULL && strstr(out, "--tp (2)") != NULL, "%s", out);
}

int main(void)
{
    RUN(case_bf16);
    RUN(case_fp8_block);
    RUN(case_shadow_tp4);
    RUN(case_from_checkpoint);
    RUN(case_moe_checkpoints);
    RUN(case_refusals);
    return check_summary();
}
