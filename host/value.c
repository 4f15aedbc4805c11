/* Messages and value trees: constructors, containers, accessors, equality. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- messages ------------------------------------------------------------ */

gser_status_t gser_msg_create(gser_context_t *ctx, gser_msg_t **msg_out)
{
    if (!ctx || !msg_out)
        return GSER_ERR_INVALID_ARG;
    gser_msg_t *m = NULL;
    for (int i = 0; GSER_REUSE && !m && i < 2; i++)
        if (atomic_load_explicit(&ctx->spare_msg[i], memory_order_relaxed))
            m = atomic_exchange_explicit(&ctx->spare_msg[i], NULL, memory_order_acquire);
    if (!m && !(m = malloc(sizeof *m)))
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_msg_create: out of memory");
    m->ctx = ctx;
    m->dev = NULL;
    m->frames = NULL;
    m->nframes = 0;
    m->codecs = NULL;
    m->flat_release = NULL;
    m->flat_arg = NULL;
    m->flat_data = NULL;
    m->nil = (gser_value_t){.kind = GSER_KIND_NIL, .msg = m};
    m->root = &m->nil;
    gser__arena_init(&m->arena, (arena_chunk_t *)m->first_chunk, sizeof m->first_chunk);
    *msg_out = m;
    return GSER_OK;
}

void gser_msg_destroy(gser_msg_t *msg)
{
    if (!msg)
        return;
    /* Objects first (they may point into frames), then the device memory the
     * message made (after its copies finish), then the frames, then the
     * flattened bytes the frames point into, then the memory. */
    /* The tests keep the calls off the path of small host messages, which
     * have no cleanups, no device memory and one chunk. */
    if (msg->arena.cleanups)
        gser__arena_run_cleanups(&msg->arena);
    if (msg->dev)
        gser__msgdev_release(msg);
    for (size_t i = msg->nframes; i-- > 0;)
        if (msg->frames[i].release)
            msg->frames[i].release((void *)msg->frames[i].data, msg->frames[i].release_arg);
    if (msg->flat_release)
        msg->flat_release((void *)msg->flat_data, msg->flat_arg);
    if (msg->arena.head != (arena_chunk_t *)msg->first_chunk || msg->arena.head->next)
        gser__arena_free(&msg->arena, (arena_chunk_t *)msg->first_chunk);
    else
        msg->arena.head = NULL;
    for (int i = 0; GSER_REUSE && i < 2; i++) {
        gser_msg_t *none = NULL;
        if (atomic_compare_exchange_strong_explicit(&msg->ctx->spare_msg[i], &none, msg, memory_order_release,
                                                    memory_order_relaxed))
            return;
    }
    free(msg);
}

gser_value_t *gser_msg_get_root(gser_msg_t *msg)
{
    return msg ? msg->root : NULL;
}

gser_status_t gser_msg_set_root(gser_msg_t *msg, gser_value_t *value)
{
    if (!msg || !value)
        return GSER_ERR_INVALID_ARG;
    msg->root = value;
    return GSER_OK;
}

gser_context_t *gser_msg_get_context(const gser_msg_t *msg)
{
    return msg ? msg->ctx : NULL;
}

static gser_status_t nomem(gser_msg_t *msg, const char *fn)
{
    return gser__error_set(msg->ctx, GSER_ERR_NO_MEMORY, "%s: out of memory", fn);
}

/* ---- scalar constructors -------------------------------------------------- */

