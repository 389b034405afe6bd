/* Element types: sizes and names. */
#include "wsync/wsync.h"

#include <string.h>
#include <strings.h>

static const struct {
    wsync_dtype_t dtype;
    size_t size;
    const char *name;
    const char *aliases[3];
} dtypes[] = {
    {WSYNC_DTYPE_BF16, 2, "bf16", {"bfloat16", "BF16", NULL}},
    {WSYNC_DTYPE_F16, 2, "f16", {"float16", "F16", "half"}},
    {WSYNC_DTYPE_F32, 4, "f32", {"float32", "F32", "float"}},
    {WSYNC_DTYPE_F8E4M3FN, 1, "f8e4m3fn", {"float8_e4m3fn", "F8_E4M3", "e4m3"}},
    {WSYNC_DTYPE_F8E5M2, 1, "f8e5m2", {"float8_e5m2", "F8_E5M2", "e5m2"}},
    {WSYNC_DTYPE_U8, 1, "u8", {"uint8", "U8", NULL}},
};

size_t wsync_dtype_size(wsync_dtype_t dtype)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (dtypes[i].dtype == dtype)
            return dtypes[i].size;
    return 0;
}

const char *wsync_dtype_name(wsync_dtype_t dtype)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (dtypes[i].dtype == dtype)
            return dtypes[i].name;
    return "?";
}

wsync_status_t wsync_dtype_parse(const char *name, wsync_dtype_t *dtype)
{
    if (name == NULL || dtype == NULL)
        return WSYNC_ERR_INVALID;
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
        if (strcasecmp(name, dtypes[i].name) == 0) {
            *dtype = dtypes[i].dtype;
            return WSYNC_OK;
        }
        for (int a = 0; a < 3 && dtypes[i].aliases[a] != NULL; a++) {
            if (strcmp(name, dtypes[i].aliases[a]) == 0) {
                *dtype = dtypes[i].dtype;
                return WSYNC_OK;
            }
        }
    }
    return WSYNC_ERR_INVALID;
}
