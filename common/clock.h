/* clock.h - the monotonic clock, for durations and deadlines (never wall time). */
#ifndef CEPHALO_CLOCK_H
#define CEPHALO_CLOCK_H

/* Seconds / milliseconds on CLOCK_MONOTONIC since an arbitrary start. */
double clock_now_s(void);
double clock_now_ms(void);

#endif
