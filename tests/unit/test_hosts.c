/* Hosts and network namespaces in the negotiation (issue 19.1): the host id's two parts, counted
 * and compared; ipc refuses the pairs that cross a host or a namespace, naming them and saying
 * which of the two it is; nccl and the store say how many hosts they span; an explicit scheme
 * that cannot reach some pairs is WSYNC_ERR_UNSUPPORTED with them in the text. Groups are built
 * here as the coordinator would see them (HELLOs), so every case is exact and fast. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/registry.h"
#include "core/status.h"
#include "core/util.h"
#include "tests/support/check.h"
#include "wsync/wsync.h"

#define MAXP 32

typedef struct {
    wsync_hello_t h[MAXP];
    wsync_group_info_t g;
    char reason[1024], explain[4096];
} group_t;

/* ns senders then nr receivers, every transport, host memory; ids[i] / names[i] per participant
 * (senders first), the last one given repeated when there are fewer. */
static void group_make(group_t *gr, uint32_t ns, uint32_t nr, const char *const *ids,
                       size_t nids, const char *const *names, size_t nnames)
{
    memset(gr, 0, sizeof(*gr));
    for (uint32_t i = 0; i < ns + nr && i < MAXP; i++) {
        wsync_hello_t *h = &gr->h[i];
        h->role = i < ns ? WSYNC_ROLE_SENDER : WSYNC_ROLE_RECEIVER;
        h->rank = (int32_t)(i < ns ? i : i - ns);
        h->nsenders = (int32_t)ns;
        h->nreceivers = (int32_t)nr;
        h->transports = 0xffffffffu;
        h->host_id = (char *)ids[i < nids ? i : nids - 1];
        h->hostname = (char *)names[i < nnames ? i : nnames - 1];
    }
    gr->g.nsenders = ns;
    gr->g.nreceivers = nr;
    gr->g.senders = gr->h;
    gr->g.receivers = gr->h + ns;
    gr->g.mem_kinds = 1u << WSYNC_MEM_HOST;
    gr->g.replication = 1.0;
}

