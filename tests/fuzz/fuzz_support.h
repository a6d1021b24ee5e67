/* What every fuzz target shares: REQUIRE, which aborts with the property that failed (the
 * fuzzer reports it as a crash), and little-endian readers for modelling wire formats. */
#ifndef MESHTRAIN_FUZZ_SUPPORT_H
#define MESHTRAIN_FUZZ_SUPPORT_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "meshtrain/status.h"

__attribute__((format(printf, 4, 5), noreturn)) static void
property_failed(const char *file, int line, const char *cond, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: property failed: %s\n  ", file, line, cond);
    va_list args;
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n  last error: %s\n", mt_last_error());
    abort();
}
#define REQUIRE(cond, ...)                                                                      \
    do {                                                                                        \
        if (!(cond))                                                                            \
            property_failed(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)

static inline uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t rd32(const uint8_t *p) { return rd16(p) | rd16(p + 2) << 16; }
static inline uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

#endif
