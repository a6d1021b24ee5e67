/* Central finite differences for fp32 kernels: perturb sampled elements of an input and
 * compare (L(x+h) - L(x-h)) / 2h with the analytic gradient, by norm over the samples. */
#ifndef MESHTRAIN_TEST_GRADCHECK_H
#define MESHTRAIN_TEST_GRADCHECK_H

#include <math.h>
#include <stdio.h>

#include "meshtrain/rng.h"

typedef double (*objective_fn)(void *ctx);

enum { GRADCHECK_SAMPLES = 32 };

/* Relative error |fd - analytic| / |analytic| over up to GRADCHECK_SAMPLES elements of x
 * (all of them when x is small). When the analytic gradient is ~0 the absolute error is
 * returned instead, so a gradient that should vanish is checked too. */
static inline double gradcheck(const char *what, float *x, const float *analytic, long n,
                               objective_fn objective, void *ctx, float h)
{
    double diff = 0, norm = 0;
    long samples = n < GRADCHECK_SAMPLES ? n : GRADCHECK_SAMPLES;
    mt_rng rng = {99, mt_name_hash(what)};
    for (long k = 0; k < samples; k++) {
        long i = n <= GRADCHECK_SAMPLES ? k : (long)(mt_rng_u64(rng, (uint64_t)k) % (uint64_t)n);
        float saved = x[i];
        x[i] = saved + h;
        double plus = objective(ctx);
        x[i] = saved - h;
        double minus = objective(ctx);
        x[i] = saved;
        double fd = (plus - minus) / (2.0 * h);
        diff += (fd - analytic[i]) * (fd - analytic[i]);
        norm += (double)analytic[i] * analytic[i];
    }
    double error = norm > 1e-12 ? sqrt(diff / norm) : sqrt(diff);
    printf("  %-34s %s error %.3e\n", what, norm > 1e-12 ? "relative" : "absolute", error);
    return error;
}

/* Fills x with normal(mean, std) values keyed by a name. */
static inline void fill_normal(float *x, long n, const char *name, double mean, double std)
{
    mt_rng rng = {2024, mt_name_hash(name)};
    for (long i = 0; i < n; i++)
        x[i] = (float)(mean + std * mt_rng_normal(rng, (uint64_t)i));
}

#endif
