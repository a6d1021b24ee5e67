/* f32 collectives that travel as bf16 (mt_comm_*_wire) on whichever back end the environment
 * picks, at group sizes 1..N: bitwise the sum of every rank's rounded input, and within the
 * (N + 1) 2^-8 bound of the f32 reduction, so no rounded partial sum went from hop to hop. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_harness.h"
#include "meshtrain/comm.h"

/* Large enough that tcp takes its rings for f32 (above 64 KiB), uneven across ranks. */
static const size_t COUNTS[] = {0, 1, 7, 1000, 70001};
enum { N_COUNTS = sizeof COUNTS / sizeof COUNTS[0], MAX_RANKS = 4 };

static int rank, size;

/* Element i of rank r's input: every rank computes every rank's. Positive values (salt even)
 * make the f32 sum the scale of the relative bound; mixed signs (salt odd) cancel. The
 * mantissa is full, so rounding to bf16 always loses bits. */
static float value_of(int r, size_t i, int salt)
{
    uint64_t h = ((uint64_t)r * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ull) ^
                 ((uint64_t)salt * 0x94d049bb133111ebull);
    h ^= h >> 31;
    h *= 0xd6e9f8cc2ab5f1dbull;
    h ^= h >> 29;
    float unit = (float)((h >> 40) & 0xffffff) / (float)(1 << 24); /* [0, 1) */
    float scale = ldexpf(1.0f, (int)(h & 15) - 8);
    float v = (0.5f + unit) * scale;
    return (salt & 1) && (h & 16) ? -v : v;
}

static float bf16(float x) { return mt_bf16_to_f32(mt_bf16_from_f32(x)); }

/* The sum over ranks of element i (counted over the whole input), each input rounded, summed
 * in f32 in rank order: what every back end must produce bitwise. Also the exact sum and the
 * largest input magnitude, for the bound. */
static float expected(size_t i, int salt, double *exact, double *largest)
{
    float sum = 0;
    *exact = 0, *largest = 0;
    for (int r = 0; r < size; r++) {
        float x = value_of(r, i, salt);
        sum = r ? sum + bf16(x) : bf16(x);
        *exact += x;
        *largest = fmax(*largest, fabs(x));
    }
    return sum;
}

static int bound_failures;

/* |got - exact| <= (N + 1) 2^-8 max(|exact|, max_r |x_r|): relative to the sum when it does
 * not cancel. */
static void check_bound(double got, double exact, double largest)
{
    double scale = fmax(fabs(exact), largest);
    if (fabs(got - exact) > (size + 1) * ldexp(scale, -8))
        bound_failures++;
}

static void fill(float *buf, size_t n, int salt)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = value_of(rank, i, salt);
}

static void case_allreduce(mt_comm *c, float *send, float *recv, size_t n, int salt, int inplace)
{
    fill(send, n, salt);
    float *out = inplace ? send : recv;
    CHECK_MSG(mt_comm_allreduce_wire(c, send, out, n, MT_SUM, MT_BF16) == MT_OK, "%s",
              mt_last_error());
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double exact, largest;
        float want = bf16(expected(i, salt, &exact, &largest));
        wrong += memcmp(&out[i], &want, sizeof want) != 0;
        check_bound(out[i], exact, largest);
    }
    CHECK_MSG(wrong == 0, "all-reduce of %zu (%s place, salt %d): %zu elements differ", n,
              inplace ? "in" : "out of", salt, wrong);
}

static void case_reduce_scatter(mt_comm *c, float *send, float *recv, size_t n, int salt,
                                int average)
{
    size_t counts[MAX_RANKS], first = 0, total = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = n + (size_t)(r % 2); /* uneven blocks */
        if (r < rank)
            first += counts[r];
        total += counts[r];
    }
    fill(send, total, salt);
    mt_redop op = average ? MT_AVG : MT_SUM;
    CHECK_MSG(mt_comm_reduce_scatterv_wire(c, send, recv, counts, op, MT_BF16) == MT_OK, "%s",
              mt_last_error());
    size_t wrong = 0;
    for (size_t j = 0; j < counts[rank]; j++) {
        double exact, largest;
        float want = expected(first + j, salt, &exact, &largest);
        if (average)
            want /= (float)size, exact /= size, largest /= size;
        wrong += memcmp(&recv[j], &want, sizeof want) != 0;
        check_bound(recv[j], exact, largest);
    }
    CHECK_MSG(wrong == 0, "reduce-scatter of %zu (%s, salt %d): %zu elements differ", n,
              average ? "avg" : "sum", salt, wrong);
}

