/* sample.h - text from a trained or imported causal language model (GPT-2, Llama), with a KV
 * cache, on any device: the core of `cephalo-worker sample` (worker/cmd/sample.c, docs/sample.md).
 *
 *   sampler *s;
 *   sampler_new(&s, dev, &model, host_units, ctx, rows, &err);   // parameters to the device
 *   sampler_forward(s, prompt, P, 0, logits);      // prefill: P tokens, K/V cached, last logits
 *   sampler_forward(s, &tok, 1, P, logits);        // decode: one token against the cache
 *   int32_t next = sample_pick(logits, V, &opts, &rng, &scratch);
 *
 * The forward is the training forward (worker/model/wmodel.c) restricted to new rows: the same
 * device ops and parameter layout (wm_unit_tensors), attention replaced by attention_cached
 * over the per-layer caches and RoPE by rope_at, and the head run on the last row only. */
#ifndef CEPHALO_SAMPLE_H
#define CEPHALO_SAMPLE_H

#include <stdint.h>

#include "devices/device.h"
#include "planner/model.h"

typedef struct sampler sampler;

/* Copies the model's units (host, wmodel's layout) to the device and allocates K/V caches for
 * ctx positions and a workspace for forwards of up to `rows` new tokens. GPT and Llama only. */
int sampler_new(sampler **out, device *d, const model_spec *m, float *const *host_units, int ctx,
                int rows, err_t *err);
void sampler_free(sampler *s);
/* Runs tokens ids[0..n) at positions pos0 .. pos0+n-1: their keys and values are written to the
 * caches at rows pos0.., earlier rows are read, never recomputed. Writes the logits of the last
 * of them to the host's logits[vocab]. Needs 1 <= n <= rows and pos0 + n <= ctx. */
void sampler_forward(sampler *s, const int32_t *ids, int n, int pos0, float *logits);

/* How a token is chosen from logits: temperature 0 is greedy (the first largest logit);
 * otherwise softmax(logits / temperature) restricted to the top_k largest (0 = all) and then to
 * the smallest prefix, by falling probability, whose mass reaches top_p (1 = all). */
typedef struct sample_opts {
    double temperature;
    int top_k;
    double top_p;
} sample_opts;

/* Scratch of sample_pick (sorted candidates), reused across calls. */
typedef struct sample_scratch {
    void *cand;
    int cap;
} sample_scratch;

/* A uniform double in [0, 1) from a splitmix64 stream. */
double sample_uniform(uint64_t *rng);
/* The chosen token among ids [0, V). Ties between equal logits go to the lower id. */
int32_t sample_pick(const float *logits, int V, const sample_opts *o, uint64_t *rng,
                    sample_scratch *sc);
void sample_scratch_free(sample_scratch *sc);

#endif
