/* The run's state, shared by the files of the training loop: setup and the loop (trainer.c),
 * one optimizer step (train_step.c) and what the run leaves behind (run_outputs.c). */
#ifndef MESHTRAIN_TRAINER_INTERNAL_H
#define MESHTRAIN_TRAINER_INTERNAL_H

#include "meshtrain/checkpoint.h"
#include "meshtrain/data_parallel.h"
#include "meshtrain/memory.h"
#include "meshtrain/mesh.h"
#include "meshtrain/pipeline_stage.h"
#include "meshtrain/run_plan.h"
#include "meshtrain/safetensors.h"
#include "meshtrain/tensor_parallel.h"
#include "meshtrain/thread_count.h"
#include "meshtrain/trace.h"
#include "meshtrain/train.h"
#include "progress.h"

/* A fault a test asks for through MT_INJECT_FAULT (trainer_fault.c): KIND@RANK:STEP (world
 * rank, step) for nan_loss (that rank's loss becomes NaN), nan_grad (its gradients do), skew
 * (one of its parameters moves after the update, as a silent corruption would) or skew_norm
 * (the same for the final norm's weight, which every tensor-parallel rank holds whole); kill
 * (SIGKILL at the start of the step), kill_node (the same, to its parent first: under
 * meshtrain launch, the node's launcher, so the whole node is lost), kill_in_shard (halfway
 * through writing its shard of that step's checkpoint), kill_after_shard (its shard durable,
 * before the ranks agree) and kill_before_commit (world rank 0: the metadata written, before
 * the folder's rename commits it); only the first attempt of a restarted job
 * (MT_RESTART_COUNT 0 or unset) meets those. KIND@RANK:MS for a slow rank, on every attempt:
 * slow_compute (MS milliseconds of extra compute before each micro-batch's forward) and
 * slow_comm (a sleep of MS milliseconds before each of its collectives and transfers). */
typedef enum fault_kind {
    FAULT_NONE, FAULT_NAN_LOSS, FAULT_NAN_GRAD, FAULT_SKEW, FAULT_SKEW_NORM, FAULT_KILL,
    FAULT_KILL_NODE, FAULT_KILL_IN_SHARD, FAULT_KILL_AFTER_SHARD, FAULT_KILL_BEFORE_COMMIT,
    FAULT_SLOW_COMPUTE, FAULT_SLOW_COMM
} fault_kind;
typedef struct fault {
    fault_kind kind;
    int rank, step;  /* step: the step it strikes, or for a slow rank its milliseconds */
} fault;

typedef struct trainer_save trainer_save; /* a checkpoint being written (trainer_checkpoint.c) */

