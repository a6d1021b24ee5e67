/* The one clock meshtrain times with: monotonic seconds, for step times, throughput and
 * benchmarks (never wall-clock time, which jumps). */
#ifndef MESHTRAIN_CLOCK_H
#define MESHTRAIN_CLOCK_H

#include <time.h>

static inline double mt_clock_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sleeps about `seconds` (a poll loop's pause; a signal may end it early). */
static inline void mt_clock_nap(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

#endif
