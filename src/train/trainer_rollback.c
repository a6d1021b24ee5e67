/* The spike guard's rollback: the newest checkpoint reloaded in the running job, the batches
 * of the streak that caused it left out from then on, the action logged. */
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "trainer_internal.h"

/* The ascending union of the run's left-out batches and the streak's, into *out (malloc'd). */
static mt_status merge_left_out(const mt_ckpt_training *run, const mt_ckpt_spike *streak,
                                long long **out, int *count)
{
    long long *list = malloc(((size_t)run->skipped_count + (size_t)streak->streak + 1) *
                             sizeof *list);
    if (!list)
        return mt_fail(MT_ENOMEM, "rolling back: out of memory");
    int n = 0;
    for (int i = 0, j = 0; i < run->skipped_count || j < streak->streak;) {
        long long a = i < run->skipped_count ? run->skipped[i] : -1;
        long long b = j < streak->streak ? streak->streak_batches[j] : -1;
        long long next = a < 0 ? b : b < 0 ? a : a < b ? a : b;
        i += a == next;
        j += b == next;
        if (!n || list[n - 1] != next)
            list[n++] = next;
    }
    *out = list;
    *count = n;
    return MT_OK;
}

/* {"step": S, "event": "rollback", "to_step": T, "left_out": [...]}: a line the metrics trim
 * keeps with the steps up to S. */
static void log_rollback(trainer *tr, int step, int to, const mt_ckpt_spike *streak)
{
    FILE *p = tr->out.progress.out, *f = tr->out.metrics;
    if (p)
        fprintf(p, "step %d: %d consecutive loss spikes; rolled back to step %d, leaving their "
                   "batches out\n", step, streak->streak, to);
    if (!f)
        return;
    fprintf(f, "{\"step\": %d, \"event\": \"rollback\", \"to_step\": %d, \"left_out\": [", step, to);
    for (int i = 0; i < streak->streak; i++)
        fprintf(f, "%s%lld", i ? ", " : "", streak->streak_batches[i]);
    fputs("]}\n", f);
    fflush(f);
}

mt_status trainer_rollback(trainer *tr, int step, int *resumed)
{
    trainer_state *st = &tr->state;
    mt_status status = trainer_finish_save(tr);
    char dir[MT_PATH_MAX + 300];
    int at = -1;
    if (status == MT_OK)
        status = trainer_find_latest(tr->cfg, st->world, dir, sizeof dir, &at);
    if (status)
        return mt_fail_context(status, "step %d: rolling back after %d loss spikes", step,
                               st->spike.state.streak);
    if (at < 0)
        return mt_fail(MT_ENUMERIC, "step %d: %d consecutive loss spikes and no checkpoint to "
                                    "roll back to (give save_every)", step,
                       st->spike.state.streak);
    mt_ckpt_meta meta;
    status = mt_comm_agree_outcome(st->world, mt_ckpt_meta_read(dir, &meta), "rolling back");
    if (status)
        return status;
    mt_ckpt_training next = {0};
    if ((status = trainer_load_checkpoint(tr, &meta)) == MT_OK &&
        !trainer_ckpt_training_copy(&next, &meta.training))
        status = mt_fail(MT_ENOMEM, "rolling back: out of memory");
    mt_ckpt_meta_free(&meta);
    long long *left_out = NULL;
    int left_out_count = 0;
    if (status == MT_OK)
        status = merge_left_out(&st->training, &st->spike.state, &left_out, &left_out_count);
    if (status) {
        free(next.skipped);
        return status;
    }
    log_rollback(tr, step, at, &st->spike.state);
    /* the checkpoint's position and statistics; the run's counts and left-out batches */
    free(next.skipped);
    next.skipped = left_out;
    next.skipped_count = left_out_count;
    next.overflow_skips = st->training.overflow_skips;
    next.spike.skips = st->spike.state.skips;
    next.spike.rollbacks = st->spike.state.rollbacks + 1;
    next.spike.streak = 0;
    free(st->training.skipped);
    st->training = next;
    trainer_loss_scaler_init(&st->scaler, tr->cfg, &next.scaler);
    st->spike.state = next.spike;
    st->training.scaler = st->scaler.state;
    *resumed = at;
    return MT_OK;
}
