/* A strict safetensors reader: the header parsed with jansson, the data left in a read-only
 * mapping (never copied). Every check names the tensor or field that failed it. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/internal.h"

#define ST_MAX_HEADER (100u << 20)   /* the format's own cap on the header */

struct wsync_engine_st {
    void *map;                      /* wsync_engine_st_open's mapping, or NULL */
    size_t map_len;
    wsync_engine_tensor_t *t;       /* sorted by offset */
    size_t n;
    char *strings;                  /* names and dtype names, NUL-separated */
};

static const struct {
    const char *name;
    size_t size;
    wsync_dtype_t dtype;            /* 0: no wsync dtype (the engine cannot use it) */
} st_dtypes[] = {
    {"BF16", 2, WSYNC_DTYPE_BF16}, {"F16", 2, WSYNC_DTYPE_F16},
    {"F32", 4, WSYNC_DTYPE_F32},   {"F8_E4M3", 1, WSYNC_DTYPE_F8E4M3FN},
    {"F8_E5M2", 1, WSYNC_DTYPE_F8E5M2}, {"U8", 1, WSYNC_DTYPE_U8},
    {"BOOL", 1, (wsync_dtype_t)0}, {"I8", 1, (wsync_dtype_t)0}, {"I16", 2, (wsync_dtype_t)0},
    {"U16", 2, (wsync_dtype_t)0},  {"I32", 4, (wsync_dtype_t)0}, {"U32", 4, (wsync_dtype_t)0},
    {"F64", 8, (wsync_dtype_t)0},  {"I64", 8, (wsync_dtype_t)0}, {"U64", 8, (wsync_dtype_t)0},
};

typedef struct {
    const char *key;
    json_t *val;
    uint64_t begin, end;
} entry_t;

