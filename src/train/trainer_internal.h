/* The trainer in three parts: the run plan (immutable), the training state (what a step reads
 * and changes) and the outputs (what the run measures, reports and leaves behind). */
#ifndef MESHTRAIN_TRAINER_INTERNAL_H
#define MESHTRAIN_TRAINER_INTERNAL_H

#include "meshtrain/checkpoint.h"
#include "meshtrain/context_parallel.h"
#include "meshtrain/data_parallel.h"
#include "meshtrain/memory.h"
#include "meshtrain/mesh.h"
#include "meshtrain/pipeline_stage.h"
#include "meshtrain/ps.h"
#include "meshtrain/run_plan.h"
#include "meshtrain/safetensors.h"
#include "meshtrain/tensor_parallel.h"
#include "meshtrain/thread_count.h"
#include "meshtrain/trace.h"
#include "meshtrain/train.h"
#include "local_sgd.h"
#include "loss_scaler.h"
#include "prefetch.h"
#include "progress.h"
#include "spike_guard.h"
#include "step_account.h"
#include "trainer_fault.h"

#include <time.h>

typedef struct trainer trainer;
typedef struct trainer_init trainer_init;
typedef struct trainer_save trainer_save; /* a checkpoint being written (trainer_checkpoint.c) */

/* How this rank runs one step's forward and backward passes: the whole model micro-batch by
 * micro-batch (step_plain.c), or its pipeline stage's part of the schedule (step_pipeline.c).
 * The rest of the step (gradient sync, checks, the update) is the same for both (train_step.c). */
typedef struct trainer_passes {
    /* Gradients of every micro-batch accumulate in the model, each token's loss gradient
     * scaled by loss_scale; *loss_sum is the sum of this rank's micro-batch losses (0 on a
     * stage without the loss). */
    mt_status (*run)(trainer *tr, int step, float loss_scale, double *loss_sum);
    /* The whole model's forward, for validation and sampling. */
    mt_forward (*forward)(trainer *tr);
} trainer_passes;
/* deterministic: one pass per group of the batch, each reduced and added into the tree */
extern const trainer_passes trainer_plain_passes, trainer_pipeline_passes, trainer_group_passes;

/* The training state: this rank's place on the mesh, the model and what it learns (one
 * mt_dp_model owns parameters, gradients and Adam moments on every layout, one process
 * included), the data it reads, and how its passes run. */
typedef struct trainer_state {
    mt_comm *world;   /* NULL: one process */
    mt_mesh *mesh;    /* with a world */
    mt_comm *dp;      /* the data-parallel group, NULL for one replica */
    mt_comm *tp;      /* the tensor-parallel group, NULL when the model is whole */
    mt_cp_ring *cp_ring; /* the context-parallel group's ring, NULL for whole sequences */
    mt_tp_tree *tp_tree; /* deterministic: its sums' tree and scratch (NULL otherwise) */
    int rank;         /* in the world */
    mt_mesh_coord at; /* on the mesh (all 0 for one process) */
    mt_thread_count threads; /* this rank's, and where the figure came from */
    mt_memory_ledger ledger;
    mt_gpt gpt;              /* the model's table and activations */
    mt_dp_model *model;      /* its state */
    mt_tokens train_tokens, val_tokens;
    mt_sampler train, val;
    /* bits per byte over nats per token on the validation split (val tokens / val bytes / ln 2),
     * NAN when the corpus folder does not record its bytes */
    double val_bpb_per_loss;
    int32_t *inputs, *targets; /* one micro-batch of this rank */
    double *finite_checks;     /* every rank's loss, gradient square sum and deterministic mean
                                * loss (train_step.c) */
    /* deterministic: each pass's loss, the group's gathered (2 x groups), and the step's mean
     * loss over them in the groups' tree (step_groups.c) */
    double *group_losses, *group_gather, group_mean_loss;
    trainer_prefetch *prefetch; /* NULL: the step draws its micro-batches itself */
    const trainer_passes *passes;
    /* pp > 1: the stage's executor, the communicator its gradients travel on (activations
     * take the mesh's pp group), and the step being run, for its micro-batch loader. */
    mt_pp_runner *runner;
    mt_comm *pp_gradients;
    int pp_step;
    trainer_fault fault;
    /* a worker of parameter servers (ps_run.c): the servers and the transport to them; NULL
     * otherwise. The world is then the workers' group. */
    const mt_ps_worker *ps;
    trainer_local *local; /* local steps' anchor and outer state (local_sgd.c), NULL: DDP */
    int start_step;   /* the step the run resumed from (0: a fresh start) */
    /* The applied-step counter, the data cursor and the batches left out, the scaler's and
     * the spike guard's state: what a checkpoint carries besides the tensors. */
    mt_ckpt_training training;
    long long step_batch; /* the global batch the step in progress draws */
    trainer_loss_scaler scaler; /* their states are copied into training after each step */
    trainer_spike_guard spike;
} trainer_state;

