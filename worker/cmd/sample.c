/* sample.c - `cephalo-worker sample` (docs/sample.md): reads a model (a checkpoint or a Hugging
 * Face directory), encodes the prompt (a tokenizer.json, or bytes for a 256-token vocabulary),
 * prefills it into the KV cache (model/kvcache.c) and decodes one token at a time, streaming the
 * text to stdout and the speed to stderr. The token choice is model/sample.c's sample_pick. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/cmd.h"
#include "common/args.h"
#include "common/ckpt_dir.h"
#include "common/clock.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/outputs.h"
#include "common/worker_cmd.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "model/import.h"
#include "model/sample.h"
#include "planner/arch.h"
#include "state/export.h"
#include "state/mtok.h"


typedef struct sample_args {
    const char *checkpoint, *init_from, *tokenizer, *prompt, *prompt_file, *device, *dump;
    long max_new, num_samples, gpu, threads, prefill_chunk;
    unsigned long long seed;
    sample_opts pick;
    bool json, no_bos, allow_unused;
} sample_args;

/* Everything one run holds: the model and its parameters, the text codec, the device. */
typedef struct gen {
    model_spec m;
    float **units; /* host */
    tok *t;        /* NULL: byte-level (vocabulary 256) */
    int V;         /* ids we sample among: the model's vocabulary, or the tokenizer's if smaller */
    int32_t eos;   /* -1: none */
    tok_id recorded; /* the tokenizer the checkpoint records (TOKID_UNKNOWN: none, or --init-from) */
    bool window_cap; /* generation is cut at the model's sliding window, before --max-new-tokens */
    device dev;
    bool dev_open;
} gen;

static const char usage[] =
    "usage: cephalo-worker sample (--checkpoint PATH | --init-from DIR) [--prompt TEXT | --prompt-file F]\n"
    "                             [--tokenizer tokenizer.json] [options]\n"
    "Generates text from a GPT-2 or Llama model with a KV cache (docs/sample.md).\n"
    "  --checkpoint PATH     a checkpoint file, a step directory, or a run's checkpoint directory\n"
    "                        (its `latest`, else its newest complete checkpoint), or a --dump file\n"
    "  --init-from DIR       a Hugging Face model directory (config.json + safetensors)\n"
    "  --allow-unused-weights  load files that hold tensors the model does not use (a warning\n"
    "                        names them; without it they are an error)\n"
    "  --tokenizer FILE      a Hugging Face tokenizer.json; without it the text is bytes, which\n"
    "                        needs a model with a 256-token vocabulary (what `cephalo data` writes)\n"
    "  --prompt TEXT         the text to continue (default: the tokenizer's BOS or EOS token; for\n"
    "                        byte-level models a newline)\n"
    "  --prompt-file F       the prompt from a file\n"
    "  --max-new-tokens N    tokens to generate (default 128; capped by the model's positions)\n"
    "  --temperature T       0 = greedy; default 1 (the model's own distribution)\n"
    "  --top-k K             sample among the K likeliest tokens only (default 0 = all)\n"
    "  --top-p P             ... and among the fewest whose probability reaches P (default 1 = all)\n"
    "  --seed S              the sampling stream (default 1337): the same seed, the same text\n"
    "  --num-samples N       independent continuations of the prompt (default 1)\n"
    "  --device cpu|cuda     (default cpu); --gpu N picks the GPU; --threads N the CPU threads\n"
    "  --no-bos              do not start the prompt with the tokenizer's BOS token\n"
    "  --prefill-chunk N     prompt tokens per prefill forward (default 512; the workspace's rows)\n"
    "  --json                one JSON object per sample on stdout instead of streamed text\n"
    "  --dump-logits FILE    testing aid: every step's logits and the tokens, as safetensors\n"
    "Stops at --max-new-tokens or at the tokenizer's end-of-text token.\n";

