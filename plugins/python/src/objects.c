/* The objects that view a message's memory (its owner is in owner.c).
 *
 * Lifetime chain: numpy array -> memoryview -> PgFrame -> PgOwner -> gser
 * message + the Python buffers it borrows; gser.DeviceFrame and
 * gser.DeviceArray hold the owner directly. The owner dies with the last
 * view, and then frees the message before releasing those buffers.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#include <structmember.h>

/* ---- PgFrame: a buffer exporter ------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PgOwner *owner;
    char *ptr;
    Py_ssize_t len;
    Py_ssize_t itemsize;
    const char *format;
    int readonly;
    int c_order; /* strides say C order (consumers may ignore them) */
    int ndim; /* 0: flat bytes */
    Py_ssize_t flat_shape[1];
    Py_ssize_t flat_strides[1];
    Py_ssize_t shape[PG_MAX_NDIM];
    Py_ssize_t strides[PG_MAX_NDIM];
} PgFrame;

/* Zero-length views still need a non-NULL pointer for some consumers. */
static char empty_data[16];

static int frame_getbuffer(PgFrame *self, Py_buffer *view, int flags)
{
    if ((flags & PyBUF_WRITABLE) && self->readonly) {
        PyErr_SetString(PyExc_BufferError, "gser: this frame is read-only");
        view->obj = NULL;
        return -1;
    }
    view->buf = self->ptr;
    view->len = self->len;
    view->readonly = self->readonly;
    view->suboffsets = NULL;
    view->internal = NULL;
    bool typed = self->ndim > 0 && (flags & PyBUF_FORMAT);
    if (self->ndim > 0 && !self->c_order && (flags & PyBUF_STRIDES) != PyBUF_STRIDES) {
        PyErr_SetString(PyExc_BufferError, "gser: this buffer is strided; ask for its strides");
        view->obj = NULL;
        return -1;
    }
    if (typed) {
        view->format = (char *)self->format;
        view->itemsize = self->itemsize;
        view->ndim = self->ndim;
        view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
        view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    } else {
        /* Unsigned bytes: what a consumer that asks for no format assumes. */
        view->format = (flags & PyBUF_FORMAT) ? "B" : NULL;
        view->itemsize = 1;
        view->ndim = 1;
        view->shape = (flags & PyBUF_ND) ? self->flat_shape : NULL;
        view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->flat_strides : NULL;
    }
    view->obj = Py_NewRef((PyObject *)self);
    return 0;
}

static void frame_dealloc(PgFrame *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->owner);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int frame_traverse(PgFrame *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    return 0;
}

static PyType_Slot frame_slots[] = {
    {Py_tp_doc, "Memory of a gser message, exported through the buffer protocol (internal)."},
    {Py_tp_dealloc, (void *)frame_dealloc},
    {Py_tp_traverse, (void *)frame_traverse},
    {Py_bf_getbuffer, (void *)frame_getbuffer},
    {0, NULL},
};

static PyType_Spec frame_spec = {
    .name = "gser._gser._Frame",
    .basicsize = sizeof(PgFrame),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = frame_slots,
};

PyObject *pg_frame_new(PgOwner *owner, const void *ptr, Py_ssize_t len, bool readonly, const char *format,
                       Py_ssize_t itemsize, int ndim, const int64_t *shape)
{
    return pg_frame_new_strided(owner, ptr, len, readonly, format, itemsize, ndim, shape, NULL);
}

PyObject *pg_frame_new_strided(PgOwner *owner, const void *ptr, Py_ssize_t len, bool readonly, const char *format,
                               Py_ssize_t itemsize, int ndim, const int64_t *shape, const int64_t *strides)
{
    if (ndim < 0 || ndim > PG_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "gser: %d dimensions (at most %d)", ndim, PG_MAX_NDIM);
        return NULL;
    }
    PgFrame *f = PyObject_GC_New(PgFrame, owner->state->Frame);
    if (!f)
        return NULL;
    f->owner = (PgOwner *)Py_NewRef((PyObject *)owner);
    f->ptr = ptr ? (char *)ptr : empty_data;
    f->len = len;
    f->readonly = readonly;
    f->format = format ? format : "B";
    f->itemsize = itemsize > 0 ? itemsize : 1;
    f->ndim = ndim;
    f->flat_shape[0] = len;
    f->flat_strides[0] = 1;
    f->c_order = strides == NULL;
    /* Callers checked the shape (pg_extents_total); unsigned arithmetic all the
     * same, so that a shape they missed is an error and never overflows. */
    size_t stride = (size_t)f->itemsize;
    for (int d = ndim; d-- > 0;) {
        size_t ext = shape[d] > 0 ? (size_t)shape[d] : 1;
        f->shape[d] = (Py_ssize_t)shape[d];
        f->strides[d] = (Py_ssize_t)stride;
        if (shape[d] < 0 || stride > (size_t)PY_SSIZE_T_MAX / ext) {
            PyObject_GC_Track(f);
            Py_DECREF(f);
            PyErr_SetString(owner->state->GserError, "gser: a buffer shape Python cannot hold");
            return NULL;
        }
        stride *= ext;
    }
    for (int d = 0; strides && d < ndim; d++) /* checked by the core: the elements lie in the span */
        f->strides[d] = (Py_ssize_t)strides[d];
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

