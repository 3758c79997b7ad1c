/* strutil.h - small string helpers shared by the planner, worker and operator. */
#ifndef CEPHALO_STRUTIL_H
#define CEPHALO_STRUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* "1.50 GiB", "812.0 MiB", ... for messages and tables. */
const char *str_bytes(double bytes, char *buf, size_t bufsz);
/* Appends n bytes to the growable buffer *p (len bytes used, cap allocated), doubling it as
 * needed and keeping a NUL after the data (HTTP bodies, stream lines). */
void str_append(char **p, size_t *len, size_t *cap, const void *data, size_t n);

#endif
