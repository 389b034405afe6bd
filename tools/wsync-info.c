/* wsync-info: what this build of wsync has and what works on this machine: the library version,
 * the optional dependencies it was built with, and every transport and scheme (compiled in,
 * available now, capabilities, and why). Public API only. */
#include "wsync/wsync.h"
#include "wsync_build_config.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "wsync-info"

typedef struct {
    int count;
    wsync_component_info_t *items;
} info_list_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " [--json] [--explain [--mem host|cuda] [--senders N] [--receivers R]\n"
            "                  [--delta off|on|auto] [--model config.json]]\n"
            "\n"
            "Prints the wsync version, the optional dependencies this build has (CUDA, NCCL,\n"
            "UCX, libfabric), and for every transport and scheme: whether it is compiled in,\n"
            "whether it is available on this machine now, its capabilities, and the reason.\n"
            "\n"
            "  --json       print one JSON object instead of tables\n"
            "  --explain    also show which scheme a group of N senders and R receivers on\n"
            "               this machine would get, and why every other scheme is refused\n"
            "               (the coordinator's own negotiation; defaults: host, 1, 1),\n"
            "               and whether delta versions would be on (--delta: every\n"
            "               participant's choice; default $WSYNC_DELTA or auto) and what the\n"
            "               senders' baselines cost (--model: per sender, FSDP over N)\n"
            "  -h, --help   this text\n"
            "\n"
            "Environment: WSYNC_LOG_LEVEL=error|warn|info|debug.\n");
}

static const struct {
    const char *name;
    int have;
} build_options[] = {
    {"cuda", WSYNC_HAVE_CUDA},
    {"nccl", WSYNC_HAVE_NCCL},
    {"ucx", WSYNC_HAVE_UCX},
    {"ofi", WSYNC_HAVE_OFI},
};
#define NBUILD_OPTIONS ((int)(sizeof(build_options) / sizeof(build_options[0])))

/* Collects the transports (which = 0) or the schemes (which = 1). 0 on success. */
static int collect(const wsync_ctx_t *ctx, int which, info_list_t *list)
{
    int n = which ? wsync_scheme_count(ctx) : wsync_transport_count(ctx);
    list->count = 0;
    list->items = calloc(n > 0 ? (size_t)n : 1, sizeof(*list->items));
    if (!list->items) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        wsync_status_t st = which ? wsync_scheme_info(ctx, i, &list->items[i])
                                  : wsync_transport_info(ctx, i, &list->items[i]);
        if (st != WSYNC_OK) {
            fprintf(stderr, PROG ": %s(%d) failed: %s\n",
                    which ? "wsync_scheme_info" : "wsync_transport_info", i, wsync_last_error());
            return -1;
        }
    }
    list->count = n;
    return 0;
}

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

static void print_table(const char *title, const info_list_t *list)
{
    int wname = 4, wcaps = 4;
    for (int i = 0; i < list->count; i++) {
        int a = (int)strlen(or_dash(list->items[i].name));
        int b = (int)strlen(or_dash(list->items[i].caps));
        wname = a > wname ? a : wname;
        wcaps = b > wcaps ? b : wcaps;
    }
    printf("%s\n", title);
    printf("  %-*s  %-8s  %-9s  %-*s  %s\n", wname, "name", "compiled", "available", wcaps,
           "caps", "reason");
    for (int i = 0; i < list->count; i++) {
        const wsync_component_info_t *c = &list->items[i];
        printf("  %-*s  %-8s  %-9s  %-*s  %s\n", wname, or_dash(c->name),
               c->compiled ? "yes" : "no", c->available ? "yes" : "no", wcaps, or_dash(c->caps),
               or_dash(c->reason));
    }
}

/* A JSON string of s; bytes that are not valid UTF-8 become '?' rather than losing the field. */
static json_t *jstr(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    char *copy = strdup(s);
    if (!copy)
        return json_null();
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j ? j : json_null();
}

