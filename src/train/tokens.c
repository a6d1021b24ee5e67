/* Reading and writing token files: a 32-byte header (magic, version, width, count, vocab
 * bound) then the tokens. Everything in a file is validated before training reads it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshtrain/data.h"
#include "meshtrain/files.h"

static const char TOKENS_MAGIC[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};

static uint32_t read_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t read_u64(const uint8_t *p)
{
    return (uint64_t)read_u32(p) | (uint64_t)read_u32(p + 4) << 32;
}

static void write_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void write_u64(uint8_t *p, uint64_t v)
{
    write_u32(p, (uint32_t)v);
    write_u32(p + 4, (uint32_t)(v >> 32));
}

static mt_status check_header(mt_tokens *t, const uint8_t *h, size_t file_bytes)
{
    if (memcmp(h, TOKENS_MAGIC, sizeof TOKENS_MAGIC) != 0)
        return mt_fail(MT_EFORMAT, "token file '%s': not a meshtrain token file (bad magic)",
                       t->path);
    uint32_t version = read_u32(h + 8), width = read_u32(h + 12);
    if (version != MT_TOKENS_VERSION)
        return mt_fail(MT_EFORMAT, "token file '%s': version %u, this meshtrain reads version %d",
                       t->path, version, MT_TOKENS_VERSION);
    if (width != 1 && width != 2 && width != 4)
        return mt_fail(MT_EFORMAT, "token file '%s': token width %u bytes (expected 1, 2 or 4)",
                       t->path, width);
    t->token_bytes = (int)width;
    t->count = read_u64(h + 16);
    t->vocab = read_u32(h + 24);
    uint64_t payload = file_bytes - MT_TOKENS_HEADER_BYTES;
    if (t->count > payload / width || payload != t->count * width)
        return mt_fail(MT_EFORMAT,
                       "token file '%s': header says %llu tokens (%llu bytes) but the file holds "
                       "%llu bytes after the header (truncated or padded)",
                       t->path, (unsigned long long)t->count,
                       (unsigned long long)(t->count * width), (unsigned long long)payload);
    if (t->vocab == 0 || (width < 4 && t->vocab > (1ull << (8 * width))))
        return mt_fail(MT_EFORMAT, "token file '%s': vocabulary bound %u does not fit %u-byte tokens",
                       t->path, t->vocab, width);
    return MT_OK;
}

static mt_status check_tokens(const mt_tokens *t)
{
    for (uint64_t i = 0; i < t->count; i++) {
        uint32_t token = mt_tokens_at(t, i);
        if (token >= t->vocab)
            return mt_fail(MT_EFORMAT, "token file '%s': token %u at index %llu is not below the "
                                       "header's vocabulary bound %u",
                           t->path, token, (unsigned long long)i, t->vocab);
    }
    return MT_OK;
}

mt_status mt_tokens_open(mt_tokens *t, const char *path)
{
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mt_fail(MT_EIO, "token file '%s': %s (write one with `meshtrain data`)", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return mt_fail(MT_EIO, "token file '%s': not a regular file", path);
    }
    if ((size_t)st.st_size < MT_TOKENS_HEADER_BYTES) {
        close(fd);
        return mt_fail(MT_EFORMAT, "token file '%s': %lld bytes, shorter than the %d-byte header",
                       path, (long long)st.st_size, MT_TOKENS_HEADER_BYTES);
    }
    t->map_bytes = (size_t)st.st_size;
    t->map = mmap(NULL, t->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        return mt_fail(MT_EIO, "token file '%s': cannot map: %s", path, strerror(errno));
    }
    t->data = (const uint8_t *)t->map + MT_TOKENS_HEADER_BYTES;
    mt_status status = check_header(t, t->map, t->map_bytes);
    if (status == MT_OK)
        status = check_tokens(t);
    if (status != MT_OK)
        mt_tokens_close(t);
    return status;
}

void mt_tokens_close(mt_tokens *t)
{
    if (t->map)
        munmap(t->map, t->map_bytes);
    t->map = NULL;
}

mt_status mt_tokens_write_bytes(const char *path, const uint8_t *bytes, uint64_t count)
{
    char temporary[600];
    if (snprintf(temporary, sizeof temporary, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof temporary)
        return mt_fail(MT_EINVAL, "token file path '%s' is too long", path);
    FILE *file = fopen(temporary, "wb");
    if (!file)
        return mt_fail(MT_EIO, "cannot create '%s': %s", temporary, strerror(errno));
    uint8_t header[MT_TOKENS_HEADER_BYTES] = {0};
    memcpy(header, TOKENS_MAGIC, sizeof TOKENS_MAGIC);
    write_u32(header + 8, MT_TOKENS_VERSION);
    write_u32(header + 12, 1);
    write_u64(header + 16, count);
    write_u32(header + 24, 256);
    int ok = fwrite(header, 1, sizeof header, file) == sizeof header &&
             fwrite(bytes, 1, count, file) == count;
    ok = fflush(file) == 0 && ok;
    ok = fsync(fileno(file)) == 0 && ok;
    ok = fclose(file) == 0 && ok;
    if (!ok || rename(temporary, path) != 0) {
        int saved = errno;
        unlink(temporary);
        return mt_fail(MT_EIO, "cannot write '%s': %s", path, strerror(saved));
    }
    return MT_OK;
}

mt_status mt_corpus_write(const char *dir, const uint8_t *text, size_t length, double val_fraction)
{
    if (length < 2)
        return mt_fail(MT_EINVAL, "corpus text has %zu bytes; it needs at least 2", length);
    mt_status status = mt_make_folders(dir);
    if (status)
        return status;
    size_t val = (size_t)(length * val_fraction);
    if (val < 1)
        val = 1;
    char path[560];
    if (snprintf(path, sizeof path, "%s/train.bin", dir) >= (int)sizeof path)
        return mt_fail(MT_EINVAL, "corpus folder path '%s' is too long", dir);
    status = mt_tokens_write_bytes(path, text, length - val);
    if (status)
        return status;
    snprintf(path, sizeof path, "%s/val.bin", dir);
    return mt_tokens_write_bytes(path, text + length - val, val);
}
