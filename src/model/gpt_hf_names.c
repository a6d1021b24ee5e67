/* The Hugging Face GPT-2 names of meshtrain's tensors, and how they are laid out there, so that
 * exported models load into GPT-2 code and GPT-2 files start meshtrain runs (--init). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/model.h"

/* A tensor's name after its "h.<layer>." prefix (or the whole name outside the blocks), ours
 * and GPT-2's. GPT-2 computes its linear layers with Conv1D, whose weight is (in, out): the
 * transpose of ours (nn.Linear's (out, in)). */
typedef struct name_pair {
    const char *ours, *theirs;
    int matrix, transposed;
} name_pair;

static const name_pair TOP_LEVEL[] = {
    {"wte.weight", "wte.weight", 1, 0},
    {"wpe.weight", "wpe.weight", 1, 0},
    {"lnf.weight", "ln_f.weight", 0, 0},
    {"lnf.bias", "ln_f.bias", 0, 0},
};

static const name_pair IN_BLOCK[] = {
    {"ln1.weight", "ln_1.weight", 0, 0},
    {"ln1.bias", "ln_1.bias", 0, 0},
    {"attn.qkv.weight", "attn.c_attn.weight", 1, 1},
    {"attn.qkv.bias", "attn.c_attn.bias", 0, 0},
    {"attn.proj.weight", "attn.c_proj.weight", 1, 1},
    {"attn.proj.bias", "attn.c_proj.bias", 0, 0},
    {"ln2.weight", "ln_2.weight", 0, 0},
    {"ln2.bias", "ln_2.bias", 0, 0},
    {"mlp.fc.weight", "mlp.c_fc.weight", 1, 1},
    {"mlp.fc.bias", "mlp.c_fc.bias", 0, 0},
    {"mlp.proj.weight", "mlp.c_proj.weight", 1, 1},
    {"mlp.proj.bias", "mlp.c_proj.bias", 0, 0},
};

static int found(const name_pair *pair, const char *prefix, mt_gpt_hf_tensor *out)
{
    snprintf(out->name, sizeof out->name, "%s%s", prefix, pair->theirs);
    out->matrix = pair->matrix;
    out->transposed = pair->transposed;
    return 1;
}

int mt_gpt_hf_tensor_of(const char *ours, mt_gpt_hf_tensor *out)
{
    for (size_t i = 0; i < sizeof TOP_LEVEL / sizeof TOP_LEVEL[0]; i++)
        if (strcmp(ours, TOP_LEVEL[i].ours) == 0)
            return found(&TOP_LEVEL[i], "", out);
    if (strncmp(ours, "h.", 2) != 0 || ours[2] < '0' || ours[2] > '9')
        return 0;
    char *end;
    long layer = strtol(ours + 2, &end, 10);
    if (*end != '.' || layer > 1000000)
        return 0;
    char prefix[24];
    snprintf(prefix, sizeof prefix, "h.%ld.", layer);
    size_t used = strlen(prefix);
    if (strncmp(ours, prefix, used) != 0)
        return 0; /* "h.01." and the like are not our names */
    for (size_t i = 0; i < sizeof IN_BLOCK / sizeof IN_BLOCK[0]; i++)
        if (strcmp(ours + used, IN_BLOCK[i].ours) == 0)
            return found(&IN_BLOCK[i], prefix, out);
    return 0;
}

int mt_gpt_hf_shape(const mt_gpt_hf_tensor *hf, size_t rows, size_t cols, int64_t shape[2])
{
    if (!hf->matrix) {
        shape[0] = (int64_t)(rows * (cols ? cols : 1));
        return 1;
    }
    shape[0] = (int64_t)(hf->transposed ? cols : rows);
    shape[1] = (int64_t)(hf->transposed ? rows : cols);
    return 2;
}
