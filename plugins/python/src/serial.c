/* Whole messages: Python objects serialized into an owner's frames, and a
 * deserialized message's objects; what dumps/loads, to_bytes/from_bytes
 * (module.c), gser.dump/load (flatio.c) and the UCX bindings share.
 *
 * Below the callers and above the encoder and decoder: it calls down only.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <string.h>

/* ---- serializing ---------------------------------------------------------------------- */

/* families: None (the default order), one str, or a sequence of str. */
typedef struct fam_list {
    PyObject *keep; /* what the names point into */
    const char *names[33];
    size_t n;
} fam_list_t;

/* For the flattened form, which holds host memory only: "device" is left
 * out and "host" added at the end when missing, so that device buffers are
 * staged into host frames. */
static void families_flat(fam_list_t *f)
{
    size_t n = 0;
    bool host = false;
    for (size_t i = 0; i < f->n; i++) {
        if (strcmp(f->names[i], "device") == 0)
            continue;
        host |= strcmp(f->names[i], "host") == 0;
        f->names[n++] = f->names[i];
    }
    if (!host)
        f->names[n++] = "host";
    f->n = n;
}

static int families_parse(PyObject *families, bool flat, fam_list_t *f)
{
    f->keep = NULL;
    f->n = 0;
    if (!families || families == Py_None) {
        if (flat) {
            f->names[0] = "host";
            f->n = 1;
        }
        return 0;
    }
    PyObject *seq;
    if (PyUnicode_Check(families))
        seq = PyTuple_Pack(1, families);
    else
        seq = PySequence_Tuple(families);
    if (!seq) {
        PyErr_SetString(PyExc_TypeError, "families must be a str or a sequence of str");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n == 0 || n > 32) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "families: %zd names given (1..32 allowed)", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyTuple_GET_ITEM(seq, i);
        const char *name = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
        if (!name) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "families must be a str or a sequence of str");
            return -1;
        }
        f->names[i] = name;
    }
    f->keep = seq;
    f->n = (size_t)n;
    if (flat)
        families_flat(f);
    return 0;
}

int pg_compression_parse(PyObject *o, int *out)
{
    if (!o || o == Py_None || o == Py_False) {
        *out = GSER_COMPRESSION_NONE;
        return 0;
    }
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (s && strcmp(s, "lz4") == 0)
        *out = GSER_COMPRESSION_LZ4;
    else if (s && strcmp(s, "zstd") == 0)
        *out = GSER_COMPRESSION_ZSTD;
    else if (s && strcmp(s, "auto") == 0)
        *out = GSER_COMPRESSION_AUTO;
    else {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "compression must be None, \"lz4\", \"zstd\" or \"auto\", not %R", o);
        return -1;
    }
    return 0;
}

static int threshold_parse(PyObject *o, double *out)
{
    if (!o || o == Py_None) {
        *out = 0;
        return 0;
    }
    double t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred())
        return -1;
    if (!(t > 0 && t <= 1)) {
        PyErr_Format(PyExc_ValueError, "compression_threshold must be in (0, 1], not %R", o);
        return -1;
    }
    *out = t;
    return 0;
}

static int chunk_parse(PyObject *o, size_t *out)
{
    *out = 0;
    if (!o || o == Py_None)
        return 0;
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "compression_chunk_size must be an int or None, not %R", o);
        return -1;
    }
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (overflow || (n != 0 && (n < (long long)GSER_COMPRESS_CHUNK_MIN || n > (long long)GSER_COMPRESS_CHUNK_MAX))) {
        PyErr_Format(PyExc_ValueError, "compression_chunk_size must be 0 (whole frames) or %zu to %zu bytes, not %R",
                     GSER_COMPRESS_CHUNK_MIN, GSER_COMPRESS_CHUNK_MAX, o);
        return -1;
    }
    *out = (size_t)n;
    return 0;
}

int pg_squeeze_parse(PyObject *compression, PyObject *threshold, PyObject *chunk, int *codec,
                     pg_encode_options_t *eo)
{
    if (pg_compression_parse(compression, codec) < 0 || threshold_parse(threshold, &eo->compression_threshold) < 0 ||
        chunk_parse(chunk, &eo->compression_chunk_size) < 0)
        return -1;
    return 0;
}

PgOwner *pg_serialize(pg_state_t *s, PyObject *obj, PyObject *families, const pg_encode_options_t *eo, bool flat,
                      int compression)
{
    fam_list_t fam;
    if (families_parse(families, flat, &fam) < 0)
        return NULL;
    PgOwner *owner = pg_owner_new(s);
    if (!owner) {
        Py_XDECREF(fam.keep);
        return NULL;
    }
    size_t work = 0;
    if (pg_encode(owner, obj, eo, &work) < 0)
        goto fail;
    bool release = work >= PG_GIL_WORK || compression != GSER_COMPRESSION_NONE;
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = compression;
    so.compression_threshold = eo->compression_threshold;
    so.compression_chunk_size = eo->compression_chunk_size;
    so.narrow_ints = true; /* a list's ints are copied out of their boxes anyway */
    if (fam.n) {
        so.families = fam.names;
        so.nfamilies = fam.n;
    }
    gser_status_t st;
    gser_frames_t *frames = NULL;
    if (release) {
        Py_BEGIN_ALLOW_THREADS
        st = gser_serialize(pg_ctx, owner->msg, &so, &frames);
        Py_END_ALLOW_THREADS
    } else {
        st = gser_serialize(pg_ctx, owner->msg, &so, &frames);
    }
    if (st) {
        pg_raise(s, st, true, "gser_serialize");
        goto fail;
    }
    /* Packing and device-to-host staging run on a stream: frames handed to
     * Python must be complete. */
    if (gser_frames_query(frames) != GSER_OK) { /* work on a stream, or an error wait reports */
        Py_BEGIN_ALLOW_THREADS
        st = gser_frames_wait(frames);
        Py_END_ALLOW_THREADS
    }
    if (st) {
        gser_frames_destroy(frames);
        pg_raise(s, st, true, "gser_frames_wait");
        goto fail;
    }
    owner->frames = frames;
    Py_XDECREF(fam.keep);
    return owner;
fail:
    Py_XDECREF(fam.keep);
    Py_DECREF(owner);
    return NULL;
}

