/* data.h - training data for the worker: llm.c token shards, labeled images (CIMG) and synthetic
 * sources, with one deterministic, random-access sample order (docs/data.md).
 *
 * Sample order. A source has W samples per epoch (token windows or images). Global sample index s
 * (the trainer uses s = step * global_batch + position in the batch) maps to epoch e = s / W and to
 * sample perm_e(s % W), where perm_e is a pseudo-random permutation of 0..W-1 that depends only on
 * (seed, e): a keyed Feistel network with cycle walking. It never depends on ranks, on the plan or
 * on what was read before, so any rank can fetch any sample in any order and get the same data;
 * lookups keep no state, so one source may serve several threads.
 *
 * Token samples are windows of seq+1 tokens starting at multiples of seq inside one shard (never
 * across shards). DATA_CLM: inputs = window[0..seq), targets = window[1..seq]. DATA_MLM: the
 * sequence is window[0..seq); about 15% of positions (a hash of seed, s and the position; at least
 * one per sample) get target = the token and input = the mask token vocab-1 (80%), a random token
 * in [0, vocab-1) (10%) or the token itself (10%); other positions get target -1 (ignored) and the
 * token as input. So for MLM vocab-1 is reserved: data tokens must be below vocab-1.
 *
 * Every token read is checked against the model's vocabulary and every image label against its
 * class count; bad files give an err_t naming the file and the problem, never a crash (a file that
 * shrinks while mapped is the exception: it is the caller's to keep shards unchanged). */
#ifndef CEPHALO_DATA_H
#define CEPHALO_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/outputs.h"
#include "formats/tokenizer.h"
#include "planner/arch.h"

typedef enum { DATA_CLM, DATA_MLM } data_task;
/* The task a token model's data is cut for: its architecture's (planner/arch.h's task). */
static inline data_task data_task_of(arch_task t) { return t == TASK_MLM ? DATA_MLM : DATA_CLM; }

typedef struct data_source data_source;

/* ---- llm.c token shards ---- */
/* Version 1 holds uint16 tokens (GPT-2 and any vocabulary up to 65536), version 2 uint32 tokens
 * (larger vocabularies, e.g. Llama-3's 128256), as llm.c writes them; the reader takes both. */
#define DATA_SHARD_MAGIC 20240520
#define DATA_SHARD_VERSION 1
#define DATA_SHARD_VERSION_U32 2
#define DATA_SHARD_HEADER_BYTES 1024 /* 256 little-endian int32 */
#define DATA_SHARD_MAX_TOKENS INT32_MAX
/* The tokenizer's identity in the header slots llm.c leaves zero: h[3] = this marker ("TKID"),
 * h[4] = tok_id_kind, h[5] = vocabulary size, h[6], h[7] = the hash's low and high 32 bits.
 * Without the marker (llm.c's own shards: zeros) the tokenizer is unknown. */
#define DATA_SHARD_TOKID_MARK 0x44494b54

/* The tokenizer identity a shard header records (TOKID_UNKNOWN without one); -1 with a message
 * when the marker is there but the fields are not a valid identity. hdr: the 1024 header bytes. */
int data_shard_tokenizer(const char *name, const void *hdr, tok_id *id, err_t *err);

/* Validates a shard image in memory (header, version, token count against len); name is used in
 * the messages. On success stores the token count. */
int data_shard_check(const char *name, const void *buf, size_t len, int64_t *n_tokens, err_t *err);
/* The same, also giving the version (1: uint16 tokens, 2: uint32). */
int data_shard_check_version(const char *name, const void *buf, size_t len, int64_t *n_tokens, int *version,
                             err_t *err);

/* Writes n uint16 tokens as one shard, atomically (path.tmp, fsync, rename). */
int data_shard_write(const char *path, const uint16_t *tokens, int64_t n, err_t *err);

/* Streaming shard writer (for shards built piece by piece, e.g. `cephalo data`): tokens are
 * appended, close patches the count into the header and renames path.tmp to path. */
