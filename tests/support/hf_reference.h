/* HF transformers' reference run of a testdata model (shared/testdata/README.md): the prompt,
 * the greedy continuation and the f32 logits of every prompt position, as the engine tests
 * compare against them. Engine-free, so that every test binary can link it. */
#ifndef WSYNC_TEST_HF_REFERENCE_H
#define WSYNC_TEST_HF_REFERENCE_H

#include <stdint.h>

#define HF_REF_MAX_TOK 64

typedef struct {
    int32_t prompt[HF_REF_MAX_TOK], greedy[HF_REF_MAX_TOK];
    int nprompt, ngreedy;
    float *logits;   /* [nprompt, V] */
    int64_t V;
} hf_ref_t;

/* Reads <dir>/reference.json (input_ids, greedy_12, logits_shape) and
 * <dir>/reference_logits_f32.bin into *r. testdata's tiny models all have 10 prompt tokens, 12
 * greedy ones and a vocabulary of 384: anything else is a failure. 0, or -1 with the failure
 * recorded (CHECK). Free with hf_ref_free. */
int hf_ref_load(const char *dir, hf_ref_t *r);
void hf_ref_free(hf_ref_t *r);

/* ||a - b|| / ||b|| over n values. */
double hf_rel_err(const float *a, const float *b, int64_t n);

#endif
