/* engine_mem.c - the trainer's device memory, shared by the planner's prediction and the
 * engine's allocations (see engine_mem.h). */
#include "planner/engine_mem.h"

int engine_qkv_width(const model_spec *m) {
    int hd = m->d_model / m->n_head;
    return (m->n_head + 2 * m->n_kv_head) * hd;
}

int engine_wide(const model_spec *m) { return m->d_ff > m->d_model ? m->d_ff : m->d_model; }

static int64_t head_logits_bytes = ENGINE_HEAD_LOGITS_BYTES;

void engine_set_head_logits_bytes(int64_t bytes) {
    head_logits_bytes = bytes > 0 ? bytes : ENGINE_HEAD_LOGITS_BYTES;
}

int64_t engine_head_chunk_rows(const model_spec *m, int micro, int T) {
    int64_t rows = (int64_t)micro * T;
    int64_t fit = head_logits_bytes / ((int64_t)m->vocab * 4);
    if (fit >= 64) fit -= fit % 64; /* whole tiles for the GEMMs */
    if (fit < 1) fit = 1;
    return rows < fit ? rows : fit;
}

static int vit_patches(const model_spec *m) { return (m->image / m->patch) * (m->image / m->patch); }
static int patch_dim(const model_spec *m) { return m->channels * m->patch * m->patch; }

engine_workspace engine_workspace_floats(const model_spec *m, int max_m, int seq) {
    int T = model_tokens(m, seq);
    int64_t N = (int64_t)max_m * T;
    bool vit = m->arch == ARCH_VIT;
    engine_workspace w = {0};
    w.nd = N * m->d_model;
    w.nq = N * engine_qkv_width(m);
    w.nf = N * engine_wide(m);
    w.nstat = N;
    w.nlse = (int64_t)max_m * m->n_head * T;
    /* the fused head computes the logits of the whole microbatch, or of a chunk of its rows
     * when those would exceed ENGINE_HEAD_LOGITS_BYTES */
    int64_t chunk = vit ? 0 : engine_head_chunk_rows(m, max_m, T);
    w.nlogits = vit ? (int64_t)max_m * m->n_classes : chunk * m->vocab;
    w.nloss = vit ? max_m : chunk;
    w.npatch = vit ? (int64_t)max_m * vit_patches(m) * patch_dim(m) : 0;
    w.nrows = vit ? (int64_t)max_m * m->d_model : 0;
    return w;
}

int64_t engine_workspace_bytes(const model_spec *m, int max_m, int seq) {
    engine_workspace w = engine_workspace_floats(m, max_m, seq);
    bool llama = m->arch == ARCH_LLAMA;
    /* nd: norm outputs x2, attention output, residual, and the gradients of the attention
     * output, residual and norm; nq: q|k|v and its gradient; nf: MLP hidden, activation and
     * their gradients (Llama: and the up projection with its gradient); nstat: two norms'
     * mean and rstd */
    int64_t f = 7 * w.nd + 2 * w.nq + (llama ? 6 : 4) * w.nf + 4 * w.nstat + w.nlse + w.nlogits +
                w.nloss + w.npatch + w.nrows;
    return f * 4;
}

int64_t engine_head_bytes(const model_spec *m, int seq, int micro) {
    engine_workspace w = engine_workspace_floats(m, micro, seq);
    return (w.nlogits + w.nloss) * 4;
}

int64_t engine_max_unit_params(const model_spec *m) {
    int64_t max = 0;
    for (int u = 0; u < model_n_units(m); u++)
        if (model_unit_params(m, u) > max) max = model_unit_params(m, u);
    return max;
}

int64_t engine_compute_bytes(const model_spec *m, int seq, int micro, engine_opts o) {
    int64_t rows = (int64_t)micro * model_tokens(m, seq);
    int64_t bytes = engine_workspace_bytes(m, micro, seq);
    /* unit input, output, output and input gradients */
    bytes += (o.double_buffer ? 8 : 4) * rows * m->d_model * 4;
    bytes += 2 * rows * 4; /* token ids and targets (int32) */
    bytes += ENGINE_STEP_SUMS * (int64_t)sizeof(double);
    if (m->arch == ARCH_VIT) bytes += (int64_t)micro * m->channels * m->image * m->image * 4;
    int64_t slot = engine_max_unit_params(m);
    bool half = precision_half(o.prec);
    if (o.sharded || half) bytes += 2 * slot * 4; /* gathered parameters */
    if (o.sharded) bytes += 2 * slot * 4;         /* full gradients */
    if (half) bytes += 2 * slot * 2;              /* bf16/fp16 gather buffers */
    return bytes;
}
