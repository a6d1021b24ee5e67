/* Prefixes each line a worker prints with its rank ("[3] ...") and writes it whole, so that
 * the output of many workers stays readable and greppable by rank. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "launch_internal.h"

void launch_line_prefixer_init(line_prefixer *p, int fd, int rank)
{
    memset(p, 0, sizeof *p);
    p->fd = fd;
    snprintf(p->prefix, sizeof p->prefix, "[%d] ", rank);
}

static void write_all(int fd, const char *data, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, data, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* the launcher's own output is gone (a closed pipe): nothing to do */
        data += w;
        n -= (size_t)w;
    }
}

/* Writes the buffered line with its prefix (unless it continues a cut line). */
static void emit(line_prefixer *p, int complete)
{
    char out[sizeof p->prefix + LINE_CAPACITY + 1];
    size_t n = 0;
    if (!p->mid_line) {
        n = strlen(p->prefix);
        memcpy(out, p->prefix, n);
    }
    memcpy(out + n, p->line, p->len);
    n += p->len;
    if (complete)
        out[n++] = '\n';
    write_all(p->fd, out, n);
    p->len = 0;
    p->mid_line = !complete;
}

void launch_line_prefixer_feed(line_prefixer *p, const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            emit(p, 1);
            continue;
        }
        if (p->len == LINE_CAPACITY)
            emit(p, 0); /* a very long line goes out in pieces, prefixed once */
        p->line[p->len++] = data[i];
    }
}

void launch_line_prefixer_flush(line_prefixer *p)
{
    if (p->len > 0 || p->mid_line)
        emit(p, 1);
}