typedef struct data_shard_writer data_shard_writer;
data_shard_writer *data_shard_writer_open(const char *path, err_t *err); /* version 1 */
/* version DATA_SHARD_VERSION (uint16 tokens) or DATA_SHARD_VERSION_U32 (uint32 tokens) */
data_shard_writer *data_shard_writer_open_version(const char *path, int version, err_t *err);
int data_shard_writer_add(data_shard_writer *w, const uint16_t *tokens, int64_t n, err_t *err);
/* uint32 tokens; into a version 1 shard each must be below 65536 (else an error naming it). */
int data_shard_writer_add32(data_shard_writer *w, const uint32_t *tokens, int64_t n, err_t *err);
int64_t data_shard_writer_count(const data_shard_writer *w);
/* Records the tokenizer's identity in the header (written at close). */
void data_shard_writer_set_tokenizer(data_shard_writer *w, tok_id id);
/* Also writes a loss mask beside the shard (data_mask_path): every token added after this call
 * comes with a mask byte (data_shard_writer_add32_masked). Call before the first token. A shard
 * closed without one removes a mask an earlier shard of its name left there. */
int data_shard_writer_enable_mask(data_shard_writer *w, err_t *err);
/* uint32 tokens and their mask bytes (0 or 1, see "loss masks" below); the writer must have a mask. */
int data_shard_writer_add32_masked(data_shard_writer *w, const uint32_t *tokens, const uint8_t *mask, int64_t n,
                                   err_t *err);
int data_shard_writer_close(data_shard_writer *w, err_t *err); /* frees w, even on error */
void data_shard_writer_abort(data_shard_writer *w);             /* removes path.tmp, frees w */

/* ---- loss masks (supervised fine-tuning, docs/data.md "Fine-tuning data") ---- */
/* A shard X.bin may have a loss mask X.mask beside it (data_mask_path): a 1024-byte header of 256
 * little-endian int32 (h[0] = DATA_MASK_MAGIC, h[1] = DATA_MASK_VERSION, h[2] = the shard's token
 * count, the rest 0), then one byte per token of the shard: 1 when the token is a target whose
 * loss counts (the loss of predicting it from the tokens before it), 0 when not. A window's
 * target t is token t+1 of the window, so its mask byte is the one of token t+1: the mask is on
 * targets, never on inputs. A source's shards all have masks or none do. */
#define DATA_MASK_MAGIC 0x4b53414d /* "MASK" */
#define DATA_MASK_VERSION 1
/* The mask file of shard `shard`: its name with ".bin" replaced by ".mask" (".mask" appended
 * when it does not end in ".bin"); -1 with a message when it does not fit in n bytes. */
int data_mask_path(const char *shard, char *buf, size_t n, err_t *err);

/* ---- labeled images: CIMG files ---- */
/* Header (little-endian, 64 bytes): "CIMG", u32 version (1), u32 count, u32 channels, u32 height,
 * u32 width, u32 n_classes, zeros up to 64. Then count records: u16 label, channels*height*width
 * u8 pixels in CHW order. */
#define DATA_CIMG_VERSION 1
#define DATA_CIMG_HEADER_BYTES 64
#define DATA_CIMG_MAX_CHANNELS 16
#define DATA_CIMG_MAX_SIDE 65535
#define DATA_CIMG_MAX_CLASSES 65536
#define DATA_CIMG_MAX_PIXELS (1 << 28) /* channels*height*width per image */

typedef struct data_image_info {
    uint32_t count, channels, height, width, n_classes;
} data_image_info;

/* Validates a CIMG file image in memory (header and size; labels are checked on read). */
int data_image_check(const char *name, const void *buf, size_t len, data_image_info *info, err_t *err);
/* Reads and validates the header and size of a CIMG file. */
int data_image_file_info(const char *path, data_image_info *info, err_t *err);

/* Writes info->count images (labels[i], pixels i*C*H*W ..) atomically. */
int data_image_write(const char *path, const data_image_info *info, const uint16_t *labels,
                     const uint8_t *pixels, err_t *err);

/* Streaming image writer: info->count is ignored (close writes the number added). */
typedef struct data_image_writer data_image_writer;
data_image_writer *data_image_writer_open(const char *path, const data_image_info *info, err_t *err);
int data_image_writer_add(data_image_writer *w, uint16_t label, const uint8_t *pixels, err_t *err);
int data_image_writer_close(data_image_writer *w, err_t *err); /* frees w, even on error */
void data_image_writer_abort(data_image_writer *w);

