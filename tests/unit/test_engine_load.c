/* Bad input to the engine's loader: a truncated safetensors file, header offsets that overlap,
 * leave a hole or run past the end, sizes that disagree with the shape, unknown and unsupported
 * dtypes, a missing tensor, a tensor of the wrong shape, and config.json files missing required
 * fields: each a clear error naming the tensor or field, never a crash. Files are written to a
 * fresh directory from the tiny Qwen3 checkpoint. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/support/check.h"

#define MODEL_DIR WSYNC_TESTDATA "/hf_qwen3_tiny"

static char tmpdir[256];
static wsync_engine_st_t *good;   /* the real checkpoint */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL)
        buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static void put_file(const char *name, const void *data, size_t len)
{
    char path[512];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    f = fopen(path, "wb");
    CHECK(f != NULL && fwrite(data, 1, len, f) == len);
    fclose(f);
}

/* A safetensors file with the given JSON header and data area. */
static void put_safetensors(const char *header, const void *data, size_t dlen)
{
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + dlen + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (dlen > 0)
        memcpy(buf + 8 + hl, data, dlen);
    put_file("model.safetensors", buf, 8 + hl + dlen);
    free(buf);
}

/* The real checkpoint rewritten, with tensor `change` given dtype `dtype` (same byte size) or
 * shape [rows, cols] (when rows > 0), or left out (drop). */