enum {
    O_CKPT = 256, O_INIT, O_TOK, O_PROMPT, O_PROMPT_FILE, O_MAX_NEW, O_TEMP, O_TOPK, O_TOPP,
    O_SEED, O_NUM, O_DEVICE, O_GPU, O_THREADS, O_JSON, O_DUMP, O_NO_BOS, O_CHUNK, O_UNUSED
};

static int sample_option(args *p, int ch, sample_args *a) {
    long v;
    int rc = 0;
    switch (ch) {
    case O_CKPT: a->checkpoint = p->val; break;
    case O_INIT: return args_dir(p, &a->init_from);
    case O_TOK: a->tokenizer = p->val; break;
    case O_PROMPT: a->prompt = p->val; break;
    case O_PROMPT_FILE: a->prompt_file = p->val; break;
    case O_MAX_NEW: return args_long(p, 1, 1L << 30, &a->max_new);
    case O_TEMP: return args_double(p, 0, 100, &a->pick.temperature);
    case O_TOPK: return args_int(p, 0, 1 << 30, &a->pick.top_k);
    case O_TOPP: return args_double(p, 1e-9, 1, &a->pick.top_p);
    case O_SEED:
        rc = args_long(p, 0, 0x7fffffffffffffffL, &v);
        a->seed = (unsigned long long)v;
        return rc;
    case O_NUM: return args_long(p, 1, 100000, &a->num_samples);
    case O_DEVICE: return args_choice(p, cmd_devices, &a->device);
    case O_GPU: return args_long(p, 0, 1024, &a->gpu);
    case O_THREADS: return args_long(p, 0, 4096, &a->threads);
    case O_JSON: a->json = true; break;
    case O_DUMP: a->dump = p->val; break;
    case O_NO_BOS: a->no_bos = true; break;
    case O_UNUSED: a->allow_unused = true; break;
    case O_CHUNK: return args_long(p, 1, 1L << 20, &a->prefill_chunk);
    }
    return 0;
}

