/* cost.c - per-device compute costs (profiled or analytic), compute memory and collectives.
 * docs/cost-model.md explains each estimate. */
#include "planner/cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/nccl_budget.h"
#include "planner/arch.h"
#include "planner/engine_mem.h"

/* Analytic estimate knobs (replaced by measurements when a profile is given). */
#define EFF_MAX_GPU 0.65 /* best fraction of peak a large matmul reaches */
#define EFF_MAX_CPU 0.60
#define KERNEL_OVERHEAD_MS_GPU 0.006 /* launch + sync per kernel */
#define KERNEL_OVERHEAD_MS_CPU 0.002
#define KERNELS_PER_UNIT_PASS 12
#define ALPHA_INTRA_MS 0.010 /* per ring step inside one node */
#define ALPHA_INTER_MS 0.030 /* per ring step across nodes */
/* CPU devices of one host talk through the socket communicator over loopback: a ring step is a
 * thread wake-up and a few syscalls, the bytes a copy through the kernel (the collectives of
 * `make demo`'s 3 devices on the 2-core host: 0.06 ms per step, 1.6 GB/s; docs/cost-model.md) */
#define ALPHA_LOOPBACK_MS 0.060
#define LOOPBACK_GBS 1.6
/* A collective among CPU devices whose compute threads fill the host's cores (comm_contends)
 * waits for its communicator thread to get a core: a scheduler wake-up, per collective, whatever
 * the bytes (tiny-gpt, tiny-llama and tiny-vit on 2 x cpu:1t, the 2-core host: 0.31, 0.19 and
 * 0.18 ms per collective beyond the loopback's; docs/cost-model.md) */
#define CONTENDED_WAKEUP_MS 0.25
#define OPT_BYTES_PER_PARAM 32.0 /* AdamW reads param, grad, m, v and writes param, m, v */

static bool is_cpu(const cluster_device *d) { return d->threads > 0; }

/* One host's CPU devices (a local run), which the socket communicator links over loopback. */
static bool cpu_host(const cluster *cl) {
    if (cl->n_nodes != 1) return false;
    for (int r = 0; r < cl->n_devices; r++)
        if (!is_cpu(&cl->devices[r])) return false;
    return true;
}

static double device_peak_tflops(const cluster_device *d, precision p) {
    if (d->tflops_override > 0) return d->tflops_override;
    if (is_cpu(d)) return d->threads * CPU_GFLOPS_PER_THREAD / 1000.0;
    return gpu_peak_tflops(d->spec, p);
}

static double device_bw_gbs(const cluster_device *d) {
    if (is_cpu(d)) return fmin(d->threads * CPU_BW_GBS_PER_THREAD, 40.0);
    return d->spec->mem_bw_gbs;
}

/* ---- analytic unit times ---- */

typedef struct unit_est {
    double flops, traffic, param_bytes; /* per sample, per sample, per microbatch */
} unit_est;

static unit_est unit_estimate(const cost_model *cm, unit_kind k) {
    int elem = precision_gather_bytes(cm->opts.prec);
    unit_est u;
    u.flops = model_kind_fwd_flops(cm->model, k, cm->seq);
    u.traffic = model_kind_traffic_bytes(cm->model, k, cm->seq, elem);
    u.param_bytes = (double)model_kind_params(cm->model, k) * elem;
    /* a token embedding reads only the rows its tokens look up (and the positions'), not its
     * table: GPT-2's 50,257 rows would be 25 MB a microbatch, ~100x what the lookups move */
    if (k == UNIT_EMBEDDING && !arch_of(cm->model->arch)->images) {
        u.traffic += fmin(u.param_bytes, 2.0 * cm->tokens * cm->model->d_model * elem);
        u.param_bytes = 0;
    }
    return u;
}

/* How much slower a CPU device computes than alone on its cores: its node's CPU devices' threads
 * over the cores they share, when more (`make demo`'s three 1-thread devices on a 2-core host
 * each get 2/3 of a core). 1 for a GPU, or when the node's cores are not known (a cluster file). */
