/* The memory ledger (bytes per kind, now and at peak) and the resident-set cross-check read
 * from /proc/self/status. */
#include "meshtrain/memory.h"

#include <stdio.h>
#include <string.h>

void mt_memory_count(mt_memory_ledger *ledger, mt_memory_kind kind, long long delta)
{
    if (!ledger || kind >= MT_MEMORY_KINDS)
        return;
    ledger->bytes[kind] = (size_t)((long long)ledger->bytes[kind] + delta);
    ledger->total = (size_t)((long long)ledger->total + delta);
    if (ledger->bytes[kind] > ledger->peak[kind])
        ledger->peak[kind] = ledger->bytes[kind];
    if (ledger->total > ledger->total_peak)
        ledger->total_peak = ledger->total;
}

const char *mt_memory_kind_name(mt_memory_kind kind)
{
    static const char *names[MT_MEMORY_KINDS] = {"parameters", "gradients", "optimizer",
                                                 "activations", "comm", "offload"};
    return kind < MT_MEMORY_KINDS ? names[kind] : "?";
}

void mt_memory_resident(size_t *now, size_t *peak)
{
    *now = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "VmRSS: %llu kB", &kib) == 1)
            *now = (size_t)kib * 1024;
        else if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            *peak = (size_t)kib * 1024;
    }
    fclose(f);
}
