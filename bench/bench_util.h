/* Shared benchmark plumbing: timing with medians, and the result line format
 * every gser benchmark prints (a table, or with --json one object per line:
 * name, value, unit, anchor, anchor_value, ratio = value / anchor_value,
 * target = a condition on ratio). */
#ifndef GSER_BENCH_UTIL_H
#define GSER_BENCH_UTIL_H


#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median over reps of fn(arg), after warmup runs. Microseconds per call. */
static inline double bench_median_us(void (*fn)(void *), void *arg, int warmup, int reps)
{
    for (int i = 0; i < warmup; i++)
        fn(arg);
    double *t = (double *)malloc(sizeof(double) * (size_t)reps);
    if (!t)
        abort();
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now_us();
        fn(arg);
        t[i] = bench_now_us() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    double m = t[reps / 2];
    free(t);
    return m;
}

typedef struct bench_result {
    const char *name;
    double value;
    const char *unit;
    const char *anchor;
    double anchor_value;
    const char *target; /* applies to ratio, e.g. "<= 2"; NULL: none (a row that explains another) */
    const char *note;   /* free text for the table, or NULL */
} bench_result_t;

/* Whether ratio meets a target "<= x", "< x", ">= x" or "> x". */
static inline bool bench_meets(double ratio, const char *target)
{
    double x = atof(target + (target[1] == '=' ? 2 : 1));
    if (strncmp(target, "<=", 2) == 0)
        return ratio <= x;
    if (target[0] == '<')
        return ratio < x;
    if (strncmp(target, ">=", 2) == 0)
        return ratio >= x;
    return ratio > x;
}

static inline void bench_print(const bench_result_t *r, bool json)
{
    double ratio = r->value / r->anchor_value;
    if (json) {
        printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"anchor\": \"%s\", \"anchor_value\": %.6g, "
               "\"ratio\": %.6g, \"target\": %s%s%s}\n",
               r->name, r->value, r->unit, r->anchor, r->anchor_value, ratio, r->target ? "\"" : "",
               r->target ? r->target : "null", r->target ? "\"" : "");
    } else {
        printf("%-22s %12.3f %-4s  %-34s %12.3f  ratio %9.4f  target %-7s %s%s%s\n", r->name, r->value, r->unit,
               r->anchor, r->anchor_value, ratio, r->target ? r->target : "-",
               !r->target ? "  " : bench_meets(ratio, r->target) ? "ok" : "MISSED", r->note ? "  " : "",
               r->note ? r->note : "");
    }
    fflush(stdout);
}

#endif
