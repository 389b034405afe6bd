/* The frame of a GPU test program (tests/gpu/): its command line, the GPU count (found by a
 * child: the parent never initializes CUDA), and the table of cases it prints and writes as JSON
 * for tests/gpu/run.sh. Linked into the GPU tests only (it calls the CUDA runtime). */
#ifndef WSYNC_TEST_GPU_GPU_CASES_H
#define WSYNC_TEST_GPU_GPU_CASES_H

#define GPU_CASES_MAX 64

typedef struct {
    char name[120];
    const char *result;              /* "pass", "FAIL", "skipped" */
    char why[200];
    double seconds;
} gpu_case_t;

typedef struct {
    gpu_case_t rows[GPU_CASES_MAX];
    int nrows;
    int ngpu;                        /* visible GPUs */
    const char *only;                /* --only SCHEME, NULL: every scheme */
    const char *match;               /* --case SUBSTRING, NULL: every case */
    const char *json;                /* --json PATH, NULL: none */
} gpu_cases_t;

/* --json PATH, --no-bench (accepted, no effect), --only SCHEME, --case SUBSTRING. 0, or 2 after
 * printing the usage line for anything else. */
int gpu_cases_args(gpu_cases_t *c, int argc, char **argv);

/* c->ngpu from a child process's cudaGetDeviceCount (at most 100). */
void gpu_cases_count_gpus(gpu_cases_t *c);

/* A new row (the table holds GPU_CASES_MAX; past that the last row is reused). */
gpu_case_t *gpu_cases_add(gpu_cases_t *c);

/* Print the table (name column `width` wide), write the JSON when asked, print "F of N cases
 * failed" and return the exit status: 1 when a case failed, else 0. */
int gpu_cases_finish(const gpu_cases_t *c, int width);

#endif
