/* The flattened form for Python: gser.FlatBytes, what to_bytes returns, and
 * the primitives gser.dump and gser.load (gser/_flatio.py) are made of.
 *
 * FlatBytes memory is written once, right after it is allocated: a large
 * one is an anonymous mapping advised for huge pages, since a fresh bytes
 * object of a GiB faults in 4 KiB at a time and costs several times the copy
 * that fills it. */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <gser/testing.h>

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

/* Below this, PyMem_Malloc: a mapping costs two system calls. */
#define PG_FLAT_MAP_MIN ((size_t)1 << 20)

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
    size_t maplen; /* data is a mapping of maplen bytes; 0: PyMem_Malloc'd (or the empty string) */
    bool raw;      /* PyMem_RawMalloc'd, by pg_flat_mem_alloc */
} PgFlatBytes;

static char flat_empty[1];

static void flat_bytes_dealloc(PgFlatBytes *self)
{
    if (self->maplen)
        munmap(self->data, self->maplen);
    else if (self->raw)
        PyMem_RawFree(self->data);
    else if (self->data != flat_empty)
        PyMem_Free(self->data);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

PyObject *pg_flat_bytes_new(pg_state_t *s, size_t size, char **data)
{
    if (size > (size_t)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PgFlatBytes *self = PyObject_New(PgFlatBytes, s->FlatBytes);
    if (!self)
        return NULL;
    self->len = (Py_ssize_t)size;
    self->maplen = 0;
    self->raw = false;
    self->data = flat_empty;
    if (size >= PG_FLAT_MAP_MIN) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
            (void)madvise(p, size, MADV_HUGEPAGE); /* a hint: refused where THP is off */
#endif
            self->data = p;
            self->maplen = size;
        }
    }
    if (size && !self->maplen && !(self->data = PyMem_Malloc(size))) {
        self->data = flat_empty;
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    *data = self->data;
    return (PyObject *)self;
}

/* Without the GIL (gser_serialize_flat calls it): the same memory as
 * pg_flat_bytes_new's. */
void *pg_flat_mem_alloc(void *arg, size_t size)
{
    pg_flat_mem_t *m = arg;
    if (size > (size_t)PY_SSIZE_T_MAX)
        return NULL;
    m->size = size;
    m->maplen = 0;
    if (size >= PG_FLAT_MAP_MIN) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
            (void)madvise(p, size, MADV_HUGEPAGE);
#endif
            m->maplen = size;
            return m->data = p;
        }
    }
    return m->data = PyMem_RawMalloc(size ? size : 1);
}

void pg_flat_mem_free(pg_flat_mem_t *m)
{
    if (m->maplen)
        munmap(m->data, m->maplen);
    else
        PyMem_RawFree(m->data);
    m->data = NULL;
}

PyObject *pg_flat_bytes_adopt(pg_state_t *s, pg_flat_mem_t *m, size_t len)
{
    PgFlatBytes *self = PyObject_New(PgFlatBytes, s->FlatBytes);
    if (!self) {
        pg_flat_mem_free(m);
        return NULL;
    }
    self->data = m->data;
    self->len = (Py_ssize_t)len;
    self->maplen = m->maplen;
    self->raw = !m->maplen;
    m->data = NULL;
    return (PyObject *)self;
}

PyObject *pg_to_flat_bytes(pg_state_t *s, PyObject *obj, PyObject *families, PyObject *compression,
                           PyObject *threshold, PyObject *chunk)
{
    int codec;
    pg_encode_options_t eo = {0};
    if (pg_squeeze_parse(compression, threshold, chunk, &codec, &eo) < 0)
        return NULL;
    pg_flat_mem_t mem = {0};
    size_t written = 0;
    if (pg_serialize_flat(s, obj, families, codec, &eo, pg_flat_mem_alloc, &mem, &written) < 0) {
        if (mem.data)
            pg_flat_mem_free(&mem);
        return NULL;
    }
    return pg_flat_bytes_adopt(s, &mem, written);
}