static void case_allgather(mt_comm *c, float *send, float *recv, size_t n, int salt)
{
    size_t counts[MAX_RANKS];
    for (int r = 0; r < size; r++)
        counts[r] = n + (size_t)(r % 2);
    float *mine = send;
    for (size_t j = 0; j < counts[rank]; j++)
        mine[j] = value_of(rank, j, salt);
    CHECK_MSG(mt_comm_allgatherv_wire(c, mine, recv, counts, MT_BF16) == MT_OK, "%s",
              mt_last_error());
    size_t wrong = 0, at = 0;
    for (int r = 0; r < size; r++)
        for (size_t j = 0; j < counts[r]; j++, at++) {
            float want = bf16(value_of(r, j, salt));
            wrong += memcmp(&recv[at], &want, sizeof want) != 0;
        }
    CHECK_MSG(wrong == 0, "all-gather of %zu (salt %d): %zu elements differ", n, salt, wrong);
}

static int worker(void)
{
    mt_comm *c;
    harness_pretend_hosts();
    if (mt_comm_create(NULL, &c)) {
        fprintf(stderr, "rank %d: %s\n", harness_rank(), mt_last_error());
        return 1;
    }
    rank = mt_comm_rank(c);
    size = mt_comm_size(c);
    size_t most = (COUNTS[N_COUNTS - 1] + 1) * (size_t)size;
    float *send = malloc(most * sizeof *send), *recv = malloc(most * sizeof *recv);
    CHECK(send && recv);
    int salt = 0;
    for (int k = 0; send && recv && k < N_COUNTS; k++)
        for (int sign = 0; sign < 2; sign++) {
            size_t n = COUNTS[k];
            salt = 2 * (salt / 2 + 1) + sign;
            case_allreduce(c, send, recv, n, salt, 0);
            case_allreduce(c, send, recv, n, salt, 1);
            case_reduce_scatter(c, send, recv, n, salt, 0);
            case_reduce_scatter(c, send, recv, n, salt, 1);
            case_allgather(c, send, recv, n, salt);
        }
    CHECK_MSG(bound_failures == 0, "%d elements beyond (N + 1) 2^-8 of the f32 sum",
              bound_failures);
    /* What cannot travel as bf16 is refused and leaves the group usable. */
    float one = 1, out;
    CHECK(mt_comm_allreduce_wire(c, &one, &out, 1, MT_MAX, MT_BF16) == MT_EINVAL);
    CHECK(mt_comm_allreduce_wire(c, &one, &out, 1, MT_SUM, MT_I32) == MT_EINVAL);
    CHECK(mt_comm_allreduce_wire(c, &one, &out, 1, MT_SUM, MT_F32) == MT_OK && out == size);
    free(send);
    free(recv);
    mt_comm_destroy(c);
    if (check_failures)
        fprintf(stderr, "rank %d of %d: %d of %d checks failed\n", rank, size, check_failures,
                check_count);
    return check_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (harness_is_rank())
        return worker();
    int first = argc > 1 ? atoi(argv[1]) : 1, last = argc > 2 ? atoi(argv[2]) : MAX_RANKS;
    for (int n = first; n <= last; n++) {
        mt_launch_result result;
        mt_status st = harness_launch(n, "wire", 5.0, &result);
        CHECK_MSG(st == MT_OK, "%d ranks: %s", n, mt_last_error());
        printf("group of %d: %s\n", n, st == MT_OK ? "ok" : "FAILED");
        fflush(stdout);
    }
    return check_summary("test_comm_wire");
}
