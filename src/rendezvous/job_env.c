/* Reads a worker's rank, world, local rank and master from the variables of meshtrain launch,
 * torchrun, Open MPI, PMI or Slurm, checking every value so that a bad launch fails by name. */
#include "meshtrain/job_env.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct env_reader {
    mt_env_lookup lookup;
    void *context;
} env_reader;

/* NULL for unset and for empty: `export RANK=` in a script must not mean rank 0. */
static const char *env_get(const env_reader *r, const char *name)
{
    const char *v = r->lookup ? r->lookup(name, r->context) : getenv(name);
    return v && *v ? v : NULL;
}

/* A whole decimal integer with an optional sign and nothing else: strtoll alone would accept
 * leading spaces and "4abc" would stop at 4, and a launcher never writes either. */
static mt_status parse_int(const char *name, const char *text, int *out)
{
    const char *p = text + (*text == '+' || *text == '-');
    char *end = NULL;
    errno = 0;
    long long v = isdigit((unsigned char)*p) ? strtoll(text, &end, 10) : 0;
    if (!end || *end)
        return mt_fail(MT_EINVAL, "%s='%s' is not an integer", name, text);
    if (errno == ERANGE || v < INT_MIN || v > INT_MAX)
        return mt_fail(MT_EINVAL, "%s=%s does not fit in an int", name, text);
    *out = (int)v;
    return MT_OK;
}

/* *present 0 (and *out untouched) when the variable is unset. */
static mt_status env_int(const env_reader *r, const char *name, int *present, int *out)
{
    const char *text = env_get(r, name);
    *present = text != NULL;
    return text ? parse_int(name, text, out) : MT_OK;
}

static mt_status check_range(const char *name, int value, int lo, int hi)
{
    if (value < lo || value > hi)
        return mt_fail(MT_EINVAL, "%s=%d is outside %d..%d", name, value, lo, hi);
    return MT_OK;
}

/* Rank `name` must be in 0..size-1; size_label says where size came from ("WORLD_SIZE=4"). */
static mt_status check_index(const char *name, int value, const char *size_label, int size)
{
    if (value < 0 || value >= size)
        return mt_fail(MT_EINVAL, "%s=%d is outside %s", name, value, size_label);
    return MT_OK;
}

/* A rank and world-size pair: both or neither, since a process that knows its rank but not
 * the world (or the reverse) cannot join it. Called when at least one of the two is set. */
static mt_status read_world(const env_reader *r, const char *rank_name, const char *size_name,
                            mt_job_env *e)
{
    const char *rank_text = env_get(r, rank_name), *size_text = env_get(r, size_name);
    if (!rank_text || !size_text)
        return mt_fail(MT_EINVAL, "%s=%s is set but %s is not: a launcher sets both",
                       rank_text ? rank_name : size_name, rank_text ? rank_text : size_text,
                       rank_text ? size_name : rank_name);
    mt_status st;
    if ((st = parse_int(size_name, size_text, &e->world_size)) ||
        (st = parse_int(rank_name, rank_text, &e->rank)) ||
        (st = check_range(size_name, e->world_size, 1, INT_MAX)))
        return st;
    char label[96];
    snprintf(label, sizeof label, "%s=%d", size_name, e->world_size);
    return check_index(rank_name, e->rank, label, e->world_size);
}

/* The local rank, checked against the local size when that is known (size_label names where
 * it came from) and against the world otherwise. */
static mt_status set_local_rank(const char *name, int present, int value, const char *size_label,
                                mt_job_env *e)
{
    if (!present)
        return MT_OK;
    mt_status st;
    if (e->local_world_size > 0) {
        st = check_index(name, value, size_label, e->local_world_size);
    } else {
        char label[64];
        snprintf(label, sizeof label, "0..%d (a world of %d ranks)", e->world_size - 1,
                 e->world_size);
        st = check_index(name, value, label, e->world_size);
    }
    if (!st)
        e->local_rank = value;
    return st;
}

static mt_status set_local_size(const char *name, int value, mt_job_env *e)
{
    if (value < 1 || value > e->world_size)
        return mt_fail(MT_EINVAL, "%s=%d is outside 1..%d (the world size)", name, value,
                       e->world_size);
    e->local_world_size = value;
    return MT_OK;
}

