/* Context parallelism in the model: ring attention over the group's key/value blocks (each
 * transfer in flight while the held block computes), its checks, and chunk positions. */
#include <math.h>
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/clock.h"
#include "meshtrain/kernels.h"

mt_status gpt_cp_check(const mt_gpt *gpt, const mt_gpt_shape *s)
{
    const mt_gpt_context_parallel *cp = &gpt->cp;
    if (cp->size == 1)
        return MT_OK;
    if (cp->rank < 0 || cp->rank >= cp->size)
        return mt_fail(MT_EINVAL, "context-parallel rank %d of %d is not a rank of the group",
                       cp->rank, cp->size);
    if (!cp->ring_start || !cp->ring_wait)
        return mt_fail(MT_EINVAL, "a context-parallel group of %d needs its ring transfers",
                       cp->size);
    if (s->context % (2 * cp->size))
        return mt_fail(MT_EINVAL, "context parallelism cp %d cuts each sequence into 2 x %d "
                                  "chunks, which context %d does not divide", cp->size,
                       cp->size, s->context);
    if (gpt->attention != MT_ATTENTION_FUSED)
        return mt_fail(MT_EINVAL, "context parallelism runs ring attention on the fused "
                                  "kernel's blocks: use attention fused with cp %d", cp->size);
    /* bf16's rounded activations are widened into fp32 scratch before attention reads them,
     * so the ring computes on fp32 blocks as it does in fp32; fp16 is untested with it */
    if (gpt->precision == MT_PRECISION_FP16)
        return mt_fail(MT_EINVAL, "context parallelism runs in fp32 or bf16, not %s",
                       mt_gpt_precision_name(gpt->precision));
    if (gpt->stage.split_backward)
        return mt_fail(MT_EINVAL, "context parallelism (cp %d) does not run with split "
                                  "(zero-bubble) backwards", cp->size);
    if (gpt->recompute == MT_RECOMPUTE_FULL)
        return mt_fail(MT_EINVAL, "context parallelism (cp %d) does not run with full "
                                  "recomputation", cp->size);
    return MT_OK;
}

/* The k and v columns of qkv [rows, 3c] as a block [rows, 2c]. */
static void pack_kv(float *kv, const float *qkv, long rows, int c)
{
    for (long r = 0; r < rows; r++)
        memcpy(kv + r * 2 * c, qkv + r * 3 * c + c, sizeof(float) * 2 * (size_t)c);
}

static mt_status ring_start(mt_gpt *gpt, int channel, const float *send, float *recv,
                            size_t count)
{
    mt_status status = gpt->cp.ring_start(gpt->cp.context, channel, send, recv, count);
    return status ? mt_fail_context(status, "context parallelism: starting a ring transfer")
                  : MT_OK;
}

/* Time spent here is the ring's exposed part: the rest overlapped the computation. */
static mt_status ring_wait(mt_gpt *gpt, int channel)
{
    double start = mt_clock_seconds();
    mt_status status = gpt->cp.ring_wait(gpt->cp.context, channel);
    gpt->cp_wait_seconds += mt_clock_seconds() - start;
    return status ? mt_fail_context(status, "context parallelism: waiting for a ring transfer")
                  : MT_OK;
}

/* Where this rank's chunks, and the ones it holds after `step` steps of the ring, sit. */
static void places(const mt_gpt *gpt, int step, int mine[2], int theirs[2])
{
    int size = gpt->cp.size, rank = gpt->cp.rank, holder = (rank - step + size) % size;
    mine[0] = rank, mine[1] = 2 * size - 1 - rank;
    theirs[0] = holder, theirs[1] = 2 * size - 1 - holder;
}

/* Step s computes with the block of rank r - s while the ring brings the next one. */
mt_status gpt_ring_forward(mt_gpt *gpt, gpt_block_acts *a)
{
    /* this tensor-parallel rank's heads: c and heads are c / tp and heads / tp */
    int size = gpt->cp.size, c = gpt->shape.width / gpt->tp.size;
    int heads = gpt->shape.heads / gpt->tp.size;
    int chunk = gpt->t / 2;
    long rows = (long)gpt->b * gpt->t;
    size_t count = (size_t)rows * 2 * (size_t)c;
    float **kv = gpt->acts->ring_kv;
    memset(a->atty, 0, sizeof(float) * (size_t)rows * (size_t)c);
    for (long i = 0; i < rows * heads; i++)
        a->lse[i] = -INFINITY;
    pack_kv(kv[0], a->qkv, rows, c);
    mt_status status = MT_OK;
    for (int step = 0; status == MT_OK && step < size; step++) {
        int mine[2], theirs[2], more = step + 1 < size;
        places(gpt, step, mine, theirs);
        const float *held = kv[step % 2];
        if (more && (status = ring_start(gpt, 0, held, kv[(step + 1) % 2], count)))
            return status;
        mt_attention_ring_forward(a->atty, a->lse, a->qkv, held, gpt->b, chunk, c, heads, mine,
                                  theirs);
        if (more)
            status = ring_wait(gpt, 0);
    }
    return status;
}

