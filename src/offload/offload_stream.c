/* The I/O thread and its pool: a pass hands records out in order from buffers filled ahead of
 * it, and writes each back once released, so reading and writing overlap the user's compute. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshtrain/clock.h"
#include "offload_internal.h"

typedef enum { SLOT_FREE, SLOT_READING, SLOT_READY, SLOT_HELD, SLOT_DIRTY, SLOT_WRITING } slot_state;

typedef struct slot {
    void *data;
    slot_state state;
    int position; /* in the pass's order */
} slot;

struct mt_offload {
    offload_file file;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* the thread: work to do */
    pthread_cond_t done; /* the user: a transfer finished */
    int started, stop;
    slot *slots;
    int slot_count;
    mt_memory_ledger *ledger;
    long long pool_bytes;
    void (*written)(void *context, int record);
    void *written_context;
    void *head;        /* mt_offload_read_head's buffer, grown to the largest request */
    size_t head_bytes;
    /* the pass */
    const int *order;
    int count, read, write, active;
    int next_read, next_hand, held;
    int failed;
    char message[1200];
    mt_offload_stats stats;
};

mt_status mt_offload_parse(const char *name, mt_offload_kind *kind)
{
    static const char *const names[] = {"none", "optimizer", "params"};
    for (int k = 0; k < 3; k++)
        if (strcmp(name, names[k]) == 0) {
            *kind = (mt_offload_kind)k;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "'%s' is not an offload mode: none, optimizer or params", name);
}

const char *mt_offload_name(mt_offload_kind kind)
{
    return kind == MT_OFFLOAD_OPTIMIZER ? "optimizer" : kind == MT_OFFLOAD_PARAMS ? "params" : "none";
}

/* The next transfer, under the lock: write-backs first (they free buffers), then the next read
 * into a free buffer. Returns the slot, or -1 when there is nothing to do. */
static int pick(mt_offload *o, int *writing)
{
    for (int i = 0; i < o->slot_count; i++)
        if (o->slots[i].state == SLOT_DIRTY) {
            o->slots[i].state = SLOT_WRITING;
            *writing = 1;
            return i;
        }
    if (!o->active || o->failed || o->next_read >= o->count)
        return -1;
    for (int i = 0; i < o->slot_count; i++)
        if (o->slots[i].state == SLOT_FREE) {
            o->slots[i].state = SLOT_READING;
            o->slots[i].position = o->next_read++;
            *writing = 0;
            return i;
        }
    return -1;
}

static void *io_thread(void *argument)
{
    mt_offload *o = argument;
    char message[sizeof o->message];
    pthread_mutex_lock(&o->lock);
    while (!o->stop) {
        int writing, s = pick(o, &writing);
        if (s < 0) {
            pthread_cond_wait(&o->wake, &o->lock);
            continue;
        }
        slot *sl = &o->slots[s];
        int record = o->order[sl->position], fill = o->read, failed = o->failed;
        pthread_mutex_unlock(&o->lock);
        double start = mt_clock_seconds();
        int ok = 1;
        if (writing && !failed)
            ok = offload_file_write(&o->file, record, sl->data, message, sizeof message);
        else if (!writing && fill)
            ok = offload_file_read(&o->file, record, sl->data, message, sizeof message);
        else if (!writing)
            memset(sl->data, 0, o->file.span[record]);
        double seconds = mt_clock_seconds() - start;
        if (writing && ok && !failed && o->written)
            o->written(o->written_context, record);
        pthread_mutex_lock(&o->lock);
        if (writing) {
            o->stats.write_seconds += seconds;
            o->stats.write_bytes += ok && !failed ? (double)o->file.span[record] : 0;
        } else if (fill) {
            o->stats.read_seconds += seconds;
            o->stats.read_bytes += ok ? (double)o->file.span[record] : 0;
        }
        if (!ok && !o->failed) {
            o->failed = 1;
            memcpy(o->message, message, sizeof message);
        }
        sl->state = writing || !ok ? SLOT_FREE : SLOT_READY;
        pthread_cond_broadcast(&o->done);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

mt_status mt_offload_open(const mt_offload_options *options, mt_offload **out)
{
    *out = NULL;
    if (options->buffers < 2)
        return mt_fail(MT_EINVAL, "offload: %d buffers; at least 2 (one in use, one moving)",
                       options->buffers);
    mt_offload *o = calloc(1, sizeof *o);
    if (!o)
        return mt_fail(MT_ENOMEM, "offload: out of memory");
    o->held = -1;
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->wake, NULL);
    pthread_cond_init(&o->done, NULL);
    mt_status status = offload_file_open(&o->file, options);
    o->slot_count = options->buffers;
    o->written = options->written;
    o->written_context = options->written_context;
    o->slots = status ? NULL : calloc((size_t)o->slot_count, sizeof *o->slots);
    if (status == MT_OK && !o->slots)
        status = mt_fail(MT_ENOMEM, "offload: out of memory");
    size_t bytes = o->file.largest ? o->file.largest : MT_OFFLOAD_ALIGN;
    for (int i = 0; status == MT_OK && i < o->slot_count; i++)
        if (posix_memalign(&o->slots[i].data, MT_OFFLOAD_ALIGN, bytes) != 0)
            status = mt_fail(MT_ENOMEM, "offload: cannot allocate %d buffers of %zu bytes",
                             o->slot_count, bytes);
    if (status == MT_OK && pthread_create(&o->thread, NULL, io_thread, o) != 0)
        status = mt_fail(MT_EIO, "offload file '%s': cannot start the I/O thread", o->file.path);
    if (status) {
        mt_offload_close(o);
        return status;
    }
    o->started = 1;
    o->ledger = options->ledger;
    o->pool_bytes = (long long)bytes * o->slot_count;
    mt_memory_count(o->ledger, MT_MEMORY_OFFLOAD, o->pool_bytes);
    *out = o;
    return MT_OK;
}

void mt_offload_close(mt_offload *o)
{
    if (!o)
        return;
    if (o->started) {
        if (o->active)
            mt_offload_end(o);
        pthread_mutex_lock(&o->lock);
        o->stop = 1;
        pthread_cond_signal(&o->wake);
        pthread_mutex_unlock(&o->lock);
        pthread_join(o->thread, NULL);
    }
    for (int i = 0; o->slots && i < o->slot_count; i++)
        free(o->slots[i].data);
    free(o->slots);
    free(o->head);
    mt_memory_count(o->ledger, MT_MEMORY_OFFLOAD, -o->pool_bytes - (long long)o->head_bytes);
    offload_file_close(&o->file);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->wake);
    pthread_cond_destroy(&o->done);
    free(o);
}