#define NEW_SCALAR(fn, KIND, field, T)                                                                                 \
    gser_status_t fn(gser_msg_t *msg, T x, gser_value_t **out)                                                         \
    {                                                                                                                  \
        if (!msg || !out)                                                                                              \
            return GSER_ERR_INVALID_ARG;                                                                               \
        gser_value_t *v = gser__msg_value(msg, KIND);                                                                  \
        if (!v)                                                                                                        \
            return nomem(msg, #fn);                                                                                    \
        v->u.field = x;                                                                                                \
        *out = v;                                                                                                      \
        return GSER_OK;                                                                                                \
    }

NEW_SCALAR(gser_msg_new_bool, GSER_KIND_BOOL, b, bool)
NEW_SCALAR(gser_msg_new_int, GSER_KIND_INT, i, int64_t)
NEW_SCALAR(gser_msg_new_uint, GSER_KIND_UINT, u, uint64_t)
NEW_SCALAR(gser_msg_new_float, GSER_KIND_FLOAT, f, double)

gser_status_t gser_msg_new_nil(gser_msg_t *msg, gser_value_t **out)
{
    if (!msg || !out)
        return GSER_ERR_INVALID_ARG;
    *out = &msg->nil;
    return GSER_OK;
}

gser_status_t gser_msg_new_str(gser_msg_t *msg, const char *s, size_t len, gser_value_t **out)
{
    if (!msg || !out || (!s && len))
        return GSER_ERR_INVALID_ARG;
    gser_value_t *v = gser__msg_str_value(msg, s, len);
    if (!v)
        return nomem(msg, "gser_msg_new_str");
    *out = v;
    return GSER_OK;
}

gser_status_t gser_msg_new_cstr(gser_msg_t *msg, const char *s, gser_value_t **out)
{
    if (!s)
        return GSER_ERR_INVALID_ARG;
    return gser_msg_new_str(msg, s, strlen(s), out);
}

gser_status_t gser_msg_new_bytes(gser_msg_t *msg, const void *data, size_t len, gser_value_t **out)
{
    if (!msg || !out || (!data && len))
        return GSER_ERR_INVALID_ARG;
    gser_value_t *v = gser__msg_value(msg, GSER_KIND_BYTES);
    if (!v)
        return nomem(msg, "gser_msg_new_bytes");
    v->u.s.ptr = data;
    v->u.s.len = len;
    *out = v;
    return GSER_OK;
}

/* ---- lists ------------------------------------------------------------------ */

size_t gser__scalar_kind_size(gser_kind_t k)
{
    switch (k) {
    case GSER_KIND_BOOL: return 1;
    case GSER_KIND_INT:
    case GSER_KIND_UINT:
    case GSER_KIND_FLOAT: return 8;
    default: return 0;
    }
}

bool gser__kind_is_array_elem(gser_kind_t k)
{
    return gser__scalar_kind_size(k) != 0;
}

bool gser__kind_is_scalar(gser_kind_t k)
{
    return k <= GSER_KIND_BYTES;
}

gser_status_t gser__value_list_new(gser_msg_t *msg, gser_kind_t kind, gser_value_t **out)
{
    /* the value, the list and its first item slots: one allocation */
    gser_value_t *v = gser__msg_alloc(msg, sizeof *v + sizeof(gser_list_t) + GSER_LIST_INLINE * sizeof(gser_value_t *),
                                      alignof(gser_value_t));
    if (!v)
        return GSER_ERR_NO_MEMORY;
    gser_list_t *l = (gser_list_t *)(v + 1);
    *v = (gser_value_t){.kind = (uint8_t)kind, .msg = msg, .u.list = l};
    *l = (gser_list_t){.mode = LIST_BOXED, .items = (gser_value_t **)(l + 1), .items_cap = GSER_LIST_INLINE};
    *out = v;
    return GSER_OK;
}

gser_status_t gser_msg_new_list(gser_msg_t *msg, gser_value_t **out)
{
    if (!msg || !out)
        return GSER_ERR_INVALID_ARG;
    return gser__value_list_new(msg, GSER_KIND_LIST, out) ? nomem(msg, "gser_msg_new_list") : GSER_OK;
}

gser_status_t gser_msg_new_tuple(gser_msg_t *msg, gser_value_t **out)
{
    if (!msg || !out)
        return GSER_ERR_INVALID_ARG;
    return gser__value_list_new(msg, GSER_KIND_TUPLE, out) ? nomem(msg, "gser_msg_new_tuple") : GSER_OK;
}

gser_status_t gser__value_array_wrap(gser_msg_t *msg, bool tuple, gser_kind_t elem_kind, const void *data, size_t count,
                                     gser_value_t **out)
{
    gser_value_t *v;
    if (gser__value_list_new(msg, tuple ? GSER_KIND_TUPLE : GSER_KIND_LIST, &v))
        return GSER_ERR_NO_MEMORY;
    gser_list_t *l = v->u.list;
    l->mode = LIST_ARRAY;
    l->arr_kind = elem_kind;
    l->explicit_array = true;
    l->arr_borrowed = true;
    l->arr = (void *)data;
    l->len = count;
    *out = v;
    return GSER_OK;
}

gser_status_t gser_msg_new_array(gser_msg_t *msg, gser_kind_t elem_kind, const void *data, size_t count,
                                 unsigned flags, gser_value_t **out)
{
    if (!msg || !out)
        return GSER_ERR_INVALID_ARG;
    if (!gser__kind_is_array_elem(elem_kind))
        return gser__error_set(msg->ctx, GSER_ERR_INVALID_ARG,
                               "gser_msg_new_array: element kind %s is not bool, int, uint or float",
                               gser_kind_str(elem_kind));
    size_t es = gser__scalar_kind_size(elem_kind);
    if (count && !data)
        return gser__error_set(msg->ctx, GSER_ERR_INVALID_ARG, "gser_msg_new_array: data is NULL");
    if (count > SIZE_MAX / es)
        return gser__error_set(msg->ctx, GSER_ERR_INVALID_ARG, "gser_msg_new_array: count too large");
    if (elem_kind == GSER_KIND_BOOL) {
        const unsigned char *b = data;
        for (size_t i = 0; i < count; i++)
            if (b[i] > 1)
                return gser__error_set(msg->ctx, GSER_ERR_INVALID_ARG,
                                       "gser_msg_new_array: bool element %zu is %u, not 0 or 1", i, b[i]);
    }
    const void *src = data;
    if ((flags & GSER_ARRAY_COPY) && count) {
        void *copy = gser__msg_alloc(msg, count * es, 16);
        if (!copy)
            return nomem(msg, "gser_msg_new_array");
        memcpy(copy, data, count * es);
        src = copy;
    }
    gser_value_t *v;
    if (gser__value_array_wrap(msg, flags & GSER_ARRAY_TUPLE, elem_kind, src, count, &v))
        return nomem(msg, "gser_msg_new_array");
    *out = v;
    return GSER_OK;
}

static bool is_list(const gser_value_t *v)
{
    return v && (v->kind == GSER_KIND_LIST || v->kind == GSER_KIND_TUPLE);
}

/* Box element i of an array-backed list into a new value. */
static gser_value_t *box_elem(gser_msg_t *msg, const gser_list_t *l, size_t i)
{
    gser_value_t *v = gser__msg_value(msg, l->arr_kind);
    if (!v)
        return NULL;
    switch (l->arr_kind) {
    case GSER_KIND_BOOL: v->u.b = ((const unsigned char *)l->arr)[i] != 0; break;
    case GSER_KIND_INT: memcpy(&v->u.i, (const char *)l->arr + 8 * i, 8); break;
    case GSER_KIND_UINT: memcpy(&v->u.u, (const char *)l->arr + 8 * i, 8); break;
    default: memcpy(&v->u.f, (const char *)l->arr + 8 * i, 8); break;
    }
    return v;
}

/* Turn an array-backed list into a list of value pointers (a mixed append). */
static gser_status_t list_box(gser_msg_t *msg, gser_list_t *l)
{
    if (gser__arena_vec_reserve(&msg->arena, (void **)&l->items, &l->items_cap, sizeof(gser_value_t *), l->len + 1))
        return GSER_ERR_NO_MEMORY;
    for (size_t i = 0; i < l->len; i++) {
        gser_value_t *v = l->cache && l->cache[i] ? l->cache[i] : box_elem(msg, l, i);
        if (!v)
            return GSER_ERR_NO_MEMORY;
        l->items[i] = v;
    }
    l->mode = LIST_BOXED;
    l->cache = NULL;
    l->explicit_array = false;
    return GSER_OK;
}

/* Make room for one more unboxed element, taking a private copy of a borrowed array. */
static gser_status_t list_arr_reserve(gser_msg_t *msg, gser_list_t *l, size_t es)
{
    if (l->arr_borrowed) {
        const void *old = l->arr;
        l->arr = NULL;
        l->arr_cap = 0;
        if (gser__arena_vec_reserve(&msg->arena, &l->arr, &l->arr_cap, es, l->len + 1)) {
            l->arr = (void *)old;
            return GSER_ERR_NO_MEMORY;
        }
        if (l->len)
            memcpy(l->arr, old, l->len * es);
        l->arr_borrowed = false;
        return GSER_OK;
    }
    return gser__arena_vec_reserve(&msg->arena, &l->arr, &l->arr_cap, es, l->len + 1);
}

/* Append a scalar without boxing when the list is (or can become) an array of its kind. */
static gser_status_t list_push_scalar(gser_value_t *list, gser_kind_t kind, const void *bits)
{
    gser_list_t *l = list->u.list;
    gser_msg_t *msg = list->msg;
    if (l->mode == LIST_BOXED && l->len == 0) {
        l->mode = LIST_ARRAY;
        l->arr_kind = kind;
    }
    if (l->mode == LIST_ARRAY && l->arr_kind == kind) {
        size_t es = gser__scalar_kind_size(kind);
        if (list_arr_reserve(msg, l, es))
            return nomem(msg, "gser_list_append");
        memcpy((char *)l->arr + l->len * es, bits, es);
        l->len++;
        l->cache = NULL;
        return GSER_OK;
    }
    gser_value_t *v = gser__msg_value(msg, kind);
    if (!v)
        return nomem(msg, "gser_list_append");
    memcpy(&v->u, bits, gser__scalar_kind_size(kind));
    return gser_list_append(list, v);
}

gser_status_t gser_list_append(gser_value_t *list, gser_value_t *value)
{
    if (!is_list(list) || !value)
        return GSER_ERR_INVALID_ARG;
    gser_list_t *l = list->u.list;
    gser_msg_t *msg = list->msg;
    gser_kind_t k = value->kind;
    if (gser__kind_is_array_elem(k) && (l->mode == LIST_ARRAY || l->len == 0)) {
        if (l->mode == LIST_BOXED || l->arr_kind == k) {
            if (k == GSER_KIND_BOOL) {
                unsigned char b = value->u.b;
                return list_push_scalar(list, k, &b);
            }
            return list_push_scalar(list, k, &value->u);
        }
    }
    if (l->mode == LIST_ARRAY && list_box(msg, l))
        return nomem(msg, "gser_list_append");
    if (gser__arena_vec_reserve(&msg->arena, (void **)&l->items, &l->items_cap, sizeof(gser_value_t *), l->len + 1))
        return nomem(msg, "gser_list_append");
    l->items[l->len++] = value;
    return GSER_OK;
}

gser_status_t gser_list_append_nil(gser_value_t *list)
{
    return is_list(list) ? gser_list_append(list, &list->msg->nil) : GSER_ERR_INVALID_ARG;
}

gser_status_t gser_list_append_bool(gser_value_t *list, bool v)
{
    unsigned char b = v;
    return is_list(list) ? list_push_scalar(list, GSER_KIND_BOOL, &b) : GSER_ERR_INVALID_ARG;
}

/* The common case of an append: an owned array of this kind with room left. */
static inline bool list_push8_fast(gser_value_t *list, gser_kind_t kind, const void *bits)
{
    gser_list_t *l = list->u.list;
    if (l->mode != LIST_ARRAY || l->arr_kind != kind || l->len >= l->arr_cap || l->arr_borrowed)
        return false;
    memcpy((char *)l->arr + 8 * l->len++, bits, 8);
    l->cache = NULL;
    return true;
}

gser_status_t gser_list_append_int(gser_value_t *list, int64_t v)
{
    if (!is_list(list))
        return GSER_ERR_INVALID_ARG;
    return list_push8_fast(list, GSER_KIND_INT, &v) ? GSER_OK : list_push_scalar(list, GSER_KIND_INT, &v);
}

gser_status_t gser_list_append_uint(gser_value_t *list, uint64_t v)
{
    if (!is_list(list))
        return GSER_ERR_INVALID_ARG;
    return list_push8_fast(list, GSER_KIND_UINT, &v) ? GSER_OK : list_push_scalar(list, GSER_KIND_UINT, &v);
}

gser_status_t gser_list_append_float(gser_value_t *list, double v)
{
    if (!is_list(list))
        return GSER_ERR_INVALID_ARG;
    return list_push8_fast(list, GSER_KIND_FLOAT, &v) ? GSER_OK : list_push_scalar(list, GSER_KIND_FLOAT, &v);
}

gser_status_t gser_list_append_cstr(gser_value_t *list, const char *s)
{
    if (!is_list(list) || !s)
        return GSER_ERR_INVALID_ARG;
    gser_value_t *v = gser__msg_str_value(list->msg, s, strlen(s));
    if (!v)
        return nomem(list->msg, "gser_list_append_cstr");
    gser_list_t *l = list->u.list;
    if (l->mode == LIST_BOXED && l->len < l->items_cap) { /* the common case, without the checks of any append */
        l->items[l->len++] = v;
        return GSER_OK;
    }
    return gser_list_append(list, v);
}

gser_status_t gser_list_get(gser_value_t *list, size_t i, gser_value_t **out)
{
    if (!is_list(list) || !out)
        return GSER_ERR_INVALID_ARG;
    gser_list_t *l = list->u.list;
    if (i >= l->len)
        return GSER_ERR_OUT_OF_RANGE;
    if (l->mode == LIST_BOXED) {
        *out = l->items[i];
        return GSER_OK;
    }
    gser_msg_t *msg = list->msg;
    if (!l->cache) {
        l->cache = gser__msg_alloc(msg, l->len * sizeof(gser_value_t *), alignof(gser_value_t *));
        if (!l->cache)
            return nomem(msg, "gser_list_get");
        memset(l->cache, 0, l->len * sizeof(gser_value_t *));
    }
    if (!l->cache[i] && !(l->cache[i] = box_elem(msg, l, i)))
        return nomem(msg, "gser_list_get");
    *out = l->cache[i];
    return GSER_OK;
}

gser_status_t gser_list_get_array(const gser_value_t *list, gser_kind_t *elem_kind, const void **data, size_t *count)
{
    if (!is_list(list) || !elem_kind || !data || !count)
        return GSER_ERR_INVALID_ARG;
    const gser_list_t *l = list->u.list;
    if (l->mode != LIST_ARRAY)
        return GSER_ERR_TYPE_MISMATCH;
    *elem_kind = l->arr_kind;
    *data = l->arr;
    *count = l->len;
    return GSER_OK;
}

/* ---- maps -------------------------------------------------------------------- */

gser_status_t gser_msg_new_map(gser_msg_t *msg, gser_value_t **out)
{
    if (!msg || !out)
        return GSER_ERR_INVALID_ARG;
    /* the value, the map and its first pairs: one allocation */
    gser_value_t *v = gser__msg_alloc(msg, sizeof *v + sizeof(gser_map_t) + GSER_MAP_INLINE * sizeof(gser_pair_t),
                                      alignof(gser_value_t));
    if (!v)
        return nomem(msg, "gser_msg_new_map");
    gser_map_t *m = (gser_map_t *)(v + 1);
    *v = (gser_value_t){.kind = GSER_KIND_MAP, .msg = msg, .u.map = m};
    *m = (gser_map_t){.len = 0, .cap = GSER_MAP_INLINE, .pairs = (gser_pair_t *)(m + 1)};
    *out = v;
    return GSER_OK;
}

/* Append a pair whose key is known to be a scalar. */
static inline gser_status_t map_append(gser_value_t *map, gser_value_t *key, gser_value_t *value)
{
    gser_map_t *m = map->u.map;
    if (gser__arena_vec_reserve(&map->msg->arena, (void **)&m->pairs, &m->cap, sizeof(gser_pair_t), m->len + 1))
        return nomem(map->msg, "gser_map_put");
    m->pairs[m->len].key = key;
    m->pairs[m->len].value = value;
    m->len++;
    return GSER_OK;
}

gser_status_t gser_map_put(gser_value_t *map, gser_value_t *key, gser_value_t *value)
{
    if (!map || map->kind != GSER_KIND_MAP || !key || !value)
        return GSER_ERR_INVALID_ARG;
    if (!gser__kind_is_scalar(key->kind))
        return gser__error_set(map->msg->ctx, GSER_ERR_INVALID_ARG,
                               "gser_map_put: a map key must be a scalar, not a %s", gser_kind_str(key->kind));
    return map_append(map, key, value);
}

gser_status_t gser_map_put_cstr(gser_value_t *map, const char *key, gser_value_t *value)
{
    if (!map || map->kind != GSER_KIND_MAP || !key || !value)
        return GSER_ERR_INVALID_ARG;
    gser_value_t *k = gser__msg_str_value(map->msg, key, strlen(key));
    return k ? map_append(map, k, value) : nomem(map->msg, "gser_map_put_cstr");
}

gser_status_t gser_map_put_borrowed(gser_value_t *map, const char *key, size_t len, gser_value_t *value)
{
    if (!map || map->kind != GSER_KIND_MAP || !key || !value || key[len] != '\0')
        return GSER_ERR_INVALID_ARG;
    gser_value_t *k = gser__msg_value(map->msg, GSER_KIND_STR);
    if (!k)
        return nomem(map->msg, "gser_map_put_borrowed");
    k->u.s.ptr = key; /* not copied: the caller keeps it, as the call says */
    k->u.s.len = len;
    return map_append(map, k, value);
}

gser_status_t gser_map_get_at(gser_value_t *map, size_t i, gser_value_t **key, gser_value_t **value)
{
    if (!map || map->kind != GSER_KIND_MAP)
        return GSER_ERR_INVALID_ARG;
    if (i >= map->u.map->len)
        return GSER_ERR_OUT_OF_RANGE;
    if (key)
        *key = map->u.map->pairs[i].key;
    if (value)
        *value = map->u.map->pairs[i].value;
    return GSER_OK;
}

gser_status_t gser_map_find_cstr(gser_value_t *map, const char *key, gser_value_t **value)
{
    if (!map || map->kind != GSER_KIND_MAP || !key || !value)
        return GSER_ERR_INVALID_ARG;
    size_t n = strlen(key);
    const gser_map_t *m = map->u.map;
    for (size_t i = 0; i < m->len; i++) {
        const gser_value_t *k = m->pairs[i].key;
        if (k->kind == GSER_KIND_STR && k->u.s.len == n && memcmp(k->u.s.ptr, key, n) == 0) {
            *value = m->pairs[i].value;
            return GSER_OK;
        }
    }
    return GSER_ERR_NOT_FOUND;
}

gser_status_t gser_map_find(gser_value_t *map, const gser_value_t *key, gser_value_t **value)
{
    if (!map || map->kind != GSER_KIND_MAP || !key || !value)
        return GSER_ERR_INVALID_ARG;
    const gser_map_t *m = map->u.map;
    for (size_t i = 0; i < m->len; i++) {
        if (gser_value_equal(m->pairs[i].key, key)) {
            *value = m->pairs[i].value;
            return GSER_OK;
        }
    }
    return GSER_ERR_NOT_FOUND;
}

/* ---- buffers and objects -------------------------------------------------------- */

typedef struct owned_release {
    void (*fn)(void *data, void *arg);
    void *data;
    void *arg;
} owned_release_t;

static void run_owned_release(void *arg)
{
    owned_release_t *r = arg;
    r->fn(r->data, r->arg);
}

uint32_t gser__layout_span(uint32_t ndim, const int64_t *shape, const int64_t *strides, size_t es, size_t *first,
                           size_t *span)
{
    for (uint32_t k = 0; k < ndim; k++) {
        if (shape[k] == 0) {
            *first = *span = 0;
            return 0;
        }
    }
    /* lo <= 0 <= hi: the lowest and highest element offsets from element 0 */
    int64_t lo = 0, hi = 0, reach, top;
    for (uint32_t k = 0; k < ndim; k++) {
        if (__builtin_mul_overflow(strides[k], shape[k] - 1, &reach) ||
            (reach < 0 ? __builtin_add_overflow(lo, reach, &lo) : __builtin_add_overflow(hi, reach, &hi)))
            return k + 1;
    }
    /* hi - lo + es, the byte after the highest element, as an int64 */
    if (es > INT64_MAX || __builtin_sub_overflow(hi, lo, &top) || __builtin_add_overflow(top, (int64_t)es, &top) ||
        (uint64_t)top > SIZE_MAX)
        return ndim;
    *first = (size_t)-(uint64_t)lo;
    *span = (size_t)top;
    return 0;
}

bool gser__layout_is_c(uint32_t ndim, const int64_t *shape, const int64_t *strides, size_t es)
{
    uint64_t want = es;
    bool c = true;
    for (uint32_t k = ndim; k-- > 0;) {
        if (shape[k] == 0)
            return true;
        if (shape[k] != 1 && (uint64_t)strides[k] != want)
            c = false;
        want *= (uint64_t)shape[k];
    }
    return c;
}

/* The C-order strides of a shape (for comparing a C-order buffer with a
 * strided one). */
static void c_strides(uint32_t ndim, const int64_t *shape, size_t es, int64_t *out)
{
    uint64_t s = es;
    for (uint32_t k = ndim; k-- > 0;) {
        out[k] = (int64_t)s;
        s *= shape[k] ? (uint64_t)shape[k] : 1;
    }
}

gser_value_t *gser__buffer_value(gser_msg_t *msg, gser_value_t *into, const gser_buffer_desc_t *desc, size_t first,
                                 size_t span)
{
    gser_value_t *v = into ? into : gser__msg_value(msg, GSER_KIND_BUFFER);
    gser_buffer_t *b = v ? gser__msg_alloc(msg, sizeof *b, alignof(gser_buffer_t)) : NULL;
    size_t dims = (size_t)desc->ndim * (desc->strides ? 2 : 1);
    int64_t *store = b && dims ? gser__msg_alloc(msg, dims * sizeof(int64_t), 8) : NULL;
    if (!b || (dims && !store))
        return NULL;
    b->desc = *desc;
    b->desc.flags = 0;
    b->desc.release = NULL;
    b->desc.release_arg = NULL;
    b->desc.shape = b->desc.strides = NULL;
    if (desc->ndim) {
        memcpy(store, desc->shape, desc->ndim * sizeof(int64_t));
        b->desc.shape = store;
    }
    if (desc->strides) {
        memcpy(store + desc->ndim, desc->strides, desc->ndim * sizeof(int64_t));
        b->desc.strides = store + desc->ndim;
    }
    b->first = first;
    b->span = span;
    v->kind = GSER_KIND_BUFFER;
    v->u.buf = b;
    return v;
}

/* Check a caller's description (its struct already read into d) and find
 * the span of its elements; strides that say C order are dropped. */
static gser_status_t buffer_check(gser_context_t *ctx, const char *what, gser_buffer_desc_t *d, size_t *first,
                                  size_t *span)
{
    size_t es = gser_dtype_size(d->dtype);
    if (es == 0)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: unknown dtype %d", what, (int)d->dtype);
    if (d->ndim > GSER_MAX_NDIM || (d->ndim && !d->shape))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: ndim %u needs a shape of at most %d dims", what, d->ndim,
                               GSER_MAX_NDIM);
    if (d->strides && !d->ndim)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: strides need a shape (ndim is 0)", what);
    if (d->ndim) {
        uint64_t total = es;
        for (uint32_t k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0 || (d->shape[k] && total > UINT64_MAX / (uint64_t)d->shape[k]))
                return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: bad extent %lld in dim %u", what,
                                       (long long)d->shape[k], k);
            total *= (uint64_t)d->shape[k];
        }
        if (total != d->nbytes)
            return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: shape holds %llu bytes of %s but nbytes is %zu",
                                   what, (unsigned long long)total, gser_dtype_str(d->dtype), d->nbytes);
    } else if (d->nbytes % es) {
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: nbytes %zu is not a multiple of %s", what, d->nbytes,
                               gser_dtype_str(d->dtype));
    }
    *first = 0;
    *span = d->nbytes;
    if (d->strides) {
        uint32_t bad = gser__layout_span(d->ndim, d->shape, d->strides, es, first, span);
        if (bad)
            return gser__error_set(ctx, GSER_ERR_INVALID_ARG,
                                   "%s: with strides[%u] = %lld the elements span more than 2^63 - 1 bytes", what,
                                   bad - 1, (long long)d->strides[bad - 1]);
        if (gser__layout_is_c(d->ndim, d->shape, d->strides, es)) {
            d->strides = NULL;
            *first = 0;
            *span = d->nbytes;
        }
    }
    return GSER_OK;
}

