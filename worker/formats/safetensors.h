/* safetensors.h - reading and writing safetensors files (the Hugging Face tensor file format),
 * the on-disk format of the worker's checkpoints. docs/checkpoints.md describes the format rules
 * and every check made on load.
 *
 * Writing (the data is referenced, not copied: keep it alive and unchanged until the save):
 *
 *   st_writer *w = st_writer_new();
 *   st_writer_add(w, "wte", ST_F32, 2, (int64_t[]){vocab, d}, wte);
 *   st_writer_meta(w, "cephalo.step", "1200");
 *   if (st_writer_save(w, "ckpt/step-1200.safetensors", 0, &err) < 0) ...   // atomic
 *   st_writer_free(w);
 *
 * Reading (the file is mapped read-only and validated in full before st_open returns):
 *
 *   st_file *f;
 *   if (st_open(&f, path, &err) < 0) ...
 *   const void *wte;
 *   if (st_expect(f, "wte", ST_F32, 2, (int64_t[]){vocab, d}, &wte, &err) < 0) ...
 *   st_close(f);   // tensor pointers and names die here
 *
 * The writer adds the metadata entry "cephalo.crc32", a CRC-32 of the whole data buffer; the
 * reader verifies it when present, so a flipped byte is an error instead of a silently different
 * model. Files written by other tools (no such entry) load too.
 *
 * Tensor data is little-endian and row-major; this code assumes a little-endian host. Functions
 * that can fail return 0, or -1 with an err_t message that names the file (and the tensor, where
 * one is at fault). */
#ifndef CEPHALO_SAFETENSORS_H
#define CEPHALO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Most dimensions a tensor may have. */
#define ST_MAX_DIMS 8
/* Largest header accepted on load (the reference implementation's limit). */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* The metadata key holding the CRC-32 of the data buffer (8 lowercase hex digits). */
#define ST_CRC_KEY "cephalo.crc32"

/* Element types with a whole number of bytes; the file spells them as st_dtype_name() does. */
typedef enum {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_I64,
    ST_U64,
    ST_F64,
    ST_NDTYPES
} st_dtype;

/* Bytes per element (1, 2, 4 or 8), and the name used in files ("F32", "BF16", ...). */
size_t st_dtype_size(st_dtype dtype);
const char *st_dtype_name(st_dtype dtype);
/* The dtype spelled `name` (exact, case-sensitive); -1 when there is none. */
int st_dtype_parse(const char *name);

/* CRC-32 (IEEE 802.3, polynomial 0xEDB88320, as zlib's crc32()). Pass 0 to start, and the
 * previous result to continue: st_crc32(st_crc32(0, a, n), b, m) == CRC of a followed by b. */
uint32_t st_crc32(uint32_t crc, const void *buf, size_t len);

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct st_writer st_writer;

st_writer *st_writer_new(void);

/* Adds a tensor of shape[0] x ... x shape[ndim-1] elements (ndim 0..ST_MAX_DIMS; ndim 0 is a
 * scalar with one element) whose bytes start at `data` (may be NULL only when the tensor has no
 * elements). The name and shape are copied; `data` is only referenced, and read by
 * st_writer_save(), so a checkpoint is never held twice in memory. Mistakes (a duplicate name, a
 * negative dimension, too many dimensions, a name that is not UTF-8 or is "__metadata__") are
 * remembered and reported by st_writer_save(). */
void st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape,
                   const void *data);

/* Adds a metadata entry (both strings copied; UTF-8). A key given twice, or ST_CRC_KEY (the
 * writer sets that itself), is reported by st_writer_save(). */
void st_writer_meta(st_writer *w, const char *key, const char *value);

/* Writes the file atomically: the bytes go to "<path>.tmp.<pid>" in the same directory, which is
 * fsync'ed and renamed over `path`, and then the directory is fsync'ed. On failure the temporary
 * file is removed, a file already at `path` is left as it was, and the message names the path and
 * the system error. The header lists the metadata first, then the tensors in the order of the
 * data buffer: by descending element size, and in the order added within one size, so each
 * tensor's bytes start at a multiple of its element size (the header is padded with spaces to a
 * multiple of 8 bytes). The writer may be saved again, or added to and saved again. */
int st_writer_save(st_writer *w, const char *path, int flags, err_t *err);

void st_writer_free(st_writer *w);

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct st_tensor {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS]; /* shape[ndim..] are 0 */
    const void *data; /* nbytes bytes inside the file's buffer; NULL-safe to read when nbytes 0 */
    size_t nbytes; /* product(shape) * st_dtype_size(dtype) */
} st_tensor;

typedef struct st_file st_file;

/* Maps the file read-only and validates it (st_parse). On failure *out is NULL. The mapping
 * lives until st_close(); the file must not be truncated meanwhile. */
int st_open(st_file **out, const char *path, err_t *err);

/* Parses and validates a whole safetensors file held in memory; `label` names it in messages.
 * Nothing is copied out of `buf`: it must outlive the st_file. On failure *out is NULL. */
int st_parse(st_file **out, const void *buf, size_t len, const char *label, err_t *err);

/* An st_file over tensors another format's reader found (formats/torchbin.h): the tensors are
 * copied (names too), their data pointers kept; the st_file takes `map` (munmap'ed on close,
 * may be NULL) and the malloc'ed `owned` array and its buffers (freed on close), also on
 * failure. A name given twice is an error naming `label`. */
int st_from_tensors(st_file **out, const char *label, const st_tensor *t, int n, void *map, size_t map_len,
                    void **owned, int n_owned, err_t *err);
/* The tensors in data-buffer order (ascending offsets), 0 <= i < st_count(). */
int st_count(const st_file *f);
const st_tensor *st_tensor_at(const st_file *f, int i);
/* The tensor named `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* A metadata value, or NULL when the file has no such key. */
const char *st_meta(const st_file *f, const char *key);
/* The label given to st_parse() (the path for st_open()). */
const char *st_label(const st_file *f);

/* Requires tensor `name` with exactly this dtype and shape; its data goes to *data (may be
 * NULL). Errors name the file, the tensor, and what was expected and found. Data pointers are
 * aligned to the element size when the file was written by st_writer (or any writer that lays
 * tensors out by descending element size with a header padded to 8 bytes) and the buffer is
 * 8-byte aligned (as a mapping is); for other files, copy with memcpy. */
int st_expect(const st_file *f, const char *name, st_dtype dtype, int ndim, const int64_t *shape,
              const void **data, err_t *err);

/* Unmaps or forgets the buffer and frees everything; NULL is fine. */
void st_close(st_file *f);

#endif
