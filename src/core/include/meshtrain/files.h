/* Small file-system helpers shared by the data, training and checkpoint code (folders, durable
 * writes, removal). They return statuses whose messages name the path. */
#ifndef MESHTRAIN_FILES_H
#define MESHTRAIN_FILES_H

#include <stddef.h>
#include <stdio.h>

#include "meshtrain/status.h"

/* Creates a folder and any missing parents (mkdir -p). */
mt_status mt_make_folders(const char *path);

/* fsync of a file or folder by path (a folder's fsync makes renames inside it durable). */
mt_status mt_sync_path(const char *path);

/* Writes all `bytes` bytes to fd (retrying short writes and EINTR); `path` names it in errors. */
mt_status mt_write_all(int fd, const void *data, size_t bytes, const char *path);

/* Writes `bytes` bytes to `path` durably: into PATH.partial, fsynced, renamed over path, and
 * the folder fsynced, so a reader sees the old file or the whole new one, never a part. */
mt_status mt_write_file_durably(const char *path, const void *data, size_t bytes);

/* Reads the rest of an open stream (a file, standard input) into a new buffer (*bytes, free()
 * it; never NULL on success, even for nothing read); `name` names it in errors. */
mt_status mt_read_stream(FILE *stream, const char *name, unsigned char **bytes, size_t *length);

/* Removes a file or a folder with everything in it (rm -rf); a missing path is fine. */
mt_status mt_remove_tree(const char *path);

/* The folder part of a path into out ("." when it has none). */
void mt_path_folder(const char *path, char *out, size_t capacity);

#endif
