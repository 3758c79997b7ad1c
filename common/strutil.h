/* strutil.h - small string helpers shared by the planner, worker and operator. */
#ifndef CEPHALO_STRUTIL_H
#define CEPHALO_STRUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* The text of a macro's value: a default shown in a help text from the one constant that sets it. */
#define STR_OF(x) STR_OF_(x)
#define STR_OF_(x) #x

/* Lower-cased name with '-', '_', ' ' and '.' removed: "Tesla-V100_16GB" -> "teslav10016gb". */
void str_normalize(const char *in, char *out, size_t outsz);

/* Levenshtein distance (bytes). */
int str_edit_distance(const char *a, const char *b);

/* Writes up to `max` candidates closest to `name` (by normalized edit distance, only reasonably
 * close ones) as "'a', 'b'" into out; returns how many were written. */
int str_suggest(const char *name, const char *const *candidates, size_t ncand, int max, char *out,
                size_t outsz);

/* Strict number parsing: the whole string must be a number in range. */
bool str_to_long(const char *s, long *out);
bool str_to_double(const char *s, double *out);

/* Sizes in bytes: "1048576", "512K", "512M", "1.5G", "2T", with an optional "iB" or "B" after the
 * suffix ("512MiB", "2GB"); the suffixes are binary (K = 1024). Positive, at most 2^62. */
bool str_to_size(const char *s, int64_t *out);

/* The length (1 to 4) of the UTF-8 character at s (n bytes there), or 0 when the bytes are not
 * one: a stray continuation byte, a sequence cut short, an overlong form, a surrogate, or beyond
 * U+10FFFF. */
int str_utf8_len(const unsigned char *s, size_t n);

/* in as one line of a log into out (n bytes, cut to fit): a line break becomes \n, a carriage
 * return \r, another control byte \xHH, so that text from elsewhere (a pod's termination message,
 * an API server's answer) can neither break a log's one line per entry nor forge a line. */
void str_one_line(const char *in, char *out, size_t n);

/* "1.50 GiB", "812.0 MiB", ... for messages and tables. */
const char *str_bytes(double bytes, char *buf, size_t bufsz);
/* Appends n bytes to the growable buffer *p (len bytes used, cap allocated), doubling it as
 * needed and keeping a NUL after the data (HTTP bodies, stream lines). */
void str_append(char **p, size_t *len, size_t *cap, const void *data, size_t n);
/* ... formatted text (generated YAML, JSON, argv): text with no bound grows, it is never cut. */
void str_appendf(char **p, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* A fresh formatted string (the caller frees it), for a path or name of any length. */
char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* snprintf into a fixed buffer that refuses to cut: 0 when the whole text fit, else -1 with err
 * (when not NULL) naming WHAT, the start of the text and the buffer's limit: "checkpoint path
 * 'runs/abc...' is too long (at most 4095 characters)". A cut path names another file and a cut name
 * another object, so every fixed buffer that holds text from input goes through here, unless its
 * size makes a cut impossible (a comment then says why). */
int str_fmt(char *buf, size_t n, err_t *err, const char *what, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* path in its shortest lexical form (as Go's filepath.Clean): repeated '/', "." components and
 * "dir/.." pairs go, a trailing '/' too; "" becomes ".". "runs/x/./" -> "runs/x", "hf/" -> "hf",
 * "a/b/.." -> "a", "../x/.." -> "..", "/.." -> "/". Symbolic links are not looked at ("link/.."
 * is taken as "."). A fresh string; the caller frees it. */
char *str_path_clean(const char *path);

/* The name a path gives what it names (a model directory, a run): the last component of its
 * clean form ("hf/" and "hf/." -> "hf", "a/b/.." -> "a"); where the spelling has none (".",
 * "..", "/"), the last component of the clean form resolved, when it exists ("." in /src/gpt2 ->
 * "gpt2"), else "" (the root too). A fresh string; the caller frees it. */
char *str_path_name(const char *path);

/* Whether s ends in suffix (a file name's extension: ".bin"). */
bool str_ends_with(const char *s, const char *suffix);

#endif
