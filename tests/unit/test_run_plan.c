/* The run plan's refusals: every rule between keys broken once, each refused with a message
 * naming the keys a user set, where lower layers speak only of their own terms. */
#include "check.h"
#include "meshtrain/config.h"
#include "meshtrain/run_plan.h"

/* Resolves the defaults with `settings` (key, value pairs, NULL-terminated) on `world` ranks. */
static void refused(int world, const char *message, const char *const *settings)
{
    mt_config c;
    mt_config_defaults(&c);
    for (int i = 0; settings[i]; i += 2)
        CHECK_MSG(mt_config_set(&c, settings[i], settings[i + 1], "test") == MT_OK, "%s: %s",
                  settings[i], mt_last_error());
    mt_run_plan plan;
    mt_status st = mt_run_plan_resolve(&c, world, &plan);
    CHECK_MSG(st == MT_EINVAL && check_contains(mt_last_error(), message),
              "status %d, message '%s', want '%s'", (int)st, mt_last_error(), message);
}

#define REFUSED(world, message, ...)                                                               \
    refused(world, message, (const char *const[]){__VA_ARGS__, NULL})

int main(void)
{
    mt_config c;
    mt_config_defaults(&c);
    mt_run_plan plan;
    CHECK_MSG(mt_run_plan_resolve(&c, 1, &plan) == MT_OK, "defaults: %s", mt_last_error());
    mt_run_plan_free(&plan);

    REFUSED(2,
            "config keys 'microbatches' and 'pp': 1 micro-batches cannot fill 2 pipeline "
            "stages (the schedule needs at least pp)",
            "pp", "2", "microbatches", "1", "batch", "8", "layers", "2");
    REFUSED(4,
            "config keys 'microbatches' and 'pp': interleaved needs micro-batches a multiple "
            "of pp, got 6 micro-batches for pp 4",
            "pp", "4", "microbatches", "6", "batch", "12", "layers", "8", "schedule", "interleaved",
            "chunks", "2");
    REFUSED(2, "config key 'layers': 2 layers cannot be cut into pp 2 x chunks 2 = 4 model chunks",
            "pp", "2", "microbatches", "2", "batch", "8", "layers", "2", "schedule", "interleaved",
            "chunks", "2");
    REFUSED(2,
            "config keys 'chunks' and 'schedule': 2 model chunks per stage need the interleaved "
            "schedule, not 1f1b",
            "pp", "2", "microbatches", "2", "batch", "8", "layers", "2", "schedule", "1f1b",
            "chunks", "2");
    REFUSED(1, "config key 'recompute': 'most' is not none, selective or full", "recompute",
            "most");
    REFUSED(2,
            "config keys 'zero3_keep_params' and 'zero': keeping gathered parameters is a ZeRO 3 "
            "setting, and zero is 2",
            "zero", "2", "zero3_keep_params", "on");
    for (int zero = 2; zero <= 3; zero++)
        REFUSED(4, "config keys 'zero' and 'schedule': ZeRO", "pp", "2", "microbatches", "4",
                "batch", "8", "layers", "2", "schedule", "zb1", "zero", zero == 2 ? "2" : "3");
    REFUSED(4, "config keys 'zero_shard_size' and 'dp': shard groups of 3 data-parallel ranks "
               "do not divide dp 4", "zero", "1", "zero_shard_size", "3");
    REFUSED(4, "config keys 'zero_shard_size' and 'dp': shard groups of 8 data-parallel ranks "
               "do not divide dp 2", "zero", "3", "zero_shard_size", "8", "tp", "2");
    REFUSED(4, "config keys 'zero_shard_size' and 'zero': shard groups of 2 ranks shard ZeRO "
               "1-3 state, and zero 0 shards none", "zero_shard_size", "2");
    REFUSED(4, "config keys 'zero_shard_size' and 'grad_comm': hybrid sharding reduces "
               "gradients with plain collectives, and grad_comm is powersgd",
            "zero", "1", "zero_shard_size", "2", "grad_comm", "powersgd");
    REFUSED(4, "config keys 'offload' and 'zero_shard_size': offloaded parameters",
            "zero", "3", "zero_shard_size", "2", "offload", "params");
    /* the whole dp group, or dp 1's one rank, is plain ZeRO (or DDP): accepted */
    const char *whole[][4] = {{"zero", "0", "zero_shard_size", "4"},
                              {"zero", "2", "zero_shard_size", "4"},
                              {"zero", "1", "zero_shard_size", "1"}};
    for (int i = 0; i < 3; i++) {
        mt_config_defaults(&c);
        for (int k = 0; k < 4; k += 2)
            mt_config_set(&c, whole[i][k], whole[i][k + 1], "test");
        CHECK_MSG(mt_run_plan_resolve(&c, i == 2 ? 1 : 4, &plan) == MT_OK, "%s %s: %s",
                  whole[i][1], whole[i][3], mt_last_error());
        mt_run_plan_free(&plan);
    }
    /* --deterministic on: the layouts it cannot make bitwise, each saying why */
    REFUSED(3, "config keys 'deterministic' and 'dp': dp 3 is not a power of 2", "deterministic",
            "on", "batch", "12");
    REFUSED(1, "config keys 'deterministic' and 'microbatches': 3 micro-batches is not a power "
               "of 2", "deterministic", "on", "batch", "12", "microbatches", "3");
    REFUSED(2, "config keys 'deterministic' and 'pp', 'schedule': the zb1 schedule splits",
            "deterministic", "on", "pp", "2", "microbatches", "2", "layers", "2", "schedule",
            "zb1");
    REFUSED(2, "config keys 'deterministic' and 'grad_comm'", "deterministic", "on", "grad_comm",
            "powersgd");
    REFUSED(2, "config keys 'deterministic' and 'local_steps', 'outer_optimizer'",
            "deterministic", "on", "local_steps", "4");
    REFUSED(4, "config keys 'deterministic' and 'zero_shard_size'", "deterministic", "on",
            "zero", "1", "zero_shard_size", "2");
    REFUSED(2, "config keys 'deterministic' and 'grad_reduce'", "deterministic", "on",
            "grad_reduce", "bf16");
    REFUSED(2, "config keys 'offload' and 'precision': offloaded parameters", "zero", "3",
            "offload", "params", "precision", "bf16");
    REFUSED(2, "config keys 'deterministic' and 'offload'", "deterministic", "on", "offload",
            "optimizer");
    /* the groups: the largest power of 2 dividing the batch (24: 8 groups of 3 sequences),
     * one pass per group, dp x microbatches cutting them into whole subtrees */
    mt_config_defaults(&c);
    CHECK(mt_config_set(&c, "deterministic", "on", "test") == MT_OK);
    CHECK(mt_config_set(&c, "batch", "24", "test") == MT_OK);
    CHECK(mt_config_set(&c, "microbatches", "2", "test") == MT_OK);
    CHECK_MSG(mt_run_plan_resolve(&c, 2, &plan) == MT_OK, "deterministic: %s", mt_last_error());
    CHECK_MSG(plan.micro_sequences == 3 && plan.passes == 4, "groups of %d, %d passes",
              plan.micro_sequences, plan.passes);
    mt_run_plan_free(&plan);
    /* under a pipeline the passes are the schedule's micro-batches, one group each, whatever
     * --microbatches; tensor parallelism and half precision are covered */
    const char *covered[][2] = {{"pp", "2"}, {"tp", "2"}, {"precision", "bf16"}};
    for (int i = 0; i < 3; i++) {
        mt_config_defaults(&c);
        CHECK(mt_config_set(&c, "deterministic", "on", "test") == MT_OK);
        CHECK(mt_config_set(&c, "batch", "24", "test") == MT_OK);
        CHECK(mt_config_set(&c, "microbatches", "2", "test") == MT_OK);
        CHECK(mt_config_set(&c, "layers", "2", "test") == MT_OK);
        CHECK(mt_config_set(&c, covered[i][0], covered[i][1], "test") == MT_OK);
        CHECK_MSG(mt_run_plan_resolve(&c, i < 2 ? 2 : 1, &plan) == MT_OK, "deterministic, %s %s: "
                  "%s", covered[i][0], covered[i][1], mt_last_error());
        CHECK_MSG(i != 0 || (plan.schedule.micros == 8 && plan.micro_sequences == 3),
                  "pp 2: %d micro-batches of %d sequences", plan.schedule.micros,
                  plan.micro_sequences);
        mt_run_plan_free(&plan);
    }
    return check_summary("test_run_plan");
}