gser_status_t gser_msg_new_buffer(gser_msg_t *msg, const gser_buffer_desc_t *user_desc, gser_value_t **out)
{
    static const char what[] = "gser_msg_new_buffer";
    if (!msg || !user_desc || !out)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = msg->ctx;
    gser_buffer_desc_t d_ = GSER_BUFFER_DESC_INIT;
    const gser_buffer_desc_t *desc = &d_;
    gser_status_t rst = gser__struct_read(ctx, what, "gser_buffer_desc_t", &d_, sizeof d_, user_desc);
    if (rst)
        return rst;
    size_t first, span;
    if ((rst = buffer_check(ctx, what, &d_, &first, &span)))
        return rst;
    if (desc->nbytes && !desc->data)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: data is NULL", what);
    if (desc->memory != GSER_MEMORY_HOST && desc->memory != GSER_MEMORY_DEVICE)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: unknown memory kind %d", what, (int)desc->memory);
    bool copy = desc->flags & GSER_BUFFER_COPY;
    if (copy && desc->memory != GSER_MEMORY_HOST)
        return gser__error_set(ctx, GSER_ERR_UNSUPPORTED, "%s: GSER_BUFFER_COPY needs host memory", what);
    if (copy && desc->release)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: both GSER_BUFFER_COPY and release set", what);

    gser_value_t *v = gser__buffer_value(msg, NULL, desc, first, span);
    if (!v)
        return nomem(msg, what);
    if (copy && span) {
        /* the span, not nbytes: a broadcast array is copied as its base */
        char *d = gser__msg_alloc(msg, span, 16);
        if (!d)
            return nomem(msg, what);
        memcpy(d, (const char *)desc->data - first, span);
        v->u.buf->desc.data = d + first;
    }
    if (desc->release) {
        /* Registered last, once nothing else can fail: the message owns data
         * only when the call succeeds. */
        owned_release_t *r = gser__msg_alloc(msg, sizeof *r, alignof(owned_release_t));
        if (!r)
            return nomem(msg, what);
        r->fn = desc->release;
        r->data = (void *)desc->data;
        r->arg = desc->release_arg;
        if (gser__arena_on_release(&msg->arena, run_owned_release, r))
            return nomem(msg, what);
    }
    *out = v;
    return GSER_OK;
}

