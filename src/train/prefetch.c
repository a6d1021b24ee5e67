/* The prefetch queue: one producer thread, one consumer (the step), a ring of `depth` slots
 * under one mutex; the producer fills the slot after the last ready one outside the lock. */
#include "prefetch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MESSAGE_CAPACITY = 1024 };

typedef struct slot {
    uint64_t key;
    int32_t *inputs, *targets;
    mt_status status;
    char message[MESSAGE_CAPACITY];
} slot;

struct trainer_prefetch {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    slot *slots;
    int depth, head, ready; /* ready slots from head on, in key order */
    uint64_t next_key, end_key; /* the key the producer draws next; where it stops */
    int stop, failed;
    size_t tokens;
    trainer_draw_fn draw;
    const void *context;
};

static void *produce(void *arg)
{
    trainer_prefetch *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop && !p->failed && p->next_key < p->end_key) {
        if (p->ready == p->depth) {
            pthread_cond_wait(&p->changed, &p->lock);
            continue;
        }
        slot *s = &p->slots[(p->head + p->ready) % p->depth];
        uint64_t key = p->next_key;
        pthread_mutex_unlock(&p->lock);
        /* the consumer never touches a slot past the ready ones */
        s->key = key;
        s->status = p->draw(p->context, key, s->inputs, s->targets);
        if (s->status)
            snprintf(s->message, sizeof s->message, "%s", mt_last_error());
        pthread_mutex_lock(&p->lock);
        p->ready++;
        p->next_key++;
        p->failed = s->status != MT_OK;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

mt_status trainer_prefetch_start(trainer_prefetch **out, int depth, size_t tokens,
                                 uint64_t first_key, uint64_t end_key, trainer_draw_fn draw,
                                 const void *context)
{
    *out = NULL;
    trainer_prefetch *p = calloc(1, sizeof *p);
    if (!p)
        return mt_fail(MT_ENOMEM, "data prefetch: out of memory");
    *p = (trainer_prefetch){.depth = depth, .next_key = first_key, .end_key = end_key,
                            .tokens = tokens, .draw = draw, .context = context};
    p->slots = calloc((size_t)depth, sizeof *p->slots);
    int ok = p->slots != NULL;
    for (int i = 0; ok && i < depth; i++) {
        p->slots[i].inputs = malloc(tokens * sizeof(int32_t));
        p->slots[i].targets = malloc(tokens * sizeof(int32_t));
        ok = p->slots[i].inputs && p->slots[i].targets;
    }
    if (!ok) {
        for (int i = 0; p->slots && i < depth; i++) {
            free(p->slots[i].inputs);
            free(p->slots[i].targets);
        }
        free(p->slots);
        free(p);
        return mt_fail(MT_ENOMEM, "data prefetch: cannot hold %d micro-batches", depth);
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->changed, NULL);
    if (pthread_create(&p->thread, NULL, produce, p) != 0) {
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->changed);
        for (int i = 0; i < depth; i++) {
            free(p->slots[i].inputs);
            free(p->slots[i].targets);
        }
        free(p->slots);
        free(p);
        return mt_fail(MT_EIO, "data prefetch: cannot start its thread");
    }
    *out = p;
    return MT_OK;
}

mt_status trainer_prefetch_take(trainer_prefetch *p, uint64_t key, int32_t *inputs,
                                int32_t *targets)
{
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->ready > 0 && p->slots[p->head].key < key) { /* batches the consumer skipped */
            p->head = (p->head + 1) % p->depth;
            p->ready--;
            pthread_cond_broadcast(&p->changed);
        }
        if (p->ready > 0 && p->slots[p->head].key == key) {
            slot *s = &p->slots[p->head];
            mt_status status = s->status;
            if (status == MT_OK) {
                memcpy(inputs, s->inputs, p->tokens * sizeof *inputs);
                memcpy(targets, s->targets, p->tokens * sizeof *targets);
                p->head = (p->head + 1) % p->depth;
                p->ready--;
                pthread_cond_broadcast(&p->changed);
                pthread_mutex_unlock(&p->lock);
                return MT_OK;
            }
            pthread_mutex_unlock(&p->lock);
            return mt_fail(status, "%s", s->message);
        }
        /* drawn here: a key behind the producer, or one it will not reach */
        int behind = p->ready > 0 || p->next_key > key;
        if (behind || p->failed || p->stop || key >= p->end_key)
            break;
        pthread_cond_wait(&p->changed, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return p->draw(p->context, key, inputs, targets);
}

void trainer_prefetch_stop(trainer_prefetch *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->changed);
    for (int i = 0; i < p->depth; i++) {
        free(p->slots[i].inputs);
        free(p->slots[i].targets);
    }
    free(p->slots);
    free(p);
}
