/* data_cmd.c - `cephalo data`: text to llm.c token shards, byte-level or with a Hugging Face
 * tokenizer.json (docs/data.md, docs/tokenizer.md), and synthetic CIMG image files. */
#include "cli/data_cmd.h"
#include "cli/data_sft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/args.h"
#include "common/fileio.h"
#include "common/json_util.h"
#include "common/outputs.h"
#include "common/log.h"
#include "common/strutil.h"
#include "formats/data.h"
#include "formats/tokenizer.h"


/* ---- cephalo data (docs/data.md) ---- */

static const char data_usage[] =
    "usage: cephalo data -o OUTDIR [--shard-tokens N] [--val-fraction F] FILE...\n"
    "       cephalo data -o OUTDIR --tokenizer tokenizer.json [--eos TOKEN] [--bos] [--doc-sep SEP]\n"
    "                    [--special] [--shard-tokens N] [--val-fraction F] FILE...\n"
    "       cephalo data -o OUTDIR --tokenizer tokenizer.json --sft [--chat-template FILE]\n"
    "                    [--max-example-tokens N [--overlong drop|truncate]] [--bos] [--eos TOKEN] FILE.jsonl...\n"
    "       cephalo data --images -o FILE.cimg --synthetic N --classes K --size S [--channels C] [--seed X]\n"
    "\n"
    "Text files ('-' reads stdin) become llm.c token shards OUTDIR/train_000000.bin, ... and, with\n"
    "--val-fraction, OUTDIR/val_000000.bin, ... (docs/data.md). Without --tokenizer each byte is a\n"
    "token 0..255 and the val shards hold the last fraction of the token stream; with --tokenizer the\n"
    "text is encoded by a Hugging Face tokenizer.json (byte-level BPE as GPT-2 and Llama-3, or\n"
    "SentencePiece BPE as Llama-2; docs/tokenizer.md), each document ends with the end-of-text\n"
    "token, whole documents go to the val shards, and shards are uint32 (version 2) when the\n"
    "vocabulary exceeds 65536.\n"
    "\n"
    "  -o, --output PATH     output directory (created if missing); with --images the file\n"
    "  --shard-tokens N      tokens per shard (default 100M; suffixes K, M, G = 1e3, 1e6, 1e9)\n"
    "  --val-fraction F      fraction for validation, in [0, 1) (default 0): of the tokens, or with\n"
    "                        --tokenizer of the documents (document d when floor((d+1)F) > floor(dF))\n"
    "  --tokenizer FILE      a tokenizer.json\n"
    "  --eos TOKEN           the token after each document (default: <|endoftext|>, <|end_of_text|>,\n"
    "                        </s> or <eos>, the first the tokenizer has)\n"
    "  --bos                 also put the beginning-of-text token (<|begin_of_text|>, <s>) first\n"
    "  --doc-sep SEP         documents are separated by SEP inside the files (\\n \\r \\t \\\\ escapes;\n"
    "                        e.g. '\\n\\n'); default: each file is one document\n"
    "  --special             the added tokens' strings in the text (e.g. <|endoftext|>) become\n"
    "                        those tokens (default: they are ordinary text)\n"
    "  --sft                 the files are JSONL fine-tuning examples, one a line: {\"prompt\": ...,\n"
    "                        \"response\": ...} or {\"messages\": [{\"role\": ..., \"content\": ...}, ...]};\n"
    "                        a loss mask beside each shard (X.mask) makes training learn the\n"
    "                        responses only (docs/data.md \"Fine-tuning data\")\n"
    "  --chat-template FILE  how \"messages\" become text: a JSON file of per-role prefixes and\n"
    "                        suffixes (docs/data.md)\n"
    "  --max-example-tokens N  an example longer than N tokens is dropped, or with --overlong\n"
    "                        truncate cut to N (default: no limit); the counts are printed\n"
    "  --overlong drop|truncate  what --max-example-tokens does (default drop)\n"
    "  --images              write a synthetic labeled image file (CIMG) instead:\n"
    "  --synthetic N         number of images\n"
    "  --classes K           number of classes (1..65536)\n"
    "  --size S              image height and width in pixels\n"
    "  --channels C          channels (default 3)\n"
    "  --seed X              seed of the images (default 1)\n"
    "  -h, --help            this text\n"
    "\n"
    "exit status: 0 written, 2 bad input or a file that cannot be read or written\n";

/* Non-negative integer with an optional K/M/G suffix (powers of 1000). */
static bool parse_count(const char *s, long max, long *out) {
    char buf[32];
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n + 1);
    long mult = 1;
    switch (buf[n - 1]) {
    case 'k': case 'K': mult = 1000; break;
    case 'm': case 'M': mult = 1000000; break;
    case 'g': case 'G': mult = 1000000000; break;
    default: break;
    }
    if (mult > 1) buf[n - 1] = '\0';
    long v;
    if (buf[0] == '-' || buf[0] == '+' || !str_to_long(buf, &v) || v < 0 || v > max / mult) return false;
    *out = v * mult;
    return true;
}

typedef struct data_input {
    const char *name;
    FILE *f;      /* regular files: streamed */
    char *buf;    /* stdin and other non-regular files: read whole */
    size_t len;   /* bytes (for regular files: the size when opened) */
} data_input;

