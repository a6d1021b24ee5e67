/* Memory accounting: every byte of training state meshtrain allocates is counted by kind, so a
 * rank can report what it holds (and ZeRO's savings can be measured, not assumed). */
#ifndef MESHTRAIN_MEMORY_H
#define MESHTRAIN_MEMORY_H

#include <stddef.h>

typedef enum mt_memory_kind {
    MT_MEMORY_PARAMETERS,  /* parameters (a shard, the whole model, or gathered copies) */
    MT_MEMORY_GRADIENTS,   /* gradients and the buffers backward writes them into */
    MT_MEMORY_OPTIMIZER,   /* Adam's two moments */
    MT_MEMORY_ACTIVATIONS, /* what forward keeps for backward, and backward's scratch */
    MT_MEMORY_COMM,        /* communication buffers this rank owns (staging, rings) */
    MT_MEMORY_OFFLOAD,     /* the offload engine's buffers (the state itself is in its file) */
    MT_MEMORY_KINDS
} mt_memory_kind;

/* Bytes held now and at their peak, per kind and in total. One ledger per model owner (a
 * trainer): nothing is global, so two models in one process never mix their counts. */
typedef struct mt_memory_ledger {
    size_t bytes[MT_MEMORY_KINDS], peak[MT_MEMORY_KINDS];
    size_t total, total_peak;
} mt_memory_ledger;

/* Adds (or, with a negative delta, returns) bytes of a kind. A NULL ledger counts nothing. */
void mt_memory_count(mt_memory_ledger *ledger, mt_memory_kind kind, long long delta);

/* "parameters", "gradients", "optimizer", "activations", "comm", "offload". */
const char *mt_memory_kind_name(mt_memory_kind kind);

/* The process's resident set now and at its peak (VmRSS and VmHWM of /proc/self/status), in
 * bytes; 0 when unknown. The cross-check of the ledger: it also sees libraries, the heap of
 * small allocations and pages of peers' shared segments this process has touched. */
void mt_memory_resident(size_t *now, size_t *peak);

#endif