static double cpu_share(const cluster *cl, const cluster_device *d) {
    int cores = cl->nodes[d->node].host_cores;
    if (!is_cpu(d) || cores <= 0) return 1;
    int threads = 0;
    for (int r = 0; r < cl->n_devices; r++)
        if (cl->devices[r].node == d->node && is_cpu(&cl->devices[r])) threads += cl->devices[r].threads;
    return fmax(1.0, (double)threads / cores);
}

/* Time of `mult` x the forward work of a unit for microbatch m: compute at a saturating
 * efficiency (small microbatches leave the device underused) plus memory traffic and a fixed
 * per-kernel overhead. Backward = mult 2 (and it writes the fp32 gradient once). */
static double unit_ms(const cluster_device *d, const cost_model *cm, unit_est u, int m,
                      double mult) {
    double peak = device_peak_tflops(d, cm->opts.prec) * 1e12;
    double bw = device_bw_gbs(d) * 1e9;
    double tokens = (double)m * cm->tokens;
    double half = is_cpu(d) ? 64.0 : 256.0 * sqrt(peak / 1e12);
    double eff = (is_cpu(d) ? EFF_MAX_CPU : EFF_MAX_GPU) * tokens / (tokens + half);
    double compute = mult * u.flops * m / (peak * eff);
    double memory = (mult * u.traffic * m + mult * u.param_bytes) / bw;
    double overhead = mult * KERNELS_PER_UNIT_PASS *
                      (is_cpu(d) ? KERNEL_OVERHEAD_MS_CPU : KERNEL_OVERHEAD_MS_GPU);
    return (compute + memory) * 1e3 + overhead;
}

/* ---- profiled unit times ---- */

/* Value of a measured curve at microbatch m: linear between points, proportional below the
 * first, and beyond the last a straight line whose slope is fitted over the upper half of the
 * points (the linear regime of the paper's figure 5). */
static double curve_at(const int *xs, const double *ys, int n, int m) {
    if (m <= xs[0]) return ys[0] * m / xs[0];
    for (int i = 1; i < n; i++)
        if (m <= xs[i])
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (m - xs[i - 1]) / (double)(xs[i] - xs[i - 1]);
    if (n == 1) return ys[0] * m / xs[0];
    int lo = n / 2;
    if (n - lo < 2) lo = n - 2;
    double sx = 0, sy = 0, sxx = 0, sxy = 0, k = n - lo;
    for (int i = lo; i < n; i++) {
        sx += xs[i];
        sy += ys[i];
        sxx += (double)xs[i] * xs[i];
        sxy += xs[i] * ys[i];
    }
    double den = k * sxx - sx * sx;
    double slope = den > 0 ? (k * sxy - sx * sy) / den : ys[n - 1] / xs[n - 1];
    if (slope <= 0) slope = ys[n - 1] / xs[n - 1];
    return ys[n - 1] + slope * (m - xs[n - 1]);
}

typedef struct unit_times {
    double fwd, bwd;
    double bwd_keep; /* the backward phase with recompute none: measured, or bwd */
} unit_times;

static unit_times unit_times_at(const cost_model *cm, const cluster_device *d,
                                const profile_entry *pe, unit_kind k, int m) {
    unit_est u = unit_estimate(cm, k);
    double share = cpu_share(cm->cl, d);
    unit_times est = {share * unit_ms(d, cm, u, m, 1.0), share * unit_ms(d, cm, u, m, 2.0), 0};
    est.bwd_keep = est.bwd;
    if (!pe) return est;
    const profile_curve *c = k == UNIT_BLOCK ? &pe->block : k == UNIT_HEAD ? &pe->head : &pe->embedding;
    if (c->present) {
        unit_times t = {curve_at(pe->microbatch, c->fwd_ms, pe->n_points, m),
                        curve_at(pe->microbatch, c->bwd_ms, pe->n_points, m), 0};
        t.bwd_keep = c->bwd_keep_ms ? curve_at(pe->microbatch, c->bwd_keep_ms, pe->n_points, m) : t.bwd;
        return t;
    }
    /* Unmeasured embedding/head: the estimate, calibrated by how far the block's estimate is
     * from the block's measurement at the same microbatch. */
    unit_est ub = unit_estimate(cm, UNIT_BLOCK);
    double est_blk = unit_ms(d, cm, ub, m, 1.0) + unit_ms(d, cm, ub, m, 2.0);
    double meas_blk = curve_at(pe->microbatch, pe->block.fwd_ms, pe->n_points, m) +
                      curve_at(pe->microbatch, pe->block.bwd_ms, pe->n_points, m);
    double scale = meas_blk / (share * est_blk); /* the measurement has the sharing in it */
    return (unit_times){est.fwd * scale, est.bwd * scale, est.bwd * scale};
}

