/* test_inventory.c - GPU accounting with a scheduler (operator/inventory.h): a pod charges a node
 * when bound to it, or, not bound yet, when its required node affinity names that one node (the
 * operator's worker pods before the scheduler binds them), so two jobs never book the same GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "operator/inventory.h"

static cJSON *parse(const char *text) {
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    return j;
}

/* A Node with GPUs and a hostname label (HOST "" : none). */
#define NODE(name, host, count)                                                                   \
    "{\"metadata\":{\"name\":\"" name "\",\"labels\":{\"nvidia.com/gpu.product\":\"NVIDIA-L4\""     \
    host "}},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"" count "\"}}}"
#define HOST(h) ",\"kubernetes.io/hostname\":\"" h "\""

/* A pod asking one GPU, owned by OWNER, phase PHASE, with SPEC's placement fields (JSON members
 * before "containers", each ending in a comma). */
#define POD(owner, phase, spec)                                                                    \
    "{\"metadata\":{\"ownerReferences\":[{\"controller\":true,\"uid\":\"" owner "\"}]},\"spec\":{" spec \
    "\"containers\":[{\"resources\":{\"requests\":{\"nvidia.com/gpu\":\"1\"},\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]}," \
    "\"status\":{\"phase\":\"" phase "\"}}"
#define AFFINITY(terms) "\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":" \
    "{\"nodeSelectorTerms\":[" terms "]}}},"
#define EXPR(key, op, values) "{\"key\":\"" key "\",\"operator\":\"" op "\",\"values\":[" values "]}"
#define TERM(exprs) "{\"matchExpressions\":[" exprs "]}"
#define FIELDS(exprs) "{\"matchFields\":[" exprs "]}"
#define ON_HOST(h) AFFINITY(TERM(EXPR("kubernetes.io/hostname", "In", "\"" h "\"")))

