/* Reading a committed checkpoint: finding it from a run's folder, each shard opened (and its
 * header checked) once, and any region of a tensor filled from the pieces that overlap it. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshtrain/checkpoint.h"

mt_status mt_ckpt_reader_open(mt_ckpt_reader *reader, const mt_ckpt_meta *meta)
{
    *reader = (mt_ckpt_reader){.meta = meta};
    reader->fds = malloc(((size_t)meta->file_count + 1) * sizeof *reader->fds);
    if (!reader->fds)
        return mt_fail(MT_ENOMEM, "reading checkpoint '%s': out of memory", meta->dir);
    for (int f = 0; f < meta->file_count; f++)
        reader->fds[f] = -1;
    return MT_OK;
}

void mt_ckpt_reader_close(mt_ckpt_reader *reader)
{
    for (int f = 0; reader->fds && f < reader->meta->file_count; f++)
        if (reader->fds[f] >= 0)
            close(reader->fds[f]);
    free(reader->fds);
    free(reader->buffer);
    *reader = (mt_ckpt_reader){0};
}

mt_status mt_ckpt_reader_piece(mt_ckpt_reader *reader, int piece, const float **data)
{
    const mt_ckpt_meta *meta = reader->meta;
    const mt_ckpt_piece *p = &meta->pieces[piece];
    if (p->bytes > reader->buffer_bytes) {
        float *grown = realloc(reader->buffer, (size_t)p->bytes);
        if (!grown)
            return mt_fail(MT_ENOMEM, "reading checkpoint '%s': out of memory for a piece of "
                                      "'%s'", meta->dir, meta->tensors[p->tensor].name);
        reader->buffer = grown;
        reader->buffer_bytes = (size_t)p->bytes;
    }
    mt_status status;
    if (reader->fds[p->file] < 0 && reader->open >= MT_CKPT_READER_MAX_OPEN) {
        /* a checkpoint of thousands of ranks must not run out of descriptors: start over */
        for (int f = 0; f < meta->file_count; f++)
            if (reader->fds[f] >= 0) {
                close(reader->fds[f]);
                reader->fds[f] = -1;
            }
        reader->open = 0;
    }
    if (reader->fds[p->file] < 0) {
        if ((status = mt_ckpt_shard_open(meta, p->file, &reader->fds[p->file])))
            return status;
        reader->open++;
    }
    if ((status = mt_ckpt_piece_read(meta, piece, reader->fds[p->file], reader->buffer)))
        return status;
    *data = reader->buffer;
    return MT_OK;
}

mt_status mt_ckpt_reader_fill(mt_ckpt_reader *reader, int tensor, mt_ckpt_state state,
                              const mt_ckpt_box *regions, int region_count,
                              const mt_ckpt_view *to, size_t *filled)
{
    const mt_ckpt_meta *meta = reader->meta;
    *filled = 0;
    for (int i = 0; i < meta->piece_count; i++) {
        const mt_ckpt_piece *piece = &meta->pieces[i];
        mt_ckpt_box both;
        int overlaps = 0;
        if (piece->tensor != tensor || piece->state != state)
            continue;
        for (int r = 0; r < region_count && !overlaps; r++)
            overlaps = mt_ckpt_box_intersect(&regions[r], &piece->box, &both);
        if (!overlaps)
            continue; /* never read */
        const float *data;
        mt_status status = mt_ckpt_reader_piece(reader, i, &data);
        if (status)
            return status;
        mt_ckpt_view saved = {.data = (float *)data, .dims = piece->box.dims};
        for (int d = 0; d < piece->box.dims; d++) {
            saved.origin[d] = piece->box.offset[d];
            saved.shape[d] = piece->box.extent[d];
        }
        for (int r = 0; r < region_count; r++)
            if (mt_ckpt_box_intersect(&regions[r], &piece->box, &both)) {
                mt_ckpt_copy(&both, &saved, to);
                *filled += mt_ckpt_box_volume(&both);
            }
    }
    return MT_OK;
}

mt_ckpt_view mt_ckpt_tensor_view(const mt_ckpt_tensor *tensor, float *data, mt_ckpt_box *whole)
{
    mt_ckpt_view view = {.data = data, .dims = tensor->dims};
    *whole = (mt_ckpt_box){.dims = tensor->dims};
    for (int d = 0; d < tensor->dims; d++)
        view.shape[d] = whole->extent[d] = tensor->shape[d];
    return view;
}

mt_status mt_ckpt_locate(const char *path, char *out, size_t capacity)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return mt_fail(MT_EIO, "'%s' is not a folder (give a step_<N> folder with a "
                               "metadata.json, a run's OUT/ckpt folder or its OUT folder)", path);
    char probe[MT_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/metadata.json", path);
    if (access(probe, F_OK) == 0) {
        snprintf(out, capacity, "%s", path);
        return MT_OK;
    }
    int step = -1;
    snprintf(probe, sizeof probe, "%s/ckpt", path); /* a run's OUT folder */
    mt_status status = mt_ckpt_find_latest(probe, out, capacity, &step);
    if (status == MT_OK && step < 0) /* an OUT/ckpt folder */
        status = mt_ckpt_find_latest(path, out, capacity, &step);
    if (status == MT_OK && step < 0)
        status = mt_fail(MT_EIO, "'%s' holds no committed checkpoint (give a step_<N> folder "
                                 "with a metadata.json, a run's OUT/ckpt folder or its OUT "
                                 "folder)", path);
    return status;
}