/* ---- compute memory ---- */

/* NCCL's own buffers on a GPU of a multi-GPU job (common/nccl_budget.h): outside what the engine
 * allocates and what a profile measures, so both paths add them. */
static double nccl_bytes(const cost_model *cm, const cluster_device *d) {
    return is_cpu(d) ? 0 : (double)nccl_device_bytes(cm->cl->n_devices, d->cc_major);
}

/* What recompute none adds to the compute memory: the engine's own difference (planner/engine_mem.c),
 * exactly keep_m1*m + keep_ml*m*l (a profile measures recompute full). */
static void keep_memory(const cost_model *cm, const cluster_device *d, cost_group *g) {
    engine_opts full = {.sharded = cm->cl->n_devices > 1, .prec = cm->opts.prec, .double_buffer = !is_cpu(d)};
    engine_opts one = full, two = full;
    one.recompute = two.recompute = RECOMPUTE_NONE;
    one.kept = 1, two.kept = 2;
    const model_spec *md = cm->model;
    double f = (double)engine_compute_bytes(md, cm->seq, 1, full);
    double k1 = (double)engine_compute_bytes(md, cm->seq, 1, one), k2 = (double)engine_compute_bytes(md, cm->seq, 1, two);
    g->keep_ml = k2 - k1;
    g->keep_m1 = k1 - f - g->keep_ml;
}

static void compute_memory(const cost_model *cm, const cluster_device *d, const profile_entry *pe,
                           double *m0, double *m1) {
    const model_spec *md = cm->model;
    if (pe && pe->compute_bytes) {
        /* least-squares line through the measured points, less the head's logits (the one
         * part that is not linear in m: cost_compute_bytes adds it back exactly) */
        double sx = 0, sy = 0, sxx = 0, sxy = 0, n = pe->n_points;
        for (int i = 0; i < pe->n_points; i++) {
            double x = pe->microbatch[i];
            double y = pe->compute_bytes[i] - (double)engine_head_bytes(md, cm->seq, (int)x);
            sx += x, sy += y, sxx += x * x, sxy += x * y;
        }
        double den = n * sxx - sx * sx;
        *m1 = den > 0 ? (n * sxy - sx * sy) / den : sy / sx;
        if (*m1 < 0) *m1 = 0;
        *m0 = (sy - *m1 * sx) / n;
        /* `cephalo profile` measures the engine of a sharded rank; one rank alone has no
         * gathered-parameter and full-gradient slots */
        if (cm->cl->n_devices == 1) {
            engine_opts sh = {.sharded = true, .prec = cm->opts.prec, .double_buffer = !is_cpu(d)}, one = sh;
            one.sharded = false;
            *m0 -= (double)(engine_compute_bytes(md, cm->seq, 0, sh) - engine_compute_bytes(md, cm->seq, 0, one));
        }
        if (*m0 < 0) *m0 = 0;
        *m0 += nccl_bytes(cm, d);
        return;
    }
    engine_opts eo = {.sharded = cm->cl->n_devices > 1, .prec = cm->opts.prec,
                      .double_buffer = !is_cpu(d)};
    double reserve = is_cpu(d) ? 0 : GPU_RESERVED_BYTES;
    /* exactly what the engine allocates (planner/engine_mem.c): linear in m once the head's
     * logits are set apart */
    int s = cm->seq;
    double at0 = (double)(engine_compute_bytes(md, s, 0, eo) - engine_head_bytes(md, s, 0));
    double at1 = (double)(engine_compute_bytes(md, s, 1, eo) - engine_head_bytes(md, s, 1));
    *m0 = at0 + reserve + nccl_bytes(cm, d);
    *m1 = at1 - at0;
}