/* Which affinities pin a pod to one node, and to which. */
static void test_pinned(void **state) {
    (void)state;
    static const struct {
        const char *pod, *host, *name; /* host and name NULL: not pinned */
    } cases[] = {
        {POD("u", "Pending", ON_HOST("h-a")), "h-a", NULL},
        {POD("u", "Pending", AFFINITY(FIELDS(EXPR("metadata.name", "In", "\"n-a\"")))), NULL, "n-a"},
        /* other requirements narrow it further: still that one node */
        {POD("u", "Pending", AFFINITY(TERM(EXPR("nvidia.com/gpu.product", "In", "\"NVIDIA-L4\"") ","
                                           EXPR("kubernetes.io/hostname", "In", "\"h-a\"")))), "h-a", NULL},
        /* terms are ORed: pinned only when every term names the same node */
        {POD("u", "Pending", AFFINITY(TERM(EXPR("kubernetes.io/hostname", "In", "\"h-a\"")) ","
                                      TERM(EXPR("kubernetes.io/hostname", "In", "\"h-a\"")))), "h-a", NULL},
        {POD("u", "Pending", AFFINITY(TERM(EXPR("kubernetes.io/hostname", "In", "\"h-a\"")) ","
                                      TERM(EXPR("kubernetes.io/hostname", "In", "\"h-b\"")))), NULL, NULL},
        {POD("u", "Pending", AFFINITY(TERM(EXPR("kubernetes.io/hostname", "In", "\"h-a\"")) ","
                                      TERM(EXPR("nvidia.com/gpu.product", "In", "\"NVIDIA-L4\"")))), NULL, NULL},
        /* several values, another operator, another key: several nodes */
        {POD("u", "Pending", AFFINITY(TERM(EXPR("kubernetes.io/hostname", "In", "\"h-a\",\"h-b\"")))), NULL, NULL},
        {POD("u", "Pending", AFFINITY(TERM(EXPR("kubernetes.io/hostname", "NotIn", "\"h-a\"")))), NULL, NULL},
        {POD("u", "Pending", AFFINITY(TERM(EXPR("topology.kubernetes.io/zone", "In", "\"z\"")))), NULL, NULL},
        {POD("u", "Pending", AFFINITY("")), NULL, NULL},
        {POD("u", "Pending", ""), NULL, NULL},
        /* a nodeSelector on the hostname pins too */
        {POD("u", "Pending", "\"nodeSelector\":{\"kubernetes.io/hostname\":\"h-b\"},"), "h-b", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *p = parse(cases[i].pod);
        const char *host = "x", *name = "x";
        bool pinned = inv_pod_pinned(p, &host, &name);
        if (cases[i].host) assert_string_equal(host, cases[i].host);
        else assert_null(host);
        if (cases[i].name) assert_string_equal(name, cases[i].name);
        else assert_null(name);
        assert_int_equal(pinned, cases[i].host || cases[i].name);
        assert_int_equal(inv_pod_holds(p), pinned); /* pending, not bound: holds only when pinned */
        cJSON_Delete(p);
    }
}

/* A pod's node: bound (nodeName) wins; pinned by hostname matches the node's hostname label or its
 * name (a node without the label); by metadata.name, the name only. */
static void test_pod_on_node(void **state) {
    (void)state;
    cJSON *nodes = parse("[" NODE("n-a", HOST("h-a"), "2") "," NODE("n-b", "", "1") "," NODE("n-c", HOST("n-c"), "1") "]");
    const cJSON *a = cJSON_GetArrayItem(nodes, 0), *b = cJSON_GetArrayItem(nodes, 1), *c = cJSON_GetArrayItem(nodes, 2);
    assert_string_equal(inv_node_hostname(a), "h-a");
    assert_string_equal(inv_node_hostname(b), "n-b"); /* no label: the name */

    cJSON *p = parse(POD("u", "Pending", ON_HOST("h-a")));
    assert_true(inv_pod_on_node(p, a));
    assert_false(inv_pod_on_node(p, b));
    assert_string_equal(inv_pod_node(p), "h-a");
    cJSON_Delete(p);
    p = parse(POD("u", "Pending", ON_HOST("n-a"))); /* the node's name where its hostname differs */
    assert_true(inv_pod_on_node(p, a));
    cJSON_Delete(p);
    p = parse(POD("u", "Pending", ON_HOST("n-b")));
    assert_true(inv_pod_on_node(p, b));
    assert_false(inv_pod_on_node(p, c));
    cJSON_Delete(p);
    p = parse(POD("u", "Pending", AFFINITY(FIELDS(EXPR("metadata.name", "In", "\"n-c\"")))));
    assert_true(inv_pod_on_node(p, c));
    assert_false(inv_pod_on_node(p, a));
    assert_string_equal(inv_pod_node(p), "n-c");
    cJSON_Delete(p);
    /* bound: the binding decides, whatever the affinity said */
    p = parse(POD("u", "Running", "\"nodeName\":\"n-b\"," ON_HOST("h-a")));
    assert_true(inv_pod_on_node(p, b));
    assert_false(inv_pod_on_node(p, a));
    assert_string_equal(inv_pod_node(p), "n-b");
    assert_true(inv_pod_holds(p));
    cJSON_Delete(p);
    /* finished: holds nothing, bound or pinned */
    p = parse(POD("u", "Succeeded", ON_HOST("h-a")));
    assert_false(inv_pod_holds(p));
    cJSON_Delete(p);
    p = parse(POD("u", "Failed", "\"nodeName\":\"n-a\","));
    assert_false(inv_pod_holds(p));
    cJSON_Delete(p);
    p = parse(POD("u", "Pending", ""));
    assert_null(inv_pod_node(p));
    cJSON_Delete(p);
    cJSON_Delete(nodes);
}

/* The accounting: a node's used GPUs are those of the bound pods and of the unbound ones pinned to
 * it, a job's own excepted; two jobs never book the same GPU. */
static void test_unbound_pinned_charged(void **state) {
    (void)state;
    cJSON *nodes = parse("[" NODE("n-a", HOST("h-a"), "2") "," NODE("n-b", "", "1") "]");
    const cJSON *a = cJSON_GetArrayItem(nodes, 0), *b = cJSON_GetArrayItem(nodes, 1);
    /* job A's two workers admitted on n-a, not bound yet (the scheduler has not run); a foreign pod
     * bound to n-b; an unpinned pending pod (it may go anywhere: no node charged) */
    cJSON *pods = parse("[" POD("job-a", "Pending", ON_HOST("h-a")) "," POD("job-a", "Pending", ON_HOST("h-a")) ","
                        POD("other", "Running", "\"nodeName\":\"n-b\",") "," POD("loose", "Pending", "") "]");
    assert_int_equal(inv_node_used(pods, a, NULL), 2);
    assert_int_equal(inv_node_used(pods, a, "job-a"), 0); /* job A's own */
    assert_int_equal(inv_node_used(pods, b, NULL), 1);
    inv_constraints c = {.pods = pods, .own_uid = "job-b"};
    cluster cl;
    inv_result r;
    err_t err;
    /* job B sees every GPU taken: n-a by job A's unbound workers, n-b by the foreign pod */
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 0);
    assert_int_equal(r.usable, 3);
    assert_int_equal(r.free, 0);
    cluster_free(&cl);
    /* job A plans on its own GPUs of n-a */
    c.own_uid = "job-a";
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.gpus, 2);
    assert_string_equal(cl.nodes[cl.devices[0].node].name, "n-a");
    cluster_free(&cl);
    cJSON_Delete(pods);
    /* a foreign pod pinned by nodeName to n-a and a worker pinned there by affinity: both count
     * (the node is over-booked: nothing is left, never a negative count) */
    pods = parse("[" POD("other", "Running", "\"nodeName\":\"n-a\",") "," POD("job-a", "Pending", ON_HOST("n-a")) ","
                 POD("job-a", "Pending", ON_HOST("n-a")) "]");
    assert_int_equal(inv_node_used(pods, a, NULL), 3);
    c.pods = pods, c.own_uid = "job-c";
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.free, 1);
    assert_string_equal(cl.nodes[cl.devices[0].node].name, "n-b");
    cluster_free(&cl);
    cJSON_Delete(pods);
    cJSON_Delete(nodes);
}

