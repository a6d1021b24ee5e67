/* Distributed checkpoints: every tensor described by boxes of its global shape, shard files
 * with a checksum per piece, and the strictly checked metadata that commits a checkpoint. */
#ifndef MESHTRAIN_CHECKPOINT_H
#define MESHTRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/config.h"
#include "meshtrain/model.h"
#include "meshtrain/safetensors.h"
#include "meshtrain/status.h"

/* A checkpoint folder OUT/ckpt/step_<N>/ holds metadata.json (written last: the commit) and one
 * rank<R>.shard per writing rank. A shard file is a 64-byte header (MT_CKPT_SHARD_MAGIC, the
 * format version, the writer's rank, the step and the file's size, little-endian) followed by
 * pieces, each a box of one tensor's parameters or Adam moments in row-major order, at 64-byte
 * aligned offsets. The metadata names every tensor with its global shape and every piece with
 * its file, state, box, byte range and XXH3-64 checksum; the pieces of each (tensor, state)
 * tile the tensor exactly. */
#define MT_CKPT_SHARD_MAGIC "MTSHARD\n"
enum { MT_CKPT_VERSION = 1, MT_CKPT_HEADER_BYTES = 64, MT_CKPT_MAX_DIMS = 3 };

typedef enum mt_ckpt_state {
    MT_CKPT_PARAM,      /* the parameters */
    MT_CKPT_EXP_AVG,    /* AdamW's first moment */
    MT_CKPT_EXP_AVG_SQ, /* AdamW's second moment */
    MT_CKPT_STATES
} mt_ckpt_state;
/* "param", "exp_avg", "exp_avg_sq" (PyTorch's names for the moments). */
const char *mt_ckpt_state_name(mt_ckpt_state state);

/* A box of a global tensor: offset and extent per dimension. */
typedef struct mt_ckpt_box {
    int dims;
    long long offset[MT_CKPT_MAX_DIMS], extent[MT_CKPT_MAX_DIMS];
} mt_ckpt_box;

/* An array that holds box-shaped data of a global tensor: element j of the row-major array of
 * `shape` whose first element sits at global coordinates `origin`, stored at data[j - first]
 * (only indices from `first` on are addressed: a ZeRO slice starts inside its tensor). */
typedef struct mt_ckpt_view {
    float *data;
    size_t first;
    int dims;
    long long origin[MT_CKPT_MAX_DIMS], shape[MT_CKPT_MAX_DIMS];
} mt_ckpt_view;

/* The most boxes a flat range of a row-major array of MT_CKPT_MAX_DIMS dimensions needs. */
enum { MT_CKPT_RANGE_BOXES = 2 * MT_CKPT_MAX_DIMS - 1 };

size_t mt_ckpt_box_volume(const mt_ckpt_box *box);
/* The intersection of a and b into *out; 0 when it is empty. */
int mt_ckpt_box_intersect(const mt_ckpt_box *a, const mt_ckpt_box *b, mt_ckpt_box *out);
/* Elements [first, first + count) of a tensor-parallel rank's local array of `shard`, as boxes
 * of the global tensor (padding rows left out): a partial leading row, whole rows, a partial
 * trailing row, recursively. Returns how many boxes it wrote into boxes[]. */
int mt_ckpt_range_boxes(const mt_param_shard *shard, size_t first, size_t count,
                        mt_ckpt_box boxes[MT_CKPT_RANGE_BOXES]);
/* The view of a local array of `shard` whose elements from `first` on are at data. */
mt_ckpt_view mt_ckpt_shard_view(const mt_param_shard *shard, float *data, size_t first);
/* The box's elements in `view`'s array when they are one contiguous run there, else NULL. */
float *mt_ckpt_view_run(const mt_ckpt_view *view, const mt_ckpt_box *box);
/* Copies `region` (inside both views' arrays) from one view to the other. */
void mt_ckpt_copy(const mt_ckpt_box *region, const mt_ckpt_view *from, const mt_ckpt_view *to);
/* "[0:3, 16:32, 0:64]" */
void mt_ckpt_box_format(const mt_ckpt_box *box, char *out, size_t capacity);

/* The metadata of a committed checkpoint, as read and checked by mt_ckpt_meta_read. */
typedef struct mt_ckpt_tensor {
    char name[48];
    int dims;
    long long shape[MT_CKPT_MAX_DIMS];
} mt_ckpt_tensor;

typedef struct mt_ckpt_file {
    char name[64]; /* "rank3.shard", inside the checkpoint folder */
    int rank;
    uint64_t bytes;
} mt_ckpt_file;

typedef struct mt_ckpt_piece {
    int tensor, file;
    mt_ckpt_state state;
    mt_ckpt_box box;
    uint64_t at, bytes, xxh3;
} mt_ckpt_piece;

typedef struct mt_ckpt_layout {
    int world, dp, pp, tp, sp, zero;
} mt_ckpt_layout;

/* Where training stands beyond its step number, which skipped steps and rollbacks part from
 * the optimizer's count and from the data's position: what a resume needs to go on bitwise.
 * Written under "training" in metadata.json; a checkpoint without it is read as a run that
 * never skipped (applied and cursor equal to its step, no scaler or spike statistics). */