/* Splits the token stream over train shards and val shards. */
typedef struct shard_sink {
    const char *dir;
    long shard_tokens;
    int64_t n_train, written; /* tokens before the val split; tokens written so far */
    int cur;                  /* split of the open shard: 0 train, 1 val */
    int index[2];             /* shards started per split */
    data_shard_writer *w;
    char path[4096];
} shard_sink;

static int sink_close_shard(shard_sink *k, err_t *err) {
    if (!k->w) return 0;
    int rc = data_shard_writer_close(k->w, err);
    k->w = NULL;
    return rc;
}

static int sink_add(shard_sink *k, const uint16_t *toks, int64_t n, err_t *err) {
    while (n > 0) {
        int si = k->written < k->n_train ? 0 : 1;
        if (k->w && (k->cur != si || data_shard_writer_count(k->w) == k->shard_tokens) &&
            sink_close_shard(k, err) < 0)
            return -1;
        if (!k->w) {
            if (str_fmt(k->path, sizeof k->path, err, "-o: the shard path", "%s/%s_%06d.bin", k->dir, si ? "val" : "train",
                        k->index[si]++) < 0 ||
                !(k->w = data_shard_writer_open(k->path, err)))
                return -1;
            data_shard_writer_set_tokenizer(k->w, tok_id_bytes());
            k->cur = si;
        }
        int64_t room = k->shard_tokens - data_shard_writer_count(k->w);
        if (!si && k->n_train - k->written < room) room = k->n_train - k->written;
        int64_t m = n < room ? n : room;
        if (data_shard_writer_add(k->w, toks, m, err) < 0) return -1;
        toks += m;
        n -= m;
        k->written += m;
    }
    return 0;
}

static int sink_bytes(shard_sink *k, const unsigned char *p, size_t n, err_t *err) {
    uint16_t toks[4096];
    while (n > 0) {
        size_t m = n < 4096 ? n : 4096;
        for (size_t i = 0; i < m; i++) toks[i] = p[i];
        if (sink_add(k, toks, (int64_t)m, err) < 0) return -1;
        p += m;
        n -= m;
    }
    return 0;
}

static int data_fail(const char *msg) {
    fprintf(stderr, "cephalo data: %s\n", msg);
    return EXIT_BAD_INPUT;
}

static int open_inputs(char **names, int n, data_input *in, err_t *err) {
    for (int i = 0; i < n; i++) {
        in[i].name = names[i];
        bool is_stdin = !strcmp(names[i], "-");
        struct stat st;
        int fd = is_stdin ? fileno(stdin) : file_open_read(names[i], false, &st, err);
        if (fd < 0) return -1;
        if (is_stdin && fstat(fd, &st) != 0) return err_set(err, "-: cannot stat the standard input: %s", strerror(errno));
        if (is_stdin && S_ISDIR(st.st_mode)) return err_set(err, "-: the standard input is a directory, expected a file");
        FILE *f = is_stdin ? stdin : fdopen(fd, "rb");
        if (!f) {
            close(fd);
            return err_set(err, "%s: cannot open: %s", names[i], strerror(errno));
        }
        if (S_ISREG(st.st_mode) && !is_stdin) {
            in[i].f = f;
            in[i].len = (size_t)st.st_size;
            continue;
        }
        size_t cap = 1 << 16, len = 0, got;
        char *buf = malloc(cap);
        while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
            if ((len += got) == cap) {
                char *nb = realloc(buf, cap *= 2);
                if (!nb) free(buf);
                buf = nb;
            }
        bool bad_read = !buf || ferror(f);
        if (!is_stdin) fclose(f);
        if (bad_read) {
            free(buf);
            return err_set(err, "%s: read error%s", names[i], buf ? "" : " (out of memory)");
        }
        in[i].buf = buf;
        in[i].len = len;
    }
    return 0;
}

static int write_input(shard_sink *k, data_input *in, err_t *err) {
    if (in->buf) return sink_bytes(k, (const unsigned char *)in->buf, in->len, err);
    unsigned char chunk[1 << 16];
    size_t total = 0, got;
    while ((got = fread(chunk, 1, sizeof chunk, in->f)) > 0) {
        if (total + got > in->len) got = in->len - total; /* grew while reading: the size counted */
        if (sink_bytes(k, chunk, got, err) < 0) return -1;
        total += got;
        if (total == in->len) break;
    }
    if (ferror(in->f)) return err_set(err, "%s: read error: %s", in->name, strerror(errno));
    if (total != in->len)
        return err_set(err, "%s: the file shrank while being read (%zu of %zu bytes)", in->name, total, in->len);
    return 0;
}


/* train_000000.bin, val_000012.bin, ...: the names data_text gives its shards (six digits or
 * more). */
static bool is_shard_name(const char *s) {
    const char *p = !strncmp(s, "train_", 6) ? s + 6 : !strncmp(s, "val_", 4) ? s + 4 : NULL;
    if (!p) return false;
    size_t digits = strspn(p, "0123456789");
    return digits >= 6 && !strcmp(p + digits, ".bin");
}

static const out_kind data_dir_kind = {"data directory", is_shard_name, false, NULL, NULL};

/* An input that is one of OUTDIR's shards would be replaced by this run's shards, or trained on
 * with them (symbolic links into OUTDIR included); nor may the tokenizer be one (common/outputs.h). */