static void case_host_id_parts(void)
{
    const char *a = "3f2a-boot/net:[4026531833]";
    uint32_t hosts = 0, spaces = 0;

    CHECK(wsync_host_len(a) == strlen("3f2a-boot"));
    CHECK(strcmp(wsync_host_netns(a), "net:[4026531833]") == 0);
    CHECK(strcmp(wsync_host_netns("hostonly"), "") == 0 && wsync_host_len("hostonly") == 8);
    CHECK(strcmp(wsync_host_netns(NULL), "") == 0 && wsync_host_len(NULL) == 0);
    CHECK(wsync_host_same(a, "3f2a-boot/net:[7]") && !wsync_host_same_netns(a, "3f2a-boot/net:[7]"));
    CHECK(!wsync_host_same(a, "3f2a-bootX/net:[4026531833]"));
    CHECK(!wsync_host_same(a, "3f2a/net:[4026531833]"));
    CHECK(wsync_host_same_netns(a, "3f2a-boot/net:[4026531833]"));
    CHECK(wsync_host_same(NULL, "") && wsync_host_same_netns(NULL, ""));

    const char *ids[] = {"b/net:[2]", "a/net:[1]", "a/net:[2]", "b/net:[2]", "a/net:[1]",
                         "c", NULL, "c/"};
    CHECK(wsync_host_count(ids, 8, &hosts, &spaces) == 0);
    /* hosts a, b, c and "" (NULL); namespaces a1, a2, b2, c with "" and "/" alike, "" */
    CHECK_MSG(hosts == 4 && spaces == 5, "%u hosts, %u namespaces", hosts, spaces);
    CHECK(wsync_host_count(ids, 0, &hosts, &spaces) == 0 && hosts == 0 && spaces == 0);

    /* this process: the kernel's boot id and the inode of its network namespace, read here */
    char boot[64] = "", net[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    ssize_t n = readlink("/proc/self/ns/net", net, sizeof(net) - 1);
    net[n > 0 ? n : 0] = '\0';
    const char *me = wsync_host_id();
    if (boot[0] != '\0' && getenv("WSYNC_HOST_ID") == NULL)
        CHECK_MSG(wsync_host_len(me) == strlen(boot) && memcmp(me, boot, strlen(boot)) == 0,
                  "host id %s, boot id %s", me, boot);
    CHECK_MSG(strcmp(wsync_host_netns(me), net) == 0, "host id %s, netns %s", me, net);
}

/* One receiver on another machine: ipc names it, the host, and says "another host". */
static void case_ipc_other_host(void)
{
    group_t gr;
    const char *ids[] = {"boot1/net:[1]", "boot1/net:[1]", "boot1/net:[1]", "boot2/net:[5]"};
    const char *names[] = {"h1", "h1", "h1", "h2"};
    const wsync_scheme_ops_t *chosen = NULL;

    group_make(&gr, 1, 3, ids, 4, names, 4);
    CHECK(wsync_scheme_ipc.score(&gr.g, gr.reason, sizeof(gr.reason)) == 0);
    CHECK_MSG(strstr(gr.reason, "receiver 2 is on another host (hostname h2) than sender 0 (h1)") &&
                  strstr(gr.reason, "1 of the 3 sender -> receiver pairs cross hosts or network "
                                    "namespaces (sender 0 -> receiver 2)"),
              "%s", gr.reason);
    /* asked for explicitly: refused, the code and the pair in the error */
    CHECK_ST(wsync_negotiate(&gr.g, "ipc", &chosen, gr.explain, sizeof(gr.explain)),
             WSYNC_ERR_UNSUPPORTED);
    CHECK_ERR_HAS("scheme 'ipc' was asked for but cannot serve this group");
    CHECK_ERR_HAS("sender 0 -> receiver 2");
    CHECK_ERR_HAS("another host (hostname h2)");
    CHECK(chosen == NULL);
}

/* Same boot id, another namespace: "on host h1 but in another network namespace (...)". */
static void case_ipc_other_namespace(void)
{
    group_t gr;
    const char *ids[] = {"boot1/net:[1]", "boot1/net:[1]", "boot1/net:[1]", "boot1/net:[9]"};
    const char *names[] = {"h1"};

    group_make(&gr, 1, 3, ids, 4, names, 1);
    CHECK(wsync_scheme_ipc.score(&gr.g, gr.reason, sizeof(gr.reason)) == 0);
    CHECK_MSG(strstr(gr.reason, "receiver 2 is on host h1 but in another network namespace "
                                "(net:[9]) than sender 0 (net:[1]): abstract Unix sockets do not "
                                "cross namespaces") != NULL,
              "%s", gr.reason);
    CHECK_MSG(strstr(gr.reason, "another host") == NULL, "%s", gr.reason);
}

/* Many pairs apart: the first 8 named, the rest counted. */
static void case_ipc_many_pairs(void)
{
    group_t gr;
    const char *ids[] = {"boot1/net:[1]", "boot1/net:[1]", "boot2/net:[1]"};
    const char *names[] = {"h1", "h1", "h2"};

    group_make(&gr, 2, 12, ids, 3, names, 3);
    CHECK(wsync_scheme_ipc.score(&gr.g, gr.reason, sizeof(gr.reason)) == 0);
    CHECK_MSG(strstr(gr.reason, "receiver 0 is on another host (hostname h2) than sender 0 (h1)") &&
                  strstr(gr.reason, "24 of the 24 sender -> receiver pairs") &&
                  strstr(gr.reason, "(sender 0 -> receiver 0, sender 0 -> receiver 1, ") &&
                  strstr(gr.reason, "sender 0 -> receiver 7, and 16 more)") &&
                  !strstr(gr.reason, "receiver 8,"),
              "%s", gr.reason);
}

/* Two hosts, each sender feeding only its own host's receiver (the plan's pair bytes): ipc
 * serves the group, and auto picks it; without the pair bytes every pair counts and it cannot. */
static void case_ipc_pairs_within_hosts(void)
{
    group_t gr;
    /* sender 0, sender 1, receiver 0, receiver 1 */
    const char *ids[] = {"boot1/net:[1]", "boot1/net:[2]", "boot1/net:[1]", "boot1/net:[2]"};
    const char *names[] = {"h1"};
    uint64_t pair[4] = {4096, 0, 0, 4096};   /* [s * 2 + r] */
    const wsync_scheme_ops_t *chosen = NULL;

    group_make(&gr, 2, 2, ids, 4, names, 1);
    gr.g.pair_bytes = pair;
    CHECK_MSG(wsync_scheme_ipc.score(&gr.g, gr.reason, sizeof(gr.reason)) > 0, "%s", gr.reason);
    CHECK_MSG(strstr(gr.reason, "each of the 2 sender -> receiver pairs that carry bytes shares a "
                                "host and network namespace (1 host, 2 namespaces in all)") != NULL,
              "%s", gr.reason);
    CHECK_OK(wsync_negotiate(&gr.g, "auto", &chosen, gr.explain, sizeof(gr.explain)));
    CHECK_MSG(chosen == &wsync_scheme_ipc, "%s", gr.explain);
    pair[1] = 8;   /* receiver 1 now also reads from sender 0, in the other namespace */
    CHECK(wsync_scheme_ipc.score(&gr.g, gr.reason, sizeof(gr.reason)) == 0);
    CHECK_MSG(strstr(gr.reason, "1 of the 3 sender -> receiver pairs that carry bytes") &&
                  strstr(gr.reason, "(sender 0 -> receiver 1)"),
              "%s", gr.reason);
    gr.g.pair_bytes = NULL;
    CHECK(wsync_scheme_ipc.score(&gr.g, gr.reason, sizeof(gr.reason)) == 0);
    CHECK_MSG(strstr(gr.reason, "2 of the 4 sender -> receiver pairs cross"), "%s", gr.reason);
}

/* nccl spans hosts and says so; so does the store; auto then picks by memory kind. */
static void case_spanning_schemes(void)
{
    group_t gr;
    const char *ids[] = {"boot1/net:[1]", "boot2/net:[1]", "boot3/net:[1]", "boot3/net:[4]"};
    const char *names[] = {"h1", "h2", "h3", "h3"};
    const wsync_scheme_ops_t *chosen = NULL;

    group_make(&gr, 2, 2, ids, 4, names, 4);
    gr.g.mem_kinds = 1u << WSYNC_MEM_CUDA;
    CHECK(wsync_scheme_nccl.score(&gr.g, gr.reason, sizeof(gr.reason)) > 0);
    CHECK_MSG(strstr(gr.reason, "participants on 3 hosts: nccl over its network transports"),
              "%s", gr.reason);
    CHECK_OK(wsync_negotiate(&gr.g, "auto", &chosen, gr.explain, sizeof(gr.explain)));
    CHECK_MSG(chosen == &wsync_scheme_nccl && strstr(gr.explain, "ipc: refused: receiver 0 is on "
                                                                 "another host (hostname h3)"),
              "%s", gr.explain);
    /* one host, two namespaces */
    gr.h[1].host_id = gr.h[2].host_id = gr.h[3].host_id = (char *)"boot1/net:[4]";
    CHECK(wsync_scheme_nccl.score(&gr.g, gr.reason, sizeof(gr.reason)) > 0);
    CHECK_MSG(strstr(gr.reason, "participants in 2 network namespaces of one host"), "%s",
              gr.reason);

    /* host memory: the store, where UCX or libfabric is built in */
    gr.g.mem_kinds = 1u << WSYNC_MEM_HOST;
    int store = wsync_scheme_store.score(&gr.g, gr.reason, sizeof(gr.reason));
    if (store == 0) {
        fprintf(stderr, "  (store not built here: %s)\n", gr.reason);
        return;
    }
    CHECK_MSG(strstr(gr.reason, "participants on 1 host in 2 network namespaces"), "%s",
              gr.reason);
    CHECK_OK(wsync_negotiate(&gr.g, "auto", &chosen, gr.explain, sizeof(gr.explain)));
    CHECK_MSG(chosen == &wsync_scheme_store &&
                  strstr(gr.explain, "ipc: refused: receiver 0 is on host h3 but in another "
                                     "network namespace (net:[4]) than sender 0 (net:[1])") &&
                  strstr(gr.explain, "nccl: refused: some shards or targets are in host memory") &&
                  strstr(gr.explain, "store: chosen: one-sided reads"),
              "%s", gr.explain);
    gr.h[1].host_id = (char *)"boot2/net:[1]";
    CHECK(wsync_scheme_store.score(&gr.g, gr.reason, sizeof(gr.reason)) > 0);
    CHECK_MSG(strstr(gr.reason, "participants on 2 hosts in 3 network namespaces"), "%s",
              gr.reason);
}

int main(void)
{
    RUN(case_host_id_parts);
    RUN(case_ipc_other_host);
    RUN(case_ipc_other_namespace);
    RUN(case_ipc_many_pairs);
    RUN(case_ipc_pairs_within_hosts);
    RUN(case_spanning_schemes);
    return check_summary();
}
