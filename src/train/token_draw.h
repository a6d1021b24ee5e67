/* Drawing the next token from a row of logits: greedy at temperature 0, else softmax at a
 * temperature over the top-k and then the top-p (nucleus) of the vocabulary. */
#ifndef MESHTRAIN_TOKEN_DRAW_H
#define MESHTRAIN_TOKEN_DRAW_H

#include <stddef.h>

/* The settings of a draw; top_k 0 keeps every token, top_p 1 keeps every kept token. */
typedef struct token_draw {
    double temperature, top_p;
    int top_k;
} token_draw;

/* Scratch for draws over a vocabulary of v tokens: v of each. */
typedef struct token_weight {
    float weight;
    int id;
} token_weight;
typedef struct token_draw_scratch {
    float *values;
    token_weight *ranked;
} token_draw_scratch;

/* The drawn token, from `uniform` in [0, 1); logits become scratch (their probabilities). The
 * same logits, settings and uniform draw the same token on every rank. */
int token_draw_pick(const token_draw *draw, float *logits, int v, double uniform,
                    token_draw_scratch *scratch);

#endif
