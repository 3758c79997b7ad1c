/* clock.c - the monotonic clock. */
#include "common/clock.h"

#include <time.h>

double clock_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double clock_now_ms(void) { return clock_now_s() * 1e3; }
