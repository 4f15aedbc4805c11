/* gser._gser: dumps/loads, to_bytes/from_bytes, GserError.
 *
 *   header, frames = dumps(obj, families=("device", "host"), *, strict=False)
 *   obj = loads(header, frames)
 *   b = to_bytes(obj, families=("device", "host"))
 *   obj = from_bytes(b)
 *
 * The core runs with the GIL released; everything it borrows is held by a
 * PgOwner for as long as it is used.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdarg.h>
#include <string.h>

gser_context_t *pg_ctx;
PyObject *pg_GserError;

/* ---- errors ------------------------------------------------------------------------ */

static PyObject *status_name(gser_status_t st)
{
    const char *full = gser_status_str(st);
    const char *colon = strchr(full, ':');
    return PyUnicode_FromStringAndSize(full, colon ? colon - full : (Py_ssize_t)strlen(full));
}

PyObject *pg_make_exc(PyObject *exc, gser_status_t st, PyObject *text)
{
    if (exc != pg_GserError)
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

PyObject *pg_raise(gser_status_t st, bool detail, const char *what)
{
    const char *d = detail ? gser_context_last_error(pg_ctx) : "";
    PyObject *text = *d ? PyUnicode_FromString(d)
                        : PyUnicode_FromFormat("%s: %s", what ? what : "gser", gser_status_str(st));
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

/* ---- serializing -------------------------------------------------------------------------- */

/* families: None (the default order), one str, or a sequence of str. */
typedef struct fam_list {
    PyObject *keep; /* what the names point into */
    const char *names[32];
    size_t n;
} fam_list_t;

static int families_parse(PyObject *families, fam_list_t *f)
{
    f->keep = NULL;
    f->n = 0;
    if (!families || families == Py_None)
        return 0;
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
    return 0;
}

/* Encode obj and serialize it: a new owner holding the message and frames. */
static PgOwner *serialize(PyObject *obj, PyObject *families, bool strict)
{
    fam_list_t fam;
    if (families_parse(families, &fam) < 0)
        return NULL;
    PgOwner *owner = pg_owner_new();
    if (!owner) {
        Py_XDECREF(fam.keep);
        return NULL;
    }
    pg_encode_options_t eo = {.strict = strict};
    if (pg_encode(owner, obj, &eo) < 0)
        goto fail;
    gser_serialize_options_t so = {0};
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

PyDoc_STRVAR(dumps_doc,
"dumps(obj, families=('device', 'host'), *, strict=False) -> (header, frames)\n\n"
"Serialize obj into a header (bytes: gser's msgpack header) and a list of\n"
"frames: memoryviews over host memory, gser.DeviceFrame objects for device\n"
"memory. Frames borrow obj's buffers (numpy arrays are not copied): keep\n"
"them unchanged while the frames are in use. families orders the serializer\n"
"families tried for typed objects. strict=True refuses (NotImplementedError)\n"
"what would not come back as the same type or in host memory: buffers other\n"
"than numpy.ndarray, and device arrays.");

static PyObject *py_dumps(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"obj", "families", "strict", NULL};
    PyObject *obj, *families = NULL;
    int strict = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$p:dumps", kwlist, &obj, &families, &strict))
        return NULL;
    PgOwner *owner = serialize(obj, families, strict);
    if (!owner)
        return NULL;
    size_t n = gser_frames_count(owner->frames);
    const gser_frame_t *fr = gser_frames_array(owner->frames);
    PyObject *header = PyBytes_FromStringAndSize(fr[0].data, (Py_ssize_t)fr[0].size);
    PyObject *list = header ? PyList_New((Py_ssize_t)(n - 1)) : NULL;
    for (size_t i = 1; list && i < n; i++) {
        PyObject *f;
        if (fr[i].memory == GSER_MEMORY_HOST) {
            PyObject *exp = pg_frame_new(owner, fr[i].data, (Py_ssize_t)fr[i].size, true, "B", 1, 0, NULL);
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
"to_bytes(obj, families=('device', 'host')) -> bytes\n\n"
"Serialize obj into gser's flattened form: one bytes object holding the\n"
"header and every frame (host memory only).");

static PyObject *py_to_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"obj", "families", NULL};
    PyObject *obj, *families = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:to_bytes", kwlist, &obj, &families))
        return NULL;
    PgOwner *owner = serialize(obj, families, false);
    if (!owner)
        return NULL;
    size_t n = gser_frames_count(owner->frames);
    const gser_frame_t *fr = gser_frames_array(owner->frames);
    size_t size, written = 0;
    gser_status_t st = gser_flat_size(fr, n, &size);
    PyObject *out = NULL;
    if (st == GSER_ERR_UNSUPPORTED) {
        PyErr_SetString(PyExc_NotImplementedError,
                        "gser.to_bytes: the message has device frames; flattening them needs gser's device layer");
    } else if (st) {
        pg_raise(st, false, "gser_flat_size");
    } else if (size > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
    } else if ((out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size))) {
        char *dst = PyBytes_AS_STRING(out);
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
            void *ptr;
            size_t nbytes;
            gser_dtype_t dtype;
            uint32_t ndim;
            int64_t shape[GSER_MAX_NDIM];
            const char *why;
            int r = pg_cai_read(cai, &ptr, &nbytes, &dtype, &ndim, shape, &why);
            Py_DECREF(cai);
            if (r < 0) {
                if (why)
                    PyErr_Format(PyExc_NotImplementedError, "gser.loads: frame %zd: %s", index, why);
                return -1;
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
"loads(header, frames) -> obj\n\n"
"Rebuild an object from a header and frames made by dumps (bytes-like\n"
"objects; device frames are objects with __cuda_array_interface__).\n"
"Arrays in the result view the frames without copying, and are writable\n"
"only when the frames are. Malformed input raises GserError.");

static PyObject *py_loads(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"header", "frames", NULL};
    PyObject *header, *frames_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:loads", kwlist, &header, &frames_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(frames_obj, "gser.loads: frames must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t nf = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = NULL;
    gser_frame_t *fr = PyMem_Calloc((size_t)nf + 1, sizeof *fr);
    PgOwner *owner = fr ? pg_owner_new() : NULL;
    if (!owner) {
        if (!fr)
            PyErr_NoMemory();
        goto done;
    }
    pg_decode_ctx_t dc = {.owner = owner};
    if (frame_get(owner, header, 0, &fr[0], &dc.header_readonly) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < nf; i++) {
        bool ro = false;
        if (frame_get(owner, PySequence_Fast_GET_ITEM(seq, i), i + 1, &fr[i + 1], &ro) < 0)
            goto done;
        dc.data_readonly |= ro;
    }
    dc.header = fr[0].data;
    dc.header_len = fr[0].size;
    gser_status_t st;
    gser_msg_t *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_deserialize(pg_ctx, fr, (size_t)nf + 1, NULL, &msg);
    Py_END_ALLOW_THREADS
    if (st) {
        pg_raise(st, true, "gser_deserialize");
        goto done;
    }
    owner->msg = msg;
    out = pg_decode(&dc, gser_msg_root(msg));
done:
    Py_XDECREF(owner);
    PyMem_Free(fr);
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(from_bytes_doc,
"from_bytes(b) -> obj\n\n"
"Rebuild an object from gser's flattened form (any bytes-like object).\n"
"Arrays in the result view b without copying (writable only if b is).");

static PyObject *py_from_bytes(PyObject *self, PyObject *arg)
{
    (void)self;
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
    gser_status_t st;
    gser_msg_t *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_deserialize_flat(pg_ctx, buf, len, NULL, NULL, NULL, &msg);
    Py_END_ALLOW_THREADS
    if (st) {
        pg_raise(st, true, "gser_deserialize_flat");
        goto done;
    }
    owner->msg = msg;
    size_t n;
    const gser_frame_t *fr = gser_msg_frames(msg, &n);
    pg_decode_ctx_t dc = {.owner = owner,
                          .header = n ? fr[0].data : NULL,
                          .header_len = n ? fr[0].size : 0,
                          .header_readonly = readonly,
                          .data_readonly = readonly};
    out = pg_decode(&dc, gser_msg_root(msg));
done:
    Py_DECREF(owner);
    return out;
}

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"dumps", (PyCFunction)(void (*)(void))py_dumps, METH_VARARGS | METH_KEYWORDS, dumps_doc},
    {"loads", (PyCFunction)(void (*)(void))py_loads, METH_VARARGS | METH_KEYWORDS, loads_doc},
    {"to_bytes", (PyCFunction)(void (*)(void))py_to_bytes, METH_VARARGS | METH_KEYWORDS, to_bytes_doc},
    {"from_bytes", (PyCFunction)py_from_bytes, METH_O, from_bytes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gser._gser",
    .m_doc = "gser's C core for Python: dumps/loads, to_bytes/from_bytes.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__gser(void)
{
    if (PyType_Ready(&PgOwner_Type) < 0 || PyType_Ready(&PgFrame_Type) < 0 ||
        PyType_Ready(&PgDeviceFrame_Type) < 0)
        return NULL;
    if (!pg_ctx) {
        gser_status_t st = gser_context_create(NULL, &pg_ctx);
        if (st) {
            PyErr_Format(st == GSER_ERR_NO_MEMORY ? PyExc_MemoryError : PyExc_RuntimeError,
                         "gser: cannot create a context: %s", gser_status_str(st));
            return NULL;
        }
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
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "GserError", pg_GserError) < 0 ||
        PyModule_AddObjectRef(m, "DeviceFrame", (PyObject *)&PgDeviceFrame_Type) < 0 ||
        PyModule_AddStringConstant(m, "__version__", gser_version_string()) < 0 ||
        PyModule_AddIntConstant(m, "WIRE_VERSION", GSER_WIRE_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "DEPTH_MAX", GSER_DEPTH_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
