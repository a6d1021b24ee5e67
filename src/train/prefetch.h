/* A background thread that prepares a rank's next micro-batches while the step computes: a
 * bounded queue of numbered batches, errors handed over with the batch they stopped at. */
#ifndef MESHTRAIN_PREFETCH_H
#define MESHTRAIN_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

/* Writes batch `key`'s tokens and targets (`tokens` each); must be safe to call from another
 * thread while the caller computes (it reads only immutable state). */
typedef mt_status (*trainer_draw_fn)(const void *context, uint64_t key, int32_t *inputs,
                                     int32_t *targets);

typedef struct trainer_prefetch trainer_prefetch;

/* Starts a thread drawing batches first_key, first_key + 1, ... up to end_key (exclusive),
 * at most `depth` ahead of the consumer. */
mt_status trainer_prefetch_start(trainer_prefetch **prefetch, int depth, size_t tokens,
                                 uint64_t first_key, uint64_t end_key, trainer_draw_fn draw,
                                 const void *context);

/* Batch `key` into inputs and targets: the prepared one (batches before it are dropped), or
 * one drawn here when the thread has passed it or will not reach it, so that any order of keys
 * gives the batches draw would. */
mt_status trainer_prefetch_take(trainer_prefetch *prefetch, uint64_t key, int32_t *inputs,
                                int32_t *targets);

/* Stops the thread (waking it if it waits for room) and frees the queue; NULL is a no-op. */
void trainer_prefetch_stop(trainer_prefetch *prefetch);

#endif
