/* wsync-bench's model runs, their report: the floor the compiled plan implies at the link
 * speeds measured in the same run (one peer pair alone, and every pair at once), the table and
 * the JSON line of a run, and --delta's report. */
#include "bench/bench_model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double peer_gbps, peer_min, peer_max, d2d_gbps, memcpy_gbps;
    double floor_s;
    /* the same floor at the probe's all-pairs-at-once peer speed (0: not measured: one pair) */
    double peer_all_gbps, floor_all_s;
    int floor_gpu;
    uint64_t in_b, out_b, local_b;        /* of the floor's GPU */
} model_floor_t;

static void compute_floor(const model_t *m, double memcpy_gbps, model_floor_t *f)
{
    const wsync_plan_summary_t *sum = bench_model_moved(m);   /* the bytes as they travel */
    const bench_probe_res_t *p = &m->sh->probe;
    const bench_probe_req_t *q = &m->sh->probe_req;
    memset(f, 0, sizeof(*f));
    f->floor_gpu = -1;
    if (!m->o->mem_cuda) {
        uint64_t most = 0;
        for (int r = 0; r < m->NR; r++)
            if (sum->bytes_per_receiver[r] > most)
                most = sum->bytes_per_receiver[r];
        f->memcpy_gbps = memcpy_gbps;
        f->floor_s = memcpy_gbps > 0 ? (double)most / (memcpy_gbps * 1e9) : 0;
        return;
    }
    double v[MODEL_MAX_GPUS * MODEL_MAX_GPUS];
    int nv = 0;
    for (int i = 0; i < q->npairs; i++)
        if (p->peer_gbps[i] > 0)
            v[nv++] = p->peer_gbps[i];
    if (nv > 0) {
        bench_stats_t s = bench_stats_of(v, nv);
        f->peer_gbps = s.median;
        f->peer_min = s.min;
        f->peer_max = s.max;
    }
    nv = 0;
    for (int i = 0; i < q->ngpus; i++)
        if (p->d2d_gbps[i] > 0)
            v[nv++] = p->d2d_gbps[i];
    if (nv > 0)
        f->d2d_gbps = bench_stats_of(v, nv).median;
    for (int g = 0; g < m->ngpu; g++) {
        uint64_t in = 0, out = 0, local = 0;
        for (int s = 0; s < m->N; s++)
            for (int r = 0; r < m->NR; r++) {
                uint64_t b = sum->pair_bytes[s * m->NR + r];
                if (m->gpu_s[s] == g && m->gpu_r[r] == g)
                    local += b;
                else if (m->gpu_r[r] == g)
                    in += b;
            }
        /* out: per sender on g and TP rank t, the most any replica on another GPU takes */
        for (int s = 0; s < m->N; s++) {
            if (m->gpu_s[s] != g)
                continue;
            for (int t = 0; t < m->T; t++) {
                uint64_t most = 0;
                for (int k = 0; k < m->R; k++) {
                    int r = k * m->T + t;
                    uint64_t b = sum->pair_bytes[s * m->NR + r];
                    if (m->gpu_r[r] != g && b > most)
                        most = b;
                }
                out += most;
            }
        }
        double link = (double)(in > out ? in : out);
        double t_local = f->d2d_gbps > 0 ? (double)local / (f->d2d_gbps * 1e9) : 0;
        double t = (f->peer_gbps > 0 ? link / (f->peer_gbps * 1e9) : 0) + t_local;
        if (p->peer_all_gbps > 0) {
            double t_all = link / (p->peer_all_gbps * 1e9) + t_local;
            f->peer_all_gbps = p->peer_all_gbps;
            if (t_all > f->floor_all_s)
                f->floor_all_s = t_all;
        }
        if (t > f->floor_s) {
            f->floor_s = t;
            f->floor_gpu = g;
            f->in_b = in;
            f->out_b = out;
            f->local_b = local;
        }
    }
}

static void gpu_list(char *buf, size_t len, const int *g, int n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 8 < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%d", i ? "," : "", g[i]);
}

