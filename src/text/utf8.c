/* UTF-8 decoding of single code points, for the pre-tokeniser and GPT-2's token strings.
 * Invalid bytes decode one at a time as code point -1, so any byte string still splits. */
#include "text_internal.h"

size_t text_utf8_next(const unsigned char *text, size_t length, size_t pos, int32_t *code_point)
{
    unsigned char c = text[pos];
    if (c < 0x80) {
        *code_point = c;
        return 1;
    }
    size_t n;
    int32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
        n = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4, cp = c & 0x07, min = 0x10000;
    } else {
        *code_point = -1;
        return 1;
    }
    if (pos + n > length) {
        *code_point = -1;
        return 1;
    }
    for (size_t i = 1; i < n; i++) {
        unsigned char k = text[pos + i];
        if ((k & 0xC0) != 0x80) {
            *code_point = -1;
            return 1;
        }
        cp = (cp << 6) | (k & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        *code_point = -1;
        return 1;
    }
    *code_point = cp;
    return n;
}