int pg_serialize_flat(pg_state_t *s, PyObject *obj, PyObject *families, int codec, const pg_encode_options_t *eo,
                      gser_flat_alloc_fn alloc, void *alloc_arg, size_t *written)
{
    fam_list_t fam;
    if (families_parse(families, true, &fam) < 0)
        return -1;
    PgOwner *owner = pg_owner_new(s);
    if (!owner) {
        Py_XDECREF(fam.keep);
        return -1;
    }
    int rc = -1;
    if (pg_encode(owner, obj, eo, NULL) == 0) {
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.compression = codec;
        so.compression_threshold = eo->compression_threshold;
        so.compression_chunk_size = eo->compression_chunk_size;
        so.narrow_ints = true; /* a list's ints are copied out of their boxes anyway */
        if (fam.n) {
            so.families = fam.names;
            so.nfamilies = fam.n;
        }
        gser_status_t st;
        Py_BEGIN_ALLOW_THREADS
        st = gser_serialize_flat(pg_ctx, owner->msg, &so, alloc, alloc_arg, written);
        Py_END_ALLOW_THREADS
        if (st)
            pg_raise(s, st, true, "gser_serialize_flat");
        else
            rc = 0;
    }
    Py_XDECREF(fam.keep);
    Py_DECREF(owner);
    return rc;
}

int pg_flat_prepare(pg_state_t *s, PyObject *obj, PyObject *families, PyObject *compression, PyObject *threshold,
                    PyObject *chunk, pg_flat_t *out)
{
    int codec;
    pg_encode_options_t eo = {0};
    if (pg_squeeze_parse(compression, threshold, chunk, &codec, &eo) < 0)
        return -1;
    PgOwner *owner = pg_serialize(s, obj, families, &eo, true, codec);
    if (!owner)
        return -1;
    size_t n = gser_frames_get_count(owner->frames);
    const gser_frame_t *fr = gser_frames_get_array(owner->frames);
    size_t size = 0;
    gser_status_t st = gser_flat_size(fr, n, &size);
    if (st) {
        Py_DECREF(owner);
        pg_raise(s, st, false, "gser_flat_size");
        return -1;
    }
    *out = (pg_flat_t){.owner = owner, .fr = fr, .n = n, .size = size};
    return 0;
}

/* ---- deserializing -------------------------------------------------------------------- */

/* Wait for the device copies gser made while deserializing (restored or
 * scattered buffers carry their event), so that the objects handed out need
 * no synchronization (their __cuda_array_interface__ has no stream). */
int pg_msg_wait(pg_state_t *s, gser_msg_t *msg)
{
    return pg_msg_wait_gil(s, msg, true);
}

int pg_msg_wait_gil(pg_state_t *s, gser_msg_t *msg, bool release)
{
    gser_status_t st;
    if (release) {
        Py_BEGIN_ALLOW_THREADS
        st = gser_msg_wait(msg);
        Py_END_ALLOW_THREADS
    } else {
        st = gser_msg_wait(msg);
    }
    if (st) {
        pg_raise(s, st, true, "gser_msg_wait");
        return -1;
    }
    return 0;
}

PyObject *pg_decode_msg_dask(PgOwner *owner, bool readonly, PyObject *dask_parts)
{
    if (pg_msg_wait(owner->state, owner->msg) < 0)
        return NULL;
    size_t n;
    const gser_frame_t *fr = gser_msg_get_frames(owner->msg, &n);
    pg_decode_ctx_t dc = {0};
    PyObject *out = NULL;
    if (pg_decode_ctx_init(&dc, owner, n) == 0) {
        dc.any_readonly = readonly;
        dc.dask_parts = dask_parts;
        for (size_t i = 0; i < n; i++)
            pg_decode_ctx_set_frame(&dc, i, &fr[i], readonly, NULL); /* no objects of their own */
        out = pg_decode(&dc, gser_msg_get_root(owner->msg));
    }
    if (out && dc.dask_msg) { /* (message,): a whole Dask message, not a list of Dask's frames */
        PyObject *t = PyTuple_Pack(1, out);
        Py_SETREF(out, t);
    }
    pg_decode_ctx_clear(&dc);
    return out;
}

PyObject *pg_decode_msg(PgOwner *owner, bool readonly)
{
    return pg_decode_msg_dask(owner, readonly, NULL);
}

PyObject *pg_load_finish(PgOwner *owner, gser_status_t st, gser_msg_t *msg, bool readonly, const char *what)
{
    if (st)
        return pg_raise(owner->state, st, true, what);
    owner->msg = msg;
    return pg_decode_msg(owner, readonly);
}
