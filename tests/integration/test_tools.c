/* The command-line tools as a user runs them: wsync-info lists shm as available and explains the
 * scheme choice; wsync-bench moves a small version between processes and reports JSON (dense and
 * mixture-of-experts shapes, delta versions, and refuses a shape that cannot fit); every tool
 * answers --help and names a bad option. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/support/check.h"
#include "tests/support/proc.h"
#include "wsync/wsync.h"

static char out[1 << 16];

static void case_info_lists_shm(void)
{
    int rc = proc_run(WSYNC_BIN_DIR "/wsync-info --json", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-info --json exited %d", rc);
    json_t *j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-info --json printed no JSON: %s", out);
    if (j == NULL)
        return;
    json_t *transports = json_object_get(j, "transports");
    int found = 0;
    for (size_t i = 0; i < json_array_size(transports); i++) {
        json_t *t = json_array_get(transports, i);
        if (strcmp(json_string_value(json_object_get(t, "name")), "shm") != 0)
            continue;
        found = 1;
        CHECK(json_is_true(json_object_get(t, "compiled")));
        CHECK_MSG(json_is_true(json_object_get(t, "available")), "shm unavailable: %s",
                  json_string_value(json_object_get(t, "reason")));
    }
    CHECK_MSG(found, "no shm transport in %s", out);
    /* every scheme and transport says why, either way */
    json_t *schemes = json_object_get(j, "schemes");
    CHECK(json_array_size(schemes) == 3);
    for (size_t i = 0; i < json_array_size(schemes); i++)
        CHECK(strlen(json_string_value(json_object_get(json_array_get(schemes, i), "reason"))) > 0);
    json_decref(j);
}