/* What the run measures and leaves behind. World rank 0 writes the files. */
typedef struct trainer_outputs {
    int writes;
    time_t started; /* when the outputs opened, for the provenance */
    FILE *metrics;    /* OUT/metrics.jsonl */
    progress progress;
    mt_trace *trace;  /* cfg->trace: this rank's timeline, or NULL */
    int resumed_here; /* from a checkpoint in OUT/ckpt: metrics.jsonl continues */
    int32_t *rank_threads;   /* every world rank's threads, by rank */
    double *step_seconds;    /* per step, for the median throughput */
    /* Seconds blocked on data-parallel communication: the trainer's own collectives (the
     * loss check), and over the timed steps with the model's, against their step time; and
     * over the timed steps, in the model's tensor-parallel collectives. */
    double wait_seconds, timed_wait, timed_seconds, timed_tp;
    double timed_cp; /* of the timed steps, waiting on the context-parallel ring */
    /* Seconds the step waited for its micro-batches (drawing them, without prefetch), and
     * over the timed steps. */
    double data_seconds, timed_data;
    double dp_bytes;   /* gradient bytes handed to the data-parallel group, over dp_byte_steps */
    int dp_byte_steps;
    double wire_bytes[3]; /* sent over the network on the dp, tp and pp groups, likewise */
    int timed_steps;
    /* Every rank's memory after the run: MEMORY_COLUMNS figures per world rank. */
    long long *memory;
    int memory_ranks;
    /* The pipeline over the timed steps: this stage's busy and pipeline seconds and its most
     * activations held at once; after the run, every stage's bubble and peak. */
    double pp_busy, pp_span;
    int pp_peak_slots;
    double *bubble, bubble_expected;
    int *stage_slots;
    int *stage_reserved;     /* the slots each stage's arena holds */
    /* Checkpoints: the save in flight (async_save), the communicator saves use (a world of
     * their own under async_save, so a background save never meets training's collectives),
     * and the totals of every save. */
    trainer_save *save;
    mt_comm *save_comm, *own_save_comm;
    /* Where each step's time went (step_account.h); the counters when the passes ended. */
    trainer_account account;
    account_counters passes_done;
    double passes_end;
    double save_seconds;       /* every save's own time, planning to commit */
    double save_stall_seconds; /* training's wait for saves (all of it unless async_save) */
    unsigned long long saved_bytes; /* every rank's shards (world rank 0) */
    int saves;
    /* An elastic job that may grow: world rank 0's connection to the launchers' store
     * (trainer_grow.c), and the step whose checkpoint the run stopped at to regroup (0: none). */
    struct mt_store *grow_store;
    int regrouped_at;
} trainer_outputs;

struct trainer {
    const mt_run_plan *plan;
    const mt_config *cfg; /* the plan's */
    trainer_state state;
    trainer_outputs out;
};

/* Per rank: the ledger's bytes of each kind, its total at peak, resident now and at peak. */
enum { MEMORY_COLUMNS = MT_MEMORY_KINDS + 3 };

/* Whether step `step` ends with a checkpoint (every save_every steps and the last). */
static inline int trainer_saves_at(const mt_config *cfg, int step)
{
    return cfg->save_every > 0 && (step % cfg->save_every == 0 || step == cfg->steps);
}

/* Whether the model runs sequence parallelism (asked for, and split over tp > 1). */
static inline int trainer_sequence_parallel(const trainer *tr)
{
    return tr->state.gpt.tp.size > 1 && tr->state.gpt.tp.sequence_parallel;
}

/* The counters step accounting takes differences of: every wait this rank has timed, by group,
 * and its data time. */
static inline void trainer_read_counters(const trainer *tr, account_counters *c)
{
    const trainer_state *st = &tr->state;
    if (!tr->out.account.on) { /* --accounting off: nothing reads them */
        *c = (account_counters){0};
        return;
    }
    double model = mt_dp_model_wait_seconds(st->model);
    double embedding = mt_dp_model_embedding_seconds(st->model);
    c->dp_model = model - embedding;
    /* the trainer's own checks over the world wait for the slowest rank: on a pipeline the
     * last stage to end (idle), else the slowest replica (data-parallel) */
    c->idle = tr->plan->shape.pp > 1 ? tr->out.wait_seconds : 0;
    c->dp = tr->out.wait_seconds - c->idle + c->dp_model;
    c->embedding = embedding;
    c->tp = st->gpt.tp_seconds;
    c->data = tr->out.data_seconds;
    c->dp_running = mt_comm_collective_seconds(st->dp);
}

