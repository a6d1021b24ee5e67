/* GPT-2's byte-to-unicode mapping: printable bytes stand for themselves, the other 68 take code
 * points 256 and up in byte order, so every token of encoder.json is a printable string. */
#include "text_internal.h"

static int printable(int byte)
{
    return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
           (byte >= 0xAE && byte <= 0xFF);
}

int32_t text_byte_to_unicode(int byte)
{
    if (printable(byte))
        return byte;
    int32_t n = 0;
    for (int b = 0; b < byte; b++)
        n += !printable(b);
    return 256 + n;
}

int text_unicode_to_byte(int32_t code_point)
{
    if (code_point >= 0 && code_point < 256)
        return printable(code_point) ? code_point : -1;
    int32_t n = code_point - 256;
    for (int b = 0; b < 256; b++)
        if (!printable(b) && n-- == 0)
            return b;
    return -1;
}
