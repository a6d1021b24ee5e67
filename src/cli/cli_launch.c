/* `meshtrain launch ... -- COMMAND`: parses the launcher's options (and the secret's source),
 * runs mt_launch, and turns a failed job into its message and exit status 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_log.h"
#include "meshtrain/launch.h"

static const char USAGE[] =
    "usage: meshtrain launch --nproc-per-node N [--nnodes [MIN:]M --node-rank I --master HOST:PORT]\n"
    "                        [--max-restarts K] [--secret-file FILE] [options] -- COMMAND...\n"
    "\n"
    "Starts N workers running COMMAND with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
    "MASTER_ADDR, MASTER_PORT and the job's secret (MT_JOB_SECRET) in their environment, hosts\n"
    "the job's store (node 0), prefixes each output line with the rank, and forwards SIGINT and\n"
    "SIGTERM. When a worker fails, every worker of the job is stopped within seconds and the\n"
    "failure is reported (rank, host, pid, exit code or signal) with an analysis of the\n"
    "workers' flight recorder dumps; SIGUSR1 to the launcher prints that analysis live.\n"
    "\n"
    "  --nproc-per-node N   workers on this node\n"
    "  --nnodes M           nodes in the job (default 1); each runs one launcher\n"
    "  --nnodes MIN:M       elastic: an attempt starts on the nodes that meet for it, at least\n"
    "                       MIN, ranks renumbered densely; a restart goes on without a lost\n"
    "                       node (the program resumes on the smaller world); a node that\n"
    "                       comes late waits, and the job takes it in at its next\n"
    "                       checkpoint (a growth: no restart used)\n"
    "  --last-call SECONDS  elastic: once MIN nodes are in, how long the others get unless\n"
    "                       known to have left (default 30)\n"
    "  --node-rank I        this node's index, 0..M-1 (node 0 hosts the store)\n"
    "  --standby            elastic, on every node: node 1 hosts a standby of the store that\n"
    "                       takes over if node 0 is lost (a node 0 cut off, not dead, goes on\n"
    "                       too: for jobs where losing the way to node 0 means losing it)\n"
    "  --master HOST:PORT   where node 0's store listens (several nodes: required; one node:\n"
    "                       default 127.0.0.1 and a free port). Nothing listens beyond\n"
    "                       loopback unless this names another address.\n"
    "  --secret-file FILE   the job's secret, shared by every node's launcher (mode 600);\n"
    "                       else MT_JOB_SECRET or MT_JOB_SECRET_FILE; one node makes its own\n"
    "  --max-restarts K     restart the whole job up to K times after a failure (default 0)\n"
    "  --ps-servers S       the last S ranks are parameter servers, the others workers (default 0)\n"
    "  --ps-mode MODE       sync (default): any death fails the job; ssp or async: a worker's\n"
    "                       death is logged and the job goes on (under --max-restarts that\n"
    "                       rank starts again alone, MT_INCARNATION one higher); a server's\n"
    "                       death fails the job\n"
    "  --grace SECONDS      after a failure, before SIGTERM (then SIGKILL 2 s later; default 3)\n"
    "  --join-timeout SECONDS  launchers waiting for each other (default 300)\n"
    "  --dump-dir DIR       flight recorder dumps (default: a temporary folder, kept on failure);\n"
    "                       a folder of yours that no one else may write to, not a symbolic\n"
    "                       link (made, mode 700, when missing); only rank<R>.flight and\n"
    "                       rank<R>.armed files are ever removed from it\n"
    "  --log-dir DIR        write DIR/launcher.log: its start, what it reports (failures,\n"
    "                       restarts) and its end, timestamped (meshtrain train's ranks log\n"
    "                       to OUT/logs/rank<R>.log: give OUT/logs to keep them together)\n"
    "  --bind-to-core       pin local rank r to the r-th allowed CPU when there are enough\n"
    "  --no-prefix          leave the workers' output as it is\n";

static int parse_seconds(const char *flag, const char *text, double *out)
{
    char *end;
    double v = strtod(text, &end);
    if (!*text || *end || !(v >= 0) || v > 1e6) {
        fprintf(stderr, "meshtrain launch: error: %s '%s' is not a number of seconds\n", flag,
                text);
        return 0;
    }
    *out = v;
    return 1;
}

/* "M" or "MIN:M" into the options' node counts. */
static int parse_nnodes(const char *text, mt_launch_options *o)
{
    const char *colon = strchr(text, ':');
    o->min_nnodes = 0;
    if (!colon)
        return cli_parse_int("launch", "--nnodes", text, 1, 65536, &o->nnodes);
    char least[16];
    if ((size_t)(colon - text) >= sizeof least) {
        fprintf(stderr, "meshtrain launch: error: --nnodes '%s' is not M or MIN:M\n", text);
        return 0;
    }
    snprintf(least, sizeof least, "%.*s", (int)(colon - text), text);
    if (!cli_parse_int("launch", "--nnodes MIN", least, 1, 65536, &o->min_nnodes) ||
        !cli_parse_int("launch", "--nnodes M", colon + 1, 1, 65536, &o->nnodes))
        return 0;
    if (o->min_nnodes > o->nnodes) {
        fprintf(stderr, "meshtrain launch: error: --nnodes %s: MIN %d is above M %d\n", text,
                o->min_nnodes, o->nnodes);
        return 0;
    }
    return 1;
}

