/* Shard files of a checkpoint: written whole under a temporary name, fsynced and renamed; read
 * back a piece at a time, each against its checksum, after the header and size are checked. */
#define _GNU_SOURCE /* posix_fallocate, pread */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL /* the header's own build of XXH3, vectorised for this CPU */
#include <xxhash.h>

#include "ckpt_internal.h"
#include "meshtrain/byte_order.h"
#include "meshtrain/files.h"

uint64_t trainer_ckpt_hash(const void *data, size_t bytes) { return XXH3_64bits(data, bytes); }

static void shard_header(unsigned char header[MT_CKPT_HEADER_BYTES], int rank, int step,
                         uint64_t bytes)
{
    memset(header, 0, MT_CKPT_HEADER_BYTES);
    memcpy(header, MT_CKPT_SHARD_MAGIC, 8);
    mt_put_le32(header + 8, MT_CKPT_VERSION);
    mt_put_le32(header + 12, (uint32_t)rank);
    mt_put_le64(header + 16, (uint64_t)step);
    mt_put_le64(header + 24, bytes);
}

uint64_t trainer_ckpt_plan_layout(ckpt_shard_plan *plan)
{
    uint64_t at = MT_CKPT_HEADER_BYTES;
    for (int i = 0; i < plan->count; i++) {
        at = (at + 63) / 64 * 64;
        plan->pieces[i].at = at;
        at += plan->pieces[i].bytes;
    }
    return plan->bytes = at;
}

mt_status trainer_ckpt_shard_write(const char *path, int rank, int step, ckpt_shard_plan *plan,
                                   int die_halfway)
{
    char temporary[MT_PATH_MAX + 48];
    snprintf(temporary, sizeof temporary, "%s.partial", path);
    int fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return mt_fail(MT_EIO, "cannot write '%s': %s", temporary, strerror(errno));
    /* Claims the space first: a full disk fails here, before anything is written. */
    int claimed = posix_fallocate(fd, 0, (off_t)plan->bytes);
    mt_status status = claimed && claimed != EOPNOTSUPP && claimed != EINVAL
                           ? mt_fail(MT_EIO, "cannot write '%s' (%" PRIu64 " bytes): %s",
                                     temporary, plan->bytes, strerror(claimed))
                           : MT_OK;
    unsigned char header[MT_CKPT_HEADER_BYTES], zeros[64] = {0};
    shard_header(header, rank, step, plan->bytes);
    if (status == MT_OK)
        status = mt_write_all(fd, header, sizeof header, temporary);
    uint64_t at = MT_CKPT_HEADER_BYTES;
    for (int i = 0; i < plan->count && status == MT_OK; i++) {
        mt_ckpt_piece *p = &plan->pieces[i];
        const float *data = plan->data[i];
        if (!data && (status = plan->fetch(plan->fetch_context, i, &data)))
            break;
        p->xxh3 = trainer_ckpt_hash(data, (size_t)p->bytes);
        if (die_halfway && i == plan->count / 2)
            raise(SIGKILL); /* MT_INJECT_FAULT: a rank dies in the middle of its shard */
        status = mt_write_all(fd, zeros, (size_t)(p->at - at), temporary);
        if (status == MT_OK)
            status = mt_write_all(fd, data, (size_t)p->bytes, temporary);
        at = p->at + p->bytes;
    }
    if (status == MT_OK && fsync(fd) != 0)
        status = mt_fail(MT_EIO, "cannot write '%s': fsync: %s", temporary, strerror(errno));
    if (close(fd) != 0 && status == MT_OK)
        status = mt_fail(MT_EIO, "cannot write '%s': %s", temporary, strerror(errno));
    if (status == MT_OK && rename(temporary, path) != 0)
        status = mt_fail(MT_EIO, "cannot rename '%s' to '%s': %s", temporary, path,
                         strerror(errno));
    if (status) {
        unlink(temporary);
        return status;
    }
    char folder[MT_PATH_MAX + 32];
    mt_path_folder(path, folder, sizeof folder);
    return mt_sync_path(folder);
}

static mt_status bad_shard(const mt_ckpt_meta *meta, int file, const char *problem,
                           const char *detail)
{
    return mt_fail(MT_EFORMAT, "checkpoint shard '%s/%s': %s%s", meta->dir,
                   meta->files[file].name, problem, detail);
}

