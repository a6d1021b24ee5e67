/* Status codes and the error message that travels with them.
 * Library calls return an mt_status and never exit; the message names the thing that went wrong. */
#ifndef MESHTRAIN_STATUS_H
#define MESHTRAIN_STATUS_H

typedef enum mt_status {
    MT_OK = 0,
    MT_EINVAL,   /* a bad argument or configuration value */
    MT_EIO,      /* a file or pipe could not be read or written */
    MT_EFORMAT,  /* a file exists but its contents are malformed */
    MT_ENOMEM,   /* an allocation failed */
    MT_ENUMERIC, /* a NaN or infinity appeared in training */
    MT_EPEER,    /* a peer process died, timed out, or called a different collective */
} mt_status;

/* Records a formatted message for the calling thread and returns `code`, so that
 * library code can write `return mt_fail(MT_EINVAL, "heads %d ...", h);`. */
mt_status mt_fail(mt_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the calling thread's current message with more context ("loading x: ..."),
 * returning `code` unchanged. */
mt_status mt_fail_context(mt_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of the last failure on this thread (empty if none). The buffer is
 * thread-local, so threads and communicators never overwrite each other's errors. */
const char *mt_last_error(void);

const char *mt_status_name(mt_status code);

#endif
