/* The text of `meshtrain generate`: the prompt encoded by a tokenizer or taken as bytes, and
 * every drawn token's bytes written and flushed at once (a UTF-8 character that two tokens
 * share appears as its bytes arrive). */
#include <stdlib.h>
#include <string.h>

#include "cli_generate.h"
#include "meshtrain/clock.h"

mt_status generate_text_prompt(const generate_text *text, const unsigned char *prompt,
                               size_t length, int model_vocab, int32_t **ids, int *count)
{
    if (length == 0)
        return mt_fail(MT_EINVAL, "the prompt is empty: give --prompt TEXT or --prompt_file F "
                                  "with at least one byte");
    if (!text->tokenizer && model_vocab > 256)
        return mt_fail(MT_EINVAL, "the model's vocabulary has %d tokens, not bytes: give "
                                  "--tokenizer tok.json or --tokenizer gpt2:DIR (the one it was "
                                  "trained with)", model_vocab);
    if (text->tokenizer && mt_tokenizer_vocab_size(text->tokenizer) > model_vocab)
        return mt_fail(MT_EINVAL, "--tokenizer has %d tokens, more than the model's vocabulary "
                                  "of %d: it is not the model's tokenizer",
                       mt_tokenizer_vocab_size(text->tokenizer), model_vocab);
    mt_token_ids encoded = {0};
    if (text->tokenizer) {
        mt_status status = mt_tokenizer_encode(text->tokenizer, prompt, length, &encoded);
        if (status) {
            mt_token_ids_free(&encoded);
            return status;
        }
        *ids = encoded.ids;
        *count = (int)encoded.count;
        return MT_OK;
    }
    *ids = malloc(sizeof **ids * length);
    if (!*ids)
        return mt_fail(MT_ENOMEM, "cannot hold the prompt's %zu bytes", length);
    for (size_t i = 0; i < length; i++)
        (*ids)[i] = prompt[i];
    *count = (int)length;
    return MT_OK;
}

void generate_text_print(const mt_tokenizer *tokenizer, int32_t token, FILE *out)
{
    if (!tokenizer || token >= mt_tokenizer_vocab_size(tokenizer)) {
        fputc(token < 256 && !tokenizer ? token : '?', out);
        return;
    }
    unsigned char *bytes = NULL;
    size_t length = 0;
    if (mt_tokenizer_decode(tokenizer, &token, 1, &bytes, &length) == MT_OK)
        fwrite(bytes, 1, length, out);
    free(bytes);
}

mt_status generate_text_emit(void *context, int32_t token, const float *logits, int vocab)
{
    generate_text *text = context;
    double now = mt_clock_seconds();
    if (text->emitted++ == 0)
        text->first_at = now;
    text->last_at = now;
    if (text->stops && token == text->eot)
        text->ended = 1; /* the text ends here: its marker is not part of it */
    else if (text->out) {
        generate_text_print(text->tokenizer, token, text->out);
        fflush(text->out);
    }
    if (text->dump && (fwrite(&token, sizeof token, 1, text->dump) != 1 ||
                       fwrite(logits, sizeof *logits, (size_t)vocab, text->dump) != (size_t)vocab))
        return mt_fail(MT_EIO, "cannot write the --dump file");
    return MT_OK;
}
