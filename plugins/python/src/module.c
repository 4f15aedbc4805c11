/* gser._gser: dumps/loads, to_bytes/from_bytes, GserError, DeviceFrame,
 * DeviceArray, ArrowArray.
 *
 *   header, frames = dumps(obj, families=("device", "host"), *, strict=False)
 *   obj = loads(header, frames, *, device=False)
 *   b = to_bytes(obj, families=("host",))
 *   obj = from_bytes(b, *, device=False)
 *
 * The core runs with the GIL released; everything it borrows is held by a
 * PgOwner for as long as it is used. Device copies the core makes while
 * deserializing are waited for before the objects are handed out.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdarg.h>
#include <string.h>

gser_context_t *pg_ctx;
PyObject *pg_GserError;
PyObject *pg_Declined;
PyObject *pg_GserUnsupported;

/* ---- errors ------------------------------------------------------------------------ */

static PyObject *status_name(gser_status_t st)
{
    const char *full = gser_status_str(st);
    const char *colon = strchr(full, ':');
    return PyUnicode_FromStringAndSize(full, colon ? colon - full : (Py_ssize_t)strlen(full));
}

PyObject *pg_make_exc(PyObject *exc, gser_status_t st, PyObject *text)
{
    if (exc != pg_GserError && exc != pg_GserUnsupported)
        return PyObject_CallOneArg(exc, text);
    PyObject *name = status_name(st);
    PyObject *msg = name ? PyUnicode_FromFormat("%U: %U", name, text) : NULL;
    PyObject *e = msg ? PyObject_CallOneArg(exc, msg) : NULL;
    PyObject *code = e ? PyLong_FromLong((long)st) : NULL;
    if (!code || PyObject_SetAttrString(e, "status", code) < 0 || PyObject_SetAttrString(e, "status_name", name) < 0 ||
        PyObject_SetAttrString(e, "detail", text) < 0)
        Py_CLEAR(e);
    Py_XDECREF(code);
    Py_XDECREF(msg);
    Py_XDECREF(name);
    return e;
}

PyObject *pg_text(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "backslashreplace");
}

PyObject *pg_raise_text(gser_status_t st, PyObject *text)
{
    if (!text)
        return NULL;
    if (st == GSER_ERR_NO_MEMORY) {
        PyErr_SetObject(PyExc_MemoryError, text);
    } else {
        PyObject *e = pg_make_exc(pg_GserError, st, text);
        if (e) {
            PyErr_SetObject(pg_GserError, e);
            Py_DECREF(e);
        }
    }
    Py_DECREF(text);
    return NULL;
}

PyObject *pg_raise(gser_status_t st, bool detail, const char *what)
{
    /* The detail may quote a type name or an Arrow format from the wire. */
    const char *d = detail ? gser_context_get_last_error(pg_ctx) : "";
    return pg_raise_text(st, *d ? pg_text(d)
                                : PyUnicode_FromFormat("%s: %s", what ? what : "gser", gser_status_str(st)));
}

/* ---- serializing -------------------------------------------------------------------------- */

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

