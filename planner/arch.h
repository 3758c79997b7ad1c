/* arch.h - one row per model architecture: what the rest of the code asks of an architecture
 * (its inputs, task, norms, MLP, positions, head) instead of naming it, so that a new
 * architecture is a new row and the functions only it has (docs/development.md, "Adding a model
 * architecture"). The planner is the lowest room that knows architectures, so the table is here;
 * the worker's per-architecture code is its own table of functions (worker/model/wmodel.c). */
#ifndef CEPHALO_ARCH_H
#define CEPHALO_ARCH_H

#include <stdbool.h>
#include <stddef.h>

#include "planner/model.h"

/* What the model is trained to do, which decides its data (worker/formats/data.h's data_task). */
typedef enum { TASK_CLM, TASK_MLM, TASK_CLASSIFY } arch_task;
typedef enum { NORM_LAYER, NORM_RMS } arch_norm;
typedef enum { MLP_GELU_TANH, MLP_GELU_ERF, MLP_SWIGLU } arch_mlp;
typedef enum { POS_LEARNED, POS_ROPE } arch_pos;
/* LM: norm + logits over the vocabulary; MLM: dense + gelu + LayerNorm, then the logits (with a
 * bias); classifier: norm + a linear layer over the class token. */
typedef enum { HEAD_LM, HEAD_MLM, HEAD_CLASSIFIER } arch_head;

typedef struct arch_desc {
    model_arch arch;
    const char *name; /* "gpt": JSON, model files and messages spell it so */
    const char *display; /* "GPT-2": for people, in messages */
    bool images; /* inputs are images cut into patches, not token ids: no --seq, no vocabulary */
    arch_task task;
    bool causal; /* attention sees only earlier tokens; such a model can generate (sample) */
    arch_norm norm;
    bool post_ln; /* the norms follow the residual adds (BERT), not precede the sublayers */
    arch_mlp mlp;
    arch_pos pos;
    bool gqa; /* k and v may have fewer heads than q (n_kv_head); else n_kv_head plays no part */
    bool linear_bias; /* every linear layer has a bias (Llama's have none but Qwen2's q, k, v) */
    bool tied; /* tied_head's default: the head multiplies by the token embedding */
    bool tie_choice; /* a model file or config.json may say otherwise (Llama-3.2 ties, Llama-2 not) */
    int type_vocab; /* token types a model file starts with (BERT's 2) */
    bool embed_norm; /* the embedding ends with its own LayerNorm (BERT) */
    arch_head head;
    bool hf; /* Hugging Face config.json, import and export (docs/import.md) */
    double norm_eps; /* the norms' epsilon when a spec gives none */
} arch_desc;

/* The row of an architecture; every model_arch has one (tests/unit/test_arch.c). */
const arch_desc *arch_of(model_arch a);
/* The architecture spelled NAME ("gpt", ...): 0, or -1 when none is. */
int arch_parse(const char *name, model_arch *out);
/* "gpt, llama, bert or vit" into buf: the names, for messages that list them. */
void arch_names_list(char *buf, size_t n);

#endif
