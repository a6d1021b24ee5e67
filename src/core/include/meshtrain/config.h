/* The run configuration: every key, its default, and how files and flags set it.
 * One table drives parsing, validation, --help and the saved copy, so they never disagree. */
#ifndef MESHTRAIN_CONFIG_H
#define MESHTRAIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "meshtrain/status.h"

enum { MT_PATH_MAX = 512, MT_TEXT_MAX = 256, MT_CONFIG_GIVEN_WORDS = 2 };

typedef struct mt_config {
    /* model shape */
    int vocab, context, layers, heads, width;
    /* optimisation */
    int batch, microbatches, steps, warmup;
    double lr, min_lr, weight_decay, beta1, beta2, eps, clip;
    char optimizer[MT_TEXT_MAX]; /* adamw or sgd */
    double momentum;             /* sgd's */
    char grad_comm[MT_TEXT_MAX]; /* allreduce, powersgd, signsgd or onebit */
    char grad_reduce[MT_TEXT_MAX]; /* the dp gradient reduction's wire type: fp32 or bf16 */
    int powersgd_rank, powersgd_start, onebit_warmup;
    double loss_scale_min; /* fp16's dynamic loss scaler: its least scale */
    int loss_scale_window, loss_scale_hysteresis; /* clean steps to double; overflows to halve */
    double spike_guard;  /* K: skip a loss above mean + K std (0: off) */
    int spike_rollbacks; /* N consecutive spike skips roll back to the last checkpoint (0: never) */
    uint64_t seed;
    /* machinery */
    int threads; /* 0: the available cores divided by the local ranks */
    /* parallelism: nproc local workers; a dp x pp x tp mesh over all ranks (dp 0: whatever
     * the world size leaves, resolved by mt_mesh_shape_resolve, which also checks the rest) */
    int nproc, dp, tp, pp;
    int cp; /* context-parallel ranks per sequence (zig-zag ring attention) */
    int sp;            /* sequence parallelism inside the tensor-parallel group */
    int zero;          /* ZeRO stage 0-3 over the data-parallel group */
    int zero_shard_size; /* ZeRO 1-3: data-parallel ranks per shard group (0: all of them) */
    int zero3_keep_params; /* ZeRO 3: gathered blocks kept for the whole step */
    int deterministic;     /* the same bits on any dp and micro-batch count (run_plan.h) */
    char schedule[MT_TEXT_MAX]; /* pipeline schedule: gpipe, 1f1b or interleaved */
    int chunks;        /* model chunks per pipeline stage (interleaved) */
    char balance[MT_TEXT_MAX];  /* layers per stage: even, or cost (measured) */
    char recompute[MT_TEXT_MAX]; /* activation recomputation: none, selective or full */
    char precision[MT_TEXT_MAX]; /* forward and backward: fp32, bf16 or fp16 */
    char attention[MT_TEXT_MAX]; /* attention kernels: fused or plain */
    char trace[MT_PATH_MAX]; /* each rank's Chrome trace (empty: none) */
    /* offload: none, optimizer or params, into a file per rank in offload_dir (empty:
     * OUT/offload) through offload_buffers buffers */
    char offload[MT_TEXT_MAX];
    char offload_dir[MT_PATH_MAX];
    int offload_buffers;
    char offload_io[MT_TEXT_MAX]; /* how records move: auto, io_uring or pread */
    int offload_delay, offload_delay_warmup; /* delayed update after that many normal ones */
    double bucket_mb;  /* DDP all-reduce bucket size */
    int overlap;       /* DDP, ZeRO 1: reductions start as backward finishes units (else after) */
    int check_every;   /* steps between replica checksums (0: never) */
    /* local SGD / DiLoCo: replicas step alone local_steps times, then synchronise by the outer
     * optimizer (none: DDP, avg, sgd or nesterov) with outer_lr and outer_momentum; a replica
     * is one data-parallel rank, or under diloco_group host the ranks of one host */
    int local_steps;
    char outer_optimizer[MT_TEXT_MAX];
    char diloco_group[MT_TEXT_MAX]; /* replica, or host (DDP inside each host) */
    double outer_lr, outer_momentum;
    /* parameter servers: ps_servers ranks after the workers hold the parameters and AdamW
     * state; ps_mode sync, ssp (staleness clocks ahead at most) or async */
    int ps_servers;
    char ps_mode[MT_TEXT_MAX];
    int staleness;
    int save_model;    /* write OUT/model.safetensors at the end */
    /* checkpoints (OUT/ckpt/step_<N>/): every save_every steps and at the end (0: never),
     * the newest `keep` committed ones kept; resume from a step folder, "auto" (the newest
     * under OUT/ckpt, or a fresh start) or "" (a fresh start); async_save writes in the
     * background; max_restarts: `train --nproc` restarts a failed job that often */
    int save_every, keep, async_save, max_restarts;
    char resume[MT_PATH_MAX];
    char init[MT_PATH_MAX]; /* a safetensors file to start from (empty: initialised) */
    char data[MT_PATH_MAX], out[MT_PATH_MAX];
    int prefetch; /* micro-batches prepared ahead by a thread per rank (0: none) */
    /* reporting */
    int eval_every, eval_seqs, log_every;
    int accounting;        /* step accounting on every rank (step_account.h) */
    uint64_t memory_limit; /* bytes per rank the memory table may reach (0: no limit) */
    int sample_tokens, top_k;
    double temperature;
    char prompt[MT_TEXT_MAX];
    /* which keys a file or flag set (bit i % 64 of word i / 64: the table's key i), so a
     * checkpoint can tell a key that contradicts it from a default */
    uint64_t given[MT_CONFIG_GIVEN_WORDS];
} mt_config;

/* Fills every key with its built-in default. */
void mt_config_defaults(mt_config *cfg);

/* Sets one key from text. `key` may use '-' or '_' ("save-every" == "save_every");
 * `where` names the source ("file.ini line 3", "the command line") in messages. */
mt_status mt_config_set(mt_config *cfg, const char *key, const char *value, const char *where);

/* Reads `key = value` lines ('#' starts a comment) from a file. */
mt_status mt_config_load_file(mt_config *cfg, const char *path);

/* Applies "--key value" and "--key=value" arguments, and "--config FILE" (loaded where it
 * appears, so later flags override it). */
mt_status mt_config_parse_args(mt_config *cfg, int argc, char **argv);

/* Checks the keys against each other (heads divide width, batch divides by microbatches,
 * ...), naming the offending keys. Called before any work starts. */
mt_status mt_config_validate(const mt_config *cfg);

/* Writes every key as `key = value`, the format mt_config_load_file reads. */
void mt_config_write(const mt_config *cfg, FILE *out);

/* The table's keys, by index (0 to mt_config_key_count() - 1). */
int mt_config_key_count(void);
const char *mt_config_key_name(int index);
/* Whether a file or flag set `key` (rather than its default). */
int mt_config_given(const mt_config *cfg, const char *key);
/* `key`'s value as mt_config_set reads it back (text unquoted); an unknown key gives "". */
void mt_config_format(const mt_config *cfg, const char *key, char *out, size_t capacity);

/* Writes the keys with their defaults and one-line descriptions, for --help. */
void mt_config_print_help(FILE *out);

#endif