/* Encode obj and serialize it: a new owner holding the message and frames. */
static PgOwner *serialize(PyObject *obj, PyObject *families, const pg_encode_options_t *eo, bool flat,
                          int compression)
{
    fam_list_t fam;
    if (families_parse(families, flat, &fam) < 0)
        return NULL;
    PgOwner *owner = pg_owner_new();
    if (!owner) {
        Py_XDECREF(fam.keep);
        return NULL;
    }
    if (pg_encode(owner, obj, eo) < 0)
        goto fail;
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = compression;
    if (fam.n) {
        so.families = fam.names;
        so.nfamilies = fam.n;
    }
    gser_status_t st;
    gser_frames_t *frames = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_serialize(pg_ctx, owner->msg, &so, &frames);
    Py_END_ALLOW_THREADS
    if (st) {
        pg_raise(st, true, "gser_serialize");
        goto fail;
    }
    /* Packing and device-to-host staging run on a stream: frames handed to
     * Python must be complete. */
    Py_BEGIN_ALLOW_THREADS
    st = gser_frames_wait(frames);
    Py_END_ALLOW_THREADS
    if (st) {
        gser_frames_destroy(frames);
        pg_raise(st, true, "gser_frames_wait");
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

PgOwner *pg_serialize(PyObject *obj, PyObject *families)
{
    pg_encode_options_t eo = {0};
    return serialize(obj, families, &eo, false, GSER_COMPRESSION_NONE);
}

PgOwner *pg_serialize_compressed(PyObject *obj, PyObject *families, int compression)
{
    pg_encode_options_t eo = {0};
    return serialize(obj, families, &eo, false, compression);
}

PgOwner *pg_serialize_flat(PyObject *obj, PyObject *families, int compression)
{
    pg_encode_options_t eo = {0};
    return serialize(obj, families, &eo, true, compression);
}

PyDoc_STRVAR(dumps_doc,
"dumps(obj, families=('device', 'host'), *, strict=False, compression=None) -> (header, frames)\n\n"
"Serialize obj into a header (bytes: gser's msgpack header) and a list of\n"
"frames: memoryviews over host memory, gser.DeviceFrame objects for device\n"
"memory. Frames borrow obj's buffers (numpy arrays, __cuda_array_interface__\n"
"and DLPack tensors are not copied): keep them unchanged while the frames are\n"
"in use. families orders the serializer\n"
"families tried for typed objects (Arrow tables) and says where device buffers\n"
"go: \"device\" keeps them in device frames, \"host\" stages them into host\n"
"frames. strict=True refuses (NotImplementedError) what would not come back as\n"
"the same type: buffers other than numpy.ndarray, bytes, bytearray and\n"
"memoryview; device arrays, DLPack tensors and Arrow tables unless their type\n"
"is registered (register_type). decline=\"object\" (an object Dask would pickle\n"
"whole) or \"collection\" (a list, tuple or dict whose items Dask would\n"
"serialize one by one) raises gser.Declined, a NotImplementedError, as soon\n"
"as gser is estimated to be slower than that (many small items); the\n"
"estimate is counted while encoding, so giving up costs little.\n"
"writable_header=True gives the header as a writable memoryview of gser's\n"
"own memory instead of bytes (small arrays inside it then load writable\n"
"without a copy, as Dask's writable frames do; memoryviews do not pickle).\n"
"compression=\"lz4\", \"zstd\" or \"auto\" (lz4) compresses host frames of at\n"
"least 10,000 bytes where a sample shrinks to 0.9 or less, as Dask's\n"
"maybe_compress does; such frames are gser's compressed copies, and the\n"
"header is wire version 3. loads decompresses them.");

static PyObject *py_dumps(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"obj", "families", "strict", "decline", "writable_header", "compression", NULL};
    PyObject *obj, *families = NULL, *compression = NULL;
    const char *decline = NULL;
    int strict = 0, writable_header = 0, codec;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$pzpO:dumps", kwlist, &obj, &families, &strict, &decline,
                                     &writable_header, &compression))
        return NULL;
    if (pg_compression_parse(compression, &codec) < 0)
        return NULL;
    pg_encode_options_t eo = {.strict = strict};
    if (decline && strcmp(decline, "object") == 0)
        eo.decline = PG_DECLINE_OBJECT;
    else if (decline && strcmp(decline, "collection") == 0)
        eo.decline = PG_DECLINE_COLLECTION;
    else if (decline)
        return PyErr_Format(PyExc_ValueError, "dumps: decline must be None, \"object\" or \"collection\"");
    PgOwner *owner = serialize(obj, families, &eo, false, codec);
    if (!owner)
        return NULL;
    size_t n = gser_frames_get_count(owner->frames);
    const gser_frame_t *fr = gser_frames_get_array(owner->frames);
    PyObject *header;
    if (writable_header) { /* gser's own header memory, zero-copy */
        PyObject *exp = pg_frame_new(owner, fr[0].data, (Py_ssize_t)fr[0].size, false, "B", 1, 0, NULL);
        header = exp ? PyMemoryView_FromObject(exp) : NULL;
        Py_XDECREF(exp);
    } else {
        header = PyBytes_FromStringAndSize(fr[0].data, (Py_ssize_t)fr[0].size);
    }
    PyObject *list = header ? PyList_New((Py_ssize_t)(n - 1)) : NULL;
    Py_ssize_t next_obj = 0; /* frames come in the order their data was encoded */
    for (size_t i = 1; list && i < n; i++) {
        PyObject *f;
        const pg_frame_obj_t *fo = next_obj < owner->nfobjs ? &owner->fobjs[next_obj] : NULL;
        bool mine = fo && fr[i].memory == GSER_MEMORY_HOST && fo->ptr == fr[i].data && fo->len == fr[i].size;
        next_obj += mine;
        if (mine && fo->obj) {
            f = Py_NewRef(fo->obj); /* bytes, bytearray, memoryview: the object itself, as Dask's frame */
        } else if (fr[i].memory == GSER_MEMORY_HOST) {
            /* Writable when the memory is a writable array's or gser's copy
             * of one, as Dask's frames of a writable array; else read-only. */
            PyObject *exp = pg_frame_new(owner, fr[i].data, (Py_ssize_t)fr[i].size, !mine || fo->readonly, "B", 1, 0,
                                         NULL);
            f = exp ? PyMemoryView_FromObject(exp) : NULL;
            Py_XDECREF(exp);
        } else {
            f = pg_device_frame_new(owner, fr[i].data, fr[i].size, fr[i].device);
        }
        if (!f)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)(i - 1), f);
    }
    Py_DECREF(owner);
    if (!list) {
        Py_XDECREF(header);
        return NULL;
    }
    return Py_BuildValue("(NN)", header, list);
}

