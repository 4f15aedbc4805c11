/* The per-thread detailed error messages of contexts, and the text for a
 * versioned struct that could not be read. The other files of the core
 * report through it, and it calls none of them (status.c's names only). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Each context keeps one message per thread that failed a call on it, found
 * by a thread number that is never reused; they live until the context is
 * destroyed, so a message never vanishes because other contexts were used. */
#define ERR_LEN 1024

struct err_slot {
    struct err_slot *next;
    uint64_t thread;
    char text[ERR_LEN];
};

static _Thread_local char create_err[ERR_LEN]; /* gser_context_create's, read with a NULL context */
static _Thread_local uint64_t this_thread;
static atomic_uint_fast64_t next_thread = 1;

static uint64_t thread_number(void)
{
    if (!this_thread)
        this_thread = atomic_fetch_add(&next_thread, 1);
    return this_thread;
}

static err_slot_t *err_slot(const gser_context_t *cctx, bool create)
{
    gser_context_t *ctx = (gser_context_t *)cctx; /* the slots are the context's mutable part */
    uint64_t me = thread_number();
    pthread_mutex_lock(&ctx->err_lock);
    err_slot_t *s = ctx->err_slots;
    while (s && s->thread != me)
        s = s->next;
    if (!s && create && (s = malloc(sizeof *s))) {
        s->thread = me;
        s->text[0] = '\0';
        s->next = ctx->err_slots;
        ctx->err_slots = s;
    }
    pthread_mutex_unlock(&ctx->err_lock);
    return s;
}

void gser__error_slots_free(gser_context_t *ctx)
{
    for (err_slot_t *s = ctx->err_slots, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    ctx->err_slots = NULL;
}

gser_status_t gser__error_setv(const gser_context_t *ctx, gser_status_t st, const char *fmt, va_list ap)
{
    if (!ctx)
        return st;
    err_slot_t *s = err_slot(ctx, true);
    if (s)
        vsnprintf(s->text, sizeof s->text, fmt, ap);
    return st;
}

gser_status_t gser__error_set(const gser_context_t *ctx, gser_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    gser__error_setv(ctx, st, fmt, ap);
    va_end(ap);
    return st;
}

gser_status_t gser__error_set_create(gser_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(create_err, sizeof create_err, fmt, ap);
    va_end(ap);
    return st;
}

void gser_struct_read_describe(gser_status_t status, const char *what, const char *type, const void *src,
                               size_t dst_size, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    if (!what || !type || !src) {
        snprintf(buf, cap, "%s", gser_status_str(status));
        return;
    }
    size_t n;
    memcpy(&n, src, sizeof n);
    if (status == GSER_ERR_INVALID_ARG)
        snprintf(buf, cap, "%s: %s.size is %zu: initialise the struct with its GSER_*_INIT macro", what, type, n);
    else
        snprintf(buf, cap,
                 "%s: %s.size is %zu, this library (%s) knows %zu bytes of it, and the caller set a field past them",
                 what, type, n, gser_version_str(), dst_size);
}

gser_status_t gser__struct_read(const gser_context_t *ctx, const char *what, const char *type, void *dst,
                                size_t dst_size, const void *src)
{
    gser_status_t st = gser_struct_read(dst, dst_size, src);
    if (st == GSER_OK)
        return GSER_OK;
    char text[ERR_LEN];
    gser_struct_read_describe(st, what, type, src, dst_size, text, sizeof text);
    return gser__error_set(ctx, st, "%s", text);
}

gser_status_t gser_context_struct_read(gser_context_t *ctx, const char *what, const char *type, void *dst,
                                       size_t dst_size, const void *src)
{
    if (!dst || !src || !what || !type)
        return GSER_ERR_INVALID_ARG;
    return gser__struct_read(ctx, what, type, dst, dst_size, src);
}

gser_status_t gser_context_fail(gser_context_t *ctx, gser_status_t status, const char *fmt, ...)
{
    if (!ctx || !fmt)
        return status;
    va_list ap;
    va_start(ap, fmt);
    gser__error_setv(ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *gser_context_get_last_error(const gser_context_t *ctx)
{
    if (!ctx)
        return create_err;
    err_slot_t *s = err_slot(ctx, false);
    return s ? s->text : "";
}