typedef struct trainer {
    mt_run_plan *plan;    /* the run's layout; cfg is its configuration */
    const mt_config *cfg;
    mt_comm *world;   /* NULL: one process */
    mt_mesh *mesh;    /* with a world */
    mt_comm *dp;      /* the data-parallel group, NULL for one replica */
    mt_comm *tp;      /* the tensor-parallel group, NULL when the model is whole */
    int rank, dp_rank, dp_size, tp_size, pp_size;
    int writes;       /* world rank 0: files, progress, sample */
    mt_thread_count threads; /* this rank's, and where the figure came from */
    int32_t *rank_threads;   /* every world rank's threads, by rank */
    mt_memory_ledger ledger;
    mt_gpt gpt;
    mt_dp_model *model;
    mt_tokens train_tokens, val_tokens;
    mt_sampler train, val;
    int32_t *inputs, *targets; /* one micro-batch of this rank */
    double *step_seconds;      /* per step, for the median throughput */
    FILE *metrics;
    progress progress;
    fault fault;
    /* Seconds blocked on data-parallel communication: the trainer's own collectives (the
     * loss check), and over the timed steps with the model's, against their step time. */
    double wait_seconds, timed_wait, timed_seconds;
    double timed_tp; /* over the timed steps, in the model's tensor-parallel collectives */
    /* Every rank's memory after the run: MEMORY_COLUMNS figures per world rank (rank 0). */
    long long *memory;
    int memory_ranks;
    mt_trace *trace;  /* cfg->trace: this rank's timeline, or NULL */
    /* Pipeline parallelism (pp > 1): the schedule (its stage layers are the plan's), the
     * stage's executor and the communicator its gradients travel on; and, over the timed
     * steps, its busy and pipeline seconds. */
    mt_pp_schedule schedule;
    mt_pp_runner *runner;
    mt_comm *pp_gradients;
    int pp_step, pp_peak_slots;
    double pp_busy, pp_span;
    double *bubble, bubble_expected; /* per stage, after the run (trainer_report_pipeline) */
    int *stage_slots;                /* per stage: the most activations held at once */
    /* Checkpoints: the step the run resumed from (0: a fresh start), the save in flight
     * (async_save), the communicator saves use (a world of their own under async_save, so a
     * background save never meets training's collectives), and the totals of every save. */
    int start_step;
    int resumed_here; /* from a checkpoint in OUT/ckpt: metrics.jsonl continues */
    trainer_save *save;
    mt_comm *save_comm, *own_save_comm;
    double save_seconds;       /* every save's own time, planning to commit */
    double save_stall_seconds; /* training's wait for saves (all of it unless async_save) */
    unsigned long long saved_bytes; /* every rank's shards (world rank 0) */
    int saves;
} trainer;

/* Per rank: the ledger's bytes of each kind, its total at peak, resident now and at peak. */
enum { MEMORY_COLUMNS = MT_MEMORY_KINDS + 3 };

/* Whether the model runs sequence parallelism (asked for, and split over tp > 1). */
static inline int trainer_sequence_parallel(const trainer *tr)
{
    return tr->gpt.tp.size > 1 && tr->gpt.tp.sequence_parallel;
}

/* trainer_pipeline.c */
/* This rank's stage, and the stage that holds (and saves) a unit. */
int trainer_stage(const trainer *tr);
int trainer_stage_of_unit(const trainer *tr, int unit);
/* Before the mesh exists: the plan's schedule (made and checked), its stage layers balanced by
 * measured cost when it asks (collective over the world), and each stage's total into
 * stage_layers[pp]. */
mt_status trainer_plan_pipeline(trainer *tr, int *stage_layers);
/* This rank's chunks and slots, for mt_gpt_create_stage. */
mt_status trainer_stage_shape(const trainer *tr, mt_gpt_stage *stage);
/* After the model: the gradient communicator and the executor. */
mt_status trainer_start_pipeline(trainer *tr);
void trainer_stop_pipeline(trainer *tr);
/* The stage's part of one step's schedule, each token's loss gradient scaled by loss_scale;
 * *loss_sum as for trainer_step's micro-batches. */
mt_status trainer_pipeline_step(trainer *tr, int step, float loss_scale, double *loss_sum);
/* The whole model's forward for validation and sampling: this rank's model, or the pipeline. */
mt_forward trainer_forward(trainer *tr);
/* Every stage's bubble and activation peak (collective); world rank 0 prints them. */
mt_status trainer_report_pipeline(trainer *tr, FILE *out);

/* trainer.c */
/* Whether step's times count in the run's figures: the first two steps of a run (or of its
 * resumption) warm up, unless there are no others. */
int trainer_step_is_timed(const trainer *tr, int step);

/* trainer_fault.c */
/* Reads MT_INJECT_FAULT (a malformed value is an error naming it); a slow_comm rank's world,
 * and every group split from it later, starts sleeping before each operation. */
mt_status trainer_read_fault(trainer *tr);
/* Whether this rank meets fault `kind` at `step`. */
int trainer_fault_now(const trainer *tr, fault_kind kind, int step);
/* The step fault this rank meets at `step`, or FAULT_NONE (a slow rank's is none). */
fault_kind trainer_fault_at(const trainer *tr, int step);
/* A slow_compute rank's extra compute before a micro-batch's forward (nothing elsewhere). */
void trainer_fault_before_forward(const trainer *tr);