static int parse_args(int argc, char **argv, sample_args *a) {
    static const struct option longopts[] = {
        {"checkpoint", 1, 0, O_CKPT}, {"init-from", 1, 0, O_INIT}, {"tokenizer", 1, 0, O_TOK},
        {"prompt", 1, 0, O_PROMPT}, {"prompt-file", 1, 0, O_PROMPT_FILE},
        {"max-new-tokens", 1, 0, O_MAX_NEW}, {"temperature", 1, 0, O_TEMP},
        {"top-k", 1, 0, O_TOPK}, {"top-p", 1, 0, O_TOPP}, {"seed", 1, 0, O_SEED},
        {"num-samples", 1, 0, O_NUM}, {"device", 1, 0, O_DEVICE}, {"gpu", 1, 0, O_GPU},
        {"threads", 1, 0, O_THREADS}, {"json", 0, 0, O_JSON}, {"dump-logits", 1, 0, O_DUMP},
        {"no-bos", 0, 0, O_NO_BOS}, {"prefill-chunk", 1, 0, O_CHUNK},
        {"allow-unused-weights", 0, 0, O_UNUSED}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    *a = (sample_args){.max_new = 128, .num_samples = 1, .seed = 1337, .device = "cpu", .prefill_chunk = 512,
                       .pick = {.temperature = 1.0, .top_k = 0, .top_p = 1.0}};
    args p = args_begin(argc, argv, WORKER_NAME " sample", longopts, "", usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) rc = sample_option(&p, ch, a);
    if (rc || ch < 0 || args_no_operands(&p)) return ARGS_BAD;
    if (!a->checkpoint == !a->init_from)
        return args_bad(&p, "give the model: --checkpoint PATH or --init-from DIR (one of them)");
    if (a->prompt && a->prompt_file) return args_bad(&p, "give --prompt or --prompt-file, not both");
    const char *sampling = "a --temperature above 0 (at 0 the likeliest token is taken)";
    const args_only only[] = {
        {O_TOPK, a->pick.temperature > 0, sampling, ARGS_GIVE_OR_LEAVE},
        {O_TOPP, a->pick.temperature > 0, sampling, ARGS_GIVE_OR_LEAVE},
        {O_SEED, a->pick.temperature > 0, sampling, ARGS_GIVE_OR_LEAVE},
        {O_GPU, !strcmp(a->device, "cuda"), "--device cuda", ARGS_LEAVE_OUT},
    };
    rc = args_check_only(&p, only, sizeof only / sizeof only[0]);
    /* known before the model is read: an --init-from directory without a tokenizer.json */
    char tj[PATH_MAX];
    struct stat st;
    if (!rc && a->no_bos && !a->tokenizer && a->init_from &&
        (snprintf(tj, sizeof tj, "%s/tokenizer.json", a->init_from) >= (int)sizeof tj || stat(tj, &st) != 0))
        return args_bad(&p, "--no-bos needs --tokenizer or DIR/tokenizer.json (bytes have no BOS token)");
    return rc;
}

/* The model and its parameters, host side. */
static int load_model(const sample_args *a, gen *g, err_t *err) {
    int units_n;
    if (a->checkpoint) {
        if (export_read_checkpoint(a->checkpoint, &g->m, a->allow_unused, &g->units, &g->recorded, err) < 0) return -1;
    } else {
        if (model_load_hf_config(a->init_from, &g->m, err) < 0) return -1;
        hf_import *imp;
        if (hf_import_open(&imp, a->init_from, &g->m, a->allow_unused, err) < 0) return -1;
        units_n = model_n_units(&g->m);
        g->units = xcalloc((size_t)units_n, sizeof *g->units);
        int rc = 0;
        for (int u = 0; rc == 0 && u < units_n; u++) {
            int64_t n = model_unit_params(&g->m, u);
            g->units[u] = xmalloc((size_t)(n ? n : 1) * sizeof(float));
            rc = hf_import_range(imp, u, 0, n, g->units[u], err);
        }
        hf_import_close(imp);
        if (rc < 0) return -1;
    }
    if (!arch_of(g->m.arch)->causal)
        return err_set(err, "%s: sample generates text with causal language models (GPT-2, Llama); "
                            "this model is a %s (%s)",
                       a->checkpoint ? a->checkpoint : a->init_from, model_arch_name(g->m.arch),
                       arch_of(g->m.arch)->task == TASK_MLM ? "bidirectional, trained to fill in masked tokens"
                                              : "an image classifier");
    return 0;
}

/* The model's tokenizer (state/mtok.h): --init-from DIR's tokenizer.json, or the checkpoint's (the
 * one it records, with the file kept beside it when that is the same); t->path "" without a file. */
static int model_tokenizer(const sample_args *a, const gen *g, mtok *t, err_t *err) {
    char path[PATH_MAX] = "";
    if (a->checkpoint && ckpt_dir_resolve(a->checkpoint, path, sizeof path, err) < 0) return -1;
    return mtok_for_model(a->init_from, path, g->recorded, t, err);
}

/* The text codec: --tokenizer, else the model's own tokenizer.json, else bytes when the model
 * was trained on bytes (recorded) or, recording nothing, its vocabulary is 256. A tokenizer other
 * than the model's (the file kept with it, or the identity its checkpoint records) is refused. */
static int load_codec(const sample_args *a, gen *g, err_t *err) {
    g->V = g->m.vocab;
    g->eos = -1;
    mtok kept;
    if (model_tokenizer(a, g, &kept, err) < 0) return -1;
    char own[TOK_ID_NAME_MAX];
    tok_id_name(kept.id, own);
    bool bytes = kept.id.kind == TOKID_BYTES; /* trained on bytes: no file, one token a byte */
    const char *file = a->tokenizer ? a->tokenizer : kept.path[0] ? kept.path : NULL;
    if (!file) {
        if (a->no_bos)
            return err_set(err, "--no-bos needs --tokenizer or a tokenizer.json beside the model (bytes have no BOS token)");
        if (kept.id.kind && !bytes)
            return err_set(err, "the checkpoint was trained with tokenizer %s (its metadata cephalo.tokenizer), but no "
                                "tokenizer.json is kept beside it: give that tokenizer with --tokenizer FILE", own);
        if (!bytes && g->m.vocab != 256)
            return err_set(err, "the model's vocabulary has %d tokens, so its text needs its tokenizer: "
                                "give --tokenizer tokenizer.json (without it the text is bytes, which "
                                "fits a 256-token vocabulary only)", g->m.vocab);
        if (g->V > 256) g->V = 256; /* a larger vocabulary's other ids have no text */
        return 0;
    }
    if (tok_load(&g->t, file, err) < 0) return -1;
    if (a->tokenizer && kept.id.kind && !tok_id_equal(tok_identity(g->t), kept.id)) {
        char given[TOK_ID_NAME_MAX];
        tok_id_name(tok_identity(g->t), given);
        return err_set(err, "--tokenizer %s is tokenizer %s, but the model's own is %s (%s): not this model's tokenizer "
                            "(leave --tokenizer out to use the model's)",
                       a->tokenizer, given, own, kept.path[0] ? kept.path : "its checkpoint's metadata cephalo.tokenizer");
    }
    int32_t tv = tok_vocab_size(g->t);
    if (tv > g->m.vocab)
        return err_set(err, "%s: the tokenizer has %d tokens but the model's vocabulary only %d: "
                            "not this model's tokenizer", file, (int)tv, g->m.vocab);
    g->V = tv; /* a padded vocabulary's extra rows are never sampled: they have no text */
    g->eos = tok_eos(g->t);
    return 0;
}

static int read_prompt(const sample_args *a, char **text, size_t *len, err_t *err) {
    if (a->prompt_file) {
        *text = file_read_all(a->prompt_file, (size_t)64 << 20, len, err);
        return *text ? 0 : -1;
    }
    const char *p = a->prompt ? a->prompt : "";
    *text = xstrdup(p);
    *len = strlen(p);
    return 0;
}

/* The prompt's tokens; an empty prompt starts from the tokenizer's BOS (else EOS) token, or for
 * bytes from a newline. *skip = leading tokens that are not the prompt's text (BOS). */
static int encode_prompt(const sample_args *a, gen *g, const char *text, size_t len, tok_ids *ids,
                         size_t *skip, err_t *err) {
    *skip = 0;
    if (!g->t) {
        if (len == 0) text = "\n", len = 1;
        for (size_t i = 0; i < len; i++) tok_ids_push(ids, (unsigned char)text[i]);
        return 0;
    }
    int32_t bos = tok_bos(g->t);
    if (bos >= 0 && !a->no_bos) tok_ids_push(ids, bos), *skip = 1;
    tok_encode(g->t, text, len, false, ids);
    if (ids->n == 0) {
        if (g->eos < 0)
            return err_set(err, "the prompt is empty and the tokenizer has no BOS or EOS token to "
                                "start from: give --prompt");
        tok_ids_push(ids, g->eos), *skip = 1;
    }
    return 0;
}

static int decode_ids(const gen *g, const int32_t *ids, size_t n, tok_text *out, err_t *err) {
    if (g->t) return tok_decode(g->t, ids, n, out, err);
    for (size_t i = 0; i < n; i++) {
        if (out->n == out->cap) {
            out->cap = out->cap ? 2 * out->cap : 256;
            out->p = xrealloc(out->p, out->cap);
        }
        out->p[out->n++] = (char)ids[i];
    }
    return 0;
}

/* One sample's outcome. */
typedef struct run {
    tok_ids ids;    /* prompt + generated */
    size_t prompt;  /* prompt tokens (BOS included) */
    float *logits;  /* [steps, V_model] when dumping */
    int steps;
    bool eos;
    double prefill_ms, decode_s;
} run;

/* The text of ids as a JSON string: its exact bytes, NULs included (a prompt file may hold them),
 * with bytes that are not UTF-8 replaced by U+FFFD (json_text); the token ids carry the bytes. */
static cJSON *json_of_ids(const gen *g, const int32_t *ids, size_t n, err_t *err) {
    tok_text t = {0};
    int rc = decode_ids(g, ids, n, &t, err);
    cJSON *item = json_text(rc == 0 && t.p ? t.p : "", rc == 0 ? t.n : 0);
    tok_text_free(&t);
    return item;
}

/* Prints the decoded text beyond what was printed already (BPE pieces may end inside a UTF-8
 * character; decoding the whole sequence keeps the bytes exact). */
static int stream(const gen *g, const run *r, size_t skip, size_t *printed, err_t *err) {
    tok_text t = {0};
    if (decode_ids(g, r->ids.v + skip, r->ids.n - skip, &t, err) < 0) return -1;
    if (t.n > *printed) fwrite(t.p + *printed, 1, t.n - *printed, stdout);
    fflush(stdout);
    *printed = t.n > *printed ? t.n : *printed;
    tok_text_free(&t);
    return 0;
}

/* Generates one continuation: prefill, then a token at a time until max_total tokens or EOS. */
static int generate(const sample_args *a, gen *g, sampler *smp, const tok_ids *prompt,
                    size_t skip, int max_total, uint64_t rng, run *r, err_t *err) {
    int Vm = g->m.vocab;
    float *logits = xmalloc((size_t)Vm * sizeof(float));
    sample_scratch sc = {0};
    int cap_steps = max_total - (int)prompt->n;
    if (a->dump) r->logits = xmalloc((size_t)cap_steps * Vm * sizeof(float));
    for (size_t i = 0; i < prompt->n; i++) tok_ids_push(&r->ids, prompt->v[i]);
    r->prompt = prompt->n;
    size_t printed = 0;
    int rc = 0;
    if (!a->json) rc = stream(g, r, skip, &printed, err);
    double t0 = clock_now_s();
    /* prefill in chunks of at most --prefill-chunk tokens: each chunk attends over the cache the
     * earlier ones filled, so the workspace stays small for long prompts */
    int chunk = (int)a->prefill_chunk;
    for (int p0 = 0; p0 < (int)prompt->n; p0 += chunk) {
        int rows = (int)prompt->n - p0 < chunk ? (int)prompt->n - p0 : chunk;
        sampler_forward(smp, prompt->v + p0, rows, p0, logits);
    }
    double t1 = clock_now_s();
    r->prefill_ms = (t1 - t0) * 1e3;
    while (rc == 0) {
        if (r->logits) memcpy(r->logits + (size_t)r->steps * Vm, logits, (size_t)Vm * sizeof(float));
        int32_t next = sample_pick(logits, g->V, &a->pick, &rng, &sc);
        r->steps++;
        tok_ids_push(&r->ids, next);
        if (next == g->eos) {
            r->eos = true;
            break;
        }
        if (!a->json) rc = stream(g, r, skip, &printed, err);
        if ((int)r->ids.n >= max_total || rc) break;
        sampler_forward(smp, &next, 1, (int)r->ids.n - 1, logits);
    }
    r->decode_s = clock_now_s() - t1;
    free(logits);
    sample_scratch_free(&sc);
    return rc;
}

static void print_json(const gen *g, const run *r, size_t skip, int k, err_t *err) {
    size_t gen_n = r->ids.n - r->prompt - (r->eos ? 1 : 0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "sample", k + 1); /* counted from 1, as on stderr and in the text */
    cJSON_AddItemToObject(o, "prompt", json_of_ids(g, r->ids.v + skip, r->prompt - skip, err));
    cJSON_AddItemToObject(o, "text", json_of_ids(g, r->ids.v + r->prompt, gen_n, err));
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)r->prompt);
    cJSON_AddNumberToObject(o, "new_tokens", r->steps);
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = r->prompt; i < r->ids.n; i++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(r->ids.v[i]));
    cJSON_AddStringToObject(o, "stop", r->eos ? "eos" : g->window_cap ? "window" : "length");
    cJSON_AddNumberToObject(o, "prefill_ms", r->prefill_ms);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->steps > 1 && r->decode_s > 0 ? (r->steps - 1) / r->decode_s : 0);
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    fflush(stdout);
    free(s);
    cJSON_Delete(o);
}