static void put_modified(const char *change, const char *dtype, int64_t rows, int64_t cols,
                         int drop)
{
    const wsync_engine_tensor_t *t = wsync_engine_st_tensors(good);
    size_t n = wsync_engine_st_count(good), off = 0, total = 0;
    json_t *h = json_object();
    uint8_t *data;
    char *text;

    for (size_t i = 0; i < n; i++)
        total += t[i].nbytes;
    data = malloc(total);
    for (size_t i = 0; i < n; i++) {
        int is = strcmp(t[i].name, change) == 0;
        json_t *shape;
        size_t bytes = t[i].nbytes;
        if (is && drop)
            continue;
        shape = json_array();
        if (is && rows > 0) {
            json_array_append_new(shape, json_integer(rows));
            json_array_append_new(shape, json_integer(cols));
            bytes = (size_t)(rows * cols) * 2;
        } else {
            for (int d = 0; d < t[i].ndim; d++)
                json_array_append_new(shape, json_integer(t[i].shape[d]));
        }
        memset(data + off, 0, bytes);
        memcpy(data + off, t[i].data, bytes < t[i].nbytes ? bytes : t[i].nbytes);
        json_object_set_new(h, t[i].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                                    is && dtype ? dtype : t[i].dtype_name,
                                                    "shape", shape, "data_offsets",
                                                    (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    text = json_dumps(h, JSON_COMPACT);
    put_safetensors(text, data, off);
    free(text);
    free(data);
    json_decref(h);
}

static void put_config(const char *text)
{
    put_file("config.json", text, strlen(text));
}

static void use_good_config(void)
{
    size_t len;
    char *cfg = slurp(MODEL_DIR "/config.json", &len);
    CHECK(cfg != NULL);
    if (cfg != NULL)
        put_file("config.json", cfg, len);
    free(cfg);
}

/* wsync_engine_open on tmpdir fails with `want`, and the message holds every needle. */
static void expect_open_error(wsync_status_t want, const char *needle1, const char *needle2)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;
    wsync_status_t st = wsync_engine_open(tmpdir, &p, &e);
    const char *msg = wsync_engine_last_error();

    CHECK_MSG(st == want, "open returned %s, expected %s (%s)", wsync_status_name(st),
              wsync_status_name(want), msg);
    CHECK(e == NULL);
    CHECK_MSG(needle1 == NULL || strstr(msg, needle1) != NULL, "\"%s\" lacks \"%s\"", msg, needle1);
    CHECK_MSG(needle2 == NULL || strstr(msg, needle2) != NULL, "\"%s\" lacks \"%s\"", msg, needle2);
    fprintf(stderr, "  -> %s\n", msg);
    wsync_engine_free(e);
}

static void case_good_copy_loads(void)
{
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;

    use_good_config();
    put_modified("", NULL, 0, 0, 0);
    CHECK_MSG(wsync_engine_open(tmpdir, &p, &e) == WSYNC_OK, "%s", wsync_engine_last_error());
    wsync_engine_free(e);
}

static void case_truncated(void)
{
    size_t len;
    char path[512];
    char *buf = slurp(MODEL_DIR "/model.safetensors", &len);
    wsync_engine_st_t *st = NULL;

    CHECK(buf != NULL);
    if (buf == NULL)
        return;
    use_good_config();
    /* cut inside the data of the last tensor */
    put_file("model.safetensors", buf, len - 1000);
    snprintf(path, sizeof(path), "%s/model.safetensors", tmpdir);
    CHECK(wsync_engine_st_open(path, &st) == WSYNC_ERR_INVALID);
    CHECK_MSG(strstr(wsync_engine_last_error(), "truncated") != NULL &&
                  strstr(wsync_engine_last_error(), "tensor '") != NULL,
              "%s", wsync_engine_last_error());
    expect_open_error(WSYNC_ERR_INVALID, "tensor '", "past the end");
    /* cut inside the header */
    put_file("model.safetensors", buf, 100);
    expect_open_error(WSYNC_ERR_INVALID, "header length", "truncated");
    /* 5 bytes: not even a length */
    put_file("model.safetensors", buf, 5);
    expect_open_error(WSYNC_ERR_INVALID, "too short", NULL);
    free(buf);
}

static void case_bad_offsets(void)
{
    uint8_t data[64] = {0};

    use_good_config();
    /* overlap */
    put_safetensors("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[4,12]}}", data, 12);
    expect_open_error(WSYNC_ERR_INVALID, "overlap", "'b'");
    /* past the end */
    put_safetensors("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[8,24]}}", data, 16);
    expect_open_error(WSYNC_ERR_INVALID, "'b'", "past the end");
    /* a hole */
    put_safetensors("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}", data, 12);
    expect_open_error(WSYNC_ERR_INVALID, "'b'", "hole");
    /* trailing bytes */
    put_safetensors("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", data, 6);
    expect_open_error(WSYNC_ERR_INVALID, "trailing", NULL);
    /* size disagrees with the shape */
    put_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_error(WSYNC_ERR_INVALID, "'a'", "needs 12");
    /* begin after end */
    put_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", data, 8);
    expect_open_error(WSYNC_ERR_INVALID, "'a'", "data_offsets");
    /* missing field, extra field, negative dim, not JSON, duplicate key */
    put_safetensors("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(WSYNC_ERR_INVALID, "'a'", "shape");
    put_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
                    data, 4);
    expect_open_error(WSYNC_ERR_INVALID, "'a'", "'x'");
    put_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(WSYNC_ERR_INVALID, "'a'", "shape[0]");
    put_safetensors("{\"a\":{\"dtype\":\"F32\",", data, 4);
    expect_open_error(WSYNC_ERR_INVALID, "JSON", NULL);
    put_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(WSYNC_ERR_INVALID, "JSON", "duplicate");
    /* the same checks on an image in memory */
    {
        const char *h = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                        "\"__metadata__\":{\"format\":\"pt\"}}";
        uint8_t img[256] = {0};
        size_t hl = strlen(h);
        wsync_engine_st_t *st = NULL;
        img[0] = (uint8_t)hl;
        memcpy(img + 8, h, hl);
        CHECK(wsync_engine_st_parse(img, 8 + hl + 4, &st) == WSYNC_OK);
        CHECK(wsync_engine_st_count(st) == 1 && wsync_engine_st_find(st, "w") != NULL &&
              wsync_engine_st_find(st, "w")->dtype == WSYNC_DTYPE_BF16);
        wsync_engine_st_close(st);
        st = NULL;
        CHECK(wsync_engine_st_parse(img, 8 + hl + 3, &st) == WSYNC_ERR_INVALID && st == NULL);
        CHECK_MSG(strstr(wsync_engine_last_error(), "'w'") != NULL, "%s",
                  wsync_engine_last_error());
    }
}

static void case_bad_dtypes(void)
{
    use_good_config();
    /* unknown to the format */
    put_modified("model.layers.1.mlp.up_proj.weight", "Q4", 0, 0, 0);
    expect_open_error(WSYNC_ERR_INVALID, "model.layers.1.mlp.up_proj.weight", "'Q4'");
    /* a format dtype the engine cannot read, on a tensor it needs */
    put_modified("model.layers.0.self_attn.k_proj.weight", "I16", 0, 0, 0);
    expect_open_error(WSYNC_ERR_UNSUPPORTED, "model.layers.0.self_attn.k_proj.weight", "I16");
}

static void case_missing_and_misshaped_tensors(void)
{
    use_good_config();
    put_modified("lm_head.weight", NULL, 0, 0, 1);
    expect_open_error(WSYNC_ERR_NOT_FOUND, "'lm_head.weight'", NULL);
    put_modified("model.layers.1.mlp.down_proj.weight", NULL, 128, 256, 0);
    expect_open_error(WSYNC_ERR_CONFIG, "model.layers.1.mlp.down_proj.weight", "[128, 384]");
    /* no checkpoint at all */
    {
        char path[512];
        snprintf(path, sizeof(path), "%s/model.safetensors", tmpdir);
        unlink(path);
        expect_open_error(WSYNC_ERR_NOT_FOUND, "model.safetensors", NULL);
    }
}

/* config.json without a required field, or with a wrong one: the field is named */
static void case_bad_config(void)
{
    size_t len;
    char *cfg = slurp(MODEL_DIR "/config.json", &len);
    json_error_t err;
    const char *required[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                              "intermediate_size", "vocab_size"};

    CHECK(cfg != NULL);
    if (cfg == NULL)
        return;
    put_modified("", NULL, 0, 0, 0);
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        json_t *j = json_loads(cfg, 0, &err);
        json_object_del(j, required[i]);
        char *text = json_dumps(j, 0);
        put_config(text);
        expect_open_error(WSYNC_ERR_CONFIG, required[i], "config.json");
        free(text);
        json_decref(j);
    }
    {
        json_t *j = json_loads(cfg, 0, &err);
        json_object_set_new(j, "num_key_value_heads", json_string("two"));
        char *text = json_dumps(j, 0);
        put_config(text);
        expect_open_error(WSYNC_ERR_CONFIG, "num_key_value_heads", NULL);
        free(text);
        json_decref(j);
    }
    /* a config that disagrees with the checkpoint's shapes */
    {
        json_t *j = json_loads(cfg, 0, &err);
        json_object_set_new(j, "intermediate_size", json_integer(256));
        char *text = json_dumps(j, 0);
        put_config(text);
        expect_open_error(WSYNC_ERR_CONFIG, "mlp.gate_proj.weight", "[384, 128]");
        free(text);
        json_decref(j);
    }
    put_config("{\"model_type\": \"qwen3\",");
    expect_open_error(WSYNC_ERR_CONFIG, "config.json", NULL);
    free(cfg);
}

int main(void)
{
    char path[] = "/tmp/wsync-engine-load-XXXXXX";

    if (mkdtemp(path) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(tmpdir, sizeof(tmpdir), "%s", path);
    CHECK_MSG(wsync_engine_st_open(MODEL_DIR "/model.safetensors", &good) == WSYNC_OK, "%s",
              wsync_engine_last_error());
    if (good != NULL) {
        CHECK(wsync_engine_st_count(good) == 25);
        RUN(case_good_copy_loads);
        RUN(case_truncated);
        RUN(case_bad_offsets);
        RUN(case_bad_dtypes);
        RUN(case_missing_and_misshaped_tensors);
        RUN(case_bad_config);
    }
    wsync_engine_st_close(good);
    snprintf(path + 0, sizeof(path), "%s", tmpdir);
    {
        char f[512];
        snprintf(f, sizeof(f), "%s/model.safetensors", tmpdir);
        unlink(f);
        snprintf(f, sizeof(f), "%s/config.json", tmpdir);
        unlink(f);
        rmdir(tmpdir);
    }
    return check_summary();
}