gser_status_t gser_value_get_buffer(const gser_value_t *v, gser_buffer_desc_t *desc)
{
    if (!v || !desc)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_BUFFER)
        return GSER_ERR_TYPE_MISMATCH;
    const gser_buffer_desc_t *b = &v->u.buf->desc;
    size_t caller;
    memcpy(&caller, desc, sizeof caller);
    if (b->strides && caller < offsetof(gser_buffer_desc_t, strides) + sizeof b->strides)
        return GSER_ERR_UNSUPPORTED;
    return gser_struct_write(desc, b, sizeof *b);
}

gser_status_t gser_buffer_get_span(const gser_buffer_desc_t *desc, int64_t *offset, size_t *span)
{
    if (!desc || !offset || !span)
        return GSER_ERR_INVALID_ARG;
    gser_buffer_desc_t d;
    gser_status_t st = gser_struct_read(&d, sizeof d, desc);
    if (st)
        return st;
    size_t es = gser_dtype_size(d.dtype), first = 0, n = d.nbytes;
    if (es == 0 || d.ndim > GSER_MAX_NDIM || (d.ndim && !d.shape) || (d.strides && !d.ndim))
        return GSER_ERR_INVALID_ARG;
    for (uint32_t k = 0; k < d.ndim; k++)
        if (d.shape[k] < 0)
            return GSER_ERR_INVALID_ARG;
    if (d.strides && gser__layout_span(d.ndim, d.shape, d.strides, es, &first, &n))
        return GSER_ERR_INVALID_ARG;
    *offset = -(int64_t)first;
    *span = n;
    return GSER_OK;
}

