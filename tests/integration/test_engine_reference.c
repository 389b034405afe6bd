/* The bundled engine against HF transformers on testdata/hf_qwen3_tiny: the logits of every
 * prompt position within 1e-3 relative error (||a - b|| / ||b||) of reference_logits_f32.bin and
 * the greedy continuation equal to reference.json's greedy_12, at TP 1, 2 and 4 (4 replicates
 * the 2 kv heads); FP8 block weights (32 x 32) give the tokens of the bf16 engine holding the
 * dequantized weights, and the same bits whether quantized whole (TP 1) or per slice (TP 2);
 * the wsync-engine command line prints the same tokens and its JSON. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/hf_reference.h"
#include "wsync_build_config.h"
#include "tests/support/proc.h"

#define MODEL_DIR WSYNC_TESTDATA "/hf_qwen3_tiny"
#define MAX_TOK HF_REF_MAX_TOK

static hf_ref_t ref;   /* HF's run of the model */

/* Feed the prompt and compare every position's logits, then generate greedy_12. */
static void check_engine(wsync_engine_t *e, const char *what)
{
    const float *logits = NULL;
    int32_t out[MAX_TOK];
    wsync_engine_result_t res;
    double worst = 0;

    for (int i = 0; i < ref.nprompt; i++) {
        wsync_status_t st = wsync_engine_forward(e, ref.prompt[i], i, &logits);
        CHECK_MSG(st == WSYNC_OK, "%s: %s", what, wsync_engine_last_error());
        if (st != WSYNC_OK)
            return;
        double r = hf_rel_err(logits, ref.logits + i * ref.V, ref.V);
        worst = r > worst ? r : worst;
        CHECK_MSG(r < 1e-3, "%s: position %d: logits relative error %.3g", what, i, r);
    }
    CHECK_MSG(wsync_engine_generate(e, ref.prompt, ref.nprompt, ref.ngreedy, out, &res) ==
                  WSYNC_OK,
              "%s: %s", what, wsync_engine_last_error());
    CHECK(res.ntokens == ref.ngreedy && res.version == 0);
    for (int i = 0; i < ref.ngreedy; i++)
        CHECK_MSG(out[i] == ref.greedy[i], "%s: token %d is %d, HF says %d", what, i, out[i],
                  ref.greedy[i]);
    fprintf(stderr, "%s: worst logits relative error %.3g\n", what, worst);
}