/* The busy store's digests (inv_pod_digest) account exactly as the pods do: for each job (its
 * own pods free to it), the same free GPUs on the same nodes; pods that hold nothing (finished,
 * unpinned, no GPU) have no digest. Nodes whose hostname label differs from their name, pods
 * bound, pinned by hostname, by name, by a node's name where its hostname differs. */
static void test_digests_account_as_pods(void **state) {
    (void)state;
    cJSON *nodes = parse("[" NODE("n-d", HOST("h-d"), "4") "," NODE("n-a", HOST("h-a"), "2") "," NODE("n-b", "", "1") ","
                         NODE("n-c", HOST("n-c"), "2") "," NODE("n-e", HOST("h-e"), "8") "]");
    cJSON *pods = parse("[" POD("job-a", "Pending", ON_HOST("h-a")) "," POD("job-b", "Running", "\"nodeName\":\"n-b\",") ","
                        POD("job-b", "Pending", ON_HOST("n-a")) "," POD("loose", "Pending", "") ","
                        POD("job-c", "Succeeded", "\"nodeName\":\"n-c\",") ","
                        POD("job-c", "Pending", AFFINITY(FIELDS(EXPR("metadata.name", "In", "\"n-c\"")))) ","
                        POD("job-a", "Running", "\"nodeName\":\"n-e\",") "," POD("job-d", "Pending", ON_HOST("h-e")) ","
                        POD("job-d", "Pending", ON_HOST("h-e")) "," POD("job-b", "Running", "\"nodeName\":\"n-d\",") "]");
    int n = cJSON_GetArraySize(pods), with = 0;
    const inv_held **held = calloc((size_t)n, sizeof *held);
    assert_non_null(held);
    for (int i = 0; i < n; i++) {
        held[i] = inv_pod_digest(cJSON_GetArrayItem(pods, i));
        with += held[i] != NULL;
    }
    assert_int_equal(with, n - 2); /* the loose pod and the finished one hold nothing */
    assert_null(held[3]);
    assert_null(held[4]);
    assert_string_equal(held[1]->bound, "n-b");
    assert_string_equal(held[1]->owner, "job-b");
    assert_null(held[1]->host);
    assert_string_equal(held[5]->name, "n-c");
    assert_int_equal(held[5]->gpus, 1);
    static const char *const owners[] = {"job-a", "job-b", "job-c", "job-d", "nobody", NULL};
    for (size_t o = 0; o < sizeof owners / sizeof *owners; o++) {
        inv_constraints by_pods = {.pods = pods, .own_uid = owners[o]};
        inv_constraints by_digests = {.held = held, .n_held = n, .own_uid = owners[o]};
        cluster a, b;
        inv_result ra, rb;
        err_t e1, e2;
        assert_int_equal(inv_build(nodes, &by_pods, &a, &ra, &e1), 0);
        assert_int_equal(inv_build(nodes, &by_digests, &b, &rb, &e2), 0);
        assert_int_equal(ra.gpus, rb.gpus);
        assert_int_equal(ra.free, rb.free);
        assert_int_equal(ra.usable, rb.usable);
        assert_int_equal(a.n_devices, b.n_devices);
        for (int d = 0; d < a.n_devices; d++)
            assert_string_equal(a.nodes[a.devices[d].node].name, b.nodes[b.devices[d].node].name);
        cluster_free(&a);
        cluster_free(&b);
    }
    /* job-b's view: n-a's 2 less job-a's pinned 1 (job-b's own pinned by n-a's name is its own),
     * n-c's 2 less job-c's 1, n-e's 8 less 1 + 2, n-d and n-b its own: 1 + 1 + 1 + 5 + 4 */
    inv_constraints c = {.held = held, .n_held = n, .own_uid = "job-b"};
    cluster cl;
    inv_result r;
    err_t err;
    assert_int_equal(inv_build(nodes, &c, &cl, &r, &err), 0);
    assert_int_equal(r.free, 12);
    assert_int_equal(r.usable, 17);
    cluster_free(&cl);
    for (int i = 0; i < n; i++) free((void *)held[i]);
    free(held);
    cJSON_Delete(pods);
    cJSON_Delete(nodes);
}

