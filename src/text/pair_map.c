/* An open-addressing map from a pair of token ids to an int: merge ranks when encoding, pair
 * slots when training. Keys are stored plus one so that zero marks an empty slot. */
#include <stdlib.h>

#include "text_internal.h"

static size_t slot_of(uint64_t key, size_t capacity)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (capacity - 1);
}

static mt_status grow(text_pair_map *map)
{
    size_t capacity = map->capacity ? 2 * map->capacity : 1024;
    uint64_t *keys = calloc(capacity, sizeof *keys);
    int32_t *values = malloc(capacity * sizeof *values);
    if (!keys || !values) {
        free(keys);
        free(values);
        return mt_fail(MT_ENOMEM, "no memory for a pair map of %zu slots", capacity);
    }
    for (size_t i = 0; i < map->capacity; i++) {
        if (!map->keys[i])
            continue;
        size_t s = slot_of(map->keys[i] - 1, capacity);
        while (keys[s])
            s = (s + 1) & (capacity - 1);
        keys[s] = map->keys[i];
        values[s] = map->values[i];
    }
    free(map->keys);
    free(map->values);
    map->keys = keys;
    map->values = values;
    map->capacity = capacity;
    return MT_OK;
}

mt_status text_pair_map_put(text_pair_map *map, uint64_t key, int32_t value)
{
    if (2 * (map->count + 1) > map->capacity) {
        mt_status status = grow(map);
        if (status)
            return status;
    }
    size_t s = slot_of(key, map->capacity);
    while (map->keys[s] && map->keys[s] != key + 1)
        s = (s + 1) & (map->capacity - 1);
    if (!map->keys[s]) {
        map->keys[s] = key + 1;
        map->count++;
    }
    map->values[s] = value;
    return MT_OK;
}

int32_t text_pair_map_get(const text_pair_map *map, uint64_t key)
{
    if (!map->capacity)
        return -1;
    size_t s = slot_of(key, map->capacity);
    while (map->keys[s]) {
        if (map->keys[s] == key + 1)
            return map->values[s];
        s = (s + 1) & (map->capacity - 1);
    }
    return -1;
}

void text_pair_map_free(text_pair_map *map)
{
    free(map->keys);
    free(map->values);
    *map = (text_pair_map){0};
}