static int check_data_inputs(const char *outdir, const char *tokenizer, char **files, int n_files, err_t *err) {
    out_set s = out_begin("cephalo data");
    out_input(&s, "--tokenizer", tokenizer);
    for (int i = 0; i < n_files; i++) out_input(&s, "input", files[i]);
    out_dir(&s, "-o", outdir, &data_dir_kind);
    int rc = out_check(&s, err);
    out_free(&s);
    return rc;
}

/* How to use a directory with val shards, as the worker reads one (worker/formats/data.c,
 * pick_role): training leaves its validation shards out, validation takes only them. */
static void print_split_hint(const char *outdir) {
    printf("  train with --data %s (its val shards are left out of training) and --val-data %s (the val shards "
           "alone)\n", outdir, outdir);
}

/* Shards of an earlier, larger run would be picked up by a directory or glob spec. */
static void warn_leftover_shards(const char *outdir, const int index[2]) {
    for (int si = 0; si < 2; si++) {
        char p[4096];
        struct stat st;
        if (str_fmt(p, sizeof p, NULL, "", "%s/%s_%06d.bin", outdir, si ? "val" : "train", index[si]) == 0 && stat(p, &st) == 0)
            fprintf(stderr, "cephalo data: warning: %s and maybe more %s shards are left from an earlier run; "
                    "remove them before training on the directory\n", p, si ? "val" : "train");
    }
}

static int data_text(const char *outdir, long shard_tokens, double val_fraction, char **files, int n_files) {
    err_t err = {{0}};
    data_input *in = calloc((size_t)n_files, sizeof *in);
    shard_sink k = {.dir = outdir, .shard_tokens = shard_tokens};
    int rc = 0;
    if (!in) return data_fail("out of memory");
    if (check_data_inputs(outdir, NULL, files, n_files, &err) < 0 || open_inputs(files, n_files, in, &err) < 0) {
        rc = data_fail(err.msg);
        goto done;
    }
    int64_t total = 0;
    for (int i = 0; i < n_files; i++) total += (int64_t)in[i].len;
    int64_t n_val = 0;
    if (total == 0) {
        rc = data_fail("the input is empty: no tokens to write");
        goto done;
    }
    if (val_fraction > 0) {
        if (total < 2) {
            rc = data_fail("--val-fraction: the input has 1 token, too few to split");
            goto done;
        }
        n_val = (int64_t)((double)total * val_fraction + 0.5);
        if (n_val < 1) n_val = 1;
        if (n_val > total - 1) n_val = total - 1;
    }
    if (file_make_dir(outdir, false, &err) < 0) {
        rc = data_fail(err.msg);
        goto done;
    }
    k.n_train = total - n_val;
    for (int i = 0; i < n_files && !rc; i++)
        if (write_input(&k, &in[i], &err) < 0) rc = -1;
    if (!rc && sink_close_shard(&k, &err) < 0) rc = -1;
    if (rc) {
        if (k.w) data_shard_writer_abort(k.w);
        rc = data_fail(err.msg);
        goto done;
    }
    printf("cephalo data: %d file%s, %lld bytes -> %lld tokens (byte-level: tokens 0..255; any vocab >= 256, "
           ">= 257 for MLM)\n",
           n_files, n_files == 1 ? "" : "s", (long long)total, (long long)total);
    for (int si = 0; si < 2; si++) {
        const char *name = si ? "val" : "train";
        if (!k.index[si]) continue;
        printf("  %-6s %lld tokens in %d shard%s: %s/%s_000000.bin", si ? "val:" : "train:", (long long)(si ? n_val : k.n_train),
               k.index[si], k.index[si] == 1 ? "" : "s", outdir, name);
        if (k.index[si] > 1) printf(" .. %s_%06d.bin", name, k.index[si] - 1);
        putchar('\n');
    }
    printf("  tokenizer bytes-256, recorded in each shard's header\n");
    if (n_val) print_split_hint(outdir);
    warn_leftover_shards(outdir, k.index);
done:
    for (int i = 0; i < n_files; i++) {
        if (in[i].f) fclose(in[i].f);
        free(in[i].buf);
    }
    free(in);
    return rc;
}

/* ---- text through a tokenizer.json (docs/tokenizer.md) ---- */

typedef struct tok_opts {
    const char *tokenizer, *eos, *doc_sep;
    bool bos, special;
    /* --sft: JSONL fine-tuning examples (cli/data_sft.h) */
    bool sft, truncate;
    const char *chat_template;
    long max_example; /* tokens; 0: no limit */
} tok_opts;

/* Train and val shards, each split rotating at shard_tokens; version 2 (uint32) when the
 * vocabulary does not fit uint16. */
typedef struct tsink {
    const char *dir;
    long shard_tokens;
    int version;
    tok_id tok; /* recorded in every shard's header */
    bool masked; /* --sft: a loss mask beside every shard */
    data_shard_writer *w[2];
    int index[2];
    int64_t tokens[2], docs[2];
    char path[4096];
} tsink;