/* train_step.c */
/* This rank's sequences of micro-batch `micro` of step `step`, into tr->inputs and targets. */
void trainer_draw_microbatch(trainer *tr, int step, int micro);
/* One optimizer step over the global batch: this rank's share of every micro-batch, the
 * gradient sync, the NaN and replica checks, clipping and the update. */
mt_status trainer_step(trainer *tr, int step, step_record *record);

/* trainer_checkpoint.c */
/* Saves OUT/ckpt/step_<step>/ from every rank (collective over the world): inline, or under
 * async_save from a copy in memory by a background thread while training goes on. Waits for
 * the previous save first. An error on any rank fails the save on every rank, leaving no
 * step_<step> folder and the earlier checkpoints intact. */
mt_status trainer_save_checkpoint(trainer *tr, int step);
/* Waits for the save in flight, if any, and returns its outcome. */
mt_status trainer_finish_save(trainer *tr);
/* Every rank's outcome of a step of work: an error on any rank is returned on all as "WHAT
 * failed on rank R: its message" (collective over comm; NULL: one process). Allocates
 * nothing, so a rank out of memory still takes part. */
mt_status trainer_agree(mt_comm *comm, mt_status mine, const char *what);

/* trainer_resume.c */
/* Before the run is set up: the checkpoint to resume from (cfg->resume, or auto after a
 * restart; collective over the world for auto), its metadata in *meta (meta->step -1: a fresh
 * start), and cfg with the model shape and optimizer settings taken from it (a key given that
 * contradicts the checkpoint is an error naming both). */
mt_status trainer_resolve_resume(mt_config *cfg, mt_comm *world, mt_ckpt_meta *meta);
/* Sets cfg's `key` to `value`, which `source` ("the checkpoint 'DIR'") fixes along with what
 * `fixes` says ("the model shape"); the key given with another value is an error naming both. */
mt_status trainer_adopt_key(mt_config *cfg, const char *key, const char *value,
                            const char *source, const char *fixes);
/* After the model exists: this rank's parameters and Adam moments from the checkpoint,
 * reading only the pieces it needs, each verified (collective: an error anywhere fails all). */
mt_status trainer_load_checkpoint(trainer *tr, const mt_ckpt_meta *meta);
/* Keeps OUT/metrics.jsonl's lines up to the resumed step (world rank 0, same folder). */
mt_status trainer_trim_metrics(const mt_config *cfg, int step);

/* trainer_init.c */
/* A safetensors file a run starts from (--init) and the prefix of its names ("" or a
 * GPT2LMHeadModel state dict's "transformer."). */
typedef struct trainer_init {
    mt_safetensors *file; /* NULL: no --init, or a resumed run */
    const char *prefix;
} trainer_init;
/* Before the run is set up: opens cfg->init (unless the run resumes a checkpoint) and takes
 * the model's shape from it (a key given that contradicts it is an error naming both). */
mt_status trainer_resolve_init(mt_config *cfg, const mt_ckpt_meta *resume, mt_comm *world,
                               trainer_init *init);
/* After the model exists: this rank's parameters from the file (Adam moments stay zero); every
 * tensor of the file must be accounted for (collective: an error anywhere fails all). */
mt_status trainer_load_init(trainer *tr, trainer_init *init);

/* run_outputs.c */
/* Every rank's memory (ledger and resident set), gathered to every rank; rank 0 prints it. */
mt_status trainer_gather_memory(trainer *tr, FILE *out);
mt_status trainer_write_summary(trainer *tr, mt_train_summary *summary);
/* OUT/model.safetensors, unit by unit (collective under ZeRO-3). */
mt_status trainer_save_model(trainer *tr);

#endif
