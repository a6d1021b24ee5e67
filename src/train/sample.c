/* Text generation at the end of a run: continue the prompt token by token, from the last
 * position's logits, with temperature and top-k; random draws keyed by (seed, position). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/rng.h"
#include "meshtrain/train.h"

/* The k-th largest value of v[0..n) (1-based k), by quickselect on a scratch copy. */
static float kth_largest(const float *v, int n, int k, float *scratch)
{
    memcpy(scratch, v, sizeof(float) * n);
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = scratch[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (scratch[i] > pivot)
                i++;
            while (scratch[j] < pivot)
                j--;
            if (i <= j) {
                float tmp = scratch[i];
                scratch[i++] = scratch[j];
                scratch[j--] = tmp;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return scratch[want];
}

/* Draws a token from softmax(logits / temperature), keeping only the top_k largest. */
static int draw_token(float *logits, int v, const mt_config *cfg, double uniform, float *scratch)
{
    float threshold = -INFINITY;
    if (cfg->top_k > 0 && cfg->top_k < v)
        threshold = kth_largest(logits, v, cfg->top_k, scratch);
    float max = -INFINITY;
    for (int i = 0; i < v; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < v; i++) {
        double p = logits[i] >= threshold ? exp((logits[i] - max) / cfg->temperature) : 0.0;
        logits[i] = (float)p;
        sum += p;
    }
    double target = uniform * sum, running = 0;
    int last = 0;
    for (int i = 0; i < v; i++) {
        if (logits[i] <= 0)
            continue;
        running += logits[i];
        last = i;
        if (running > target)
            return i;
    }
    return last;
}

mt_status mt_sample_text(const mt_forward *f, const mt_config *cfg, FILE *out)
{
    int context = f->gpt->shape.context, v = f->gpt->shape.vocab;
    size_t prompt_length = strlen(cfg->prompt);
    size_t capacity = prompt_length + (size_t)cfg->sample_tokens + 1;
    int32_t *tokens = malloc(capacity * sizeof *tokens);
    float *logits = malloc(sizeof(float) * v * 2);
    if (!tokens || !logits) {
        free(tokens);
        free(logits);
        return mt_fail(MT_ENOMEM, "cannot allocate the sampling buffers");
    }
    size_t length = 0;
    if (prompt_length == 0)
        tokens[length++] = '\n'; /* a model needs at least one token to condition on */
    for (size_t i = 0; i < prompt_length; i++)
        tokens[length++] = (unsigned char)cfg->prompt[i];
    if (out)
        fputs(cfg->prompt, out);
    mt_rng rng = {cfg->seed, mt_name_hash("sample")};
    mt_status status = MT_OK;
    for (int produced = 0; produced < cfg->sample_tokens; produced++) {
        size_t window = length < (size_t)context ? length : (size_t)context;
        if ((status = mt_forward_next_logits(f, tokens + length - window, (int)window, logits)))
            break;
        int token = draw_token(logits, v, cfg, mt_rng_uniform(rng, (uint64_t)produced), logits + v);
        tokens[length++] = token;
        if (out)
            fputc(token < 256 ? token : '?', out);
    }
    if (out) {
        fputc('\n', out);
        fflush(out);
    }
    free(tokens);
    free(logits);
    return status;
}
