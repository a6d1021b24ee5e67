/* Growing text: appends format into the room left and, when it does not fit, grows the buffer
 * to at least twice what is needed and formats again. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "meshtrain/text.h"

void mt_text_add(mt_text *t, const char *fmt, ...)
{
    while (!t->failed) {
        va_list args;
        va_start(args, fmt);
        size_t room = t->capacity - t->length;
        int k = vsnprintf(t->data ? t->data + t->length : NULL, t->data ? room : 0, fmt, args);
        va_end(args);
        if (k < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)k < room) {
            t->length += (size_t)k;
            return;
        }
        size_t capacity = (t->capacity + (size_t)k + 1) * 2;
        char *grown = realloc(t->data, capacity);
        if (!grown) {
            t->failed = 1;
            return;
        }
        t->data = grown;
        t->capacity = capacity;
    }
}

void mt_text_free(mt_text *t)
{
    free(t->data);
    *t = (mt_text){0};
}