gser_status_t gser_msg_new_object(gser_msg_t *msg, const char *type_name, void *obj, gser_value_t **out)
{
    if (!msg || !type_name || !out)
        return GSER_ERR_INVALID_ARG;
    const gser_type_t *t = gser__context_find_type(msg->ctx, type_name, strlen(type_name));
    if (!t)
        return gser__error_set(msg->ctx, GSER_ERR_NOT_FOUND, "gser_msg_new_object: type \"%s\" is not registered",
                               type_name);
    gser_value_t *v = gser__msg_value(msg, GSER_KIND_OBJECT);
    gser_object_t *o = v ? gser__msg_alloc(msg, sizeof *o, alignof(gser_object_t)) : NULL;
    if (!o)
        return nomem(msg, "gser_msg_new_object");
    o->type = t;
    o->obj = obj;
    v->u.obj = o;
    *out = v;
    return GSER_OK;
}

gser_status_t gser_value_get_object(const gser_value_t *v, const char **type_name, void **obj)
{
    if (!v)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_OBJECT)
        return GSER_ERR_TYPE_MISMATCH;
    if (type_name)
        *type_name = v->u.obj->type->name;
    if (obj)
        *obj = v->u.obj->obj;
    return GSER_OK;
}

gser_status_t gser_value_take_object(gser_value_t *v, void **obj)
{
    if (!v || !obj)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_OBJECT)
        return GSER_ERR_TYPE_MISMATCH;
    v->flags &= (uint8_t)~VF_OWNED;
    *obj = v->u.obj->obj;
    return GSER_OK;
}