static json_t *list_json(const info_list_t *list)
{
    json_t *arr = json_array();
    for (int i = 0; i < list->count; i++) {
        const wsync_component_info_t *c = &list->items[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", jstr(c->name));
        json_object_set_new(o, "compiled", json_boolean(c->compiled));
        json_object_set_new(o, "available", json_boolean(c->available));
        /* "-" is the library's way of printing no caps; JSON says that with "". */
        int no_caps = !c->caps || strcmp(c->caps, "-") == 0;
        json_object_set_new(o, "caps", jstr(no_caps ? "" : c->caps));
        json_object_set_new(o, "reason", jstr(c->reason));
        json_array_append_new(arr, o);
    }
    return arr;
}

static int print_json(const char *version, const info_list_t *transports,
                      const info_list_t *schemes)
{
    json_t *root = json_object(), *build = json_object();
    json_object_set_new(root, "version", json_string(version));
    for (int i = 0; i < NBUILD_OPTIONS; i++)
        json_object_set_new(build, build_options[i].name, json_boolean(build_options[i].have));
    json_object_set_new(root, "build", build);
    json_object_set_new(root, "transports", list_json(transports));
    json_object_set_new(root, "schemes", list_json(schemes));
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) {
        fprintf(stderr, PROG ": cannot encode the JSON output\n");
        return -1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

/* The delta line of --explain: the group's mode as the coordinator resolves it for a group on
 * one machine (auto is off there: bytes through shared memory are cheap), and the baselines'
 * memory (docs/delta.md). */
static int print_delta(const char *delta, wsync_mem_t mem, int nsenders, const char *model)
{
    const char *where = mem == WSYNC_MEM_CUDA
                            ? (getenv("WSYNC_DELTA_BASELINE") != NULL &&
                                       strcmp(getenv("WSYNC_DELTA_BASELINE"), "host") == 0
                                   ? "pinned host memory (WSYNC_DELTA_BASELINE=host)"
                                   : "device memory on the shards' GPU")
                            : "host memory";

    if (delta == NULL || *delta == '\0')
        delta = "auto";
    if (strcmp(delta, "off") == 0)
        printf("delta: off (asked for)\n");
    else if (strcmp(delta, "auto") == 0)
        printf("delta: off (auto: every participant on one host and network namespace, where "
               "full versions are cheap; auto turns it on for nccl and store groups spanning "
               "hosts or namespaces)\n");
    else if (strcmp(delta, "on") == 0)
        printf("delta: on (asked for; a scheme that does not carry delta versions refuses the "
               "group at setup)\n");
    else {
        fprintf(stderr, PROG ": WSYNC_DELTA='%s': expected off, on or auto\n", delta);
        return 1;
    }
    const char *cut = getenv("WSYNC_DELTA_CUTOFF");
    if (cut != NULL && *cut != '\0') {
        char *end = NULL;
        double f = strtod(cut, &end);
        if (end == cut || *end != '\0' || !(f > 0 && f <= 1)) {
            fprintf(stderr, PROG ": WSYNC_DELTA_CUTOFF='%s': expected a fraction in (0, 1]\n", cut);
            return 1;
        }
        printf("delta cut-off: a chunk travels plain when its encoding would pass %g of its plain "
               "bytes (WSYNC_DELTA_CUTOFF)\n", f);
    } else {
        printf("delta cut-off: a chunk travels plain when its encoding would pass %g of its plain "
               "bytes (the default for %s shards; WSYNC_DELTA_CUTOFF or params.delta_cutoff "
               "to change it)\n", mem == WSYNC_MEM_CUDA ? WSYNC_DELTA_CUTOFF_CUDA
                                                        : WSYNC_DELTA_CUTOFF_HOST,
               mem == WSYNC_MEM_CUDA ? "CUDA" : "host");
    }
    printf("delta memory: with delta on, each sender keeps a baseline of its shards that have "
           "delta-capable chunks (their bytes once more) in %s%s\n", where,
           model == NULL ? "; --model config.json gives the bytes" : "");
    if (model != NULL) {
        wsync_model_config_t cfg;
        wsync_param_t *params = NULL;
        size_t n = 0;
        double bytes = 0;
        if (wsync_model_config_load(model, &cfg) != WSYNC_OK ||
            wsync_model_params(&cfg, (wsync_dtype_t)0, &params, &n) != WSYNC_OK) {
            fprintf(stderr, PROG ": --model '%s': %s\n", model, wsync_last_error());
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            double e = (double)wsync_dtype_size(params[i].dtype);
            for (int d = 0; d < params[i].ndim; d++)
                e *= (double)params[i].shape[d];
            bytes += e;
        }
        wsync_model_params_free(params, n);
        printf("delta memory for %s: %.1f MiB of params; FSDP over %d sender%s: at most %.1f MiB "
               "of baseline per sender\n", model, bytes / (1 << 20), nsenders,
               nsenders == 1 ? "" : "s", bytes / nsenders / (1 << 20));
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, NULL, 'j'},
        {"explain", no_argument, NULL, 'e'},
        {"mem", required_argument, NULL, 'm'},
        {"senders", required_argument, NULL, 's'},
        {"receivers", required_argument, NULL, 'r'},
        {"delta", required_argument, NULL, 'd'},
        {"model", required_argument, NULL, 'M'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, explain = 0, nsenders = 1, nreceivers = 1, c;
    wsync_mem_t mem = WSYNC_MEM_HOST;
    const char *delta = getenv("WSYNC_DELTA"), *model = NULL;
    char *end;
    opterr = 0; /* reported below, naming the option */
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'e': explain = 1; break;
        case 'm':
            if (strcmp(optarg, "host") == 0)
                mem = WSYNC_MEM_HOST;
            else if (strcmp(optarg, "cuda") == 0)
                mem = WSYNC_MEM_CUDA;
            else {
                fprintf(stderr, PROG ": --mem '%s': expected host or cuda\n", optarg);
                return 2;
            }
            break;
        case 's':
        case 'r': {
            long v = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || v < 1 || v > 65536) {
                fprintf(stderr, PROG ": --%s '%s': expected an integer in [1, 65536]\n",
                        c == 's' ? "senders" : "receivers", optarg);
                return 2;
            }
            if (c == 's')
                nsenders = (int)v;
            else
                nreceivers = (int)v;
            break;
        }
        case 'd':
            if (strcmp(optarg, "off") != 0 && strcmp(optarg, "on") != 0 &&
                strcmp(optarg, "auto") != 0) {
                fprintf(stderr, PROG ": --delta '%s': expected off, on or auto\n", optarg);
                return 2;
            }
            delta = optarg;
            break;
        case 'M': model = optarg; break;
        case 'h': usage(stdout); return 0;
        default: {
            const char *arg = argv[optind - 1], *eq = strchr(arg, '=');
            if (strncmp(arg, "--", 2) == 0 && eq)
                fprintf(stderr, PROG ": option '%.*s' takes no value or is unknown (see --help)\n",
                        (int)(eq - arg), arg);
            else
                fprintf(stderr, PROG ": unknown option '%s' (see --help)\n", arg);
            return 2;
        }
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }

    wsync_ctx_t *ctx = NULL;
    wsync_status_t st = wsync_ctx_create(NULL, &ctx);
    if (st != WSYNC_OK) {
        fprintf(stderr, PROG ": wsync_ctx_create failed: %s\n", wsync_last_error());
        return 1;
    }
    info_list_t transports = {0}, schemes = {0};
    int rc = 1;
    if (collect(ctx, 0, &transports) != 0 || collect(ctx, 1, &schemes) != 0)
        goto out;

    char version[32];
    snprintf(version, sizeof(version), "%d.%d.%d", WSYNC_VERSION_MAJOR, WSYNC_VERSION_MINOR,
             WSYNC_VERSION_PATCH);
    if (json) {
        rc = print_json(version, &transports, &schemes) == 0 ? 0 : 1;
        goto out;
    }
    printf("wsync %s\n", version);
    printf("build:");
    for (int i = 0; i < NBUILD_OPTIONS; i++)
        printf(" %s=%s", build_options[i].name, build_options[i].have ? "yes" : "no");
    printf("\n\n");
    print_table("transports", &transports);
    printf("\n");
    print_table("schemes", &schemes);
    if (explain) {
        printf("\n");
        char text[4096];
        st = wsync_ctx_explain(ctx, mem, nsenders, nreceivers, text, sizeof(text));
        printf("a group of %d sender%s and %d receiver%s on this machine, %s memory:\n%s\n",
               nsenders, nsenders == 1 ? "" : "s", nreceivers, nreceivers == 1 ? "" : "s",
               mem == WSYNC_MEM_HOST ? "host" : "CUDA", text);
        if (print_delta(delta, mem, nsenders, model) != 0) {
            rc = 1;
            goto out;
        }
    }
    rc = 0;
out:
    free(transports.items);
    free(schemes.items);
    wsync_ctx_free(ctx);
    return rc;
}
