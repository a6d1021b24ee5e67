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

#endif
