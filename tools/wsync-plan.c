/* wsync-plan: what one sync of a model would move, and the time floor that sets. Trainer ranks
 * hold FSDP dim-0 shards (or whole experts), inference replicas hold vLLM's TP layouts (and its
 * expert-parallel MoE layouts); the plan the coordinator would compile is summarized per
 * receiver, per sender and per link, and compared with the naive method (gather every full
 * tensor, broadcast it to every receiver). It also times the compile and measures its memory,
 * for the models of tens of thousands of params (Kimi-K2: 61 layers x 384 experts x 3). With
 * FP8 targets it says which travel as FP8 codes and scales made by the senders (FP8 on the
 * wire, docs/fp8_wire.md) and why the others travel plain. Public API only. */
#include "wsync/wsync.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define PROG "wsync-plan"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " --config config.json --senders N --tp T [--ep E] [--replicas R]\n"
            "                  [--sender-layout fsdp|ep|fused]\n"
            "                  [--quant none|fp8-block|fp8-tensor|fp8-channel] [--fp8-block B]\n"
            "                  [--fp8-wire on|off] [--vocab-pad P] [--bucket-mb B]\n"
            "                  [--link-gbps G] [--verbose] [--json]\n"
            "\n"
            "Compiles the plan wsync would use to sync the model of a HF config.json from N\n"
            "trainer ranks to R inference engines laid out as vLLM lays them out, and prints the\n"
            "bytes each receiver, each sender and each (sender, receiver) link carries, the total,\n"
            "the naive method's figures (every full param gathered and broadcast to every\n"
            "receiver), the floor, and what compiling the plan cost here (wall and CPU seconds,\n"
            "memory). Every rank (sender or receiver) is taken to have its own NIC of G Gb/s,\n"
            "full duplex, and the network to be non-blocking, so\n"
            "  floor = max over NICs of bytes / (G x 1e9 / 8)\n"
            "        = max(most bytes into one receiver, most bytes out of one sender) / (G / 8 GB/s)\n"
            "(bytes of one version, counted per (sender, receiver) pair; GB = 1e9 bytes).\n"
            "\n"
            "  --config PATH     HF config.json: llama, qwen2, qwen3, qwen3_moe, deepseek_v2,\n"
            "                    deepseek_v3 (also Kimi-K2); tools/configs/ has published ones\n"
            "  --senders N       trainer ranks\n"
            "  --sender-layout L fsdp (default): every param split along dim 0 over the N ranks\n"
            "                    (FSDP of the checkpoint's per-expert params); ep: routed experts\n"
            "                    whole, spread over the N ranks (E %% N == 0), other params FSDP;\n"
            "                    fused: FSDP dim 0 of transformers 5.x's fused experts\n"
            "                    (gate_up_proj [E, 2I, Hd], down_proj [E, Hd, I]), i.e. whole\n"
            "                    experts, unfused into the checkpoint's per-expert params\n"
            "  --tp T            tensor-parallel size of attention (and dense layers) in an engine\n"
            "  --ep E            MoE models: expert parallelism inside each engine, as vLLM's\n"
            "                    enable_expert_parallel (EP = TP x DP): an engine is E ranks, E/T\n"
            "                    data-parallel attention groups of T, routed experts split whole\n"
            "                    over all E ranks (linear placement); receiver = engine * E + ep_rank,\n"
            "                    tp_rank = ep_rank %% T. Without --ep an engine is T ranks and every\n"
            "                    rank holds every expert, split inside by TP\n"
            "  --replicas R      inference engines (default 1)\n"
            "  --quant Q         linear weights on the receivers: none (default), fp8-block\n"
            "                    (128x128), fp8-tensor or fp8-channel (e4m3fn)\n"
            "  --fp8-block B     fp8-block: blocks of B x B (default 128)\n"
            "  --fp8-wire W      on (default): the plan an ipc or nccl group compiles, where the\n"
            "                    senders quantize the chunks of FP8 block, channel and\n"
            "                    per-tensor targets (the per-tensor ones from the amax they\n"
            "                    agree on each version: ipc and nccl, and the store\n"
            "                    with WSYNC_FP8_WIRE=2 into host targets)\n"
            "                    and send FP8 codes and fp32 scales (FP8 on the wire); off: the\n"
            "                    plan of the store, of delta versions or of WSYNC_FP8_WIRE=0,\n"
            "                    where every param travels in its dtype and receivers quantize\n"
            "  --vocab-pad P     vocab padding multiple of embed_tokens/lm_head (default 64)\n"
            "  --bucket-mb B     staging bucket size in MiB (default 256)\n"
            "  --link-gbps G     each rank's NIC in Gb/s, gigabits (default 400: one 400 Gb/s\n"
            "                    NIC per GPU, 50 GB/s each way)\n"
            "  --verbose         one line per receiver and per sender, and the per-link table,\n"
            "                    however many there are (default: those past 16 as min/mean/max)\n"
            "  --json            also print one JSON object as the last line\n"
            "  -h, --help        this text\n"
            "\n"
            "Moved bytes are counted as they travel: the checkpoint dtype, or for an FP8 target\n"
            "that travels FP8 (--fp8-wire on) 1 byte per element plus 4 per fp32 scale. An FP8\n"
            "target travels so only whole: every chunk of it on whole cells of its blocks or\n"
            "rows, none feeding a target that travels otherwise. The others travel plain (and\n"
            "their receivers quantize), for one of these reasons, counted per target and in all:\n"
            "  cut cells    a chunk does not lie on whole cells (FSDP rows or fused pieces cut\n"
            "               a block), or a row of its cells does not fit a bucket\n"
            "  shared       a chunk also feeds a target that travels plain or by another rule\n"
            "  per-tensor   an fp8-tensor target left plain (--fp8-wire off, padding, or a\n"
            "               chunk shared with another target); with --fp8-wire on they travel\n"
            "               FP8, their senders agreeing on the amax each version (ipc and\n"
            "               nccl, host or CUDA shards; the store with WSYNC_FP8_WIRE=2 into\n"
            "               host targets)\n"
            "  off          --fp8-wire off\n"
            "  uncovered    padding no param covers (vocab padding), or a non-float param\n"
            "'FP8 targets' is the bytes moved into them against their checkpoint-dtype bytes;\n"
            "'whole model' all bytes moved against every param travelling in its dtype. The\n"
            "floor uses the bytes as they travel. 'landed' is what the targets then hold (1 byte\n"
            "per FP8 element plus 4 per fp32 scale).\n"
            "'compile' is the wall time of wsync_plan_summarize here (descriptions to plan to\n"
            "figures, one thread); 'layouts' is the time building every rank's shards and\n"
            "targets, which a real group spreads over its ranks. 'plan memory' is the process's\n"
            "peak resident size during the compile less its size before; 'wire' is the size of\n"
            "the encoded plan the coordinator sends (WSYNC_PLAN_WIRE_CHECK=1: also encoded,\n"
            "decoded and checked as every participant checks it, after the timed compile).\n");
}

