/* Matrix transpose in cache-sized tiles: the layout change between our (out, in) weights and
 * GPT-2's (in, out) ones on export and --init. */
#include "meshtrain/kernels.h"

void mt_transpose(const float *in, size_t rows, size_t cols, float *out)
{
    enum { TILE = 32 }; /* a tile of the input and of the output both stay in L1 */
    for (size_t r0 = 0; r0 < rows; r0 += TILE)
        for (size_t c0 = 0; c0 < cols; c0 += TILE)
            for (size_t r = r0; r < rows && r < r0 + TILE; r++)
                for (size_t c = c0; c < cols && c < c0 + TILE; c++)
                    out[c * rows + r] = in[r * cols + c];
}