static void case_info_explains(void)
{
    int rc = proc_run(WSYNC_BIN_DIR "/wsync-info --explain --senders 2 --receivers 3", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-info --explain exited %d", rc);
    CHECK_MSG(strstr(out, "ipc: chosen: all 5 participants share host") != NULL, "%s", out);
    CHECK_MSG(strstr(out, "nccl: refused:") != NULL, "%s", out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-info --explain --mem cuda", out, sizeof(out));
    CHECK_MSG(strstr(out, "ipc: refused: some shards or targets are in CUDA memory") != NULL, "%s",
              out);
}

static void case_bench_small_json(void)
{
    int rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --scheme ipc --mem host --receivers 2 --bytes 8M "
                               "--bucket-mb 1 --iters 2 --json 2>/dev/null", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench exited %d: %s", rc, out);
    json_t *j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench printed no JSON: %s", out);
    if (j == NULL)
        return;
    CHECK(strcmp(json_string_value(json_object_get(j, "scheme")), "ipc") == 0);
    CHECK(json_integer_value(json_object_get(j, "bytes")) == 8 << 20);
    double gbps = json_number_value(json_object_get(j, "gbps_per_receiver"));
    double base = json_number_value(json_object_get(j, "baseline_gbps"));
    double ratio = json_number_value(json_object_get(j, "ratio"));
    double secs = json_number_value(json_object_get(j, "seconds"));
    CHECK(gbps > 0 && base > 0 && secs > 0);
    /* the figures agree with each other (GB = 1e9 bytes) */
    CHECK_MSG(ratio > 0.99 * gbps / base && ratio < 1.01 * gbps / base, "ratio %g, %g / %g", ratio,
              gbps, base);
    CHECK_MSG(gbps > 0.99 * 8388608 / 1e9 / secs && gbps < 1.01 * 8388608 / 1e9 / secs,
              "%g GB/s for %g s", gbps, secs);
    json_decref(j);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --scheme ipc --mem host --receivers 1 --bytes 4M "
                           "--source private --iters 1 2>/dev/null", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --source private exited %d: %s", rc, out);
}

/* A model run over host memory: FSDP-2 -> 2 replicas of TP-2 with FP8-block targets; every
 * receiver checks its bytes against the host's reference, and the replicas agree. FP8 on the
 * wire (the default) moves the tiny shape's FP8 targets as codes and scales: its every chunk
 * lies on whole 128 x 128 blocks, so one byte per element and 4 per 16,384; with --fp8-wire off
 * they move as bf16. */
static void case_bench_model_host(void)
{
    int rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc "
                               "--senders 2 --tp 2 --replicas 2 --quant fp8-block --iters 2 --json "
                               "2>/dev/null", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --model-shape tiny exited %d: %s", rc, out);
    json_t *j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench printed no JSON: %s", out);
    if (j == NULL)
        return;
    CHECK(json_is_true(json_object_get(j, "correct")));
    CHECK(json_integer_value(json_object_get(j, "receivers")) == 4);
    CHECK(json_integer_value(json_object_get(j, "version")) == 3);
    json_int_t moved = json_integer_value(json_object_get(j, "bytes_moved"));
    json_int_t plain = json_integer_value(json_object_get(j, "param_dtype_bytes"));
    double secs = json_number_value(json_object_get(j, "seconds"));
    double gbps = json_number_value(json_object_get(j, "gbps"));
    /* 2 replicas each take the whole model once (2 x its bf16 bytes), and each TP rank its
     * own copy of the norms */
    json_int_t model = 2 * json_integer_value(json_object_get(j, "param_elems"));
    CHECK_MSG(plain >= 2 * model && plain < 2 * model + model / 100,
              "param_dtype_bytes %lld of %lld", (long long)plain, (long long)model);
    /* tiny (hidden 256, 4 heads and 2 kv of 128, intermediate 512, 2 layers): q, k, v, o,
     * gate, up, down are 786,432 elements a layer; 2 replicas take them all */
    const json_int_t fp8_elems = 2 * 2 * 786432, fp8_wire = fp8_elems + fp8_elems / 16384 * 4;
    CHECK(json_is_true(json_object_get(j, "fp8_wire")));
    CHECK_MSG(json_integer_value(json_object_get(j, "fp8_wire_bytes")) == fp8_wire,
              "fp8_wire_bytes %lld, reference %lld",
              (long long)json_integer_value(json_object_get(j, "fp8_wire_bytes")),
              (long long)fp8_wire);
    CHECK_MSG(moved == plain - 2 * fp8_elems + fp8_wire, "bytes_moved %lld, param dtype %lld",
              (long long)moved, (long long)plain);
    CHECK(json_integer_value(json_object_get(j, "wire_bytes")) == moved);
    CHECK_MSG(gbps > 0.99 * (double)moved / 1e9 / secs && gbps < 1.01 * (double)moved / 1e9 / secs,
              "%g GB/s for %g s", gbps, secs);
    json_t *d = json_object_get(j, "digests");
    CHECK(json_array_size(d) == 4);
    if (json_array_size(d) == 4) /* receiver k*T+t is TP rank t of replica k */
        CHECK(strcmp(json_string_value(json_array_get(d, 0)),
                     json_string_value(json_array_get(d, 2))) == 0 &&
              strcmp(json_string_value(json_array_get(d, 0)),
                     json_string_value(json_array_get(d, 1))) != 0);
    json_decref(j);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc "
                               "--senders 2 --tp 2 --quant fp8-block --fp8-wire off --iters 1 "
                               "--json 2>/dev/null", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --fp8-wire off exited %d: %s", rc, out);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench printed no JSON: %s", out);
    if (j != NULL) {
        CHECK(json_is_true(json_object_get(j, "correct")));
        CHECK(json_is_false(json_object_get(j, "fp8_wire")));
        CHECK(json_integer_value(json_object_get(j, "fp8_wire_bytes")) == 0);
        CHECK(json_integer_value(json_object_get(j, "bytes_moved")) ==
              json_integer_value(json_object_get(j, "param_dtype_bytes")));
        json_decref(j);
    }
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc "
                           "--fp8-wire maybe 2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "--fp8-wire") != NULL, "--fp8-wire maybe: exit %d, %s", rc,
              out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape qwen3-9b --mem host --scheme ipc "
                           "2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "qwen3-8b") != NULL, "unknown shape: exit %d, %s", rc, out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --mem cuda --scheme nccl --receivers 1 --bytes 1M "
                           "2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "--model-shape") != NULL, "flat cuda: exit %d, %s", rc, out);
}

/* Delta versions (wsync-bench --delta): FSDP-2 -> TP-2 of the tiny shape, the same versions with
 * delta on and then off, every version checked on every receiver against its own fp32 masters;
 * the encoded bytes are at least the changed elements' values and less than the full version's.
 * Over the store it reports the floor of the reader's pass, on its pool's threads. With
 * --delta-mode auto a one-host ipc group resolves off and sends every version whole. Bad
 * combinations are refused, named. */
static void case_bench_delta_host(void)
{
    /* WSYNC_DELTA_CUTOFF=1: at lr 1e-5 (a seventh of the weights changing) the host default (0.2)
     * would send every chunk plain; 1 keeps the encodings that are smaller than the plain bytes,
     * so the encoded path is what this case checks (test_delta_cutoff checks the default) */
    int rc = proc_run("WSYNC_DELTA_CUTOFF=1 " WSYNC_BIN_DIR "/wsync-bench --model-shape tiny "
                      "--mem host --scheme ipc --senders 2 --tp 2 --delta --lr 1e-5 --iters 2 "
                      "--json 2>/dev/null", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --delta exited %d: %s", rc, out);
    json_t *j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench --delta printed no JSON: %s", out);
    if (j == NULL)
        return;
    CHECK(json_is_true(json_object_get(j, "delta")));
    CHECK(json_is_true(json_object_get(j, "correct")));
    CHECK(json_number_value(json_object_get(j, "lr")) == 1e-5);
    CHECK(strcmp(json_string_value(json_object_get(j, "delta_resolved")), "on") == 0);
    double changed = json_number_value(json_object_get(j, "changed_fraction"));
    double wire = (double)json_integer_value(json_object_get(j, "wire_bytes"));
    double full = (double)json_integer_value(json_object_get(j, "full_wire_bytes"));
    double params = (double)json_integer_value(json_object_get(j, "param_bytes"));
    /* lr 1e-5 on N(0, 0.02^2) bf16 weights changes about a seventh of them per step */
    CHECK_MSG(changed > 0.05 && changed < 0.3, "changed fraction %g", changed);
    CHECK_MSG(full >= params && wire >= changed * params && wire < full,
              "wire %g bytes, full %g, params %g bytes, changed %g", wire, full, params, changed);
    CHECK(json_number_value(json_object_get(j, "seconds")) > 0 &&
          json_number_value(json_object_get(j, "full_seconds")) > 0);
    CHECK(json_array_size(json_object_get(j, "times")) == 2 &&
          json_array_size(json_object_get(j, "full_times")) == 2);
    /* the CPU codec on the senders' own version pairs: the applied bytes are the new ones, its
     * ratio is what its seconds say, and it sends at least the changed values */
    CHECK(json_is_true(json_object_get(j, "codec_correct")));
    double enc = json_number_value(json_object_get(j, "encode_seconds"));
    double app = json_number_value(json_object_get(j, "apply_seconds"));
    double rd = json_number_value(json_object_get(j, "read_both_seconds"));
    double cr = json_number_value(json_object_get(j, "codec_ratio"));
    CHECK_MSG(enc > 0 && app > 0 && rd > 0, "encode %g, apply %g, read both %g s", enc, app, rd);
    CHECK_MSG(rd > 0 && cr > 0.999 * (enc + app) / rd && cr < 1.001 * (enc + app) / rd,
              "codec ratio %g, (encode %g + apply %g) / read both %g", cr, enc, app, rd);
    CHECK(strcmp(json_string_value(json_object_get(j, "read_both")), "a memcpy of one version") ==
          0);
    double cb = (double)json_integer_value(json_object_get(j, "codec_bytes"));
    CHECK_MSG(cb >= changed * params && cb < full, "codec bytes %g, changed %g of %g bytes", cb,
              changed, params);
    /* the read floor is the store's (its reader's pool): none over ipc */
    CHECK(json_is_null(json_object_get(j, "read_floor_seconds")));
    json_decref(j);

    /* the store on host memory: the floor of the reader's pass on as many threads as its pool,
     * and its ratio to the full version's seconds */
    rc = proc_run("WSYNC_DELTA_THREADS=3 " WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem "
                  "host --scheme store --transport ofi --delta --iters 1 --json 2>/dev/null", out,
                  sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --delta over the store exited %d: %s", rc, out);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench --delta over the store printed no JSON: %s", out);
    if (j != NULL) {
        double rf = json_number_value(json_object_get(j, "read_floor_seconds"));
        double rr = json_number_value(json_object_get(j, "read_floor_ratio"));
        double fs = json_number_value(json_object_get(j, "full_seconds"));
        CHECK(json_is_true(json_object_get(j, "correct")));
        CHECK(json_integer_value(json_object_get(j, "read_floor_threads")) == 3);
        CHECK_MSG(rf > 0 && fs > 0 && rr > 0.999 * rf / fs && rr < 1.001 * rf / fs,
                  "read floor %g s, ratio %g, full %g s", rf, rr, fs);
        json_decref(j);
    }

    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc --delta "
                           "--delta-mode auto --iters 1 --json 2>/dev/null", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --delta --delta-mode auto exited %d: %s", rc, out);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench --delta-mode auto printed no JSON: %s", out);
    if (j != NULL) {
        CHECK(json_is_true(json_object_get(j, "correct")));
        CHECK(strcmp(json_string_value(json_object_get(j, "delta_resolved")), "off") == 0);
        CHECK(json_integer_value(json_object_get(j, "wire_bytes")) ==
              json_integer_value(json_object_get(j, "full_wire_bytes")));
        json_decref(j);
    }

    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc --delta "
                           "--quant fp8-block 2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "FP8 targets always take full bytes") != NULL,
              "--delta with fp8: exit %d, %s", rc, out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc --lr 1e-5 "
                           "2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "only with --delta") != NULL, "--lr alone: exit %d, %s", rc,
              out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc --delta "
                           "--lr 0 2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "'0' is not a learning rate") != NULL, "--lr 0: exit %d, %s",
              rc, out);
}

