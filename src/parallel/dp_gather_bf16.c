/* ZeRO-3's gather of a block for a pass under bf16: its matrices travel rounded to bf16 (the
 * model reads them through bf16 compute copies anyway), its norms and biases whole in fp32. */
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "meshtrain/half.h"

/* Why not every element in bf16: the model reads norms and biases in fp32, and a norm weight
 * near 1 rounded to bf16 (steps of 2^-7) would lose every AdamW step smaller than that.
 * Each rank packs its slice as a stream of 2-byte words, a matrix element one word (its bf16
 * bits), a vector element two (its fp32 bits, high word first), and the streams are
 * all-gathered as 2-byte elements; no sum is taken. An element never takes more than its
 * 4 bytes, so the stream lands in the gathered buffer itself and is unpacked there from the
 * end (every element's words lie at or below its own place). */

static int is_matrix(const mt_gpt *gpt, int unit, size_t at, size_t *run_end)
{
    const mt_unit *u = &gpt->units[unit];
    for (int i = u->first_param; i < u->first_param + u->param_count; i++) {
        const mt_param_info *p = &gpt->params[i];
        size_t lo = p->offset - u->offset, hi = lo + p->numel;
        if (at >= lo && at < hi) {
            *run_end = hi;
            return p->cols > 0;
        }
    }
    *run_end = u->numel;
    return 0;
}

/* Words of the stream for elements [first, first + count) of a block. */
static size_t words_of(const mt_gpt *gpt, int unit, size_t first, size_t count)
{
    size_t words = 0, end;
    for (size_t at = first; at < first + count; at = end) {
        int matrix = is_matrix(gpt, unit, at, &end);
        end = end < first + count ? end : first + count;
        words += (end - at) * (matrix ? 1 : 2);
    }
    return words;
}

mt_status dp_gather_bf16_plan(mt_dp_model *m)
{
    const mt_gpt *gpt = m->gpt;
    m->packed_counts = calloc((size_t)gpt->unit_count * (size_t)m->size, sizeof(size_t));
    if (!m->packed_counts)
        return mt_fail(MT_ENOMEM, "data parallel: out of memory");
    for (int u = 0; u < gpt->unit_count; u++) {
        const size_t *counts = m->counts + (size_t)u * m->size;
        size_t first = 0;
        for (int r = 0; r < m->size; r++) {
            m->packed_counts[(size_t)u * m->size + r] = words_of(gpt, u, first, counts[r]);
            first += counts[r];
        }
    }
    return MT_OK;
}

mt_status dp_gather_bf16_start(mt_dp_model *m, int unit, float *out, mt_work **work)
{
    const mt_gpt *gpt = m->gpt;
    const size_t *words = m->packed_counts + (size_t)unit * m->size;
    size_t at = 0, first = m->slices[unit].first, count = m->slices[unit].count, end;
    for (int r = 0; r < m->rank; r++)
        at += words[r];
    uint16_t *stream = (uint16_t *)out + at;
    const float *slice = m->slice_param + m->slices[unit].local;
    for (size_t i = first; i < first + count; i = end) {
        int matrix = is_matrix(gpt, unit, i, &end);
        end = end < first + count ? end : first + count;
        const float *from = slice + (i - first);
        size_t n = end - i;
        if (matrix) {
            mt_half_from_f32(MT_HALF_BF16, stream, from, n);
            stream += n;
        } else {
            for (size_t j = 0; j < n; j++) {
                uint32_t bits;
                memcpy(&bits, &from[j], sizeof bits);
                *stream++ = (uint16_t)(bits >> 16);
                *stream++ = (uint16_t)bits;
            }
        }
    }
    return mt_comm_allgatherv_async(m->group, (uint16_t *)out + at, out, words, MT_BF16, work);
}

void dp_gather_bf16_unpack(mt_dp_model *m, int unit, float *data)
{
    const mt_gpt *gpt = m->gpt;
    const size_t *words = m->packed_counts + (size_t)unit * m->size;
    size_t total = 0;
    for (int r = 0; r < m->size; r++)
        total += words[r];
    const uint16_t *stream = (const uint16_t *)data + total;
    size_t i = gpt->units[unit].numel;
    /* Runs from the end: each run is one parameter (or the part of it in one slice: a slice
     * boundary changes nothing, the stream being the slices' streams one after another). */
    while (i > 0) {
        size_t end, lo = 0;
        const mt_unit *u = &gpt->units[unit];
        for (int p = u->first_param; p < u->first_param + u->param_count; p++) {
            size_t start = gpt->params[p].offset - u->offset;
            if (start < i)
                lo = start;
        }
        int matrix = is_matrix(gpt, unit, lo, &end);
        for (size_t j = i; j-- > lo;) {
            if (matrix) {
                data[j] = mt_half_bf16_to_f32(*--stream);
            } else {
                uint32_t bits = (uint32_t)stream[-2] << 16 | stream[-1];
                stream -= 2;
                memcpy(&data[j], &bits, sizeof bits);
            }
        }
        i = lo;
    }
}
