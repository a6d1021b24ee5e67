/* Text that grows as it is written (printf-style appends), for messages and headers of any
 * length: the flight recorder's findings, a safetensors header. */
#ifndef MESHTRAIN_TEXT_H
#define MESHTRAIN_TEXT_H

#include <stddef.h>

typedef struct mt_text {
    char *data;      /* NUL-terminated once anything was added; NULL before */
    size_t length, capacity;
    int failed;      /* an append ran out of memory: the text stops growing there */
} mt_text;

/* Appends printf-formatted text. */
void mt_text_add(mt_text *text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mt_text_free(mt_text *text);

#endif
