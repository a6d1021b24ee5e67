/* BPE training: count the pairs of adjacent ids over the distinct words once, then repeatedly
 * merge the most frequent pair (ties: lowest ids), updating only the words that hold it. */
#include <stdlib.h>
#include <string.h>

#include "text_internal.h"
#include "train_words.h"

typedef struct pair_entry {
    int64_t count;
    int32_t left, right;
} pair_entry;

typedef struct pair_state {
    int64_t count, pushed;    /* now, and in the newest heap entry */
    int32_t left, right;
    int32_t *words;           /* words that held this pair when it appeared in them */
    int32_t n_words, word_capacity;
    uint32_t touched;         /* the merge that last changed this pair */
} pair_state;

typedef struct trainer {
    text_words words;
    text_pair_map index;      /* (left, right) -> pair_state index */
    pair_state *pairs;
    int32_t n_pairs, pair_capacity;
    int32_t *touched;         /* pairs changed by the current merge */
    int32_t n_touched, touched_capacity;
    pair_entry *heap;
    size_t heap_count, heap_capacity;
    uint32_t *word_seen;      /* per word, the merge that last rewrote it */
} trainer;

static int before(pair_entry a, pair_entry b)
{
    if (a.count != b.count)
        return a.count > b.count;
    if (a.left != b.left)
        return a.left < b.left;
    return a.right < b.right;
}

static mt_status heap_push(trainer *tr, pair_entry e)
{
    if (tr->heap_count == tr->heap_capacity) {
        size_t capacity = tr->heap_capacity ? 2 * tr->heap_capacity : 1 << 14;
        pair_entry *grown = realloc(tr->heap, capacity * sizeof *grown);
        if (!grown)
            return mt_fail(MT_ENOMEM, "no memory for the pair heap");
        tr->heap = grown;
        tr->heap_capacity = capacity;
    }
    size_t i = tr->heap_count++;
    while (i > 0 && before(e, tr->heap[(i - 1) / 2])) {
        tr->heap[i] = tr->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    tr->heap[i] = e;
    return MT_OK;
}

static pair_entry heap_pop(trainer *tr)
{
    pair_entry top = tr->heap[0], last = tr->heap[--tr->heap_count];
    size_t i = 0, n = tr->heap_count;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(tr->heap[c + 1], tr->heap[c]))
            c++;
        if (!before(tr->heap[c], last))
            break;
        tr->heap[i] = tr->heap[c];
        i = c;
    }
    if (n)
        tr->heap[i] = last;
    return top;
}

static mt_status grow_array(void **array, int32_t *capacity, size_t element, int32_t need)
{
    if (need <= *capacity)
        return MT_OK;
    int32_t c = *capacity ? *capacity : 8;
    while (c < need)
        c *= 2;
    void *grown = realloc(*array, (size_t)c * element);
    if (!grown)
        return mt_fail(MT_ENOMEM, "no memory while training the tokenizer");
    *array = grown;
    *capacity = c;
    return MT_OK;
}

/* Adds `delta` occurrences of (left, right); `word` >= 0 joins the pair's word list. */
static mt_status pair_add(trainer *tr, int32_t left, int32_t right, int64_t delta,
                          int32_t word, uint32_t merge)
{
    uint64_t key = text_pair_key(left, right);
    int32_t p = text_pair_map_get(&tr->index, key);
    mt_status status;
    if (p < 0) {
        if ((status = grow_array((void **)&tr->pairs, &tr->pair_capacity, sizeof *tr->pairs,
                                 tr->n_pairs + 1)))
            return status;
        p = tr->n_pairs++;
        tr->pairs[p] = (pair_state){.left = left, .right = right, .touched = UINT32_MAX};
        if ((status = text_pair_map_put(&tr->index, key, p)))
            return status;
    }
    pair_state *ps = &tr->pairs[p];
    ps->count += delta;
    if (word >= 0) {
        if ((status = grow_array((void **)&ps->words, &ps->word_capacity, sizeof *ps->words,
                                 ps->n_words + 1)))
            return status;
        ps->words[ps->n_words++] = word;
    }
    if (ps->touched != merge) {
        ps->touched = merge;
        if ((status = grow_array((void **)&tr->touched, &tr->touched_capacity,
                                 sizeof *tr->touched, tr->n_touched + 1)))
            return status;
        tr->touched[tr->n_touched++] = p;
    }
    return MT_OK;
}

/* Pushes the heap entries of the pairs the last merge changed. */
static mt_status push_touched(trainer *tr)
{
    for (int32_t i = 0; i < tr->n_touched; i++) {
        pair_state *ps = &tr->pairs[tr->touched[i]];
        if (ps->count <= 0 || ps->count == ps->pushed)
            continue;
        ps->pushed = ps->count;
        mt_status status = heap_push(tr, (pair_entry){ps->count, ps->left, ps->right});
        if (status)
            return status;
    }
    tr->n_touched = 0;
    return MT_OK;
}

/* Adds (sign +1) or removes (-1) every adjacent pair of word w. */
static mt_status count_word(trainer *tr, int32_t w, int sign, int32_t listed_id, uint32_t merge)
{
    const int32_t *s = tr->words.symbols + tr->words.start[w];
    int64_t delta = sign * tr->words.occurrences[w];
    for (int32_t i = 0; i + 1 < tr->words.length[w]; i++) {
        int listed = listed_id < 0 || s[i] == listed_id || s[i + 1] == listed_id;
        mt_status status = pair_add(tr, s[i], s[i + 1], delta, listed ? w : -1, merge);
        if (status)
            return status;
    }
    return MT_OK;
}

