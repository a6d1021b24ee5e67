/* Float sums over a group's ranks in one fixed pairwise tree ((r0 + r1) + (r2 + r3)), built from
 * the all-to-all and all-gather every back end has, so the bits never depend on the back end. */
#include "meshtrain/comm.h"

#include <stdlib.h>
#include <string.h>

/* Rank r's block of n elements: [r n / size, (r + 1) n / size), the data-parallel slices. */
static size_t block_start(size_t n, int r, int size) { return n * (size_t)r / (size_t)size; }

size_t mt_comm_tree_scratch(int size, size_t count)
{
    size_t widest = (count + (size_t)size - 1) / (size_t)size;
    return 2 * (size_t)size * widest;
}

void mt_reduce_tree_f32(float *pieces, size_t stride, int n, size_t count)
{
    /* level by level: piece i takes piece i + step, so piece 0 ends with the balanced tree's
     * sum when n is a power of two (and a fixed tree otherwise) */
    for (int step = 1; step < n; step *= 2)
        for (int i = 0; i + step < n; i += 2 * step) {
            float *a = pieces + (size_t)i * stride;
            const float *b = pieces + (size_t)(i + step) * stride;
            for (size_t k = 0; k < count; k++)
                a[k] += b[k];
        }
}

/* Where rank r's block starts: after the counts of the ranks before it, or without counts
 * at block_start. */
static size_t start_of(const size_t *counts, size_t count, int r, int size)
{
    if (!counts)
        return block_start(count, r, size);
    size_t first = 0;
    for (int i = 0; i < r; i++)
        first += counts[i];
    return first;
}

/* The tree reduce-scatter over the blocks of send (start_of), padded to `widest` floats each
 * in scratch (2 x size x widest): this rank's summed block lands in recv. */
static mt_status scatter_blocks(mt_comm *comm, const float *send, float *recv,
                                const size_t *counts, size_t count, size_t widest, float *scratch)
{
    int size = mt_comm_size(comm), rank = mt_comm_rank(comm);
    size_t lo = start_of(counts, count, rank, size);
    size_t mine = start_of(counts, count, rank + 1, size) - lo;
    if (size == 1) {
        if (recv != send)
            memmove(recv, send, mine * sizeof(float));
        return MT_OK;
    }
    /* block r of send goes to rank r; every rank's block of ours comes back in rank order */
    float *out = scratch, *in = scratch + (size_t)size * widest;
    for (int r = 0; r < size; r++) {
        size_t first = start_of(counts, count, r, size);
        size_t n = start_of(counts, count, r + 1, size) - first;
        memcpy(out + (size_t)r * widest, send + first, n * sizeof(float));
        memset(out + (size_t)r * widest + n, 0, (widest - n) * sizeof(float));
    }
    mt_status status = mt_comm_alltoall(comm, out, in, widest, MT_F32);
    if (status)
        return status;
    mt_reduce_tree_f32(in, widest, size, mine);
    memcpy(recv, in, mine * sizeof(float));
    return MT_OK;
}

mt_status mt_comm_reduce_scatter_tree(mt_comm *comm, const float *send, float *recv, size_t count,
                                      float *scratch)
{
    int size = mt_comm_size(comm);
    mt_status status = scatter_blocks(comm, send, recv, NULL, count,
                                      mt_comm_tree_scratch(size, count) / (2 * (size_t)size),
                                      scratch);
    return status ? mt_fail_context(status, "tree-ordered reduce-scatter of %zu floats", count)
                  : MT_OK;
}

size_t mt_comm_tree_scratchv(int size, const size_t *counts)
{
    size_t widest = 0;
    for (int r = 0; r < size; r++)
        widest = counts[r] > widest ? counts[r] : widest;
    return 2 * (size_t)size * widest;
}

mt_status mt_comm_reduce_scatterv_tree(mt_comm *comm, const float *send, float *recv,
                                       const size_t *counts, float *scratch)
{
    int size = mt_comm_size(comm);
    mt_status status = scatter_blocks(comm, send, recv, counts, 0,
                                      mt_comm_tree_scratchv(size, counts) / (2 * (size_t)size),
                                      scratch);
    return status ? mt_fail_context(status, "tree-ordered reduce-scatter of %zu floats",
                                    start_of(counts, 0, size, size))
                  : MT_OK;
}

mt_status mt_comm_allreduce_tree(mt_comm *comm, float *buffer, size_t count, float *scratch)
{
    int size = mt_comm_size(comm), rank = mt_comm_rank(comm);
    if (size == 1)
        return MT_OK;
    size_t *counts = malloc((size_t)size * sizeof *counts);
    if (!counts)
        return mt_fail(MT_ENOMEM, "tree-ordered all-reduce: out of memory");
    for (int r = 0; r < size; r++)
        counts[r] = block_start(count, r + 1, size) - block_start(count, r, size);
    float *mine = buffer + block_start(count, rank, size);
    mt_status status = mt_comm_reduce_scatter_tree(comm, buffer, mine, count, scratch);
    if (status == MT_OK)
        status = mt_comm_allgatherv(comm, mine, buffer, counts, MT_F32);
    free(counts);
    return status ? mt_fail_context(status, "tree-ordered all-reduce of %zu floats", count) : MT_OK;
}