static int by_begin(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int get_offset(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Check one entry against the data area; fills t except name and data. */
static wsync_status_t parse_entry(const entry_t *e, size_t data_len, wsync_engine_tensor_t *t,
                                  size_t *dtype_index)
{
    json_t *dt = json_object_get(e->val, "dtype"), *shape = json_object_get(e->val, "shape");
    const char *key;
    json_t *v;
    size_t k, esize = 0;
    uint64_t count = 1;

    json_object_foreach(e->val, key, v) {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return wse_err(WSYNC_ERR_INVALID, "tensor '%s': unknown field '%s'", e->key, key);
    }
    if (!json_is_string(dt))
        return wse_err(WSYNC_ERR_INVALID, "tensor '%s': field 'dtype' is %s", e->key,
                       dt == NULL ? "missing" : "not a string");
    for (k = 0; k < sizeof(st_dtypes) / sizeof(st_dtypes[0]); k++)
        if (strcmp(st_dtypes[k].name, json_string_value(dt)) == 0)
            break;
    if (k == sizeof(st_dtypes) / sizeof(st_dtypes[0]))
        return wse_err(WSYNC_ERR_INVALID, "tensor '%s': unknown dtype '%s'", e->key,
                       json_string_value(dt));
    esize = st_dtypes[k].size;
    *dtype_index = k;
    if (!json_is_array(shape))
        return wse_err(WSYNC_ERR_INVALID, "tensor '%s': field 'shape' is %s", e->key,
                       shape == NULL ? "missing" : "not an array");
    if (json_array_size(shape) > WSYNC_MAX_DIMS)
        return wse_err(WSYNC_ERR_INVALID, "tensor '%s': %zu dimensions (at most %d supported)",
                       e->key, json_array_size(shape), WSYNC_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *s = json_array_get(shape, (size_t)d);
        if (!json_is_integer(s) || json_integer_value(s) < 0)
            return wse_err(WSYNC_ERR_INVALID, "tensor '%s': shape[%d] is not a non-negative "
                           "integer", e->key, d);
        t->shape[d] = (int64_t)json_integer_value(s);
        if (t->shape[d] != 0 && count > UINT64_MAX / 16 / (uint64_t)t->shape[d])
            return wse_err(WSYNC_ERR_INVALID, "tensor '%s': shape overflows", e->key);
        count *= (uint64_t)t->shape[d];
    }
    if (e->end - e->begin != count * esize)
        return wse_err(WSYNC_ERR_INVALID, "tensor '%s': data_offsets [%llu, %llu) hold %llu bytes, "
                       "but %s of that shape needs %llu", e->key, (unsigned long long)e->begin,
                       (unsigned long long)e->end, (unsigned long long)(e->end - e->begin),
                       st_dtypes[k].name, (unsigned long long)(count * esize));
    if (e->end > data_len)
        return wse_err(WSYNC_ERR_INVALID, "tensor '%s': data_offsets [%llu, %llu) run past the end "
                       "of the data area (%zu bytes; is the file truncated?)", e->key,
                       (unsigned long long)e->begin, (unsigned long long)e->end, data_len);
    t->dtype = st_dtypes[k].dtype;
    t->nbytes = (size_t)(e->end - e->begin);
    return WSYNC_OK;
}

static wsync_status_t parse(const uint8_t *buf, size_t len, const char *what,
                            wsync_engine_st_t **out)
{
    uint64_t hlen = 0;
    json_error_t jerr;
    json_t *root = NULL;
    entry_t *ents = NULL;
    size_t n = 0, strbytes = 0, data_len;
    const uint8_t *data;
    wsync_engine_st_t *st = NULL;
    wsync_status_t rc;
    const char *key;
    json_t *val;

    if (len < 8)
        return wse_err(WSYNC_ERR_INVALID, "%s: %zu bytes, too short for a safetensors header", what,
                       len);
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > len - 8)
        return wse_err(WSYNC_ERR_INVALID, "%s: header length %llu does not fit the file (%zu bytes"
                       "%s)", what, (unsigned long long)hlen, len,
                       hlen > ST_MAX_HEADER ? "; the format caps it at 100 MiB" : "; truncated?");
    data = buf + 8 + hlen;
    data_len = len - 8 - (size_t)hlen;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return wse_err(WSYNC_ERR_INVALID, "%s: header is not valid JSON (line %d, column %d: %s)",
                       what, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        rc = wse_err(WSYNC_ERR_INVALID, "%s: header is not a JSON object", what);
        goto out;
    }
    ents = calloc(json_object_size(root) + 1, sizeof(*ents));
    if (ents == NULL) {
        rc = wse_err(WSYNC_ERR_NOMEM, "%s: no memory for the header", what);
        goto out;
    }
    json_object_foreach(root, key, val) {
        json_t *offs;
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(val)) {
                rc = wse_err(WSYNC_ERR_INVALID, "%s: __metadata__ is not an object", what);
                goto out;
            }
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = wse_err(WSYNC_ERR_INVALID, "%s: __metadata__ field '%s' is not a string",
                                 what, mk);
                    goto out;
                }
            }
            continue;
        }
        if (!json_is_object(val)) {
            rc = wse_err(WSYNC_ERR_INVALID, "%s: tensor '%s': entry is not an object", what, key);
            goto out;
        }
        offs = json_object_get(val, "data_offsets");
        if (!json_is_array(offs) || json_array_size(offs) != 2 ||
            get_offset(json_array_get(offs, 0), &ents[n].begin) != 0 ||
            get_offset(json_array_get(offs, 1), &ents[n].end) != 0 || ents[n].end < ents[n].begin) {
            rc = wse_err(WSYNC_ERR_INVALID, "%s: tensor '%s': field 'data_offsets' is %s", what,
                         key, offs == NULL ? "missing" : "not [begin, end] with 0 <= begin <= end");
            goto out;
        }
        ents[n].key = key;
        ents[n].val = val;
        strbytes += strlen(key) + 1;
        n++;
    }
    qsort(ents, n, sizeof(*ents), by_begin);

    st = calloc(1, sizeof(*st));
    if (st == NULL || (st->t = calloc(n + 1, sizeof(*st->t))) == NULL ||
        (st->strings = malloc(strbytes + 1)) == NULL) {
        rc = wse_err(WSYNC_ERR_NOMEM, "%s: no memory for %zu tensors", what, n);
        goto out;
    }
    {
        char *s = st->strings;
        uint64_t covered = 0;
        for (size_t i = 0; i < n; i++) {
            wsync_engine_tensor_t *t = &st->t[i];
            size_t di = 0;
            rc = parse_entry(&ents[i], data_len, t, &di);
            if (rc != WSYNC_OK) {
                char detail[1536];
                snprintf(detail, sizeof(detail), "%s", wsync_engine_last_error());
                /* keep the status text once, prefix the file */
                const char *d = strchr(detail, ':');
                rc = wse_err(rc, "%s: %s", what, d != NULL ? d + 2 : detail);
                goto out;
            }
            /* sorted by begin: each must start where the previous ended (no overlap, no hole) */
            if (ents[i].begin < covered) {
                rc = wse_err(WSYNC_ERR_INVALID, "%s: tensor '%s': data_offsets [%llu, %llu) overlap "
                             "tensor '%s' [%llu, %llu)", what, ents[i].key,
                             (unsigned long long)ents[i].begin, (unsigned long long)ents[i].end,
                             ents[i - 1].key, (unsigned long long)ents[i - 1].begin,
                             (unsigned long long)ents[i - 1].end);
                goto out;
            }
            if (ents[i].begin > covered) {
                rc = wse_err(WSYNC_ERR_INVALID, "%s: tensor '%s' starts at byte %llu of the data "
                             "area, leaving bytes [%llu, %llu) unused (a hole)", what, ents[i].key,
                             (unsigned long long)ents[i].begin, (unsigned long long)covered,
                             (unsigned long long)ents[i].begin);
                goto out;
            }
            covered = ents[i].end;
            strcpy(s, ents[i].key);
            t->name = s;
            s += strlen(s) + 1;
            t->dtype_name = st_dtypes[di].name;
            t->data = data + ents[i].begin;
        }
        if (covered != data_len) {
            rc = wse_err(WSYNC_ERR_INVALID, "%s: the tensors end at byte %llu of the data area, "
                         "which has %zu bytes (%zu trailing bytes)", what,
                         (unsigned long long)covered, data_len, data_len - (size_t)covered);
            goto out;
        }
    }
    st->n = n;
    *out = st;
    st = NULL;
    rc = WSYNC_OK;
