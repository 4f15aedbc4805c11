/* libFuzzer target: a flattened gser message read from a file and a pipe.
 *
 * The input is put in an in-memory file, then read by gser_deserialize_fd
 * (into its own buffer, and mapped with GSER_DESERIALIZE_MMAP) and through a
 * pipe: each must fail with the status gser_deserialize_flat gives the same
 * bytes, and what loads must write again the same bytes as what
 * gser_deserialize_flat loads (which reads every byte). Any difference aborts. Run:
 * fuzz_file -max_total_time=30 tests/fuzz/corpus */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"

static gser_context_t *ctx;

/* Objects stay serialized: a loaded object compares by pointer, its bytes do not. */
#define FLAGS (GSER_DESERIALIZE_KEEP_SERIALIZED | GSER_DESERIALIZE_ALLOW_UNKNOWN)

static gser_status_t from_fd(int fd, unsigned flags, gser_msg_t **out)
{
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = flags | FLAGS;
    return gser_deserialize_fd(ctx, fd, &o, out);
}

/* The message written again, flattened: what it holds, byte for byte
 * (reading every byte of it). NULL when it cannot be written. */
static unsigned char *flat_of(gser_msg_t *msg, size_t *len)
{
    gser_frames_t *f = NULL;
    unsigned char *buf = gser_serialize(ctx, msg, NULL, &f) == GSER_OK ? fuzz_flatten(f, len) : NULL;
    gser_frames_destroy(f);
    return buf;
}

static void same(gser_status_t want, gser_msg_t *ref, gser_status_t got, gser_msg_t *msg)
{
    if (got != want)
        abort();
    if (want == GSER_OK) {
        size_t la = 0, lb = 0;
        unsigned char *a = flat_of(ref, &la), *b = flat_of(msg, &lb);
        if (!a != !b || la != lb || (a && memcmp(a, b, la) != 0))
            abort();
        free(a);
        free(b);
    }
    gser_msg_destroy(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx)
        ctx = fuzz_context(NULL);
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = FLAGS;
    gser_msg_t *ref = NULL;
    gser_status_t want = gser_deserialize_flat(ctx, size ? (const void *)data : "", size, NULL, NULL, &o, &ref);

    int fd = memfd_create("fuzz_file", MFD_CLOEXEC);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    static const unsigned modes[] = {0, GSER_DESERIALIZE_MMAP};
    for (int i = 0; i < 2; i++) {
        gser_msg_t *msg = NULL;
        if (lseek(fd, 0, SEEK_SET) != 0)
            abort();
        same(want, ref, from_fd(fd, modes[i], &msg), msg);
    }
    close(fd);

    /* A pipe holds the whole input (up to its 64 KiB buffer): no writer
     * thread needed. A stream has no end to check, so bytes after a message
     * are not an error there; only inputs without them are compared. */
    int p[2];
    if (size <= 65536 && pipe(p) == 0) {
        if (size && write(p[1], data, size) != (ssize_t)size)
            abort();
        close(p[1]);
        gser_msg_t *msg = NULL;
        uint64_t need = 0;
        gser_status_t got = from_fd(p[0], 0, &msg);
        if (want != GSER_ERR_FORMAT || gser_flat_get_need(ctx, data, size, NULL, &need) || need >= size)
            same(want, ref, got, msg);
        else
            gser_msg_destroy(msg);
        close(p[0]);
    }
    gser_msg_destroy(ref);
    return 0;
}