/* --dump-logits: sample{k}.tokens I32 [prompt + new], sample{k}.logits F32 [new, vocab] (row s
 * chose token prompt + s), and the settings as metadata cephalo.sample. */
static int dump_logits(const sample_args *a, const gen *g, const run *runs, int n, err_t *err) {
    st_writer *w = st_writer_new();
    char name[64];
    for (int k = 0; k < n; k++) {
        snprintf(name, sizeof name, "sample%d.tokens", k);
        st_writer_add(w, name, ST_I32, 1, (int64_t[]){(int64_t)runs[k].ids.n}, runs[k].ids.v);
        snprintf(name, sizeof name, "sample%d.logits", k);
        st_writer_add(w, name, ST_F32, 2, (int64_t[]){runs[k].steps, g->m.vocab}, runs[k].logits);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "samples", n);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)runs[0].prompt);
    cJSON_AddNumberToObject(o, "vocab_sampled", g->V);
    cJSON_AddNumberToObject(o, "temperature", a->pick.temperature);
    cJSON_AddNumberToObject(o, "top_k", a->pick.top_k);
    cJSON_AddNumberToObject(o, "top_p", a->pick.top_p);
    cJSON_AddNumberToObject(o, "seed", (double)a->seed);
    cJSON_AddNumberToObject(o, "eos", g->eos);
    cJSON_AddStringToObject(o, "arch", model_arch_name(g->m.arch));
    char *meta = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    st_writer_meta(w, "cephalo.sample", meta);
    free(meta);
    int rc = st_writer_save(w, a->dump, 0, err);
    st_writer_free(w);
    return rc;
}

