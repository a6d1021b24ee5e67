/* The Unicode class of a code point (letter, number or other) for the GPT-2 pre-tokeniser:
 * ASCII directly, the rest by binary search of the generated ranges. */
#include <stddef.h>

#include "text_internal.h"
#include "unicode_ranges.h"

int text_unicode_class(int32_t code_point)
{
    if (code_point < 0)
        return TEXT_CLASS_OTHER;
    if (code_point < 128) {
        if ((code_point >= 'a' && code_point <= 'z') || (code_point >= 'A' && code_point <= 'Z'))
            return TEXT_CLASS_LETTER;
        if (code_point >= '0' && code_point <= '9')
            return TEXT_CLASS_NUMBER;
        return TEXT_CLASS_OTHER;
    }
    size_t lo = 0, hi = sizeof CLASS_RANGES / sizeof CLASS_RANGES[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uint32_t)code_point < CLASS_RANGES[mid].first)
            hi = mid;
        else if ((uint32_t)code_point > CLASS_RANGES[mid].last)
            lo = mid + 1;
        else
            return CLASS_RANGES[mid].class_id;
    }
    return TEXT_CLASS_OTHER;
}
