/* Config keys as a table of (name, type, field offset, default, help); parsing, validation
 * messages, --help and the saved run config all read the same table. */
#include "meshtrain/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KEY_INT, KEY_SWITCH, KEY_U64, KEY_BYTES, KEY_REAL, KEY_TEXT, KEY_PATH } key_type;

typedef struct config_key {
    const char *name;
    key_type type;
    size_t offset;
    const char *default_value;
    double min, max; /* bounds for numbers */
    const char *help;
} config_key;

#define FIELD(f) offsetof(mt_config, f)
static const config_key KEYS[] = {
    {"vocab", KEY_INT, FIELD(vocab), "256", 1, 1 << 24, "vocabulary size (byte tokens need >= 256)"},
    {"context", KEY_INT, FIELD(context), "128", 1, 1 << 16, "sequence length (tokens per sequence)"},
    {"layers", KEY_INT, FIELD(layers), "4", 1, 4096, "transformer blocks"},
    {"heads", KEY_INT, FIELD(heads), "4", 1, 4096, "attention heads per block"},
    {"width", KEY_INT, FIELD(width), "256", 1, 1 << 16, "model width (embedding size)"},
    {"batch", KEY_INT, FIELD(batch), "16", 1, 1 << 20, "sequences per optimizer step (the global batch)"},
    {"microbatches", KEY_INT, FIELD(microbatches), "1", 1, 1 << 20,
     "gradient-accumulation steps per optimizer step"},
    {"steps", KEY_INT, FIELD(steps), "600", 0, 1e9, "optimizer steps of the run"},
    {"warmup", KEY_INT, FIELD(warmup), "40", 0, 1e9, "steps of linear learning-rate warm-up"},
    {"lr", KEY_REAL, FIELD(lr), "3e-3", 0, 10, "peak learning rate"},
    {"min_lr", KEY_REAL, FIELD(min_lr), "3e-4", 0, 10, "learning rate at the end of the cosine decay"},
    {"weight_decay", KEY_REAL, FIELD(weight_decay), "0.1", 0, 10,
     "AdamW decoupled weight decay (matrices only)"},
    {"beta1", KEY_REAL, FIELD(beta1), "0.9", 0, 0.999999, "AdamW first-moment decay"},
    {"beta2", KEY_REAL, FIELD(beta2), "0.95", 0, 0.999999999, "AdamW second-moment decay"},
    {"eps", KEY_REAL, FIELD(eps), "1e-8", 0, 1, "AdamW epsilon"},
    {"optimizer", KEY_TEXT, FIELD(optimizer), "adamw", 0, 0,
     "adamw, or sgd (torch.optim.SGD: momentum, weight decay coupled as L2)"},
    {"momentum", KEY_REAL, FIELD(momentum), "0.9", 0, 0.999999, "SGD momentum (0: plain SGD)"},
    {"grad_comm", KEY_TEXT, FIELD(grad_comm), "allreduce", 0, 0,
     "how data parallelism sends gradients (zero 0 or 1): allreduce, powersgd, signsgd (majority "
     "vote), onebit (sign x scale with error feedback; --optimizer sgd)"},
    {"grad_reduce", KEY_TEXT, FIELD(grad_reduce), "fp32", 0, 0,
     "what the data-parallel gradient reduction (DDP all-reduce, ZeRO reduce-scatter) sends: "
     "fp32, or bf16 (half the bytes; every rank's rounded gradient summed in fp32, with any "
     "precision)"},
    {"powersgd_rank", KEY_INT, FIELD(powersgd_rank), "2", 1, 4096, "PowerSGD: the rank R of the factors"},
    {"powersgd_start", KEY_INT, FIELD(powersgd_start), "10", 0, 1e9,
     "PowerSGD: steps before this one take the plain all-reduce"},
    {"onebit_warmup", KEY_INT, FIELD(onebit_warmup), "10", 0, 1e9,
     "1-bit SGD: steps of plain all-reduce first"},
    {"clip", KEY_REAL, FIELD(clip), "1.0", 0, 1e30, "global gradient-norm clip (0: off)"},
    {"loss_scale_window", KEY_INT, FIELD(loss_scale_window), "2000", 1, 1e9,
     "fp16: steps without an overflow after which the loss scale doubles"},
    {"loss_scale_hysteresis", KEY_INT, FIELD(loss_scale_hysteresis), "1", 1, 1e6,
     "fp16: overflows since the scale last grew before each halving (1: every overflow)"},
    {"loss_scale_min", KEY_REAL, FIELD(loss_scale_min), "1", 1e-30, 1e30,
     "fp16: a loss scale halved below this stops the run, naming the overflowing tensors"},
    {"spike_guard", KEY_REAL, FIELD(spike_guard), "0", 0, 1e6,
     "skip a step whose loss exceeds the running mean by K running standard deviations (0: off)"},
    {"spike_rollbacks", KEY_INT, FIELD(spike_rollbacks), "0", 0, 64,
     "after N consecutive spike skips, reload the last checkpoint and leave their batches out "
     "(0: never)"},
    {"seed", KEY_U64, FIELD(seed), "1337", 0, 0, "seed of initialisation, batch order and sampling"},
    {"threads", KEY_INT, FIELD(threads), "0", 0, 4096, "threads per rank (0: OMP_NUM_THREADS, else CPUs/local ranks)"},
    {"nproc", KEY_INT, FIELD(nproc), "1", 1, 4096, "local worker processes to launch"},
    {"dp", KEY_INT, FIELD(dp), "0", 0, 1 << 20,
     "data-parallel replicas (0: the world size / (tp * pp * cp))"},
    {"tp", KEY_INT, FIELD(tp), "1", 1, 4096, "tensor-parallel ranks per layer (must divide heads)"},
    {"cp", KEY_INT, FIELD(cp), "1", 1, 4096,
     "context-parallel ranks per sequence: each cut into 2 cp chunks, ring attention (with dp)"},
    {"pp", KEY_INT, FIELD(pp), "1", 1, 4096, "pipeline stages (the layers cut into pp runs; see balance, schedule)"},
    {"schedule", KEY_TEXT, FIELD(schedule), "1f1b", 0, 0,
     "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b, interleaved, zb1 (zero "
     "bubble: backwards split into input and weight gradients; 1f1b's activation memory), zb2 "
     "(split, up to 2 pp - 1 micro-batches held, no stage idle between its first and last pass)"},
    {"chunks", KEY_INT, FIELD(chunks), "1", 1, 8,
     "model chunks per pipeline stage (interleaved schedule; layers >= pp x chunks)"},
    {"balance", KEY_TEXT, FIELD(balance), "even", 0, 0,
     "layers per pipeline stage: even, or cost (balanced by each layer's measured time)"},
    {"trace", KEY_PATH, FIELD(trace), "", 0, 0,
     "write each rank's Chrome trace to FILE with .rank<R> before .json (empty: none)"},
    {"recompute", KEY_TEXT, FIELD(recompute), "none", 0, 0,
     "activation recomputation: none, selective (attention scores and softmax), full (each "
     "block's input only)"},
    {"precision", KEY_TEXT, FIELD(precision), "fp32", 0, 0,
     "precision of forward and backward: fp32, bf16 or fp16 (fp32 master parameters, "
     "gradients and AdamW moments in every one)"},
    {"attention", KEY_TEXT, FIELD(attention), "fused", 0, 0,
     "attention kernels: fused (blocked, online softmax, keeps no T x T probabilities; head "
     "sizes 4 to 256 in steps of 4) or plain (keeps the probabilities)"},
    {"sp", KEY_SWITCH, FIELD(sp), "off", 0, 1,
     "sequence parallelism: norms and residuals hold 1/tp of each micro-batch's rows (on|off)"},
    {"zero", KEY_INT, FIELD(zero), "0", 0, 3,
     "ZeRO stage over the data-parallel ranks: 0 DDP, 1 optimizer state, 2 + gradients, 3 + parameters"},
    {"zero_shard_size", KEY_INT, FIELD(zero_shard_size), "0", 0, 1 << 20,
     "ZeRO 1-3: shard over groups of this many consecutive data-parallel ranks and replicate "
     "across the groups (hybrid sharding, HSDP); 0: the whole data-parallel group"},
    {"zero3_keep_params", KEY_SWITCH, FIELD(zero3_keep_params), "off", 0, 1,
     "ZeRO 3: keep each gathered block until the update (one gather per block and step, the stage's parameters in full) (on|off)"},
    {"offload", KEY_TEXT, FIELD(offload), "none", 0, 0,
     "state kept in a file per rank instead of memory: none, optimizer (AdamW's moments), "
     "params (ZeRO 3: the parameter shards too)"},
    {"offload_dir", KEY_PATH, FIELD(offload_dir), "", 0, 0,
     "folder of the offload files, on fast local storage (empty: OUT/offload)"},
    {"offload_buffers", KEY_INT, FIELD(offload_buffers), "4", 2, 1024,
     "offload: unit-sized buffers per rank that state streams through (read ahead, written behind)"},
    {"offload_io", KEY_TEXT, FIELD(offload_io), "auto", 0, 0,
     "offload: how records move: io_uring (Debian's liburing) where the build and the kernel "
     "allow it, else pread/pwrite (auto); io_uring; pread"},
    {"offload_delay", KEY_SWITCH, FIELD(offload_delay), "off", 0, 1,
     "delayed update: step t's optimizer runs while step t+1's forward and backward run, on "
     "parameters one step stale (ZeRO-Offload's; changes the maths; offload none applies the "
     "same delay in memory, in line) (on|off)"},
    {"offload_delay_warmup", KEY_INT, FIELD(offload_delay_warmup), "10", 0, 1 << 30,
     "offload_delay: updates applied normally before the delay starts"},
    {"deterministic", KEY_SWITCH, FIELD(deterministic), "off", 0, 1,
     "the same bits on any dp and micro-batch count: every sum over the batch in one fixed tree "
     "over groups of its sequences, with the same tp, pp and zero (power-of-2 dp and "
     "microbatches; no zb1 or zb2 schedule, local steps, grad_comm hooks, bf16 grad_reduce, hybrid "
     "sharding or offload) (on|off)"},
    {"bucket_mb", KEY_REAL, FIELD(bucket_mb), "4", 0, 1 << 20,
     "DDP: MiB of gradients per all-reduce bucket (started as backward fills it)"},
    {"overlap", KEY_SWITCH, FIELD(overlap), "on", 0, 1,
     "DDP and ZeRO 1: start each bucket's reduction as backward fills it (off: all of them "
     "after backward, nothing hidden) (on|off)"},
    {"local_steps", KEY_INT, FIELD(local_steps), "1", 1, 1e9,
     "local SGD / DiLoCo: optimizer steps each data-parallel replica takes on its own data "
     "between synchronisations (above 1 with outer_optimizer none: avg)"},
    {"outer_optimizer", KEY_TEXT, FIELD(outer_optimizer), "none", 0, 0,
     "how replicas synchronise every local_steps: none (DDP: gradients every step), avg "
     "(parameters averaged), sgd or nesterov (DiLoCo: the mean displacement is an outer gradient)"},
    {"diloco_group", KEY_TEXT, FIELD(diloco_group), "replica", 0, 0,
     "local steps: what steps alone between synchronisations: replica (each data-parallel "
     "rank) or host (the data-parallel ranks of a host, DDP among them)"},
    {"outer_lr", KEY_REAL, FIELD(outer_lr), "0.7", 0, 100, "DiLoCo: the outer optimizer's learning rate"},
    {"outer_momentum", KEY_REAL, FIELD(outer_momentum), "0.9", 0, 0.999999,
     "DiLoCo: the outer optimizer's momentum"},
    {"ps_servers", KEY_INT, FIELD(ps_servers), "0", 0, 1 << 20,
     "parameter-server ranks added to the job (the last ranks of the world; the others are "
     "workers); 0: none"},
    {"ps_mode", KEY_TEXT, FIELD(ps_mode), "sync", 0, 0,
     "parameter servers' consistency: sync (every worker's gradient of a step before its "
     "update: DDP's model), ssp or async"},
    {"staleness", KEY_INT, FIELD(staleness), "0", 0, 1 << 20,
     "ps_mode ssp: clocks a worker may run ahead of the slowest"},
    {"check_every", KEY_INT, FIELD(check_every), "50", 0, 1e9,
     "steps between checksums of the data-parallel replicas' parameters (0: never)"},
    {"save_model", KEY_SWITCH, FIELD(save_model), "on", 0, 1,
     "write the trained parameters to OUT/model.safetensors at the end (on|off)"},
    {"save_every", KEY_INT, FIELD(save_every), "0", 0, 1e9,
     "steps between checkpoints in OUT/ckpt/step_<N>, one also at the end (0: none)"},
    {"keep", KEY_INT, FIELD(keep), "3", 1, 1e6, "committed checkpoints kept (older ones deleted)"},
    {"resume", KEY_PATH, FIELD(resume), "", 0, 0,
     "continue from a checkpoint: a step_<N> folder, or auto (the newest under OUT/ckpt, else a "
     "fresh start); restarted workers resume auto"},
    {"init", KEY_PATH, FIELD(init), "", 0, 0,
     "start from the parameters of a safetensors file (GPT-2's names, as `meshtrain export` "
     "writes, or model.safetensors); the model shape comes from it"},
    {"async_save", KEY_SWITCH, FIELD(async_save), "off", 0, 1,
     "write checkpoints in the background from a copy in memory while training goes on (on|off)"},
    {"max_restarts", KEY_INT, FIELD(max_restarts), "0", 0, 1000,
     "with --nproc: restart the whole job after a failure, up to N times (resuming auto)"},
    {"data", KEY_PATH, FIELD(data), "data/kjv", 0, 0, "corpus folder written by `meshtrain data`"},
    {"out", KEY_PATH, FIELD(out), "runs/default", 0, 0, "run folder (metrics.jsonl, summary.json)"},
    {"prefetch", KEY_INT, FIELD(prefetch), "4", 0, 64,
     "micro-batches a background thread per rank prepares ahead (0: the step draws its own)"},
    {"eval_every", KEY_INT, FIELD(eval_every), "100", 0, 1e9,
     "validation loss every N steps and at the end (0: never)"},
    {"eval_seqs", KEY_INT, FIELD(eval_seqs), "64", 1, 1 << 20, "validation sequences per evaluation"},
    {"log_every", KEY_INT, FIELD(log_every), "20", 1, 1e9,
     "steps between progress lines when output is not a terminal"},
    {"accounting", KEY_SWITCH, FIELD(accounting), "on", 0, 1,
     "step accounting on every rank: where each step's time goes, the verdict (on|off)"},
    {"memory_limit", KEY_BYTES, FIELD(memory_limit), "0", 0, 0,
     "bytes of memory per rank (K, M, G, T suffixes: powers of 1024): a run whose memory "
     "table exceeds it is refused before training, one near it (>= 90%) is memory-bound (0: "
     "no limit)"},
    {"sample_tokens", KEY_INT, FIELD(sample_tokens), "300", 0, 1 << 20,
     "tokens of text sampled at the end (0: none)"},
    {"temperature", KEY_REAL, FIELD(temperature), "0.8", 1e-3, 100, "sampling temperature"},
    {"top_k", KEY_INT, FIELD(top_k), "40", 0, 1 << 24, "sample among the k likeliest tokens (0: all)"},
    {"prompt", KEY_TEXT, FIELD(prompt), "And God said", 0, 0, "text the sample continues"},
};
#undef FIELD
enum { KEY_COUNT = sizeof KEYS / sizeof KEYS[0] };
_Static_assert(KEY_COUNT <= 64 * MT_CONFIG_GIVEN_WORDS, "mt_config.given has one bit per key");

