/* plan_io.c - plan output: readable tables and the JSON of docs/formats.md. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/strutil.h"
#include "common/version.h"
#include "planner/arch.h"
#include "planner/engine_mem.h"
#include "planner/model_json.h"
#include "planner/plan.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static const char *rank_device(const cost_model *cm, int r) {
    const cluster_device *d = &cm->cl->devices[r];
    return d->threads ? d->type : d->spec->name;
}

static bool all_measured(const cost_model *cm, bool *any) {
    bool all = true;
    *any = false;
    for (int g = 0; g < cm->n_groups; g++) {
        all &= cm->groups[g].measured;
        *any |= cm->groups[g].measured;
    }
    return all;
}

static const char *cost_source(const cost_model *cm) {
    bool any;
    if (all_measured(cm, &any)) return "profiled";
    return any ? "profiled where measured, analytic estimates elsewhere" : "analytic estimates";
}

static void print_header(const plan *p, FILE *f) {
    const cost_model *cm = p->cm;
    bool images = arch_of(cm->model->arch)->images; /* no --seq: the tokens of an image */
    fprintf(f, "%s plan: %s (%.4g M params), batch %d, %s %d, %s, %d devices on %d nodes; costs: %s\n",
            strategy_name(p->strat), cm->model->name, cm->params / 1e6, cm->batch,
            images ? "tokens" : "seq", images ? cm->tokens : cm->seq,
            precision_name(cm->opts.prec), cm->cl->n_devices, cm->cl->n_nodes, cost_source(cm));
}

/* Width of a UTF-8 string in code points (bytes that do not continue a character). An East Asian
 * wide character (CJK, emoji) takes two terminal columns but counts as one here: telling them
 * apart needs the Unicode width tables, and the cost is only a row set off by a column. */