/* What a run's report says: its times, bytes and floor, and whether every receiver got it right. */
typedef struct {
    double times[MODEL_MAX_VERSIONS];
    bench_stats_t t;                  /* of times[0 .. iters) */
    const wsync_plan_summary_t *sum;  /* the bytes as they travelled */
    int wire;                         /* FP8 on the wire used */
    uint64_t moved, per_recv;         /* bytes in all; the most into one receiver */
    model_floor_t f;
    double gbps, gbps_recv, ratio_floor, bcast, ratio_bcast;
    int right, skipped;
    const char *first_wrong;
    char gs[256], gr[256];            /* GPUs of the senders and of the receivers (CUDA memory) */
} model_result_t;

static void model_result(const model_t *m, double memcpy_gbps, model_result_t *res)
{
    const bench_opts_t *o = m->o;
    const model_shared_t *sh = m->sh;
    const int K = o->iters;

    memset(res, 0, sizeof(*res));
    for (int k = 0; k < K; k++) {
        int v = o->warmup + k; /* index of version v+1 */
        if (o->store) {
            for (int r = 0; r < m->NR; r++)
                if (sh->fetch_s[v][r] > res->times[k])
                    res->times[k] = sh->fetch_s[v][r];
        } else {
            for (int s = 0; s < m->N; s++)
                if (sh->push_s[v][s] > res->times[k])
                    res->times[k] = sh->push_s[v][s];
        }
    }
    res->t = bench_stats_of(res->times, K);
    res->sum = bench_model_moved(m);
    res->wire = res->sum == m->sum_wire;
    res->moved = res->sum->total_bytes;
    for (int r = 0; r < m->NR; r++)
        if (res->sum->bytes_per_receiver[r] > res->per_recv)
            res->per_recv = res->sum->bytes_per_receiver[r];
    compute_floor(m, memcpy_gbps, &res->f);
    res->gbps = (double)res->moved / res->t.median / 1e9;
    res->gbps_recv = (double)res->per_recv / res->t.median / 1e9;
    res->ratio_floor = res->f.floor_s > 0 ? res->t.median / res->f.floor_s : 0;
    res->bcast = o->mem_cuda ? sh->probe.bcast_gbps : 0;
    res->ratio_bcast = res->bcast > 0 ? res->gbps_recv / res->bcast : 0;
    res->right = 1;
    res->first_wrong = "";
    for (int r = 0; r < m->NR; r++) {
        if (sh->verdict[r] != 1 || sh->final_version[r] != (uint64_t)(o->warmup + K)) {
            res->right = 0;
            if (!res->first_wrong[0])
                res->first_wrong = sh->first_wrong[r][0] ? sh->first_wrong[r] : "version";
        }
        res->skipped += sh->skipped_versions[r];
    }
    if (o->mem_cuda) {
        gpu_list(res->gs, sizeof(res->gs), m->gpu_s, m->N);
        gpu_list(res->gr, sizeof(res->gr), m->gpu_r, m->NR);
    }
}