/* Mixture-of-experts shapes over host memory: FSDP-2 -> EP-2 (whole experts per receiver, 3-D
 * FusedMoE targets), -> TP-2 with FP8-block targets (every expert split), and DeepSeek's MLA,
 * shared experts and f32 router bias with EP-2 and FP8; every receiver's bytes are checked
 * against the host's reference. A shape that cannot fit is refused before anything runs,
 * naming the bytes. */
static void case_bench_moe_host(void)
{
    int rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny-moe --mem host --scheme ipc "
                               "--senders 2 --ep 2 --iters 2 --json 2>&1", out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench --model-shape tiny-moe --ep 2 exited %d: %s", rc, out);
    json_t *j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL, "wsync-bench printed no JSON: %s", out);
    if (j != NULL) {
        CHECK(json_is_true(json_object_get(j, "correct")));
        CHECK(json_integer_value(json_object_get(j, "ep")) == 2);
        CHECK(json_integer_value(json_object_get(j, "experts")) == 8);
        CHECK(strcmp(json_string_value(json_object_get(j, "model_type")), "qwen3_moe") == 0);
        /* one replica: every byte of the model lands once, and the router and norms once more
         * (each rank holds them whole), well under 1% of it */
        json_int_t moved = json_integer_value(json_object_get(j, "bytes_moved"));
        json_int_t model = json_integer_value(json_object_get(j, "param_bytes"));
        CHECK_MSG(moved > model && moved < model + model / 100, "bytes_moved %lld of %lld",
                  (long long)moved, (long long)model);
        json_t *d = json_object_get(j, "digests");
        CHECK(json_array_size(d) == 2 &&
              strcmp(json_string_value(json_array_get(d, 0)),
                     json_string_value(json_array_get(d, 1))) != 0);
        json_decref(j);
    }
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny-moe --mem host --scheme ipc "
                           "--senders 2 --tp 2 --quant fp8-block --iters 1 --json 2>&1",
                  out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench tiny-moe TP-2 fp8-block exited %d: %s", rc, out);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL && json_is_true(json_object_get(j, "correct")) &&
                  json_integer_value(json_object_get(j, "ep")) == 1,
              "tiny-moe TP-2 fp8-block: %s", out);
    json_decref(j);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny-deepseek --mem host --scheme ipc "
                           "--senders 2 --ep 2 --quant fp8-block --iters 1 --json 2>&1",
                  out, sizeof(out));
    CHECK_MSG(rc == 0, "wsync-bench tiny-deepseek EP-2 fp8-block exited %d: %s", rc, out);
    j = (json_t *)proc_last_json_line(out);
    CHECK_MSG(j != NULL && json_is_true(json_object_get(j, "correct")) &&
                  strcmp(json_string_value(json_object_get(j, "model_type")), "deepseek_v3") == 0,
              "tiny-deepseek EP-2 fp8-block: %s", out);
    json_decref(j);

    /* DeepSeek-V3 is 1.3 TB of bf16: senders and receivers together cannot be in host memory */
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape deepseek-v3 --mem host --scheme ipc "
                           "--senders 2 --ep 2 2>&1", out, sizeof(out));
    CHECK_MSG(rc == 2 && strstr(out, "deepseek-v3 FSDP-2 -> 1 replica x EP-2 does not fit in "
                                     "host memory: it needs ") != NULL &&
                  strstr(out, "available (MemAvailable)") != NULL,
              "deepseek-v3 in host memory: exit %d, %s", rc, out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny --mem host --scheme ipc --ep 2 "
                           "2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "--ep: shape 'tiny' has no experts") != NULL,
              "--ep on a dense shape: exit %d, %s", rc, out);
    rc = proc_run(WSYNC_BIN_DIR "/wsync-bench --model-shape tiny-moe --mem host --scheme ipc "
                           "--ep 2 --tp 4 2>&1", out, sizeof(out));
    CHECK_MSG(rc != 0 && strstr(out, "--ep 2 with --tp 4") != NULL, "--ep 2 --tp 4: exit %d, %s",
              rc, out);
}

static void case_help_and_bad_options(void)
{
    static const char *tools[] = {"wsync-info", "wsync-bench", "wsync-plan"};
    char cmd[512];

    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
        snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/%s --help", tools[i]);
        int rc = proc_run(cmd, out, sizeof(out));
        CHECK_MSG(rc == 0 && strstr(out, "usage") != NULL, "%s --help: exit %d, %s", tools[i], rc,
                  out);
        snprintf(cmd, sizeof(cmd), WSYNC_BIN_DIR "/%s --no-such-option 2>&1", tools[i]);
        rc = proc_run(cmd, out, sizeof(out));
        CHECK_MSG(rc != 0 && strstr(out, "--no-such-option") != NULL,
                  "%s with a bad option: exit %d, %s", tools[i], rc, out);
    }
}

int main(void)
{
    RUN(case_info_lists_shm);
    RUN(case_info_explains);
    RUN(case_bench_small_json);
    RUN(case_bench_model_host);
    RUN(case_bench_moe_host);
    RUN(case_bench_delta_host);
    RUN(case_help_and_bad_options);
    return check_summary();
}
