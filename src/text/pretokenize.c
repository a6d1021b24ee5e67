/* GPT-2's pre-tokenisation pattern, by hand: contractions, letter runs, number runs, runs of
 * anything else (each after an optional space), then whitespace, as the reference's regex. */
#include "text_internal.h"

int text_is_space(int32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

/* A character's class for the pattern: space, letter, number or other. */
enum { KIND_SPACE = 3 };

static int kind_of(int32_t cp)
{
    return text_is_space(cp) ? KIND_SPACE : text_unicode_class(cp);
}

/* The end of the run of characters of `kind` from pos. */
static size_t run_end(const unsigned char *text, size_t length, size_t pos, int kind)
{
    while (pos < length) {
        int32_t cp;
        size_t n = text_utf8_next(text, length, pos, &cp);
        if (kind_of(cp) != kind)
            break;
        pos += n;
    }
    return pos;
}

static size_t contraction(const unsigned char *text, size_t length, size_t pos)
{
    if (text[pos] != '\'' || pos + 1 >= length)
        return 0;
    unsigned char a = text[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (pos + 2 < length) {
        unsigned char b = text[pos + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    return 0;
}

size_t text_pretoken_end(const unsigned char *text, size_t length, size_t pos)
{
    size_t n = contraction(text, length, pos);
    if (n)
        return pos + n;
    int32_t cp;
    size_t first = text_utf8_next(text, length, pos, &cp);
    int kind = kind_of(cp);
    size_t start = pos;
    if (cp == ' ' && pos + first < length) {
        /* ` ?X+`: a space joins the run of letters, numbers or others after it. */
        int32_t next;
        text_utf8_next(text, length, pos + first, &next);
        int next_kind = kind_of(next);
        if (next_kind != KIND_SPACE)
            return run_end(text, length, pos + first, next_kind);
    }
    if (kind != KIND_SPACE)
        return run_end(text, length, start, kind);
    /* \s+(?!\S): a run of whitespace, but not its last character when something follows;
     * \s+ when that leaves nothing. */
    size_t end = run_end(text, length, pos, KIND_SPACE);
    if (end == length)
        return end;
    size_t last = pos, at = pos;
    while (at < end) {
        last = at;
        at += text_utf8_next(text, length, at, &cp);
    }
    return last > pos ? last : end;
}