static PyObject *flat_bytes_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_type(type);
    if (!s)
        return NULL;
    static char *kwlist[] = {"data", NULL};
    Py_buffer view;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*:FlatBytes", kwlist, &view))
        return NULL;
    char *dst;
    PyObject *out = pg_flat_bytes_new(s, (size_t)view.len, &dst);
    if (out && view.len) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return out;
}

static int flat_bytes_getbuffer(PgFlatBytes *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 1, flags);
}

static Py_ssize_t flat_bytes_length(PgFlatBytes *self)
{
    return self->len;
}

/* Indexing and slicing as bytes does: an int, or a new bytes object. */
static PyObject *flat_bytes_subscript(PgFlatBytes *self, PyObject *key)
{
    PyObject *mv = PyMemoryView_FromObject((PyObject *)self);
    if (!mv)
        return NULL;
    PyObject *r = PyObject_GetItem(mv, key);
    if (r && PyMemoryView_Check(r))
        Py_SETREF(r, PyBytes_FromObject(r));
    Py_DECREF(mv);
    return r;
}

static PyObject *flat_bytes_bytes(PgFlatBytes *self, PyObject *unused);

/* b + other: a new bytes, as bytes + other is. */
static PyObject *flat_bytes_concat(PgFlatBytes *self, PyObject *other)
{
    PyObject *b = flat_bytes_bytes(self, NULL);
    if (!b)
        return NULL;
    PyObject *r = PyNumber_Add(b, other);
    Py_DECREF(b);
    return r;
}

/* Equal to any bytes-like object with the same bytes, as bytes is. */
static PyObject *flat_bytes_richcompare(PgFlatBytes *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !PyObject_CheckBuffer(other))
        Py_RETURN_NOTIMPLEMENTED;
    Py_buffer view;
    if (PyObject_GetBuffer(other, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    bool eq = view.len == self->len && (self->len == 0 || memcmp(view.buf, self->data, (size_t)self->len) == 0);
    PyBuffer_Release(&view);
    return PyBool_FromLong(eq == (op == Py_EQ));
}

static PyObject *flat_bytes_bytes(PgFlatBytes *self, PyObject *unused)
{
    (void)unused;
    return PyBytes_FromStringAndSize(self->data, self->len);
}

static PyObject *flat_bytes_reduce(PgFlatBytes *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(O(N))", Py_TYPE(self), flat_bytes_bytes(self, NULL));
}

static PyObject *flat_bytes_repr(PgFlatBytes *self)
{
    return PyUnicode_FromFormat("<gser.FlatBytes of %zd bytes>", self->len);
}

static PyMethodDef flat_bytes_methods[] = {
    {"__bytes__", (PyCFunction)flat_bytes_bytes, METH_NOARGS, "A bytes copy."},
    {"__reduce__", (PyCFunction)flat_bytes_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(flat_bytes_doc,
"FlatBytes(data)\n\n"
"Immutable bytes: what gser.to_bytes returns. Read it wherever bytes is read\n"
"through the buffer protocol (memoryview, numpy.frombuffer, file.write,\n"
"socket.send, gser.from_bytes, which views it without copying); len(),\n"
"indexing (an int), slicing and + (a bytes copy), == with any bytes-like\n"
"object and bytes(b) (a copy) work as for bytes; it is not hashable and pickles as\n"
"itself. Its memory is allocated for it alone (an anonymous mapping advised\n"
"for huge pages from 1 MiB up) and written once. FlatBytes(data) copies any\n"
"bytes-like object into one.");

static PyType_Slot flat_bytes_slots[] = {
    {Py_tp_doc, (void *)flat_bytes_doc},
    {Py_tp_new, (void *)flat_bytes_new},
    {Py_tp_dealloc, (void *)flat_bytes_dealloc},
    {Py_tp_repr, (void *)flat_bytes_repr},
    {Py_tp_hash, (void *)PyObject_HashNotImplemented},
    {Py_tp_richcompare, (void *)flat_bytes_richcompare},
    {Py_bf_getbuffer, (void *)flat_bytes_getbuffer},
    {Py_mp_length, (void *)flat_bytes_length},
    {Py_mp_subscript, (void *)flat_bytes_subscript},
    {Py_sq_length, (void *)flat_bytes_length},
    {Py_sq_concat, (void *)flat_bytes_concat},
    {Py_tp_methods, flat_bytes_methods},
    {0, NULL},
};

/* Not a GC type: it holds no Python objects. */
static PyType_Spec flat_bytes_spec = {
    .name = "gser.FlatBytes",
    .basicsize = sizeof(PgFlatBytes),
    .flags = PG_TPFLAGS,
    .slots = flat_bytes_slots,
};

/* ---- dump: to a descriptor, or through a write method ---------------------------------- */

static PyObject *py_dump_fd(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"obj", "fd", "families", "compression", "compression_threshold",
                             "compression_chunk_size", NULL};
    PyObject *obj, *families = NULL, *compression = NULL, *threshold = NULL, *chunk = NULL;
    int fd;
    pg_flat_t fl;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|OOOO:_dump_fd", kwlist, &obj, &fd, &families, &compression,
                                     &threshold, &chunk) ||
        pg_flat_prepare(s, obj, families, compression, threshold, chunk, &fl) < 0)
        return NULL;
    gser_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = gser_flat_write_fd(fl.fr, fl.n, fd);
    Py_END_ALLOW_THREADS /* keeps errno */
    Py_DECREF(fl.owner);
    if (st == GSER_ERR_IO)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (st)
        return pg_raise(s, st, false, "gser_flat_write_fd");
    return PyLong_FromSize_t(fl.size);
}

