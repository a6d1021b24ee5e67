/* Sums of squares that no order can change: each square scaled by a power of 2 and rounded to
 * an integer, the integers added in 128 bits, exactly, so threads and slicing cannot matter. */
#include "meshtrain/kernels.h"

#include <math.h>

float mt_max_abs(const float *x, long n)
{
    float most = 0.0f;
    int nan = 0;
#pragma omp parallel for simd reduction(max : most) reduction(| : nan) schedule(static)
    for (long i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        nan |= a != a;
        most = a > most ? a : most;
    }
    return nan ? NAN : most;
}

void mt_sum_squares_fixed(const float *x, long n, int shift, uint64_t sum[2])
{
    unsigned __int128 total = (unsigned __int128)sum[1] << 64 | sum[0];
#pragma omp parallel
    {
        unsigned __int128 mine = 0;
#pragma omp for schedule(static)
        for (long i = 0; i < n; i++) {
            /* a float's square is exact in double, and so is its scaling by 2^shift */
            double square = ldexp((double)x[i] * (double)x[i], shift);
            mine += (uint64_t)nearbyint(square);
        }
#pragma omp critical
        total += mine; /* integer addition: the threads' order does not matter */
    }
    sum[0] = (uint64_t)total;
    sum[1] = (uint64_t)(total >> 64);
}
