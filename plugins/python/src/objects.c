/* Owners of messages, and the buffer exporters that view their memory.
 *
 * Lifetime chain: numpy array -> memoryview -> PgFrame -> PgOwner -> gser
 * message + the Python buffers it borrows. The owner dies with the last
 * view, and then frees the message before releasing those buffers.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#include <structmember.h>

/* ---- PgOwner ------------------------------------------------------------------- */

static void owner_dealloc(PgOwner *self)
{
    PyObject_GC_UnTrack(self);
    /* The frames borrow the message, the message borrows the views. */
    gser_frames_destroy(self->frames);
    self->frames = NULL;
    gser_msg_destroy(self->msg);
    self->msg = NULL;
    for (Py_ssize_t i = self->nviews; i-- > 0;)
        PyBuffer_Release(&self->views[i]);
    PyMem_Free(self->views);
    self->views = NULL;
    self->nviews = 0;
    for (Py_ssize_t i = 0; i < self->nallocs; i++)
        free(self->allocs[i]);
    PyMem_Free(self->allocs);
    self->allocs = NULL;
    self->nallocs = 0;
    Py_CLEAR(self->refs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int owner_traverse(PgOwner *self, visitproc visit, void *arg)
{
    Py_VISIT(self->refs);
    for (Py_ssize_t i = 0; i < self->nviews; i++)
        Py_VISIT(self->views[i].obj);
    return 0;
}

PyTypeObject PgOwner_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gser._gser._Owner",
    .tp_doc = "Keeps a gser message and the memory it views alive (internal).",
    .tp_basicsize = sizeof(PgOwner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)owner_dealloc,
    .tp_traverse = (traverseproc)owner_traverse,
};

PgOwner *pg_owner_new(void)
{
    PgOwner *o = PyObject_GC_New(PgOwner, &PgOwner_Type);
    if (!o)
        return NULL;
    o->msg = NULL;
    o->frames = NULL;
    o->views = NULL;
    o->nviews = 0;
    o->capviews = 0;
    o->refs = NULL;
    o->allocs = NULL;
    o->nallocs = 0;
    o->capallocs = 0;
    PyObject_GC_Track(o);
    return o;
}

int pg_owner_hold_view(PgOwner *o, Py_buffer *view)
{
    if (o->nviews == o->capviews) {
        Py_ssize_t cap = o->capviews ? o->capviews * 2 : 4;
        Py_buffer *nv = PyMem_Realloc(o->views, (size_t)cap * sizeof *nv);
        if (!nv) {
            PyBuffer_Release(view);
            PyErr_NoMemory();
            return -1;
        }
        o->views = nv;
        o->capviews = cap;
    }
    o->views[o->nviews++] = *view;
    return 0;
}

int pg_owner_hold_ref(PgOwner *o, PyObject *obj)
{
    if (!o->refs && !(o->refs = PyList_New(0)))
        return -1;
    return PyList_Append(o->refs, obj);
}

int pg_owner_hold_alloc(PgOwner *o, void *p)
{
    if (o->nallocs == o->capallocs) {
        Py_ssize_t cap = o->capallocs ? o->capallocs * 2 : 4;
        void **na = PyMem_Realloc(o->allocs, (size_t)cap * sizeof *na);
        if (!na) {
            free(p);
            PyErr_NoMemory();
            return -1;
        }
        o->allocs = na;
        o->capallocs = cap;
    }
    o->allocs[o->nallocs++] = p;
    return 0;
}

/* ---- PgFrame: a buffer exporter ------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PgOwner *owner;
    char *ptr;
    Py_ssize_t len;
    Py_ssize_t itemsize;
    const char *format;
    int readonly;
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
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int frame_traverse(PgFrame *self, visitproc visit, void *arg)
{
    Py_VISIT(self->owner);
    return 0;
}

static PyBufferProcs frame_as_buffer = {
    .bf_getbuffer = (getbufferproc)frame_getbuffer,
};

PyTypeObject PgFrame_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gser._gser._Frame",
    .tp_doc = "Memory of a gser message, exported through the buffer protocol (internal).",
    .tp_basicsize = sizeof(PgFrame),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_traverse = (traverseproc)frame_traverse,
    .tp_as_buffer = &frame_as_buffer,
};

PyObject *pg_frame_new(PgOwner *owner, const void *ptr, Py_ssize_t len, bool readonly, const char *format,
                       Py_ssize_t itemsize, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > PG_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "gser: %d dimensions (at most %d)", ndim, PG_MAX_NDIM);
        return NULL;
    }
    PgFrame *f = PyObject_GC_New(PgFrame, &PgFrame_Type);
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
    Py_ssize_t stride = f->itemsize;
    for (int d = ndim; d-- > 0;) {
        f->shape[d] = (Py_ssize_t)shape[d];
        f->strides[d] = stride;
        stride *= f->shape[d] ? f->shape[d] : 1;
    }
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

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
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int dframe_traverse(PgDeviceFrame *self, visitproc visit, void *arg)
{
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
    return PyUnicode_FromFormat("<gser.DeviceFrame %zd bytes on device %d at 0x%zx>", self->nbytes, self->device,
                                (size_t)self->ptr);
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

static PySequenceMethods dframe_as_sequence = {
    .sq_length = (lenfunc)dframe_len,
};

PyTypeObject PgDeviceFrame_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gser.DeviceFrame",
    .tp_doc = "A frame in device memory produced by gser.dumps: exposes __cuda_array_interface__\n"
              "(one-dimensional bytes) and keeps the serialized message alive.",
    .tp_basicsize = sizeof(PgDeviceFrame),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)dframe_dealloc,
    .tp_traverse = (traverseproc)dframe_traverse,
    .tp_repr = (reprfunc)dframe_repr,
    .tp_getset = dframe_getset,
    .tp_members = dframe_members,
    .tp_as_sequence = &dframe_as_sequence,
};

PyObject *pg_device_frame_new(PgOwner *owner, const void *ptr, size_t len, int32_t device)
{
    if (len > PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PgDeviceFrame *f = PyObject_GC_New(PgDeviceFrame, &PgDeviceFrame_Type);
    if (!f)
        return NULL;
    f->owner = (PgOwner *)Py_NewRef((PyObject *)owner);
    f->ptr = (unsigned long long)(uintptr_t)ptr;
    f->nbytes = (Py_ssize_t)len;
    f->device = device;
    PyObject_GC_Track(f);
    return (PyObject *)f;
}
