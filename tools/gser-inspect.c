/* gser-inspect: print a flattened gser message as an indented tree.
 *
 *   gser-inspect [--items N] FILE|-
 *
 * No type needs to be registered: every typed object is kept serialized and
 * its sub-header decoded for display only. Malformed input gives one line on
 * stderr and exit status 1; usage and I/O errors exit with 2.
 *
 * Hostile files are expected: the reader checks the prefix and the size
 * table before it reads on and never reads past what the table declares
 * (gser_deserialize_fd), objects nested in objects count against the depth
 * limit, every name and string is printed escaped, and the output grows with
 * the input, not faster (at most --items children per container, strings
 * cut short, indentation bounded by the depth limit).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gser/gser.h>

static size_t max_items = 8;
static const gser_frame_t *frames;
static size_t nframes;

static void indent(int depth)
{
    for (int i = 0; i < depth; i++)
        fputs("  ", stdout);
}

/* Like a str value: quoted, with quotes, backslashes, control and non-ASCII
 * bytes escaped, so that no byte of the input reaches the terminal as is. */
static void print_quoted(const char *s, size_t n, size_t max)
{
    putchar('"');
    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
    if (n > max)
        printf("...(%zu bytes)", n);
}

/* "frame N" for data inside a frame of the message, "inline" otherwise. The
 * frames of a flattened message lie in one buffer in order: a binary search,
 * so that a message of many buffers and frames prints in n log n. */
static bool decompressed; /* some frames have buffers of their own: not in order */

