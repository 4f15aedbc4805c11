/* Paths of values ("$.tasks[3].payload") for error messages and traces. */
#include <ctype.h>
#include <inttypes.h>
#include <string.h>

#include "internal.h"

typedef struct sbuf {
    char *p;
    size_t cap;
    size_t len;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n && b->len + 1 < b->cap; i++)
        b->p[b->len++] = s[i];
    b->p[b->len] = '\0';
}

static void puts_(sbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

static void put_quoted(sbuf_t *b, const char *s, size_t n, size_t max)
{
    put(b, "\"", 1);
    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(b, esc, 2);
        } else if (c < 0x20 || c >= 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            puts_(b, esc);
        } else {
            put(b, (const char *)&c, 1);
        }
    }
    if (n > max)
        puts_(b, "...");
    put(b, "\"", 1);
}

static bool is_ident(const char *s, size_t n)
{
    if (n == 0 || n > 64 || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
            return false;
    return true;
}

static void scalar_put(sbuf_t *b, const gser_value_t *v)
{
    char tmp[64];
    switch (v->kind) {
    case GSER_KIND_NIL: puts_(b, "nil"); break;
    case GSER_KIND_BOOL: puts_(b, v->u.b ? "true" : "false"); break;
    case GSER_KIND_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v->u.i); puts_(b, tmp); break;
    case GSER_KIND_UINT: snprintf(tmp, sizeof tmp, "%" PRIu64, v->u.u); puts_(b, tmp); break;
    case GSER_KIND_FLOAT: snprintf(tmp, sizeof tmp, "%.17g", v->u.f); puts_(b, tmp); break;
    case GSER_KIND_STR: put_quoted(b, v->u.s.ptr, v->u.s.len, 40); break;
    case GSER_KIND_BYTES:
        put(b, "b", 1);
        put_quoted(b, v->u.s.ptr, v->u.s.len, 16);
        break;
    default: puts_(b, gser_kind_str((gser_kind_t)v->kind)); break;
    }
}

void gser__scalar_format(const gser_value_t *v, char *buf, size_t cap)
{
    sbuf_t b = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    scalar_put(&b, v);
}

void gser__quote_format(const char *s, size_t n, char *buf, size_t cap)
{
    sbuf_t b = {buf, cap, 0};
    if (cap == 0)
        return;
    buf[0] = '\0';
    put_quoted(&b, s, n, 64);
}

void gser__dims_format(const int64_t *v, uint32_t n, char *buf, size_t cap)
{
    sbuf_t b = {buf, cap, 0};
    if (cap == 0)
        return;
    put(&b, "(", 1);
    for (uint32_t i = 0; i < n; i++) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "%s%" PRId64, i ? ", " : "", v[i]);
        puts_(&b, tmp);
    }
    puts_(&b, n == 1 ? ",)" : ")");
}

void gser__layout_format(const gser_buffer_desc_t *d, size_t span, char *buf, size_t cap)
{
    sbuf_t b = {buf, cap, 0};
    if (cap == 0)
        return;
    buf[0] = '\0';
    if (!d->strides)
        return;
    char tmp[128];
    gser__dims_format(d->strides, d->ndim, tmp, sizeof tmp);
    puts_(&b, " strides=");
    puts_(&b, tmp);
    snprintf(tmp, sizeof tmp, " span=%zu", span);
    puts_(&b, tmp);
}

void gser__path_format(const path_t *p, char *buf, size_t cap)
{
    sbuf_t b = {buf, cap, 0};
    if (cap == 0)
        return;
    buf[0] = '\0';
    puts_(&b, "$");
    for (size_t i = 0; i < p->len; i++) {
        const path_seg_t *s = &p->seg[i];
        if (!s->key) {
            char tmp[32];
            snprintf(tmp, sizeof tmp, "[%zu]", s->index);
            puts_(&b, tmp);
        } else if (s->key->kind == GSER_KIND_STR && is_ident(s->key->u.s.ptr, s->key->u.s.len)) {
            put(&b, ".", 1);
            put(&b, s->key->u.s.ptr, s->key->u.s.len);
        } else {
            put(&b, "[", 1);
            scalar_put(&b, s->key);
            put(&b, "]", 1);
        }
    }
    if (b.len + 1 >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
}

void gser__trace_line(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    flockfile(f);
    fputs("[gser] ", f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    funlockfile(f);
    va_end(ap);
}

void gser__path_vmessage(const path_t *p, const char *sep, char *buf, size_t cap, const char *fmt, va_list ap)
{
    char path[256];
    gser__path_format(p, path, sizeof path);
    int n = snprintf(buf, cap, "%s%s", path, sep);
    if (n >= 0 && (size_t)n < cap)
        vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
}
