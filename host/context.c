/* Contexts: options, limits and the registry of families and types (the
 * per-thread detailed error messages are in error.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

gser_status_t gser_context_get_limits(const gser_context_t *ctx, gser_limits_t *out)
{
    if (!ctx || !out)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = gser_struct_write(out, &ctx->limits, sizeof ctx->limits);
    return st ? gser__error_set(ctx, st, "gser_context_get_limits: out->size is 0: use GSER_LIMITS_INIT") : GSER_OK;
}

/* ---- create / destroy ---------------------------------------------------- */

void gser__limits_resolve(const gser_limits_t *in, gser_limits_t *out)
{
    gser_limits_t l = GSER_LIMITS_INIT;
    if (in && gser_struct_read(&l, sizeof l, in) != GSER_OK)
        memset(&l, 0, sizeof l); /* checked where the limits come in */
    l.size = sizeof l;
    if (l.max_depth == 0 || l.max_depth > GSER_DEPTH_MAX)
        l.max_depth = GSER_DEPTH_MAX;
    if (l.max_nodes == 0)
        l.max_nodes = GSER_DEFAULT_MAX_NODES;
    if (l.max_frames == 0)
        l.max_frames = GSER_DEFAULT_MAX_FRAMES;
    if (l.max_bytes == 0)
        l.max_bytes = GSER_DEFAULT_MAX_BYTES;
    if (l.max_expansion == 0)
        l.max_expansion = GSER_DEFAULT_MAX_EXPANSION;
    *out = l;
}

static bool env_trace_on(void)
{
    const char *v = getenv("GSER_TRACE");
    return v && *v && strcmp(v, "0") != 0;
}

gser_status_t gser_context_create(const gser_context_options_t *opts, gser_context_t **ctx_out)
{
    if (!ctx_out)
        return GSER_ERR_INVALID_ARG;
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    gser_limits_t lim = GSER_LIMITS_INIT;
    gser_status_t rst;
    if (opts && (rst = gser_struct_read(&o, sizeof o, opts))) {
        return gser__error_set_create(rst, "gser_context_create: gser_context_options_t.size is %zu: %s", opts->size,
                                      rst == GSER_ERR_INVALID_ARG
                                          ? "initialise it with GSER_CONTEXT_OPTIONS_INIT"
                                          : "the caller set a field this library does not know");
    }
    if (o.limits && (rst = gser_struct_read(&lim, sizeof lim, o.limits))) {
        return gser__error_set_create(rst, "gser_context_create: gser_limits_t.size is %zu: %s", o.limits->size,
                                      rst == GSER_ERR_INVALID_ARG
                                          ? "initialise it with GSER_LIMITS_INIT"
                                          : "the caller set a field this library does not know");
    }
    if (lim.max_depth > GSER_DEPTH_MAX)
        return gser__error_set_create(GSER_ERR_INVALID_ARG,
                                      "gser_context_create: limits.max_depth %zu is over the maximum of %d",
                                      lim.max_depth, GSER_DEPTH_MAX);

    gser_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return gser__error_set_create(GSER_ERR_NO_MEMORY, "gser_context_create: out of memory");
    pthread_mutex_init(&ctx->err_lock, NULL);
    gser__limits_resolve(&lim, &ctx->limits);
    ctx->inline_max = o.inline_max ? o.inline_max : GSER_DEFAULT_INLINE_MAX;
    ctx->array_min = o.array_min ? o.array_min : GSER_DEFAULT_ARRAY_MIN;
    if (o.trace > 0 || (o.trace == 0 && env_trace_on()))
        ctx->trace = o.trace_stream ? o.trace_stream : stderr;
    atomic_init(&ctx->frozen, false);
    atomic_init(&ctx->spare_msg[0], NULL);
    atomic_init(&ctx->spare_msg[1], NULL);
    atomic_init(&ctx->spare_frames, NULL);
    strcpy(ctx->families[GSER_FAMILY_DEVICE], "device");
    strcpy(ctx->families[GSER_FAMILY_HOST], "host");
    ctx->nfamilies = 2;
    gser_status_t st = gser__ctxdev_open(ctx, &o);
    if (st != GSER_OK) {
        gser__error_set_create(st, "%s", gser_context_get_last_error(ctx));
        gser_context_destroy(ctx);
        return st;
    }
    *ctx_out = ctx;
    return GSER_OK;
}

void gser_context_destroy(gser_context_t *ctx)
{
    if (!ctx)
        return;
    for (size_t i = 0; i < ctx->type_slots; i++) {
        if (ctx->types[i]) {
            free(ctx->types[i]->name);
            free(ctx->types[i]);
        }
    }
    free(ctx->types);
    free(atomic_load(&ctx->spare_msg[0]));
    free(atomic_load(&ctx->spare_msg[1]));
    free(atomic_load(&ctx->spare_frames));
    gser__ctxdev_close(ctx);
    gser__error_slots_free(ctx);
    pthread_mutex_destroy(&ctx->err_lock);
    free(ctx);
}

void gser__context_freeze(gser_context_t *ctx)
{
    if (!atomic_load_explicit(&ctx->frozen, memory_order_relaxed))
        atomic_store(&ctx->frozen, true);
}

static gser_status_t check_setup(gser_context_t *ctx, const char *what)
{
    if (atomic_load(&ctx->frozen))
        return gser__error_set(ctx, GSER_ERR_STATE,
                               "%s: the context has been used to (de)serialize; register everything before first use",
                               what);
    return GSER_OK;
}

/* ---- families ------------------------------------------------------------ */

int gser__context_find_family(const gser_context_t *ctx, const char *name, size_t len)
{
    for (size_t i = 0; i < ctx->nfamilies; i++)
        if (strlen(ctx->families[i]) == len && memcmp(ctx->families[i], name, len) == 0)
            return (int)i;
    return -1;
}

