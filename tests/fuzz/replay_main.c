/* main() for a fuzz target built without libFuzzer: runs the target once on every file named on
 * the command line, and on every file inside every directory named (not recursively). A crash or
 * a failed property aborts, as under libFuzzer; otherwise it prints how many inputs ran. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long len;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "cannot read %s: %s\n", path, strerror(errno));
        if (f != NULL)
            fclose(f);
        return -1;
    }
    /* an exact-size copy, so that ASan sees any read past the input's end */
    buf = malloc(len > 0 ? (size_t)len : 1);
    if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "cannot read %s\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int ran = 0, bad = 0;

    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
            bad++;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad += run_file(argv[i]) != 0;
            ran++;
            continue;
        }
        /* a directory: its regular files, in name order so that runs are reproducible */
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        char **names = NULL;
        size_t n = 0, cap = 0;
        if (d == NULL) {
            fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
            bad++;
            continue;
        }
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                names = realloc(names, cap * sizeof(*names));
                if (names == NULL)
                    abort();
            }
            size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
            names[n] = malloc(len);
            if (names[n] == NULL)
                abort();
            snprintf(names[n++], len, "%s/%s", argv[i], e->d_name);
        }
        closedir(d);
        if (n > 0)
            qsort(names, n, sizeof(*names), cmp_names);
        for (size_t k = 0; k < n; k++) {
            if (stat(names[k], &sb) == 0 && S_ISREG(sb.st_mode)) {
                bad += run_file(names[k]) != 0;
                ran++;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("%d inputs ran, %d unreadable\n", ran, bad);
    return bad != 0;
}