/* trainer.c: the run on this world (under parameter servers the workers' group, with `ps`) */
mt_status trainer_run(const mt_config *cfg, mt_comm *world, const mt_ps_worker *ps,
                      FILE *progress_out, const mt_sample_text *sample,
                      mt_train_summary *summary);

/* ps_run.c: a job with parameter servers: the world split into workers, which run the
 * trainer, and servers (ps_server.c) */
mt_status trainer_ps_run(const mt_config *cfg, mt_comm *world, FILE *progress_out,
                         const mt_sample_text *sample, mt_train_summary *summary);
/* ps_server.c: a server's run: `job` the whole job, `servers` the servers' group */
mt_status trainer_ps_serve(const mt_run_plan *plan, mt_comm *job, mt_comm *servers,
                           mt_ps_transport *transport);
/* ps_server.c: a server's share of one tensor-parallel rank's table: arrays of the range
 * [lo, hi), each placed so that element x sits at the same alignment (mod 64 bytes) as in a
 * worker's arena, where DDP sums and updates it (the vectorised kernels then split the work
 * into the same lanes) */
enum { TRAINER_PS_ARRAYS = 5, TRAINER_PS_ALIGN_FLOATS = 16 };
typedef struct trainer_ps_shard {
    mt_ps_range range;
    void *blocks[TRAINER_PS_ARRAYS];
    float *param, *m, *v, *grad, *stage; /* element x at [x - range.lo] */
    int first_worker;                    /* the first data-parallel worker of this tp rank */
} trainer_ps_shard;
mt_status trainer_ps_shard_alloc(trainer_ps_shard *s);
void trainer_ps_shard_free(trainer_ps_shard *s);
int trainer_ps_shard_holds(const trainer_ps_shard *s, const mt_param_info *p);
void trainer_ps_shard_update(const mt_config *cfg, const mt_gpt *gpt, trainer_ps_shard *s,
                             int lr_step, int adam_step, double clip_scale);
/* ps_serve_alone.c: a server of ssp or async (index: among the servers) */
mt_status trainer_ps_serve_alone(const mt_run_plan *plan, int index, mt_ps_transport *transport);
/* ps_server.c: waits (over channels) until every worker has closed its link */
void trainer_ps_drain(mt_ps_transport *t, int workers);

/* trainer_state.c */
/* This rank's threads; the plan's stage layers, balanced by measured cost when it asks (the
 * plan is final after this and becomes tr->plan); then this rank's place, model, state, data
 * and passes. Resume and init say where the parameters come from (else the seed). Collective
 * over tr->state.world. */
mt_status trainer_state_open(trainer *tr, mt_run_plan *plan, const mt_ckpt_meta *resume,
                             trainer_init *init);
/* The same without the corpus: the model on its layout, for generation. */
mt_status trainer_state_open_model(trainer *tr, mt_run_plan *plan, const mt_ckpt_meta *resume,
                                   trainer_init *init);
void trainer_state_close(trainer *tr);
/* Whether step's times count in the run's figures: the first two steps of a run (or of its
 * resumption) warm up, unless there are no others. */
int trainer_step_is_timed(const trainer *tr, int step);

/* step_pipeline.c */
/* After the model: the gradient communicator and the stage's executor. */
mt_status trainer_pipeline_start(trainer *tr);
void trainer_pipeline_stop(trainer *tr);
/* Every stage's bubble and activation peak (collective); world rank 0 prints them. */
mt_status trainer_report_pipeline(trainer *tr, FILE *out);

/* train_step.c */
/* This rank's sequences of micro-batch `micro` of step `step`, into the state's inputs and
 * targets: from the prefetch thread when there is one; the wait counts as data time. */
mt_status trainer_draw_microbatch(trainer *tr, int step, int micro);
/* Starts this rank's prefetch thread (cfg->prefetch > 0, on a rank that reads batches). */
mt_status trainer_prefetch_begin(trainer *tr);
/* One optimizer step over the global batch: this rank's passes, the gradient sync, the NaN and
 * replica checks, clipping and the update. */
mt_status trainer_step(trainer *tr, int step, step_record *record);
/* --offload_delay: the update held back applied now (every rank, after step `step`) */
mt_status trainer_delay_flush(trainer *tr, int step);

/* trainer_rollback.c */
/* After the spike guard's streak reached spike_rollbacks at `step`: waits for the save in
 * flight, reloads the newest checkpoint (collective), keeps the run's skip counts and adds
 * the streak's batches to those left out; *resumed is the checkpoint's step, the next step
 * the run takes follows it. Logged in metrics.jsonl. */
mt_status trainer_rollback(trainer *tr, int step, int *resumed);

/* trainer_checkpoint.c */
/* Saves OUT/ckpt/step_<step>/ from every rank (collective over the world): inline, or under
 * async_save from a copy in memory by a background thread while training goes on. Waits for
 * the previous save first. An error on any rank fails the save on every rank, leaving no
 * step_<step> folder and the earlier checkpoints intact. */