static void print_where(const void *p, size_t n)
{
    const char *c = p;
    for (size_t i = 1; decompressed && c && i < nframes; i++) {
        const char *f = frames[i].data;
        if (c >= f && c + n <= f + frames[i].size) {
            printf("frame %zu", i);
            if (c != f)
                printf(" +%td", c - f);
            return;
        }
    }
    size_t lo = 1, hi = decompressed ? 1 : nframes; /* the last frame starting at or before p is in [lo - 1, hi) */
    while (c && lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((const char *)frames[mid].data <= c)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (c && lo > 1) {
        const char *f = frames[lo - 1].data;
        if (c + n <= f + frames[lo - 1].size) {
            printf("frame %zu", lo - 1);
            if (c != f)
                printf(" +%td", c - f);
            return;
        }
    }
    printf(n ? "inline" : "empty");
}

/* Extents or strides as Python prints a tuple. */
static void print_dims(const int64_t *v, uint32_t n)
{
    printf("(");
    for (uint32_t i = 0; i < n; i++)
        printf("%s%" PRId64, i ? ", " : "", v[i]);
    printf(n == 1 ? ",)" : ")");
}

/* The header's wire version (the decoder accepted it: 1 to 3, in any
 * msgpack integer width, right after the 7 magic bytes). */
static unsigned header_version(const gser_frame_t *hdr)
{
    const unsigned char *p = hdr->data;
    if (p[7] < 0x80)
        return p[7];
    /* uint8..uint64 (cc..cf) and int8..int64 (d0..d3): the low byte is last */
    return (p[7] >= 0xcc && p[7] <= 0xd3) ? p[7 + (1u << (p[7] & 3))] : 0;
}

static void print_scalar(const gser_value_t *v)
{
    bool b;
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
    size_t n;
    const void *p;
    switch (gser_value_get_kind(v)) {
    case GSER_KIND_NIL: printf("nil"); break;
    case GSER_KIND_BOOL: gser_value_get_bool(v, &b); printf(b ? "true" : "false"); break;
    case GSER_KIND_INT: gser_value_get_int(v, &i); printf("%" PRId64, i); break;
    case GSER_KIND_UINT: gser_value_get_uint(v, &u); printf("%" PRIu64 "u", u); break;
    case GSER_KIND_FLOAT: gser_value_get_float(v, &d); printf("%.17g", d); break;
    case GSER_KIND_STR: gser_value_get_str(v, &s, &n); print_quoted(s, n, 60); break;
    case GSER_KIND_BYTES:
        gser_value_get_bytes(v, &p, &n);
        printf("bytes(%zu) b", n);
        print_quoted(p, n, 24);
        break;
    default: printf("%s", gser_kind_str(gser_value_get_kind(v))); break;
    }
}

static void print_array_elems(gser_kind_t k, const void *data, size_t count)
{
    printf("[");
    for (size_t i = 0; i < count && i < max_items; i++) {
        if (i)
            printf(", ");
        const char *c = (const char *)data;
        switch (k) {
        case GSER_KIND_BOOL: printf(c[i] ? "true" : "false"); break;
        case GSER_KIND_INT: printf("%" PRId64, ((const int64_t *)data)[i]); break;
        case GSER_KIND_UINT: printf("%" PRIu64, ((const uint64_t *)data)[i]); break;
        default: printf("%.17g", ((const double *)data)[i]); break;
        }
    }
    if (count > max_items)
        printf(", ... %zu more", count - max_items);
    printf("]");
}

static int print_value(gser_msg_t *msg, gser_value_t *v, int depth);

static int print_children(gser_msg_t *msg, gser_value_t *v, int depth)
{
    gser_kind_t k = gser_value_get_kind(v);
    size_t n = gser_value_get_len(v);
    for (size_t i = 0; i < n; i++) {
        if (i == max_items && n > max_items + 1) {
            indent(depth);
            printf("... %zu more\n", n - i);
            break;
        }
        gser_value_t *key = NULL, *val = NULL;
        if (k == GSER_KIND_MAP)
            gser_map_get_at(v, i, &key, &val);
        else if (gser_list_get(v, i, &val) != GSER_OK)
            return -1;
        indent(depth);
        if (key) {
            print_scalar(key);
            printf(": ");
        } else {
            printf("[%zu] ", i);
        }
        if (print_value(msg, val, depth) != 0)
            return -1;
    }
    return 0;
}

static int print_value(gser_msg_t *msg, gser_value_t *v, int depth)
{
    gser_kind_t k = gser_value_get_kind(v);
    switch (k) {
    case GSER_KIND_LIST:
    case GSER_KIND_TUPLE: {
        gser_kind_t ek;
        const void *data;
        size_t count;
        if (gser_list_get_array(v, &ek, &data, &count) == GSER_OK) {
            printf("%s array<%s> n=%zu (%zu bytes, ", gser_kind_str(k), gser_kind_str(ek), count,
                   count * (ek == GSER_KIND_BOOL ? 1 : 8));
            print_where(data, count);
            printf(") ");
            print_array_elems(ek, data, count);
            printf("\n");
            return 0;
        }
        printf("%s n=%zu\n", gser_kind_str(k), gser_value_get_len(v));
        return print_children(msg, v, depth + 1);
    }
    case GSER_KIND_MAP:
        printf("map n=%zu\n", gser_value_get_len(v));
        return print_children(msg, v, depth + 1);
    case GSER_KIND_BUFFER: {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        gser_value_get_buffer(v, &d);
        printf("buffer %s", gser_dtype_str(d.dtype));
        if (d.ndim) {
            printf(" shape=");
            print_dims(d.shape, d.ndim);
        }
        int64_t off = 0;
        size_t span = d.nbytes;
        if (d.strides) {
            printf(" strides=");
            print_dims(d.strides, d.ndim);
            gser_buffer_get_span(&d, &off, &span); /* the decoder checked the layout */
        }
        printf(" %zu bytes", d.nbytes);
        if (d.strides)
            printf(" (span %zu)", span);
        printf(" %s, ", gser_memory_str(d.memory));
        print_where(span ? (const char *)d.data + off : d.data, span);
        printf("\n");
        return 0;
    }
    case GSER_KIND_SERIALIZED: {
        gser_serialized_info_t info = GSER_SERIALIZED_INFO_INIT;
        gser_value_get_serialized(v, &info);
        printf("object type=");
        print_quoted(info.type_name, strlen(info.type_name), 255);
        printf(" family=");
        print_quoted(info.family, strlen(info.family), 63);
        printf(" version=%u frames=%zu sub-header=%zu bytes\n", info.version, info.nframes, info.header_len);
        gser_value_t *tree;
        if (gser_value_decode_serialized(msg, v, &tree) != GSER_OK)
            return -1;
        indent(depth + 1);
        printf("= ");
        return print_value(msg, tree, depth + 1);
    }
    default:
        if (k != GSER_KIND_NIL)
            printf("%s ", gser_kind_str(k));
        print_scalar(v);
        printf("\n");
        return 0;
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: gser-inspect [--items N] FILE|-\n"
                    "Print a flattened gser message (header, frame table, value tree).\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--items") == 0 && i + 1 < argc) {
            char *end;
            unsigned long n = strtoul(argv[++i], &end, 10);
            if (*end || n == 0)
                return usage();
            max_items = n;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage();
            return 0;
        } else if (!path) {
            path = argv[i];
        } else {
            return usage();
        }
    }
    if (!path)
        return usage();
    int fd = strcmp(path, "-") == 0 ? STDIN_FILENO : open(path, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "gser-inspect: %s: %s\n", path, strerror(errno));
        return 2;
    }
    gser_context_options_t opts = GSER_CONTEXT_OPTIONS_INIT;
    opts.trace = -1;
    opts.device_backend = "none"; /* a file holds host frames: no device is needed, whatever GSER_DEVICE says */
    gser_context_t *ctx;
    if (gser_context_create(&opts, &ctx) != GSER_OK) {
        fprintf(stderr, "gser-inspect: cannot create a context: %s\n", gser_context_get_last_error(NULL));
        return 2;
    }
    gser_deserialize_options_t dopts = GSER_DESERIALIZE_OPTIONS_INIT;
    /* A file is mapped: only the pages printed are read, whatever its size. */
    dopts.flags = GSER_DESERIALIZE_KEEP_SERIALIZED | GSER_DESERIALIZE_ALLOW_UNKNOWN | GSER_DESERIALIZE_MMAP;
    gser_msg_t *msg;
    gser_status_t st = gser_deserialize_fd(ctx, fd, &dopts, &msg);
    if (fd != STDIN_FILENO)
        close(fd);
    if (st != GSER_OK) {
        const char *detail = gser_context_get_last_error(ctx);
        fprintf(stderr, "gser-inspect: %s: %s%s%s\n", path, gser_status_str(st), *detail ? ": " : "", detail);
        gser_context_destroy(ctx);
        return st == GSER_ERR_IO ? 2 : 1;
    }
    frames = gser_msg_get_frames(msg, &nframes);
    printf("gser message, wire format %u: header %zu bytes, %zu data frames\n", header_version(&frames[0]),
           frames[0].size, nframes - 1);
    size_t total = frames[0].size, total_raw = frames[0].size;
    for (size_t i = 1; i < nframes; i++) {
        int codec = GSER_COMPRESSION_NONE;
        size_t wire = frames[i].size;
        gser_msg_get_frame_codec(msg, i, &codec, &wire);
        size_t chunk = 0, nchunks = 0, squeezed = 0;
        gser_msg_get_frame_chunks(msg, i, &chunk, &nchunks, &squeezed);
        if (codec != GSER_COMPRESSION_NONE && nchunks) {
            decompressed = true;
            printf("  frame %zu: %zu bytes, %s of %zu bytes in %zu chunks of %zu bytes, %zu compressed\n", i, wire,
                   codec == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd", frames[i].size, nchunks, chunk, squeezed);
        } else if (codec != GSER_COMPRESSION_NONE) {
            decompressed = true;
            printf("  frame %zu: %zu bytes, %s of %zu bytes\n", i, wire,
                   codec == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd", frames[i].size);
        } else {
            printf("  frame %zu: %zu bytes\n", i, frames[i].size);
        }
        total += wire;
        total_raw += frames[i].size;
    }
    if (decompressed)
        printf("  total: %zu bytes, %zu uncompressed\n", total, total_raw);
    else
        printf("  total: %zu bytes\n", total);
    printf("$ ");
    int rc = print_value(msg, gser_msg_get_root(msg), 0);
    if (rc != 0)
        fprintf(stderr, "gser-inspect: %s: %s\n", path, gser_context_get_last_error(ctx));
    gser_msg_destroy(msg);
    gser_context_destroy(ctx);
    return rc ? 1 : 0;
}