/* The run's table on stdout. */
static void print_model_table(const model_t *m, const model_result_t *res)
{
    const bench_opts_t *o = m->o;
    const model_shared_t *sh = m->sh;
    const model_floor_t *f = &res->f;
    const bench_stats_t *t = &res->t;
    const int K = o->iters;
    char experts[96] = "";

    if (m->cfg.num_experts > 0)
        snprintf(experts, sizeof(experts), ", %lld experts %s, senders %s",
                 (long long)m->cfg.num_experts,
                 o->ep > 1 ? "whole per rank (EP)" : "split inside by TP",
                 o->fused_experts ? "fused (whole experts)" : "per expert");
    printf("%s: %s (%llu params, %.3f GB%s), FSDP-%d -> %d replica%s x %s-%d, %s, mem %s, "
           "quant %s, scheme %s (asked %s)\n",
           PROG, m->shape->name, (unsigned long long)m->param_elems,
           (double)m->param_bytes / 1e9, experts, m->N, m->R, m->R == 1 ? "" : "s",
           o->ep > 1 ? "EP" : "TP", m->T, o->colocated ? "colocated" : "disaggregated",
           o->mem_cuda ? "cuda" : "host",
           o->quant_fp8 ? "fp8-block" : "none", sh->scheme, o->scheme);
    if (o->mem_cuda)
        printf("  GPUs              %d visible (%s); senders on %s; receivers on %s\n", m->ngpu,
               sh->gpu_name, res->gs, res->gr);
    printf("  seconds           median %.6f   min %.6f   max %.6f   (%d version%s after %d "
           "warm-up; %s)\n",
           t->median, t->min, t->max, K, K == 1 ? "" : "s", o->warmup,
           o->store ? "slowest receiver's fetch" : "slowest sender's push");
    printf("  bytes moved       %.4f GB (plan: %llu chunks, %llu segments); most into one "
           "receiver %.4f GB\n",
           (double)res->moved / 1e9, (unsigned long long)res->sum->nchunks,
           (unsigned long long)res->sum->nsegments, (double)res->per_recv / 1e9);
    if (o->quant_fp8)
        printf("  FP8 on the wire   %s: %.4f GB moved, %.4f of them FP8 codes and scales; %.4f x "
               "the %.4f GB of the params' dtype\n",
               res->wire ? "on" : o->fp8_wire ? "asked, not used by this scheme" : "off",
               (double)res->moved / 1e9, (double)res->sum->fp8_wire_bytes / 1e9,
               m->sum->total_bytes ? (double)res->moved / (double)m->sum->total_bytes : 0.0,
               (double)m->sum->total_bytes / 1e9);
    printf("  GB/s              %.1f (bytes moved / median); %.1f per receiver\n", res->gbps,
           res->gbps_recv);
    if (o->mem_cuda) {
        printf("  links             peer %.1f GB/s (median of %d pairs, %.1f..%.1f), "
               "device-to-device %.1f GB/s\n",
               f->peer_gbps, sh->probe_req.npairs, f->peer_min, f->peer_max, f->d2d_gbps);
        printf("  broadcast         %s%s%.1f GB/s\n", sh->probe.bcast_note,
               res->bcast > 0 ? ": " : "", res->bcast);
        printf("  floor             %.6f s: GPU %d, max(in %.3f GB, out %.3f GB) at peer "
               "GB/s + %.3f GB local at device-to-device GB/s\n",
               f->floor_s, f->floor_gpu, (double)f->in_b / 1e9, (double)f->out_b / 1e9,
               (double)f->local_b / 1e9);
        if (f->floor_all_s > 0)
            printf("  floor, all peers  %.6f s: the same bytes at %.1f GB/s, the probe's every "
                   "peer pair at once; ratio %.3f\n",
                   f->floor_all_s, f->peer_all_gbps, t->median / f->floor_all_s);
    } else {
        printf("  floor             %.6f s: the largest receiver's bytes at one core's memcpy "
               "(%.2f GB/s)\n",
               f->floor_s, f->memcpy_gbps);
    }
    printf("  ratio to floor    %.3f  (median seconds / floor seconds)\n", res->ratio_floor);
    if (res->bcast > 0)
        printf("  ratio to bcast    %.3f  (per-receiver GB/s / broadcast GB/s)\n",
               res->ratio_bcast);
    if (res->right)
        printf("  correct           yes: every receiver holds exactly version %d%s\n",
               o->warmup + K, res->skipped ? " (some waits skipped a version)" : "");
    else
        printf("  correct           NO: %s\n", res->first_wrong);
}

