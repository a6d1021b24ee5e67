/* Unit tests of the trainer's prefetch queue: batches in order, skipped and repeated keys,
 * an error carried to the batch it stopped at, and a stop while the thread waits for room. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "meshtrain/status.h"
#include "train/prefetch.h"

enum { TOKENS = 64 };

typedef struct source {
    atomic_int calls;
    int64_t fail_at; /* -1: never */
} source;

/* Batch `key`: token i is key * 1000 + i, targets its negation. */
static mt_status draw(const void *context, uint64_t key, int32_t *inputs, int32_t *targets)
{
    source *s = (source *)context;
    atomic_fetch_add(&s->calls, 1);
    if (s->fail_at >= 0 && key == (uint64_t)s->fail_at)
        return mt_fail(MT_EFORMAT, "bad batch %llu", (unsigned long long)key);
    for (int i = 0; i < TOKENS; i++) {
        inputs[i] = (int32_t)(key * 1000 + (uint64_t)i);
        targets[i] = -inputs[i];
    }
    return MT_OK;
}

static int is_batch(const int32_t *inputs, const int32_t *targets, uint64_t key)
{
    for (int i = 0; i < TOKENS; i++)
        if (inputs[i] != (int32_t)(key * 1000 + (uint64_t)i) || targets[i] != -inputs[i])
            return 0;
    return 1;
}

static void test_order(void)
{
    source s = {.fail_at = -1};
    trainer_prefetch *p;
    CHECK(trainer_prefetch_start(&p, 4, TOKENS, 10, 200, draw, &s) == MT_OK);
    int32_t in[TOKENS], tg[TOKENS];
    int good = 1;
    for (uint64_t key = 10; key < 100; key++)
        good &= trainer_prefetch_take(p, key, in, tg) == MT_OK && is_batch(in, tg, key);
    CHECK_MSG(good, "batches taken in order differ from draw's");
    /* skipped keys are dropped; a key behind the thread and one past its end are drawn here */
    const uint64_t keys[] = {105, 106, 103, 150, 151, 7, 250, 199};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        CHECK_MSG(trainer_prefetch_take(p, keys[k], in, tg) == MT_OK && is_batch(in, tg, keys[k]),
                  "key %llu", (unsigned long long)keys[k]);
    trainer_prefetch_stop(p);
}

static void test_error(void)
{
    source s = {.fail_at = 5};
    trainer_prefetch *p;
    CHECK(trainer_prefetch_start(&p, 3, TOKENS, 0, 100, draw, &s) == MT_OK);
    int32_t in[TOKENS], tg[TOKENS];
    for (uint64_t key = 0; key < 5; key++)
        CHECK(trainer_prefetch_take(p, key, in, tg) == MT_OK && is_batch(in, tg, key));
    CHECK(trainer_prefetch_take(p, 5, in, tg) == MT_EFORMAT);
    CHECK_MSG(strstr(mt_last_error(), "bad batch 5") != NULL, "message: '%s'", mt_last_error());
    /* the thread stopped at the error; later keys are drawn here */
    CHECK(trainer_prefetch_take(p, 6, in, tg) == MT_OK && is_batch(in, tg, 6));
    trainer_prefetch_stop(p);
}

/* A run that fails before taking anything: the thread waits for room and must still stop. */
static void test_stop_full(void)
{
    for (int round = 0; round < 50; round++) {
        source s = {.fail_at = -1};
        trainer_prefetch *p;
        CHECK(trainer_prefetch_start(&p, 2, TOKENS, 0, 1000000, draw, &s) == MT_OK);
        trainer_prefetch_stop(p);
        CHECK(atomic_load(&s.calls) <= 2);
    }
    trainer_prefetch_stop(NULL);
}

int main(void)
{
    test_order();
    test_error();
    test_stop_full();
    return check_summary("test_prefetch");
}
