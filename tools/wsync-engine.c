/* wsync-engine: greedy generation with the bundled engine, on T tensor-parallel processes, from
 * an HF directory, optionally taking new weight versions from a wsync group. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "wsync_build_config.h"

#define PROG "wsync-engine"
#define MAX_PROMPT 4096

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " --model DIR --prompt-ids 1,2,3 --max-new N [--tp T [--ep T]]\n"
            "                    [--device cpu|cuda [--gpu-offset G]]\n"
            "                    [--quant none|fp8-block] [--fp8-block B] [--sync ADDR\n"
            "                    [--versions K] [--mode in-place|shadow]] [--timeout S] [--json]\n"
            "\n"
            "Greedy generation with the bundled engine (Llama, Qwen2, Qwen3, Qwen3-MoE,\n"
            "DeepSeek-V2/V3) from an HF directory (config.json, model.safetensors). With --tp T\n"
            "it starts T processes, each holding only its tensor-parallel slices (vLLM's\n"
            "layouts), which all-reduce through shared memory (on CUDA: through NCCL, one GPU\n"
            "per rank). With --sync each rank is a wsync\n"
            "receiver of the group whose coordinator listens at ADDR: it takes K new versions\n"
            "(default 1) and generates after each.\n"
            "\n"
            "  --model DIR        HF directory: config.json and model.safetensors (or an index)\n"
            "  --prompt-ids LIST  prompt token ids, comma-separated\n"
            "  --max-new N        tokens to generate\n"
            "  --tp T             tensor-parallel processes (default 1)\n"
            "  --ep E             expert parallelism of MoE models: 1 (default) splits every\n"
            "                     expert inside by TP; E = T gives each rank whole experts\n"
            "                     (vLLM's --enable-expert-parallel: E / T each, linear\n"
            "                     placement), attention still split by TP\n"
            "  --device D         cpu (default) or cuda: TP rank r runs on GPU (r + G) mod the\n"
            "                     number of visible GPUs; its weights are CUDA memory that wsync\n"
            "                     lands directly. Ranks on distinct GPUs all-reduce through NCCL,\n"
            "                     otherwise through host shared memory (WSYNC_ENGINE_ALLREDUCE=shm\n"
            "                     forces that); WSYNC_LOG_LEVEL=info says which GPU and path\n"
            "  --gpu-offset G     first GPU of --device cuda (default 0)\n"
            "  --quant Q          linear weights: none (bf16, default) or fp8-block (e4m3fn with\n"
            "                     fp32 block scales, dequantized on the fly)\n"
            "  --fp8-block B      block size of fp8-block (default 128; small models need 32)\n"
            "  --sync ADDR        host:port of the wsync coordinator (sender rank 0)\n"
            "  --versions K       versions to take with --sync (default 1)\n"
            "  --mode M           in-place (default: generation pauses while a version lands) or\n"
            "                     shadow (versions land in spare buffers, swapped at commit)\n"
            "  --timeout S        seconds to wait for a version or a peer (default 60)\n"
            "  --json             end stdout with one JSON object: tokens, version (0 when the\n"
            "                     weights came from the files), logits_sha (xxh3-64 of the last\n"
            "                     step's logits, hex), tp, ep, quant, seconds\n"
            "  -h, --help         this text\n");
}

typedef struct {
    const char *model, *sync, *quant;
    int32_t prompt[MAX_PROMPT];
    int nprompt, max_new, tp, ep, block, versions, shadow, timeout_s, json, cuda, gpu_offset;
    wsync_model_config_t cfg;
} options_t;

static int parse_int(const char *opt, const char *text, long lo, long hi, int *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s: '%s' is not an integer in [%ld, %ld]\n", opt, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_ids(const char *text, options_t *o)
{
    const char *p = text;
    o->nprompt = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr, PROG ": --prompt-ids: '%s' is not a comma-separated list of token "
                    "ids\n", text);
            return -1;
        }
        if (o->nprompt == MAX_PROMPT) {
            fprintf(stderr, PROG ": --prompt-ids: more than %d ids\n", MAX_PROMPT);
            return -1;
        }
        o->prompt[o->nprompt++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') {
            fprintf(stderr, PROG ": --prompt-ids: '%s' ends with a comma\n", text);
            return -1;
        }
    }
    if (o->nprompt == 0) {
        fprintf(stderr, PROG ": --prompt-ids: no ids given\n");
        return -1;
    }
    return 0;
}

/* -1: exit 0 (help); 2: usage error; 0: go on. */
static int parse_args(int argc, char **argv, options_t *o)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},  {"prompt-ids", required_argument, NULL, 'p'},
        {"max-new", required_argument, NULL, 'n'}, {"tp", required_argument, NULL, 't'},
        {"device", required_argument, NULL, 'd'},  {"quant", required_argument, NULL, 'q'},
        {"fp8-block", required_argument, NULL, 'b'}, {"sync", required_argument, NULL, 's'},
        {"versions", required_argument, NULL, 'k'}, {"mode", required_argument, NULL, 'M'},
        {"timeout", required_argument, NULL, 'T'}, {"json", no_argument, NULL, 'j'},
        {"gpu-offset", required_argument, NULL, 'g'}, {"ep", required_argument, NULL, 'e'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    int c, have_max_new = 0;

    memset(o, 0, sizeof(*o));
    o->tp = 1;
    o->versions = 1;
    o->timeout_s = 60;
    o->quant = "none";
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': if (parse_ids(optarg, o)) return 2; break;
        case 'n': if (parse_int("--max-new", optarg, 0, 1 << 20, &o->max_new)) return 2;
                  have_max_new = 1; break;
        case 't': if (parse_int("--tp", optarg, 1, WSYNC_ENGINE_MAX_TP, &o->tp)) return 2; break;
        case 'e': if (parse_int("--ep", optarg, 1, WSYNC_ENGINE_MAX_TP, &o->ep)) return 2; break;
        case 'd':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, PROG ": --device: '%s' is not cpu or cuda\n", optarg);
                return 2;
            }
            o->cuda = strcmp(optarg, "cuda") == 0;
            if (o->cuda && !WSYNC_HAVE_CUDA) {
                fprintf(stderr, PROG ": --device cuda: wsync was built without CUDA (use "
                        "--device cpu, or build with the CUDA toolkit)\n");
                return 2;
            }
            break;
        case 'g': if (parse_int("--gpu-offset", optarg, 0, 1 << 16, &o->gpu_offset)) return 2;
                  break;
        case 'q':
            if (strcmp(optarg, "none") != 0 && strcmp(optarg, "fp8-block") != 0) {
                fprintf(stderr, PROG ": --quant: '%s' is not none or fp8-block\n", optarg);
                return 2;
            }
            o->quant = optarg;
            break;
        case 'b': if (parse_int("--fp8-block", optarg, 1, 256, &o->block)) return 2; break;
        case 's': o->sync = optarg; break;
        case 'k': if (parse_int("--versions", optarg, 1, 1 << 20, &o->versions)) return 2; break;
        case 'M':
            if (strcmp(optarg, "in-place") != 0 && strcmp(optarg, "shadow") != 0) {
                fprintf(stderr, PROG ": --mode: '%s' is not in-place or shadow\n", optarg);
                return 2;
            }
            o->shadow = strcmp(optarg, "shadow") == 0;
            break;
        case 'T': if (parse_int("--timeout", optarg, 1, 86400, &o->timeout_s)) return 2; break;
        case 'j': o->json = 1; break;
        case 'h': usage(stdout); return -1;
        case ':':
            fprintf(stderr, PROG ": option '%s' needs a value (see --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, PROG ": unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (o->ep > 1 && o->ep != o->tp) {
        fprintf(stderr, PROG ": --ep %d: expert parallelism spans the TP ranks, so it is 1 or "
                "--tp (%d)\n", o->ep, o->tp);
        return 2;
    }
    if (o->model == NULL || o->nprompt == 0 || !have_max_new) {
        fprintf(stderr, PROG ": %s is required (see --help)\n",
                o->model == NULL ? "--model" : o->nprompt == 0 ? "--prompt-ids" : "--max-new");
        return 2;
    }
    return 0;
}