gser_status_t gser_value_get_serialized(const gser_value_t *v, gser_serialized_info_t *info)
{
    if (!v || !info)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_SERIALIZED)
        return GSER_ERR_TYPE_MISMATCH;
    const gser_serialized_t *s = v->u.ser;
    gser_serialized_info_t out = {.size = sizeof out,
                                  .type_name = s->type_name,
                                  .family = s->family,
                                  .version = s->version,
                                  .header = s->header,
                                  .header_len = s->header_len,
                                  .nframes = s->nframes};
    return gser_struct_write(info, &out, sizeof out);
}

/* ---- scalar accessors ----------------------------------------------------------- */

gser_kind_t gser_value_get_kind(const gser_value_t *v)
{
    return v ? (gser_kind_t)v->kind : GSER_KIND_NIL;
}

gser_status_t gser_value_get_bool(const gser_value_t *v, bool *out)
{
    if (!v || !out)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_BOOL)
        return GSER_ERR_TYPE_MISMATCH;
    *out = v->u.b;
    return GSER_OK;
}

gser_status_t gser_value_get_int(const gser_value_t *v, int64_t *out)
{
    if (!v || !out)
        return GSER_ERR_INVALID_ARG;
    if (v->kind == GSER_KIND_INT) {
        *out = v->u.i;
        return GSER_OK;
    }
    if (v->kind == GSER_KIND_UINT) {
        if (v->u.u > (uint64_t)INT64_MAX)
            return GSER_ERR_OUT_OF_RANGE;
        *out = (int64_t)v->u.u;
        return GSER_OK;
    }
    return GSER_ERR_TYPE_MISMATCH;
}