int mt_offload_direct(const mt_offload *o) { return o->file.direct; }
const char *mt_offload_io_name(const mt_offload *o) { return o->file.ring ? "io_uring" : "pread/pwrite"; }
const char *mt_offload_io_reason(const mt_offload *o) { return o->file.io_reason; }

mt_status mt_offload_io_parse(const char *name, mt_offload_io *io)
{
    static const char *const names[] = {"auto", "io_uring", "pread"};
    for (int k = 0; k < 3; k++)
        if (strcmp(name, names[k]) == 0) {
            *io = (mt_offload_io)k;
            return MT_OK;
        }
    return mt_fail(MT_EINVAL, "'%s' is not an offload I/O engine: auto, io_uring or pread", name);
}
const char *mt_offload_path(const mt_offload *o) { return o->file.path; }

mt_status mt_offload_begin(mt_offload *o, const int *order, int count, int read, int write)
{
    for (int i = 0; i < count; i++)
        if (order[i] < 0 || order[i] >= o->file.count)
            return mt_fail(MT_EINVAL, "offload file '%s': no record %d (it has %d)", o->file.path,
                           order[i], o->file.count);
    pthread_mutex_lock(&o->lock);
    int busy = o->active;
    if (!busy) {
        o->order = order;
        o->count = count;
        o->read = read;
        o->write = write;
        o->active = 1;
        o->next_read = o->next_hand = 0;
        o->held = -1;
        o->failed = 0;
        pthread_cond_signal(&o->wake);
    }
    pthread_mutex_unlock(&o->lock);
    return busy ? mt_fail(MT_EINVAL, "offload file '%s': a pass is already running", o->file.path)
                : MT_OK;
}

static mt_status failure(mt_offload *o)
{
    return mt_fail(MT_EIO, "%s", o->message);
}

mt_status mt_offload_next(mt_offload *o, void **data)
{
    *data = NULL;
    double start = mt_clock_seconds();
    pthread_mutex_lock(&o->lock);
    int found = -1;
    while (o->active && o->held < 0 && o->next_hand < o->count && !o->failed) {
        for (int i = 0; i < o->slot_count && found < 0; i++)
            if (o->slots[i].state == SLOT_READY && o->slots[i].position == o->next_hand)
                found = i;
        if (found >= 0)
            break;
        pthread_cond_wait(&o->done, &o->lock);
    }
    mt_status status = MT_OK;
    if (o->failed)
        status = failure(o);
    else if (found < 0)
        status = mt_fail(MT_EINVAL, "offload file '%s': no record to hand out (no pass, one "
                                    "held, or the pass is over)", o->file.path);
    else {
        o->slots[found].state = SLOT_HELD;
        o->held = found;
        o->next_hand++;
        *data = o->slots[found].data;
    }
    o->stats.wait_seconds += mt_clock_seconds() - start;
    pthread_mutex_unlock(&o->lock);
    return status;
}

