/* Leaf helpers every part of the plugin uses: the monotonic clock and the
 * tables that find endpoints and connections by id. They call nothing else
 * of the plugin but its error text (status.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

double gux_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- tables of objects by id ------------------------------------------------------- */

#define GUX_SLOT_BITS 20
#define GUX_SLOT_MASK ((1u << GUX_SLOT_BITS) - 1)

gser_status_t gux_slot_take(gux_slots_t *t, void *item, uint32_t *id)
{
    size_t i = t->hint;
    while (i < t->n && t->items[i])
        i++;
    if (i == t->n) {
        if (t->n >= GUX_SLOT_MASK - 1)
            return gux_fail(GSER_ERR_NO_MEMORY, "too many endpoints or connections on one worker");
        size_t cap = t->n ? t->n * 2 : 16;
        void **s = realloc(t->items, cap * sizeof *s);
        if (!s)
            return gux_fail(GSER_ERR_NO_MEMORY, "worker table: out of memory");
        t->items = s;
        uint32_t *g = realloc(t->gen, cap * sizeof *g);
        if (!g)
            return gux_fail(GSER_ERR_NO_MEMORY, "worker table: out of memory");
        t->gen = g;
        memset(s + t->n, 0, (cap - t->n) * sizeof *s);
        memset(g + t->n, 0, (cap - t->n) * sizeof *g);
        t->n = cap;
    }
    t->items[i] = item;
    t->hint = i + 1;
    /* A generation in the high bits keeps a reused slot from catching what
     * was meant for its previous owner. */
    *id = ((t->gen[i] & 0xfffu) << GUX_SLOT_BITS) | (uint32_t)(i + 1);
    return GSER_OK;
}

void gux_slot_put(gux_slots_t *t, uint32_t id)
{
    size_t i = (size_t)(id & GUX_SLOT_MASK) - 1;
    if ((id & GUX_SLOT_MASK) == 0 || i >= t->n || !t->items[i])
        return;
    t->items[i] = NULL;
    t->gen[i]++;
    if (i < t->hint)
        t->hint = i;
}

void *gux_slot_get(const gux_slots_t *t, uint32_t id)
{
    size_t i = (size_t)(id & GUX_SLOT_MASK) - 1;
    if ((id & GUX_SLOT_MASK) == 0 || i >= t->n || !t->items[i] || (t->gen[i] & 0xfffu) != id >> GUX_SLOT_BITS)
        return NULL;
    return t->items[i];
}

void gux_slot_set(gux_slots_t *t, uint32_t id, void *item)
{
    size_t i = (size_t)(id & GUX_SLOT_MASK) - 1;
    if ((id & GUX_SLOT_MASK) != 0 && i < t->n)
        t->items[i] = item;
}

void gux_slots_free(gux_slots_t *t)
{
    free(t->items);
    free(t->gen);
    t->items = NULL;
    t->gen = NULL;
    t->n = t->hint = 0;
}
