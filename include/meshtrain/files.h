/* Small file-system helpers shared by the data, training and checkpoint code.
 * They return statuses whose messages name the path. */
#ifndef MESHTRAIN_FILES_H
#define MESHTRAIN_FILES_H

#include "meshtrain/status.h"

/* Creates a folder and any missing parents (mkdir -p). */
mt_status mt_make_folders(const char *path);

#endif