double cost_host_bytes(const cost_model *cm, int b) { return b * cm->host_per_sample; }

double cost_host_usable(const cost_model *cm) { return cm->opts.host_bytes * cm->opts.mem_cap; }

int64_t cost_compute_bytes(const cost_group *g, int m) {
    return (int64_t)ceil(g->m0 + g->m1 * m) + engine_head_bytes(g->model, g->seq, m);
}

int64_t cost_compute_bytes_mode(const cost_group *g, int m, int l, recompute_mode r) {
    if (r == RECOMPUTE_FULL) return cost_compute_bytes(g, m);
    return (int64_t)ceil(g->m0 + g->m1 * m + g->keep_m1 * m + g->keep_ml * m * (double)l) +
           engine_head_bytes(g->model, g->seq, m);
}

double cost_bwd_ms(const cost_group *g, int m, recompute_mode r) {
    return r == RECOMPUTE_NONE ? g->bwd_keep_ms[m] : g->bwd_ms[m];
}

/* ---- groups ---- */

static bool same_device(const cluster_device *a, const cluster_device *b) {
    return strcmp(a->type, b->type) == 0 && a->memory_bytes == b->memory_bytes &&
           a->tflops_override == b->tflops_override && a->threads == b->threads;
}

static void build_group(cost_model *cm, cost_group *g, int batch_limit) {
    const cluster_device *d = g->dev;
    /* a CPU device's own type ("cpu-2t-4.00g") first, then any profiled "cpu" */
    const profile_entry *pe =
        cm->opts.prof ? profile_find(cm->opts.prof, d->type, cm->model->name, cm->seq, cm->opts.prec)
                      : NULL;
    if (!pe && cm->opts.prof && is_cpu(d)) {
        /* `cephalo profile` names CPU devices by their threads ("cpu-2t"): memory does not
         * change the times, and the compute memory it measured is the engine's, whatever the cap */
        char by_threads[32];
        snprintf(by_threads, sizeof by_threads, "%s-%dt", GPU_CPU_NAME, d->threads);
        pe = profile_find(cm->opts.prof, by_threads, cm->model->name, cm->seq, cm->opts.prec);
    }
    if (!pe && cm->opts.prof && is_cpu(d))
        pe = profile_find(cm->opts.prof, GPU_CPU_NAME, cm->model->name, cm->seq, cm->opts.prec);
    g->measured = pe != NULL;
    g->peak_tflops = device_peak_tflops(d, cm->opts.prec);
    g->usable_bytes = d->memory_bytes * cm->opts.mem_cap;
    g->model = cm->model, g->seq = cm->seq;
    compute_memory(cm, d, pe, &g->m0, &g->m1);
    keep_memory(cm, d, g);
    g->slot_bytes = cm->cl->n_devices > 1 ? 4.0 * (double)engine_max_unit_params(cm->model) * 4 : 0;
    g->mmax = 0;
    while (g->mmax < batch_limit && cost_compute_bytes(g, g->mmax + 1) <= g->usable_bytes)
        g->mmax++;
    /* times beyond the memory limit too: the baselines that ignore memory need them */
    g->mlimit = batch_limit;
    g->fwd_ms = xcalloc((size_t)g->mlimit + 1, sizeof(double));
    g->bwd_ms = xcalloc((size_t)g->mlimit + 1, sizeof(double));
    g->bwd_keep_ms = xcalloc((size_t)g->mlimit + 1, sizeof(double));
    int L = cm->model->n_layer;
    /* the step check's correction: how far a training step on these devices was from this
     * entry's prediction (the load of the host, what per-unit timing leaves out) */
    double scale = pe && pe->step_scale > 0 ? pe->step_scale : 1.0;
    g->step_overhead_ms = pe ? pe->step_overhead_ms : 0;
    for (int m = 1; m <= g->mlimit; m++) {
        unit_times e = unit_times_at(cm, d, pe, UNIT_EMBEDDING, m);
        unit_times b = unit_times_at(cm, d, pe, UNIT_BLOCK, m);
        unit_times h = unit_times_at(cm, d, pe, UNIT_HEAD, m);
        g->fwd_ms[m] = scale * (e.fwd + L * b.fwd + h.fwd + h.bwd); /* the head runs fused in the forward */
        g->bwd_ms[m] = scale * (L * (b.fwd + b.bwd) + e.bwd);
        /* no block recomputed: the profile's measured backward phases when it has them
         * (version 2), else the block's bwd (its backward phase less its forward) and the
         * embedding's (whose recompute is a lookup) */
        g->bwd_keep_ms[m] = scale * (L * b.bwd_keep + e.bwd_keep);
    }
    /* measured: zeroing the gradient shard, its squared norm and AdamW (`cephalo profile`) */
    g->opt_ms_per_param = pe && pe->optimizer_ms_per_mparam > 0
                              ? scale * pe->optimizer_ms_per_mparam / 1e6
                              : cpu_share(cm->cl, d) * OPT_BYTES_PER_PARAM / (device_bw_gbs(d) * 1e9) * 1e3;
}

