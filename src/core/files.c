/* File-system helpers: folder creation with parents.
 * Kept apart so that data, runs and checkpoints create paths the same way. */
#include "meshtrain/files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static mt_status make_one(const char *path)
{
    if (mkdir(path, 0755) == 0)
        return MT_OK;
    struct stat st;
    if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return MT_OK;
    if (errno == EEXIST)
        return mt_fail(MT_EIO, "cannot create folder '%s': a file of that name exists", path);
    return mt_fail(MT_EIO, "cannot create folder '%s': %s", path, strerror(errno));
}

mt_status mt_make_folders(const char *path)
{
    char partial[1024];
    if (snprintf(partial, sizeof partial, "%s", path) >= (int)sizeof partial)
        return mt_fail(MT_EINVAL, "path '%s' is too long", path);
    for (char *p = partial + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mt_status status = make_one(partial);
        if (status)
            return status;
        *p = '/';
    }
    return make_one(partial);
}
