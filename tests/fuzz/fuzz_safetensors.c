/* Fuzz target: the engine's safetensors reader (engine/safetensors.c wsync_engine_st_parse).
 *
 * Input: the beginning of a safetensors image (8-byte header length, JSON header, maybe some
 * data), then a u32 (the last 4 bytes): how many zero bytes follow it in the image handed to the
 * parser, at most 4 MiB. So a seed can be a real checkpoint's header alone (the tiny Qwen3's is
 * 2.6 kB for 1 MB of data), and the fuzzer can still make every offset check pass or fail.
 *
 * Properties for an accepted image: the tensors tile the data area in offset order, each inside
 * the image with nbytes = shape x dtype size, names unique and found by wsync_engine_st_find. */
#include "engine/engine.h"
#include "tests/fuzz/fuzz.h"

#define MAX_PAD (4u << 20)

static size_t size_of(const char *name)
{
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U8", 1},
             {"BOOL", 1}, {"I8", 1},  {"I16", 2}, {"U16", 2},     {"I32", 4},     {"U32", 4},
             {"F64", 8},  {"I64", 8}, {"U64", 8}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(t[i].name, name) == 0)
            return t[i].size;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *image;
    wsync_engine_st_t *st = NULL;
    size_t len, pad;

    if (size < 4)
        return 0;
    pad = (size_t)(data[size - 4] | data[size - 3] << 8 | data[size - 2] << 16 |
                   (uint32_t)data[size - 1] << 24) % (MAX_PAD + 1);
    len = size - 4 + pad;
    /* an exact-size copy, so that ASan sees any read past the image; calloc, since a large
     * zeroed block costs nothing until touched and the parser never reads the data area */
    image = calloc(1, len ? len : 1);
    FUZZ_ASSERT(image != NULL, "no memory");
    memcpy(image, data, size - 4);

    if (wsync_engine_st_parse(image, len, &st) == WSYNC_OK) {
        size_t n = wsync_engine_st_count(st);
        const wsync_engine_tensor_t *t = wsync_engine_st_tensors(st);
        const uint8_t *end = image + len, *next = NULL;
        for (size_t i = 0; i < n; i++) {
            uint64_t count = 1;
            size_t esz = size_of(t[i].dtype_name);
            FUZZ_ASSERT(t[i].name != NULL && esz > 0, "tensor %zu", i);
            FUZZ_ASSERT(t[i].ndim >= 0 && t[i].ndim <= WSYNC_MAX_DIMS, "ndim %d", t[i].ndim);
            for (int d = 0; d < t[i].ndim; d++)
                FUZZ_ASSERT(t[i].shape[d] >= 0 &&
                            !__builtin_mul_overflow(count, (uint64_t)t[i].shape[d], &count),
                            "tensor %s shape", t[i].name);
            FUZZ_ASSERT(count * esz == t[i].nbytes, "tensor %s: %zu bytes for %llu x %zu",
                        t[i].name, t[i].nbytes, (unsigned long long)count, esz);
            const uint8_t *p = t[i].data;
            FUZZ_ASSERT(p >= image + 8 && p <= end && t[i].nbytes <= (size_t)(end - p),
                        "tensor %s lies outside the image", t[i].name);
            FUZZ_ASSERT(next == NULL || p == next, "tensor %s leaves a hole or overlaps",
                        t[i].name);
            next = p + t[i].nbytes;
            FUZZ_ASSERT(wsync_engine_st_find(st, t[i].name) == &t[i],
                        "tensor %s is not found by name (duplicate?)", t[i].name);
            if (t[i].nbytes > 0) {
                /* touch the first and last byte: both must be inside the image */
                volatile uint8_t a = p[0], b = p[t[i].nbytes - 1];
                (void)a;
                (void)b;
            }
        }
        FUZZ_ASSERT(n == 0 || next == end, "the tensors end %td bytes before the image",
                    end - next);
        FUZZ_ASSERT(wsync_engine_st_find(st, "no such tensor \x01") == NULL, "found a ghost");
        wsync_engine_st_close(st);
    } else {
        FUZZ_ASSERT(st == NULL, "a failed parse wrote its output");
    }
    free(image);
    return 0;
}
