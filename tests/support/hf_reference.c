#include "tests/support/hf_reference.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/check.h"

/* Up to HF_REF_MAX_TOK integers of the JSON array `a` into out; its length. */
static int int_list(json_t *a, int32_t *out)
{
    int n = (int)json_array_size(a);
    for (int i = 0; i < n && i < HF_REF_MAX_TOK; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

int hf_ref_load(const char *dir, hf_ref_t *r)
{
    const int before = check_failures;
    char path[512];
    json_error_t err;
    json_t *j, *a;
    FILE *f;

    memset(r, 0, sizeof(*r));
    snprintf(path, sizeof(path), "%s/reference.json", dir);
    j = json_load_file(path, 0, &err);
    CHECK_MSG(j != NULL, "%s: %s", path, err.text);
    if (j == NULL)
        return -1;
    r->nprompt = int_list(json_object_get(j, "input_ids"), r->prompt);
    r->ngreedy = int_list(json_object_get(j, "greedy_12"), r->greedy);
    a = json_object_get(j, "logits_shape");
    r->V = json_integer_value(json_array_get(a, 1));
    CHECK_MSG(r->nprompt == 10 && r->ngreedy == 12 && r->V == 384 &&
              json_integer_value(json_array_get(a, 0)) == r->nprompt,
              "%s: %d prompt tokens, %d greedy, logits [%lld, %lld]", path, r->nprompt,
              r->ngreedy, (long long)json_integer_value(json_array_get(a, 0)), (long long)r->V);
    json_decref(j);
    if (check_failures != before)
        return -1;
    r->logits = malloc((size_t)(r->nprompt * r->V) * sizeof(float));
    snprintf(path, sizeof(path), "%s/reference_logits_f32.bin", dir);
    f = fopen(path, "rb");
    CHECK_MSG(f != NULL && r->logits != NULL, "cannot open %s", path);
    if (f == NULL || r->logits == NULL) {
        if (f != NULL)
            fclose(f);
        hf_ref_free(r);
        return -1;
    }
    CHECK_MSG(fread(r->logits, sizeof(float), (size_t)(r->nprompt * r->V), f) ==
                  (size_t)(r->nprompt * r->V),
              "%s is shorter than [%d, %lld] floats", path, r->nprompt, (long long)r->V);
    fclose(f);
    return check_failures != before ? -1 : 0;
}

void hf_ref_free(hf_ref_t *r)
{
    free(r->logits);
    r->logits = NULL;
}

double hf_rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}