static void print_result(const options_t *o, const int32_t *tokens,
                         const wsync_engine_result_t *res, json_t *gens)
{
    char sha[17];
    json_t *j, *toks = json_array();

    snprintf(sha, sizeof(sha), "%016" PRIx64, res->logits_hash);
    printf("version %" PRIu64 ":", res->version);
    for (int i = 0; i < res->ntokens; i++) {
        printf(" %d", (int)tokens[i]);
        json_array_append_new(toks, json_integer(tokens[i]));
    }
    printf("  (logits_sha %s, %.3f s)\n", sha, res->seconds);
    fflush(stdout);
    j = json_pack("{s:o, s:I, s:s, s:f}", "tokens", toks, "version", (json_int_t)res->version,
                  "logits_sha", sha, "seconds", res->seconds);
    json_array_append_new(gens, j);
    (void)o;
}

static int rank_main(int rank, int tp, wsync_engine_comm_t *comm, void *arg)
{
    const options_t *o = arg;
    wsync_engine_params_t p = WSYNC_ENGINE_PARAMS_INIT;
    wsync_engine_t *e = NULL;
    wsync_ctx_t *ctx = NULL;
    wsync_status_t st;
    int32_t *tokens = calloc((size_t)o->max_new + 1, sizeof(int32_t));
    wsync_engine_result_t res;
    json_t *gens = json_array();
    int rc = 1;

    signal(SIGPIPE, SIG_IGN);
    p.tp_rank = rank;
    p.tp_size = tp;
    p.comm = comm;
    p.ep = o->ep;
    p.quant = strcmp(o->quant, "fp8-block") == 0 ? WSYNC_ENGINE_QUANT_FP8_BLOCK
                                                 : WSYNC_ENGINE_QUANT_NONE;
    p.fp8_block = o->block;
    p.mode = o->shadow ? WSYNC_ENGINE_SHADOW : WSYNC_ENGINE_IN_PLACE;
    if (o->cuda) {
        p.device = WSYNC_ENGINE_CUDA;
        p.gpu = rank + o->gpu_offset;   /* modulo the visible GPUs, in the engine */
    }
    if (o->nprompt + o->max_new > 4096)
        p.max_seq = o->nprompt + o->max_new;
    st = wsync_engine_open(o->model, &p, &e);
    if (st != WSYNC_OK) {
        fprintf(stderr, PROG ": TP rank %d: %s\n", rank, wsync_engine_last_error());
        if (st == WSYNC_ERR_CONFIG && p.quant == WSYNC_ENGINE_QUANT_FP8_BLOCK && o->block == 0)
            fprintf(stderr, PROG ": (a small model needs a smaller block: try --fp8-block 32)\n");
        goto out;
    }
    if (o->sync == NULL) {
        st = wsync_engine_generate(e, o->prompt, o->nprompt, o->max_new, tokens, &res);
        if (st != WSYNC_OK) {
            fprintf(stderr, PROG ": TP rank %d: %s\n", rank, wsync_engine_last_error());
            goto out;
        }
        if (rank == 0)
            print_result(o, tokens, &res, gens);
    } else {
        wsync_receiver_params_t rp = WSYNC_RECEIVER_PARAMS_INIT;
        if ((st = wsync_ctx_create(NULL, &ctx)) != WSYNC_OK) {
            fprintf(stderr, PROG ": TP rank %d: %s\n", rank, wsync_last_error());
            goto out;
        }
        rp.coordinator = o->sync;
        rp.timeout_ms = o->timeout_s * 1000;
        if ((st = wsync_engine_attach(e, ctx, &rp)) != WSYNC_OK) {
            fprintf(stderr, PROG ": TP rank %d: %s\n", rank, wsync_engine_last_error());
            goto out;
        }
        for (int k = 0; k < o->versions; k++) {
            uint64_t v = 0;
            st = wsync_engine_update(e, o->timeout_s * 1000, &v);
            if (st == WSYNC_OK)
                st = wsync_engine_generate(e, o->prompt, o->nprompt, o->max_new, tokens, &res);
            if (st != WSYNC_OK) {
                fprintf(stderr, PROG ": TP rank %d: %s\n", rank, wsync_engine_last_error());
                goto out;
            }
            if (rank == 0)
                print_result(o, tokens, &res, gens);
        }
    }
    if (rank == 0 && o->json) {
        json_t *last = json_array_get(gens, json_array_size(gens) - 1);
        json_t *j = json_deep_copy(last);
        char *text;
        json_object_set_new(j, "tp", json_integer(tp));
        json_object_set_new(j, "ep", json_integer(o->ep > 1 ? o->ep : 1));
        json_object_set_new(j, "quant", json_string(o->quant));
        json_object_set_new(j, "device", json_string(o->cuda ? "cuda" : "cpu"));
        json_object_set_new(j, "model", json_string(o->model));
        if (o->sync != NULL)
            json_object_set(j, "generations", gens);
        text = json_dumps(j, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
        json_decref(j);
    }
    rc = 0;
out:
    wsync_engine_free(e);
    wsync_ctx_free(ctx);
    json_decref(gens);
    free(tokens);
    return rc;
}

int main(int argc, char **argv)
{
    static options_t o;
    wsync_engine_comm_t *comm = NULL;
    wsync_status_t st;
    char path[4096];
    int rc;

    rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    snprintf(path, sizeof(path), "%s/config.json", o.model);
    if (wsync_model_config_load(path, &o.cfg) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_last_error());
        return 1;
    }
    if (o.cuda)
        setenv("NCCL_NVLS_ENABLE", "0", 0);   /* NVLink multicast off on shared hosts */
    /* no CUDA call here: the rank processes (forked below) each set their own GPU */
    if (o.tp == 1)
        return rank_main(0, 1, NULL, &o);
    /* the communicator exists before the fork; wsync objects only after it */
    if (wsync_engine_comm_create(o.tp, &o.cfg, 0, o.timeout_s * 1000 + 30000, &comm) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_engine_last_error());
        return 1;
    }
    st = wsync_engine_launch(o.tp, comm, rank_main, &o,
                             o.sync != NULL ? o.timeout_s * (o.versions + 1) + 60 : 3600, NULL);
    wsync_engine_comm_free(comm);
    if (st != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_engine_last_error());
        return 1;
    }
    return 0;
}
