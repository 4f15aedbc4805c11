/* libFuzzer target: a flattened message holding an Arrow table, from
 * untrusted bytes, on host memory and on the emulated device backend.
 *
 * Whatever the Arrow plugin accepts must be a table a consumer can read by
 * the Arrow spec without leaving its buffers: the target takes the table and
 * reads every buffer byte its schema implies (for the layouts it knows), so
 * ASan reports any range the plugin failed to check. Seeds: tests/fuzz/corpus-arrow. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gser/arrow.h>
#include <gser/gser.h>

static gser_context_t *ctxs[2];
static volatile unsigned sink;

/* Read n bytes at p (device memory through the backend). */
static void touch(gser_context_t *ctx, bool device, const void *p, int64_t n)
{
    if (n <= 0)
        return;
    if (!p)
        abort(); /* a buffer the layout needs was accepted as NULL */
    unsigned char *h = malloc((size_t)n);
    if (!h || gser_device_memcpy(ctx, h, GSER_MEMORY_HOST, p, device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST,
                                 (size_t)n, NULL) != GSER_OK)
        abort();
    for (int64_t i = 0; i < n; i++)
        sink += h[i];
    free(h);
}

static int64_t fixed_width(const char *f)
{
    if (!strcmp(f, "c") || !strcmp(f, "C"))
        return 1;
    if (!strcmp(f, "s") || !strcmp(f, "S") || !strcmp(f, "e"))
        return 2;
    if (!strcmp(f, "i") || !strcmp(f, "I") || !strcmp(f, "f") || !strcmp(f, "tdD"))
        return 4;
    if (!strcmp(f, "l") || !strcmp(f, "L") || !strcmp(f, "g") || !strcmp(f, "tdm") || !strncmp(f, "ts", 2) ||
        !strncmp(f, "tD", 2))
        return 8;
    if (!strncmp(f, "w:", 2))
        return atoi(f + 2);
    return 0;
}

/* Read a node of the table and its children by the layout of its format. */
static void read_node(gser_context_t *ctx, bool device, const struct ArrowArray *a, const struct ArrowSchema *s,
                      int depth)
{
    if (depth > 64 || a->length < 0 || a->offset < 0)
        abort();
    int64_t end = a->offset + a->length;
    const char *f = s->format;
    if (getenv("FUZZ_ARROW_DEBUG")) /* which node a crash is in */
        fprintf(stderr, "node %s len %lld off %lld nulls %lld nbuf %lld nchild %lld\n", f, (long long)a->length,
                (long long)a->offset, (long long)a->null_count, (long long)a->n_buffers, (long long)a->n_children);
    if (a->n_buffers > 0 && a->buffers[0] && a->null_count != 0)
        touch(ctx, device, a->buffers[0], (end + 7) / 8);
    int64_t w = fixed_width(f);
    if (s->dictionary && a->dictionary)
        read_node(ctx, device, a->dictionary, s->dictionary, depth + 1);
    if (w > 0) {
        touch(ctx, device, a->buffers[1], end * w);
    } else if (!strcmp(f, "b")) {
        touch(ctx, device, a->buffers[1], (end + 7) / 8);
    } else if (!strcmp(f, "u") || !strcmp(f, "z") || !strcmp(f, "U") || !strcmp(f, "Z") || !strcmp(f, "+l") ||
               !strcmp(f, "+L")) {
        int64_t ow = (f[0] == 'U' || f[0] == 'Z' || !strcmp(f, "+L")) ? 8 : 4;
        if (a->length == 0)
            return;
        unsigned char last[8] = {0};
        touch(ctx, device, a->buffers[1], (end + 1) * ow);
        if (gser_device_memcpy(ctx, last, GSER_MEMORY_HOST, (const char *)a->buffers[1] + end * ow,
                               device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST, (size_t)ow, NULL) != GSER_OK)
            abort();
        int64_t hi = 0;
        memcpy(&hi, last, (size_t)ow); /* little-endian */
        if (ow == 4)
            hi = (int32_t)hi;
        if (f[0] != '+')
            touch(ctx, device, a->buffers[2], hi);
        else if (a->n_children == 1 && s->n_children == 1 && a->children[0]->length < hi)
            abort(); /* the child must hold every value the offsets reach */
    }
    for (int64_t c = 0; c < a->n_children && c < s->n_children; c++)
        read_node(ctx, device, a->children[c], s->children[c], depth + 1);
}

static void walk(gser_context_t *ctx, gser_value_t *v, int depth)
{
    if (depth > 64)
        return;
    gser_kind_t k = gser_value_get_kind(v);
    if (k == GSER_KIND_OBJECT) {
        const char *type;
        if (gser_value_get_object(v, &type, NULL) == GSER_OK && !strcmp(type, GSER_ARROW_TYPE)) {
            struct ArrowDeviceArray da;
            struct ArrowSchema s;
            if (gser_arrow_take_value(v, NULL, &da, &s) == GSER_OK) {
                read_node(ctx, da.device_type == ARROW_DEVICE_CUDA, &da.array, &s, 0);
                da.array.release(&da.array);
                s.release(&s);
            }
        }
    } else if (k == GSER_KIND_LIST || k == GSER_KIND_TUPLE || k == GSER_KIND_MAP) {
        for (size_t i = 0; i < gser_value_get_len(v) && i < 64; i++) {
            gser_value_t *e = NULL;
            if (k == GSER_KIND_MAP)
                gser_map_get_at(v, i, NULL, &e);
            else
                gser_list_get(v, i, &e);
            if (e)
                walk(ctx, e, depth + 1);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctxs[0]) {
        static const char *const backends[2] = {"none", "emulated"};
        for (int i = 0; i < 2; i++) {
            static gser_limits_t lim = GSER_LIMITS_INIT;
            lim.max_nodes = 100000;
            lim.max_bytes = 1 << 24;
            gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
            o.trace = -1;
            o.limits = &lim;
            o.device_backend = backends[i];
            if (gser_context_create(&o, &ctxs[i]) || gser_arrow_register(ctxs[i]))
                abort();
        }
    }
    for (int i = 0; i < 2; i++) {
        gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
        o.flags = i ? GSER_DESERIALIZE_RESTORE_DEVICE : 0;
        gser_msg_t *msg = NULL;
        if (gser_deserialize_flat(ctxs[i], data, size, NULL, NULL, &o, &msg) != GSER_OK)
            continue;
        walk(ctxs[i], gser_msg_get_root(msg), 0);
        gser_msg_destroy(msg);
    }
    return 0;
}
