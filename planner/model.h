/* model.h - the model zoo: exact shapes, FSDP units and their parameter counts, FLOPs and
 * activation bytes. Formulas and sources: docs/cost-model.md.
 *
 * A model is a list of FSDP units: unit 0 is the embedding, units 1..n_layer the transformer
 * blocks, the last unit the final norm + head. The worker builds exactly these units, so the
 * planner and the worker agree on every unit's parameter count. */
#ifndef CEPHALO_MODEL_H
#define CEPHALO_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

/* What each architecture is, and its name: planner/arch.h's table (a row per value). */
typedef enum { ARCH_GPT, ARCH_LLAMA, ARCH_BERT, ARCH_VIT, ARCH_COUNT } model_arch;
typedef enum { UNIT_EMBEDDING, UNIT_BLOCK, UNIT_HEAD } unit_kind;
/* RoPE frequency scaling of a Hugging Face config's rope_scaling (docs/import.md). */
typedef enum { ROPE_PLAIN, ROPE_LINEAR, ROPE_LLAMA3 } rope_scaling_kind;

typedef struct model_spec {
    char name[64];
    model_arch arch;
    int n_layer;
    int d_model;
    int n_head;
    int n_kv_head; /* Llama grouped-query attention; = n_head elsewhere */
    int d_ff; /* MLP hidden size */
    int vocab; /* token vocabulary (GPT, Llama, BERT) */
    int max_seq; /* learned position table size (GPT, BERT); RoPE context for Llama */
    int default_seq; /* sequence length used when --seq is not given */
    int type_vocab; /* BERT token types */
    bool tied_head; /* head reuses the token embedding (GPT-2, BERT) */
    /* ViT */
    int image, patch, channels, n_classes;
    /* Imported models carry these from their config.json; 0 means the architecture's default
     * (model_rope_theta, model_norm_eps), so built-ins and older plans keep their meaning. */
    double rope_theta; /* Llama RoPE base (default 10000; Llama-3 uses 500000) */
    double norm_eps; /* LayerNorm/RMSNorm epsilon (default: GPT/Llama 1e-5, BERT 1e-12, ViT 1e-6) */
    /* Llama family only (imported Llama-3.1, Mistral, Qwen2 configs; all 0 elsewhere): */
    rope_scaling_kind rope_scaling; /* linear: every frequency / factor; llama3: by wavelength */
    double rope_factor, rope_low_freq, rope_high_freq; /* factor; llama3's low/high_freq_factor */
    int rope_orig_max; /* llama3's original_max_position_embeddings */
    bool qkv_bias; /* biases on the q, k and v projections (Qwen2), none on o */
    int sliding_window; /* Mistral's attention window, 0 none: a longer sequence is refused */
} model_spec;

const char *model_arch_name(model_arch a); /* arch_of(a)->name */
const char *unit_kind_name(unit_kind k);

/* Built-in models (name list for --help and suggestions). */
const model_spec *model_builtins(int *count);

/* MODEL is a built-in name, the path of a model file (YAML), or a Hugging Face config.json (or
 * the model directory holding it). Errors suggest close names. model_resolve.c: above the
 * loaders, which use this file's names, built-ins and checks. */
int model_resolve(const char *name_or_path, model_spec *out, err_t *err);
/* A Hugging Face config.json (GPT2LMHeadModel, LlamaForCausalLM): model_hf.c, docs/import.md.
 * The name is the directory's. */
int model_load_hf_config(const char *path, model_spec *out, err_t *err);
/* The same from config.json's text (e.g. a Kubernetes object's): src names it in errors, name is
 * the model's name (NULL or "": "hf-model"). */
int model_load_hf_string(const char *src, const char *text, size_t len, const char *name, model_spec *out,
                         err_t *err);
/* The Hugging Face families config.json is read as and export writes: the class config.json's
 * "architectures" names, its model_type, the name for people, and our architecture. */
typedef struct hf_family_desc {
    const char *hf_class, *model_type, *display;
    model_arch arch;
} hf_family_desc;
/* The family a spec is exported as and was imported from: GPT-2 for gpt; for llama, Qwen2 with
 * q/k/v biases, Mistral with a sliding window, else Llama. NULL where Hugging Face has none. */
const hf_family_desc *hf_family_of(const model_spec *m);
/* The value used for the fields whose 0 means "the architecture's default". */
double model_rope_theta(const model_spec *m);
double model_norm_eps(const model_spec *m);
const char *model_rope_scaling_name(rope_scaling_kind k); /* "none", "linear", "llama3" */
/* The hd/2 RoPE inverse frequencies of the model, in fp32 as transformers computes them
 * (rope_theta, then rope_scaling): the one table every device and the sampler rotate by. */
void model_rope_inv_freq(const model_spec *m, int hd, float *inv_freq);
int model_load_file(const char *path, model_spec *out, err_t *err);
/* The error for a name that is no built-in model, with the nearest names; returns -1. */
int model_unknown(const char *name, err_t *err);
int model_load_string(const char *name, const char *text, size_t len, model_spec *out, err_t *err);
/* Checks shape consistency (heads divide width, GQA groups, ...); errors name the field. */
int model_validate(const model_spec *m, err_t *err);

static inline int model_n_units(const model_spec *m) { return m->n_layer + 2; }
unit_kind model_unit_kind(const model_spec *m, int unit);
/* "embedding", "block.0", ..., "head" */
void model_unit_name(const model_spec *m, int unit, char *buf, size_t bufsz);

int64_t model_kind_params(const model_spec *m, unit_kind k);
int64_t model_unit_params(const model_spec *m, int unit);
int64_t model_params(const model_spec *m);

/* Tokens one sample carries: the sequence length, or patches + class token for ViT. */
int model_tokens(const model_spec *m, int seq);
/* Resolves the sequence length to use (0 = default) and checks it against the model: within
 * max_seq for every token model (Llama too), none for ViT. The one check wherever a seq meets a
 * model: the worker's options and plan, job files, plans, profiles, the operator's planning. */
int model_check_seq(const model_spec *m, int seq, int *out, err_t *err);
/* The positions a token model runs over as it was trained to: max_seq, or Mistral's
 * sliding_window when that is smaller (attention over a sliding window is not implemented; inside
 * the window it changes nothing). What model_check_seq allows, for a generation that grows. */
int model_context(const model_spec *m);

/* Forward FLOPs of one unit for one sample (matmuls and attention; backward = 2x). */
double model_kind_fwd_flops(const model_spec *m, unit_kind k, int seq);
/* Bytes of activations one sample needs while one unit is (re)computed and back-propagated,
 * with checkpoints at unit boundaries; `elem` = bytes per activation element (4 fp32, 2 bf16). */
double model_kind_act_bytes(const model_spec *m, unit_kind k, int seq, int elem);
/* Bytes of elementwise memory traffic of one unit's forward for one sample. */
double model_kind_traffic_bytes(const model_spec *m, unit_kind k, int seq, int elem);
/* The checkpoint kept (and offloaded) at a unit boundary for one sample. */
double model_boundary_bytes(const model_spec *m, int seq, int elem);

#endif
