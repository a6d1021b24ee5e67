/* A fast 64-bit checksum of bytes, for telling whether two replicas hold the same state: not
 * cryptographic, but every bit of the input changes the result. */
#ifndef MESHTRAIN_CHECKSUM_H
#define MESHTRAIN_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* Checksum of `bytes` bytes, continuing from `seed` (0 to start, or a previous result to
 * chain several ranges). */
uint64_t mt_checksum64(const void *data, size_t bytes, uint64_t seed);

#endif
