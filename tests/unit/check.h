/* A minimal test harness: CHECK-style macros that count failures and report where, and a
 * closing line per program. ctest runs each program; a non-zero exit fails the test. */
#ifndef MESHTRAIN_TEST_CHECK_H
#define MESHTRAIN_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_failures, check_count;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        check_count++;                                                                          \
        if (!(cond)) {                                                                          \
            check_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);            \
        }                                                                                       \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                    \
    do {                                                                                        \
        check_count++;                                                                          \
        if (!(cond)) {                                                                          \
            check_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fputc('\n', stderr);                                                                \
        }                                                                                       \
    } while (0)

/* |got - want| <= tol * max(1, |want|) */
#define CHECK_NEAR(got, want, tol)                                                              \
    CHECK_MSG(fabs((double)(got) - (double)(want)) <=                                           \
                  (tol) * (fabs((double)(want)) > 1 ? fabs((double)(want)) : 1.0),              \
              "got %.9g, want %.9g (tol %g)", (double)(got), (double)(want), (double)(tol))

/* Whether `haystack` (NULL: never) holds `needle`: for checking messages. */
static inline int check_contains(const char *haystack, const char *needle)
{
    return haystack && strstr(haystack, needle) != NULL;
}

/* Writes `text` to a new file at `path` (a failure is a failed check). */
static inline void check_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK_MSG(f != NULL, "cannot create %s", path);
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
}

/* Call at the end of main: prints a summary and returns the exit status. */
static inline int check_summary(const char *program)
{
    printf("%s: %d checks, %d failed\n", program, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
