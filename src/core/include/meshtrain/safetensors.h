/* A strict reader of safetensors files (Hugging Face's tensor format, and meshtrain's
 * model.safetensors): any tensor names in any order, every byte range checked before use. */
#ifndef MESHTRAIN_SAFETENSORS_H
#define MESHTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "meshtrain/status.h"

/* The format: an 8-byte little-endian header length n, n bytes of JSON (an object whose
 * optional "__metadata__" maps names to strings and whose every other key names a tensor:
 * {"dtype":"F32","shape":[..],"data_offsets":[begin,end]}, padded with spaces), then the data
 * area; each tensor's bytes are [begin, end) of it, little-endian, row-major. */
enum {
    MT_SAFETENSORS_MAX_DIMS = 8,
    MT_SAFETENSORS_MAX_HEADER = 100 * 1000 * 1000, /* bytes of JSON; more is refused */
};

/* Element types by their names in the header. Every one is accepted and its size checked
 * against the shape; mt_safetensors_read_f32 converts only F32 so far. */
typedef enum mt_safetensors_dtype {
    MT_SAFETENSORS_BOOL,
    MT_SAFETENSORS_U8,
    MT_SAFETENSORS_I8,
    MT_SAFETENSORS_F8_E4M3,
    MT_SAFETENSORS_F8_E5M2,
    MT_SAFETENSORS_U16,
    MT_SAFETENSORS_I16,
    MT_SAFETENSORS_F16,
    MT_SAFETENSORS_BF16,
    MT_SAFETENSORS_U32,
    MT_SAFETENSORS_I32,
    MT_SAFETENSORS_F32,
    MT_SAFETENSORS_U64,
    MT_SAFETENSORS_I64,
    MT_SAFETENSORS_F64,
} mt_safetensors_dtype;

/* One tensor as the header describes it; pointers stay valid until mt_safetensors_close. */
typedef struct mt_safetensors_tensor {
    const char *name;
    mt_safetensors_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[MT_SAFETENSORS_MAX_DIMS];
    uint64_t numel;   /* product of the shape (1 for a scalar) */
    const void *data; /* its bytes in the mapped file: little-endian, not necessarily aligned */
    uint64_t bytes;
} mt_safetensors_tensor;

typedef struct mt_safetensors mt_safetensors;

/* Maps `path` read-only and validates it whole: the size (at least 8 bytes), the header's
 * length (inside the file, at most MT_SAFETENSORS_MAX_HEADER), the header as strict JSON of the
 * structure above (no other fields, no repeated names), known dtypes, non-negative dimensions
 * whose product times the dtype's size is the tensor's byte range, ranges inside the data area
 * and not overlapping. Every error names the file, and the tensor when one is at fault. */
mt_status mt_safetensors_open(const char *path, mt_safetensors **out);
void mt_safetensors_close(mt_safetensors *file); /* NULL is fine */

int mt_safetensors_count(const mt_safetensors *file);

/* Tensor i (0 <= i < count) in header order. */
const mt_safetensors_tensor *mt_safetensors_tensor_at(const mt_safetensors *file, int i);

/* The index of the tensor called `name`, or -1. */
int mt_safetensors_find(const mt_safetensors *file, const char *name);

/* Copies tensor i's numel values into `out` as floats; a tensor of another dtype is an error
 * naming the file, the tensor and its dtype. */
mt_status mt_safetensors_read_f32(const mt_safetensors *file, int i, float *out);

/* "F32", "BF16", ...; the size of one element in bytes. */
const char *mt_safetensors_dtype_name(mt_safetensors_dtype dtype);
size_t mt_safetensors_dtype_size(mt_safetensors_dtype dtype);

/* The file's path, and its __metadata__ pairs (count, and key and value of pair i). */
const char *mt_safetensors_path(const mt_safetensors *file);
int mt_safetensors_metadata_count(const mt_safetensors *file);
void mt_safetensors_metadata_at(const mt_safetensors *file, int i, const char **key,
                                const char **value);

/* Writing a file of float32 tensors (or of tensors all of one other dtype), one after another, without holding them all: the header
 * is written first from every tensor's name and shape, then mt_safetensors_write takes the
 * values in tensor order (in pieces of any size), into PATH.partial; mt_safetensors_finish
 * with commit fsyncs it and renames it over PATH (a reader sees the old file or the whole new
 * one), or without commit removes it. `tensors` must outlive the writer. */
typedef struct mt_safetensors_spec {
    const char *name;
    int ndim;
    int64_t shape[MT_SAFETENSORS_MAX_DIMS];
} mt_safetensors_spec;
typedef struct mt_safetensors_writer mt_safetensors_writer;

/* metadata: key, value, key, value, ..., NULL (or NULL for none): the __metadata__ strings. */
mt_status mt_safetensors_create(const char *path, const mt_safetensors_spec *tensors, int count,
                                const char *const *metadata, mt_safetensors_writer **out);
mt_status mt_safetensors_write(mt_safetensors_writer *writer, const float *values, size_t count);
/* The same for a file whose every tensor is `dtype` (any of the enum): its elements are written
 * as the bytes they are (little-endian), `count` elements of mt_safetensors_dtype_size each. */
mt_status mt_safetensors_create_as(const char *path, mt_safetensors_dtype dtype,
                                   const mt_safetensors_spec *tensors, int count,
                                   const char *const *metadata, mt_safetensors_writer **out);
mt_status mt_safetensors_write_elements(mt_safetensors_writer *writer, const void *elements,
                                        size_t count);
/* Commits (every tensor must be whole) or abandons the file; frees the writer (NULL is fine). */
mt_status mt_safetensors_finish(mt_safetensors_writer *writer, int commit);

#endif