static int count_groups(const cluster *cl) {
    int n = cl->n_devices > 0;
    for (int r = 1; r < cl->n_devices; r++) n += !same_device(&cl->devices[r - 1], &cl->devices[r]);
    return n;
}

static void build_groups(cost_model *cm) {
    const cluster *cl = cm->cl;
    int limit = cm->batch - (cl->n_devices - 1); /* every other rank needs a sample */
    cm->groups = xcalloc((size_t)cl->n_devices, sizeof *cm->groups);
    cm->n_groups = 0;
    for (int r = 0; r < cl->n_devices; r++) {
        cost_group *last = cm->n_groups ? &cm->groups[cm->n_groups - 1] : NULL;
        if (last && same_device(last->dev, &cl->devices[r])) {
            last->count++;
            continue;
        }
        cost_group *g = &cm->groups[cm->n_groups++];
        g->first_rank = r;
        g->count = 1;
        g->dev = &cl->devices[r];
        build_group(cm, g, limit);
    }
}

/* ---- communication ---- */

static void ring_link(const cluster *cl, double *gbs, double *alpha_ms) {
    if (cpu_host(cl)) {
        *gbs = LOOPBACK_GBS;
        *alpha_ms = ALPHA_LOOPBACK_MS;
        return;
    }
    if (cl->n_nodes == 1) {
        *gbs = cl->nodes[0].intra_gbps / 8;
        *alpha_ms = ALPHA_INTRA_MS;
        return;
    }
    double slowest = INFINITY;
    for (int i = 0; i < cl->n_nodes; i++) slowest = fmin(slowest, cl->nodes[i].network_gbps);
    *gbs = slowest / 8;
    *alpha_ms = ALPHA_INTER_MS;
}

/* Measured collective time at `bytes`: linear between points, extended by the last segment's
 * slope (time is linear in the collective size, the paper's supplementary section C). */
static double comm_curve_at(const double *xs, const double *ys, int n, double bytes) {
    if (n == 1 || bytes <= xs[0]) return n == 1 && xs[0] > 0 ? ys[0] * bytes / xs[0] : ys[0];
    for (int i = 1; i < n; i++)
        if (bytes <= xs[i])
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (bytes - xs[i - 1]) / (xs[i] - xs[i - 1]);
    double slope = (ys[n - 1] - ys[n - 2]) / (xs[n - 1] - xs[n - 2]);
    return ys[n - 1] + fmax(slope, 0) * (bytes - xs[n - 1]);
}

