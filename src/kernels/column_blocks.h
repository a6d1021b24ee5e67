/* Column blocks that one thread owns whole: sums over rows (bias, norm and embedding
 * gradients) then need no atomics and add in a fixed order, so results are deterministic. */
#ifndef MESHTRAIN_COLUMN_BLOCKS_H
#define MESHTRAIN_COLUMN_BLOCKS_H

/* Narrow enough to spread a model's width over the threads, wide enough to vectorise. */
enum { COLUMN_BLOCK = 64 };

static inline int column_block_count(int columns)
{
    return (columns + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
}

/* Columns [*start, *end) of block `block`. */
static inline void column_block_range(int block, int columns, int *start, int *end)
{
    *start = block * COLUMN_BLOCK;
    *end = *start + COLUMN_BLOCK < columns ? *start + COLUMN_BLOCK : columns;
}

#endif
