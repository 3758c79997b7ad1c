/* fuzz_shard.c - libFuzzer target for the worker's data files (worker/formats/data.c): the input is
 * checked in memory, then written to a temporary file and opened through the real path (mmap) as
 * an llm.c token shard (CLM and MLM, small and large vocabularies) and as a CIMG image file (with
 * the header's own dimensions and with mismatched ones); a few samples are read from each. Every
 * open must succeed exactly when the in-memory check and the model's arguments say it should
 * (expect_tokens, expect_images): a check made by only one of the two paths aborts. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char tmp_path[64];

static void remove_tmp(void) {
    if (tmp_path[0]) unlink(tmp_path);
}

static int write_tmp(const uint8_t *data, size_t size) {
    if (!tmp_path[0]) {
        /* tmpfs when there is one: a disk-backed /tmp makes every run wait on writeback */
        const char *d = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(tmp_path, sizeof tmp_path, "%s/fuzz_shard.%ld.bin", d, (long)getpid());
        atexit(remove_tmp);
    }
    FILE *f = fopen(tmp_path, "wb");
    if (!f) return -1;
    size_t put = size ? fwrite(data, 1, size, f) : 0;
    return fclose(f) == 0 && put == size ? 0 : -1;
}

/* Returns whether the file opened as a token source. */
static int read_tokens(int seq, int vocab, data_task task) {
    data_source *ds;
    err_t err;
    if (data_open_tokens(&ds, tmp_path, DATA_TRAIN, seq, vocab, task, 7, &err) < 0) return 0;
    int32_t in[64], tg[64];
    char desc[256];
    data_describe(ds, desc, sizeof desc);
    int64_t w = data_num_samples(ds);
    for (int64_t s = 0; s < 2 * w && s < 64; s++)
        if (data_get_tokens(ds, s, in, tg, &err) < 0) break;
    data_close(ds);
    return 1;
}

/* Returns whether the file opened as an image source. */
static int read_images(int channels, int side, int classes) {
    data_source *ds;
    err_t err;
    if (data_open_images(&ds, tmp_path, channels, side, classes, 3, &err) < 0) return 0;
    size_t px = (size_t)channels * (size_t)side * (size_t)side;
    float *pix = malloc(px * sizeof *pix);
    int32_t label;
    for (int64_t s = 0; s < data_num_samples(ds) + 1 && s < 16; s++)
        if (data_get_image(ds, s, pix, &label, &err) < 0) break;
    free(pix);
    data_close(ds);
    return 1;
}

/* The same for images: the header passes, its dimensions are the model's, and it holds an image. */
static int expect_images(int image_ok, const data_image_info *in, int channels, int side, int classes) {
    return image_ok && (int)in->channels == channels && (int)in->height == side && (int)in->width == side &&
           (int)in->n_classes == classes && in->count > 0;
}

/* What opening the file as one shard must give, from the in-memory header check alone: the
 * header passes, the shard has a window of seq+1 tokens, and the tokenizer it records (if any)
 * fits the model's vocabulary. The file path checks nothing else for one shard without a mask,
 * so any other disagreement is a check that only one of the two paths makes. */
static int expect_tokens(int shard_ok, int64_t n_tokens, const tok_id *tok, int seq, int vocab) {
    return shard_ok && n_tokens >= (int64_t)seq + 1 && tok->vocab <= vocab;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    err_t err;
    int64_t n_tokens = 0;
    data_image_info info;
    tok_id tok = {0};
    int shard_ok = data_shard_check("fuzz.bin", data, size, &n_tokens, &err) == 0;
    if (shard_ok && data_shard_tokenizer("fuzz.bin", data, &tok, &err) < 0) abort(); /* the check passed it */
    int image_ok = data_image_check("fuzz.cimg", data, size, &info, &err) == 0;
    if (write_tmp(data, size) < 0) return 0;

    static const struct {
        int seq, vocab;
        data_task task;
    } opens[] = {
        {4, 65536, DATA_CLM}, {1, 300, DATA_CLM}, {7, 300, DATA_MLM}, {64, 3, DATA_MLM}, {2, 1 << 24, DATA_CLM},
    };
    for (size_t i = 0; i < sizeof opens / sizeof opens[0]; i++)
        if (read_tokens(opens[i].seq, opens[i].vocab, opens[i].task) !=
            expect_tokens(shard_ok, n_tokens, &tok, opens[i].seq, opens[i].vocab))
            abort();
    if (read_images(3, 8, 10) != expect_images(image_ok, &info, 3, 8, 10)) abort();
    if (image_ok) {
        data_image_info again;
        if (data_image_file_info(tmp_path, &again, &err) < 0 || memcmp(&again, &info, sizeof info) != 0) abort();
        int c = (int)info.channels, side = (int)info.height, k = (int)info.n_classes;
        if (read_images(c, side, k) != expect_images(image_ok, &info, c, side, k)) abort();
        if (read_images(c, side, k + 1)) abort();
    }
    return 0;
}