/* Local rank and size from two optional variables. */
static mt_status read_local(const env_reader *r, const char *rank_name, const char *size_name,
                            mt_job_env *e)
{
    int has_rank, has_size, rank = 0, size = 0;
    mt_status st;
    if ((st = env_int(r, rank_name, &has_rank, &rank)) ||
        (st = env_int(r, size_name, &has_size, &size)))
        return st;
    if (has_size && (st = set_local_size(size_name, size, e)))
        return st;
    char label[96];
    snprintf(label, sizeof label, "%s=%d", size_name, size);
    return set_local_rank(rank_name, has_rank, rank, label, e);
}

/* RANK and WORLD_SIZE: meshtrain launch when it says it hosts the store, else torchrun or
 * anything that copies its variables. */
static mt_status detect_rank_vars(const env_reader *r, mt_job_env *e)
{
    mt_status st;
    if ((st = read_world(r, "RANK", "WORLD_SIZE", e)) ||
        (st = read_local(r, "LOCAL_RANK", "LOCAL_WORLD_SIZE", e)))
        return st;
    const char *hosted = env_get(r, "MT_STORE_HOSTED");
    if (hosted && strcmp(hosted, "0") != 0 && strcmp(hosted, "1") != 0)
        return mt_fail(MT_EINVAL, "MT_STORE_HOSTED='%s' is neither 0 nor 1", hosted);
    e->store_hosted = hosted && hosted[0] == '1';
    e->launcher = e->store_hosted ? MT_JOB_MESHTRAIN : MT_JOB_TORCHRUN;
    e->launcher_name = e->store_hosted ? "meshtrain launch" : "torchrun-style variables";
    return MT_OK;
}

static mt_status detect_pmi(const env_reader *r, mt_job_env *e)
{
    mt_status st = read_world(r, "PMI_RANK", "PMI_SIZE", e);
    if (st)
        return st;
    /* Hydra (MPICH's mpiexec) names the local rank MPI_LOCALRANKID; other PMI launchers
     * (Intel MPI's, some PMIx shims) use PMI_LOCAL_*. Each variable falls back on its own. */
    const char *rank_name = env_get(r, "MPI_LOCALRANKID") ? "MPI_LOCALRANKID" : "PMI_LOCAL_RANK";
    const char *size_name = env_get(r, "MPI_LOCALNRANKS") ? "MPI_LOCALNRANKS" : "PMI_LOCAL_SIZE";
    if ((st = read_local(r, rank_name, size_name, e)))
        return st;
    e->launcher = MT_JOB_PMI;
    e->launcher_name = "PMI (MPICH)";
    return MT_OK;
}