static int utf8_width(const char *s) {
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

/* s left-aligned in a column of `width` code points: printf's %-10s pads by bytes, which sets a
 * row with multi-byte names off. The columns are as wide as their longest name (see
 * plan_print_table), so nothing is ever cut, let alone inside a character. */
static void print_cell(FILE *f, const char *s, int width) {
    fputs(s, f);
    for (int w = utf8_width(s); w < width; w++) fputc(' ', f);
}

/* The node and device columns: their header's minimum, widened to the longest name (node names
 * are at most 63 bytes, device types 31). */
static void name_widths(const plan *p, int *node_w, int *dev_w) {
    const cost_model *cm = p->cm;
    *node_w = 10, *dev_w = 12;
    for (int i = 0; i < p->n_ranks; i++) {
        int wn = utf8_width(cm->cl->nodes[cm->cl->devices[i].node].name), wd = utf8_width(rank_device(cm, i));
        if (wn > *node_w) *node_w = wn;
        if (wd > *dev_w) *dev_w = wd;
    }
}

void plan_print_table(const plan *p, FILE *f) {
    const cost_model *cm = p->cm;
    print_header(p, f);
    if (!p->feasible) {
        fprintf(f, "infeasible: %s\n", p->reason);
        return;
    }
    int node_w, dev_w;
    name_widths(p, &node_w, &dev_w);
    fprintf(f, "%4s  %-*s %-*s %5s %5s %4s %-9s %7s %9s %9s %9s %6s %9s %9s  %s\n", "rank", node_w, "node", dev_w, "device",
            "batch", "micro", "x", "recompute", "state%", "state GiB", "comp GiB", "peak GiB", "use%", "fwd ms", "bwd ms", "costs");
    for (int i = 0; i < p->n_ranks; i++) {
        const plan_rank *r = &p->ranks[i];
        const cost_group *g = &cm->groups[cost_group_of(cm, i)];
        fprintf(f, "%4d  ", i);
        print_cell(f, cm->cl->nodes[cm->cl->devices[i].node].name, node_w);
        fputc(' ', f);
        print_cell(f, rank_device(cm, i), dev_w);
        fprintf(f, " %5d %5d %4d %-9s %6.2f%% %9.2f %9.2f %9.2f %5.1f%% %9.1f %9.1f  %s\n", r->batch, r->micro, r->micros,
                recompute_name(r->recompute), 100 * r->state_ratio, r->state_bytes / GIB, r->compute_bytes / GIB, r->peak_bytes / GIB,
                100 * r->peak_bytes / r->capacity_bytes, r->fwd_ms, r->bwd_ms, g->measured ? "measured" : "estimated");
    }
    fprintf(f, "predicted: %.1f ms/iteration, %.2f samples/s, MFU %.1f%%\n", p->iter_ms, p->samples_per_s, 100 * p->mfu);
    fprintf(f, "  forward %.1f ms (collectives %.1f), backward %.1f ms (collectives %.1f), exposed collectives %.1f ms, optimizer %.1f ms\n",
            p->fwd_ms, p->fwd_floor_ms, p->bwd_ms, p->bwd_floor_ms, p->exposed_ms, p->opt_ms);
    if (p->replicated)
        fprintf(f, "  state replicated on every device; gradients all-reduced\n");
    else if (p->uneven)
        fprintf(f, "  state sharded unevenly (%d of %d units uneven; collectives x%.2f)\n", p->n_uneven_units, p->n_units,
                cm->comm.uneven_factor);
    else
        fprintf(f, "  state sharded evenly over %d devices\n", p->n_ranks);
    if (cm->opts.host_bytes > 0) {
        double most = 0;
        for (int i = 0; i < p->n_ranks; i++) most = fmax(most, p->ranks[i].host_bytes);
        fprintf(f, "  host offload pool: at most %.2f GiB per rank of %.2f GiB usable (%.2f x host memory %.2f GiB)\n",
                most / GIB, cost_host_usable(cm) / GIB, cm->opts.mem_cap, cm->opts.host_bytes / GIB);
    }
    fprintf(f, "  planned in %.1f ms (%ld feasibility tests)\n", p->solve_ms, p->checks);
}

void plan_print_compare(const plan *plans, int n, FILE *f) {
    if (n == 0) return;
    print_header(&plans[0], f);
    fprintf(f, "%-8s %12s %10s %8s %7s  %s\n", "strategy", "iter ms", "samples/s", "speedup", "MFU", "peak GiB per device / status");
    double base = 0;
    for (int s = 0; s < n; s++)
        if (plans[s].strat == STRAT_CEPHALO && plans[s].feasible) base = plans[s].samples_per_s;
    for (int s = 0; s < n; s++) {
        const plan *p = &plans[s];
        if (!p->feasible) {
            bool oom = strstr(p->reason, "memory") || strstr(p->reason, "does not fit");
            fprintf(f, "%-8s %12s %10s %8s %7s  %s: %s\n", strategy_name(p->strat), "-", "-", "-", "-",
                    oom ? "OOM" : "infeasible", p->reason);
            continue;
        }
        fprintf(f, "%-8s %12.1f %10.2f %7.2fx %6.1f%%  ", strategy_name(p->strat), p->iter_ms, p->samples_per_s,
                base > 0 ? p->samples_per_s / base : 1.0, 100 * p->mfu);
        for (int i = 0; i < p->n_ranks && i < 16; i++) fprintf(f, "%s%.1f", i ? " " : "", p->ranks[i].peak_bytes / GIB);
        if (p->n_ranks > 16) fprintf(f, " ... (%d devices)", p->n_ranks);
        fputc('\n', f);
    }
    fprintf(f, "speedup: samples/s relative to cephalo\n");
}

/* ---- JSON ---- */

static int write_json(cJSON *root, FILE *f, err_t *err) {
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return err_set(err, "cannot render JSON (out of memory)");
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    free(text);
    return ok ? 0 : err_set(err, "write error");
}

static cJSON *inputs_json(const plan *p) {
    const cost_model *cm = p->cm;
    cJSON *in = cJSON_CreateObject();
    cJSON_AddStringToObject(in, "model", cm->model->name);
    cJSON_AddItemToObject(in, "model_spec", model_to_json(cm->model));
    cJSON_AddNumberToObject(in, "params", (double)cm->params);
    cJSON_AddNumberToObject(in, "batch", cm->batch);
    cJSON_AddNumberToObject(in, "seq", cm->seq);
    cJSON_AddNumberToObject(in, "tokens_per_sample", cm->tokens);
    cJSON_AddStringToObject(in, "precision", precision_name(cm->opts.prec));
    cJSON_AddStringToObject(in, "strategy", strategy_name(p->strat));
    cJSON_AddNumberToObject(in, "mem_cap", cm->opts.mem_cap);
    if (cm->opts.host_bytes > 0) cJSON_AddNumberToObject(in, "host_memory_bytes", cm->opts.host_bytes);
    cJSON_AddStringToObject(in, "recompute", recompute_policy_name(cm->opts.recompute));
    cJSON_AddStringToObject(in, "costs", cost_source(cm));
    /* what the environment's switches made of the memory model: workers check theirs agree */
    engine_switches sw = engine_switches_of(cm->model, cm->opts.prec);
    cJSON *eng = cJSON_AddObjectToObject(in, "engine");
    cJSON_AddNumberToObject(eng, "state_bytes_per_param", sw.state_bytes_per_param);
    cJSON_AddNumberToObject(eng, "activation_bits", sw.activation_bits);
    cJSON_AddNumberToObject(eng, "logits_row_stride", sw.logits_row_stride);
    return in;
}

static cJSON *rank_json(const plan *p, int i) {
    const cost_model *cm = p->cm;
    const plan_rank *r = &p->ranks[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", i);
    cJSON_AddStringToObject(o, "node", cm->cl->nodes[cm->cl->devices[i].node].name);
    cJSON_AddStringToObject(o, "device", rank_device(cm, i));
    if (cm->cl->devices[i].threads) cJSON_AddNumberToObject(o, "threads", cm->cl->devices[i].threads);
    cJSON_AddNumberToObject(o, "memory_bytes", r->capacity_bytes);
    cJSON_AddNumberToObject(o, "batch", r->batch);
    cJSON_AddNumberToObject(o, "microbatch", r->micro);
    cJSON_AddNumberToObject(o, "microbatches", r->micros);
    cJSON_AddStringToObject(o, "recompute", recompute_name(r->recompute));
    cJSON_AddNumberToObject(o, "state_ratio", r->state_ratio);
    cJSON_AddNumberToObject(o, "state_params", (double)r->state_params);
    cJSON_AddBoolToObject(o, "measured", cm->groups[cost_group_of(cm, i)].measured);
    cJSON *pred = cJSON_AddObjectToObject(o, "predicted");
    cJSON_AddNumberToObject(pred, "peak_bytes", (double)r->peak_bytes);
    cJSON_AddNumberToObject(pred, "compute_bytes", (double)r->compute_bytes);
    cJSON_AddNumberToObject(pred, "state_bytes", (double)r->state_bytes);
    cJSON_AddNumberToObject(pred, "usable_bytes", r->usable_bytes);
    cJSON_AddNumberToObject(pred, "host_bytes", r->host_bytes);
    cJSON_AddNumberToObject(pred, "fwd_ms", r->fwd_ms);
    cJSON_AddNumberToObject(pred, "bwd_ms", r->bwd_ms);
    cJSON_AddNumberToObject(pred, "optimizer_ms", r->opt_ms);
    return o;
}

static cJSON *plan_json(const plan *p) {
    const cost_model *cm = p->cm;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", PLAN_FORMAT);
    cJSON_AddNumberToObject(root, "version", PLAN_VERSION);
    /* who wrote it (a record; compatibility is the format version's business) */
    cJSON_AddStringToObject(root, "cephalo_version", cephalo_version());
    cJSON_AddItemToObject(root, "inputs", inputs_json(p));
    cJSON_AddBoolToObject(root, "feasible", p->feasible);
    if (!p->feasible) {
        cJSON_AddStringToObject(root, "reason", p->reason);
        return root;
    }
    cJSON_AddNumberToObject(root, "world_size", p->n_ranks);
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    for (int i = 0; i < p->n_ranks; i++) cJSON_AddItemToArray(ranks, rank_json(p, i));
    cJSON *units = cJSON_AddArrayToObject(root, "units");
    for (int u = 0; u < p->n_units; u++) {
        cJSON *o = cJSON_CreateObject();
        char name[32];
        model_unit_name(cm->model, u, name, sizeof name);
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddNumberToObject(o, "numel", (double)model_unit_params(cm->model, u));
        cJSON *sz = cJSON_AddArrayToObject(o, "shard_sizes");
        for (int i = 0; i < p->n_ranks; i++) cJSON_AddItemToArray(sz, cJSON_CreateNumber((double)p->shards[(size_t)u * p->n_ranks + i]));
        cJSON_AddItemToArray(units, o);
    }
    cJSON_AddBoolToObject(root, "replicated", p->replicated);
    cJSON_AddBoolToObject(root, "uneven", p->uneven);
    cJSON *pred = cJSON_AddObjectToObject(root, "predicted");
    cJSON_AddNumberToObject(pred, "iter_ms", p->iter_ms);
    cJSON_AddNumberToObject(pred, "samples_per_s", p->samples_per_s);
    cJSON_AddNumberToObject(pred, "mfu", p->mfu);
    cJSON_AddNumberToObject(pred, "fwd_ms", p->fwd_ms);
    cJSON_AddNumberToObject(pred, "bwd_ms", p->bwd_ms);
    cJSON_AddNumberToObject(pred, "fwd_collectives_ms", p->fwd_floor_ms);
    cJSON_AddNumberToObject(pred, "bwd_collectives_ms", p->bwd_floor_ms);
    cJSON_AddNumberToObject(pred, "exposed_collectives_ms", p->exposed_ms);
    cJSON_AddNumberToObject(pred, "optimizer_ms", p->opt_ms);
    return root;
}

int plan_write_json(const plan *p, FILE *f, err_t *err) { return write_json(plan_json(p), f, err); }

int plan_write_compare_json(const plan *plans, int n, FILE *f, err_t *err) {
    cJSON *root = cJSON_CreateObject();
    if (n > 0) cJSON_AddItemToObject(root, "inputs", inputs_json(&plans[0]));
    cJSON *arr = cJSON_AddArrayToObject(root, "strategies");
    for (int s = 0; s < n; s++) {
        const plan *p = &plans[s];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "strategy", strategy_name(p->strat));
        cJSON_AddBoolToObject(o, "feasible", p->feasible);
        if (p->feasible) {
            cJSON_AddNumberToObject(o, "iter_ms", p->iter_ms);
            cJSON_AddNumberToObject(o, "samples_per_s", p->samples_per_s);
        } else {
            cJSON_AddNullToObject(o, "iter_ms");
            cJSON_AddNullToObject(o, "samples_per_s");
        }
        cJSON *peaks = cJSON_AddArrayToObject(o, "peak_bytes");
        for (int i = 0; p->feasible && i < p->n_ranks; i++) cJSON_AddItemToArray(peaks, cJSON_CreateNumber((double)p->ranks[i].peak_bytes));
        cJSON_AddStringToObject(o, "reason", p->feasible ? "" : p->reason);
        cJSON_AddItemToArray(arr, o);
    }
    return write_json(root, f, err);
}

/* ---- --dump-costs ---- */

/* Writes a cJSON object without its closing brace, so that large members can follow streamed. */
static bool put_open_object(cJSON *obj, FILE *f) {
    char *text = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!text) return false;
    size_t len = strlen(text);
    bool ok = len >= 2 && fwrite(text, 1, len - 1, f) == len - 1;
    free(text);
    return ok;
}

