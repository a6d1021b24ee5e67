/* `meshtrain ckpt inspect` (what a checkpoint holds, every checksum verified) and `meshtrain
 * export` (a checkpoint's model as a GPT-2 safetensors file): the tools around checkpoints. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "meshtrain/checkpoint.h"

static const char CKPT_USAGE[] =
    "usage: meshtrain ckpt inspect DIR\n"
    "\n"
    "Prints what a checkpoint holds: its step, the layout that wrote it, the run's config and\n"
    "every tensor with its shape and the boxes of it that each shard file holds (parameters and\n"
    "both Adam moments), then reads every piece and verifies its checksum. DIR is a step_<N>\n"
    "folder, or a run's OUT or OUT/ckpt folder (its newest checkpoint). Exit status 1 when\n"
    "anything is damaged.\n";

static const char EXPORT_USAGE[] =
    "usage: meshtrain export --ckpt DIR --out FILE.safetensors [--dtype f32|bf16|f16]\n"
    "\n"
    "Writes the model of a checkpoint (any layout) as one safetensors file with Hugging Face\n"
    "GPT-2's tensor names and orientation (wte.weight, h.0.attn.c_attn.weight as (in, out),\n"
    "...), with GPT-2's config in its metadata (n_embd, n_head, n_layer, n_positions,\n"
    "vocab_size). DIR is a step_<N> folder, or a run's OUT or OUT/ckpt folder (its newest\n"
    "checkpoint). --dtype: f32 (default: the checkpoint's fp32 values as they are), bf16 or\n"
    "f16 (each value rounded to nearest even, NaN kept, beyond the range infinity).\n"
    "`meshtrain train --init FILE` starts training from such a file, of any of the three.\n";

__attribute__((format(printf, 3, 4))) static int usage_error(const char *command,
                                                             const char *usage,
                                                             const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "meshtrain %s: error: ", command);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n\n%s", usage);
    return 2;
}

static void print_layout(const mt_ckpt_meta *meta)
{
    const mt_ckpt_layout *l = &meta->layout;
    printf("step %d, %lld sequences trained; written by %d rank%s: dp %d x pp %d x tp %d, sp %s, "
           "zero %d\n", meta->step, meta->sequences, l->world, l->world == 1 ? "" : "s", l->dp,
           l->pp, l->tp, l->sp ? "on" : "off", l->zero);
    const mt_ckpt_training *t = &meta->training;
    printf("training: %d optimizer steps applied, data cursor at batch %lld, %d batch%s left out "
           "by rollbacks, %d overflow skips, %d spike skips, %d rollbacks", t->applied, t->cursor,
           t->skipped_count, t->skipped_count == 1 ? "" : "es", t->overflow_skips, t->spike.skips,
           t->spike.rollbacks);
    if (t->scaler.scale > 0)
        printf(", loss scale %g", t->scaler.scale);
    printf("\nconfig:");
    for (int i = 0; i < meta->config_count; i++)
        printf("%s %s = %s", i % 6 ? "," : "\n ", meta->config_keys[i], meta->config_values[i]);
    putchar('\n');
}

/* Every tensor, its shape, and per state the pieces as "rank<R> <box>". */
static void print_tensors(const mt_ckpt_meta *meta)
{
    size_t values = 0;
    mt_ckpt_box whole;
    for (int t = 0; t < meta->tensor_count; t++) {
        mt_ckpt_tensor_view(&meta->tensors[t], NULL, &whole);
        values += mt_ckpt_box_volume(&whole);
    }
    printf("tensors: %d, %zu parameters; %d pieces in %d shard files\n", meta->tensor_count,
           values, meta->piece_count, meta->file_count);
    for (int t = 0; t < meta->tensor_count; t++) {
        const mt_ckpt_tensor *tensor = &meta->tensors[t];
        mt_ckpt_tensor_view(tensor, NULL, &whole);
        char box[128];
        mt_ckpt_box_format(&whole, box, sizeof box);
        printf("  %s %s\n", tensor->name, box);
        for (int s = 0; s < MT_CKPT_STATES; s++) {
            printf("    %-10s", mt_ckpt_state_name((mt_ckpt_state)s));
            for (int i = 0; i < meta->piece_count; i++) {
                const mt_ckpt_piece *p = &meta->pieces[i];
                if (p->tensor != t || p->state != (mt_ckpt_state)s)
                    continue;
                mt_ckpt_box_format(&p->box, box, sizeof box);
                printf(" rank%d %s", meta->files[p->file].rank, box);
            }
            putchar('\n');
        }
    }
}