gser_status_t gser_value_get_uint(const gser_value_t *v, uint64_t *out)
{
    if (!v || !out)
        return GSER_ERR_INVALID_ARG;
    if (v->kind == GSER_KIND_UINT) {
        *out = v->u.u;
        return GSER_OK;
    }
    if (v->kind == GSER_KIND_INT) {
        if (v->u.i < 0)
            return GSER_ERR_OUT_OF_RANGE;
        *out = (uint64_t)v->u.i;
        return GSER_OK;
    }
    return GSER_ERR_TYPE_MISMATCH;
}

gser_status_t gser_value_get_float(const gser_value_t *v, double *out)
{
    if (!v || !out)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_FLOAT)
        return GSER_ERR_TYPE_MISMATCH;
    *out = v->u.f;
    return GSER_OK;
}

gser_status_t gser_value_get_str(const gser_value_t *v, const char **s, size_t *len)
{
    if (!v || !s)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_STR)
        return GSER_ERR_TYPE_MISMATCH;
    *s = v->u.s.ptr;
    if (len)
        *len = v->u.s.len;
    return GSER_OK;
}

gser_status_t gser_value_get_bytes(const gser_value_t *v, const void **data, size_t *len)
{
    if (!v || !data || !len)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_BYTES)
        return GSER_ERR_TYPE_MISMATCH;
    *data = v->u.s.ptr;
    *len = v->u.s.len;
    return GSER_OK;
}

size_t gser_value_get_len(const gser_value_t *v)
{
    if (!v)
        return 0;
    switch (v->kind) {
    case GSER_KIND_STR:
    case GSER_KIND_BYTES: return v->u.s.len;
    case GSER_KIND_LIST:
    case GSER_KIND_TUPLE: return v->u.list->len;
    case GSER_KIND_MAP: return v->u.map->len;
    default: return 0;
    }
}

/* ---- equality ------------------------------------------------------------------- */

/* Element i of any list as a scalar value on the stack (no allocation). */
static bool list_elem(const gser_list_t *l, size_t i, gser_value_t *tmp, const gser_value_t **out)
{
    if (l->mode == LIST_BOXED) {
        *out = l->items[i];
        return true;
    }
    tmp->kind = (uint8_t)l->arr_kind;
    switch (l->arr_kind) {
    case GSER_KIND_BOOL: tmp->u.b = ((const unsigned char *)l->arr)[i] != 0; break;
    default: memcpy(&tmp->u, (const char *)l->arr + 8 * i, 8); break;
    }
    *out = tmp;
    return true;
}

