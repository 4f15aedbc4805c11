#include <stdlib.h>

#include "pincache.h"

void devl_pincache_init(devl_pincache_t *c, size_t budget)
{
    *c = (devl_pincache_t){.budget = budget};
    pthread_mutex_init(&c->lock, NULL);
}

static int class_of(size_t size)
{
    int k = 0;
    while (k < DEVL_PIN_CLASSES - 1 && ((size_t)DEVL_PIN_MIN << k) < size)
        k++;
    return k;
}

size_t devl_pincache_class_size(size_t size)
{
    size_t cs = (size_t)DEVL_PIN_MIN << class_of(size);
    return cs >= size ? cs : 0;
}

void *devl_pincache_get(devl_pincache_t *c, size_t size)
{
    int k = class_of(size);
    void *p = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->count[k]) {
        p = c->blocks[k][--c->count[k]];
        c->bytes -= (size_t)DEVL_PIN_MIN << k;
    }
    pthread_mutex_unlock(&c->lock);
    return p;
}

bool devl_pincache_put(devl_pincache_t *c, void *p, size_t size)
{
    int k = class_of(size);
    size_t cs = (size_t)DEVL_PIN_MIN << k;
    bool kept = false;
    pthread_mutex_lock(&c->lock);
    if (c->bytes + cs <= c->budget) {
        if (c->count[k] == c->cap[k]) {
            size_t cap = c->cap[k] ? 2 * c->cap[k] : 8;
            void **b = realloc(c->blocks[k], cap * sizeof *b);
            if (b) {
                c->blocks[k] = b;
                c->cap[k] = cap;
            }
        }
        if (c->count[k] < c->cap[k]) {
            c->blocks[k][c->count[k]++] = p;
            c->bytes += cs;
            kept = true;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return kept;
}

void devl_pincache_drain(devl_pincache_t *c, void (*release)(void *p, size_t size))
{
    for (int k = 0; k < DEVL_PIN_CLASSES; k++) {
        for (size_t i = 0; i < c->count[k]; i++)
            release(c->blocks[k][i], (size_t)DEVL_PIN_MIN << k);
        free(c->blocks[k]);
    }
    pthread_mutex_destroy(&c->lock);
    *c = (devl_pincache_t){0};
}

gser_status_t devl_pincache_alloc(devl_pincache_t *c, size_t size, devl_pin_alloc_fn alloc, void *arg, void **ptr)
{
    size_t csize = devl_pincache_class_size(size);
    if (!csize)
        return GSER_ERR_NO_MEMORY;
    void *p = devl_pincache_get(c, size);
    if (p) {
        *ptr = p;
        return GSER_OK;
    }
    return alloc(arg, csize, ptr);
}

void devl_pincache_free(devl_pincache_t *c, void *p, size_t size, devl_pin_release_fn release, void *arg)
{
    if (!devl_pincache_put(c, p, size))
        release(arg, p);
}