static void case_tp1(void)
{
    wsync_engine_t *e = NULL;
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;

    CHECK_MSG(wsync_engine_open(MODEL_DIR, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    if (e == NULL)
        return;
    check_engine(e, "TP 1");
    /* the targets are the layout's: embed, norm, lm_head and 8 per layer */
    CHECK(wsync_engine_weight_count(e) == 3 + 2 * 8);
    /* without a wsync group, waking from level 2 reloads the weights from the files */
    CHECK_OK(wsync_engine_sleep(e, 2));
    CHECK(wsync_engine_sleeping(e) == 2);
    CHECK(wsync_engine_forward(e, ref.prompt[0], 0, NULL) == WSYNC_ERR_STATE);
    CHECK_OK(wsync_engine_wake(e));
    check_engine(e, "TP 1 after sleep level 2 and wake");
    wsync_engine_free(e);
}

typedef struct {
    int quant;
} tp_arg_t;

static int tp_rank_main(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    wsync_engine_t *e = NULL;
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    char what[32];

    (void)arg;
    p.tp_rank = rank;
    p.tp_size = tp;
    p.comm = comm;
    CHECK_MSG(wsync_engine_open(MODEL_DIR, &p, &e) == WSYNC_OK, "rank %d: %s", rank,
              wsync_engine_last_error());
    if (e == NULL)
        return 1;
    snprintf(what, sizeof(what), "TP %d rank %d", tp, rank);
    check_engine(e, what);
    wsync_engine_free(e);
    return check_failures ? 1 : 0;
}

static void run_tp(int tp)
{
    wsync_model_config_t cfg;
    wsync_engine_comm_t *comm = NULL;
    int codes[WSYNC_ENGINE_MAX_TP];

    CHECK_OK(wsync_model_config_load(MODEL_DIR "/config.json", &cfg));
    CHECK_MSG(wsync_engine_comm_create(tp, &cfg, 0, 30000, &comm) == WSYNC_OK, "%s",
              wsync_engine_last_error());
    if (comm == NULL)
        return;
    CHECK_MSG(wsync_engine_launch(tp, comm, tp_rank_main, NULL, 60, codes) == WSYNC_OK, "%s",
              wsync_engine_last_error());
    for (int r = 0; r < tp; r++)
        CHECK_MSG(codes[r] == 0, "TP %d: rank %d exited with %d", tp, r, codes[r]);
    wsync_engine_comm_free(comm);
}

static void case_tp2(void)
{
    run_tp(2);
}

static void case_tp4_replicated_kv(void)
{
    run_tp(4);
}

/* A rank that dies makes its peers fail with PEER_LOST, promptly, not hang. */
static int dying_rank_main(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    wsync_engine_t *e = NULL;
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    int32_t out[8];
    long long t0;
    wsync_status_t st;

    (void)arg;
    p.tp_rank = rank;
    p.tp_size = tp;
    p.comm = comm;
    if (wsync_engine_open(MODEL_DIR, &p, &e) != WSYNC_OK)
        return 3;
    if (rank == 1)
        _exit(7);   /* gone before the first collective */
    t0 = proc_now_ms();
    st = wsync_engine_generate(e, ref.prompt, ref.nprompt, 4, out, NULL);
    CHECK_MSG(st == WSYNC_ERR_PEER_LOST, "generate without a peer returned %s (%s)",
              wsync_status_name(st), wsync_engine_last_error());
    CHECK_MSG(strstr(wsync_engine_last_error(), "TP rank 1") != NULL,
              "the error does not name the lost rank: %s", wsync_engine_last_error());
    CHECK_MSG(proc_now_ms() - t0 < 5000, "noticed after %lld ms", proc_now_ms() - t0);
    fprintf(stderr, "rank 0 saw: %s\n", wsync_engine_last_error());
    wsync_engine_free(e);
    return check_failures ? 1 : 0;
}

static void case_dead_peer(void)
{
    wsync_model_config_t cfg;
    wsync_engine_comm_t *comm = NULL;
    int codes[2];

    CHECK_OK(wsync_model_config_load(MODEL_DIR "/config.json", &cfg));
    CHECK(wsync_engine_comm_create(2, &cfg, 0, 30000, &comm) == WSYNC_OK);
    if (comm == NULL)
        return;
    CHECK(wsync_engine_launch(2, comm, dying_rank_main, NULL, 60, codes) == WSYNC_ERR_PEER_LOST);
    CHECK_MSG(codes[0] == 0 && codes[1] == 7, "exit codes %d, %d", codes[0], codes[1]);
    wsync_engine_comm_free(comm);
}

/* ---- FP8 ---------------------------------------------------------------------------------- */

static int is_linear(const char *name)
{
    return strstr(name, "qkv_proj.weight") || strstr(name, "o_proj.weight") ||
           strstr(name, "gate_up_proj.weight") || strstr(name, "down_proj.weight");
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The FP8 engine's tokens are those of the bf16 engine whose linear weights are the FP8
 * weights dequantized (q * s, rounded to bf16). */
static void case_fp8_equals_dequantized(void)
{
    wsync_engine_params_t p8 = WSYNC_ENGINE_PARAMS_INIT, pb = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e8 = NULL, *eb = NULL;
    int32_t t8[MAX_TOK], tb[MAX_TOK];
    wsync_engine_result_t r8, rb;
    const float *l8, *lb;
    float f8[384], fb[384];
    uint8_t codes[256];
    float lut[256];
    int nlinear = 0;

    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    wsync_fp8_to_f32(codes, 256, WSYNC_DTYPE_F8E4M3FN, lut);
    p8.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
    p8.fp8_block = 32;
    CHECK_MSG(wsync_engine_open(MODEL_DIR, &p8, &e8) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK_MSG(wsync_engine_open(MODEL_DIR, &pb, &eb) == WSYNC_OK, "%s", wsync_engine_last_error());
    if (e8 == NULL || eb == NULL)
        goto out;
    CHECK(wsync_engine_weight_count(e8) == wsync_engine_weight_count(eb));
    for (size_t i = 0; i < wsync_engine_weight_count(e8); i++) {
        wsync_engine_weight_t w8, wb;
        CHECK_OK(wsync_engine_weight(e8, i, &w8));
        CHECK_OK(wsync_engine_weight(eb, i, &wb));
        CHECK(strcmp(w8.name, wb.name) == 0);
        if (!is_linear(w8.name)) {
            CHECK(w8.dtype == WSYNC_DTYPE_BF16 && w8.scales == NULL);
            continue;
        }
        nlinear++;
        CHECK_MSG(w8.dtype == WSYNC_DTYPE_F8E4M3FN && w8.block == 32 && w8.scales != NULL &&
                      wb.dtype == WSYNC_DTYPE_BF16,
                  "%s: %s", w8.name, wsync_dtype_name(w8.dtype));
        int64_t rows = w8.shape[0], cols = w8.shape[1], nbc = (cols + 31) / 32;
        CHECK(w8.nscales == (size_t)(((rows + 31) / 32) * nbc));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                float q = lut[((uint8_t *)w8.data)[r * cols + c]];
                ((uint16_t *)wb.data)[r * cols + c] = to_bf16(q * w8.scales[(r / 32) * nbc + c / 32]);
            }
    }
    CHECK(nlinear == 2 * 4);
    CHECK(wsync_engine_generate(e8, ref.prompt, ref.nprompt, ref.ngreedy, t8, &r8) == WSYNC_OK);
    CHECK(wsync_engine_generate(eb, ref.prompt, ref.nprompt, ref.ngreedy, tb, &rb) == WSYNC_OK);
    for (int i = 0; i < ref.ngreedy; i++)
        CHECK_MSG(t8[i] == tb[i], "token %d: FP8 engine %d, bf16 engine on dequantized weights %d",
                  i, t8[i], tb[i]);
    /* and their logits agree closely on the prompt */
    for (int i = 0; i < ref.nprompt; i++) {
        CHECK(wsync_engine_forward(e8, ref.prompt[i], i, &l8) == WSYNC_OK);
        memcpy(f8, l8, sizeof(f8));
        CHECK(wsync_engine_forward(eb, ref.prompt[i], i, &lb) == WSYNC_OK);
        memcpy(fb, lb, sizeof(fb));
        double r = hf_rel_err(f8, fb, 384);
        CHECK_MSG(r < 1e-2, "position %d: FP8 vs dequantized bf16 logits differ by %.3g", i, r);
    }
    fprintf(stderr, "fp8 tokens:");
    for (int i = 0; i < ref.ngreedy; i++)
        fprintf(stderr, " %d", t8[i]);
    fprintf(stderr, "\n");
out:
    wsync_engine_free(e8);
    wsync_engine_free(eb);
}

/* FP8 at TP 2: each rank's blocks are the TP-1 engine's blocks of the same rows (quantizing the
 * whole weight, then slicing, gives the slice's bits), and the tokens are the same. */
static int32_t fp8_tp1_tokens[MAX_TOK];

static int fp8_rank_main(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT, p1 = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL, *whole = NULL;
    int32_t out[MAX_TOK];

    (void)arg;
    p.tp_rank = rank;
    p.tp_size = tp;
    p.comm = comm;
    p.quant = p1.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
    p.fp8_block = p1.fp8_block = 32;
    CHECK_MSG(wsync_engine_open(MODEL_DIR, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    CHECK_MSG(wsync_engine_open(MODEL_DIR, &p1, &whole) == WSYNC_OK, "%s",
              wsync_engine_last_error());
    if (e == NULL || whole == NULL)
        return 1;
    for (size_t i = 0; i < wsync_engine_weight_count(e); i++) {
        wsync_engine_weight_t w, w1;
        CHECK_OK(wsync_engine_weight(e, i, &w));
        CHECK_OK(wsync_engine_weight(whole, i, &w1));
        if (strstr(w.name, "down_proj.weight") == NULL && strstr(w.name, "o_proj.weight") == NULL)
            continue;
        /* row-parallel: rank r holds columns [r * c, (r + 1) * c) of every row */
        int64_t rows = w.shape[0], c = w.shape[1], nbc = c / 32, nbc1 = w1.shape[1] / 32;
        for (int64_t i2 = 0; i2 < rows; i2++)
            CHECK_MSG(memcmp((uint8_t *)w.data + i2 * c, (uint8_t *)w1.data + i2 * w1.shape[1] +
                             rank * c, (size_t)c) == 0, "%s row %lld", w.name, (long long)i2);
        for (int64_t b = 0; b < rows / 32; b++)
            CHECK(memcmp(w.scales + b * nbc, w1.scales + b * nbc1 + rank * nbc,
                         (size_t)nbc * sizeof(float)) == 0);
    }
    CHECK(wsync_engine_generate(e, ref.prompt, ref.nprompt, ref.ngreedy, out, NULL) == WSYNC_OK);
    for (int i = 0; i < ref.ngreedy; i++)
        CHECK_MSG(out[i] == fp8_tp1_tokens[i], "rank %d token %d: TP 2 %d, TP 1 %d", rank, i,
                  out[i], fp8_tp1_tokens[i]);
    wsync_engine_free(e);
    wsync_engine_free(whole);
    return check_failures ? 1 : 0;
}

static void case_fp8_tp2(void)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;
    wsync_engine_comm_t *comm = NULL;
    int codes[2];

    p.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
    p.fp8_block = 32;
    CHECK(wsync_engine_open(MODEL_DIR, &p, &e) == WSYNC_OK);
    if (e == NULL)
        return;
    CHECK(wsync_engine_generate(e, ref.prompt, ref.nprompt, ref.ngreedy, fp8_tp1_tokens, NULL) ==
          WSYNC_OK);
    CHECK(wsync_engine_comm_create(2, wsync_engine_config(e), 0, 30000, &comm) == WSYNC_OK);
    wsync_engine_free(e);
    if (comm == NULL)
        return;
    CHECK(wsync_engine_launch(2, comm, fp8_rank_main, NULL, 60, codes) == WSYNC_OK);
    CHECK(codes[0] == 0 && codes[1] == 0);
    wsync_engine_comm_free(comm);
}

/* 128 x 128 blocks are refused for this model with a message naming the param. */
static void case_fp8_128_refused(void)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;

    p.quant = WSYNC_ENGINE_QUANT_FP8_BLOCK;
    CHECK(wsync_engine_open(MODEL_DIR, &p, &e) == WSYNC_ERR_CONFIG);
    CHECK(e == NULL);
    CHECK_MSG(strstr(wsync_engine_last_error(), "_proj.weight") != NULL &&
                  strstr(wsync_engine_last_error(), "128") != NULL,
              "%s", wsync_engine_last_error());
}

/* ---- the command line --------------------------------------------------------------------- */

static char out[1 << 16];

static void cli_case(int tp)
{
    char cmd[1024], ids[512] = "";
    size_t n = 0;
    json_t *j;

    for (int i = 0; i < ref.nprompt; i++)
        n += (size_t)snprintf(ids + n, sizeof(ids) - n, "%s%d", i ? "," : "", ref.prompt[i]);
    snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/wsync-engine --model " MODEL_DIR
             " --tp %d --prompt-ids %s --max-new %d --json", tp, ids, ref.ngreedy);
    CHECK_MSG(proc_run(cmd, out, sizeof(out)) == 0, "%s failed", cmd);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "no JSON from %s: %s", cmd, out);
    if (j == NULL)
        return;
    json_t *toks = json_object_get(j, "tokens");
    CHECK(json_array_size(toks) == (size_t)ref.ngreedy);
    for (int i = 0; i < ref.ngreedy; i++)
        CHECK(json_integer_value(json_array_get(toks, (size_t)i)) == ref.greedy[i]);
    CHECK(json_is_integer(json_object_get(j, "version")) &&
          json_integer_value(json_object_get(j, "version")) == 0);
    const char *sha = json_string_value(json_object_get(j, "logits_sha"));
    CHECK(sha != NULL && strlen(sha) == 16 && strspn(sha, "0123456789abcdef") == 16);
    json_decref(j);
}

static void case_cli(void)
{
    cli_case(1);
    cli_case(2);
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-engine --help", out, sizeof(out)) == 0);
    CHECK(strstr(out, "--prompt-ids") != NULL && strstr(out, "--tp") != NULL);
    {
        /* without a GPU (or without CUDA built) --device cuda is a clear error, not a crash */
        int rc = proc_run(WSYNC_BIN_DIR "/wsync-engine --model " MODEL_DIR " --prompt-ids 1 "
                          "--max-new 1 --device cuda 2>&1", out, sizeof(out));
#if WSYNC_HAVE_CUDA
        CHECK_MSG(rc == 0 || (rc == 1 && strstr(out, "no CUDA device") != NULL), "rc %d: %s", rc,
                  out);
#else
        CHECK_MSG(rc == 2 && strstr(out, "built without CUDA") != NULL, "rc %d: %s", rc, out);
#endif
    }
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-engine --model " MODEL_DIR " --prompt-ids 1 --max-new 1 "
              "--bogus 2>&1", out, sizeof(out)) == 2);
    CHECK_MSG(strstr(out, "--bogus") != NULL, "%s", out);
    CHECK(proc_run(WSYNC_BIN_DIR "/wsync-engine --model " MODEL_DIR " --prompt-ids 1,400 --max-new 1 "
              "2>&1", out, sizeof(out)) == 1);
    CHECK_MSG(strstr(out, "400") != NULL, "%s", out);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (hf_ref_load(MODEL_DIR, &ref) != 0)
        return check_summary();
    RUN(case_tp1);
    RUN(case_tp2);
    RUN(case_tp4_replicated_kv);
    RUN(case_dead_peer);
    RUN(case_fp8_equals_dequantized);
    RUN(case_fp8_tp2);
    RUN(case_fp8_128_refused);
    RUN(case_cli);
    return check_summary();
}
