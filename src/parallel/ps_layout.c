/* The parameter space over the servers: each server a contiguous run of whole tensors of the
 * tensor-parallel ranks' tables, balanced by bytes. */
#include <stdlib.h>

#include "meshtrain/ps.h"

mt_status mt_ps_layout_plan(const mt_gpt *gpt, int tp, int servers, mt_ps_layout *out)
{
    *out = (mt_ps_layout){.servers = servers, .tp = tp};
    out->ranges = calloc((size_t)servers * (size_t)tp, sizeof *out->ranges);
    if (!out->ranges)
        return mt_fail(MT_ENOMEM, "parameter servers: out of memory for the layout");
    for (int i = 1; i < gpt->param_count; i++)
        if (gpt->params[i].offset != gpt->params[i - 1].offset + gpt->params[i - 1].numel) {
            mt_ps_layout_free(out);
            return mt_fail(MT_EINVAL, "parameter servers: tensor '%s' does not follow the one "
                                      "before it in the table", gpt->params[i].name);
        }
    double total = (double)tp * (double)gpt->numel;
    for (int j = 0; j < tp; j++)
        for (int i = 0; i < gpt->param_count; i++) {
            const mt_param_info *p = &gpt->params[i];
            double middle = (double)j * (double)gpt->numel + (double)p->offset + 0.5 * (double)p->numel;
            int s = (int)(middle * servers / total);
            s = s < servers ? s : servers - 1;
            mt_ps_range *r = &out->ranges[s * tp + j];
            if (r->hi == r->lo)
                r->lo = p->offset;
            r->hi = p->offset + p->numel;
        }
    return MT_OK;
}

void mt_ps_layout_free(mt_ps_layout *layout)
{
    free(layout->ranges);
    layout->ranges = NULL;
}
