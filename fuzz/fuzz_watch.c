/* fuzz_watch.c - libFuzzer target for the watch-stream parser (operator/client/watch.c): the input is a
 * watch response body fed in pieces whose sizes come from the input itself, so partial lines
 * across pieces, truncation at the end and overlong lines (the limit is small here) all occur. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "operator/client/watch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touches what a real handler would read, so ASan sees any bad pointer in the event. */
static int on_event(watch_event *ev, void *arg, err_t *err) {
    (void)err;
    size_t *sum = arg;
    *sum += strlen(watch_type_name(ev->type));
    if (ev->resource_version) *sum += strlen(ev->resource_version);
    if (ev->message) *sum += strlen(ev->message);
    char *s = cJSON_PrintUnformatted(ev->object);
    if (s) *sum += strlen(s);
    cJSON_free(s);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    /* first byte: piece size 1..64 (0: the whole rest at once) */
    size_t piece = data[0] & 63;
    data++, size--;
    size_t sum = 0;
    watch_parser p;
    watch_parser_init(&p, 4096, on_event, &sum);
    err_t err;
    int rc = 0;
    for (size_t off = 0; off < size && rc == 0;) {
        size_t n = piece ? piece : size;
        if (n > size - off) n = size - off;
        rc = watch_parser_feed(&p, (const char *)data + off, n, &err);
        off += n;
    }
    if (rc == 0) watch_parser_finish(&p, &err);
    watch_parser_free(&p);
    return 0;
}