/* One candidate; keep: recompute none. */
static bool put_candidate(const cost_group *g, int m, int l, recompute_mode r, bool first, FILE *f) {
    return fprintf(f, "%s[%d,%d,%.17g,%.17g,%lld,\"%s\"]", first ? "" : ",", m, l, (double)l * g->fwd_ms[m],
                   (double)l * cost_bwd_ms(g, m, r), (long long)cost_compute_bytes_mode(g, m, l, r), recompute_name(r)) >= 0;
}

/* One group's candidates, streamed: [m, l, l*F(m), l*K(m), M(m), recompute] for every m <= mmax
 * and l with m*l <= B-(N-1): recompute full, and none where its memory fits (the job's policy
 * permitting). Identical devices share one table, so the file stays O(groups * B log B). */
static bool put_group(const cost_group *g, int id, recompute_policy policy, FILE *f) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "group", id);
    cJSON_AddStringToObject(o, "device", g->dev->threads ? g->dev->type : g->dev->spec->name);
    cJSON_AddNumberToObject(o, "first_rank", g->first_rank);
    cJSON_AddNumberToObject(o, "count", g->count);
    cJSON_AddNumberToObject(o, "usable_bytes", g->usable_bytes);
    cJSON_AddBoolToObject(o, "measured", g->measured);
    cJSON_AddStringToObject(o, "candidate_fields", "[microbatch, microbatches, fwd_ms, bwd_ms, compute_bytes, recompute]");
    if (!put_open_object(o, f) || fputs(",\"candidates\":[", f) < 0) return false;
    bool first = true;
    for (int m = 1; m <= g->mmax; m++)
        for (int l = 1; (long)m * l <= g->mlimit; l++) {
            if (policy != RECOMPUTE_FORCE_NONE) {
                if (!put_candidate(g, m, l, RECOMPUTE_FULL, first, f)) return false;
                first = false;
            }
            if (policy != RECOMPUTE_FORCE_FULL && (double)cost_compute_bytes_mode(g, m, l, RECOMPUTE_NONE) <= g->usable_bytes) {
                if (!put_candidate(g, m, l, RECOMPUTE_NONE, first, f)) return false;
                first = false;
            }
        }
    return fputs("]}", f) >= 0;
}

