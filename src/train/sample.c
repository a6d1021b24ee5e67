/* The text sample at the end of a run: the prompt's bytes continued by mt_generate, each token
 * printed as its byte (tokens past the bytes as '?': the trainer knows no tokenizer). */
#include <string.h>

#include "meshtrain/train.h"

static mt_status print_byte(void *context, int32_t token, const float *logits, int vocab)
{
    (void)logits;
    (void)vocab;
    FILE *out = context;
    if (out)
        fputc(token < 256 ? token : '?', out);
    return MT_OK;
}

mt_status mt_sample_text(const mt_forward *f, const mt_config *cfg, FILE *out)
{
    int context = f->gpt->shape.context;
    size_t length = strlen(cfg->prompt);
    /* a model needs at least one token to condition on; a long prompt keeps its end */
    int32_t newline = '\n', *prompt = NULL;
    size_t skip = length > (size_t)context ? length - (size_t)context : 0;
    if (out)
        fputs(cfg->prompt, out);
    int32_t tokens[MT_TEXT_MAX];
    for (size_t i = skip; i < length; i++)
        tokens[i - skip] = (unsigned char)cfg->prompt[i];
    prompt = length ? tokens : &newline;
    mt_generate_options o = {.tokens = cfg->sample_tokens, .temperature = cfg->temperature,
                             .top_k = cfg->top_k, .top_p = 1, .seed = cfg->seed,
                             .emit = print_byte, .context = out};
    mt_status status = mt_generate(f, prompt, length ? (int)(length - skip) : 1, &o);
    if (out) {
        fputc('\n', out);
        fflush(out);
    }
    return status;
}
