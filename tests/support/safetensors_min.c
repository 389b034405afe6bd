#include "tests/support/safetensors_min.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u * 1024u * 1024u)   /* the reference implementation's cap */

struct st_file {
    void *map;              /* st_open's mapping, or NULL */
    size_t map_len;
    const uint8_t *data;    /* the data area */
    size_t data_len;
    st_tensor_t *t;
    size_t n;
    char *names;            /* all names, NUL-separated */
};

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err != NULL && errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
    {"F64", 8},  {"I64", 8}, {"U64", 8},
};

static size_t dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return dtypes[i].size;
    return 0;
}

static int get_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    const st_tensor_t *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Parse one tensor entry into *t (name set by the caller). */
static int parse_entry(const char *name, json_t *v, st_tensor_t *t, size_t data_len, char *err,
                       size_t errlen)
{
    json_t *dt, *shape, *offs;
    uint64_t count = 1, b, e;

    if (!json_is_object(v))
        return fail(err, errlen, "tensor '%s': entry is not an object", name);
    if (json_object_size(v) != 3)
        return fail(err, errlen, "tensor '%s': expected exactly dtype, shape, data_offsets", name);
    dt = json_object_get(v, "dtype");
    shape = json_object_get(v, "shape");
    offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
        return fail(err, errlen, "tensor '%s': dtype, shape or data_offsets missing or mistyped",
                    name);
    if (strlen(json_string_value(dt)) >= sizeof(t->dtype) ||
        (t->elem_size = dtype_size(json_string_value(dt))) == 0)
        return fail(err, errlen, "tensor '%s': unknown dtype '%s'", name, json_string_value(dt));
    strcpy(t->dtype, json_string_value(dt));
    if (json_array_size(shape) > ST_MAX_DIMS)
        return fail(err, errlen, "tensor '%s': %zu dims, at most %d", name,
                    json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        uint64_t n;
        if (get_u64(json_array_get(shape, (size_t)d), &n) != 0 || n > (uint64_t)INT64_MAX)
            return fail(err, errlen, "tensor '%s': shape[%d] is not a non-negative integer", name,
                        d);
        t->shape[d] = (int64_t)n;
        if (n != 0 && count > UINT64_MAX / n)
            return fail(err, errlen, "tensor '%s': shape overflows", name);
        count *= n;
    }
    if (json_array_size(offs) != 2 || get_u64(json_array_get(offs, 0), &b) != 0 ||
        get_u64(json_array_get(offs, 1), &e) != 0)
        return fail(err, errlen, "tensor '%s': data_offsets must be two non-negative integers",
                    name);
    if (b > e || e > data_len)
        return fail(err, errlen, "tensor '%s': data_offsets [%llu, %llu] outside the data area "
                    "of %zu bytes", name, (unsigned long long)b, (unsigned long long)e, data_len);
    if (count > UINT64_MAX / t->elem_size || e - b != count * t->elem_size)
        return fail(err, errlen, "tensor '%s': %llu bytes for %llu elements of %s", name,
                    (unsigned long long)(e - b), (unsigned long long)count, t->dtype);
    t->offset = b;
    t->nbytes = e - b;
    return 0;
}