/* The run's JSON line (--json; the keys are in the top README). */
static void print_model_json(const model_t *m, const model_result_t *res)
{
    const bench_opts_t *o = m->o;
    const model_shared_t *sh = m->sh;
    const model_floor_t *f = &res->f;
    const wsync_plan_summary_t *sum = res->sum;
    const double median = res->t.median;
    const int K = o->iters;
    json_t *j = json_object();
    char dig[24];

    json_object_set_new(j, "mode", json_string("model"));
    json_object_set_new(j, "model_shape", json_string(m->shape->name));
    json_object_set_new(j, "param_elems", json_integer((json_int_t)m->param_elems));
    json_object_set_new(j, "params", json_integer((json_int_t)m->param_count));
    json_object_set_new(j, "senders", json_integer(m->N));
    json_object_set_new(j, "tp", json_integer(m->T));
    json_object_set_new(j, "ep", json_integer(o->ep > 1 ? o->ep : 1));
    json_object_set_new(j, "model_type",
                        json_string(wsync_model_type_name(m->cfg.model_type)));
    json_object_set_new(j, "experts", json_integer((json_int_t)m->cfg.num_experts));
    json_object_set_new(j, "param_bytes", json_integer((json_int_t)m->param_bytes));
    json_object_set_new(j, "sender_experts",
                        json_string(m->cfg.num_experts == 0 ? "none"
                                    : o->fused_experts ? "fused" : "per-expert"));
    json_object_set_new(j, "replicas", json_integer(m->R));
    json_object_set_new(j, "receivers", json_integer(m->NR));
    json_object_set_new(j, "colocated", json_boolean(o->colocated));
    json_object_set_new(j, "mem", json_string(o->mem_cuda ? "cuda" : "host"));
    json_object_set_new(j, "quant", json_string(o->quant_fp8 ? "fp8-block" : "none"));
    json_object_set_new(j, "scheme_asked", json_string(o->scheme));
    json_object_set_new(j, "scheme", json_string(sh->scheme));
    json_object_set_new(j, "ngpu", json_integer(m->ngpu));
    json_object_set_new(j, "gpu", json_string(sh->gpu_name));
    json_object_set_new(j, "gpus_senders", json_string(res->gs));
    json_object_set_new(j, "gpus_receivers", json_string(res->gr));
    json_object_set_new(j, "iters", json_integer(K));
    json_object_set_new(j, "warmup", json_integer(o->warmup));
    json_object_set_new(j, "seconds", json_real(median));
    json_object_set_new(j, "seconds_min", json_real(res->t.min));
    json_object_set_new(j, "seconds_max", json_real(res->t.max));
    json_object_set_new(j, "times", bench_json_reals(res->times, K));
    json_object_set_new(j, "bytes_moved", json_integer((json_int_t)res->moved));
    json_object_set_new(j, "bytes_per_receiver_max", json_integer((json_int_t)res->per_recv));
    json_object_set_new(j, "bytes_landed", json_integer((json_int_t)sum->total_landed_bytes));
    json_object_set_new(j, "fp8_wire_asked", json_integer(o->fp8_wire));
    json_object_set_new(j, "fp8_wire", json_boolean(res->wire));
    json_object_set_new(j, "wire_bytes", json_integer((json_int_t)res->moved));
    json_object_set_new(j, "fp8_wire_bytes", json_integer((json_int_t)sum->fp8_wire_bytes));
    json_object_set_new(j, "param_dtype_bytes", json_integer((json_int_t)m->sum->total_bytes));
    json_object_set_new(j, "wire_ratio",
                        json_real(m->sum->total_bytes
                                      ? (double)res->moved / (double)m->sum->total_bytes : 0.0));
    {   /* the FP8 targets' bytes as they travelled against their params' dtype */
        uint64_t fb = 0, fp = 0;
        for (int w = 0; w < WSYNC_WIRE_NFORMS; w++)
            if (w != WSYNC_WIRE_PLAIN) {
                fb += sum->form_bytes[w];
                fp += sum->form_param_bytes[w];
            }
        json_object_set_new(j, "fp8_targets_ratio", json_real(fp ? (double)fb / fp : 0.0));
    }
    json_object_set_new(j, "gbps", json_real(res->gbps));
    json_object_set_new(j, "gbps_per_receiver", json_real(res->gbps_recv));
    json_object_set_new(j, "peer_gbps", json_real(f->peer_gbps));
    json_object_set_new(j, "peer_gbps_min", json_real(f->peer_min));
    json_object_set_new(j, "peer_gbps_max", json_real(f->peer_max));
    json_object_set_new(j, "d2d_gbps", json_real(f->d2d_gbps));
    json_object_set_new(j, "memcpy_gbps", json_real(f->memcpy_gbps));
    json_object_set_new(j, "bcast_gbps", json_real(res->bcast));
    json_object_set_new(j, "bcast_note", json_string(o->mem_cuda ? sh->probe.bcast_note : ""));
    json_object_set_new(j, "floor_seconds", json_real(f->floor_s));
    json_object_set_new(j, "floor_gpu", json_integer(f->floor_gpu));
    json_object_set_new(j, "peer_all_gbps", json_real(f->peer_all_gbps));
    json_object_set_new(j, "floor_all_seconds", json_real(f->floor_all_s));
    json_object_set_new(j, "ratio_floor_all",
                        json_real(f->floor_all_s > 0 ? median / f->floor_all_s : 0));
    json_object_set_new(j, "floor_in_bytes", json_integer((json_int_t)f->in_b));
    json_object_set_new(j, "floor_out_bytes", json_integer((json_int_t)f->out_b));
    json_object_set_new(j, "floor_local_bytes", json_integer((json_int_t)f->local_b));
    json_object_set_new(j, "ratio_floor", json_real(res->ratio_floor));
    json_object_set_new(j, "ratio_bcast", json_real(res->ratio_bcast));
    json_object_set_new(j, "correct", json_boolean(res->right));
    json_object_set_new(j, "version", json_integer(o->warmup + K));
    json_t *d = json_array();
    for (int r = 0; r < m->NR; r++) {
        snprintf(dig, sizeof(dig), "%016llx", (unsigned long long)sh->digest[r]);
        json_array_append_new(d, json_string(dig));
    }
    json_object_set_new(j, "digests", d);
    bench_print_json(j);
}