/* Reads every piece; prints each failure (a damaged shard once) and returns how many failed. */
static int verify_pieces(const mt_ckpt_meta *meta, unsigned long long *bytes)
{
    mt_ckpt_reader reader;
    if (mt_ckpt_reader_open(&reader, meta))
        return meta->piece_count ? meta->piece_count : 1;
    char *file_failed = calloc((size_t)meta->file_count + 1, 1);
    int failed = 0;
    *bytes = 0;
    for (int i = 0; i < meta->piece_count; i++) {
        const mt_ckpt_piece *p = &meta->pieces[i];
        const float *data;
        if (file_failed && file_failed[p->file]) {
            failed++;
            continue;
        }
        if (mt_ckpt_reader_piece(&reader, i, &data) == MT_OK) {
            *bytes += p->bytes;
            continue;
        }
        failed++;
        printf("  DAMAGED: %s\n", mt_last_error());
        if (file_failed && reader.fds[p->file] < 0)
            file_failed[p->file] = 1; /* the shard itself: its other pieces are not read */
    }
    free(file_failed);
    mt_ckpt_reader_close(&reader);
    return failed;
}

static int inspect(int argc, char **argv)
{
    if (argc >= 1 && cli_is_help(argv[0])) {
        fputs(CKPT_USAGE, stdout);
        return 0;
    }
    if (argc != 1 || argv[0][0] == '-')
        return usage_error("ckpt", CKPT_USAGE, "inspect takes one checkpoint folder");
    char dir[MT_PATH_MAX + 300];
    mt_ckpt_meta meta;
    if (mt_ckpt_locate(argv[0], dir, sizeof dir) || mt_ckpt_meta_read(dir, &meta))
        return cli_report_error("ckpt");
    printf("checkpoint '%s' (format version %d)\n", dir, MT_CKPT_VERSION);
    print_layout(&meta);
    print_tensors(&meta);
    unsigned long long bytes = 0;
    int failed = verify_pieces(&meta, &bytes);
    if (failed)
        printf("FAILED: %d of %d pieces are damaged or unreadable\n", failed, meta.piece_count);
    else
        printf("verified: %d pieces (%.1f MB) in %d shard files, every checksum matches\n",
               meta.piece_count, (double)bytes / 1e6, meta.file_count);
    mt_ckpt_meta_free(&meta);
    return failed ? 1 : 0;
}

int cli_ckpt(int argc, char **argv)
{
    if (argc < 1 || cli_is_help(argv[0])) {
        fputs(CKPT_USAGE, argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    if (strcmp(argv[0], "inspect") == 0)
        return inspect(argc - 1, argv + 1);
    return usage_error("ckpt", CKPT_USAGE, "unknown action '%s' (expected inspect)", argv[0]);
}

int cli_export(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *dtype_name = "f32";
    for (int i = 0; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(EXPORT_USAGE, stdout);
            return 0;
        }
        const char **slot = strcmp(argv[i], "--ckpt") == 0  ? &ckpt
                            : strcmp(argv[i], "--out") == 0 ? &out
                            : strcmp(argv[i], "--dtype") == 0 ? &dtype_name
                                                              : NULL;
        if (!slot)
            return usage_error("export", EXPORT_USAGE, "unknown argument '%s'", argv[i]);
        if (i + 1 >= argc)
            return usage_error("export", EXPORT_USAGE, "%s needs a value", argv[i]);
        *slot = argv[++i];
    }
    if (!ckpt || !out)
        return usage_error("export", EXPORT_USAGE, "export needs --ckpt DIR and --out FILE");
    mt_safetensors_dtype dtype = strcmp(dtype_name, "f32") == 0    ? MT_SAFETENSORS_F32
                                 : strcmp(dtype_name, "bf16") == 0 ? MT_SAFETENSORS_BF16
                                 : strcmp(dtype_name, "f16") == 0  ? MT_SAFETENSORS_F16
                                                                   : MT_SAFETENSORS_BOOL;
    if (dtype == MT_SAFETENSORS_BOOL)
        return usage_error("export", EXPORT_USAGE, "--dtype '%s': expected f32, bf16 or f16",
                           dtype_name);
    char dir[MT_PATH_MAX + 300];
    mt_ckpt_meta meta;
    if (mt_ckpt_locate(ckpt, dir, sizeof dir) || mt_ckpt_meta_read(dir, &meta))
        return cli_report_error("export");
    int tensors;
    size_t values;
    mt_status status = mt_ckpt_export_safetensors(&meta, out, dtype, &tensors, &values);
    if (status == MT_OK)
        printf("meshtrain export: wrote '%s': %d tensors, %zu parameters (GPT-2 names, %s), "
               "step %d of '%s'\n", out, tensors, values, mt_safetensors_dtype_name(dtype),
               meta.step, dir);
    mt_ckpt_meta_free(&meta);
    return status ? cli_report_error("export") : 0;
}
