/* One rank of a parameter-server-shaped job for the launcher's failure policy test: the last
 * rank serves, the others stream sequenced messages to it over a channel set up from the
 * launcher's variables alone; worker `DIE` (argv) kills itself mid-stream in its first life.
 * Usage: channel_rank MESSAGES DIE (DIE -1: none). The server exits 0 when every worker said
 * it is done and every message came exactly once. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshtrain/channel.h"
#include "meshtrain/clock.h"

enum { TAG_DONE = 999, TAG_ACK = 1000 };

static int serve(mt_channel *ch, int workers, int messages)
{
    int *count = calloc((size_t)workers * (size_t)(messages + 2), sizeof *count);
    int *done = calloc((size_t)workers, sizeof *done);
    int finished = 0;
    double end = mt_clock_seconds() + 30;
    while (count && done && finished < workers && mt_clock_seconds() < end) {
        mt_channel_event e;
        if (mt_channel_poll(ch, 0.2, &e)) {
            fprintf(stderr, "server: %s\n", mt_last_error());
            return 1;
        }
        if (e.kind == MT_CHANNEL_MESSAGE && e.seq <= (uint64_t)messages + 1) {
            count[(size_t)e.peer * (size_t)(messages + 2) + e.seq]++;
            if (e.tag == TAG_DONE && !done[e.peer]) {
                done[e.peer] = 1;
                finished++;
                mt_channel_send(ch, e.peer, TAG_ACK, 0, NULL, 0);
            }
        } else if (e.kind == MT_CHANNEL_LOST && !e.left) {
            printf("server: %s\n", e.reason);
        } else if (e.kind == MT_CHANNEL_JOINED && e.incarnation > 0) {
            printf("server: rank %d rejoined as incarnation %u after message %llu\n", e.peer,
                   e.incarnation, (unsigned long long)e.seq);
        }
    }
    int once = finished == workers;
    for (int w = 0; once && w < workers; w++)
        for (int q = 1; q <= messages + 1; q++)
            once &= count[(size_t)w * (size_t)(messages + 2) + q] == 1;
    printf("server: %d of %d workers done; %s\n", finished, workers,
           once ? "every message came exactly once" : "messages missing or repeated");
    free(count);
    free(done);
    return once ? 0 : 1;
}

static int work(mt_channel *ch, int server, int rank, int messages, int die)
{
    const char *life = getenv("MT_INCARNATION");
    int first_life = !life || strcmp(life, "0") == 0;
    double payload[64];
    for (uint64_t seq = mt_channel_resume_seq(ch, server) + 1; seq <= (uint64_t)messages; seq++) {
        for (int i = 0; i < 64; i++)
            payload[i] = (double)rank * 1e6 + (double)seq + i;
        if (mt_channel_send(ch, server, 0, seq, payload, sizeof payload)) {
            fprintf(stderr, "worker %d: %s\n", rank, mt_last_error());
            return 1;
        }
        if (rank == die && first_life && seq == (uint64_t)messages / 2) {
            mt_channel_flush(ch, 5);
            raise(SIGKILL);
        }
        usleep(3000);
    }
    if (mt_channel_send(ch, server, TAG_DONE, (uint64_t)messages + 1, NULL, 0))
        return 1;
    double end = mt_clock_seconds() + 20;
    while (mt_clock_seconds() < end) {
        mt_channel_event e;
        if (mt_channel_poll(ch, 0.2, &e)) {
            fprintf(stderr, "worker %d: %s\n", rank, mt_last_error());
            return 1;
        }
        if (e.kind == MT_CHANNEL_MESSAGE && e.tag == TAG_ACK)
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3 || !getenv("WORLD_SIZE")) {
        fprintf(stderr, "usage: channel_rank MESSAGES DIE (under meshtrain launch)\n");
        return 2;
    }
    int messages = atoi(argv[1]), die = atoi(argv[2]);
    int world = atoi(getenv("WORLD_SIZE"));
    mt_channel_config c = {.workers = world - 1, .servers = 1, .timeout_seconds = 10};
    mt_channel *ch;
    if (mt_channel_open(&c, &ch)) {
        fprintf(stderr, "channel_rank: %s\n", mt_last_error());
        return 1;
    }
    int rank = atoi(getenv("RANK"));
    int status = rank == world - 1 ? serve(ch, world - 1, messages)
                                   : work(ch, world - 1, rank, messages, die);
    mt_channel_close(ch);
    return status;
}
