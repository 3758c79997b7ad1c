/* json_util.h - loading JSON documents with cJSON, plus typed getters whose errors name the file
 * and the JSON path of the offending value.
 *
 *   cJSON *root = json_load_file("profile.json", &err);   // or json_parse()
 *   json_ctx c = {"profile.json", &err};
 *   const cJSON *seq;
 *   long s;
 *   if (json_require(&c, entry, "entries[2]", "seq", &seq) < 0 ||
 *       json_int(&c, seq, "entries[2].seq", 1, 1048576, &s) < 0) ...
 *   cJSON_Delete(root);
 *
 * Syntax errors read "FILE:LINE:COL: JSON syntax error near '...'"; value errors read
 * "FILE: PATH: expected ..., got ..." (cJSON keeps no line numbers, the path locates the value).
 * Every getter returns 0, or -1 with the error set; none of them crashes on a NULL item. */
#ifndef CEPHALO_JSON_UTIL_H
#define CEPHALO_JSON_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/err.h"

/* Files larger than this are refused before parsing. */
#define JSON_MAX_FILE ((size_t)256 << 20)

/* What the getters need to write an error: the file name used in messages. */
typedef struct json_ctx {
    const char *file;
    err_t *err;
} json_ctx;

/* Whether a json_number() range includes its bounds: [lo, hi] or (lo, hi). */
typedef enum { JSON_CLOSED, JSON_OPEN } json_bounds;

/* Parse a whole document (trailing content other than whitespace is an error). `name` is used in
 * messages. An object with a key twice, at any depth, is refused ("NAME: PATH: field 'k' appears
 * twice"): cJSON keeps both members and json_get() would pick the first, where Python's json and
 * Rust's serde pick the last, so two readers would read two documents. Every JSON the project
 * reads (files, JSONL lines, metadata, API bodies) comes through here: one rule for all of it.
 * Free the result with cJSON_Delete(). NULL with the error set on failure. */
cJSON *json_parse(const char *name, const char *text, size_t len, err_t *err);
cJSON *json_load_file(const char *path, err_t *err);

/* "an object", "an array", "a string", "a number", "a boolean", "null" (or "nothing"). */
const char *json_type_name(const cJSON *item);

/* An optional member (exact key); NULL when absent or when `obj` is not an object. */
const cJSON *json_get(const cJSON *obj, const char *key);
/* A required member: "FILE: PATH: missing field 'key'" when absent. */
int json_require(const json_ctx *c, const cJSON *obj, const char *path, const char *key,
                 const cJSON **out);

/* Refuses members not in `allowed` (NULL-terminated), suggesting the nearest allowed key, and
 * keys that appear twice (json_parse refuses those already; a tree built in code may have them). */
int json_check_keys(const json_ctx *c, const cJSON *obj, const char *path,
                    const char *const *allowed);

int json_expect_object(const json_ctx *c, const cJSON *item, const char *path);
/* An array; its length goes to *n (may be NULL). */
int json_expect_array(const json_ctx *c, const cJSON *item, const char *path, int *n);

/* A finite number in [lo, hi] (JSON_CLOSED) or (lo, hi) (JSON_OPEN); a side without a bound
 * takes -INFINITY or INFINITY. */
int json_number(const json_ctx *c, const cJSON *item, const char *path, double lo, double hi,
                json_bounds bounds, double *out);
/* An integral number in [lo, hi] ("3.0" passes, "3.5" does not). */
int json_int(const json_ctx *c, const cJSON *item, const char *path, long lo, long hi,
             long *out);
/* A non-empty string. The pointer lives as long as the document. */
int json_string(const json_ctx *c, const cJSON *item, const char *path, const char **out);
/* A string equal to one of `choices` (NULL-terminated); its index goes to *index. */
int json_enum(const json_ctx *c, const cJSON *item, const char *path, const char *const *choices,
              int *index);
int json_bool(const json_ctx *c, const cJSON *item, const char *path, bool *out);

/* A JSON string of len bytes of text, for text that may hold NULs (a prompt, generated text):
 * cJSON keeps strings as C strings, which a NUL would cut short, so this is a raw item holding the
 * quoted string, NULs written \u0000 and every byte that is not UTF-8 replaced by U+FFFD (JSON
 * text is UTF-8). Add it with cJSON_AddItemToObject. */
cJSON *json_text(const char *s, size_t len);

/* The double whose shortest decimal form reads back as f (1e-5f gives 1e-05, not the exact
 * 9.99999974737875e-06 a float widened to double prints as): what JSON should say of a float. */
double json_float_decimal(float f);

#endif