/* Mean measured uneven/even ratio over both collectives; the paper's 15% when not measured. */
static double measured_uneven_factor(const profile *p, int world) {
    double sum = 0;
    int n = 0;
    for (int rs = 0; rs < 2; rs++) {
        const profile_comm *pc = profile_find_comm(p, world, rs);
        if (!pc || !pc->uneven_ms) continue;
        for (int i = 0; i < pc->n_points; i++)
            if (pc->ms[i] > 0) sum += pc->uneven_ms[i] / pc->ms[i], n++;
    }
    return n ? fmax(1.0, sum / n) : UNEVEN_COMM_FACTOR;
}

static double comm_line(const cost_model *cm, bool rs, double bytes) {
    int n = cm->comm.world;
    if (n <= 1) return 0;
    const profile_comm *pc = cm->opts.prof ? profile_find_comm(cm->opts.prof, n, rs) : NULL;
    if (pc) return comm_curve_at(pc->bytes, pc->ms, pc->n_points, bytes);
    return (n - 1) * cm->comm.alpha_ms + (n - 1) / (double)n * bytes / (cm->comm.bandwidth_gbs * 1e9) * 1e3;
}

/* CPU time of one rank's communicator for a collective of `bytes`: measured (cpu_ms), else on
 * loopback the whole collective (the communicator copies and waits on its sockets throughout);
 * 0 when a profile measured the collectives but not their CPU time. */
static double comm_cpu_line(const cost_model *cm, bool rs, double bytes) {
    const profile_comm *pc = cm->opts.prof ? profile_find_comm(cm->opts.prof, cm->comm.world, rs) : NULL;
    if (!pc) return comm_line(cm, rs, bytes);
    return pc->cpu_ms ? comm_curve_at(pc->bytes, pc->cpu_ms, pc->n_points, bytes) : 0;
}

/* Whether the communicators compete with compute for the host's cores: CPU devices on one host
 * whose threads plus one communicator thread per rank exceed its cores (those the profile's
 * collectives were measured on, else the node's). Then the collectives' CPU time does not overlap
 * compute but adds to it. */
static bool comm_contends(const cost_model *cm) {
    const cluster *cl = cm->cl;
    if (!cpu_host(cl) || cl->n_devices < 2) return false;
    const profile_comm *pc = cm->opts.prof ? profile_find_comm(cm->opts.prof, cm->comm.world, false) : NULL;
    if (pc && !pc->cpu_ms) return false;
    int cores = pc ? pc->host_cores : cl->nodes[0].host_cores;
    if (cores <= 0) return false;
    int demand = 0;
    for (int r = 0; r < cl->n_devices; r++) demand += cl->devices[r].threads + 1;
    return demand > cores;
}

