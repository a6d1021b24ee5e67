/* Token plus position embeddings. The backward scatter-add is split by columns across
 * threads, so repeated tokens never race and the sum order is fixed (deterministic). */
#include "meshtrain/kernels.h"

#include "column_blocks.h"

#include <string.h>

void mt_embedding_forward(float *y, const int32_t *tokens, const float *wte, const float *wpe,
                          int b, int t, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < b * t; row++) {
        const float *token_row = wte + (long)tokens[row] * c, *position_row = wpe + (long)(row % t) * c;
        float *yr = y + (long)row * c;
#pragma omp simd
        for (int i = 0; i < c; i++)
            yr[i] = token_row[i] + position_row[i];
    }
}

void mt_embedding_lookup(float *y, const int32_t *tokens, const float *wte, int first_token,
                         int token_count, int n, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        int token = tokens[row] - first_token;
        float *yr = y + (long)row * c;
        if (token < 0 || token >= token_count) {
            memset(yr, 0, sizeof(float) * (size_t)c);
            continue;
        }
        memcpy(yr, wte + (long)token * c, sizeof(float) * (size_t)c);
    }
}

void mt_position_add(float *y, const float *wpe, int first_row, int rows, int t, int c)
{
#pragma omp parallel for schedule(static)
    for (int row = 0; row < rows; row++) {
        const float *position_row = wpe + (long)((first_row + row) % t) * c;
        float *yr = y + (long)row * c;
#pragma omp simd
        for (int i = 0; i < c; i++)
            yr[i] += position_row[i];
    }
}

void mt_embedding_backward(float *dwte, float *dwpe, const float *dy, const int32_t *tokens, int b,
                           int t, int c, int first_token, int token_count)
{
    int blocks = column_block_count(c);
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        int start, end;
        column_block_range(block, c, &start, &end);
        for (int row = 0; row < b * t; row++) {
            const float *dyr = dy + (long)row * c;
            float *position_grad = dwpe + (long)(row % t) * c;
            int token = tokens[row] - first_token;
#pragma omp simd
            for (int i = start; i < end; i++)
                position_grad[i] += dyr[i];
            if (token < 0 || token >= token_count)
                continue;
            float *token_grad = dwte + (long)token * c;
#pragma omp simd
            for (int i = start; i < end; i++)
                token_grad[i] += dyr[i];
        }
    }
}