static void gen_release(gen *g) {
    for (int u = 0; g->units && u < model_n_units(&g->m); u++) free(g->units[u]);
    free(g->units);
    if (g->t) tok_free(g->t);
    if (g->dev_open) device_close(&g->dev);
}

static int sample_main(const sample_args *a, gen *g, err_t *err) {
    int rc = load_model(a, g, err);
    if (rc == 0) rc = load_codec(a, g, err);
    if (rc < 0) return EXIT_BAD_INPUT;
    char *text;
    size_t len, skip;
    if (read_prompt(a, &text, &len, err) < 0) return EXIT_BAD_INPUT;
    tok_ids prompt = {0};
    rc = encode_prompt(a, g, text, len, &prompt, &skip, err);
    free(text);
    for (size_t i = 0; rc == 0 && i < prompt.n; i++)
        if (prompt.v[i] >= g->m.vocab)
            rc = err_set(err, "the prompt's token %d is outside the model's vocabulary (%d)",
                         (int)prompt.v[i], g->m.vocab);
    /* a Mistral model's sliding window bounds the sequence as max_seq does: beyond it every token
     * would attend to more than the window (full attention), which is another model than the one
     * trained; train and eval refuse such a --seq, so generation stops at the window */
    int ctx = model_context(&g->m);
    bool window = ctx < g->m.max_seq;
    char why[160];
    if (window)
        snprintf(why, sizeof why, "its sliding_window of %d positions (attention over a sliding window is not "
                                  "implemented, so generation stays inside the window)", ctx);
    else
        snprintf(why, sizeof why, "%d positions", ctx);
    if (rc == 0 && (int64_t)prompt.n >= ctx)
        rc = err_set(err, "the prompt has %zu tokens; the model sees %s, so at most %d prompt tokens leave room "
                          "for one more", prompt.n, why, ctx - 1);
    if (rc < 0) {
        tok_ids_free(&prompt);
        return EXIT_BAD_INPUT;
    }
    int max_total = (int)prompt.n + (int)a->max_new;
    if ((int64_t)prompt.n + a->max_new > ctx) {
        max_total = ctx;
        g->window_cap = window;
        fprintf(stderr, "cephalo-worker sample: --max-new-tokens %ld capped to %d: the model sees %s, and the "
                        "prompt takes %zu\n",
                a->max_new, ctx - (int)prompt.n, why, prompt.n);
    }
    if (device_open(&g->dev, a->device, 0, (int)a->threads, (int)a->gpu, 0, err) < 0) {
        tok_ids_free(&prompt);
        return EXIT_FAILED;
    }
    g->dev_open = true;
    sampler *smp;
    int rows = (int)prompt.n < a->prefill_chunk ? (int)prompt.n : (int)a->prefill_chunk;
    if (sampler_new(&smp, &g->dev, &g->m, g->units, max_total, rows, err) < 0) {
        tok_ids_free(&prompt);
        return EXIT_FAILED;
    }
    int n = (int)a->num_samples;
    run *runs = xcalloc((size_t)n, sizeof *runs);
    rc = 0;
    for (int k = 0; rc == 0 && k < n; k++) {
        /* sample k's own stream: independent of how many samples run before it */
        uint64_t rng = (uint64_t)a->seed * 0x9E3779B97F4A7C15ULL + (uint64_t)k;
        sample_uniform(&rng);
        if (!a->json && n > 1) printf("%s--- sample %d ---\n", k ? "\n" : "", k + 1);
        rc = generate(a, g, smp, &prompt, skip, max_total, rng, &runs[k], err);
        if (rc < 0) break;
        run *r = &runs[k];
        if (a->json) print_json(g, r, skip, k, err);
        else putchar('\n');
        fflush(stdout);
        fprintf(stderr, "sample %d: %d new tokens%s | prefill %zu tokens in %.1f ms | decode %.1f tok/s | %s",
                k + 1, r->steps,
                r->eos ? " (stopped at end-of-text)" : g->window_cap ? " (stopped at the model's sliding window)" : "",
                r->prompt, r->prefill_ms,
                r->steps > 1 && r->decode_s > 0 ? (r->steps - 1) / r->decode_s : 0.0, g->dev.ops->name);
        if (!strcmp(g->dev.ops->name, "cpu")) fprintf(stderr, ", %d thread%s", g->dev.threads, g->dev.threads == 1 ? "" : "s");
        fputc('\n', stderr);
    }
    if (rc == 0 && a->dump) rc = dump_logits(a, g, runs, n, err);
    for (int k = 0; k < n; k++) tok_ids_free(&runs[k].ids), free(runs[k].logits);
    free(runs);
    sampler_free(smp);
    tok_ids_free(&prompt);
    return rc < 0 ? EXIT_FAILED : EXIT_OK;
}

/* --dump-logits never lands on an input (common/outputs.h). */
static int check_outputs(const sample_args *a, err_t *err) {
    out_set s = out_begin(WORKER_NAME " sample");
    out_input_path(&s, "--checkpoint", a->checkpoint, &ckpt_dir_kind);
    out_input_path(&s, "--init-from", a->init_from, &out_hf_input);
    out_input(&s, "--tokenizer", a->tokenizer);
    out_input(&s, "--prompt-file", a->prompt_file);
    out_file(&s, "--dump-logits", a->dump);
    int rc = out_check(&s, err);
    out_free(&s);
    return rc;
}

int cmd_sample(int argc, char **argv) {
    sample_args a;
    err_t err = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    if (check_outputs(&a, &err) < 0) return fprintf(stderr, WORKER_NAME " sample: %s\n", err.msg), EXIT_BAD_INPUT;
    gen g = {0};
    rc = sample_main(&a, &g, &err);
    if (rc != EXIT_OK) fprintf(stderr, "cephalo-worker sample: %s\n", err.msg);
    gen_release(&g);
    return rc;
}
