/* The frame of a GPU test program: see gpu_cases.h. */
#include "tests/gpu/gpu_cases.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "tests/support/proc.h"

int gpu_cases_args(gpu_cases_t *c, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            c->json = argv[++i];
        else if (strcmp(argv[i], "--no-bench") == 0)
            ;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            c->only = argv[++i];
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
            c->match = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--json PATH] [--no-bench] [--only ipc|nccl] "
                            "[--case SUBSTRING]\n", argv[0]);
            return 2;
        }
    }
    return 0;
}

static int count_gpus(void *arg)
{
    (void)arg;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n > 100 ? 100 : n;
}

void gpu_cases_count_gpus(gpu_cases_t *c)
{
    pid_t pid = proc_spawn(count_gpus, NULL, 60);
    int code = 0;

    proc_wait_all(&pid, 1, 60000, &code);
    c->ngpu = code > 0 && code < 128 ? code : 0;
}

gpu_case_t *gpu_cases_add(gpu_cases_t *c)
{
    gpu_case_t *row = &c->rows[c->nrows < GPU_CASES_MAX ? c->nrows++ : GPU_CASES_MAX - 1];
    memset(row, 0, sizeof(*row));
    return row;
}

static void write_json(const gpu_cases_t *c)
{
    FILE *f = fopen(c->json, "w");
    if (!f)
        return;
    fprintf(f, "{\"ngpu\": %d, \"cases\": [", c->ngpu);
    for (int i = 0; i < c->nrows; i++)
        fprintf(f, "%s{\"name\": \"%s\", \"result\": \"%s\", \"why\": \"%s\", \"seconds\": %.1f}",
                i ? ", " : "", c->rows[i].name, c->rows[i].result ? c->rows[i].result : "FAIL",
                c->rows[i].why, c->rows[i].seconds);
    fprintf(f, "]}\n");
    fclose(f);
}

int gpu_cases_finish(const gpu_cases_t *c, int width)
{
    int failed = 0;

    printf("\n%-*s  result    seconds\n", width, "case");
    for (int i = 0; i < c->nrows; i++) {
        const gpu_case_t *r = &c->rows[i];
        const char *res = r->result ? r->result : "FAIL";
        printf("%-*s  %-8s  %.1f%s%s\n", width, r->name, res, r->seconds, r->why[0] ? "  " : "",
               r->why);
        if (strcmp(res, "FAIL") == 0)
            failed++;
    }
    if (c->json)
        write_json(c);
    printf("%d of %d cases failed\n", failed, c->nrows);
    return failed ? 1 : 0;
}
