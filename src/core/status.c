/* Thread-local error messages behind mt_status codes.
 * One buffer per thread: errors raised on a helper thread never clobber another thread's. */
#include "meshtrain/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { MT_ERROR_CAPACITY = 1024 };
static _Thread_local char error_message[MT_ERROR_CAPACITY];

mt_status mt_fail(mt_status code, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, args);
    va_end(args);
    return code;
}

mt_status mt_fail_context(mt_status code, const char *fmt, ...)
{
    char previous[MT_ERROR_CAPACITY];
    memcpy(previous, error_message, sizeof previous);
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(error_message, sizeof error_message, fmt, args);
    va_end(args);
    if (n >= 0 && (size_t)n < sizeof error_message) {
        size_t room = sizeof error_message - (size_t)n;
        if (snprintf(error_message + n, room, ": %s", previous) < 0)
            error_message[n] = '\0';
    }
    return code;
}

const char *mt_last_error(void) { return error_message; }

const char *mt_status_name(mt_status code)
{
    switch (code) {
    case MT_OK: return "ok";
    case MT_EINVAL: return "invalid argument";
    case MT_EIO: return "i/o error";
    case MT_EFORMAT: return "malformed file";
    case MT_ENOMEM: return "out of memory";
    case MT_ENUMERIC: return "non-finite value";
    case MT_EPEER: return "peer failure";
    }
    return "unknown status";
}