PyDoc_STRVAR(to_bytes_doc,
"to_bytes(obj, families=('host',)) -> gser.FlatBytes\n\n"
"Serialize obj into gser's flattened form: one immutable bytes-like object\n"
"(gser.FlatBytes: the buffer protocol, len, indexing, slicing, ==, bytes())\n"
"holding the header and every frame, copied once into memory allocated for\n"
"it (huge pages where the kernel allows). It holds host memory only: the \"host\" family is\n"
"always used (\"device\" is left out of families, \"host\" added when\n"
"missing), so device buffers and device Arrow tables are staged into host\n"
"frames; from_bytes(b, device=True) puts them back on the device.\n"
"compression=None, \"lz4\", \"zstd\" or \"auto\" as for dumps.");

static PyObject *py_to_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"obj", "families", "compression", NULL};
    PyObject *obj, *families = NULL, *compression = NULL;
    int codec;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$O:to_bytes", kwlist, &obj, &families, &compression))
        return NULL;
    if (pg_compression_parse(compression, &codec) < 0)
        return NULL;
    PgOwner *owner = pg_serialize_flat(obj, families, codec);
    if (!owner)
        return NULL;
    size_t n = gser_frames_get_count(owner->frames);
    const gser_frame_t *fr = gser_frames_get_array(owner->frames);
    size_t size, written = 0;
    gser_status_t st = gser_flat_size(fr, n, &size);
    PyObject *out = NULL;
    char *dst;
    if (st) {
        pg_raise(st, false, "gser_flat_size");
    } else if ((out = pg_flat_bytes_new(size, &dst))) {
        Py_BEGIN_ALLOW_THREADS
        st = gser_flat_write(fr, n, dst, size, &written);
        Py_END_ALLOW_THREADS
        if (st || written != size) {
            Py_CLEAR(out);
            pg_raise(st ? st : GSER_ERR_STATE, false, "gser_flat_write");
        }
    }
    Py_DECREF(owner);
    return out;
}

/* ---- deserializing ------------------------------------------------------------------------ */

/* One input frame: a host buffer (held by the owner) or a device array
 * (__cuda_array_interface__, kept alive by the owner). */