static const config_key *find_key(const char *name)
{
    char normal[64];
    size_t n = strlen(name);
    if (n >= sizeof normal)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        normal[i] = name[i] == '-' ? '_' : name[i];
    for (int i = 0; i < KEY_COUNT; i++)
        if (strcmp(KEYS[i].name, normal) == 0)
            return &KEYS[i];
    return NULL;
}

static mt_status parse_number(const config_key *key, const char *value, const char *where,
                              double *number)
{
    char *end;
    errno = 0;
    *number = strtod(value, &end);
    if (end == value || *end != '\0' || errno == ERANGE || !isfinite(*number))
        return mt_fail(MT_EINVAL, "config key '%s' (%s): '%s' is not a number", key->name, where,
                       value);
    if (key->type != KEY_REAL && *number != floor(*number))
        return mt_fail(MT_EINVAL, "config key '%s' (%s): '%s' is not a whole number", key->name,
                       where, value);
    if (key->type != KEY_U64 && (*number < key->min || *number > key->max))
        return mt_fail(MT_EINVAL, "config key '%s' (%s): %s is outside [%g, %g]", key->name,
                       where, value, key->min, key->max);
    return MT_OK;
}

static mt_status parse_u64(const config_key *key, const char *value, const char *where,
                           uint64_t *number)
{
    char *end;
    errno = 0;
    unsigned long long parsed = strtoull(value, &end, 0);
    if (!isdigit((unsigned char)value[0]) || *end != '\0' || errno == ERANGE)
        return mt_fail(MT_EINVAL, "config key '%s' (%s): '%s' is not an unsigned integer",
                       key->name, where, value);
    *number = parsed;
    return MT_OK;
}