/* The key/value blocks go round again; each block's gradient follows it one step behind:
 * a rank adds its share to what the previous rank sent and passes the sum on, so after the
 * last step every rank receives its own block's whole gradient. Its share is made while the
 * previous share is in flight. */
mt_status gpt_ring_backward(mt_gpt *gpt, const float *qkv, const float *atty, const float *lse)
{
    int size = gpt->cp.size, c = gpt->shape.width / gpt->tp.size;
    int heads = gpt->shape.heads / gpt->tp.size;
    int chunk = gpt->t / 2;
    long rows = (long)gpt->b * gpt->t;
    size_t count = (size_t)rows * 2 * (size_t)c;
    mt_gpt_activations *s = gpt->acts;
    float **kv = s->ring_kv, **made = s->ring_dkv, **got = s->ring_dkv + 2;
    memset(s->dqkv, 0, sizeof(float) * (size_t)rows * 3 * (size_t)c);
    pack_kv(kv[0], qkv, rows, c);
    mt_status status = MT_OK;
    for (int step = 0; status == MT_OK && step < size; step++) {
        int mine[2], theirs[2], more = step + 1 < size;
        places(gpt, step, mine, theirs);
        const float *held = kv[step % 2];
        float *share = made[step % 2];
        if (more && (status = ring_start(gpt, 0, held, kv[(step + 1) % 2], count)))
            return status;
        memset(share, 0, sizeof(float) * count);
        mt_attention_ring_backward(s->dqkv, share, s->datty, atty, lse, qkv, held, gpt->b, chunk,
                                   c, heads, mine, theirs);
        if (step > 0) {
            if ((status = ring_wait(gpt, 1)))
                return status;
            const float *before = got[(step - 1) % 2];
            for (size_t i = 0; i < count; i++)
                share[i] += before[i];
        }
        if ((status = ring_start(gpt, 1, share, got[step % 2], count)))
            return status;
        if (more)
            status = ring_wait(gpt, 0);
    }
    if (status == MT_OK)
        status = ring_wait(gpt, 1);
    const float *own = got[(size - 1) % 2];
    for (long r = 0; status == MT_OK && r < rows; r++)
        memcpy(s->dqkv + r * 3 * c + c, own + r * 2 * c, sizeof(float) * 2 * (size_t)c);
    return status;
}

/* Row k * chunk of each sequence starts chunk places[k] of the whole sequence. */
void gpt_cp_embed_forward(mt_gpt *gpt, const float *wte, const float *wpe)
{
    int chunk = gpt->t / 2, c = gpt->shape.width, mine[2], theirs[2];
    places(gpt, 0, mine, theirs);
    mt_gpt_activations *a = gpt->acts;
    for (int seq = 0; seq < gpt->b; seq++)
        for (int k = 0; k < 2; k++) {
            long row = (long)seq * gpt->t + (long)k * chunk;
            mt_embedding_forward(a->encoded + row * c, a->tokens + row, wte,
                                 wpe + (long)mine[k] * chunk * c, 1, chunk, c);
        }
}

void gpt_cp_position_add(const mt_gpt *gpt, float *y, const float *wpe)
{
    int chunk = gpt->t / 2, c = gpt->shape.width, mine[2], theirs[2];
    places(gpt, 0, mine, theirs);
    for (int i = 0; i < gpt->rows_local; i++) {
        int at = (gpt->first_row + i) % gpt->t, position = mine[at / chunk] * chunk + at % chunk;
        const float *p = wpe + (long)position * c;
        float *row = y + (long)i * c;
        for (int d = 0; d < c; d++)
            row[d] += p[d];
    }
}

void gpt_cp_embed_backward(mt_gpt *gpt, float *dwte, float *dwpe, const float *dy,
                           int first_token, int count)
{
    int chunk = gpt->t / 2, c = gpt->shape.width, mine[2], theirs[2];
    places(gpt, 0, mine, theirs);
    mt_gpt_activations *a = gpt->acts;
    for (int seq = 0; seq < gpt->b; seq++)
        for (int k = 0; k < 2; k++) {
            long row = (long)seq * gpt->t + (long)k * chunk;
            mt_embedding_backward(dwte, dwpe + (long)mine[k] * chunk * c, dy + row * c,
                                  a->tokens + row, 1, chunk, c, first_token, count);
        }
}