static void build_comm(cost_model *cm) {
    cost_comm *c = &cm->comm;
    const model_spec *md = cm->model;
    c->world = cm->cl->n_devices;
    ring_link(cm->cl, &c->bandwidth_gbs, &c->alpha_ms);
    c->uneven_factor = UNEVEN_COMM_FACTOR;
    int gelem = precision_gather_bytes(cm->opts.prec); /* gathered parameters */
    int relem = 4; /* gradients are reduced in fp32 */
    double emb = (double)model_kind_params(md, UNIT_EMBEDDING);
    double blk = (double)model_kind_params(md, UNIT_BLOCK);
    double head = (double)model_kind_params(md, UNIT_HEAD);
    int L = md->n_layer;
    c->ag_first_ms = comm_line(cm, false, emb * gelem);
    /* the forward gathers every block and the head; a tied head needs the embedding again */
    c->ag_fwd_ms = L * comm_line(cm, false, blk * gelem) + comm_line(cm, false, head * gelem) +
                   (md->tied_head ? comm_line(cm, false, emb * gelem) : 0);
    /* the backward gathers every unit again, the embedding included (to recompute and back-propagate,
     * or with recompute none to back-propagate) */
    c->ag_bwd_ms = L * comm_line(cm, false, blk * gelem) + comm_line(cm, false, emb * gelem);
    /* a tied head's embedding gradient is reduce-scattered right after the head (behind the
     * backward of the blocks), so only one full embedding gradient is ever held */
    c->rs_ms = L * comm_line(cm, true, blk * relem) + comm_line(cm, true, head * relem) +
               (md->tied_head ? comm_line(cm, true, emb * relem) : 0);
    c->rs_last_ms = comm_line(cm, true, emb * relem);
    /* the step's all-reduced sums (ENGINE_STEP_ALLREDUCED doubles): a latency-bound reduce-scatter
     * and all-gather */
    double sums = ENGINE_STEP_ALLREDUCED * sizeof(double);
    c->sums_ms = comm_line(cm, true, sums) + comm_line(cm, false, sums);
    if (comm_contends(cm)) {
        c->cpu_fwd_ms = L * comm_cpu_line(cm, false, blk * gelem) + comm_cpu_line(cm, false, head * gelem) +
                        (md->tied_head ? comm_cpu_line(cm, false, emb * gelem) : 0);
        c->cpu_bwd_ms = L * comm_cpu_line(cm, false, blk * gelem) + comm_cpu_line(cm, false, emb * gelem) +
                        L * comm_cpu_line(cm, true, blk * relem) + comm_cpu_line(cm, true, head * relem) +
                        (md->tied_head ? comm_cpu_line(cm, true, emb * relem) : 0);
    }
    const profile_comm *ag = cm->opts.prof ? profile_find_comm(cm->opts.prof, c->world, false) : NULL;
    if (ag && ag->train_overhead_ms > 0) {
        c->overhead_ms = ag->train_overhead_ms * cost_step_collectives(md);
    } else if (!ag && comm_contends(cm)) {
        c->overhead_ms = CONTENDED_WAKEUP_MS * cost_step_collectives(md);
    }
    c->measured = cm->opts.prof && profile_find_comm(cm->opts.prof, c->world, false);
    if (c->measured) c->uneven_factor = measured_uneven_factor(cm->opts.prof, c->world);
}

/* With contention (comm_contends) a pass costs max(compute + cpu, collectives) =
 * cpu + max(compute, collectives - cpu): the floors drop by the CPU time, which is exposed. */
double cost_fwd_floor(const cost_model *cm, bool uneven) {
    return fmax(cm->comm.ag_fwd_ms - cm->comm.cpu_fwd_ms, 0) * (uneven ? cm->comm.uneven_factor : 1.0);
}

double cost_bwd_floor(const cost_model *cm, bool uneven) {
    return fmax(cm->comm.ag_bwd_ms + cm->comm.rs_ms - cm->comm.cpu_bwd_ms, 0) * (uneven ? cm->comm.uneven_factor : 1.0);
}

int cost_step_collectives(const model_spec *m) {
    /* as the worker issues them (worker/model/fsdp.c): every unit gathered in the forward and again in
     * the backward (the head's gather is kept), every gradient reduce-scattered (a tied head's
     * embedding twice), and the loss all-reduce (a reduce-scatter and an all-gather) */
    int units = m->n_layer + 2, tied = m->tied_head ? 1 : 0;
    return (units + tied) + (units - 1) + (units + tied) + 2;
}

double cost_exposed_ms(const cost_model *cm, bool uneven) {
    const cost_comm *c = &cm->comm;
    return (c->ag_first_ms + c->rs_last_ms + c->sums_ms + c->cpu_fwd_ms + c->cpu_bwd_ms) *
               (uneven ? c->uneven_factor : 1.0) +
           c->overhead_ms;
}

double cost_flops_per_sample(const cost_model *cm) {
    const model_spec *m = cm->model;
    double f = model_kind_fwd_flops(m, UNIT_EMBEDDING, cm->seq) +
               m->n_layer * model_kind_fwd_flops(m, UNIT_BLOCK, cm->seq) +
               model_kind_fwd_flops(m, UNIT_HEAD, cm->seq);
    return 3 * f;
}

