/* arch.c - the architectures' table (arch.h): every property the planner and the worker ask of
 * an architecture, one row each. The names and defaults are what JSON, model files and messages
 * have always said; tests/unit/test_arch.c checks the rows agree with one another. */
#include "planner/arch.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"

static const arch_desc rows[ARCH_COUNT] = {
    [ARCH_GPT] = {.arch = ARCH_GPT, .name = "gpt", .display = "GPT-2", .task = TASK_CLM, .causal = true,
                  .norm = NORM_LAYER, .mlp = MLP_GELU_TANH, .pos = POS_LEARNED, .linear_bias = true,
                  .tied = true, .head = HEAD_LM, .hf = true, .norm_eps = 1e-5},
    [ARCH_LLAMA] = {.arch = ARCH_LLAMA, .name = "llama", .display = "Llama", .task = TASK_CLM, .causal = true,
                    .norm = NORM_RMS, .mlp = MLP_SWIGLU, .pos = POS_ROPE, .gqa = true, .tie_choice = true,
                    .head = HEAD_LM, .hf = true, .norm_eps = 1e-5},
    [ARCH_BERT] = {.arch = ARCH_BERT, .name = "bert", .display = "BERT", .task = TASK_MLM, .norm = NORM_LAYER,
                   .post_ln = true, .mlp = MLP_GELU_ERF, .pos = POS_LEARNED, .linear_bias = true, .tied = true,
                   .type_vocab = 2, .embed_norm = true, .head = HEAD_MLM, .norm_eps = 1e-12},
    [ARCH_VIT] = {.arch = ARCH_VIT, .name = "vit", .display = "ViT", .images = true, .task = TASK_CLASSIFY,
                  .norm = NORM_LAYER, .mlp = MLP_GELU_ERF, .pos = POS_LEARNED, .linear_bias = true,
                  .head = HEAD_CLASSIFIER, .norm_eps = 1e-6},
};

const arch_desc *arch_of(model_arch a) {
    CHECK((unsigned)a < ARCH_COUNT);
    return &rows[a];
}

int arch_parse(const char *name, model_arch *out) {
    for (int i = 0; i < ARCH_COUNT; i++)
        if (rows[i].name && strcmp(name, rows[i].name) == 0) return *out = (model_arch)i, 0;
    return -1;
}

void arch_names_list(char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < ARCH_COUNT && len < n; i++) {
        const char *sep = i == 0 ? "" : i == ARCH_COUNT - 1 ? " or " : ", ";
        int k = snprintf(buf + len, n - len, "%s%s", sep, rows[i].name);
        if (k < 0) break;
        len += (size_t)k;
    }
}