static int frame_get(PgOwner *owner, PyObject *o, Py_ssize_t index, gser_frame_t *fr, bool *readonly)
{
    memset(fr, 0, sizeof *fr);
    if (PyObject_CheckBuffer(o)) {
        Py_buffer view;
        if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) < 0)
            return -1;
        fr->data = view.buf;
        fr->size = (size_t)view.len;
        fr->memory = GSER_MEMORY_HOST;
        *readonly = view.readonly;
        return pg_owner_hold_view(owner, &view);
    }
    if (index > 0) {
        PyObject *cai = PyObject_GetAttrString(o, "__cuda_array_interface__");
        if (cai) {
            void *ptr, *stream;
            size_t nbytes;
            gser_dtype_t dtype;
            uint32_t ndim;
            int64_t shape[GSER_MAX_NDIM], strides[GSER_MAX_NDIM];
            bool strided;
            const char *why;
            int r = pg_cai_read(cai, &ptr, &nbytes, &dtype, &ndim, shape, strides, &strided, &stream, &why);
            Py_DECREF(cai);
            if (r == 0 && strided) {
                why = "a strided device frame (frames are contiguous bytes)";
                r = -1;
            }
            if (r < 0) {
                if (why) {
                    PyObject *text = PyUnicode_FromFormat("gser.loads: frame %zd: %s", index, why);
                    PyObject *e = text ? pg_make_exc(pg_GserUnsupported, GSER_ERR_UNSUPPORTED, text) : NULL;
                    if (e)
                        PyErr_SetObject(pg_GserUnsupported, e);
                    Py_XDECREF(e);
                    Py_XDECREF(text);
                }
                return -1;
            }
            /* The interface's consumer synchronizes with the producer's
             * stream: the loaded arrays view this memory with no stream. */
            if (stream) {
                gser_status_t st;
                Py_BEGIN_ALLOW_THREADS
                st = gser_stream_wait(pg_ctx, stream);
                Py_END_ALLOW_THREADS
                if (st) {
                    pg_raise(st, true, "gser_stream_wait");
                    return -1;
                }
            }
            fr->data = ptr;
            fr->size = nbytes;
            fr->memory = GSER_MEMORY_DEVICE;
            *readonly = false;
            return pg_owner_hold_ref(owner, o);
        }
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    PyErr_Format(PyExc_TypeError, "gser.loads: %s %zd is a %s, not a bytes-like object%s",
                 index ? "frame" : "header", index, Py_TYPE(o)->tp_name,
                 index ? " or an object with __cuda_array_interface__" : "");
    return -1;
}

PyDoc_STRVAR(loads_doc,
"loads(header, frames, *, device=False) -> obj\n\n"
"Rebuild an object from a header and frames made by dumps (bytes-like\n"
"objects; device frames are objects with __cuda_array_interface__).\n"
"Arrays in the result view the frames without copying, and are writable\n"
"only when the frames are; buffers in device memory come back as\n"
"gser.DeviceArray, Arrow tables as gser.ArrowArray. device=True puts buffers\n"
"that were device memory at the sender but came in host frames (the \"host\"\n"
"family) back on the device. Device copies are waited for before loads\n"
"returns. copy_readonly=True gives numpy arrays the writability they had at\n"
"the sender, as Dask's numpy serializer does: an array that was writable but\n"
"views a read-only frame is copied (only then). Malformed input raises\n"
"GserError.");

/* Wait for the device copies gser made while deserializing (restored or
 * scattered buffers carry their event), so that the objects handed out need
 * no synchronization (their __cuda_array_interface__ has no stream). */
static int msg_wait(gser_msg_t *msg)
{
    gser_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = gser_msg_wait(msg);
    Py_END_ALLOW_THREADS
    if (st) {
        pg_raise(st, true, "gser_msg_wait");
        return -1;
    }
    return 0;
}

/* The frames' memory, for the decoder: writability, and the objects given. */
static void frame_ref_set(pg_frame_ref_t *ref, const gser_frame_t *fr, bool readonly, PyObject *src)
{
    ref->data = fr->data;
    ref->size = fr->size;
    ref->host = fr->memory == GSER_MEMORY_HOST;
    ref->readonly = readonly;
    ref->src = src;
}

PyObject *pg_decode_msg(PgOwner *owner, bool readonly)
{
    if (msg_wait(owner->msg) < 0)
        return NULL;
    size_t n;
    const gser_frame_t *fr = gser_msg_get_frames(owner->msg, &n);
    pg_decode_ctx_t dc = {0};
    PyObject *out = NULL;
    if (pg_decode_ctx_init(&dc, owner, n) == 0) {
        dc.any_readonly = readonly;
        for (size_t i = 0; i < n; i++)
            frame_ref_set(&dc.frames[i], &fr[i], readonly, NULL); /* no objects of their own */
        out = pg_decode(&dc, gser_msg_get_root(owner->msg));
    }
    pg_decode_ctx_clear(&dc);
    return out;
}

