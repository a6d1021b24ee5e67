/* A block's attention on the kernels the model was made with: plain (probabilities kept) or
 * fused (only each row's log-sum-exp kept), and what each keeps for the backward. */
#include <string.h>

#include "gpt_internal.h"
#include "meshtrain/kernels.h"

static const char *const NAMES[] = {"plain", "fused"};

mt_status mt_gpt_attention_parse(const char *text, mt_gpt_attention *out)
{
    for (int k = MT_ATTENTION_PLAIN; k <= MT_ATTENTION_FUSED; k++)
        if (strcmp(text, NAMES[k]) == 0) {
            *out = (mt_gpt_attention)k;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "'%s' is not plain or fused", text);
}

const char *mt_gpt_attention_name(mt_gpt_attention attention)
{
    return attention == MT_ATTENTION_PLAIN || attention == MT_ATTENTION_FUSED ? NAMES[attention]
                                                                               : "unknown";
}

mt_status mt_gpt_attention_check(const mt_gpt_shape *shape, mt_gpt_attention attention)
{
    if (attention != MT_ATTENTION_PLAIN && attention != MT_ATTENTION_FUSED)
        return mt_fail(MT_EINVAL, "attention kernel %d is not plain or fused", (int)attention);
    if (attention == MT_ATTENTION_FUSED && shape->heads > 0 && shape->width % shape->heads == 0 &&
        !mt_attention_fused_supports(shape->width / shape->heads))
        return mt_fail(MT_EINVAL, "fused attention takes head sizes (width / heads) of 4 to 256 "
                                  "in steps of 4, and width %d / heads %d is %d: use attention "
                                  "plain or another width or heads", shape->width, shape->heads,
                       shape->width / shape->heads);
    return MT_OK;
}

mt_status gpt_attention_forward(mt_gpt *gpt, gpt_block_acts *a)
{
    int c_tp = gpt->shape.width / gpt->tp.size, heads_tp = gpt->shape.heads / gpt->tp.size;
    if (gpt->cp.size > 1)
        return gpt_ring_forward(gpt, a);
    if (gpt->attention == MT_ATTENTION_FUSED)
        mt_attention_fused_forward(a->atty, a->lse, a->qkv, gpt->b, gpt->t, c_tp, heads_tp);
    else
        mt_attention_forward(a->atty, a->probs, a->qkv, gpt->b, gpt->t, c_tp, heads_tp);
    return MT_OK;
}

int gpt_attention_remakes_probs(const mt_gpt *gpt)
{
    return gpt->attention == MT_ATTENTION_PLAIN && gpt->recompute == MT_RECOMPUTE_SELECTIVE;
}

mt_status gpt_attention_backward(mt_gpt *gpt, const float *qkv, const float *atty,
                                 const float *saved)
{
    int c_tp = gpt->shape.width / gpt->tp.size, heads_tp = gpt->shape.heads / gpt->tp.size;
    mt_gpt_activations *s = gpt->acts;
    if (gpt->cp.size > 1)
        return gpt_ring_backward(gpt, qkv, atty, saved);
    if (gpt->attention == MT_ATTENTION_FUSED)
        mt_attention_fused_backward(s->dqkv, s->datty, atty, saved, qkv, gpt->b, gpt->t, c_tp,
                                    heads_tp);
    else
        mt_attention_backward(s->dqkv, s->dprobs, s->datty, saved, qkv, gpt->b, gpt->t, c_tp,
                              heads_tp);
    return MT_OK;
}