/* mask: NULL, or (masked sinks) one byte per id. */
static int tsink_add(tsink *k, int si, const int32_t *ids, const uint8_t *mask, size_t n, err_t *err) {
    uint32_t buf[4096];
    while (n > 0) {
        if (k->w[si] && data_shard_writer_count(k->w[si]) == k->shard_tokens) {
            int rc = data_shard_writer_close(k->w[si], err);
            k->w[si] = NULL;
            if (rc < 0) return -1;
        }
        if (!k->w[si]) {
            if (str_fmt(k->path, sizeof k->path, err, "-o: the shard path", "%s/%s_%06d.bin", k->dir, si ? "val" : "train",
                        k->index[si]++) < 0 ||
                !(k->w[si] = data_shard_writer_open_version(k->path, k->version, err)))
                return -1;
            data_shard_writer_set_tokenizer(k->w[si], k->tok);
            if (k->masked && data_shard_writer_enable_mask(k->w[si], err) < 0) return -1;
        }
        int64_t room = k->shard_tokens - data_shard_writer_count(k->w[si]);
        size_t m = n < sizeof buf / sizeof *buf ? n : sizeof buf / sizeof *buf;
        if ((int64_t)m > room) m = (size_t)room;
        for (size_t i = 0; i < m; i++) buf[i] = (uint32_t)ids[i];
        if (k->masked ? data_shard_writer_add32_masked(k->w[si], buf, mask, (int64_t)m, err)
                      : data_shard_writer_add32(k->w[si], buf, (int64_t)m, err))
            return -1;
        if (mask) mask += m;
        ids += m;
        n -= m;
        k->tokens[si] += (int64_t)m;
    }
    return 0;
}

static int tsink_close(tsink *k, err_t *err) {
    int rc = 0;
    for (int si = 0; si < 2; si++) {
        if (k->w[si] && data_shard_writer_close(k->w[si], err) < 0) rc = -1;
        k->w[si] = NULL;
    }
    return rc;
}

static void tsink_abort(tsink *k) {
    for (int si = 0; si < 2; si++) data_shard_writer_abort(k->w[si]);
    k->w[0] = k->w[1] = NULL;
}

/* --doc-sep's escapes: \n \r \t and \\ (a backslash before anything else is dropped). */
static char *unescape(const char *s, size_t *n) {
    char *o = xmalloc(strlen(s) + 1);
    size_t k = 0;
    for (; *s; s++) {
        if (*s == '\\' && s[1]) {
            s++;
            o[k++] = *s == 'n' ? '\n' : *s == 'r' ? '\r' : *s == 't' ? '\t' : *s;
        } else {
            o[k++] = *s;
        }
    }
    o[k] = '\0';
    *n = k;
    return o;
}

