/* test_scale.c - nothing quadratic in what users feed it (issue 38). Each case gives one reader a
 * user-sized input of N items and checks the answer: a retention.json of 200,000 marks beside
 * 20,000 checkpoints, a YAML mapping of 200,000 keys, a cluster file of 65,536 nodes, a plan of
 * 100,000 ranks, a tokenizer.json of 200,000 added tokens and a text full of them, an operator
 * store of 200,000 pods, a work queue of 200,000 jobs. Each prints its time. Before issue 38 each was quadratic (a cJSON list
 * walked from its start for every index, a list scanned for every item): the time is bounded
 * loosely, alarm(SCALE_LIMIT_S) ends a case that runs past it where the linear pass takes well
 * under a second, so only a quadratic pass fails it. The sanitizer build (3-10x slower) runs N/4.
 * tests/cli/test_report.sh and test_ckpt.sh drive the binaries the same way (a report of 3 ranks x
 * 1,000,000 log lines, a worker run over a retention.json of 200,000 marks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt_dir.h"
#include "common/ckpt_keep.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/str_map.h"
#include "common/strutil.h"
#include "common/yaml_tree.h"
#include "formats/tokenizer.h"
#include "model/train.h"
#include "operator/client/cache.h"
#include "operator/client/workqueue.h"
#include "planner/cluster.h"
#include "planner/model.h"
#include "state/plan_read.h"

#if defined(__SANITIZE_ADDRESS__)
#define SCALE 4 /* the sanitizer run: N/4 */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SCALE 4
#endif
#endif
#ifndef SCALE
#define SCALE 1
#endif
#define SCALE_LIMIT_S 30

static char tmpdir[64];
static char running[160]; /* the case, for the alarm's message */
static double t0;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_alarm(int sig) {
    (void)sig;
    char msg[256];
    int n = snprintf(msg, sizeof msg, "[  FAILED  ] 1 test(s): %s ran past %d s (a linear pass takes well under "
                     "one: a quadratic one?)\n", running, SCALE_LIMIT_S);
    if (write(1, msg, (size_t)n) < 0) _exit(1);
    _exit(1);
}

/* The case's clock and its ceiling. */
static void begin(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void begin(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(running, sizeof running, fmt, ap);
    va_end(ap);
    signal(SIGALRM, on_alarm);
    alarm(SCALE_LIMIT_S);
    t0 = now_s();
}

static void end(void) {
    alarm(0);
    printf("# %s: %.2f s\n", running, now_s() - t0);
}

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cephalo-test-scale-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A growing text (the inputs are built in memory). */
typedef struct text {
    char *p;
    size_t len, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof buf);
    str_append(&t->p, &t->len, &t->cap, buf, (size_t)n);
}

static void write_text(const char *path, const text *t) {
    err_t err;
    if (file_write_atomic(path, t->p, t->len, 0, &err) < 0) fail_msg("%s", err.msg);
}

/* ---- retention: retention.json's marks against the checkpoints of a directory ---- */

static int deleted; /* the deletions retention logged */

static void count_deletions(const char *level, const char *line) {
    if (!strcmp(level, "note") && strstr(line, "checkpoint retention: deleted ")) deleted++;
    else fprintf(stderr, "%s: %s\n", level, line);
}

/* K checkpoints (empty files: complete, as retention sees them), the odd ones marked diverged, and
 * M marks in all, the others of checkpoints long gone. Retention must keep the newest (K, good)
 * and the 3 newest good ones (K-2, K-4), delete the rest, and the next mark drops the stale ones. */