/* A byte count: digits with an optional K, M, G or T (powers of 1024; "KiB", "MB" alike). */
static mt_status parse_bytes(const config_key *key, const char *value, const char *where,
                             uint64_t *number)
{
    char *end;
    errno = 0;
    unsigned long long parsed = strtoull(value, &end, 10);
    int shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: break;
    }
    if (shift) {
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'B' || *end == 'b')
            end++;
    }
    if (!isdigit((unsigned char)value[0]) || *end != '\0' || errno == ERANGE ||
        parsed > (UINT64_MAX >> shift))
        return mt_fail(MT_EINVAL, "config key '%s' (%s): '%s' is not a byte count (digits "
                       "with an optional K, M, G or T)", key->name, where, value);
    *number = (uint64_t)parsed << shift;
    return MT_OK;
}

mt_status mt_config_set(mt_config *cfg, const char *name, const char *value, const char *where)
{
    const config_key *key = find_key(name);
    if (!key)
        return mt_fail(MT_EINVAL, "unknown config key '%s' (%s); see --help for the keys", name,
                       where);
    char *field = (char *)cfg + key->offset;
    /* mt_config_defaults clears it again */
    cfg->given[(key - KEYS) / 64] |= 1ull << ((key - KEYS) % 64);
    double number;
    mt_status status;
    switch (key->type) {
    case KEY_INT:
        if ((status = parse_number(key, value, where, &number)))
            return status;
        *(int *)field = (int)number;
        return MT_OK;
    case KEY_SWITCH: {
        static const char *const on[] = {"on", "1", "true", "yes"}, *const off[] = {"off", "0", "false", "no"};
        for (int i = 0; i < 4; i++)
            if (strcmp(value, on[i]) == 0 || strcmp(value, off[i]) == 0) {
                *(int *)field = strcmp(value, on[i]) == 0;
                return MT_OK;
            }
        return mt_fail(MT_EINVAL, "config key '%s' (%s): '%s' is neither on nor off", key->name,
                       where, value);
    }
    case KEY_REAL:
        if ((status = parse_number(key, value, where, &number)))
            return status;
        *(double *)field = number;
        return MT_OK;
    case KEY_U64:
        return parse_u64(key, value, where, (uint64_t *)field);
    case KEY_BYTES:
        return parse_bytes(key, value, where, (uint64_t *)field);
    case KEY_TEXT:
    case KEY_PATH: {
        size_t capacity = key->type == KEY_TEXT ? MT_TEXT_MAX : MT_PATH_MAX;
        if (strlen(value) >= capacity)
            return mt_fail(MT_EINVAL, "config key '%s' (%s): value longer than %zu bytes",
                           key->name, where, capacity - 1);
        /* a path whose default is empty (trace) is optional: empty means none */
        if (key->type == KEY_PATH && value[0] == '\0' && key->default_value[0] != '\0')
            return mt_fail(MT_EINVAL, "config key '%s' (%s): empty path", key->name, where);
        strcpy(field, value);
        return MT_OK;
    }
    }
    return MT_OK;
}