mt_status trainer_save_checkpoint(trainer *tr, int step);
/* Waits for the save in flight, if any, and returns its outcome. */
mt_status trainer_finish_save(trainer *tr);

/* trainer_grow.c */
/* After the checkpoint of `step` (before the last): when a node waits to join the job, that
 * checkpoint is committed and *stop is 1 on every rank (collective over the world), so the
 * launchers meet again with it; the run then leaves no final outputs. */
mt_status trainer_grow_check(trainer *tr, int step, int *stop);
void trainer_grow_close(trainer *tr);

/* trainer_resume.c */
/* Before the run is set up: the checkpoint to resume from (cfg->resume, or auto after a
 * restart; collective over the world for auto), its metadata in *meta (meta->step -1: a fresh
 * start), and cfg with the model shape and optimizer settings taken from it (a key given that
 * contradicts the checkpoint is an error naming both). */
mt_status trainer_resolve_resume(mt_config *cfg, mt_comm *world, mt_ckpt_meta *meta);
/* The newest committed checkpoint under OUT/ckpt into dir, found by world rank 0 and broadcast
 * so that every rank takes the same one; *step -1 when there is none (collective). */
mt_status trainer_find_latest(const mt_config *cfg, mt_comm *world, char *dir, size_t capacity,
                              int *step);
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
struct trainer_init {
    mt_safetensors *file; /* NULL: no --init, or a resumed run */
    const char *prefix;
};
/* Before the run is set up: opens cfg->init (unless the run resumes a checkpoint) and takes
 * the model's shape from it (a key given that contradicts it is an error naming both). */
mt_status trainer_resolve_init(mt_config *cfg, const mt_ckpt_meta *resume, mt_comm *world,
                               trainer_init *init);
/* After the model exists: this rank's parameters from the file (Adam moments stay zero); every
 * tensor of the file must be accounted for (collective: an error anywhere fails all). */
mt_status trainer_load_init(trainer *tr, trainer_init *init);
/* Both of the above, then the plan of the configuration they fixed (`run`, which *plan's
 * config copies) on a job of world_size ranks (the servers included; `world` is the group
 * that resolves together): what training and generation start from. On failure nothing is
 * left open. */
mt_status trainer_resolve_run(const mt_config *cfg, mt_comm *world, int world_size,
                              mt_config *run, mt_ckpt_meta *resume, trainer_init *init,
                              mt_run_plan *plan);

/* safetensors_floats.c */
/* Whether `dtype` is one --init reads (F32, BF16, F16). */
int trainer_safetensors_is_float(mt_safetensors_dtype dtype);
/* Tensor i of `file` (F32, BF16 or F16) as numel floats in out; another dtype is an error
 * naming the file, the tensor and its dtype. */
mt_status trainer_safetensors_read_floats(const mt_safetensors *file, int i, float *out);

/* run_outputs.c */
/* After the state: OUT/config.ini, OUT/metrics.jsonl (continued when `resumed_dir`, the
 * checkpoint the run resumed from, lies in OUT/ckpt; NULL: a fresh start) and the progress
 * lines on progress_out (world rank 0); this rank's trace; every rank's thread count; the
 * communicator saves use. Collective over the world. */
mt_status trainer_outputs_open(trainer *tr, const char *resumed_dir, FILE *progress_out);
/* Lets a save in flight end (a failed run's too), closes the trace and frees the rest; returns
 * `status`, or when that is MT_OK the first failure of those. */
mt_status trainer_outputs_close(trainer *tr, mt_status status);
/* rank_files.c: rank `rank`'s file of a kind into path (size bytes). */
typedef void (*trainer_rank_path)(const void *context, int rank, char *path, size_t size);
/* Collective over `world`: every rank's file (path_of) that world rank 0 does not see with the
 * same bytes is sent to rank 0 and written there durably under the same name; *collected
 * counts them. A rank without the file sends nothing. */
mt_status trainer_collect_rank_files(mt_comm *world, trainer_rank_path path_of, const void *context,
                                     int *collected);
/* Every rank's memory (ledger and resident set), gathered to every rank; rank 0 prints it. */
mt_status trainer_gather_memory(trainer *tr, FILE *out);
/* memory_limit.c: --memory_limit's refusal of a run whose memory table (every rank's ledger
 * after the state is planned) exceeds it, naming the rank and its kinds (collective). */
mt_status trainer_check_memory_limit(const trainer *tr);
mt_status trainer_write_summary(trainer *tr, mt_train_summary *summary);
/* OUT/model.safetensors, unit by unit (collective under ZeRO-3). */
mt_status trainer_save_model(trainer *tr);

#endif