typedef struct {
    const char *config;
    int senders, tp, replicas, ep;
    const char *sender_layout;
    const char *quant;
    long fp8_block;
    int fp8_wire;
    long vocab_pad;
    double bucket_mb, link_gbps;
    int json, verbose;
} options_t;

/* Receivers of one engine: E with expert parallelism, else T. */
static int engine_size(const options_t *o)
{
    return o->ep ? o->ep : o->tp;
}

/* What compiling cost, and the plan's encoded size. */
typedef struct {
    double layout_s, compile_s, compile_cpu_s;
    uint64_t rss_before, rss_peak;   /* bytes */
    uint64_t wire_bytes;
} cost_t;

/* A positive integer option, or an error naming it. */
static int parse_int(const char *opt, const char *text, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > max) {
        fprintf(stderr, PROG ": %s: '%s' is not an integer in [1, %ld]\n", opt, text, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_pos(const char *opt, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v <= 0) {
        fprintf(stderr, PROG ": %s: '%s' is not a positive number\n", opt, text);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_quant(const char *text, wsync_quant_scheme_t *q)
{
    static const struct {
        const char *name;
        wsync_quant_scheme_t q;
    } names[] = {{"none", WSYNC_QUANT_NONE},
                 {"fp8-block", WSYNC_QUANT_BLOCK},
                 {"fp8-tensor", WSYNC_QUANT_TENSOR},
                 {"fp8-channel", WSYNC_QUANT_CHANNEL}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(text, names[i].name) == 0) {
            *q = names[i].q;
            return 0;
        }
    fprintf(stderr, PROG ": --quant: '%s' is not one of none, fp8-block, fp8-tensor, "
            "fp8-channel\n", text);
    return -1;
}

/* "1.23 GB" style, decimal units (GB = 1e9 bytes). */
static const char *human(uint64_t b, char *buf, size_t len)
{
    static const char *units[] = {"B", "kB", "MB", "GB", "TB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1000 && u < 4) {
        v /= 1000;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", b);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

static json_t *u64_array(const uint64_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

typedef struct {
    wsync_shard_t **shards;    /* [senders] */
    size_t *nshards;
    wsync_target_t **targets;  /* [engine_size] (engines share a layout) */
    size_t *ntargets;
} layouts_t;

static void layouts_free(layouts_t *l, const options_t *o)
{
    for (int s = 0; l->shards && s < o->senders; s++)
        wsync_layout_shards_free(l->shards[s], l->nshards[s]);
    for (int r = 0; l->targets && r < engine_size(o); r++)
        wsync_layout_targets_free(l->targets[r], l->ntargets[r]);
    free(l->shards);
    free(l->nshards);
    free(l->targets);
    free(l->ntargets);
}

static double now_s(clockid_t clk)
{
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Resident size now (VmRSS) and at its peak (VmHWM), in bytes; 0 where /proc cannot tell. */
static void rss_now(uint64_t *cur, uint64_t *peak)
{
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    *cur = *peak = 0;
    while (f && fgets(line, sizeof(line), f)) {
        unsigned long long kb;
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            *cur = (uint64_t)kb * 1024;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            *peak = (uint64_t)kb * 1024;
    }
    if (f)
        fclose(f);
}

/* min, mean, max of v[0..n) and where the max is */
typedef struct {
    uint64_t min, max;
    double mean;
    int argmax;
} spread_t;

static spread_t spread(const uint64_t *v, int n)
{
    spread_t s = {UINT64_MAX, 0, 0.0, 0};
    for (int i = 0; i < n; i++) {
        s.min = v[i] < s.min ? v[i] : s.min;
        if (v[i] > s.max) {
            s.max = v[i];
            s.argmax = i;
        }
        s.mean += (double)v[i] / n;
    }
    if (n == 0)
        s.min = 0;
    return s;
}

static void print_seconds(char *buf, size_t len, double s)
{
    if (s >= 1)
        snprintf(buf, len, "%.3f s", s);
    else if (s >= 1e-3)
        snprintf(buf, len, "%.3f ms", s * 1e3);
    else
        snprintf(buf, len, "%.3f us", s * 1e6);
}

#define LIST_MAX 16   /* more receivers (senders) than this: min / mean / max unless --verbose */

/* ---- FP8 on the wire, per target ------------------------------------------------------------
 * FP8 targets are listed by name with the layer (every number between dots) as '*': one line for
 * a kind of target, however many layers, receivers and replicas it has. */

#define GROUP_MAX 256          /* kinds of FP8 target listed; more go to the last line */
#define GROUP_NAME 128

static const char *const form_names[WSYNC_WIRE_NFORMS] = {
    "plain", "fp8", "cut cells", "shared", "per-tensor", "off", "uncovered"};
static const char *const form_keys[WSYNC_WIRE_NFORMS] = {
    "plain", "fp8", "cut_cells", "shared", "per_tensor", "off", "uncovered"};

typedef struct {
    char name[GROUP_NAME];
    uint64_t ntargets[WSYNC_WIRE_NFORMS];
    uint64_t bytes[WSYNC_WIRE_NFORMS], param_bytes[WSYNC_WIRE_NFORMS];
} wire_group_t;

typedef struct {
    wire_group_t *g;
    size_t n;
} wire_groups_t;

/* "model.layers.12.mlp.down_proj.weight" -> "model.layers.*.mlp.down_proj.weight" */
static void group_name(const char *name, char *out, size_t len)
{
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < len;) {
        const char *q = p;
        while (*q >= '0' && *q <= '9')
            q++;
        if (q > p && (p == name || p[-1] == '.') && (*q == '.' || *q == '\0')) {
            out[k++] = '*';
            p = q;
            continue;
        }
        out[k++] = *p++;
    }
    out[k] = '\0';
}

/* The summary's FP8 targets (every form but plain) grouped by kind; 0 or -1 (out of memory). */
static int wire_groups(const wsync_plan_summary_t *s, const wsync_target_t *targets,
                       wire_groups_t *wg)
{
    char name[GROUP_NAME];

    wg->n = 0;
    wg->g = calloc(GROUP_MAX, sizeof(*wg->g));
    if (wg->g == NULL)
        return -1;
    for (size_t j = 0; j < s->ntargets; j++) {
        int f = s->target_form[j];
        size_t k;
        if (f == WSYNC_WIRE_PLAIN)
            continue;
        group_name(targets[j].name ? targets[j].name : "(null)", name, sizeof(name));
        for (k = 0; k < wg->n; k++)
            if (strcmp(wg->g[k].name, name) == 0)
                break;
        if (k == wg->n) {
            if (wg->n == GROUP_MAX) {
                k = GROUP_MAX - 1;
                snprintf(wg->g[k].name, GROUP_NAME, "(others)");
            } else {
                snprintf(wg->g[k].name, GROUP_NAME, "%s", name);
                wg->n++;
            }
        }
        wg->g[k].ntargets[f]++;
        wg->g[k].bytes[f] += s->target_bytes[j];
        wg->g[k].param_bytes[f] += s->target_param_bytes[j];
    }
    return 0;
}

/* Bytes moved into FP8 targets (every form but plain), as they travel (param 0) or in the
 * params' dtype (param 1). */
static uint64_t wire_fp8_target_bytes(const wsync_plan_summary_t *s, int param)
{
    uint64_t b = 0;
    for (int f = 0; f < WSYNC_WIRE_NFORMS; f++)
        if (f != WSYNC_WIRE_PLAIN)
            b += param ? s->form_param_bytes[f] : s->form_bytes[f];
    return b;
}

static double ratio_of(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static void print_wire_table(const wsync_plan_summary_t *s, const wire_groups_t *wg)
{
    char a[32], b[32];
    uint64_t fp8 = wire_fp8_target_bytes(s, 0), fp8_param = wire_fp8_target_bytes(s, 1);

    if (wg->n == 0)
        return;
    printf("\nFP8 targets (by kind, layers as *; bytes moved into them, all receivers)\n");
    printf("  %-44s %7s %12s %12s %6s  %s\n", "target", "targets", "plain dtype", "moved",
           "ratio", "how (targets)");
    for (size_t k = 0; k < wg->n; k++) {
        const wire_group_t *g = &wg->g[k];
        uint64_t n = 0, by = 0, pb = 0;
        char how[160];
        size_t used = 0;
        how[0] = '\0';
        for (int f = 0; f < WSYNC_WIRE_NFORMS; f++) {
            n += g->ntargets[f];
            by += g->bytes[f];
            pb += g->param_bytes[f];
            if (g->ntargets[f] && used + 32 < sizeof(how))
                used += (size_t)snprintf(how + used, sizeof(how) - used, "%s%s %" PRIu64,
                                         used ? ", " : "", form_names[f], g->ntargets[f]);
        }
        printf("  %-44s %7" PRIu64 " %12s %12s %6.3f  %s\n", g->name, n,
               human(pb, a, sizeof(a)), human(by, b, sizeof(b)), ratio_of(by, pb), how);
    }
    printf("  FP8 on the wire %s: %s as FP8 codes and scales", s->fp8_wire ? "on" : "off",
           human(s->fp8_wire_bytes, a, sizeof(a)));
    for (int f = WSYNC_WIRE_CUT_CELLS; f < WSYNC_WIRE_NFORMS; f++)
        if (s->form_bytes[f])
            printf(", %s plain (%s)", human(s->form_bytes[f], b, sizeof(b)), form_names[f]);
    printf("\n  FP8 targets: %s moved for %s in the params' dtype: ratio %.4f\n",
           human(fp8, a, sizeof(a)), human(fp8_param, b, sizeof(b)), ratio_of(fp8, fp8_param));
}

/* The JSON's FP8-on-the-wire figures. */
static void wire_json(json_t *root, const wsync_plan_summary_t *s, const wire_groups_t *wg)
{
    json_t *forms = json_object(), *groups = json_array();
    uint64_t fp8 = wire_fp8_target_bytes(s, 0), fp8_param = wire_fp8_target_bytes(s, 1);

    json_object_set_new(root, "fp8_wire", json_boolean(s->fp8_wire));
    json_object_set_new(root, "fp8_wire_bytes", json_integer((json_int_t)s->fp8_wire_bytes));
    for (int f = 0; f < WSYNC_WIRE_NFORMS; f++) {
        json_t *o = json_object();
        json_object_set_new(o, "bytes", json_integer((json_int_t)s->form_bytes[f]));
        json_object_set_new(o, "param_bytes", json_integer((json_int_t)s->form_param_bytes[f]));
        json_object_set_new(forms, form_keys[f], o);
    }
    json_object_set_new(root, "wire_forms", forms);
    json_object_set_new(root, "fp8_targets_bytes", json_integer((json_int_t)fp8));
    json_object_set_new(root, "fp8_targets_param_bytes", json_integer((json_int_t)fp8_param));
    json_object_set_new(root, "fp8_targets_ratio", json_real(ratio_of(fp8, fp8_param)));
    json_object_set_new(root, "total_param_bytes", json_integer((json_int_t)s->total_param_bytes));
    json_object_set_new(root, "ratio_to_param_dtype",
                        json_real(ratio_of(s->total_bytes, s->total_param_bytes)));
    for (size_t k = 0; k < wg->n; k++) {
        const wire_group_t *g = &wg->g[k];
        json_t *o = json_object(), *n = json_object(), *b = json_object(), *p = json_object();
        json_object_set_new(o, "target", json_string(g->name));
        for (int f = 0; f < WSYNC_WIRE_NFORMS; f++) {
            if (!g->ntargets[f])
                continue;
            json_object_set_new(n, form_keys[f], json_integer((json_int_t)g->ntargets[f]));
            json_object_set_new(b, form_keys[f], json_integer((json_int_t)g->bytes[f]));
            json_object_set_new(p, form_keys[f], json_integer((json_int_t)g->param_bytes[f]));
        }
        json_object_set_new(o, "targets", n);
        json_object_set_new(o, "bytes", b);
        json_object_set_new(o, "param_bytes", p);
        json_array_append_new(groups, o);
    }
    json_object_set_new(root, "fp8_target_kinds", groups);
}

static void print_table(const options_t *o, const wsync_model_config_t *cfg,
                        const wsync_plan_summary_t *s, uint64_t naive_per_receiver,
                        uint64_t naive_total, double floor_s, const char *bottleneck,
                        const cost_t *cost, const wire_groups_t *wg)
{
    char a[32], b[32], c[32];
    int nr = s->nreceivers, ns = s->nsenders, per = engine_size(o);

    printf("wsync-plan: %s (%s, %" PRId64 " layers, hidden %" PRId64 ", vocab %" PRId64
           ", %s", o->config, wsync_model_type_name(cfg->model_type), cfg->num_hidden_layers,
           cfg->hidden_size, cfg->vocab_size,
           wsync_dtype_name(cfg->dtype ? cfg->dtype : WSYNC_DTYPE_BF16));
    if (cfg->num_experts > 0)
        printf(", %" PRId64 " experts top-%" PRId64 ", expert I %" PRId64, cfg->num_experts,
               cfg->num_experts_per_tok, cfg->moe_intermediate_size);
    printf(")\n");
    if (o->ep)
        printf("senders %d (%s) -> %d engine(s) x EP %d (attention DP %d x TP %d) = %d "
               "receivers", ns, o->sender_layout, o->replicas, o->ep, o->ep / o->tp, o->tp, nr);
    else
        printf("senders %d (%s) -> %d replica(s) x TP %d = %d receivers", ns, o->sender_layout,
               o->replicas, o->tp, nr);
    printf("; quant %s", o->quant);
    if (strcmp(o->quant, "fp8-block") == 0)
        printf(" %ldx%ld", o->fp8_block, o->fp8_block);
    printf("; FP8 on the wire %s; vocab pad %ld; bucket %g MiB; NIC %g Gb/s per rank\n\n",
           o->fp8_wire ? "on" : "off", o->vocab_pad, (double)s->bucket_bytes / 1048576.0,
           o->link_gbps);

    if (nr <= LIST_MAX || o->verbose) {
        printf("receivers\n  %-8s %-7s %-7s %-7s %14s %14s %14s\n", "receiver", "engine",
               "ep_rank", "tp_rank", "moved", "landed", "naive");
        for (int r = 0; r < nr; r++) {
            if (o->ep)
                snprintf(c, sizeof(c), "%d", r % per);
            else
                snprintf(c, sizeof(c), "-");
            printf("  %-8d %-7d %-7s %-7d", r, r / per, c, (r % per) % o->tp);
            printf(" %14s", human(s->bytes_per_receiver[r], a, sizeof(a)));
            printf(" %14s", human(s->bytes_landed_per_receiver[r], a, sizeof(a)));
            printf(" %14s\n", human(naive_per_receiver, a, sizeof(a)));
        }
    } else {
        spread_t m = spread(s->bytes_per_receiver, nr);
        spread_t l = spread(s->bytes_landed_per_receiver, nr);
        printf("receivers (%d; --verbose lists each)\n  %-8s %14s %14s %14s %s\n", nr, "",
               "min", "mean", "max", "(max at)");
        printf("  %-8s %14s %14s %14s receiver %d\n", "moved", human(m.min, a, sizeof(a)),
               human((uint64_t)m.mean, b, sizeof(b)), human(m.max, c, sizeof(c)), m.argmax);
        printf("  %-8s %14s %14s %14s receiver %d\n", "landed", human(l.min, a, sizeof(a)),
               human((uint64_t)l.mean, b, sizeof(b)), human(l.max, c, sizeof(c)), l.argmax);
        printf("  %-8s %14s (each)\n", "naive", human(naive_per_receiver, a, sizeof(a)));
    }

    if (ns <= LIST_MAX || o->verbose) {
        printf("\nsenders\n  %-8s %14s %14s %8s\n", "sender", "sent", "staged", "buckets");
        for (int sn = 0; sn < ns; sn++)
            printf("  %-8d %14s %14s %8" PRIu64 "\n", sn,
                   human(s->bytes_per_sender[sn], a, sizeof(a)),
                   human(s->staged_bytes_per_sender[sn], b, sizeof(b)),
                   s->buckets_per_sender[sn]);
    } else {
        spread_t t = spread(s->bytes_per_sender, ns);
        spread_t g = spread(s->staged_bytes_per_sender, ns);
        printf("\nsenders (%d; --verbose lists each)\n  %-8s %14s %14s %14s %s\n", ns, "", "min",
               "mean", "max", "(max at)");
        printf("  %-8s %14s %14s %14s sender %d\n", "sent", human(t.min, a, sizeof(a)),
               human((uint64_t)t.mean, b, sizeof(b)), human(t.max, c, sizeof(c)), t.argmax);
        printf("  %-8s %14s %14s %14s sender %d\n", "staged", human(g.min, a, sizeof(a)),
               human((uint64_t)g.mean, b, sizeof(b)), human(g.max, c, sizeof(c)), g.argmax);
    }

    if ((ns <= LIST_MAX && nr <= LIST_MAX) || o->verbose) {
        printf("\nbytes per link (row: sender, column: receiver)\n  %-8s", "");
        for (int r = 0; r < nr; r++) {
            snprintf(a, sizeof(a), "r%d", r);
            printf(" %14s", a);
        }
        printf("\n");
        for (int sn = 0; sn < ns; sn++) {
            printf("  s%-7d", sn);
            for (int r = 0; r < nr; r++)
                printf(" %14s", human(s->pair_bytes[(size_t)sn * nr + r], a, sizeof(a)));
            printf("\n");
        }
    }

    print_wire_table(s, wg);
    printf("\ntotal moved     %s (%" PRIu64 " bytes)\n", human(s->total_bytes, a, sizeof(a)),
           s->total_bytes);
    if (s->total_param_bytes != s->total_bytes)
        printf("whole model     %.4f of the %s it takes with every param in its dtype\n",
               ratio_of(s->total_bytes, s->total_param_bytes),
               human(s->total_param_bytes, a, sizeof(a)));
    printf("naive total     %s (%" PRIu64 " bytes: full model to each of %d receivers)\n",
           human(naive_total, a, sizeof(a)), naive_total, nr);
    printf("ratio to naive  %.4f\n", naive_total ? (double)s->total_bytes / naive_total : 0.0);
    printf("total landed    %s\n", human(s->total_landed_bytes, a, sizeof(a)));
    printf("plan            %" PRIu64 " chunks, %" PRIu64 " segments, fingerprint %016" PRIx64
           "\n", s->nchunks, s->nsegments, s->fingerprint);
    print_seconds(a, sizeof(a), floor_s);
    printf("floor           %s at %g Gb/s per NIC (bottleneck: %s)\n", a, o->link_gbps,
           bottleneck);
    print_seconds(a, sizeof(a), cost->compile_s);
    print_seconds(b, sizeof(b), cost->compile_cpu_s);
    printf("compile         %s wall, %s CPU", a, b);
    print_seconds(a, sizeof(a), cost->layout_s);
    printf(" (layouts: %s)\n", a);
    printf("plan memory     %s (peak resident %s, before the compile %s)\n",
           human(cost->rss_peak > cost->rss_before ? cost->rss_peak - cost->rss_before : 0, a,
                 sizeof(a)),
           human(cost->rss_peak, b, sizeof(b)), human(cost->rss_before, c, sizeof(c)));
    printf("wire            %s (encoded plan, %s the %u-byte control frame)\n",
           human(cost->wire_bytes, a, sizeof(a)),
           cost->wire_bytes <= (64u << 20) ? "fits" : "PAST", 64u << 20);
    if (s->wire_checked)
        printf("wire check      encode -> decode -> same plan -> every sender's and receiver's "
               "check: ok, %.3f s\n", s->wire_check_seconds);
    printf("\nNote: 'moved' counts bytes as they travel: the checkpoint dtype, or FP8 codes "
           "and fp32 scales for\nFP8 targets that travel FP8 (the others are quantized on the "
           "receiver); 'landed' is what the\ntargets hold. 'sent' counts one copy per receiver "
           "(point to point); 'staged' packs a chunk\nthat several receivers need once.\n");
}

static int print_json(const options_t *o, const wsync_model_config_t *cfg,
                      const wsync_plan_summary_t *s, uint64_t naive_per_receiver,
                      uint64_t naive_total, double floor_s, const char *bottleneck,
                      const cost_t *cost, const wire_groups_t *wg)
{
    size_t nr = (size_t)s->nreceivers, ns = (size_t)s->nsenders;
    json_t *root = json_object(), *conf = json_object(), *pairs = json_array();
    spread_t m = spread(s->bytes_per_receiver, (int)nr);
    spread_t t = spread(s->bytes_per_sender, (int)ns);
    char fp[17];

    json_object_set_new(conf, "config", json_string(o->config));
    json_object_set_new(conf, "model_type", json_string(wsync_model_type_name(cfg->model_type)));
    json_object_set_new(conf, "param_dtype",
                        json_string(wsync_dtype_name(cfg->dtype ? cfg->dtype : WSYNC_DTYPE_BF16)));
    json_object_set_new(conf, "num_experts", json_integer(cfg->num_experts));
    json_object_set_new(conf, "senders", json_integer(o->senders));
    json_object_set_new(conf, "sender_layout", json_string(o->sender_layout));
    json_object_set_new(conf, "tp", json_integer(o->tp));
    json_object_set_new(conf, "ep", json_integer(o->ep));
    json_object_set_new(conf, "replicas", json_integer(o->replicas));
    json_object_set_new(conf, "receivers", json_integer((json_int_t)nr));
    json_object_set_new(conf, "quant", json_string(o->quant));
    json_object_set_new(conf, "fp8_block", json_integer(o->fp8_block));
    json_object_set_new(conf, "fp8_wire", json_boolean(o->fp8_wire));
    json_object_set_new(conf, "vocab_pad", json_integer(o->vocab_pad));
    json_object_set_new(conf, "bucket_bytes", json_integer((json_int_t)s->bucket_bytes));
    json_object_set_new(conf, "link_gbps", json_real(o->link_gbps));
    json_object_set_new(root, "config", conf);

    json_object_set_new(root, "bytes_per_receiver", u64_array(s->bytes_per_receiver, nr));
    json_object_set_new(root, "bytes_per_receiver_min", json_integer((json_int_t)m.min));
    json_object_set_new(root, "bytes_per_receiver_max", json_integer((json_int_t)m.max));
    json_object_set_new(root, "bytes_per_receiver_mean", json_real(m.mean));
    json_object_set_new(root, "bytes_landed_per_receiver",
                        u64_array(s->bytes_landed_per_receiver, nr));
    json_object_set_new(root, "naive_bytes_per_receiver",
                        json_integer((json_int_t)naive_per_receiver));
    json_object_set_new(root, "total_bytes", json_integer((json_int_t)s->total_bytes));
    json_object_set_new(root, "naive_total_bytes", json_integer((json_int_t)naive_total));
    json_object_set_new(root, "ratio_to_naive",
                        json_real(naive_total ? (double)s->total_bytes / naive_total : 0.0));
    json_object_set_new(root, "total_landed_bytes",
                        json_integer((json_int_t)s->total_landed_bytes));
    for (size_t sn = 0; sn < ns; sn++)
        json_array_append_new(pairs, u64_array(s->pair_bytes + sn * nr, nr));
    json_object_set_new(root, "pair_bytes", pairs);
    json_object_set_new(root, "bytes_per_sender", u64_array(s->bytes_per_sender, ns));
    json_object_set_new(root, "bytes_per_sender_min", json_integer((json_int_t)t.min));
    json_object_set_new(root, "bytes_per_sender_max", json_integer((json_int_t)t.max));
    json_object_set_new(root, "bytes_per_sender_mean", json_real(t.mean));
    json_object_set_new(root, "staged_bytes_per_sender",
                        u64_array(s->staged_bytes_per_sender, ns));
    json_object_set_new(root, "buckets_per_sender", u64_array(s->buckets_per_sender, ns));
    json_object_set_new(root, "nchunks", json_integer((json_int_t)s->nchunks));
    json_object_set_new(root, "nsegments", json_integer((json_int_t)s->nsegments));
    snprintf(fp, sizeof(fp), "%016" PRIx64, s->fingerprint);
    json_object_set_new(root, "fingerprint", json_string(fp));
    json_object_set_new(root, "floor_seconds", json_real(floor_s));
    json_object_set_new(root, "floor_bottleneck", json_string(bottleneck));
    json_object_set_new(root, "fp8_quantized_on_receiver",
                        json_boolean(wire_fp8_target_bytes(s, 0) > s->fp8_wire_bytes));
    wire_json(root, s, wg);
    json_object_set_new(root, "layout_seconds", json_real(cost->layout_s));
    json_object_set_new(root, "compile_seconds", json_real(cost->compile_s));
    json_object_set_new(root, "compile_cpu_seconds", json_real(cost->compile_cpu_s));
    json_object_set_new(root, "rss_before_compile_bytes",
                        json_integer((json_int_t)cost->rss_before));
    json_object_set_new(root, "rss_peak_bytes", json_integer((json_int_t)cost->rss_peak));
    json_object_set_new(root, "plan_memory_bytes",
                        json_integer((json_int_t)(cost->rss_peak > cost->rss_before
                                                      ? cost->rss_peak - cost->rss_before
                                                      : 0)));
    json_object_set_new(root, "plan_wire_bytes", json_integer((json_int_t)cost->wire_bytes));
    json_object_set_new(root, "plan_wire_checked", json_boolean(s->wire_checked));

    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(12));
    json_decref(root);
    if (!text) {
        fprintf(stderr, PROG ": cannot encode the JSON output\n");
        return -1;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

/* Parses argv into o; returns -1 to exit 0 (help), 2 on a usage error, 0 to go on. */
static int parse_args(int argc, char **argv, options_t *o)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"senders", required_argument, NULL, 'n'},
        {"sender-layout", required_argument, NULL, 'l'},
        {"tp", required_argument, NULL, 't'},
        {"ep", required_argument, NULL, 'e'},
        {"replicas", required_argument, NULL, 'r'},
        {"quant", required_argument, NULL, 'q'},
        {"vocab-pad", required_argument, NULL, 'v'},
        {"fp8-block", required_argument, NULL, 'B'},
        {"fp8-wire", required_argument, NULL, 'w'},
        {"bucket-mb", required_argument, NULL, 'b'},
        {"link-gbps", required_argument, NULL, 'g'},
        {"json", no_argument, NULL, 'j'},
        {"verbose", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long v;
    int c;
    wsync_quant_scheme_t q;

    opterr = 0; /* reported below, naming the option */
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': o->config = optarg; break;
        case 'n':
            if (parse_int("--senders", optarg, 1 << 20, &v))
                return 2;
            o->senders = (int)v;
            break;
        case 'l':
            if (strcmp(optarg, "fsdp") && strcmp(optarg, "ep") && strcmp(optarg, "fused")) {
                fprintf(stderr, PROG ": --sender-layout: '%s' is not one of fsdp, ep, fused\n",
                        optarg);
                return 2;
            }
            o->sender_layout = optarg;
            break;
        case 't':
            if (parse_int("--tp", optarg, 1 << 16, &v))
                return 2;
            o->tp = (int)v;
            break;
        case 'e':
            if (parse_int("--ep", optarg, 1 << 16, &v))
                return 2;
            o->ep = (int)v;
            break;
        case 'r':
            if (parse_int("--replicas", optarg, 1 << 16, &v))
                return 2;
            o->replicas = (int)v;
            break;
        case 'q':
            if (parse_quant(optarg, &q))
                return 2;
            o->quant = optarg;
            break;
        case 'v':
            if (parse_int("--vocab-pad", optarg, 1L << 30, &v))
                return 2;
            o->vocab_pad = v;
            break;
        case 'B':
            if (parse_int("--fp8-block", optarg, 1L << 20, &v))
                return 2;
            o->fp8_block = v;
            break;
        case 'w':
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, PROG ": --fp8-wire: '%s' is not one of on, off\n", optarg);
                return 2;
            }
            o->fp8_wire = strcmp(optarg, "on") == 0;
            break;
        case 'b':
            if (parse_pos("--bucket-mb", optarg, &o->bucket_mb))
                return 2;
            break;
        case 'g':
            if (parse_pos("--link-gbps", optarg, &o->link_gbps))
                return 2;
            break;
        case 'j': o->json = 1; break;
        case 'V': o->verbose = 1; break;
        case 'h': usage(stdout); return -1;
        default: {
            const char *arg = argv[optind - 1], *eq = strchr(arg, '=');
            int is_long = strncmp(arg, "--", 2) == 0;
            if (optopt && is_long && eq)
                fprintf(stderr, PROG ": option '%.*s' takes no value (see --help)\n",
                        (int)(eq - arg), arg);
            else if (optopt && is_long)
                fprintf(stderr, PROG ": option '%s' needs a value (see --help)\n", arg);
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
    if (!o->config || !o->senders || !o->tp) {
        fprintf(stderr, PROG ": %s is required (see --help)\n",
                !o->config ? "--config" : !o->senders ? "--senders" : "--tp");
        return 2;
    }
    if (o->ep && o->ep % o->tp != 0) {
        fprintf(stderr, PROG ": --ep %d is not a multiple of --tp %d (vLLM: EP = TP x DP)\n",
                o->ep, o->tp);
        return 2;
    }
    if ((int64_t)o->replicas * engine_size(o) > (1 << 20)) {
        fprintf(stderr, PROG ": --replicas %d x %s %d: too many receivers\n", o->replicas,
                o->ep ? "--ep" : "--tp", engine_size(o));
        return 2;
    }
    double bucket = o->bucket_mb * 1048576.0;
    if (bucket < 64 || bucket > 1099511627776.0) {
        fprintf(stderr, PROG ": --bucket-mb %g: the bucket must be between 64 bytes and 1 TiB\n",
                o->bucket_mb);
        return 2;
    }
    return 0;
}

/* Rank s's shards of transformers 5.x's in-memory params fp (wsync_model_fused_params, made
 * once for every rank: naming and fusing a trillion-parameter MoE's 69,120 expert params 256
 * times was most of the tool's time): FSDP dim 0 of each (the fused experts included), each
 * fused shard unfused into the checkpoint's per-expert params. */
static wsync_status_t fused_shards(const wsync_param_t *fp, size_t nfp, int s, int n,
                                   wsync_shard_t **out, size_t *nout)
{
    size_t len = 0, cap = 0;
    wsync_shard_t *v = NULL;
    wsync_status_t st = WSYNC_OK;

    for (size_t i = 0; st == WSYNC_OK && i < nfp; i++) {
        wsync_shard_t one, *parts = NULL;
        size_t nparts = 0;
        memset(&one, 0, sizeof(one));
        one.param = fp[i];
        one.mem = WSYNC_MEM_HOST;
        if ((st = wsync_layout_shard_box(&fp[i], 0, s, n, &one.box)) != WSYNC_OK ||
            (st = wsync_layout_unfuse_experts(&one, &parts, &nparts)) != WSYNC_OK)
            break;
        if (len + nparts > cap) {
            size_t nc = cap ? cap * 2 : 1024;
            while (nc < len + nparts)
                nc *= 2;
            wsync_shard_t *nv = realloc(v, nc * sizeof(*nv));
            if (nv == NULL) {
                wsync_layout_shards_free(parts, nparts);
                st = WSYNC_ERR_NOMEM;
                break;
            }
            v = nv;
            cap = nc;
        }
        memcpy(v + len, parts, nparts * sizeof(*parts));   /* names move into v */
        len += nparts;
        free(parts);
    }
    if (st != WSYNC_OK) {
        wsync_layout_shards_free(v, len);
        return st;
    }
    *out = v;
    *nout = len;
    return WSYNC_OK;
}

/* Each sender's shards (--sender-layout) and each engine rank's targets (--tp, --ep, --quant)
 * into l; *nsh, *ntg: their counts (the targets of one replica). 0, or 1 with the error printed. */
static int make_layouts(const options_t *o, const wsync_model_config_t *cfg,
                        wsync_quant_scheme_t qs, layouts_t *l, size_t *nsh, size_t *ntg)
{
    const int per = engine_size(o);
    wsync_param_t *fused = NULL;
    size_t nfused = 0;

    *nsh = *ntg = 0;
    l->shards = calloc((size_t)o->senders, sizeof(*l->shards));
    l->nshards = calloc((size_t)o->senders, sizeof(*l->nshards));
    l->targets = calloc((size_t)per, sizeof(*l->targets));
    l->ntargets = calloc((size_t)per, sizeof(*l->ntargets));
    if (!l->shards || !l->nshards || !l->targets || !l->ntargets) {
        fprintf(stderr, PROG ": out of memory\n");
        goto fail;
    }
    if (strcmp(o->sender_layout, "fused") == 0 &&
        wsync_model_fused_params(cfg, (wsync_dtype_t)0, &fused, &nfused) != WSYNC_OK) {
        fprintf(stderr, PROG ": --sender-layout fused: %s\n", wsync_last_error());
        goto fail;
    }
    for (int s = 0; s < o->senders; s++) {
        wsync_status_t st;
        if (strcmp(o->sender_layout, "ep") == 0)
            st = wsync_layout_ep_shards(cfg, (wsync_dtype_t)0, s, o->senders, 0, &l->shards[s],
                                        &l->nshards[s]);
        else if (strcmp(o->sender_layout, "fused") == 0)
            st = fused_shards(fused, nfused, s, o->senders, &l->shards[s], &l->nshards[s]);
        else
            st = wsync_layout_fsdp_shards(cfg, (wsync_dtype_t)0, s, o->senders, &l->shards[s],
                                          &l->nshards[s]);
        if (st != WSYNC_OK) {
            fprintf(stderr, PROG ": --senders %d (--sender-layout %s): %s\n", o->senders,
                    o->sender_layout, wsync_last_error());
            goto fail;
        }
        *nsh += l->nshards[s];
    }
    wsync_model_params_free(fused, nfused);   /* the shards own copies of the names */
    fused = NULL;
    nfused = 0;
    wsync_tp_options_t topt = WSYNC_TP_OPTIONS_INIT;
    topt.quant.scheme = qs;
    if (qs == WSYNC_QUANT_BLOCK)
        topt.quant.block_rows = topt.quant.block_cols = (int)o->fp8_block;
    topt.vocab_pad = o->vocab_pad;
    for (int r = 0; r < per; r++) {
        /* with --ep, layout r is EP rank r: TP rank r % T of its attention group */
        topt.ep_size = o->ep;
        topt.ep_rank = o->ep ? r : 0;
        if (wsync_layout_tp_targets(cfg, r % o->tp, o->tp, &topt, &l->targets[r],
                                    &l->ntargets[r]) != WSYNC_OK) {
            if (o->ep)
                fprintf(stderr, PROG ": --tp %d --ep %d: %s\n", o->tp, o->ep, wsync_last_error());
            else
                fprintf(stderr, PROG ": --tp %d: %s\n", o->tp, wsync_last_error());
            goto fail;
        }
        *ntg += l->ntargets[r];
    }
    return 0;
fail:
    wsync_model_params_free(fused, nfused);
    return 1;
}

int main(int argc, char **argv)
{
    options_t o = {NULL, 0, 0, 1, 0, "fsdp", "none", 128, 1, 64, 256.0, 400.0, 0, 0};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;

    wsync_quant_scheme_t qs = WSYNC_QUANT_NONE;
    parse_quant(o.quant, &qs);
    wsync_model_config_t cfg;
    if (wsync_model_config_load(o.config, &cfg) != WSYNC_OK) {
        fprintf(stderr, PROG ": --config: %s\n", wsync_last_error());
        return 1;
    }
    if ((o.ep || strcmp(o.sender_layout, "fsdp") != 0) && cfg.num_experts == 0) {
        fprintf(stderr, PROG ": %s needs a mixture-of-experts model; %s is %s, dense\n",
                o.ep ? "--ep" : "--sender-layout ep/fused", o.config,
                wsync_model_type_name(cfg.model_type));
        return 2;
    }

    layouts_t l = {0};
    wsync_param_t *params = NULL;
    size_t nparams = 0;
    wsync_shard_t *shards = NULL;
    wsync_target_t *targets = NULL;
    int *shard_sender = NULL, *target_receiver = NULL;
    wsync_plan_summary_t *sum = NULL;
    wire_groups_t wg = {0};
    int per = engine_size(&o), nr = o.replicas * per;
    cost_t cost;
    memset(&cost, 0, sizeof(cost));
    rc = 1;

    /* naive: every full param, in the checkpoint dtype, to every receiver */
    uint64_t naive = 0;
    if (wsync_model_params(&cfg, (wsync_dtype_t)0, &params, &nparams) != WSYNC_OK) {
        fprintf(stderr, PROG ": %s\n", wsync_last_error());
        goto out;
    }
    for (size_t i = 0; i < nparams; i++) {
        uint64_t e = wsync_dtype_size(params[i].dtype);
        for (int d = 0; d < params[i].ndim; d++)
            e *= (uint64_t)params[i].shape[d];
        naive += e;
    }

    double t0 = now_s(CLOCK_MONOTONIC);
    size_t nsh = 0, ntg = 0;
    if (make_layouts(&o, &cfg, qs, &l, &nsh, &ntg) != 0)
        goto out;
    ntg *= (size_t)o.replicas;

    /* flat arrays of shallow copies; the layouts keep ownership of names and pieces */
    shards = calloc(nsh ? nsh : 1, sizeof(*shards));
    shard_sender = calloc(nsh ? nsh : 1, sizeof(*shard_sender));
    targets = calloc(ntg ? ntg : 1, sizeof(*targets));
    target_receiver = calloc(ntg ? ntg : 1, sizeof(*target_receiver));
    if (!shards || !shard_sender || !targets || !target_receiver) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    size_t k = 0;
    for (int s = 0; s < o.senders; s++)
        for (size_t i = 0; i < l.nshards[s]; i++, k++) {
            shards[k] = l.shards[s][i];
            shard_sender[k] = s;
        }
    k = 0;
    for (int r = 0; r < nr; r++)
        for (size_t j = 0; j < l.ntargets[r % per]; j++, k++) {
            targets[k] = l.targets[r % per][j];
            target_receiver[k] = r;
        }
    cost.layout_s = now_s(CLOCK_MONOTONIC) - t0;

    size_t bucket = (size_t)(o.bucket_mb * 1048576.0);
    uint64_t peak0;
    rss_now(&cost.rss_before, &peak0);
    double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    if (wsync_plan_summarize_wire(shards, shard_sender, nsh, targets, target_receiver, ntg,
                                  o.senders, nr, bucket, o.fp8_wire, &sum) != WSYNC_OK) {
        fprintf(stderr, PROG ": plan: %s\n", wsync_last_error());
        goto out;
    }
    cost.compile_s = now_s(CLOCK_MONOTONIC) - w0;
    cost.compile_cpu_s = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    {
        uint64_t cur;
        rss_now(&cur, &cost.rss_peak);
    }
    cost.wire_bytes = sum->wire_bytes;     /* the PLAN the coordinator sends, as encoded */

    uint64_t max_in = 0, max_out = 0;
    int arg_in = 0, arg_out = 0;
    for (int r = 0; r < nr; r++)
        if (sum->bytes_per_receiver[r] > max_in) {
            max_in = sum->bytes_per_receiver[r];
            arg_in = r;
        }
    for (int s = 0; s < o.senders; s++)
        if (sum->bytes_per_sender[s] > max_out) {
            max_out = sum->bytes_per_sender[s];
            arg_out = s;
        }
    char bottleneck[64];
    if (max_in >= max_out)
        snprintf(bottleneck, sizeof(bottleneck), "into receiver %d", arg_in);
    else
        snprintf(bottleneck, sizeof(bottleneck), "out of sender %d", arg_out);
    double floor_s = (double)(max_in > max_out ? max_in : max_out) / (o.link_gbps * 1e9 / 8.0);
    uint64_t naive_total = naive * (uint64_t)nr;

    if (wire_groups(sum, targets, &wg) != 0) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    print_table(&o, &cfg, sum, naive, naive_total, floor_s, bottleneck, &cost, &wg);
    if (o.json &&
        print_json(&o, &cfg, sum, naive, naive_total, floor_s, bottleneck, &cost, &wg) != 0)
        goto out;
    rc = 0;
out:
    free(wg.g);
    wsync_plan_summary_free(sum);
    free(shards);
    free(shard_sender);
    free(targets);
    free(target_receiver);
    layouts_free(&l, &o);
    wsync_model_params_free(params, nparams);
    return rc;
}
