/* Arenas: one allocation per kind of state (parameters, gradients, moments, activations).
 * Planned first (offsets handed out), then allocated once, so the training step never allocates. */
#ifndef MESHTRAIN_ARENA_H
#define MESHTRAIN_ARENA_H

#include <stddef.h>

#include "meshtrain/memory.h"
#include "meshtrain/status.h"

typedef struct mt_arena {
    const char *name; /* the kind of state, for messages and memory reports */
    char *base;       /* NULL until mt_arena_allocate */
    size_t used;      /* bytes planned so far */
    mt_memory_ledger *ledger; /* when set, allocation and free are counted there as `kind` */
    mt_memory_kind kind;
} mt_arena;

/* Reserves `bytes` (rounded up to 64-byte alignment) and returns their offset from the
 * base. Only valid before the arena is allocated. */
size_t mt_arena_plan(mt_arena *arena, size_t bytes);

/* Allocates every planned byte at once, zero-filled and 64-byte aligned. */
mt_status mt_arena_allocate(mt_arena *arena);

/* The address of a planned offset; the arena must be allocated. */
static inline void *mt_arena_at(const mt_arena *arena, size_t offset)
{
    return arena->base + offset;
}

void mt_arena_free(mt_arena *arena);

#endif