/* Pieces go to write() as memoryviews over gser's memory, released after
 * each call: a writer that keeps one gets a released view, never a dangling
 * pointer. */
static gser_status_t write_piece(void *arg, const void *data, size_t size)
{
    PyObject *write = arg;
    const char *p = data;
    while (size) {
        PyObject *mv = PyMemoryView_FromMemory((char *)p, (Py_ssize_t)size, PyBUF_READ);
        if (!mv)
            return GSER_ERR_IO;
        PyObject *r = PyObject_CallOneArg(write, mv);
        PyObject *rel = PyObject_CallMethod(mv, "release", NULL);
        Py_DECREF(mv);
        if (!rel) { /* the writer kept an export of it */
            Py_XDECREF(r);
            return GSER_ERR_IO;
        }
        Py_DECREF(rel);
        if (!r)
            return GSER_ERR_IO;
        size_t done = size; /* None: all of it (socket.sendall) */
        if (r != Py_None) {
            Py_ssize_t w = PyLong_AsSsize_t(r);
            if (w < 0 || (size_t)w > size) {
                Py_DECREF(r);
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_OSError, "gser.dump: write() returned %zd for %zu bytes", w, size);
                return GSER_ERR_IO;
            }
            if (w == 0) {
                Py_DECREF(r);
                PyErr_SetString(PyExc_BlockingIOError, "gser.dump: write() wrote nothing (a non-blocking file?)");
                return GSER_ERR_IO;
            }
            done = (size_t)w;
        }
        Py_DECREF(r);
        p += done;
        size -= done;
    }
    return GSER_OK;
}

static PyObject *py_dump_write(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"obj", "write", "families", "compression", "compression_threshold",
                             "compression_chunk_size", NULL};
    PyObject *obj, *write, *families = NULL, *compression = NULL, *threshold = NULL, *chunk = NULL;
    pg_flat_t fl;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOO:_dump_write", kwlist, &obj, &write, &families, &compression,
                                     &threshold, &chunk) ||
        pg_flat_prepare(s, obj, families, compression, threshold, chunk, &fl) < 0)
        return NULL;
    gser_status_t st = gser_flat_write_sink(fl.fr, fl.n, write_piece, write);
    Py_DECREF(fl.owner);
    if (st == GSER_ERR_IO && PyErr_Occurred())
        return NULL;
    if (st)
        return pg_raise(s, st, false, "gser_flat_write_sink");
    return PyLong_FromSize_t(fl.size);
}