mt_status mt_ckpt_shard_open(const mt_ckpt_meta *meta, int file, int *fd)
{
    const mt_ckpt_file *f = &meta->files[file];
    char path[MT_PATH_MAX + 80], text[160];
    snprintf(path, sizeof path, "%s/%s", meta->dir, f->name);
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return mt_fail(MT_EIO, "checkpoint shard '%s': cannot open: %s", path, strerror(errno));
    unsigned char header[MT_CKPT_HEADER_BYTES];
    struct stat st = {0};
    mt_status status = MT_OK;
    if (fstat(*fd, &st) != 0) {
        status = mt_fail(MT_EIO, "checkpoint shard '%s': cannot stat: %s", path, strerror(errno));
    } else if ((uint64_t)st.st_size != f->bytes) {
        snprintf(text, sizeof text, "%lld bytes where the metadata says %" PRIu64
                                    " (truncated or replaced)", (long long)st.st_size, f->bytes);
        status = bad_shard(meta, file, "", text);
    } else if (pread(*fd, header, sizeof header, 0) != (ssize_t)sizeof header) {
        status = bad_shard(meta, file, "cannot read the header", "");
    } else if (memcmp(header, MT_CKPT_SHARD_MAGIC, 8) != 0) {
        status = bad_shard(meta, file, "not a meshtrain shard (wrong magic)", "");
    } else if (mt_get_le32(header + 8) != MT_CKPT_VERSION) {
        snprintf(text, sizeof text, "format version %u; this build reads version %d",
                 mt_get_le32(header + 8), MT_CKPT_VERSION);
        status = bad_shard(meta, file, "", text);
    } else if (mt_get_le32(header + 12) != (uint32_t)f->rank ||
               mt_get_le64(header + 16) != (uint64_t)meta->step ||
               mt_get_le64(header + 24) != f->bytes) {
        snprintf(text, sizeof text,
                 "the header says rank %u, step %" PRIu64 ", %" PRIu64
                 " bytes; the metadata rank %d, step %d, %" PRIu64 " bytes",
                 mt_get_le32(header + 12), mt_get_le64(header + 16), mt_get_le64(header + 24),
                 f->rank, meta->step, f->bytes);
        status = bad_shard(meta, file, "", text);
    }
    if (status) {
        close(*fd);
        *fd = -1;
    }
    return status;
}

mt_status mt_ckpt_piece_read(const mt_ckpt_meta *meta, int piece, int fd, void *out)
{
    const mt_ckpt_piece *p = &meta->pieces[piece];
    const char *name = meta->tensors[p->tensor].name;
    char box[128];
    mt_ckpt_box_format(&p->box, box, sizeof box);
    size_t done = 0;
    while (done < p->bytes) {
        ssize_t n = pread(fd, (char *)out + done, (size_t)p->bytes - done,
                          (off_t)(p->at + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return mt_fail(MT_EIO, "checkpoint shard '%s/%s': tensor '%s' (%s %s): cannot read: "
                                   "%s", meta->dir, meta->files[p->file].name, name,
                           mt_ckpt_state_name(p->state), box, n < 0 ? strerror(errno)
                                                                    : "end of file");
        done += (size_t)n;
    }
    uint64_t hash = trainer_ckpt_hash(out, (size_t)p->bytes);
    if (hash != p->xxh3)
        return mt_fail(MT_EFORMAT, "checkpoint shard '%s/%s': tensor '%s' (%s %s): checksum "
                                   "%016" PRIx64 " where the metadata says %016" PRIx64
                                   " (the file is corrupt)", meta->dir,
                       meta->files[p->file].name, name, mt_ckpt_state_name(p->state), box, hash,
                       p->xxh3);
    return MT_OK;
}

/* N of a folder named step_<N> (digits only), else -1. */
int trainer_ckpt_step_of_name(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || !name[5] || (name[5] == '0' && name[6]))
        return -1; /* written as step_%d: no leading zeros */
    long step = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || step > 100000000)
            return -1;
        step = step * 10 + (*c - '0');
    }
    return (int)step;
}

mt_status mt_ckpt_find_latest(const char *root, char *out, size_t capacity, int *step)
{
    *step = -1;
    if (capacity)
        out[0] = '\0';
    DIR *dir = opendir(root);
    if (!dir)
        return errno == ENOENT ? MT_OK
                               : mt_fail(MT_EIO, "cannot list checkpoints in '%s': %s", root,
                                         strerror(errno));
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        int n = trainer_ckpt_step_of_name(entry->d_name);
        char marker[MT_PATH_MAX + 300];
        snprintf(marker, sizeof marker, "%s/%s/metadata.json", root, entry->d_name);
        if (n > *step && access(marker, R_OK) == 0) {
            *step = n;
            snprintf(out, capacity, "%s/%s", root, entry->d_name);
        }
    }
    closedir(dir);
    return MT_OK;
}
