/* What the checkpoint files share inside the train layer: a rank's shard plan (its pieces and
 * where their floats are), the shard writer, and the names of checkpoint folders. */
#ifndef MESHTRAIN_CKPT_INTERNAL_H
#define MESHTRAIN_CKPT_INTERNAL_H

#include "meshtrain/checkpoint.h"

/* One rank's shard: its pieces (tensor, state, box, bytes; `at` and `xxh3` filled by
 * ckpt_plan_layout and ckpt_shard_write) and each piece's floats, contiguous. */
typedef struct ckpt_shard_plan {
    mt_ckpt_piece *pieces;
    const float **data; /* NULL: fetched when written (streamed from the offload file) */
    int count, capacity;
    uint64_t bytes; /* the file's size */
    mt_status (*fetch)(void *context, int piece, const float **data);
    void *fetch_context;
} ckpt_shard_plan;

uint64_t trainer_ckpt_hash(const void *data, size_t bytes);
/* Places the pieces at 64-byte aligned offsets after the header; returns the file's size. */
uint64_t trainer_ckpt_plan_layout(ckpt_shard_plan *plan);
/* Writes the shard to PATH.partial (its space claimed first, so a full disk fails before
 * anything is written), checksumming each piece on the way, then fsyncs, renames it to path
 * and fsyncs the folder. die_halfway: SIGKILL this process halfway (a test's fault). */
mt_status trainer_ckpt_shard_write(const char *path, int rank, int step, ckpt_shard_plan *plan,
                                   int die_halfway);
/* mt_ckpt_meta_read on text already in memory (`length` bytes of metadata.json of checkpoint
 * folder `dir`, which errors name and meta->dir keeps): the same checks and messages. */
mt_status trainer_ckpt_meta_parse(const char *dir, const char *text, size_t length,
                                  mt_ckpt_meta *meta);
/* ckpt_training.c: the metadata's "training" object. */
struct json_t;
/* Reads root's "training" into meta->training (absent: the defaults of a run that never
 * skipped, at meta->step); every field checked, errors naming `path`. */
mt_status trainer_ckpt_training_read(const char *path, struct json_t *root, mt_ckpt_meta *meta);
/* The object for `training`, or NULL when out of memory. */
struct json_t *trainer_ckpt_training_json(const mt_ckpt_training *training);
/* A deep copy of `from` into *to (whose list is replaced, freed first); 0 when out of memory. */
int trainer_ckpt_training_copy(mt_ckpt_training *to, const mt_ckpt_training *from);

/* N of a folder named step_<N>, else -1. */
int trainer_ckpt_step_of_name(const char *name);

#endif
