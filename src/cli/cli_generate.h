/* `meshtrain generate`'s text side, apart from its flags and layout: the prompt as token ids
 * and each drawn token printed as it comes, by a tokenizer or as bytes. */
#ifndef MESHTRAIN_CLI_GENERATE_H
#define MESHTRAIN_CLI_GENERATE_H

#include <stdint.h>
#include <stdio.h>

#include "meshtrain/status.h"
#include "meshtrain/tokenizer.h"

/* How tokens become text: `tokenizer`, or bytes (NULL: ids past 255 print as '?'). */
typedef struct generate_text {
    mt_tokenizer *tokenizer;
    FILE *out;        /* the text, flushed per token (NULL: a rank that prints nothing) */
    FILE *dump;       /* per token: its int32 id, then its vocab float32 logits (or NULL) */
    int stops;        /* 1: the end-of-text token `eot` ends the stream, unprinted */
    int32_t eot;
    int ended;        /* drew it */
    int emitted;
    double first_at, last_at; /* clock seconds of the first and the last token */
} generate_text;

/* The prompt's ids (free() *ids): the tokenizer's encoding or the bytes; an empty prompt or a
 * byte model given a vocabulary past 256 without a tokenizer is an error naming the flag. */
mt_status generate_text_prompt(const generate_text *text, const unsigned char *prompt,
                               size_t length, int model_vocab, int32_t **ids, int *count);
/* The token's bytes by `tokenizer` (NULL: the token is a byte) to out; a token the tokenizer
 * (or the bytes) cannot spell prints as '?'. */
void generate_text_print(const mt_tokenizer *tokenizer, int32_t token, FILE *out);
/* mt_generate_options.emit: prints the token (and dumps its logits), on this rank. */
mt_status generate_text_emit(void *context, int32_t token, const float *logits, int vocab);

#endif
