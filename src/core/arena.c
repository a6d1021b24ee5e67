/* A plan-then-allocate arena: callers reserve offsets while laying out state, then one
 * aligned allocation backs them all (a later back end may place it in shared memory). */
#include "meshtrain/arena.h"

#include <stdlib.h>
#include <string.h>

enum { MT_ARENA_ALIGN = 64 };

size_t mt_arena_plan(mt_arena *arena, size_t bytes)
{
    size_t offset = arena->used;
    arena->used += (bytes + MT_ARENA_ALIGN - 1) / MT_ARENA_ALIGN * MT_ARENA_ALIGN;
    return offset;
}

mt_status mt_arena_allocate(mt_arena *arena)
{
    size_t bytes = arena->used ? arena->used : MT_ARENA_ALIGN;
    arena->base = aligned_alloc(MT_ARENA_ALIGN, bytes);
    if (!arena->base)
        return mt_fail(MT_ENOMEM, "cannot allocate %zu bytes for %s", bytes, arena->name);
    memset(arena->base, 0, bytes);
    mt_memory_count(arena->ledger, arena->kind, (long long)bytes);
    return MT_OK;
}

void mt_arena_free(mt_arena *arena)
{
    if (arena->base)
        mt_memory_count(arena->ledger, arena->kind,
                        -(long long)(arena->used ? arena->used : MT_ARENA_ALIGN));
    free(arena->base);
    arena->base = NULL;
    arena->used = 0;
}
