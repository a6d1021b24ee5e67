/* The text sample at the end of a run: the prompt continued by mt_generate, printed by the
 * caller's tokenizer or, for a byte corpus, each token as its byte (tokens past the bytes as
 * '?': the trainer itself knows no tokenizer). */
#include <string.h>

#include "meshtrain/train.h"

typedef struct sample_printer {
    const mt_sample_text *text;
    int drawn;
    int ended; /* drew the end-of-text token */
} sample_printer;

static mt_status print_token(void *context, int32_t token, const float *logits, int vocab)
{
    (void)logits;
    (void)vocab;
    sample_printer *p = context;
    const mt_sample_text *text = p->text;
    p->drawn++;
    if (text->stops && token == text->eot) {
        p->ended = 1;
        return MT_OK;
    }
    if (!text->out)
        return MT_OK;
    if (text->print)
        return text->print(text->context, token, text->out);
    fputc(token < 256 ? token : '?', text->out);
    return MT_OK;
}

mt_status mt_sample_generate(const mt_forward *f, const mt_config *cfg,
                             const mt_sample_text *text)
{
    int context = f->gpt->shape.context;
    FILE *out = text->out;
    int32_t newline = '\n', tokens[MT_TEXT_MAX];
    const int32_t *prompt;
    size_t length;
    if (text->prompt) {
        prompt = text->prompt;
        length = (size_t)text->prompt_length;
    } else {
        /* a model needs at least one token to condition on */
        length = strlen(cfg->prompt);
        for (size_t i = 0; i < length; i++)
            tokens[i] = (unsigned char)cfg->prompt[i];
        prompt = length ? tokens : &newline;
        length = length ? length : 1;
    }
    /* a long prompt keeps its end */
    size_t skip = length > (size_t)context ? length - (size_t)context : 0;
    if (out)
        fputs(cfg->prompt, out);
    sample_printer printer = {.text = text};
    mt_generate_options o = {.tokens = cfg->sample_tokens, .temperature = cfg->temperature,
                             .top_k = cfg->top_k, .top_p = 1, .seed = cfg->seed,
                             .stops = text->stops, .stop = text->eot,
                             .emit = print_token, .context = &printer};
    mt_status status = mt_generate(f, prompt + skip, (int)(length - skip), &o);
    if (out) {
        fputc('\n', out);
        if (status == MT_OK && printer.ended)
            fprintf(out, "--- end of text after %d tokens ---\n", printer.drawn);
        fflush(out);
    }
    return status;
}