void mt_offload_release(mt_offload *o)
{
    pthread_mutex_lock(&o->lock);
    if (o->held >= 0) {
        o->slots[o->held].state = o->write ? SLOT_DIRTY : SLOT_FREE;
        o->held = -1;
        pthread_cond_signal(&o->wake);
    }
    pthread_mutex_unlock(&o->lock);
}

mt_status mt_offload_end(mt_offload *o)
{
    double start = mt_clock_seconds();
    pthread_mutex_lock(&o->lock);
    if (o->held >= 0) /* ending early: what is held is not written */
        o->slots[o->held].state = SLOT_FREE;
    o->held = -1;
    o->count = o->next_read; /* no further reads */
    for (;;) {
        int moving = 0;
        for (int i = 0; i < o->slot_count; i++) {
            slot_state st = o->slots[i].state;
            if (st == SLOT_READY)
                o->slots[i].state = SLOT_FREE; /* read ahead, never handed out */
            moving |= st == SLOT_READING || st == SLOT_DIRTY || st == SLOT_WRITING;
        }
        if (!moving)
            break;
        pthread_cond_signal(&o->wake);
        pthread_cond_wait(&o->done, &o->lock);
    }
    mt_status status = o->failed ? failure(o) : MT_OK;
    o->active = 0;
    o->failed = 0;
    o->stats.wait_seconds += mt_clock_seconds() - start;
    pthread_mutex_unlock(&o->lock);
    return status;
}

/* The synchronous transfers' buffer, at least span bytes. */
static mt_status grow_head(mt_offload *o, size_t span)
{
    if (span > o->head_bytes) {
        free(o->head);
        mt_memory_count(o->ledger, MT_MEMORY_OFFLOAD, (long long)span - (long long)o->head_bytes);
        o->head_bytes = span;
        if (posix_memalign(&o->head, MT_OFFLOAD_ALIGN, span) != 0) {
            o->head = NULL;
            mt_memory_count(o->ledger, MT_MEMORY_OFFLOAD, -(long long)span);
            o->head_bytes = 0;
            return mt_fail(MT_ENOMEM, "offload: cannot allocate %zu bytes", span);
        }
    }
    return MT_OK;
}

mt_status mt_offload_read_head(mt_offload *o, int record, size_t bytes, void *dst)
{
    if (record < 0 || record >= o->file.count || bytes > o->file.span[record])
        return mt_fail(MT_EINVAL, "offload file '%s': no %zu bytes at the head of record %d",
                       o->file.path, bytes, record);
    size_t span = offload_aligned(bytes);
    mt_status grown = grow_head(o, span);
    if (grown)
        return grown;
    double start = mt_clock_seconds();
    pthread_mutex_lock(&o->lock);
    int busy = o->active;
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return mt_fail(MT_EINVAL, "offload file '%s': a record read during a pass", o->file.path);
    int ok = offload_file_read_part(&o->file, record, span, o->head, o->message,
                                    sizeof o->message);
    if (!ok)
        return failure(o);
    memcpy(dst, o->head, bytes);
    pthread_mutex_lock(&o->lock);
    o->stats.read_bytes += (double)span;
    o->stats.read_seconds += mt_clock_seconds() - start;
    o->stats.wait_seconds += mt_clock_seconds() - start;
    pthread_mutex_unlock(&o->lock);
    return MT_OK;
}

mt_status mt_offload_write_record(mt_offload *o, int record, size_t bytes, const void *src)
{
    if (record < 0 || record >= o->file.count || bytes > o->file.span[record])
        return mt_fail(MT_EINVAL, "offload file '%s': record %d holds fewer than %zu bytes",
                       o->file.path, record, bytes);
    size_t span = o->file.span[record];
    mt_status grown = grow_head(o, span);
    if (grown)
        return grown;
    pthread_mutex_lock(&o->lock);
    int busy = o->active;
    pthread_mutex_unlock(&o->lock);
    if (busy)
        return mt_fail(MT_EINVAL, "offload file '%s': a record written during a pass", o->file.path);
    memcpy(o->head, src, bytes);
    memset((char *)o->head + bytes, 0, span - bytes);
    double start = mt_clock_seconds();
    if (!offload_file_write(&o->file, record, o->head, o->message, sizeof o->message))
        return failure(o);
    pthread_mutex_lock(&o->lock);
    o->stats.write_bytes += (double)span;
    o->stats.write_seconds += mt_clock_seconds() - start;
    o->stats.wait_seconds += mt_clock_seconds() - start;
    pthread_mutex_unlock(&o->lock);
    return MT_OK;
}

void mt_offload_get_stats(const mt_offload *o, mt_offload_stats *stats)
{
    pthread_mutex_lock((pthread_mutex_t *)&o->lock);
    *stats = o->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&o->lock);
}