/* Rewrites word w with (left, right) -> id, every occurrence left to right; 0 if none. */
static int merge_in_word(trainer *tr, int32_t w, int32_t left, int32_t right, int32_t id)
{
    int32_t *s = tr->words.symbols + tr->words.start[w];
    int32_t n = tr->words.length[w], j = 0;
    for (int32_t i = 0; i < n; j++) {
        if (i + 1 < n && s[i] == left && s[i + 1] == right) {
            s[j] = id;
            i += 2;
        } else {
            s[j] = s[i++];
        }
    }
    tr->words.length[w] = j;
    return j < n;
}

static int holds(const trainer *tr, int32_t w, int32_t left, int32_t right)
{
    const int32_t *s = tr->words.symbols + tr->words.start[w];
    for (int32_t i = 0; i + 1 < tr->words.length[w]; i++)
        if (s[i] == left && s[i + 1] == right)
            return 1;
    return 0;
}

static mt_status apply_merge(trainer *tr, int32_t p, int32_t id, uint32_t merge)
{
    int32_t left = tr->pairs[p].left, right = tr->pairs[p].right;
    int32_t *list = tr->pairs[p].words, n = tr->pairs[p].n_words;
    tr->pairs[p].words = NULL;
    tr->pairs[p].n_words = tr->pairs[p].word_capacity = 0;
    mt_status status = MT_OK;
    for (int32_t k = 0; k < n && status == MT_OK; k++) {
        int32_t w = list[k];
        if (tr->word_seen[w] == merge + 1 || !holds(tr, w, left, right))
            continue;
        tr->word_seen[w] = merge + 1;
        status = count_word(tr, w, -1, INT32_MAX, merge);
        merge_in_word(tr, w, left, right, id);
        if (status == MT_OK)
            status = count_word(tr, w, +1, id, merge);
    }
    free(list);
    return status ? status : push_touched(tr);
}

static mt_status learn(trainer *tr, int n_merges, int32_t *left, int32_t *right, int *learned)
{
    mt_status status = MT_OK;
    for (int32_t w = 0; w < tr->words.count && status == MT_OK; w++)
        status = count_word(tr, w, +1, -1, 0);
    if (status == MT_OK)
        status = push_touched(tr);
    tr->word_seen = calloc((size_t)tr->words.count + 1, sizeof *tr->word_seen);
    if (status == MT_OK && !tr->word_seen)
        status = mt_fail(MT_ENOMEM, "no memory while training the tokenizer");
    int m = 0;
    while (status == MT_OK && m < n_merges && tr->heap_count > 0) {
        pair_entry e = heap_pop(tr);
        int32_t p = text_pair_map_get(&tr->index, text_pair_key(e.left, e.right));
        if (p < 0 || tr->pairs[p].count != e.count || e.count <= 0)
            continue; /* stale */
        left[m] = e.left;
        right[m] = e.right;
        tr->pairs[p].pushed = 0;
        status = apply_merge(tr, p, 256 + m, (uint32_t)m + 1);
        m++;
    }
    *learned = m;
    return status;
}

static void trainer_free(trainer *tr)
{
    for (int32_t p = 0; p < tr->n_pairs; p++)
        free(tr->pairs[p].words);
    free(tr->pairs);
    free(tr->touched);
    free(tr->heap);
    free(tr->word_seen);
    text_pair_map_free(&tr->index);
    text_words_free(&tr->words);
}

mt_status mt_tokenizer_train_texts(const unsigned char *const *texts, const size_t *lengths,
                                   int n_texts, int vocab_size, mt_tokenizer **out)
{
    *out = NULL;
    if (vocab_size < 257)
        return mt_fail(MT_EINVAL, "vocabulary size %d is below 257 (256 bytes and end-of-text)",
                       vocab_size);
    int n_merges = vocab_size - 257;
    trainer tr = {0};
    mt_status status = MT_OK;
    for (int i = 0; i < n_texts && status == MT_OK; i++)
        status = text_words_add(&tr.words, texts[i], lengths[i]);
    int32_t *left = malloc(((size_t)n_merges + 1) * sizeof *left);
    int32_t *right = malloc(((size_t)n_merges + 1) * sizeof *right);
    if (status == MT_OK && (!left || !right))
        status = mt_fail(MT_ENOMEM, "no memory for %d merges", n_merges);
    int learned = 0;
    if (status == MT_OK)
        status = learn(&tr, n_merges, left, right, &learned);
    trainer_free(&tr);
    if (status == MT_OK)
        status = text_tokenizer_from_merges(left, right, learned, out);
    free(left);
    free(right);
    return status;
}

mt_status mt_tokenizer_train(const char *const *paths, int n_paths, int vocab_size,
                             mt_tokenizer **out)
{
    *out = NULL;
    unsigned char **texts = calloc((size_t)n_paths + 1, sizeof *texts);
    size_t *lengths = calloc((size_t)n_paths + 1, sizeof *lengths);
    mt_status status = texts && lengths ? MT_OK : mt_fail(MT_ENOMEM, "no memory for %d files",
                                                          n_paths);
    for (int i = 0; i < n_paths && status == MT_OK; i++)
        status = text_read_file(paths[i], &texts[i], &lengths[i]);
    if (status == MT_OK)
        status = mt_tokenizer_train_texts((const unsigned char *const *)texts, lengths, n_paths,
                                          vocab_size, out);
    for (int i = 0; texts && i < n_paths; i++)
        free(texts[i]);
    free(texts);
    free(lengths);
    return status;
}