/* memmem, which POSIX lacks */
static const char *find_bytes(const char *h, size_t hn, const char *needle, size_t nn) {
    for (const char *p = h; nn && (size_t)(h + hn - p) >= nn; p++) {
        p = memchr(p, needle[0], (size_t)(h + hn - p) - nn + 1);
        if (!p) return NULL;
        if (!memcmp(p, needle, nn)) return p;
    }
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The progress line on stderr: rewritten in place on a terminal, else one line every 10 s. */
typedef struct progress {
    double start, last;
    int64_t total, done;
    bool tty;
} progress;

static void progress_show(progress *p, bool final) {
    double t = now_s(), el = t - p->start;
    if (!final && t - p->last < (p->tty ? 0.5 : 10)) return;
    p->last = t;
    double mb = (double)p->done / 1e6;
    fprintf(stderr, "%scephalo data: tokenized %.1f of %.1f MB in %.1f s, %.1f MB/s%s", p->tty ? "\r" : "", mb,
            (double)p->total / 1e6, el, el > 0 ? mb / el : 0.0, final || !p->tty ? "\n" : "");
    fflush(stderr);
}

/* The whole input in memory: documents are cut from it. */
static char *read_input(data_input *in, err_t *err) {
    if (in->buf) {
        char *b = in->buf;
        in->buf = NULL;
        return b;
    }
    char *b = malloc(in->len + 1);
    if (!b) {
        err_set(err, "%s: out of memory reading %zu bytes", in->name, in->len);
        return NULL;
    }
    size_t got = fread(b, 1, in->len, in->f);
    if (got != in->len) {
        free(b);
        err_set(err, "%s: read error or the file shrank while being read (%zu of %zu bytes)", in->name, got, in->len);
        return NULL;
    }
    return b;
}

/* Document d goes to validation when floor((d+1)F) > floor(dF): every 1/F-th document, spread
 * evenly, the same on every run; floor(N F) of N documents. */
static int doc_split(int64_t d, double f) {
    return f > 0 && (int64_t)((double)(d + 1) * f) > (int64_t)((double)d * f);
}

typedef struct tok_run {
    tok *t;
    const tok_opts *o;
    int32_t eos, bos;
    double val;
    tsink k;
    tok_ids ids;
    int64_t docs, bytes;
    progress prog;
    /* --sft */
    sft_template tmpl;
    sft_codec codec;
    sft_mask mask;
    int64_t dropped, truncated, learned; /* examples; examples; targets with loss */
} tok_run;

static int tok_document(tok_run *r, const char *p, size_t n, err_t *err) {
    r->ids.n = 0;
    if (r->bos >= 0) tok_ids_push(&r->ids, r->bos);
    tok_encode(r->t, p, n, r->o->special, &r->ids);
    tok_ids_push(&r->ids, r->eos);
    int si = doc_split(r->docs++, r->val);
    r->k.docs[si]++;
    return tsink_add(&r->k, si, r->ids.v, NULL, r->ids.n, err);
}

/* One input: its documents (the whole file, or the pieces between --doc-sep). */
static int tok_input(tok_run *r, data_input *in, err_t *err) {
    char *text = read_input(in, err);
    if (!text) return -1;
    size_t n = in->len, sep_n = 0;
    char *sep = r->o->doc_sep ? unescape(r->o->doc_sep, &sep_n) : NULL;
    int rc = 0;
    size_t start = 0;
    while (!rc && start <= n) {
        size_t end = n;
        if (sep_n) {
            const char *hit = find_bytes(text + start, n - start, sep, sep_n);
            if (hit) end = (size_t)(hit - text);
        }
        if (end > start || (!sep_n && n == 0)) rc = tok_document(r, text + start, end - start, err);
        r->prog.done += (int64_t)(end - start + (end < n ? sep_n : 0));
        progress_show(&r->prog, false);
        if (end == n) break;
        start = end + sep_n;
    }
    free(sep);
    free(text);
    return rc;
}

/* --max-example-tokens: 1 to keep the example (maybe truncated), 0 to drop it. An example cut
 * down to no token with loss is dropped too. */
static int sft_fit(tok_run *r) {
    long max = r->o->max_example;
    if (!max || (long)r->ids.n <= max) return 1;
    if (r->o->truncate) {
        r->ids.n = r->mask.n = (size_t)max;
        for (size_t i = 0; i < r->mask.n; i++)
            if (r->mask.v[i]) return r->truncated++, 1;
    }
    r->dropped++;
    return 0;
}

/* One JSONL input: each non-blank line an example; whole examples go to train or val. */
static int sft_input(tok_run *r, data_input *in, err_t *err) {
    char *text = read_input(in, err);
    if (!text) return -1;
    size_t n = in->len, start = 0;
    int rc = 0;
    for (long line = 1; !rc && start < n; line++) {
        const char *nl = memchr(text + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - text) : n, k = start;
        while (k < end && strchr(" \t\r", text[k])) k++;
        if (k < end && (rc = sft_encode_line(&r->codec, in->name, line, text + start, end - start, &r->ids, &r->mask, err)) == 0 &&
            sft_fit(r)) {
            int si = doc_split(r->docs++, r->val);
            r->k.docs[si]++;
            for (size_t i = 0; i < r->mask.n; i++) r->learned += r->mask.v[i];
            rc = tsink_add(&r->k, si, r->ids.v, r->mask.v, r->ids.n, err);
        }
        r->prog.done += (int64_t)(end - start + (nl ? 1 : 0));
        progress_show(&r->prog, false);
        start = end + 1;
    }
    free(text);
    return rc;
}

static void print_tok_summary(const tok_run *r, int n_files, const char *outdir) {
    const tok *t = r->t;
    const char *unit = r->o->sft ? "example" : "document";
    printf("cephalo data: %d file%s, %lld %s%s, %lld bytes -> %lld tokens (%s; vocab %d, EOS %d%s; shard "
           "version %d, %s tokens)\n",
           n_files, n_files == 1 ? "" : "s", (long long)r->docs, unit, r->docs == 1 ? "" : "s", (long long)r->bytes,
           (long long)(r->k.tokens[0] + r->k.tokens[1]), tok_describe(t), tok_vocab_size(t), r->eos,
           r->bos >= 0 ? ", BOS first" : "", r->k.version, r->k.version == DATA_SHARD_VERSION ? "uint16" : "uint32");
    for (int si = 0; si < 2; si++) {
        const char *name = si ? "val" : "train";
        if (!r->k.index[si]) continue;
        printf("  %-6s %lld tokens, %lld %ss in %d shard%s: %s/%s_000000.bin", si ? "val:" : "train:",
               (long long)r->k.tokens[si], (long long)r->k.docs[si], unit, r->k.index[si], r->k.index[si] == 1 ? "" : "s",
               outdir, name);
        if (r->k.index[si] > 1) printf(" .. %s_%06d.bin", name, r->k.index[si] - 1);
        putchar('\n');
    }
    if (r->o->sft) {
        int64_t all = r->k.tokens[0] + r->k.tokens[1];
        printf("  fine-tuning: %lld examples, %lld tokens with loss (%.1f%%); a loss mask beside each shard "
               "(train_000000.mask, ...)\n",
               (long long)r->docs, (long long)r->learned, all ? 100.0 * (double)r->learned / (double)all : 0.0);
        if (r->o->max_example)
            printf("  --max-example-tokens %ld: %lld examples dropped, %lld truncated\n", r->o->max_example,
                   (long long)r->dropped, (long long)r->truncated);
    }
    char name[TOK_ID_NAME_MAX];
    tok_id_name(r->k.tok, name);
    printf("  tokenizer %s, recorded in each shard's header; its file is %s/tokenizer.json\n", name, outdir);
    if (r->k.index[1]) print_split_hint(outdir);
}

static int tok_setup(tok_run *r, const tok_opts *o, err_t *err) {
    if (tok_load(&r->t, o->tokenizer, err) < 0) return -1;
    r->eos = o->eos ? tok_find(r->t, o->eos) : tok_eos(r->t);
    if (r->eos < 0)
        return err_set(err, o->eos ? "%s: --eos: no token \"%s\" in the tokenizer"
                                   : "%s: no end-of-text token (none of <|endoftext|>, <|end_of_text|>, </s>, <eos>): "
                                     "name one with --eos%s",
                       o->tokenizer, o->eos ? o->eos : "");
    if (o->chat_template && sft_template_load(o->chat_template, &r->tmpl, err) < 0) return -1;
    r->bos = -1;
    if ((o->bos || r->tmpl.bos) && (r->bos = tok_bos(r->t)) < 0)
        return err_set(err, "%s: %s: no beginning-of-text token (none of <|begin_of_text|>, <s>, <|startoftext|>, <bos>)",
                       o->tokenizer, o->bos ? "--bos" : "the chat template's \"bos\": true");
    r->k.version = tok_vocab_size(r->t) > 65536 ? DATA_SHARD_VERSION_U32 : DATA_SHARD_VERSION;
    r->k.tok = tok_identity(r->t);
    r->k.masked = o->sft;
    r->codec = (sft_codec){.t = r->t, .tmpl = o->chat_template ? &r->tmpl : NULL, .bos = r->bos,
                           .pair_bos = o->bos, .eos = r->eos, .special = o->special};
    return 0;
}

/* OUTDIR/tokenizer.json: the shards' tokenizer, beside them, so that training (and the
 * checkpoints and exports after it) can carry the file on. One already there with the same
 * identity stays; another is left as it is, with a warning (it is not this command's to replace). */
static int keep_tokenizer(const char *outdir, const char *src, tok_id id, err_t *err) {
    char dst[4096];
    if (str_fmt(dst, sizeof dst, err, "-o: the tokenizer path", "%s/tokenizer.json", outdir) < 0) return -1;
    if (file_same(src, dst)) return 0;
    struct stat st;
    if (stat(dst, &st) == 0) {
        tok_id have;
        err_t e2;
        char a[TOK_ID_NAME_MAX], b[TOK_ID_NAME_MAX];
        if (tok_file_identity(dst, &have, &e2) == 0 && tok_id_equal(have, id)) return 0;
        tok_id_name(id, a);
        tok_id_name(have, b);
        fprintf(stderr, "cephalo data: warning: %s is another tokenizer (%s) than the shards' (%s); left as it is, so "
                        "training on %s will not find the shards' tokenizer there\n", dst, b, a, outdir);
        return 0;
    }
    size_t len;
    char *text = file_read_all(src, JSON_MAX_FILE, &len, err);
    if (!text) return -1;
    int rc = file_write_atomic(dst, text, len, 0, err);
    free(text);
    return rc;
}

static int data_tokenized(const char *outdir, long shard_tokens, double val, const tok_opts *o, char **files,
                          int n_files) {
    err_t err = {{0}};
    tok_run r = {.o = o, .val = val, .k = {.dir = outdir, .shard_tokens = shard_tokens}};
    data_input *in = calloc((size_t)n_files, sizeof *in);
    int rc = 0;
    if (!in) return data_fail("out of memory");
    struct stat st;
    bool existed = stat(outdir, &st) == 0;
    if (val > 0 && !o->doc_sep && !o->sft && (int64_t)((double)n_files * val) < 1) { /* known before any work */
        free(in);
        err_set(&err, "--val-fraction %g: %d file%s (each one document), too few for one validation document "
                      "(every %.0fth goes there; use --doc-sep to cut the files into documents)",
                val, n_files, n_files == 1 ? "" : "s", 1 / val);
        return data_fail(err.msg);
    }
    if (tok_setup(&r, o, &err) < 0 || check_data_inputs(outdir, o->tokenizer, files, n_files, &err) < 0 ||
        open_inputs(files, n_files, in, &err) < 0 || file_make_dir(outdir, false, &err) < 0) {
        rc = data_fail(err.msg);
        goto done;
    }
    for (int i = 0; i < n_files; i++) r.prog.total += (int64_t)in[i].len;
    r.bytes = r.prog.total;
    r.prog.start = r.prog.last = now_s();
    r.prog.tty = isatty(fileno(stderr));
    for (int i = 0; i < n_files && !rc; i++) {
        if ((o->sft ? sft_input(&r, &in[i], &err) : tok_input(&r, &in[i], &err)) < 0) rc = -1;
        if (in[i].f) fclose(in[i].f);
        in[i].f = NULL;
    }
    if (!rc && r.docs == 0)
        rc = o->sft ? err_set(&err, "the input has no examples (%lld dropped by --max-example-tokens): no tokens to write",
                              (long long)r.dropped)
                    : err_set(&err, "the input has no documents: no tokens to write");
    if (!rc && val > 0 && !r.k.docs[1])
        rc = err_set(&err, "--val-fraction %g: %lld document%s, too few for one validation document (every %.0fth goes "
                           "there; use --doc-sep to cut the files into documents)",
                     val, (long long)r.docs, r.docs == 1 ? "" : "s", 1 / val);
    if (!rc && val > 0 && !r.k.docs[0]) rc = err_set(&err, "--val-fraction %g: no document left for training", val);
    if (!rc && tsink_close(&r.k, &err) < 0) rc = -1;
    if (rc) {
        tsink_abort(&r.k);
        if (!existed) rmdir(outdir); /* only when empty: shards finished before the failure stay */
        rc = data_fail(err.msg);
        goto done;
    }
    if (keep_tokenizer(outdir, o->tokenizer, r.k.tok, &err) < 0) {
        rc = data_fail(err.msg);
        goto done;
    }
    progress_show(&r.prog, true);
    print_tok_summary(&r, n_files, outdir);
    warn_leftover_shards(outdir, r.k.index);
done:
    for (int i = 0; i < n_files; i++) {
        if (in[i].f) fclose(in[i].f);
        free(in[i].buf);
    }
    free(in);
    tok_ids_free(&r.ids);
    sft_mask_free(&r.mask);
    sft_template_free(&r.tmpl);
    tok_free(r.t);
    return rc;
}

static int data_images(const char *out, long count, long classes, long size, long channels, long seed) {
    err_t err = {{0}};
    data_image_info info = {.channels = (uint32_t)channels, .height = (uint32_t)size, .width = (uint32_t)size,
                            .n_classes = (uint32_t)classes};
    data_image_writer *w = data_image_writer_open(out, &info, &err);
    if (!w) return data_fail(err.msg);
    size_t px = (size_t)channels * (size_t)size * (size_t)size;
    uint8_t *pix = malloc(px);
    if (!pix) {
        data_image_writer_abort(w);
        return data_fail("out of memory");
    }
    int32_t label;
    for (long i = 0; i < count; i++) {
        data_synthetic_image((uint64_t)seed, i, (int)channels, (int)size, (int)classes, pix, &label);
        if (data_image_writer_add(w, (uint16_t)label, pix, &err) < 0) {
            free(pix);
            data_image_writer_abort(w);
            return data_fail(err.msg);
        }
    }
    free(pix);
    if (data_image_writer_close(w, &err) < 0) return data_fail(err.msg);
    printf("cephalo data: wrote %s: %ld synthetic images of %ldx%ldx%ld, %ld classes, seed %ld (%lld bytes)\n", out,
           count, channels, size, size, classes, seed, (long long)(DATA_CIMG_HEADER_BYTES + (long long)count * (2 + (long long)px)));
    return 0;
}

typedef struct data_opts {
    const char *out;
    long shard_tokens, count, classes, size, channels, seed;
    double val;
    bool images;
    tok_opts to;
} data_opts;

/* A count with K, M, G suffixes in [1, max]. */
static int count_arg(const args *p, long max, const char *what, long *out) {
    if (!parse_count(p->val, max, out) || *out < 1) return args_bad(p, "%s: '%s' is not %s", p->opt, p->val, what);
    return 0;
}

static int text_option(args *p, int ch, data_opts *o) {
    switch (ch) {
    case 'T': return count_arg(p, DATA_SHARD_MAX_TOKENS, "a token count in 1..2147483647 (K, M, G suffixes allowed)", &o->shard_tokens);
    case 'V':
        if (!str_to_double(p->val, &o->val) || !(o->val >= 0 && o->val < 1))
            return args_bad(p, "--val-fraction: '%s' (expected a fraction in [0, 1))", p->val);
        break;
    case 'k': o->to.tokenizer = p->val; break;
    }
    return 0;
}

/* The tokenizer's options (they need --tokenizer). */
static int tok_option(args *p, int ch, data_opts *o) {
    switch (ch) {
    case 'e': o->to.eos = p->val; break;
    case 'b': o->to.bos = true; break;
    case 'd':
        if (!*p->val) return args_bad(p, "--doc-sep: empty separator");
        o->to.doc_sep = p->val;
        break;
    case 's': o->to.special = true; break;
    case 'F': o->to.sft = true; break;
    case 'c': o->to.chat_template = p->val; break;
    case 'M': return count_arg(p, DATA_SHARD_MAX_TOKENS, "a token count in 1..2147483647", &o->to.max_example);
    case 'L':
        if (strcmp(p->val, "drop") && strcmp(p->val, "truncate"))
            return args_bad(p, "--overlong: '%s' (expected drop or truncate)", p->val);
        o->to.truncate = !strcmp(p->val, "truncate");
        break;
    }
    return 0;
}

static int image_option(args *p, int ch, data_opts *o) {
    switch (ch) {
    case 'N': return count_arg(p, UINT32_MAX, "an image count in 1..4294967295", &o->count);
    case 'K': return args_long(p, 1, DATA_CIMG_MAX_CLASSES, &o->classes);
    case 'Z': return args_long(p, 1, DATA_CIMG_MAX_SIDE, &o->size);
    case 'C': return args_long(p, 1, DATA_CIMG_MAX_CHANNELS, &o->channels);
    case 'X': return args_long(p, 0, 1L << 62, &o->seed);
    }
    return 0;
}

static int data_option(args *p, int ch, data_opts *o) {
    if (ch == 'o') return o->out = p->val, 0;
    if (ch == 'I') return o->images = true, 0;
    if (strchr("NKZCX", ch)) return image_option(p, ch, o);
    if (strchr("ebdsFcML", ch)) return tok_option(p, ch, o);
    return text_option(p, ch, o);
}

/* Each kind's options act in its mode only: text (shards), the tokenizer's, the images'. An option
 * that needs another one says to give it, or to leave the option out; --sft only to give it: it asks
 * for fine-tuning data, which the bytes of a JSONL file read as text are not. */
static int check_idle_options(const args *p, const data_opts *o) {
    bool text = !o->images, tokens = text && o->to.tokenizer, sft = tokens && o->to.sft;
    const char *for_text = "text input (it is for text, not --images)";
    const char *sft_tok = "--tokenizer FILE (fine-tuning examples are encoded with the model's tokenizer.json, and "
                          "their loss masks mark the responses' tokens)";
    const args_only only[] = {
        {'T', text, for_text, ARGS_LEAVE_OUT}, {'V', text, for_text, ARGS_LEAVE_OUT},
        {'k', text, for_text, ARGS_LEAVE_OUT}, {'e', text, for_text, ARGS_LEAVE_OUT},
        {'b', text, for_text, ARGS_LEAVE_OUT}, {'d', text, for_text, ARGS_LEAVE_OUT},
        {'s', text, for_text, ARGS_LEAVE_OUT}, {'F', text, for_text, ARGS_LEAVE_OUT},
        {'c', text, for_text, ARGS_LEAVE_OUT}, {'M', text, for_text, ARGS_LEAVE_OUT},
        {'L', text, for_text, ARGS_LEAVE_OUT},
        {'F', tokens, sft_tok, ARGS_GIVE},
        {'e', tokens, "--tokenizer", ARGS_GIVE_OR_LEAVE}, {'b', tokens, "--tokenizer", ARGS_GIVE_OR_LEAVE},
        {'d', tokens, "--tokenizer", ARGS_GIVE_OR_LEAVE}, {'s', tokens, "--tokenizer", ARGS_GIVE_OR_LEAVE},
        {'c', sft, "--sft", ARGS_GIVE_OR_LEAVE}, {'M', sft, "--sft", ARGS_GIVE_OR_LEAVE},
        {'L', sft && o->to.max_example, "--max-example-tokens", ARGS_GIVE_OR_LEAVE},
        {'d', !sft, "text input, not --sft (a JSONL line is one example)", ARGS_LEAVE_OUT},
        {'N', o->images, "--images", ARGS_GIVE_OR_LEAVE}, {'K', o->images, "--images", ARGS_GIVE_OR_LEAVE},
        {'Z', o->images, "--images", ARGS_GIVE_OR_LEAVE}, {'C', o->images, "--images", ARGS_GIVE_OR_LEAVE},
        {'X', o->images, "--images", ARGS_GIVE_OR_LEAVE},
    };
    return args_check_only(p, only, sizeof only / sizeof only[0]);
}

/* --images: synthetic labeled images, no input files. */
static int check_images(const args *p, const data_opts *o, int operands) {
    if (operands) return args_bad(p, "unexpected argument '%s' (--images writes synthetic images only)", p->argv[optind]);
    if (o->count < 0) return args_bad(p, "--images needs --synthetic N (converting image files is not supported)");
    if (o->classes < 0) return args_bad(p, "--images needs --classes K");
    if (o->size < 0) return args_bad(p, "--images needs --size S");
    if ((uint64_t)o->channels * (uint64_t)o->size * (uint64_t)o->size > DATA_CIMG_MAX_PIXELS)
        return args_bad(p, "--channels x --size x --size is too large for one image (at most 2^28 values)");
    return 0;
}

int data_main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'},    {"shard-tokens", required_argument, 0, 'T'},
        {"val-fraction", required_argument, 0, 'V'}, {"images", no_argument, 0, 'I'},
        {"synthetic", required_argument, 0, 'N'}, {"classes", required_argument, 0, 'K'},
        {"size", required_argument, 0, 'Z'},      {"channels", required_argument, 0, 'C'},
        {"seed", required_argument, 0, 'X'},      {"help", no_argument, 0, 'h'},
        {"tokenizer", required_argument, 0, 'k'}, {"eos", required_argument, 0, 'e'},
        {"bos", no_argument, 0, 'b'},             {"doc-sep", required_argument, 0, 'd'},
        {"special", no_argument, 0, 's'},         {"sft", no_argument, 0, 'F'},
        {"chat-template", required_argument, 0, 'c'}, {"max-example-tokens", required_argument, 0, 'M'},
        {"overlong", required_argument, 0, 'L'},  {0, 0, 0, 0}};
    data_opts o = {.shard_tokens = 100000000, .count = -1, .classes = -1, .size = -1, .channels = 3, .seed = 1};
    args p = args_begin(argc, argv, "cephalo data", longopts, "o:", data_usage);
    int ch = 0, rc = 0;
    while (!rc && (ch = args_next(&p)) > 0) rc = data_option(&p, ch, &o);
    if (rc || ch < 0) return ARGS_BAD;
    char **files;
    int n = args_operands(&p, &files);
    if (!o.out) return args_bad(&p, "-o OUTPUT is required");
    if (check_idle_options(&p, &o)) return ARGS_BAD;
    if (o.images)
        return check_images(&p, &o, n) ? ARGS_BAD : data_images(o.out, o.count, o.classes, o.size, o.channels, o.seed);
    if (!n) return args_bad(&p, "no input FILE (give text files, or '-' for stdin)");
    if (o.to.tokenizer) return data_tokenized(o.out, o.shard_tokens, o.val, &o.to, files, n);
    return data_text(o.out, o.shard_tokens, o.val, files, n);
}