static void test_retention(void **state) {
    (void)state;
    const int K = 20000 / SCALE, M = 200000 / SCALE;
    char dir[128], path[192];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    for (int s = 1; s <= K; s++) {
        snprintf(path, sizeof path, "%s/step_%08d.safetensors", dir, s);
        int fd = open(path, O_WRONLY | O_CREAT, 0644);
        assert_true(fd >= 0);
        close(fd);
    }
    text t = {0};
    put(&t, "{\"keep_last\": 3, \"keep_every\": 0, \"diverged\": [");
    for (int i = 0; i < M; i++) put(&t, "%s%d", i ? ", " : "", i < K / 2 ? 2 * i + 1 : 1000000000 + i);
    put(&t, "]}\n");
    snprintf(path, sizeof path, "%s/retention.json", dir);
    write_text(path, &t);
    free(t.p);

    begin("retention: %d marks, %d checkpoints", M, K);
    log_set_handler(count_deletions);
    err_t err;
    ckpt_keep keep = {CKPT_KEEP_UNSET, CKPT_KEEP_UNSET};
    if (ckpt_keep_settle(dir, &keep, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(keep.keep_last, 3); /* the file's */
    char name[64];
    assert_int_equal(ckpt_keep_last_good(dir, name, sizeof name, &err), 1);
    snprintf(path, sizeof path, "step_%08d.safetensors", K);
    assert_string_equal(name, path);
    assert_int_equal(ckpt_keep_prune(dir, &keep, &err), K - 3);
    assert_int_equal(ckpt_keep_mark(dir, K + 1, true, &err), 0);
    end();
    log_set_handler(NULL);
    assert_int_equal(deleted, K - 3); /* each deletion logged */

    ckpt_entry *e;
    assert_int_equal(ckpt_dir_list(dir, &e, &err), 3);
    assert_true(e[0].step == K && e[1].step == K - 2 && e[2].step == K - 4);
    free(e);
    snprintf(path, sizeof path, "%s/retention.json", dir);
    size_t len;
    char *kept = file_read_all(path, 1 << 20, &len, &err), want[96];
    assert_non_null(kept);
    snprintf(want, sizeof want, "{\"keep_last\":3,\"keep_every\":0,\"diverged\":[%d]}\n", K + 1);
    assert_string_equal(kept, want); /* the marks of the deleted and the long gone dropped */
    free(kept);
}

/* ---- a YAML mapping of many keys (the duplicate check) ---- */

static void test_yaml_keys(void **state) {
    (void)state;
    const int N = 200000 / SCALE;
    text t = {0};
    for (int i = 0; i < N; i++) put(&t, "key%d: %d\n", i, i);
    begin("YAML: a mapping of %d keys", N);
    err_t err;
    ynode *root = ytree_load_string("big.yaml", t.p, t.len, &err);
    if (!root) fail_msg("%s", err.msg);
    assert_int_equal(root->n, N);
    assert_string_equal(ymap_get(root, "key7")->str, "7");
    ytree_free(root);
    put(&t, "key%d: again\n", N / 2); /* a duplicate on the last line */
    assert_null(ytree_load_string("big.yaml", t.p, t.len, &err));
    end();
    char want[96];
    snprintf(want, sizeof want, "big.yaml:%d: duplicate key 'key%d'", N + 1, N / 2);
    assert_string_equal(err.msg, want);
    free(t.p);
}

/* ---- a cluster file of many nodes (the duplicate node names) ---- */

static void test_cluster_nodes(void **state) {
    (void)state;
    const int N = 65536 / SCALE; /* CLUSTER_MAX_DEVICES nodes of one GPU */
    text t = {0};
    put(&t, "nodes:\n");
    size_t last = 0;
    for (int i = 0; i < N; i++) {
        last = t.len + strlen("  - {name: node-");
        put(&t, "  - {name: node-%05d, gpus: [{type: A100-40GB}]}\n", i);
    }
    begin("cluster file: %d nodes", N);
    cluster c;
    err_t err;
    if (cluster_load_string("big.yaml", t.p, t.len, &c, &err) < 0) fail_msg("%s", err.msg);
    assert_int_equal(c.n_nodes, N);
    assert_int_equal(c.n_devices, N);
    cluster_free(&c);
    memcpy(t.p + last, "00000", 5); /* the last node renamed to the first one's name */
    assert_int_equal(cluster_load_string("big.yaml", t.p, t.len, &c, &err), -1);
    end();
    char want[96];
    snprintf(want, sizeof want, "big.yaml:%d: nodes[%d].name: duplicate node name 'node-00000'", N + 1, N - 1);
    assert_string_equal(err.msg, want);
    free(t.p);
}

/* ---- a plan of many ranks (every worker reads all of it) ---- */

static void test_plan_ranks(void **state) {
    (void)state;
    const int W = 100000 / SCALE;
    model_spec m;
    err_t err;
    assert_int_equal(model_resolve("tiny-gpt", &m, &err), 0);
    text t = {0};
    put(&t, "{\"format\":\"cephalo-plan\",\"version\":1,\"feasible\":true,\"world_size\":%d,"
            "\"inputs\":{\"model\":\"tiny-gpt\",\"batch\":%d,\"seq\":32,\"precision\":\"fp32\"},\"ranks\":[", W, 2 * W);
    for (int r = 0; r < W; r++)
        put(&t, "%s{\"rank\":%d,\"batch\":2,\"microbatch\":1,\"microbatches\":2,\"memory_bytes\":1000000}", r ? "," : "", r);
    put(&t, "],\"units\":[");
    for (int u = 0; u < model_n_units(&m); u++) { /* the unit's parameters over the first ranks, 0 beyond */
        int64_t left = model_unit_params(&m, u);
        put(&t, "%s{\"numel\":%lld,\"shard_sizes\":[", u ? "," : "", (long long)left);
        for (int r = 0; r < W; r++) {
            int64_t take = r == W - 1 ? left : left < 100 ? left : 100;
            put(&t, "%s%lld", r ? "," : "", (long long)take);
            left -= take;
        }
        put(&t, "]}");
    }
    put(&t, "]}");
    char path[128];
    snprintf(path, sizeof path, "%s/plan.json", tmpdir);
    write_text(path, &t);
    free(t.p);
    begin("plan.json: %d ranks", W);
    train_config c = {0};
    train_config_defaults(&c);
    if (plan_read(path, W - 1, W, &c, &err) < 0) fail_msg("%s", err.msg);
    end();
    assert_int_equal(c.batch, 2);
    assert_int_equal(c.sample_offset, 2 * (int64_t)(W - 1));
    assert_int_equal(c.shard_sizes[0], 100);
    train_config_release(&c);
}

/* ---- a tokenizer of many added tokens, and a text full of them ---- */

/* GPT-2's byte alphabet (as tests/unit/test_tokenizer.c writes it): printable bytes stand for
 * themselves, the others for U+0100, U+0101, ... in byte order. */
static int byte_cp(int b) {
    static int map[256], done;
    for (int x = 0, next = 256; !done && x < 256; x++)
        map[x] = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174 ? x : next++;
    done = 1;
    return map[b];
}

static void test_added_tokens(void **state) {
    (void)state;
    const int N = 200000 / SCALE;
    text t = {0};
    put(&t, "{\"version\": \"1.0\", \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
            "\"add_prefix_space\": false, \"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": [");
    for (int i = 0; i < N; i++) put(&t, "%s{\"id\": %d, \"content\": \"<extra_%d>\", \"special\": true}", i ? ", " : "", 256 + i, i);
    /* byte-level: ids 0..255 are the bytes; printable ASCII stands for itself (GPT-2's alphabet) */
    put(&t, "], \"model\": {\"type\": \"BPE\", \"dropout\": null, \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        int cp = byte_cp(b);
        if (cp == '"' || cp == '\\') put(&t, "%s\"\\%c\": %d", b ? ", " : "", cp, b);
        else if (cp < 0x20 || cp >= 0x7f) put(&t, "%s\"\\u%04x\": %d", b ? ", " : "", cp, b);
        else put(&t, "%s\"%c\": %d", b ? ", " : "", cp, b);
    }
    put(&t, "}, \"merges\": []}}");
    text in = {0}; /* every added token once, "<" between them, and some that are none */
    for (int i = 0; i < N; i++) put(&in, "<extra_%d><<extra_x>", i);
    begin("tokenizer.json: %d added tokens, a text of as many", N);
    tok *tk;
    err_t err;
    if (tok_parse(&tk, "big.json", t.p, t.len, &err) < 0) fail_msg("%s", err.msg);
    tok_ids ids = {0};
    tok_encode(tk, in.p, in.len, true, &ids);
    end();
    /* per token: its id, then "<" and "<extra_x>" as bytes (10) */
    assert_int_equal(ids.n, 11 * (size_t)N);
    for (int i = 0; i < N; i += 997) {
        assert_int_equal(ids.v[11 * (size_t)i], 256 + i);
        assert_int_equal(ids.v[11 * (size_t)i + 1], '<');
    }
    tok_ids_free(&ids);
    tok_free(tk);
    free(t.p), free(in.p);
}

/* ---- an operator store of many pods, a work queue of many jobs ---- */

static int synced;

static wq_result sync_one(const char *key, void *arg) {
    (void)key, (void)arg;
    synced++;
    return (wq_result){0};
}

static void test_store(void **state) {
    (void)state;
    const int N = 200000 / SCALE;
    cache *c = cache_new("pods");
    cJSON *pod = cJSON_Parse("{\"metadata\": {\"name\": \"\", \"namespace\": \"ns\", \"resourceVersion\": \"1\"}}");
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(pod, "metadata");
    begin("operator store: %d pods added, looked up, half removed", N);
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "pod-%d", i);
        cJSON_ReplaceItemInObject(meta, "name", cJSON_CreateString(name));
        assert_true(cache_put(c, pod, NULL));
    }
    for (int i = 0; i < N; i += 2) {
        char name[32];
        snprintf(name, sizeof name, "pod-%d", i);
        cache_remove(c, "ns", name);
    }
    end();
    assert_int_equal(cache_size(c), N / 2);
    for (int i = 0; i < N; i += 4999) {
        char name[32];
        snprintf(name, sizeof name, "pod-%d", i);
        cJSON *o = cache_get(c, "ns", name);
        assert_true((o != NULL) == (i % 2 == 1));
        cJSON_Delete(o);
    }
    cJSON_Delete(pod);
    cache_free(c);

    /* every job queued twice (a relist's requeue over a watch's events): once each, all synced */
    wq *q = wq_new("reconcile");
    atomic_int stop = 0;
    begin("work queue: %d jobs queued twice, synced", N);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < N; i++) {
            char key[32];
            snprintf(key, sizeof key, "ns/job-%d", i);
            wq_add(q, key);
        }
    assert_int_equal(wq_len(q), N);
    while (wq_len(q) > 0) assert_true(wq_process_next(q, sync_one, NULL, &stop));
    end();
    assert_int_equal(synced, N);
    wq_free(q);
}

/* test_scale [PATTERN]: the cases whose names match (cmocka's filter: test_store, *yaml*). The
 * alarm ends the program: the cases after a quadratic one are run by naming them. */
/* ---- str_map, under the lookups above: random puts, sets and removals against a plain array ---- */

static void test_str_map(void **state) {
    (void)state;
    enum { KEYS = 5000, OPS = 400000 / SCALE };
    long *want = xmalloc(KEYS * sizeof *want); /* -1: absent */
    for (int k = 0; k < KEYS; k++) want[k] = -1;
    str_map m = {0};
    size_t n = 0;
    unsigned seed = 38;
    begin("str_map: %d random operations on %d keys", OPS, KEYS);
    for (int i = 0; i < OPS; i++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % KEYS), op = (int)((seed >> 4) % 4);
        char key[16];
        snprintf(key, sizeof key, "k%d", k);
        if (op == 0) { /* put: the value it had, or -1 and added */
            assert_int_equal(str_map_put(&m, key, i), want[k]);
            if (want[k] < 0) want[k] = i, n++;
        } else if (op == 1) {
            n += want[k] < 0;
            str_map_set(&m, key, i), want[k] = i;
        } else if (op == 2) {
            n -= want[k] >= 0;
            str_map_del(&m, key), want[k] = -1;
        }
        assert_int_equal(str_map_get(&m, key), want[k]);
    }
    end();
    assert_int_equal(m.n, n);
    for (int k = 0; k < KEYS; k++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", k);
        assert_int_equal(str_map_get(&m, key), want[k]);
    }
    str_map_free(&m);
    free(want);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retention), cmocka_unit_test(test_yaml_keys), cmocka_unit_test(test_cluster_nodes),
        cmocka_unit_test(test_plan_ranks), cmocka_unit_test(test_added_tokens), cmocka_unit_test(test_store),
        cmocka_unit_test(test_str_map),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