/* "host:port" into its halves (the host may not be empty). */
static int parse_master(const char *text, char *host, size_t capacity, int *port)
{
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text || (size_t)(colon - text) >= capacity) {
        fprintf(stderr, "meshtrain launch: error: --master '%s' is not HOST:PORT\n", text);
        return 0;
    }
    snprintf(host, capacity, "%.*s", (int)(colon - text), text);
    return cli_parse_int("launch", "--master port", colon + 1, 1, 65535, port);
}

int cli_launch(int argc, char **argv)
{
    mt_launch_options o = {.grace_seconds = 3.0, .prefix_output = 1, .last_call_seconds = -1};
    static char master_host[256];
    const char *secret_file = NULL, *log_dir = NULL;
    int i = 0;
    for (; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--") == 0) {
            i++;
            break;
        }
        if (cli_is_help(flag)) {
            fputs(USAGE, stdout);
            return 0;
        }
        int takes_value = strcmp(flag, "--bind-to-core") != 0 && strcmp(flag, "--no-prefix") != 0 &&
                          strcmp(flag, "--standby") != 0;
        if (takes_value && i + 1 >= argc) {
            fprintf(stderr, "meshtrain launch: error: %s needs a value\n\n%s", flag, USAGE);
            return 2;
        }
        const char *value = takes_value ? argv[++i] : NULL;
        int ok = 1;
        if (strcmp(flag, "--nproc-per-node") == 0)
            ok = cli_parse_int("launch", flag, value, 1, 4096, &o.nproc);
        else if (strcmp(flag, "--nnodes") == 0)
            ok = parse_nnodes(value, &o);
        else if (strcmp(flag, "--last-call") == 0)
            ok = parse_seconds(flag, value, &o.last_call_seconds);
        else if (strcmp(flag, "--node-rank") == 0)
            ok = cli_parse_int("launch", flag, value, 0, 65535, &o.node_rank);
        else if (strcmp(flag, "--master") == 0) {
            ok = parse_master(value, master_host, sizeof master_host, &o.master_port);
            o.master_host = master_host;
        } else if (strcmp(flag, "--max-restarts") == 0)
            ok = cli_parse_int("launch", flag, value, 0, 1000, &o.max_restarts);
        else if (strcmp(flag, "--ps-servers") == 0)
            ok = cli_parse_int("launch", flag, value, 0, 1 << 20, &o.ps_servers);
        else if (strcmp(flag, "--ps-mode") == 0)
            o.ps_mode = value;
        else if (strcmp(flag, "--grace") == 0)
            ok = parse_seconds(flag, value, &o.grace_seconds);
        else if (strcmp(flag, "--join-timeout") == 0)
            ok = parse_seconds(flag, value, &o.join_timeout);
        else if (strcmp(flag, "--secret-file") == 0)
            secret_file = value;
        else if (strcmp(flag, "--dump-dir") == 0)
            o.dump_dir = value;
        else if (strcmp(flag, "--log-dir") == 0)
            log_dir = value;
        else if (strcmp(flag, "--bind-to-core") == 0)
            o.bind_to_core = 1;
        else if (strcmp(flag, "--no-prefix") == 0)
            o.prefix_output = 0;
        else if (strcmp(flag, "--standby") == 0)
            o.standby = 1;
        else {
            fprintf(stderr, "meshtrain launch: error: unknown option '%s'\n\n%s", flag, USAGE);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (o.nproc < 1 || i >= argc) {
        fprintf(stderr, "meshtrain launch: error: %s\n\n%s",
                o.nproc < 1 ? "--nproc-per-node is required" : "no command after --", USAGE);
        return 2;
    }
    mt_store_secret secret;
    int found = 0;
    mt_status st = secret_file ? mt_store_secret_from_file(secret_file, &secret)
                               : mt_store_secret_from_env(&secret, &found);
    if (st)
        return cli_report_error("launch");
    o.secret = secret_file || found ? &secret : NULL;
    FILE *log = log_dir ? cli_log_open(log_dir, "launcher") : NULL;
    o.report = cli_log_tee(log, stderr);
    cli_log_line(log, "start: node %d of %d, %d workers: %s", o.node_rank,
                 o.nnodes > 1 ? o.nnodes : 1, o.nproc, argv[i]);
    mt_launch_result result;
    st = mt_launch(&o, argv + i, &result);
    memset(&secret, 0, sizeof secret);
    int status = st ? cli_log_error(log, "launch") : 0;
    cli_log_line(log, "stop: %s", status ? "failed" : "ok");
    if (o.report != stderr)
        fclose(o.report);
    if (log)
        fclose(log);
    return status;
}

int cli_relaunch_locally(const mt_launch_options *options, const char *command,
                         const char *const *words, int n_words, int argc, char **argv)
{
    char self[4096];
    if (!cli_self_path(command, self, sizeof self))
        return 1;
    char **child = calloc((size_t)(1 + n_words + argc + 1), sizeof *child);
    if (!child)
        return 1;
    child[0] = self;
    for (int i = 0; i < n_words; i++)
        child[1 + i] = (char *)words[i];
    for (int i = 0; i < argc; i++)
        child[1 + n_words + i] = argv[i];
    mt_launch_result result;
    mt_status st = mt_launch(options, child, &result);
    free(child);
    return st ? cli_report_error(command) : 0;
}