int st_parse(const void *bytes, size_t len, st_file_t **out, char *err, size_t errlen)
{
    const uint8_t *p = bytes;
    uint64_t hlen = 0;
    json_t *root, *v;
    json_error_t jerr;
    const char *key;
    st_file_t *f;
    size_t names_len = 0, k = 0, pos = 0;

    if (bytes == NULL || out == NULL)
        return fail(err, errlen, "st_parse: NULL argument");
    if (len < 8)
        return fail(err, errlen, "file of %zu bytes has no header length", len);
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > len - 8)
        return fail(err, errlen, "header length %llu does not fit a file of %zu bytes",
                    (unsigned long long)hlen, len);
    root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return fail(err, errlen, "header JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                    jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return fail(err, errlen, "header JSON is not an object");
    }
    f = calloc(1, sizeof(*f));
    if (f == NULL) {
        json_decref(root);
        return fail(err, errlen, "out of memory");
    }
    f->data = p + 8 + hlen;
    f->data_len = len - 8 - (size_t)hlen;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v))
                goto bad_meta;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv))
                    goto bad_meta;
            }
            continue;
        }
        if (key[0] == '\0') {
            json_decref(root);
            st_close(f);
            return fail(err, errlen, "a tensor has an empty name");
        }
        names_len += strlen(key) + 1;
        f->n++;
    }
    f->t = calloc(f->n ? f->n : 1, sizeof(*f->t));
    f->names = malloc(names_len ? names_len : 1);
    if (f->t == NULL || f->names == NULL) {
        json_decref(root);
        st_close(f);
        return fail(err, errlen, "out of memory");
    }
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        st_tensor_t *t = &f->t[k++];
        size_t kl = strlen(key) + 1;
        memcpy(f->names + pos, key, kl);
        t->name = f->names + pos;
        pos += kl;
        if (parse_entry(key, v, t, f->data_len, err, errlen) != 0) {
            json_decref(root);
            st_close(f);
            return -1;
        }
        t->data = f->data + t->offset;
    }
    json_decref(root);
    qsort(f->t, f->n, sizeof(*f->t), by_offset);
    {
        uint64_t at = 0;
        for (size_t i = 0; i < f->n; i++) {
            if (f->t[i].offset != at) {
                int r = fail(err, errlen, "tensor '%s' starts at %llu, the previous one ends at "
                             "%llu (%s)", f->t[i].name, (unsigned long long)f->t[i].offset,
                             (unsigned long long)at, f->t[i].offset < at ? "overlap" : "hole");
                st_close(f);
                return r;
            }
            at += f->t[i].nbytes;
        }
        if (at != f->data_len) {
            int r = fail(err, errlen, "the tensors cover %llu bytes of a data area of %zu",
                         (unsigned long long)at, f->data_len);
            st_close(f);
            return r;
        }
    }
    *out = f;
    return 0;

bad_meta:
    json_decref(root);
    st_close(f);
    return fail(err, errlen, "__metadata__ must be an object of strings");
}

int st_open(const char *path, st_file_t **out, char *err, size_t errlen)
{
    struct stat sb;
    void *map;
    int fd, rc;
    st_file_t *f;

    if (path == NULL || out == NULL)
        return fail(err, errlen, "st_open: NULL argument");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(err, errlen, "%s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 8) {
        close(fd);
        return fail(err, errlen, "%s: not a regular file of at least 8 bytes", path);
    }
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return fail(err, errlen, "%s: mmap: %s", path, strerror(errno));
    rc = st_parse(map, (size_t)sb.st_size, &f, err, errlen);
    if (rc != 0) {
        if (err != NULL && errlen > 0) {   /* prefix the path */
            char tmp[512];
            snprintf(tmp, sizeof(tmp), "%s", err);
            snprintf(err, errlen, "%s: %s", path, tmp);
        }
        munmap(map, (size_t)sb.st_size);
        return -1;
    }
    f->map = map;
    f->map_len = (size_t)sb.st_size;
    *out = f;
    return 0;
}

void st_close(st_file_t *f)
{
    if (f == NULL)
        return;
    if (f->map != NULL)
        munmap(f->map, f->map_len);
    free(f->t);
    free(f->names);
    free(f);
}

size_t st_count(const st_file_t *f)
{
    return f != NULL ? f->n : 0;
}

const st_tensor_t *st_at(const st_file_t *f, size_t i)
{
    return f != NULL && i < f->n ? &f->t[i] : NULL;
}

const st_tensor_t *st_find(const st_file_t *f, const char *name)
{
    if (f == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

const uint8_t *st_data(const st_file_t *f)
{
    return f != NULL ? f->data : NULL;
}

size_t st_data_size(const st_file_t *f)
{
    return f != NULL ? f->data_len : 0;
}
