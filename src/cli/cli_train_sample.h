/* The end-of-training sample's text on the CLI side: the corpus's tokenizer (its meta.json's),
 * which the trainer may not use, encodes the prompt and prints each drawn token. */
#ifndef MESHTRAIN_CLI_TRAIN_SAMPLE_H
#define MESHTRAIN_CLI_TRAIN_SAMPLE_H

#include <stdio.h>

#include "meshtrain/config.h"
#include "meshtrain/tokenizer.h"
#include "meshtrain/train.h"

typedef struct train_sample {
    mt_tokenizer *tokenizer; /* NULL: a byte corpus, or no sample */
    mt_token_ids prompt;
    mt_sample_text text;     /* what mt_train_run takes */
} train_sample;

/* The sample of a run on cfg->data, printed to out: bytes for a byte corpus, else the
 * tokenizer that meta.json names (one that does not open is an error naming it), whose
 * end-of-text token ends the sample. Nothing to open when cfg->sample_tokens is 0. */
mt_status train_sample_open(const mt_config *cfg, FILE *out, train_sample *sample);
void train_sample_close(train_sample *sample);

#endif