int bench_model_report(const model_t *m, double memcpy_gbps)
{
    model_result_t res;

    model_result(m, memcpy_gbps, &res);
    print_model_table(m, &res);
    if (m->o->json)
        print_model_json(m, &res);
    fflush(stdout);
    return res.right ? 0 : 1;
}

/* ---- --delta: the report ----------------------------------------------------------------- */

/* The time of each timed version of one group: the slowest sender's push, or with the store the
 * slowest receiver's fetch. */
static void version_times(const model_t *m, const model_shared_t *sh, double *times)
{
    for (int k = 0; k < m->o->iters; k++) {
        int v = m->o->warmup + k; /* index of version v + 1 */
        times[k] = 0;
        for (int r = 0; r < (m->o->store ? m->NR : m->N); r++) {
            double t = m->o->store ? sh->fetch_s[v][r] : sh->push_s[v][r];
            if (t > times[k])
                times[k] = t;
        }
    }
}

/* The slowest sender's push of each timed version (the store: its publish, which the fetch
 * times leave out). */
static void push_times(const model_t *m, const model_shared_t *sh, double *times)
{
    for (int k = 0; k < m->o->iters; k++) {
        times[k] = 0;
        for (int s = 0; s < m->N; s++)
            if (sh->push_s[m->o->warmup + k][s] > times[k])
                times[k] = sh->push_s[m->o->warmup + k][s];
    }
}

/* Every receiver of one group checked every version, all right. */
static int delta_all_right(const model_t *m, const model_shared_t *sh)
{
    int total = m->o->warmup + m->o->iters;
    for (int r = 0; r < m->NR; r++)
        if (sh->verdict[r] != 1 || sh->d.checked_versions[r] != total ||
            sh->final_version[r] != (uint64_t)total)
            return 0;
    return 1;
}

/* sh[0]: the group with delta = --delta-mode, sh[1]: the same versions with delta = off. */
int bench_model_report_delta(const model_t *m, model_shared_t *const *sh)
{
    char what[160];
    bench_delta_group_t g[2];
    bench_model_run_words(m, what, sizeof(what));
    bench_delta_run_t run = {m->o, m->shape->name, what, m->N, m->T, m->R, m->NR,
                             m->param_elems, m->param_bytes, m->shard_elems,
                             m->sum->total_bytes};
    for (int p = 0; p < 2; p++) {
        memset(&g[p], 0, sizeof(g[p]));
        g[p].page = &sh[p]->d;
        g[p].scheme = sh[p]->scheme;
        g[p].gpu = sh[p]->gpu_name;
        version_times(m, sh[p], g[p].times);
        push_times(m, sh[p], g[p].push);
        g[p].right = delta_all_right(m, sh[p]);
        g[p].first_wrong = "";
        for (int r = 0; r < m->NR && !g[p].first_wrong[0]; r++)
            if (sh[p]->first_wrong[r][0])
                g[p].first_wrong = sh[p]->first_wrong[r];
    }
    return bench_delta_report(&run, g);
}
