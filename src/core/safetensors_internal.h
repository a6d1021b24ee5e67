/* What safetensors.c (the file, the checks across tensors, the accessors) and safetensors_header.c
 * (the strict JSON parser of the header) share: the reader's struct and the parser's entry point. */
#ifndef MESHTRAIN_SAFETENSORS_INTERNAL_H
#define MESHTRAIN_SAFETENSORS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/safetensors.h"
#include "meshtrain/status.h"

struct mt_safetensors {
    char *path;
    void *map;
    size_t map_bytes;
    const unsigned char *data; /* the data area, after the header */
    uint64_t data_bytes;
    mt_safetensors_tensor *tensors;
    int count, capacity;
    const mt_safetensors_tensor **by_name; /* sorted by name, for lookups */
    char **metadata; /* key, value, key, value, ... */
    int metadata_count, metadata_capacity;
};

/* Parses the `length` bytes of JSON at `json` (the header, inside f's mapping): appends every
 * tensor to f->tensors (name, dtype, shape; numel, bytes and data are left to the caller's range
 * checks) and every __metadata__ pair to f->metadata, and sets *offsets to a new array of each
 * tensor's [begin, end) in the data area, two numbers per tensor, which the caller frees. On an
 * error f still owns what was parsed so far (mt_safetensors_close frees it), and *offsets is
 * NULL or the caller's to free. */
mt_status core_safetensors_parse_header(mt_safetensors *f, const char *json, size_t length,
                                        uint64_t **offsets);

/* A structural error about one tensor: "'FILE': tensor 'NAME': ...". */
__attribute__((format(printf, 3, 4))) mt_status
core_safetensors_bad_tensor(const char *path, const char *name, const char *fmt, ...);

#endif