static PyObject *device_copy_to_host(pg_state_t *s, unsigned long long ptr, Py_ssize_t nbytes, PyObject *shape,
                                     const char *typestr, const char *what);

/* ---- PgDeviceFrame ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PgOwner *owner;
    unsigned long long ptr;
    Py_ssize_t nbytes;
    int device;
} PgDeviceFrame;

static void dframe_dealloc(PgDeviceFrame *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->owner);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int dframe_traverse(PgDeviceFrame *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    return 0;
}

static PyObject *dframe_cai(PgDeviceFrame *self, void *closure)
{
    (void)closure;
    return Py_BuildValue("{s:(n),s:s,s:(NO),s:O,s:i}", "shape", self->nbytes, "typestr", "|u1", "data",
                         PyLong_FromUnsignedLongLong(self->ptr), Py_False, "strides", Py_None, "version", 3);
}

static PyObject *dframe_repr(PgDeviceFrame *self)
{
    /* PyUnicode_FromFormat has no %zx: %p writes 0x... */
    return PyUnicode_FromFormat("<gser.DeviceFrame %zd bytes on device %d at %p>", self->nbytes, self->device,
                                (void *)(uintptr_t)self->ptr);
}

static Py_ssize_t dframe_len(PgDeviceFrame *self)
{
    return self->nbytes;
}