gser_status_t gser_family_register(gser_context_t *ctx, const char *name)
{
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (!name)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_family_register: name is NULL");
    gser_status_t st = check_setup(ctx, "gser_family_register");
    if (st)
        return st;
    size_t len = strlen(name);
    if (len == 0 || len > GSER_FAMILY_NAME_MAX || strchr(name, ','))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG,
                               "gser_family_register: family name \"%.80s\" must be 1..%d bytes without commas", name,
                               GSER_FAMILY_NAME_MAX);
    if (gser__context_find_family(ctx, name, len) >= 0)
        return gser__error_set(ctx, GSER_ERR_EXISTS, "gser_family_register: family \"%s\" is already registered", name);
    if (ctx->nfamilies == GSER_MAX_FAMILIES)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_family_register: \"%s\": at most %d families", name,
                               GSER_MAX_FAMILIES);
    memcpy(ctx->families[ctx->nfamilies++], name, len + 1);
    return GSER_OK;
}

/* ---- types --------------------------------------------------------------- */

static uint64_t hash_name(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

const gser_type_t *gser__context_find_type(const gser_context_t *ctx, const char *name, size_t len)
{
    if (ctx->type_slots == 0)
        return NULL;
    size_t mask = ctx->type_slots - 1;
    for (size_t i = hash_name(name, len) & mask;; i = (i + 1) & mask) {
        const gser_type_t *t = ctx->types[i];
        if (!t)
            return NULL;
        if (t->name_len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
}

static gser_status_t types_insert(gser_context_t *ctx, gser_type_t *t)
{
    if ((ctx->ntypes + 1) * 2 > ctx->type_slots) {
        size_t slots = ctx->type_slots ? ctx->type_slots * 2 : 16;
        gser_type_t **nt = calloc(slots, sizeof *nt);
        if (!nt)
            return GSER_ERR_NO_MEMORY;
        for (size_t i = 0; i < ctx->type_slots; i++) {
            gser_type_t *o = ctx->types[i];
            if (!o)
                continue;
            size_t j = hash_name(o->name, o->name_len) & (slots - 1);
            while (nt[j])
                j = (j + 1) & (slots - 1);
            nt[j] = o;
        }
        free(ctx->types);
        ctx->types = nt;
        ctx->type_slots = slots;
    }
    size_t mask = ctx->type_slots - 1;
    size_t j = hash_name(t->name, t->name_len) & mask;
    while (ctx->types[j])
        j = (j + 1) & mask;
    ctx->types[j] = t;
    ctx->ntypes++;
    return GSER_OK;
}

gser_status_t gser_type_register(gser_context_t *ctx, const char *name, uint32_t version,
                                 const gser_type_options_t *opts)
{
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (!name)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_type_register: name is NULL");
    gser_status_t st = check_setup(ctx, "gser_type_register");
    if (st)
        return st;
    size_t len = strlen(name);
    if (len == 0 || len > GSER_TYPE_NAME_MAX)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_type_register: type name must be 1..%d bytes",
                               GSER_TYPE_NAME_MAX);
    if (gser__context_find_type(ctx, name, len))
        return gser__error_set(ctx, GSER_ERR_EXISTS, "gser_type_register: type \"%s\" is already registered", name);
    gser_type_options_t o = GSER_TYPE_OPTIONS_INIT;
    if (opts && (st = gser__struct_read(ctx, "gser_type_register", "gser_type_options_t", &o, sizeof o, opts)))
        return st;
    if (o.min_read_version > version)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG,
                               "gser_type_register: type \"%s\": min_read_version %u is newer than version %u", name,
                               o.min_read_version, version);

    gser_type_t *t = calloc(1, sizeof *t);
    char *copy = malloc(len + 1);
    if (!t || !copy) {
        free(t);
        free(copy);
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_type_register: out of memory");
    }
    memcpy(copy, name, len + 1);
    t->name = copy;
    t->name_len = len;
    t->version = version;
    t->min_read_version = o.min_read_version ? o.min_read_version : version;
    t->destroy = o.destroy;
    t->user_data = o.user_data;
    if (types_insert(ctx, t) != GSER_OK) {
        free(copy);
        free(t);
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_type_register: out of memory");
    }
    return GSER_OK;
}

gser_status_t gser_type_add_family(gser_context_t *ctx, const char *type_name, const char *family,
                                   gser_serialize_fn serialize, gser_deserialize_fn deserialize)
{
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (!type_name || !family)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_type_add_family: type name or family is NULL");
    gser_status_t st = check_setup(ctx, "gser_type_add_family");
    if (st)
        return st;
    gser_type_t *t = (gser_type_t *)gser__context_find_type(ctx, type_name, strlen(type_name));
    if (!t)
        return gser__error_set(ctx, GSER_ERR_NOT_FOUND, "gser_type_add_family: type \"%s\" is not registered",
                               type_name);
    int f = gser__context_find_family(ctx, family, strlen(family));
    if (f < 0)
        return gser__error_set(ctx, GSER_ERR_UNKNOWN_FAMILY,
                               "gser_type_add_family: type \"%s\": family \"%s\" is not registered", type_name, family);
    if (!serialize || !deserialize)
        return gser__error_set(
            ctx, GSER_ERR_INVALID_ARG,
            "gser_type_add_family: type \"%s\", family \"%s\": serialize and deserialize are both required", type_name,
            family);
    if (t->fam[f].serialize)
        return gser__error_set(ctx, GSER_ERR_EXISTS, "gser_type_add_family: type \"%s\" already has family \"%s\"",
                               type_name, family);
    t->fam[f].serialize = serialize;
    t->fam[f].deserialize = deserialize;
    return GSER_OK;
}
