/* A bump allocator with release callbacks: one release frees a message. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CHUNK_MIN 8192
#define CHUNK_MAX (1u << 20)

void gser__arena_init(arena_t *a, arena_chunk_t *first, size_t first_size)
{
    first->next = NULL;
    first->size = first_size - sizeof(arena_chunk_t);
    first->used = 0;
    a->head = first;
    a->next_size = CHUNK_MIN;
    a->cleanups = NULL;
    a->total = a->budget = 0;
    a->over = false;
}

/* Whether n more heap bytes fit the budget; counts them when they do. */
static bool arena_take(arena_t *a, size_t n)
{
    if (a->budget && (a->total > a->budget || n > a->budget - a->total)) {
        a->over = true;
        return false;
    }
    a->total += n;
    return true;
}

void gser__arena_run_cleanups(arena_t *a)
{
    for (cleanup_t *c = a->cleanups; c; c = c->next)
        c->fn(c->arg);
    a->cleanups = NULL;
}

void gser__arena_free(arena_t *a, arena_chunk_t *first)
{
    arena_chunk_t *c = a->head;
    while (c) {
        arena_chunk_t *next = c->next;
        if (c != first)
            free(c);
        c = next;
    }
    a->head = NULL;
}

void *gser__arena_alloc_slow(arena_t *a, size_t size)
{
    arena_chunk_t *h = a->head;
    if (size > SIZE_MAX - sizeof(arena_chunk_t) - 16)
        return NULL;
    /* Large requests get a chunk of their own behind the head, so the head's
     * free space is not abandoned. */
    if (size >= a->next_size / 4) {
        if (!arena_take(a, sizeof(arena_chunk_t) + size))
            return NULL;
        arena_chunk_t *c = malloc(sizeof(arena_chunk_t) + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = size;
        c->next = h->next;
        h->next = c;
        return c->data;
    }
    size_t csize = a->next_size;
    if (!arena_take(a, sizeof(arena_chunk_t) + csize))
        return NULL;
    if (a->next_size < CHUNK_MAX)
        a->next_size *= 2;
    arena_chunk_t *c = malloc(sizeof(arena_chunk_t) + csize);
    if (!c)
        return NULL;
    c->size = csize;
    c->used = size;
    c->next = h;
    a->head = c;
    return c->data;
}

gser_status_t gser__arena_on_release(arena_t *a, void (*fn)(void *), void *arg)
{
    cleanup_t *c = gser__arena_alloc(a, sizeof *c, alignof(cleanup_t));
    if (!c)
        return GSER_ERR_NO_MEMORY;
    c->fn = fn;
    c->arg = arg;
    c->next = a->cleanups;
    a->cleanups = c;
    return GSER_OK;
}

static void free_vec(void *arg)
{
    free(*(void **)arg);
    *(void **)arg = NULL;
}

gser_status_t gser__arena_vec_grow(arena_t *a, void **ptr, size_t *cap, size_t elem_size, size_t need)
{
    size_t ncap = *cap ? *cap : 4;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return GSER_ERR_NO_MEMORY;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem_size)
        return GSER_ERR_NO_MEMORY;
    /* Where a vector lives follows from its size alone: small ones in the
     * arena (no malloc, nothing to free), large ones on the heap, freed when
     * the arena is released. */
    size_t old_bytes = *cap * elem_size, new_bytes = ncap * elem_size;
    void *np;
    if (new_bytes <= ARENA_VEC_HEAP) {
        if (!(np = gser__arena_alloc(a, new_bytes, 16)))
            return GSER_ERR_NO_MEMORY;
        if (old_bytes)
            memcpy(np, *ptr, old_bytes);
    } else if (!arena_take(a, old_bytes > ARENA_VEC_HEAP ? new_bytes - old_bytes : new_bytes)) {
        return GSER_ERR_NO_MEMORY;
    } else if (old_bytes <= ARENA_VEC_HEAP) {
        if (!(np = malloc(new_bytes)))
            return GSER_ERR_NO_MEMORY;
        if (gser__arena_on_release(a, free_vec, ptr) != GSER_OK) {
            free(np);
            return GSER_ERR_NO_MEMORY;
        }
        if (old_bytes)
            memcpy(np, *ptr, old_bytes);
    } else if (!(np = realloc(*ptr, new_bytes))) {
        return GSER_ERR_NO_MEMORY;
    }
    *ptr = np;
    *cap = ncap;
    return GSER_OK;
}