/* A GPU node with labels LABELS (after the product's) and spec SPEC ("" or members and a comma). */
#define GPU_NODE(name, product, labels, spec)                                                      \
    "{\"metadata\":{\"name\":\"" name "\",\"labels\":{\"nvidia.com/gpu.product\":\"" product "\"" labels "}}," \
    "\"spec\":{" spec "\"x\":0},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"1\"}}}"

/* No usable GPU: the message counts the GPU nodes left out by why, and when one constraint left
 * out all of them it names that constraint (an allowedProducts typo reads differently from a
 * nodeSelector that matches nothing). An unknown product without allowedProducts is noted. */
static void test_left_out_said(void **state) {
    (void)state;
    cJSON *nodes = parse("[" GPU_NODE("a", "NVIDIA-L4", ",\"pool\":\"x\"", "\"unschedulable\":true,") ","
                         GPU_NODE("b", "NVIDIA-L4", ",\"pool\":\"x\"",
                                  "\"taints\":[{\"key\":\"k\",\"value\":\"v\",\"effect\":\"NoSchedule\"}],") ","
                         GPU_NODE("c", "Acme-X1", ",\"pool\":\"x\"", "") ","
                         GPU_NODE("d", "NVIDIA-A10G", ",\"pool\":\"y\"", "") "]");
    cJSON *sel = parse("{\"pool\":\"x\"}"), *nowhere = parse("{\"pool\":\"z\"}"), *typo = parse("[\"NVIDIA-L44\"]");
    const struct {
        inv_constraints c;
        const char *want;
    } cases[] = {
        {{.node_selector = sel},
         "no usable GPU: of the 4 GPU nodes (products: NVIDIA-L4, Acme-X1, NVIDIA-A10G), 1 cordoned, 1 not matching "
         "spec.gpus.nodeSelector, 1 tainted against the job, 1 with a product the catalog does not know; node a is "
         "cordoned; node b has the taint k=v:NoSchedule, which spec.tolerations does not tolerate; node c: GPU product "
         "Acme-X1 is not in the catalog (cephalo gpus): left out unless spec.gpus.allowedProducts names it"},
        {{.node_selector = nowhere}, "no usable GPU: spec.gpus.nodeSelector matches none of the 4 GPU nodes"},
        {{.allowed_products = typo},
         "no usable GPU: spec.gpus.allowedProducts names none of the products of the 4 GPU nodes (they have: "
         "NVIDIA-L4, Acme-X1, NVIDIA-A10G)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cluster cl;
        inv_result r;
        err_t err = {{0}};
        assert_int_equal(inv_build(nodes, &cases[i].c, &cl, &r, &err), -1);
        if (!strstr(err.msg, cases[i].want)) fail_msg("case %zu: %s\nwanted: %s", i, err.msg, cases[i].want);
    }
    cJSON_Delete(nodes), cJSON_Delete(sel), cJSON_Delete(nowhere), cJSON_Delete(typo);
}

/* The node store's digests (inv_node_digest) inventory exactly as the nodes' JSON does: the same
 * GPUs on the same nodes with the same types and compute capabilities, the same notes and the same
 * refusals, for nodes cordoned, tainted, not Ready, of unknown products with and without a memory
 * label, with compute capability labels, hostnames, and in no particular order. */
static void test_node_digests_as_nodes(void **state) {
    (void)state;
    cJSON *nodes = parse("[" GPU_NODE("e", "NVIDIA-L4", HOST("h-e"), "") ","
                         GPU_NODE("a", "NVIDIA-L4", ",\"pool\":\"x\"", "\"unschedulable\":true,") ","
                         GPU_NODE("b", "NVIDIA-L4", ",\"pool\":\"x\"",
                                  "\"taints\":[{\"key\":\"k\",\"value\":\"v\",\"effect\":\"NoSchedule\"}],") ","
                         GPU_NODE("c", "Acme-X1", ",\"pool\":\"x\",\"nvidia.com/gpu.memory\":\"24576\"", "") ","
                         GPU_NODE("f", "Acme-X2", "", "") ","
                         GPU_NODE("g", "NVIDIA-A10G", ",\"nvidia.com/gpu.compute.major\":\"8\","
                                  "\"nvidia.com/gpu.compute.minor\":\"6\"", "") ","
                         GPU_NODE("d", "NVIDIA-A10G", ",\"pool\":\"y\"", "") "]");
    /* n-h: not Ready */
    cJSON *h = parse(NODE("n-h", HOST("h-h"), "4"));
    cJSON *cond = parse("{\"conditions\":[{\"type\":\"Ready\",\"status\":\"False\"}]}");
    cJSON_AddItemToObject(cJSON_GetObjectItem(h, "status"), "conditions",
                          cJSON_DetachItemFromObject(cond, "conditions"));
    cJSON_AddItemToArray(nodes, h);
    cJSON_Delete(cond);
    int n = cJSON_GetArraySize(nodes);
    const inv_node **digests = calloc((size_t)n, sizeof *digests);
    assert_non_null(digests);
    for (int i = 0; i < n; i++) digests[i] = inv_node_digest(cJSON_GetArrayItem(nodes, i));
    assert_string_equal(digests[0]->host, "h-e");
    assert_string_equal(digests[1]->host, "a"); /* no hostname label: the name */
    assert_true(digests[1]->unschedulable);
    assert_true(digests[2]->tainted);
    assert_true(digests[3]->mem_mib == 24576);
    assert_int_equal(digests[5]->cc_major, 8);
    assert_int_equal(digests[5]->cc_minor, 6);
    assert_false(digests[n - 1]->ready);
    cJSON *sel = parse("{\"pool\":\"x\"}"), *acme = parse("[\"Acme-X1\",\"Acme-X2\",\"NVIDIA-L4\"]");
    cJSON *tol = parse("[{\"key\":\"k\",\"operator\":\"Exists\"}]");
    inv_archs no86 = {.n = 1, .cc = {75}};
    const inv_constraints cases[] = {{0}, {.node_selector = sel}, {.allowed_products = acme}, {.tolerations = tol},
                                     {.max_gpus = 2}, {.archs = &no86}, {.allowed_products = acme, .tolerations = tol}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        inv_constraints by_json = cases[i], by_digests = cases[i];
        by_digests.nodes_digested = digests;
        cluster a, b;
        inv_result ra, rb;
        err_t e1 = {{0}}, e2 = {{0}};
        int rc1 = inv_build(nodes, &by_json, &a, &ra, &e1), rc2 = inv_build(nodes, &by_digests, &b, &rb, &e2);
        assert_int_equal(rc1, rc2);
        assert_string_equal(e1.msg, e2.msg);
        if (rc1 < 0) continue;
        assert_string_equal(ra.notes, rb.notes);
        assert_int_equal(ra.gpus, rb.gpus);
        assert_int_equal(ra.usable, rb.usable);
        assert_int_equal(ra.free, rb.free);
        assert_int_equal(a.n_devices, b.n_devices);
        for (int d = 0; d < a.n_devices; d++) {
            assert_string_equal(a.nodes[a.devices[d].node].name, b.nodes[b.devices[d].node].name);
            assert_string_equal(a.devices[d].type, b.devices[d].type);
            assert_int_equal(a.devices[d].cc_major, b.devices[d].cc_major);
            assert_int_equal(a.devices[d].cc_minor, b.devices[d].cc_minor);
            assert_true(a.devices[d].memory_bytes == b.devices[d].memory_bytes);
        }
        cluster_free(&a);
        cluster_free(&b);
    }
    for (int i = 0; i < n; i++) free((void *)digests[i]);
    free(digests);
    cJSON_Delete(nodes), cJSON_Delete(sel), cJSON_Delete(acme), cJSON_Delete(tol);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned),
        cmocka_unit_test(test_left_out_said),
        cmocka_unit_test(test_pod_on_node),
        cmocka_unit_test(test_unbound_pinned_charged),
        cmocka_unit_test(test_digests_account_as_pods),
        cmocka_unit_test(test_node_digests_as_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