static mt_status detect_openmpi(const env_reader *r, mt_job_env *e)
{
    mt_status st;
    if ((st = read_world(r, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", e)) ||
        (st = read_local(r, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", e)))
        return st;
    e->launcher = MT_JOB_OPENMPI;
    e->launcher_name = "Open MPI";
    return MT_OK;
}

/* Reads a run of digits at *p as a positive int, advancing *p; 0 when there is none or it
 * does not fit (neither is a task count). */
static int take_count(const char **p)
{
    long long v = 0;
    const char *s = *p;
    while (isdigit((unsigned char)*s) && v <= INT_MAX)
        v = v * 10 + (*s++ - '0');
    *p = s;
    return v >= 1 && v <= INT_MAX ? (int)v : 0;
}

/* The tasks on node `node` (-1: not known) of a Slurm tasks-per-node list such as "2(x3),1"
 * (three nodes with 2 tasks, then one with 1). Without the node index only a list where every
 * node has the same count answers; *out is -1 otherwise. */
static mt_status tasks_on_node(const char *name, const char *text, int node, int *out)
{
    long long nodes = 0;
    int found = -1, same = -1;
    const char *p = text;
    for (;;) {
        int count = take_count(&p), repeat = 1;
        if (count && *p == '(') {
            p++;
            repeat = *p == 'x' ? (p++, take_count(&p)) : 0;
            if (repeat && *p == ')')
                p++;
            else
                count = 0;
        }
        if (!count || (*p && *p != ','))
            return mt_fail(MT_EINVAL, "%s='%s' is malformed (want counts like 2(x3),1)", name,
                           text);
        if (node >= nodes && node < nodes + repeat)
            found = count;
        same = same == -1 || same == count ? count : 0;
        nodes += repeat;
        if (!*p++)
            break;
    }
    if (node >= 0 && found < 0)
        return mt_fail(MT_EINVAL, "SLURM_NODEID=%d is outside the %lld nodes of %s='%s'", node,
                       nodes, name, text);
    *out = node >= 0 ? found : same > 0 ? same : -1;
    return MT_OK;
}

/* The local size under srun, and a label saying where it came from for messages. The step's
 * list comes first: a step may use fewer tasks per node than the allocation, and SLURM_NODEID
 * (which picks the entry) is this node's index within the step. */
static mt_status slurm_local_size(const env_reader *r, mt_job_env *e, char *label, size_t cap)
{
    static const char *const LISTS[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    mt_status st;
    for (size_t i = 0; i < sizeof LISTS / sizeof LISTS[0]; i++) {
        const char *text = env_get(r, LISTS[i]);
        if (!text)
            continue;
        int has_node, node = -1, size = 0;
        if ((st = env_int(r, "SLURM_NODEID", &has_node, &node)) ||
            (has_node && (st = check_range("SLURM_NODEID", node, 0, INT_MAX))) ||
            (st = tasks_on_node(LISTS[i], text, node, &size)))
            return st;
        snprintf(label, cap, "%s='%s' (%d tasks on this node)", LISTS[i], text, size);
        return size > 0 ? set_local_size(LISTS[i], size, e) : MT_OK;
    }
    int has_size, size = 0;
    if ((st = env_int(r, "SLURM_NTASKS_PER_NODE", &has_size, &size)))
        return st;
    snprintf(label, cap, "SLURM_NTASKS_PER_NODE=%d", has_size ? size : 0);
    return has_size ? set_local_size("SLURM_NTASKS_PER_NODE", size, e) : MT_OK;
}

static mt_status detect_slurm(const env_reader *r, mt_job_env *e)
{
    char label[160];
    int has_rank, rank = 0;
    mt_status st;
    if ((st = read_world(r, "SLURM_PROCID", "SLURM_NTASKS", e)) ||
        (st = slurm_local_size(r, e, label, sizeof label)) ||
        (st = env_int(r, "SLURM_LOCALID", &has_rank, &rank)) ||
        (st = set_local_rank("SLURM_LOCALID", has_rank, rank, label, e)))
        return st;
    e->launcher = MT_JOB_SLURM;
    e->launcher_name = "Slurm";
    return MT_OK;
}

/* The master where no MASTER_ADDR or MASTER_PORT says. Host: task 0 runs on the first node of
 * its step, so the step's list comes before the job's (a step on part of the allocation need
 * not include the job's first node). Port: a function of the job id alone, so every task of
 * the job agrees without exchanging anything, and 10000 ports make collisions between jobs
 * sharing a node rare (two concurrent steps of one job would still collide: they set
 * MASTER_PORT). */
static mt_status slurm_master(const env_reader *r, mt_job_env *e)
{
    static const char *const LISTS[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                                        "SLURM_NODELIST"};
    for (size_t i = 0; !e->master_host[0] && i < sizeof LISTS / sizeof LISTS[0]; i++) {
        const char *list = env_get(r, LISTS[i]);
        mt_status st = list ? mt_slurm_first_host(list, e->master_host, sizeof e->master_host)
                            : MT_OK;
        if (st)
            return mt_fail_context(st, "%s", LISTS[i]);
    }
    if (e->master_port == 0) {
        const char *name = env_get(r, "SLURM_JOB_ID") ? "SLURM_JOB_ID" : "SLURM_JOBID";
        const char *id = env_get(r, name);
        if (id) {
            /* Job ids are 32-bit unsigned and would not fit an int: read digits directly. */
            unsigned long long v = 0;
            const char *p = id;
            while (isdigit((unsigned char)*p) && v < 1000000000000ULL)
                v = v * 10 + (unsigned)(*p++ - '0');
            if (*p)
                return mt_fail(MT_EINVAL, "%s='%s' is not a job number", name, id);
            e->master_port = 20000 + (int)(v % 10000);
        }
    }
    return MT_OK;
}

static mt_status read_master(const env_reader *r, mt_job_env *e)
{
    const char *host = env_get(r, "MASTER_ADDR");
    if (host) {
        size_t n = strlen(host);
        if (n >= sizeof e->master_host)
            return mt_fail(MT_EINVAL, "MASTER_ADDR is %zu characters long; at most %d fit", n,
                           MT_JOB_HOST_MAX - 1);
        memcpy(e->master_host, host, n + 1);
    }
    int has_port, port = 0;
    mt_status st = env_int(r, "MASTER_PORT", &has_port, &port);
    if (!st && has_port && !(st = check_range("MASTER_PORT", port, 1, 65535)))
        e->master_port = port;
    return st;
}

static mt_status read_restart_count(const env_reader *r, mt_job_env *e)
{
    const char *name =
        env_get(r, "MT_RESTART_COUNT") ? "MT_RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT";
    int present, count = 0;
    mt_status st = env_int(r, name, &present, &count);
    if (!st && present && !(st = check_range(name, count, 0, INT_MAX)))
        e->restart_count = count;
    return st;
}

/* Read under every launcher: meshtrain launch inside an sbatch allocation runs its ranks within
 * the one task's CPUs, so the bound holds for them too. */
static mt_status read_cpus_per_task(const env_reader *r, mt_job_env *e)
{
    int present, cpus = 0;
    mt_status st = env_int(r, "SLURM_CPUS_PER_TASK", &present, &cpus);
    if (!st && present && !(st = check_range("SLURM_CPUS_PER_TASK", cpus, 1, INT_MAX)))
        e->cpus_per_task = cpus;
    return st;
}

mt_status mt_job_env_detect(mt_env_lookup lookup, void *context, mt_job_env *out)
{
    if (!out)
        return mt_fail(MT_EINVAL, "mt_job_env_detect: out is NULL");
    env_reader r = {lookup, context};
    mt_job_env e = {.launcher = MT_JOB_NONE, .launcher_name = "none", .local_rank = -1,
                    .local_world_size = -1};
    mt_status st;
    if (env_get(&r, "RANK") || env_get(&r, "WORLD_SIZE")) {
        st = detect_rank_vars(&r, &e);
    } else if (env_get(&r, "MT_STORE_HOSTED")) {
        /* Only meshtrain launch sets it, always with RANK: alone it is a half-copied
         * environment, and guessing a single process would leave the launcher's store waiting. */
        st = mt_fail(MT_EINVAL, "MT_STORE_HOSTED=%s is set but RANK and WORLD_SIZE are not: "
                                "meshtrain launch sets all three",
                     env_get(&r, "MT_STORE_HOSTED"));
    } else if (env_get(&r, "OMPI_COMM_WORLD_RANK") || env_get(&r, "OMPI_COMM_WORLD_SIZE")) {
        st = detect_openmpi(&r, &e);
    } else if (env_get(&r, "PMI_RANK") || env_get(&r, "PMI_SIZE")) {
        st = detect_pmi(&r, &e);
    } else if (env_get(&r, "SLURM_PROCID")) {
        /* Only SLURM_PROCID says srun started this task: an salloc shell sets SLURM_NTASKS
         * too, and a program run there directly is a single process. */
        st = detect_slurm(&r, &e);
    } else {
        e.world_size = e.local_world_size = 1;
        e.local_rank = 0;
        st = MT_OK;
    }
    if (st || (st = read_master(&r, &e)) || (st = read_restart_count(&r, &e)) ||
        (st = read_cpus_per_task(&r, &e)))
        return st;
    if (e.launcher == MT_JOB_SLURM && (st = slurm_master(&r, &e)))
        return st;
    /* meshtrain launch hosts the store and passes its port; without it nobody can reach it. */
    if (e.launcher == MT_JOB_MESHTRAIN && e.master_port == 0)
        return mt_fail(MT_EINVAL, "MT_STORE_HOSTED=1 is set but MASTER_PORT is not: the port of "
                                  "the launcher's store is unknown");
    *out = e;
    return MT_OK;
}

/* ---- Slurm node lists ---- */

static int host_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_';
}

/* Compares two digit strings as numbers of any length (leading zeros do not count). */
static int compare_digits(const char *a, size_t na, const char *b, size_t nb)
{
    while (na > 1 && *a == '0')
        a++, na--;
    while (nb > 1 && *b == '0')
        b++, nb--;
    if (na != nb)
        return na < nb ? -1 : 1;
    return memcmp(a, b, na);
}

/* Checks the inside of one bracket group, "01-04,07" (numbers or lo-hi ranges, lo <= hi),
 * and gives the length of its first number, the one the first host uses. */
static mt_status check_ranges(const char *list, const char *group, const char *end,
                              size_t *first)
{
    const char *p = group;
    for (;;) {
        const char *lo = p;
        while (p < end && isdigit((unsigned char)*p))
            p++;
        size_t nlo = (size_t)(p - lo);
        if (lo == group)
            *first = nlo;
        if (nlo && p < end && *p == '-') {
            const char *hi = ++p;
            while (p < end && isdigit((unsigned char)*p))
                p++;
            size_t nhi = (size_t)(p - hi);
            if (nhi && compare_digits(lo, nlo, hi, nhi) > 0)
                return mt_fail(MT_EINVAL, "Slurm node list '%s': range %.*s runs backwards", list,
                               (int)(p - lo), lo);
            nlo = nhi; /* a range with no upper end is malformed like an empty number */
        }
        if (!nlo || (p < end && *p != ','))
            return mt_fail(MT_EINVAL,
                           "Slurm node list '%s': brackets must hold numbers and ranges like "
                           "[01-04,07], not [%.*s]",
                           list, (int)(end - group), group);
        if (p == end)
            return MT_OK;
        p++;
    }
}

mt_status mt_slurm_first_host(const char *nodelist, char *out, size_t capacity)
{
    if (!out || capacity == 0)
        return mt_fail(MT_EINVAL, "mt_slurm_first_host: out is NULL or capacity is 0");
    out[0] = '\0';
    if (!nodelist || !*nodelist)
        return mt_fail(MT_EINVAL, "the Slurm node list is empty");
    size_t n = 0, host_len = 0; /* host_len: characters of the current host so far */
    int first = 1;
    for (const char *p = nodelist; *p;) {
        const char *piece = p;
        size_t piece_len = 1;
        if (*p == ',') {
            if (!host_len)
                return mt_fail(MT_EINVAL, "Slurm node list '%s' has an empty host name at "
                                          "offset %td", nodelist, p - nodelist);
            first = 0;
            host_len = 0;
            p++;
            continue;
        }
        if (*p == '[') {
            const char *close = strpbrk(p + 1, "[]");
            if (!close || *close == '[')
                return mt_fail(MT_EINVAL, "Slurm node list '%s': the '[' at offset %td is %s",
                               nodelist, p - nodelist, close ? "nested" : "never closed");
            mt_status st = check_ranges(nodelist, p + 1, close, &piece_len);
            if (st)
                return st;
            piece = p + 1;
            p = close + 1;
        } else if (*p == ']') {
            return mt_fail(MT_EINVAL, "Slurm node list '%s': the ']' at offset %td has no '['",
                           nodelist, p - nodelist);
        } else if (!host_char(*p)) {
            return mt_fail(MT_EINVAL, "Slurm node list '%s': byte 0x%02x at offset %td cannot be "
                                      "in a host name",
                           nodelist, (unsigned)(unsigned char)*p, p - nodelist);
        } else {
            p++;
        }
        host_len++;
        if (!first)
            continue;
        if (n + piece_len >= capacity)
            return mt_fail(MT_EINVAL, "the first host of Slurm node list '%s' is longer than "
                                      "%zu characters", nodelist, capacity - 1);
        memcpy(out + n, piece, piece_len);
        n += piece_len;
        out[n] = '\0';
    }
    if (!host_len)
        return mt_fail(MT_EINVAL, "Slurm node list '%s' ends in a comma", nodelist);
    return MT_OK;
}