static PyGetSetDef dframe_getset[] = {
    {"__cuda_array_interface__", (getter)dframe_cai, NULL, "CUDA Array Interface v3 (one-dimensional bytes).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef dframe_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(PgDeviceFrame, nbytes), READONLY, "Length in bytes."},
    {"device", T_INT, offsetof(PgDeviceFrame, device), READONLY, "Device ordinal."},
    {"ptr", T_ULONGLONG, offsetof(PgDeviceFrame, ptr), READONLY, "Device pointer."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(dframe_copy_to_host_doc,
"copy_to_host() -> numpy.ndarray\n\n"
"The frame's bytes in a new host uint8 array, copied with gser_device_memcpy\n"
"(a bytearray when numpy is not installed).");

static PyObject *dframe_copy_to_host(PgDeviceFrame *self, PyObject *unused)
{
    (void)unused;
    PyObject *shape = Py_BuildValue("(n)", self->nbytes);
    if (!shape)
        return NULL;
    PyObject *out = device_copy_to_host(self->owner->state, self->ptr, self->nbytes, shape, "|u1", "gser.DeviceFrame.copy_to_host");
    Py_DECREF(shape);
    return out;
}

static PyMethodDef dframe_methods[] = {
    {"copy_to_host", (PyCFunction)dframe_copy_to_host, METH_NOARGS, dframe_copy_to_host_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot dframe_slots[] = {
    {Py_tp_doc, "A frame in device memory produced by gser.dumps: exposes __cuda_array_interface__\n"
                "(one-dimensional bytes) and keeps the serialized message alive."},
    {Py_tp_dealloc, (void *)dframe_dealloc},
    {Py_tp_traverse, (void *)dframe_traverse},
    {Py_tp_repr, (void *)dframe_repr},
    {Py_tp_getset, dframe_getset},
    {Py_tp_members, dframe_members},
    {Py_tp_methods, dframe_methods},
    {Py_sq_length, (void *)dframe_len},
    {0, NULL},
};

static PyType_Spec dframe_spec = {
    .name = "gser.DeviceFrame",
    .basicsize = sizeof(PgDeviceFrame),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = dframe_slots,
};

PyObject *pg_device_frame_new(PgOwner *owner, const void *ptr, size_t len, int32_t device)
{
    if (len > PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PgDeviceFrame *f = PyObject_GC_New(PgDeviceFrame, owner->state->DeviceFrame);
    if (!f)
        return NULL;
    f->owner = (PgOwner *)Py_NewRef((PyObject *)owner);
    f->ptr = (unsigned long long)(uintptr_t)ptr;
    f->nbytes = (Py_ssize_t)len;
    f->device = device;
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

/* ---- PgDeviceArray ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PgOwner *owner;
    unsigned long long ptr;
    Py_ssize_t nbytes;
    gser_dtype_t dtype;
    int device;
    int ndim;
    Py_ssize_t shape[PG_MAX_NDIM];
    int strided;                     /* strides below; else C order */
    Py_ssize_t strides[PG_MAX_NDIM]; /* bytes */
    Py_ssize_t span_offset;          /* the elements cover [ptr + span_offset, + span) */
    Py_ssize_t span;
} PgDeviceArray;

static void darray_dealloc(PgDeviceArray *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->owner);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int darray_traverse(PgDeviceArray *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->owner);
    return 0;
}

static PyObject *darray_shape(PgDeviceArray *self, void *closure)
{
    (void)closure;
    PyObject *t = PyTuple_New(self->ndim);
    for (int d = 0; t && d < self->ndim; d++) {
        PyObject *x = PyLong_FromSsize_t(self->shape[d]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, d, x);
    }
    return t;
}

static PyObject *darray_typestr(PgDeviceArray *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(pg_dtype_typestr(self->dtype));
}

/* numpy.dtype(typestr) when numpy is installed, else the typestr. */
static PyObject *darray_dtype(PgDeviceArray *self, void *closure)
{
    (void)closure;
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) {
        if (!PyErr_ExceptionMatches(PyExc_ImportError))
            return NULL;
        PyErr_Clear();
        return darray_typestr(self, NULL);
    }
    PyObject *out = PyObject_CallMethod(np, "dtype", "s", pg_dtype_typestr(self->dtype));
    Py_DECREF(np);
    return out;
}

/* Version 3. The data is ready when loads returns (it waited for gser's
 * copies): stream None, no synchronization needed. */
/* The byte strides as a tuple; None in C order. */
static PyObject *darray_strides(PgDeviceArray *self, void *closure)
{
    (void)closure;
    if (!self->strided)
        Py_RETURN_NONE;
    PyObject *t = PyTuple_New(self->ndim);
    for (int d = 0; t && d < self->ndim; d++) {
        PyObject *x = PyLong_FromSsize_t(self->strides[d]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, d, x);
    }
    return t;
}

static PyObject *darray_cai(PgDeviceArray *self, void *closure)
{
    (void)closure;
    PyObject *shape = darray_shape(self, NULL);
    PyObject *strides = shape ? darray_strides(self, NULL) : NULL;
    if (!strides) {
        Py_XDECREF(shape);
        return NULL;
    }
    return Py_BuildValue("{s:N,s:s,s:(NO),s:N,s:O,s:i}", "shape", shape, "typestr", pg_dtype_typestr(self->dtype),
                         "data", PyLong_FromUnsignedLongLong(self->ptr), Py_False, "strides", strides, "stream",
                         Py_None, "version", 3);
}

/* A new host array of shape and typestr (a bytearray when numpy is not
 * installed) holding the nbytes of device memory at ptr, copied with
 * gser_device_memcpy: host code never reads device memory itself. */
static PyObject *device_copy_to_host(pg_state_t *s, unsigned long long ptr, Py_ssize_t nbytes, PyObject *shape,
                                     const char *typestr, const char *what)
{
    PyObject *out;
    PyObject *np = PyImport_ImportModule("numpy");
    if (np) {
        out = PyObject_CallMethod(np, "empty", "Os", shape, typestr);
        Py_DECREF(np);
    } else if (PyErr_ExceptionMatches(PyExc_ImportError)) {
        PyErr_Clear();
        out = PyByteArray_FromStringAndSize(NULL, nbytes);
    } else {
        return NULL;
    }
    if (!out)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    gser_status_t st = GSER_OK;
    if (view.len != nbytes) {
        st = GSER_ERR_STATE;
    } else if (nbytes) {
        void *src = (void *)(uintptr_t)ptr;
        Py_BEGIN_ALLOW_THREADS
        st = gser_device_memcpy(pg_ctx, view.buf, GSER_MEMORY_HOST, src, GSER_MEMORY_DEVICE, (size_t)nbytes, NULL);
        if (st == GSER_OK)
            st = gser_stream_wait(pg_ctx, NULL);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (st) {
        Py_DECREF(out);
        return pg_raise(s, st, true, what);
    }
    return out;
}

PyDoc_STRVAR(darray_copy_to_host_doc,
"copy_to_host() -> numpy.ndarray\n\n"
"A new host array with this array's dtype, shape and contents, copied with\n"
"gser_device_memcpy (a bytearray when numpy is not installed).");

static PyObject *darray_copy_to_host(PgDeviceArray *self, PyObject *unused)
{
    (void)unused;
    PyObject *shape = darray_shape(self, NULL);
    if (!shape)
        return NULL;
    if (!self->strided) {
        PyObject *out = device_copy_to_host(self->owner->state, self->ptr, self->nbytes, shape, pg_dtype_typestr(self->dtype),
                                            "gser.DeviceArray.copy_to_host");
        Py_DECREF(shape);
        return out;
    }
    /* The span's bytes, then a host array with the same strides over them. */
    PyObject *span = Py_BuildValue("(n)", self->span);
    PyObject *bytes = span ? device_copy_to_host(self->owner->state, self->ptr + (unsigned long long)self->span_offset, self->span, span,
                                                 "|u1", "gser.DeviceArray.copy_to_host")
                           : NULL;
    PyObject *strides = bytes ? darray_strides(self, NULL) : NULL;
    PyObject *np = strides ? PyImport_ImportModule("numpy") : NULL;
    PyObject *out = np ? PyObject_CallMethod(np, "ndarray", "OsOnO", shape, pg_dtype_typestr(self->dtype), bytes,
                                             -self->span_offset, strides)
                       : NULL;
    Py_XDECREF(np);
    Py_XDECREF(strides);
    Py_XDECREF(bytes);
    Py_XDECREF(span);
    Py_DECREF(shape);
    return out;
}

static PyObject *darray_repr(PgDeviceArray *self)
{
    PyObject *shape = darray_shape(self, NULL);
    if (!shape)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("<gser.DeviceArray %s shape=%R (%zd bytes) on device %d at %p>",
                                       gser_dtype_str(self->dtype), shape, self->nbytes, self->device,
                                       (void *)(uintptr_t)self->ptr);
    Py_DECREF(shape);
    return r;
}

static Py_ssize_t darray_len(PgDeviceArray *self)
{
    return self->shape[0];
}

static PyGetSetDef darray_getset[] = {
    {"__cuda_array_interface__", (getter)darray_cai, NULL,
     "CUDA Array Interface v3: shape, typestr, data, strides (None in C order), stream None.", NULL},
    {"shape", (getter)darray_shape, NULL, "Extents, C order.", NULL},
    {"dtype", (getter)darray_dtype, NULL, "numpy.dtype of the elements (the typestr without numpy).", NULL},
    {"typestr", (getter)darray_typestr, NULL, "The array interface's typestr (\"<f8\", ...).", NULL},
    {"strides", (getter)darray_strides, NULL, "Byte strides; None in C order.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef darray_members[] = {
    {"nbytes", T_PYSSIZET, offsetof(PgDeviceArray, nbytes), READONLY, "Length in bytes."},
    {"device", T_INT, offsetof(PgDeviceArray, device), READONLY, "Device ordinal."},
    {"ptr", T_ULONGLONG, offsetof(PgDeviceArray, ptr), READONLY, "Device pointer."},
    {"ndim", T_INT, offsetof(PgDeviceArray, ndim), READONLY, "Number of dimensions."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(darray_dlpack_doc,
"__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) -> PyCapsule\n\n"
"Lend the array through DLPack (torch.from_dlpack, cupy.from_dlpack, ...):\n"
"a \"dltensor\" capsule, zero-copy, keeping this array alive until the consumer\n"
"lets go. The data is ready, so any stream is fine. copy=True and another\n"
"dl_device raise BufferError: gser does not copy here.");

static PyObject *darray_dlpack(PgDeviceArray *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kw, &stream, &max_version, &dl_device,
                                     &copy))
        return NULL;
    if (copy != Py_None && PyObject_IsTrue(copy)) {
        PyErr_SetString(PyExc_BufferError, "gser.DeviceArray.__dlpack__: copy=True is not supported");
        return NULL;
    }
    if (dl_device != Py_None) {
        int type = -1, id = -1;
        if (!PyArg_ParseTuple(dl_device, "ii:dl_device", &type, &id))
            return NULL;
        if (type != 2 || id != self->device) {
            PyErr_Format(PyExc_BufferError, "gser.DeviceArray.__dlpack__: the array is on CUDA device %d", self->device);
            return NULL;
        }
    }
    return pg_dlpack_export((PyObject *)self, (void *)(uintptr_t)self->ptr, self->dtype, self->ndim, self->shape,
                            self->strided ? self->strides : NULL, true, self->device);
}

static PyObject *darray_dlpack_device(PgDeviceArray *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(ii)", 2 /* kDLCUDA */, self->device);
}

static PyMethodDef darray_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))darray_dlpack, METH_VARARGS | METH_KEYWORDS, darray_dlpack_doc},
    {"__dlpack_device__", (PyCFunction)darray_dlpack_device, METH_NOARGS,
     "(2, device): DLPack's kDLCUDA and the device ordinal."},
    {"copy_to_host", (PyCFunction)darray_copy_to_host, METH_NOARGS, darray_copy_to_host_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot darray_slots[] = {
    {Py_tp_doc, "An array in device memory returned by gser.loads / gser.from_bytes: exposes\n"
                "__cuda_array_interface__ (v3, with dtype and shape; CuPy, Numba and PyTorch read it\n"
                "without copying) and DLPack (__dlpack__, __dlpack_device__), keeps the loaded message and its frames alive, and copies to the\n"
                "host with copy_to_host(). Its data is ready: loads waited for gser's device copies."},
    {Py_tp_dealloc, (void *)darray_dealloc},
    {Py_tp_traverse, (void *)darray_traverse},
    {Py_tp_repr, (void *)darray_repr},
    {Py_tp_getset, darray_getset},
    {Py_tp_members, darray_members},
    {Py_tp_methods, darray_methods},
    {Py_sq_length, (void *)darray_len},
    {0, NULL},
};

static PyType_Spec darray_spec = {
    .name = "gser.DeviceArray",
    .basicsize = sizeof(PgDeviceArray),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = darray_slots,
};

PyObject *pg_device_array_new(PgOwner *owner, const gser_buffer_desc_t *desc)
{
    size_t es = gser_dtype_size(desc->dtype);
    if (desc->nbytes > (size_t)PY_SSIZE_T_MAX || desc->ndim > PG_MAX_NDIM || !es) {
        PyErr_SetString(PyExc_ValueError, "gser: a device buffer too large for Python");
        return NULL;
    }
    PgDeviceArray *a = PyObject_GC_New(PgDeviceArray, owner->state->DeviceArray);
    if (!a)
        return NULL;
    a->owner = (PgOwner *)Py_NewRef((PyObject *)owner);
    a->ptr = (unsigned long long)(uintptr_t)desc->data;
    a->nbytes = (Py_ssize_t)desc->nbytes;
    a->dtype = desc->dtype;
    a->device = desc->device;
    /* A flat buffer is one-dimensional: nbytes / element size items. */
    a->ndim = desc->ndim ? (int)desc->ndim : 1;
    if (desc->ndim)
        for (uint32_t d = 0; d < desc->ndim; d++)
            a->shape[d] = (Py_ssize_t)desc->shape[d];
    else
        a->shape[0] = (Py_ssize_t)(desc->nbytes / es);
    a->strided = desc->strides != NULL;
    for (int d = 0; a->strided && d < a->ndim; d++)
        a->strides[d] = (Py_ssize_t)desc->strides[d];
    int64_t offset = 0;
    size_t span = desc->nbytes;
    if (a->strided && gser_buffer_get_span(desc, &offset, &span) != GSER_OK) /* gser made it: cannot be */
        offset = 0, span = 0;
    a->span_offset = (Py_ssize_t)offset;
    a->span = (Py_ssize_t)span;
    PyObject_GC_Track(a);
    return (PyObject *)a;
}

int pg_objects_add(PyObject *m, pg_state_t *s)
{
    if (pg_type_add(m, &frame_spec, &s->Frame, NULL) < 0 ||
        pg_type_add(m, &dframe_spec, &s->DeviceFrame, "DeviceFrame") < 0 ||
        pg_type_add(m, &darray_spec, &s->DeviceArray, "DeviceArray") < 0)
        return -1;
    return 0;
}