/* Elements of two layouts of one shape, compared one by one. Every partial
 * offset is an element's (all extents are > 0 here), so no pointer leaves
 * the spans. */
static bool strided_equal(const char *a, const int64_t *sa, const char *b, const int64_t *sb, const int64_t *shape,
                          uint32_t ndim, size_t es)
{
    if (ndim == 0)
        return memcmp(a, b, es) == 0;
    for (int64_t i = 0; i < shape[0]; i++)
        if (!strided_equal(a + i * sa[0], sa + 1, b + i * sb[0], sb + 1, shape + 1, ndim - 1, es))
            return false;
    return true;
}

/* Same dtype, shape and memory kind, and the same elements whatever the
 * layouts; device buffers by pointer and layout. */
static bool buffer_equal(const gser_buffer_desc_t *da, const gser_buffer_desc_t *db)
{
    if (da->dtype != db->dtype || da->nbytes != db->nbytes || da->ndim != db->ndim || da->memory != db->memory)
        return false;
    if (da->ndim && memcmp(da->shape, db->shape, da->ndim * sizeof(int64_t)) != 0)
        return false;
    if (da->memory != GSER_MEMORY_HOST)
        return da->data == db->data && !da->strides == !db->strides &&
               (!da->strides || memcmp(da->strides, db->strides, da->ndim * sizeof(int64_t)) == 0);
    if (da->nbytes == 0)
        return true;
    if (!da->strides && !db->strides)
        return memcmp(da->data, db->data, da->nbytes) == 0;
    int64_t ca[GSER_MAX_NDIM], cb[GSER_MAX_NDIM];
    size_t es = gser_dtype_size(da->dtype);
    if (!da->strides)
        c_strides(da->ndim, da->shape, es, ca);
    if (!db->strides)
        c_strides(db->ndim, db->shape, es, cb);
    return strided_equal(da->data, da->strides ? da->strides : ca, db->data, db->strides ? db->strides : cb,
                         da->shape, da->ndim, es);
}

bool gser_value_equal(const gser_value_t *a, const gser_value_t *b)
{
    if (!a || !b)
        return a == b;
    if (a->kind != b->kind)
        return false;
    switch (a->kind) {
    case GSER_KIND_NIL: return true;
    case GSER_KIND_BOOL: return a->u.b == b->u.b;
    case GSER_KIND_INT: return a->u.i == b->u.i;
    case GSER_KIND_UINT: return a->u.u == b->u.u;
    case GSER_KIND_FLOAT: return a->u.f == b->u.f || (isnan(a->u.f) && isnan(b->u.f));
    case GSER_KIND_STR:
    case GSER_KIND_BYTES:
        return a->u.s.len == b->u.s.len && (a->u.s.len == 0 || memcmp(a->u.s.ptr, b->u.s.ptr, a->u.s.len) == 0);
    case GSER_KIND_LIST:
    case GSER_KIND_TUPLE: {
        const gser_list_t *la = a->u.list, *lb = b->u.list;
        if (la->len != lb->len)
            return false;
        if (la->mode == LIST_ARRAY && lb->mode == LIST_ARRAY && la->arr_kind == lb->arr_kind &&
            la->arr_kind != GSER_KIND_FLOAT)
            return la->len == 0 || memcmp(la->arr, lb->arr, la->len * gser__scalar_kind_size(la->arr_kind)) == 0;
        for (size_t i = 0; i < la->len; i++) {
            gser_value_t ta, tb;
            const gser_value_t *ea, *eb;
            list_elem(la, i, &ta, &ea);
            list_elem(lb, i, &tb, &eb);
            if (!gser_value_equal(ea, eb))
                return false;
        }
        return true;
    }
    case GSER_KIND_MAP: {
        const gser_map_t *ma = a->u.map, *mb = b->u.map;
        if (ma->len != mb->len)
            return false;
        for (size_t i = 0; i < ma->len; i++)
            if (!gser_value_equal(ma->pairs[i].key, mb->pairs[i].key) ||
                !gser_value_equal(ma->pairs[i].value, mb->pairs[i].value))
                return false;
        return true;
    }
    case GSER_KIND_BUFFER: return buffer_equal(&a->u.buf->desc, &b->u.buf->desc);
    case GSER_KIND_OBJECT: return a->u.obj->type == b->u.obj->type && a->u.obj->obj == b->u.obj->obj;
    case GSER_KIND_SERIALIZED: {
        const gser_serialized_t *sa = a->u.ser, *sb = b->u.ser;
        if (strcmp(sa->type_name, sb->type_name) || strcmp(sa->family, sb->family) || sa->version != sb->version ||
            sa->header_len != sb->header_len || sa->nframes != sb->nframes ||
            memcmp(sa->header, sb->header, sa->header_len) != 0)
            return false;
        for (size_t i = 0; i < sa->nframes; i++) {
            const gser_frame_t *fa = &sa->frames[i], *fb = &sb->frames[i];
            if (fa->size != fb->size || fa->memory != fb->memory)
                return false;
            if (fa->memory == GSER_MEMORY_HOST ? fa->size && memcmp(fa->data, fb->data, fa->size)
                                               : fa->data != fb->data)
                return false;
        }
        return true;
    }
    }
    return false;
}