enum { MT_CKPT_MAX_STREAK = 64 }; /* the most consecutive skips a rollback waits for */
typedef struct mt_ckpt_scaler {   /* the fp16 loss scaler (loss_scaler.h) */
    double scale;  /* 0: none recorded (a run of another precision) */
    int clean;     /* steps without an overflow since the scale last changed */
    int overflows; /* overflows since the scale last grew */
} mt_ckpt_scaler;
typedef struct mt_ckpt_spike {    /* the loss-spike guard (spike_guard.h) */
    long long count;  /* losses in the running statistics */
    double mean, var; /* their exponentially weighted mean and variance */
    int streak;       /* consecutive steps skipped as spikes, and the batches they drew */
    long long streak_batches[MT_CKPT_MAX_STREAK];
    int skips, rollbacks; /* every spike skip and rollback of the run */
} mt_ckpt_spike;
typedef struct mt_ckpt_training {
    int applied;           /* optimizer steps applied: AdamW's bias correction and the LR
                            * schedule count these, not steps */
    long long cursor;      /* global batches the data has passed: a step draws the first batch
                            * from here on that is not in skipped */
    long long *skipped;    /* batches rollbacks left out, ascending (owned: mt_ckpt_meta_free) */
    int skipped_count;
    int overflow_skips;    /* steps the loss scaler skipped */
    mt_ckpt_scaler scaler;
    mt_ckpt_spike spike;
} mt_ckpt_training;

typedef struct mt_ckpt_meta {
    char dir[MT_PATH_MAX];
    int step;
    long long sequences;  /* training sequences consumed: the data cursor x batch */
    mt_ckpt_training training;
    mt_ckpt_layout layout;
    int config_count;     /* the run's config, every key as text */
    char **config_keys, **config_values;
    mt_ckpt_tensor *tensors;
    int tensor_count;
    mt_ckpt_file *files;
    int file_count;
    mt_ckpt_piece *pieces;
    int piece_count;
} mt_ckpt_meta;

/* Reads DIR/metadata.json and checks everything a loader relies on: format and version, every
 * field's type and range, each piece inside its file and checksummed, and the pieces of every
 * (tensor, state) tiling the tensor exactly (no gap, no overlap). Errors name the file, and the
 * tensor when one is at fault. */
mt_status mt_ckpt_meta_read(const char *dir, mt_ckpt_meta *meta);
void mt_ckpt_meta_free(mt_ckpt_meta *meta);
/* The tensor named `name`, or -1. */
int mt_ckpt_meta_find(const mt_ckpt_meta *meta, const char *name);
/* The config value of `key` in the checkpoint, or NULL. */
const char *mt_ckpt_meta_config(const mt_ckpt_meta *meta, const char *key);

/* Writes DIR/metadata.json (through a temporary file, fsynced and renamed). */
mt_status mt_ckpt_meta_write(const char *dir, const mt_ckpt_meta *meta);

/* The newest committed checkpoint folder under `root` (OUT/ckpt) into out: the step_<N> with
 * the highest N that has a metadata.json. *step is -1 (and out empty) when there is none. */
mt_status mt_ckpt_find_latest(const char *root, char *out, size_t capacity, int *step);

/* The checkpoint folder `path` names into out: `path` itself when it holds a metadata.json,
 * else the newest committed step under PATH/ckpt (a run's OUT folder) or under PATH (an
 * OUT/ckpt folder); an error saying what was expected when there is none. */
mt_status mt_ckpt_locate(const char *path, char *out, size_t capacity);

/* Opens a shard file of a checkpoint, checking its header (magic, version, rank, step) and size
 * against the metadata. */
mt_status mt_ckpt_shard_open(const mt_ckpt_meta *meta, int file, int *fd);
/* Reads piece `piece` into out (piece bytes) and verifies its checksum. */
mt_status mt_ckpt_piece_read(const mt_ckpt_meta *meta, int piece, int fd, void *out);

/* Reads pieces of one checkpoint: each shard file is opened and its header checked on first
 * use (at most MT_CKPT_READER_MAX_OPEN at once); every piece read is verified against its
 * checksum. */
enum { MT_CKPT_READER_MAX_OPEN = 64 };
typedef struct mt_ckpt_reader {
    const mt_ckpt_meta *meta;
    int *fds;      /* per file; -1 when not open */
    int open;      /* how many are */
    float *buffer; /* the last piece read */
    size_t buffer_bytes;
} mt_ckpt_reader;

mt_status mt_ckpt_reader_open(mt_ckpt_reader *reader, const mt_ckpt_meta *meta);
void mt_ckpt_reader_close(mt_ckpt_reader *reader);
/* Piece `piece`, read and verified; *data points at its floats until the next read. */
mt_status mt_ckpt_reader_piece(mt_ckpt_reader *reader, int piece, const float **data);
/* Copies into `to` every element of `regions` (boxes of tensor `tensor`, inside to's array)
 * that a piece of state `state` holds, reading only the pieces that overlap them; *filled
 * counts the elements copied (all of the regions' when the metadata's tiling holds). */
mt_status mt_ckpt_reader_fill(mt_ckpt_reader *reader, int tensor, mt_ckpt_state state,
                              const mt_ckpt_box *regions, int region_count,
                              const mt_ckpt_view *to, size_t *filled);
/* The view of a whole tensor's row-major array at data, and its box (*whole). */
mt_ckpt_view mt_ckpt_tensor_view(const mt_ckpt_tensor *tensor, float *data, mt_ckpt_box *whole);

/* Writes the parameters of a GPT checkpoint as one safetensors file at `path` with Hugging
 * Face GPT-2's tensor names and orientation (mt_gpt_hf_tensor_of), in `dtype` (F32 as saved;
 * BF16 or F16 rounded to nearest even, NaN kept, past the largest finite value infinity), and
 * GPT-2's config (n_embd, n_head, n_layer, n_positions, vocab_size) in __metadata__; tensor
 * by tensor, so memory holds one tensor twice at most. *tensors and *values count what it wrote. */
mt_status mt_ckpt_export_safetensors(const mt_ckpt_meta *meta, const char *path,
                                     mt_safetensors_dtype dtype, int *tensors, size_t *values);

#endif
