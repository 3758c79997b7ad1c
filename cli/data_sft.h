/* data_sft.h - `cephalo data --sft`: one JSONL line (a fine-tuning example) to token ids and a
 * loss mask (docs/data.md "Fine-tuning data").
 *
 * A line is {"prompt": "...", "response": "..."} or, with a chat template,
 * {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}. The mask is 1 on
 * the tokens whose loss counts (the response, or each assistant message's content and its
 * template suffix, and the EOS that ends the example), 0 on the rest; it is a property of each
 * token as a target (formats/data.h "loss masks"). */
#ifndef CEPHALO_DATA_SFT_H
#define CEPHALO_DATA_SFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "formats/tokenizer.h"

enum { SFT_SYSTEM, SFT_USER, SFT_ASSISTANT, SFT_ROLES };

/* A chat template file (JSON): {"bos": false, "eos": true, "roles": {"system": {"prefix": "...",
 * "suffix": "..."}, "user": {...}, "assistant": {...}}}. The prefixes and suffixes are encoded
 * with the tokenizer's added tokens recognised (so "<|im_start|>" is that token); message
 * contents are not (text cannot forge a template marker) unless --special is given. */
typedef struct sft_template {
    bool bos, eos;
    char *prefix[SFT_ROLES], *suffix[SFT_ROLES];
} sft_template;

int sft_template_load(const char *path, sft_template *t, err_t *err);
void sft_template_free(sft_template *t);

typedef struct sft_codec {
    tok *t;
    const sft_template *tmpl; /* NULL: prompt/response lines only */
    int32_t bos, eos;         /* bos: the tokenizer's (-1: none), for --bos and the template's "bos" */
    bool pair_bos;            /* --bos: BOS before each prompt/response example */
    bool special;             /* added tokens' strings in the contents become those tokens */
} sft_codec;

/* A growable byte array (the mask beside tok_ids). */
typedef struct sft_mask {
    uint8_t *v;
    size_t n, cap;
} sft_mask;
void sft_mask_free(sft_mask *m);

/* Line `line` (len bytes, no newline) of file `file` (number lineno) appended as ids and mask
 * (cleared first). Errors read "FILE:LINE: ..." and name the field expected. */
int sft_encode_line(const sft_codec *c, const char *file, long lineno, const char *line, size_t len, tok_ids *ids,
                    sft_mask *mask, err_t *err);

#endif