/* Synthetic image s (uint8, CHW, size x size) and its label, from (seed, s) only: oriented stripes
 * whose direction and frequency (and, beyond 32 classes, colour) depend on the class, with a
 * random phase and noise. data_open_synthetic_images serves these, normalised. */
void data_synthetic_image(uint64_t seed, int64_t s, int channels, int size, int n_classes, uint8_t *pixels,
                          int32_t *label);

/* ---- sources ---- */
/* spec: a shard file, a directory (its *.bin shards for the role, sorted by name), a glob pattern ("d/train_*.bin")
 * or a comma-separated list of those. seq >= 1, vocab >= 2 (>= 3 for MLM). */
/* Adds what a data spec names (files, directories and their *.bin files, patterns, comma
 * lists, as data_open_tokens reads them) to s as inputs of opt (common/outputs.h); nothing for
 * "synthetic". */
void data_spec_inputs(out_set *s, const char *opt, const char *spec);

/* What the data is for. A directory's validation shards (data_is_validation_shard) are left out
 * of DATA_TRAIN (with a line saying so) and are all DATA_VALIDATION takes when it has any; named
 * files and patterns are read as named. */
typedef enum { DATA_TRAIN, DATA_VALIDATION } data_role;
bool data_is_validation_shard(const char *name);

int data_open_tokens(data_source **out, const char *spec, data_role role, int seq, int vocab, data_task task,
                     uint64_t seed, err_t *err);
/* Sample s is x_t = (start + stride*t) mod (vocab-1) with start, stride (1..4) and ~2% noise drawn
 * from (seed, s): learnable in context. Unbounded: data_num_samples returns INT64_MAX. */
int data_open_synthetic_tokens(data_source **out, int seq, int vocab, data_task task, uint64_t seed, err_t *err);

/* Errors unless the file's channels, height = width = size and n_classes match the model's. */
int data_open_images(data_source **out, const char *path, int channels, int size, int n_classes, uint64_t seed,
                     err_t *err);
int data_open_synthetic_images(data_source **out, int channels, int size, int n_classes, uint64_t seed, err_t *err);

/* inputs[seq], targets[seq] (-1 = no target, MLM). Error on an image source or s < 0. */
int data_get_tokens(data_source *ds, int64_t s, int32_t *inputs, int32_t *targets, err_t *err);
/* pixels[channels*size*size] = (x/255 - 0.5)/0.5, CHW; *label in [0, n_classes). */
int data_get_image(data_source *ds, int64_t s, float *pixels, int32_t *label, err_t *err);

bool data_is_images(const data_source *ds);
/* Whether the shards have loss masks (then targets outside the mask are -1, as MLM's). */
bool data_has_loss_mask(const data_source *ds);
/* The number of targets (>= 0) sample s has, reading only its mask: for the trainer, which
 * divides a masked step's loss by the targets of the whole global batch. Masked sources only. */
int data_sample_targets(data_source *ds, int64_t s, int64_t *n, err_t *err);
/* The tokenizer the shards record (all agree: data_open_tokens refuses a mix), TOKID_UNKNOWN
 * when none does (llm.c shards, synthetic data); *first (may be NULL) names a shard that records it. */
tok_id data_tokenizer(const data_source *ds, const char **first);
/* Samples per epoch (W); INT64_MAX for synthetic sources. */
int64_t data_num_samples(const data_source *ds);
/* The steps of `epochs` passes over ds at `batch` samples a step: ceil(epochs x W / batch), the
 * last step filled from the next epoch's order (the sample order wraps); 0 for synthetic
 * sources (no epoch). The one rule of `--epochs` and of a job file's `epochs:`. */
int64_t data_epoch_steps(const data_source *ds, long epochs, int64_t batch);
/* The sample (window or image index, 0..W-1) that global sample s reads: perm_{s/W}(s % W);
 * s itself for synthetic sources, -1 for s < 0. */
int64_t data_sample_index(const data_source *ds, int64_t s);
/* One line for logs, e.g. "tokens: 3 shards (d/train_000000.bin .. d/train_000002.bin), 1000000
 * tokens, 975 windows of 1024+1, clm, vocab 50257, seed 1". */
void data_describe(const data_source *ds, char *buf, size_t n);
void data_close(data_source *ds);

#endif