/* ---- load: from a descriptor, or a stream read piece by piece --------------------------- */

static PyObject *py_load_fd(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"fd", "mmap", "device", NULL};
    int fd, map = 0, device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|pp:_load_fd", kwlist, &fd, &map, &device))
        return NULL;
    PgOwner *owner = pg_owner_new(s);
    if (!owner)
        return NULL;
    gser_deserialize_options_t opts = GSER_DESERIALIZE_OPTIONS_INIT;
    opts.flags = (map ? GSER_DESERIALIZE_MMAP : 0) | (device ? GSER_DESERIALIZE_RESTORE_DEVICE : 0);
    gser_status_t st;
    gser_msg_t *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_deserialize_fd(pg_ctx, fd, &opts, &msg);
    Py_END_ALLOW_THREADS
    /* gser's own buffer, or a private mapping: writable */
    PyObject *out = pg_load_finish(owner, st, msg, false, "gser_deserialize_fd");
    Py_DECREF(owner);
    return out;
}

static PyObject *py_flat_need(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t need = 0;
    gser_status_t st = gser_flat_get_need(pg_ctx, view.len ? view.buf : flat_empty, (size_t)view.len, NULL, &need);
    PyBuffer_Release(&view);
    if (st)
        return pg_raise(pg_state_of_module(self), st, true, "gser_flat_get_need");
    return PyLong_FromUnsignedLongLong(need);
}

static PyMethodDef flatio_methods[] = {
    {"_dump_fd", (PyCFunction)(void (*)(void))py_dump_fd, METH_VARARGS | METH_KEYWORDS,
     "_dump_fd(obj, fd, families=None) -> int: the flattened form of obj written to fd (writev); its size."},
    {"_dump_write", (PyCFunction)(void (*)(void))py_dump_write, METH_VARARGS | METH_KEYWORDS,
     "_dump_write(obj, write, families=None) -> int: the flattened form of obj passed to write() piece by piece."},
    {"_load_fd", (PyCFunction)(void (*)(void))py_load_fd, METH_VARARGS | METH_KEYWORDS,
     "_load_fd(fd, mmap=False, device=False) -> obj: one flattened message read (or mapped) from fd."},
    {"_flat_need", (PyCFunction)py_flat_need, METH_O,
     "_flat_need(b) -> int: the bytes the flattened message starting with b needs, as far as b tells."},
    {NULL, NULL, 0, NULL},
};

int pg_flatio_add(PyObject *m, pg_state_t *s)
{
    if (pg_type_add(m, &flat_bytes_spec, &s->FlatBytes, "FlatBytes") < 0 || PyModule_AddFunctions(m, flatio_methods) < 0)
        return -1;
    return 0;
}

/* For the tests: the emulated backend's copy counters (gser/testing.h). */
PyObject *pg_device_stats(PyObject *self, PyObject *args)
{
    (void)self;
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p:_device_stats", &reset))
        return NULL;
    gser_device_stats_t st;
    gser_device_stats_get(&st);
    if (reset)
        gser_device_stats_reset();
    return Py_BuildValue("{sKsKsKsKsKsK}", "d2h_ops", (unsigned long long)st.d2h_ops, "d2h_copies",
                         (unsigned long long)st.d2h_copies, "d2h_bytes", (unsigned long long)st.d2h_bytes, "d2d_ops",
                         (unsigned long long)st.d2d_ops, "d2d_copies", (unsigned long long)st.d2d_copies,
                         "d2d_bytes", (unsigned long long)st.d2d_bytes);
}