static PyObject *py_loads(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"header", "frames", "device", "copy_readonly", NULL};
    PyObject *header, *frames_obj;
    int device = 0, copy_readonly = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$pp:loads", kwlist, &header, &frames_obj, &device,
                                     &copy_readonly))
        return NULL;
    /* A snapshot: reading a frame may run Python code (a __cuda_array_interface__
     * property) that changes the caller's list. */
    PyObject *seq = PySequence_Check(frames_obj) ? PySequence_Tuple(frames_obj) : NULL;
    if (!seq) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "gser.loads: frames must be a sequence");
        }
        return NULL;
    }
    Py_ssize_t nf = PyTuple_GET_SIZE(seq);
    PyObject *out = NULL;
    pg_decode_ctx_t dc = {0};
    gser_frame_t *fr = PyMem_Calloc((size_t)nf + 1, sizeof *fr);
    PgOwner *owner = fr ? pg_owner_new() : NULL;
    if (!owner) {
        if (!fr)
            PyErr_NoMemory();
        goto done;
    }
    if (pg_decode_ctx_init(&dc, owner, (size_t)nf + 1) < 0)
        goto done;
    dc.copy_readonly = copy_readonly;
    for (Py_ssize_t i = 0; i <= nf; i++) {
        PyObject *o = i ? PyTuple_GET_ITEM(seq, i - 1) : header;
        bool ro = false;
        if (frame_get(owner, o, i, &fr[i], &ro) < 0)
            goto done;
        frame_ref_set(&dc.frames[i], &fr[i], ro, o);
        dc.any_readonly |= ro;
    }
    gser_deserialize_options_t opts = {.size = sizeof(gser_deserialize_options_t), .flags = device ? GSER_DESERIALIZE_RESTORE_DEVICE : 0};
    gser_status_t st;
    gser_msg_t *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_deserialize(pg_ctx, fr, (size_t)nf + 1, &opts, &msg);
    Py_END_ALLOW_THREADS
    if (st) {
        pg_raise(st, true, "gser_deserialize");
        goto done;
    }
    owner->msg = msg;
    if (msg_wait(msg) == 0)
        out = pg_decode(&dc, gser_msg_get_root(msg));
done:
    pg_decode_ctx_clear(&dc);
    Py_XDECREF(owner);
    PyMem_Free(fr);
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(from_bytes_doc,
"from_bytes(b, *, device=False) -> obj\n\n"
"Rebuild an object from gser's flattened form (any bytes-like object:\n"
"bytes, gser.FlatBytes, a mmap, ...).\n"
"Arrays in the result view b without copying (writable only if b is); device\n"
"buffers of the sender come back as host numpy arrays, or with device=True\n"
"(GSER_DESERIALIZE_RESTORE_DEVICE) as gser.DeviceArray, copied to the device;\n"
"Arrow tables as gser.ArrowArray, on the device with device=True.");

static PyObject *py_from_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"b", "device", NULL};
    PyObject *arg;
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$p:from_bytes", kwlist, &arg, &device))
        return NULL;
    PgOwner *owner = pg_owner_new();
    if (!owner)
        return NULL;
    PyObject *out = NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        goto done;
    const void *buf = view.buf;
    size_t len = (size_t)view.len;
    bool readonly = view.readonly;
    if (pg_owner_hold_view(owner, &view) < 0)
        goto done;
    gser_deserialize_options_t opts = {.size = sizeof(gser_deserialize_options_t), .flags = device ? GSER_DESERIALIZE_RESTORE_DEVICE : 0};
    gser_status_t st;
    gser_msg_t *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_deserialize_flat(pg_ctx, buf, len, NULL, NULL, &opts, &msg);
    Py_END_ALLOW_THREADS
    if (st) {
        pg_raise(st, true, "gser_deserialize_flat");
        goto done;
    }
    owner->msg = msg;
    out = pg_decode_msg(owner, readonly); /* the frames are slices of b */
