/* The end-of-training sample of a BPE corpus, in the CLI because the train layer uses no
 * tokenizer: meta.json's tokenizer encodes the prompt on every rank and decodes rank 0's text. */
#include <string.h>

#include "cli_generate.h"
#include "cli_train_sample.h"
#include "meshtrain/data.h"

static mt_status print_token(void *context, int32_t token, FILE *out)
{
    generate_text_print(context, token, out);
    return MT_OK;
}

mt_status train_sample_open(const mt_config *cfg, FILE *out, train_sample *sample)
{
    *sample = (train_sample){.text = {.out = out, .eot = -1}};
    mt_corpus_meta meta;
    int found = 0;
    if (cfg->sample_tokens == 0)
        return MT_OK;
    mt_status status = mt_corpus_meta_read(cfg->data, &meta, &found);
    if (status || !found || !meta.tokenizer[0] || strcmp(meta.tokenizer, "bytes") == 0)
        return status; /* bytes; a damaged meta.json is the trainer's to report */
    if ((status = mt_tokenizer_open(meta.tokenizer, &sample->tokenizer)))
        return mt_fail_context(MT_EINVAL, "the sample's tokenizer, '%s' of %s/meta.json "
                                          "(--sample_tokens 0 trains without a sample)",
                               meta.tokenizer, cfg->data);
    /* a model needs at least one token to condition on: an empty prompt is a newline */
    const char *prompt = cfg->prompt[0] ? cfg->prompt : "\n";
    status = mt_tokenizer_encode(sample->tokenizer, (const unsigned char *)prompt,
                                 strlen(prompt), &sample->prompt);
    if (status) {
        train_sample_close(sample);
        return status;
    }
    int32_t eot = mt_tokenizer_eot(sample->tokenizer);
    sample->text = (mt_sample_text){.out = out, .prompt = sample->prompt.ids,
                                    .prompt_length = (int)sample->prompt.count,
                                    .stops = eot >= 0, .eot = eot, .print = print_token,
                                    .context = sample->tokenizer};
    return MT_OK;
}

void train_sample_close(train_sample *sample)
{
    mt_tokenizer_free(sample->tokenizer);
    mt_token_ids_free(&sample->prompt);
    *sample = (train_sample){0};
}