out:
    if (st != NULL) {
        free(st->t);
        free(st->strings);
        free(st);
    }
    free(ents);
    json_decref(root);
    return rc;
}

wsync_status_t wsync_engine_st_parse(const void *buf, size_t len, wsync_engine_st_t **out)
{
    if (buf == NULL || out == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_st_parse: NULL argument");
    return parse(buf, len, "safetensors image", out);
}

wsync_status_t wsync_engine_st_open(const char *path, wsync_engine_st_t **out)
{
    struct stat sb;
    void *map;
    int fd;
    wsync_status_t rc;
    wsync_engine_st_t *st = NULL;

    if (path == NULL || out == NULL)
        return wse_err(WSYNC_ERR_INVALID, "wsync_engine_st_open: NULL argument");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wse_err(WSYNC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return wse_err(WSYNC_ERR_IO, "%s is not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return wse_err(WSYNC_ERR_INVALID, "%s: %lld bytes, too short for a safetensors header",
                       path, (long long)sb.st_size);
    }
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return wse_err(WSYNC_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    rc = parse(map, (size_t)sb.st_size, path, &st);
    if (rc != WSYNC_OK) {
        munmap(map, (size_t)sb.st_size);
        return rc;
    }
    st->map = map;
    st->map_len = (size_t)sb.st_size;
    *out = st;
    return WSYNC_OK;
}

size_t wsync_engine_st_count(const wsync_engine_st_t *st)
{
    return st != NULL ? st->n : 0;
}

const wsync_engine_tensor_t *wsync_engine_st_tensors(const wsync_engine_st_t *st)
{
    return st != NULL ? st->t : NULL;
}

const wsync_engine_tensor_t *wsync_engine_st_find(const wsync_engine_st_t *st, const char *name)
{
    if (st == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0)
            return &st->t[i];
    return NULL;
}

void wsync_engine_st_close(wsync_engine_st_t *st)
{
    if (st == NULL)
        return;
    if (st->map != NULL)
        munmap(st->map, st->map_len);
    free(st->t);
    free(st->strings);
    free(st);
}