done:
    Py_DECREF(owner);
    return out;
}

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"dumps", (PyCFunction)(void (*)(void))py_dumps, METH_VARARGS | METH_KEYWORDS, dumps_doc},
    {"loads", (PyCFunction)(void (*)(void))py_loads, METH_VARARGS | METH_KEYWORDS, loads_doc},
    {"to_bytes", (PyCFunction)(void (*)(void))py_to_bytes, METH_VARARGS | METH_KEYWORDS, to_bytes_doc},
    {"from_bytes", (PyCFunction)(void (*)(void))py_from_bytes, METH_VARARGS | METH_KEYWORDS, from_bytes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gser._gser",
    .m_doc = "gser's C core for Python: dumps/loads, to_bytes/from_bytes, device arrays, Arrow tables.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__gser(void)
{
    if (PyType_Ready(&PgOwner_Type) < 0 || PyType_Ready(&PgFrame_Type) < 0 ||
        PyType_Ready(&PgDeviceFrame_Type) < 0 || PyType_Ready(&PgDeviceArray_Type) < 0 ||
        PyType_Ready(&PgArrowArray_Type) < 0)
        return NULL;
    if (!pg_ctx) {
        /* The device backend follows GSER_DEVICE (cuda, emulated, none). */
        gser_context_t *ctx;
        const gser_allocator_t *alloc = pg_allocator_prepare();
        if (!alloc)
            return NULL;
        gser_context_options_t opts = GSER_CONTEXT_OPTIONS_INIT;
        opts.device_allocator = alloc;
        gser_status_t st = gser_context_create(&opts, &ctx);
        if (st) {
            const char *d = gser_context_get_last_error(NULL);
            PyErr_Format(st == GSER_ERR_NO_MEMORY ? PyExc_MemoryError : PyExc_RuntimeError,
                         "gser: cannot create a context: %s", *d ? d : gser_status_str(st));
            return NULL;
        }
        if ((st = pg_arrow_register(ctx)) || (st = pg_types_register(ctx))) {
            PyErr_Format(PyExc_RuntimeError, "gser: cannot register the module's types: %s", gser_status_str(st));
            gser_context_destroy(ctx);
            return NULL;
        }
        pg_ctx = ctx;
    }
    if (!pg_GserError) {
        pg_GserError = PyErr_NewExceptionWithDoc(
            "gser.GserError",
            "An error reported by gser's core: a malformed or truncated message, a limit\n"
            "exceeded, an unknown family, ... str() is \"<STATUS_NAME>: <detail>\", where the\n"
            "detail names the failing value's path ($[2].payload); the attributes status\n"
            "(the negative gser_status_t), status_name and detail hold the parts.",
            PyExc_ValueError, NULL);
        if (!pg_GserError)
            return NULL;
    }
    if (!pg_GserUnsupported) {
        /* Both: what the decoder raises on bad input is a GserError, and
         * code written for NotImplementedError still catches it. */
        PyObject *bases = PyTuple_Pack(2, pg_GserError, PyExc_NotImplementedError);
        if (!bases)
            return NULL;
        pg_GserUnsupported = PyErr_NewExceptionWithDoc(
            "gser.GserUnsupported",
            "A message (or a frame handed to loads) holds what this Python module cannot\n"
            "give back: a dtype numpy cannot express, a typed object of a type it does not\n"
            "load, ... A GserError (status GSER_ERR_UNSUPPORTED) and a NotImplementedError.",
            bases, NULL);
        Py_DECREF(bases);
        if (!pg_GserUnsupported)
            return NULL;
    }
    if (!pg_Declined) {
        pg_Declined = PyErr_NewExceptionWithDoc(
            "gser.Declined",
            "Raised by dumps(..., decline=...) when gser would be slower than Dask's own\n"
            "path for the object (many small items that pickle carries faster). A\n"
            "NotImplementedError: Dask then tries its next serializer family.",
            PyExc_NotImplementedError, NULL);
        if (!pg_Declined)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddFunctions(m, pg_registry_methods) < 0 || PyModule_AddFunctions(m, pg_allocator_methods) < 0 ||
        PyModule_AddFunctions(m, pg_strcol_methods) < 0 ||
        pg_flatio_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef GSER_PY_HAVE_UCX
    if (pg_ucx_add(m) < 0 || PyModule_AddObjectRef(m, "HAVE_UCX", Py_True) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#else
    if (PyModule_AddObjectRef(m, "HAVE_UCX", Py_False) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    if (PyModule_AddObjectRef(m, "GserError", pg_GserError) < 0 ||
        PyModule_AddObjectRef(m, "Declined", pg_Declined) < 0 ||
        PyModule_AddObjectRef(m, "GserUnsupported", pg_GserUnsupported) < 0 ||
        PyModule_AddObjectRef(m, "DeviceFrame", (PyObject *)&PgDeviceFrame_Type) < 0 ||
        PyModule_AddObjectRef(m, "DeviceArray", (PyObject *)&PgDeviceArray_Type) < 0 ||
        PyModule_AddObjectRef(m, "ArrowArray", (PyObject *)&PgArrowArray_Type) < 0 ||
        PyModule_AddStringConstant(m, "DEVICE_BACKEND", gser_context_get_device_backend(pg_ctx)) < 0 ||
        PyModule_AddObjectRef(m, "HAVE_ARROW", pg_have_arrow ? Py_True : Py_False) < 0 ||
        PyModule_AddStringConstant(m, "__version__", gser_version_str()) < 0 ||
        PyModule_AddIntConstant(m, "WIRE_VERSION", GSER_WIRE_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "DEPTH_MAX", GSER_DEPTH_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