static cJSON *dump_header(const cost_model *cm) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "cephalo-costs");
    cJSON_AddNumberToObject(root, "version", 3);
    cJSON_AddStringToObject(root, "model", cm->model->name);
    cJSON_AddNumberToObject(root, "batch", cm->batch);
    cJSON_AddNumberToObject(root, "params", (double)cm->params);
    cJSON_AddNumberToObject(root, "state_bytes_per_param", cm->state_bpp);
    cJSON_AddStringToObject(root, "objective",
                            "exposed + max(max_i l_i*fwd_i, fwd_collectives) + max(max_i l_i*bwd_i, bwd_collectives); "
                            "even state needs compute_bytes + state_bytes_per_param*even_state_params <= usable_bytes on every rank, "
                            "uneven state needs sum_i floor((usable_i - compute_i)/state_bytes_per_param) >= params and pays uneven_factor");
    cJSON *comm = cJSON_AddObjectToObject(root, "comm");
    cJSON_AddNumberToObject(comm, "world", cm->comm.world);
    cJSON_AddNumberToObject(comm, "fwd_collectives_ms", cost_fwd_floor(cm, false));
    cJSON_AddNumberToObject(comm, "bwd_collectives_ms", cost_bwd_floor(cm, false));
    cJSON_AddNumberToObject(comm, "exposed_ms", cost_exposed_ms(cm, false));
    cJSON_AddNumberToObject(comm, "uneven_factor", cm->comm.uneven_factor);
    cJSON_AddNumberToObject(comm, "even_state_params", (double)cm->even_state_params);
    cJSON_AddBoolToObject(comm, "measured", cm->comm.measured);
    /* rank i's candidates are those of group rank_group[i] */
    cJSON *ranks = cJSON_AddArrayToObject(root, "rank_group");
    for (int i = 0; i < cm->cl->n_devices; i++) cJSON_AddItemToArray(ranks, cJSON_CreateNumber(cost_group_of(cm, i)));
    return root;
}

/* Built in memory and written atomically: a failure never leaves half a file at path. */
int plan_dump_costs(const cost_model *cm, const char *path, err_t *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return err_set(err, "%s: cannot write: out of memory", path);
    bool ok = put_open_object(dump_header(cm), f) && fputs(",\"groups\":[", f) >= 0;
    for (int g = 0; ok && g < cm->n_groups; g++) ok = (g == 0 || fputc(',', f) != EOF) && put_group(&cm->groups[g], g, cm->opts.recompute, f);
    ok = ok && fputs("]}\n", f) >= 0;
    if (fclose(f) != 0) ok = false;
    int rc = ok ? file_write_atomic(path, text, len, 0, err) : err_set(err, "%s: cannot write: out of memory", path);
    free(text);
    return rc;
}