int cost_group_of(const cost_model *cm, int rank) {
    for (int g = 0; g < cm->n_groups; g++)
        if (rank < cm->groups[g].first_rank + cm->groups[g].count) return g;
    CHECK(!"rank out of range");
    return -1;
}

int cost_build(cost_model *cm, const model_spec *m, const cluster *cl, int seq, int batch,
               const cost_opts *opts, err_t *err) {
    memset(cm, 0, sizeof *cm);
    if (engine_env_check(err) < 0) return -1; /* the switches the memory model reads */
    if (cl->n_devices < 1) return err_set(err, "the cluster has no devices");
    if (batch < 1 || batch > COST_MAX_BATCH)
        return err_set(err, "global batch %d must be in 1..%d", batch, COST_MAX_BATCH);
    /* per-microbatch times are tabulated per device group up to the batch: keep that bounded */
    if ((double)count_groups(cl) * batch > COST_MAX_TABLE)
        return err_set(err, "global batch %d over %d distinct device groups is beyond what the planner tabulates "
                            "(batch x groups <= %.0f); list identical devices next to each other",
                       batch, count_groups(cl), COST_MAX_TABLE);
    if (batch < cl->n_devices)
        return err_set(err,
                       "global batch %d cannot be split over %d devices: every device needs at "
                       "least one sample (use a batch >= %d)",
                       batch, cl->n_devices, cl->n_devices);
    if (!(opts->mem_cap > 0 && opts->mem_cap <= 1))
        return err_set(err, "--mem-cap %g must be in (0, 1]", opts->mem_cap);
    if ((unsigned)opts->prec >= PREC_COUNT) return err_set(err, "precision %d is none of " PRECISION_CHOICES, (int)opts->prec);
    if ((unsigned)opts->recompute > RECOMPUTE_FORCE_NONE)
        return err_set(err, "recompute %d is none of " RECOMPUTE_POLICY_CHOICES, (int)opts->recompute);
    /* a plan the workers cannot run is no plan: bf16 on a V100 fails at the first matmul */
    if (cluster_check_precision(cl, opts->prec, "precision", err) < 0) return -1;
    cm->model = m;
    cm->cl = cl;
    cm->opts = *opts;
    cm->batch = batch;
    if (model_check_seq(m, seq, &cm->seq, err) < 0) return -1;
    cm->tokens = model_tokens(m, cm->seq);
    cm->params = model_params(m);
    cm->state_bpp = engine_state_bytes_per_param(opts->prec);
    int n = cl->n_devices;
    for (int u = 0; u < model_n_units(m); u++)
        cm->even_state_params += (model_unit_params(m, u) + n - 1) / n;
    if (!(opts->host_bytes >= 0 && isfinite(opts->host_bytes)))
        return err_set(err, "host memory %g bytes must be >= 0 (0: not bounded)", opts->host_bytes);
    cm->host_per_sample = (double)model_n_units(m) * cm->tokens * m->d_model * 4;
    cm->host_bmax = batch;
    if (opts->host_bytes > 0)
        cm->host_bmax = (int)fmin(batch, floor(cost_host_usable(cm) / cm->host_per_sample));
    build_comm(cm);
    build_groups(cm);
    /* a step waits for its slowest rank's fixed bookkeeping too */
    double step_overhead = 0;
    for (int g = 0; g < cm->n_groups; g++) step_overhead = fmax(step_overhead, cm->groups[g].step_overhead_ms);
    cm->comm.overhead_ms += step_overhead;
    return 0;
}

void cost_free(cost_model *cm) {
    for (int g = 0; g < cm->n_groups; g++) {
        free(cm->groups[g].fwd_ms);
        free(cm->groups[g].bwd_ms);
        free(cm->groups[g].bwd_keep_ms);
    }
    free(cm->groups);
    memset(cm, 0, sizeof *cm);
}