void mt_config_defaults(mt_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < KEY_COUNT; i++)
        mt_config_set(cfg, KEYS[i].name, KEYS[i].default_value, "built-in default");
    memset(cfg->given, 0, sizeof cfg->given);
}

int mt_config_key_count(void) { return KEY_COUNT; }

const char *mt_config_key_name(int index)
{
    return index >= 0 && index < KEY_COUNT ? KEYS[index].name : NULL;
}

int mt_config_given(const mt_config *cfg, const char *name)
{
    const config_key *key = find_key(name);
    return key && (cfg->given[(key - KEYS) / 64] >> ((key - KEYS) % 64) & 1);
}

void mt_config_format(const mt_config *cfg, const char *name, char *out, size_t capacity)
{
    const config_key *key = find_key(name);
    if (!key) {
        snprintf(out, capacity, "%s", "");
        return;
    }
    const char *field = (const char *)cfg + key->offset;
    switch (key->type) {
    case KEY_INT: snprintf(out, capacity, "%d", *(const int *)field); break;
    case KEY_SWITCH: snprintf(out, capacity, "%s", *(const int *)field ? "on" : "off"); break;
    case KEY_REAL: snprintf(out, capacity, "%.17g", *(const double *)field); break;
    case KEY_U64:
    case KEY_BYTES:
        snprintf(out, capacity, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case KEY_TEXT:
    case KEY_PATH: snprintf(out, capacity, "%s", field); break;
    }
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

/* A value in a file is either bare (ends at '#', surrounding spaces dropped) or quoted
 * ("..." with \\, \" and \n escapes), so that any text, '#' and edge spaces included,
 * survives mt_config_write and a reload. */
static mt_status parse_file_value(char *raw, char *value, size_t capacity, const char *where)
{
    char *text = raw;
    while (isspace((unsigned char)*text))
        text++;
    if (*text != '"') {
        char *hash = strchr(text, '#');
        if (hash)
            *hash = '\0';
        snprintf(value, capacity, "%s", trim(text));
        return MT_OK;
    }
    size_t length = 0;
    for (text++; *text && *text != '"'; text++) {
        char c = *text;
        if (c == '\\') {
            c = *++text;
            if (c == 'n')
                c = '\n';
            else if (c != '\\' && c != '"')
                return mt_fail(MT_EINVAL, "%s: unknown escape '\\%c' in a quoted value", where, c);
        }
        if (length + 1 >= capacity)
            return mt_fail(MT_EINVAL, "%s: quoted value too long", where);
        value[length++] = c;
    }
    value[length] = '\0';
    if (*text != '"')
        return mt_fail(MT_EINVAL, "%s: quoted value has no closing '\"'", where);
    char *rest = trim(text + 1);
    if (*rest != '\0' && *rest != '#')
        return mt_fail(MT_EINVAL, "%s: unexpected '%s' after a quoted value", where, rest);
    return MT_OK;
}

mt_status mt_config_load_file(mt_config *cfg, const char *path)
{
    FILE *file = fopen(path, "r");
    if (!file)
        return mt_fail(MT_EIO, "cannot open config file '%s': %s", path, strerror(errno));
    char line[1024], where[MT_PATH_MAX + 32];
    mt_status status = MT_OK;
    for (int number = 1; fgets(line, sizeof line, file); number++) {
        snprintf(where, sizeof where, "%s line %d", path, number);
        if (!strchr(line, '\n') && !feof(file)) {
            status = mt_fail(MT_EINVAL, "%s: line longer than %zu bytes", where, sizeof line - 2);
            break;
        }
        char *text = trim(line);
        if (*text == '\0' || *text == '#')
            continue;
        char *equals = strchr(text, '=');
        if (!equals) {
            status = mt_fail(MT_EINVAL, "%s: expected 'key = value', got '%s'", where, text);
            break;
        }
        *equals = '\0';
        char value[1024];
        if ((status = parse_file_value(equals + 1, value, sizeof value, where)) ||
            (status = mt_config_set(cfg, trim(text), value, where)))
            break;
    }
    fclose(file);
    return status;
}

mt_status mt_config_parse_args(mt_config *cfg, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return mt_fail(MT_EINVAL, "unexpected argument '%s' (keys are given as --key value)",
                           arg);
        char name[64];
        const char *value;
        const char *equals = strchr(arg, '=');
        size_t length = equals ? (size_t)(equals - arg - 2) : strlen(arg + 2);
        if (length >= sizeof name)
            return mt_fail(MT_EINVAL, "unknown config key '%s'", arg + 2);
        memcpy(name, arg + 2, length);
        name[length] = '\0';
        if (equals) {
            value = equals + 1;
        } else {
            if (i + 1 >= argc)
                return mt_fail(MT_EINVAL, "config key '%s' on the command line has no value", name);
            value = argv[++i];
        }
        mt_status status = strcmp(name, "config") == 0
                               ? mt_config_load_file(cfg, value)
                               : mt_config_set(cfg, name, value, "the command line");
        if (status)
            return status;
    }
    return MT_OK;
}

/* Range checks again, for a struct filled by code rather than mt_config_set. */
static mt_status check_ranges(const mt_config *cfg)
{
    for (int i = 0; i < KEY_COUNT; i++) {
        const config_key *key = &KEYS[i];
        const char *field = (const char *)cfg + key->offset;
        double number = key->type == KEY_INT || key->type == KEY_SWITCH ? *(const int *)field
                        : key->type == KEY_REAL ? *(const double *)field
                                                : 0;
        if ((key->type == KEY_INT || key->type == KEY_SWITCH || key->type == KEY_REAL) &&
            !(number >= key->min && number <= key->max))
            return mt_fail(MT_EINVAL, "config key '%s': %g is outside [%g, %g]", key->name, number,
                           key->min, key->max);
    }
    return MT_OK;
}

mt_status mt_config_validate(const mt_config *c)
{
    mt_status status = check_ranges(c);
    if (status)
        return status;
    if (c->width % c->heads)
        return mt_fail(MT_EINVAL, "config keys 'heads' and 'width': heads %d does not divide width %d",
                       c->heads, c->width);
    if (c->batch % c->microbatches)
        return mt_fail(MT_EINVAL,
                       "config keys 'batch' and 'microbatches': batch %d is not a multiple of "
                       "microbatches %d",
                       c->batch, c->microbatches);
    if (c->chunks > 1 && strcmp(c->schedule, "interleaved"))
        return mt_fail(MT_EINVAL, "config keys 'chunks' and 'schedule': %d model chunks per stage "
                                  "need the interleaved schedule, not %s", c->chunks, c->schedule);
    if (strcmp(c->balance, "even") && strcmp(c->balance, "cost"))
        return mt_fail(MT_EINVAL, "config key 'balance': '%s' is neither even nor cost",
                       c->balance);
    if (strcmp(c->optimizer, "adamw") && strcmp(c->optimizer, "sgd"))
        return mt_fail(MT_EINVAL, "config key 'optimizer': '%s' is neither adamw nor sgd",
                       c->optimizer);
    if (strcmp(c->grad_comm, "allreduce") && strcmp(c->grad_comm, "powersgd") &&
        strcmp(c->grad_comm, "signsgd") && strcmp(c->grad_comm, "onebit"))
        return mt_fail(MT_EINVAL, "config key 'grad_comm': '%s' is not allreduce, powersgd, "
                                  "signsgd or onebit", c->grad_comm);
    if (strcmp(c->grad_reduce, "fp32") && strcmp(c->grad_reduce, "bf16"))
        return mt_fail(MT_EINVAL, "config key 'grad_reduce': '%s' is neither fp32 nor bf16",
                       c->grad_reduce);
    /* a hook sends its own compressed form, not the gradient */
    if (strcmp(c->grad_comm, "allreduce") && strcmp(c->grad_reduce, "fp32"))
        return mt_fail(MT_EINVAL, "config keys 'grad_comm' and 'grad_reduce': --grad_comm %s "
                                  "sends its own compressed form of the gradient; leave "
                                  "--grad_reduce at fp32", c->grad_comm);
    if (strcmp(c->grad_comm, "allreduce") && c->zero > 1)
        return mt_fail(MT_EINVAL, "config keys 'grad_comm' and 'zero': --grad_comm %s needs zero "
                                  "0 or 1 (zero %d's reduce-scatter owns the gradient)",
                       c->grad_comm, c->zero);
    if (strcmp(c->grad_comm, "onebit") == 0 && strcmp(c->optimizer, "adamw") == 0)
        return mt_fail(MT_EINVAL, "config keys 'grad_comm' and 'optimizer': --grad_comm onebit "
                                  "needs --optimizer sgd (error feedback on gradients that feed "
                                  "Adam's variance is unsound: the carried error inflates it)");
    /* a hook's carried state (errors, warm-start factors) is in the units of the step it was
     * made in; fp16's loss scale changes those units from step to step */
    if (strcmp(c->grad_comm, "allreduce") && strcmp(c->precision, "fp16") == 0)
        return mt_fail(MT_EINVAL, "config keys 'grad_comm' and 'precision': --grad_comm %s does "
                                  "not run with fp16, whose changing loss scale would mix the "
                                  "scales of the hook's carried error (use bf16)", c->grad_comm);
    if (c->min_lr > c->lr)
        return mt_fail(MT_EINVAL, "config keys 'min_lr' and 'lr': min_lr %g exceeds lr %g", c->min_lr,
                       c->lr);
    if (c->init[0] && c->resume[0] && strcmp(c->resume, "auto") != 0)
        return mt_fail(MT_EINVAL, "config keys 'init' and 'resume': a resumed run's parameters "
                                  "come from the checkpoint '%s'; leave out --init '%s'",
                       c->resume, c->init);
    if (c->top_k > c->vocab)
        return mt_fail(MT_EINVAL, "config keys 'top_k' and 'vocab': top_k %d exceeds vocab %d",
                       c->top_k, c->vocab);
    return MT_OK;
}

static void write_quoted(FILE *out, const char *text)
{
    fputc('"', out);
    for (const char *p = text; *p; p++) {
        if (*p == '\n')
            fputs("\\n", out);
        else {
            if (*p == '"' || *p == '\\')
                fputc('\\', out);
            fputc(*p, out);
        }
    }
    fputs("\"\n", out);
}

void mt_config_write(const mt_config *cfg, FILE *out)
{
    for (int i = 0; i < KEY_COUNT; i++) {
        const config_key *key = &KEYS[i];
        const char *field = (const char *)cfg + key->offset;
        fprintf(out, "%s = ", key->name);
        switch (key->type) {
        case KEY_INT: fprintf(out, "%d\n", *(const int *)field); break;
        case KEY_SWITCH: fprintf(out, "%s\n", *(const int *)field ? "on" : "off"); break;
        case KEY_REAL: fprintf(out, "%.17g\n", *(const double *)field); break;
        case KEY_U64:
        case KEY_BYTES: fprintf(out, "%llu\n", (unsigned long long)*(const uint64_t *)field); break;
        case KEY_TEXT:
        case KEY_PATH: write_quoted(out, field); break;
        }
    }
}

void mt_config_print_help(FILE *out)
{
    for (int i = 0; i < KEY_COUNT; i++)
        fprintf(out, "  --%-14s %-14s %s\n", KEYS[i].name, KEYS[i].default_value, KEYS[i].help);
}
