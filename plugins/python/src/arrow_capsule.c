/* Arrow tables through the Arrow PyCapsule interface and gser::arrow's type
 * "arrow.array".
 *
 * dumps: an object with __arrow_c_device_array__ (preferred) or
 * __arrow_c_array__ exports its table as two capsules. The table is moved
 * out of them (the structs left in the capsules get release NULL, so their
 * destructors do nothing), lent to the message, and released by the owner
 * once the frames and the message are gone.
 *
 * loads: gser_arrow_take_value gives a table a new gser.ArrowArray owns; its
 * __arrow_c_device_array__ / __arrow_c_array__ hand the table over once, in
 * fresh capsules whose destructors release it unless a consumer moved it out;
 * __arrow_c_schema__ hands out copies of the schema, as often as asked.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#include <structmember.h>

#include <gser/arrow.h>

#ifdef GSER_PY_HAVE_ARROW
const bool pg_have_arrow = true;
#else
const bool pg_have_arrow = false;
#endif

/* Capsule names, from the Arrow PyCapsule interface. */
#define CAP_SCHEMA "arrow_schema"
#define CAP_ARRAY "arrow_array"
#define CAP_DEVICE_ARRAY "arrow_device_array"

gser_status_t pg_arrow_register(gser_context_t *ctx)
{
#ifdef GSER_PY_HAVE_ARROW
    return gser_arrow_register(ctx);
#else
    (void)ctx;
    return GSER_OK;
#endif
}

/* ---- dumps: importing a producer's table --------------------------------------------- */

int pg_arrow_probe(PyObject *obj)
{
    int r = pg_has_attr(obj, "__arrow_c_device_array__");
    if (r)
        return r < 0 ? -1 : 2;
    return pg_has_attr(obj, "__arrow_c_array__");
}

/* A table moved out of a producer's capsules, lent to a message. */
typedef struct held_table {
    struct ArrowDeviceArray array;
    struct ArrowSchema schema;
} held_table_t;

static void held_table_release(void *p)
{
    held_table_t *h = p;
    if (h->array.array.release)
        h->array.array.release(&h->array.array);
    if (h->schema.release)
        h->schema.release(&h->schema);
    free(h);
}

int pg_arrow_encode(PgOwner *owner, PyObject *obj, int method, gser_value_t **out, const char **why)
{
    *why = NULL;
    bool device = method == 2;
    const char *array_name = device ? CAP_DEVICE_ARRAY : CAP_ARRAY;
    PyObject *res = PyObject_CallMethod(obj, device ? "__arrow_c_device_array__" : "__arrow_c_array__", NULL);
    if (!res)
        return -1;
    PyObject *sc = NULL, *ac = NULL;
    if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
        sc = PyTuple_GET_ITEM(res, 0);
        ac = PyTuple_GET_ITEM(res, 1);
    }
    if (!sc) {
        *why = device ? "__arrow_c_device_array__() did not return a tuple of two capsules"
                      : "__arrow_c_array__() did not return a tuple of two capsules";
    } else if (!PyCapsule_IsValid(sc, CAP_SCHEMA)) {
        *why = "the first capsule is not an \"arrow_schema\" capsule";
    } else if (!PyCapsule_IsValid(ac, array_name)) {
        *why = device ? "the second capsule is not an \"arrow_device_array\" capsule"
                      : "the second capsule is not an \"arrow_array\" capsule";
    }
    if (*why) {
        Py_DECREF(res); /* the capsules' destructors release what they hold */
        return -1;
    }
    struct ArrowSchema *schema = PyCapsule_GetPointer(sc, CAP_SCHEMA);
    void *ap = PyCapsule_GetPointer(ac, array_name);
    struct ArrowArray *array = device ? &((struct ArrowDeviceArray *)ap)->array : ap;
    if (!schema->release || !array->release) {
        *why = "the producer exported a released struct (its release callback is NULL)";
        Py_DECREF(res);
        return -1;
    }
    held_table_t *h = calloc(1, sizeof *h);
    if (!h) {
        Py_DECREF(res);
        PyErr_NoMemory();
        return -1;
    }
    /* Move the structs out: the capsules keep released shells. */
    h->schema = *schema;
    schema->release = NULL;
    if (device) {
        h->array = *(struct ArrowDeviceArray *)ap;
    } else {
        h->array.array = *array;
        h->array.device_id = -1;
        h->array.device_type = ARROW_DEVICE_CPU;
    }
    array->release = NULL;
    Py_DECREF(res);
    /* Released after the frames and the message, which borrow it. */
    if (pg_owner_on_destroy(owner, held_table_release, h) < 0)
        return -1;
#ifdef GSER_PY_HAVE_ARROW
    gser_status_t st = gser_arrow_new_value(owner->msg, &h->array, &h->schema, NULL, out);
#else
    gser_status_t st = GSER_ERR_UNSUPPORTED;
    (void)out;
#endif
    if (st) {
        pg_raise(owner->state, st, false, "gser_arrow_new_value");
        return -1;
    }
    return 0;
}

/* ---- schema copies ----------------------------------------------------------------------- */

static void copy_release(struct ArrowSchema *s)
{
    for (int64_t i = 0; i < s->n_children; i++) {
        struct ArrowSchema *c = s->children[i];
        if (c->release)
            c->release(c);
        free(c);
    }
    free(s->children);
    if (s->dictionary) {
        if (s->dictionary->release)
            s->dictionary->release(s->dictionary);
        free(s->dictionary);
    }
    free((void *)s->format);
    free((void *)s->name);
    free((void *)s->metadata);
    s->release = NULL;
}

static char *dup_bytes(const char *p, size_t n)
{
    char *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
}

/* Bytes of an Arrow metadata block: int32 count, then int32-length-prefixed
 * keys and values (checked by gser::arrow when it was received). */
static size_t metadata_size(const char *m)
{
    int32_t n, len;
    memcpy(&n, m, 4);
    size_t at = 4;
    for (int32_t i = 0; i < 2 * n; i++) {
        memcpy(&len, m + at, 4);
        at += 4 + (size_t)len;
    }
    return at;
}

/* A deep copy with release callbacks of its own. On failure dst still has
 * one (it frees what was copied) and -1 is returned. */
static int copy_schema(struct ArrowSchema *dst, const struct ArrowSchema *src)
{
    memset(dst, 0, sizeof *dst);
    dst->release = copy_release;
    dst->flags = src->flags;
    if (!(dst->format = dup_bytes(src->format, strlen(src->format) + 1)))
        return -1;
    if (src->name && !(dst->name = dup_bytes(src->name, strlen(src->name) + 1)))
        return -1;
    if (src->metadata && !(dst->metadata = dup_bytes(src->metadata, metadata_size(src->metadata))))
        return -1;
    if (src->n_children > 0) {
        if (!(dst->children = calloc((size_t)src->n_children, sizeof *dst->children)))
            return -1;
        for (int64_t i = 0; i < src->n_children; i++) {
            struct ArrowSchema *c = malloc(sizeof *c);
            if (!c)
                return -1;
            dst->children[i] = c;
            dst->n_children = i + 1;
            if (copy_schema(c, src->children[i]) < 0)
                return -1;
        }
    }
    if (src->dictionary) {
        if (!(dst->dictionary = malloc(sizeof *dst->dictionary)))
            return -1;
        if (copy_schema(dst->dictionary, src->dictionary) < 0)
            return -1;
    }
    return 0;
}

/* ---- capsules -------------------------------------------------------------------------- */

/* Destructors: release what no consumer moved out, then free the struct. */
static void schema_capsule_free(PyObject *cap)
{
    struct ArrowSchema *s = PyCapsule_GetPointer(cap, CAP_SCHEMA);
    if (s) {
        if (s->release)
            s->release(s);
        free(s);
    }
}

static void array_capsule_free(PyObject *cap)
{
    struct ArrowArray *a = PyCapsule_GetPointer(cap, CAP_ARRAY);
    if (a) {
        if (a->release)
            a->release(a);
        free(a);
    }
}

static void device_array_capsule_free(PyObject *cap)
{
    struct ArrowDeviceArray *a = PyCapsule_GetPointer(cap, CAP_DEVICE_ARRAY);
    if (a) {
        if (a->array.release)
            a->array.release(&a->array);
        free(a);
    }
}

static PyObject *schema_capsule(const struct ArrowSchema *schema)
{
    struct ArrowSchema *s = malloc(sizeof *s);
    if (!s)
        return PyErr_NoMemory();
    if (copy_schema(s, schema) < 0) {
        s->release(s);
        free(s);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(s, CAP_SCHEMA, schema_capsule_free);
    if (!cap) {
        s->release(s);
        free(s);
    }
    return cap;
}

/* ---- gser.ArrowArray ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    struct ArrowDeviceArray *array; /* NULL once handed over */
    struct ArrowSchema schema;      /* release NULL when there is none */
    int64_t length;
    int64_t device_id;
    int32_t device_type;
} PgArrowArray;

static void aa_dealloc(PgArrowArray *self)
{
    if (self->array) {
        if (self->array->array.release)
            self->array->array.release(&self->array->array);
        free(self->array);
    }
    if (self->schema.release)
        self->schema.release(&self->schema);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int handed_over(PgArrowArray *self)
{
    if (self->array)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "gser.ArrowArray: the table was handed over already (an Arrow PyCapsule export moves it "
                    "to its one consumer)");
    return -1;
}

/* The arguments of the export methods: requested_schema (ignored, as the
 * interface allows: the table comes in its own schema) and, for
 * __arrow_c_device_array__, future keywords, refused unless None. */
static int export_args(PyObject *args, PyObject *kw, bool device, const char *name)
{
    Py_ssize_t npos = PyTuple_GET_SIZE(args);
    if (npos > 1) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 1 positional argument (%zd given)", name, npos);
        return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (kw && PyDict_Next(kw, &pos, &key, &value)) {
        if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, "requested_schema") == 0) {
            if (npos) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument 'requested_schema'", name);
                return -1;
            }
        } else if (!device) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", name, key);
            return -1;
        } else if (value != Py_None) {
            PyErr_Format(PyExc_NotImplementedError, "%s(): keyword %R is not supported", name, key);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(aa_schema_doc,
"__arrow_c_schema__() -> PyCapsule\n\n"
"A copy of the table's schema in an \"arrow_schema\" capsule (any number of times).");

static PyObject *aa_c_schema(PgArrowArray *self, PyObject *unused)
{
    (void)unused;
    return schema_capsule(&self->schema);
}

PyDoc_STRVAR(aa_device_array_doc,
"__arrow_c_device_array__(requested_schema=None, **kwargs) -> (schema, array)\n\n"
"Hand the table over: an \"arrow_schema\" capsule (a copy) and an\n"
"\"arrow_device_array\" capsule holding the table (ARROW_DEVICE_CPU or, in\n"
"device memory, ARROW_DEVICE_CUDA). One consumer: a second call raises\n"
"RuntimeError. requested_schema is ignored (the table keeps its schema).");

static PyObject *aa_c_device_array(PgArrowArray *self, PyObject *args, PyObject *kw)
{
    if (export_args(args, kw, true, "__arrow_c_device_array__") < 0 || handed_over(self) < 0)
        return NULL;
    PyObject *sc = schema_capsule(&self->schema);
    if (!sc)
        return NULL;
    PyObject *ac = PyCapsule_New(self->array, CAP_DEVICE_ARRAY, device_array_capsule_free);
    if (!ac) {
        Py_DECREF(sc);
        return NULL;
    }
    self->array = NULL; /* the capsule has it now */
    return Py_BuildValue("(NN)", sc, ac);
}

PyDoc_STRVAR(aa_array_doc,
"__arrow_c_array__(requested_schema=None) -> (schema, array)\n\n"
"Hand a CPU table over: an \"arrow_schema\" capsule (a copy) and an\n"
"\"arrow_array\" capsule. ValueError for a table in device memory (use\n"
"__arrow_c_device_array__). One consumer: a second call raises RuntimeError.");

static PyObject *aa_c_array(PgArrowArray *self, PyObject *args, PyObject *kw)
{
    if (export_args(args, kw, false, "__arrow_c_array__") < 0 || handed_over(self) < 0)
        return NULL;
    if (self->device_type != ARROW_DEVICE_CPU) {
        PyErr_Format(PyExc_ValueError,
                     "gser.ArrowArray: the table is in device memory (Arrow device type %d): "
                     "use __arrow_c_device_array__",
                     (int)self->device_type);
        return NULL;
    }
    struct ArrowArray *a = malloc(sizeof *a);
    if (!a)
        return PyErr_NoMemory();
    PyObject *sc = schema_capsule(&self->schema);
    if (!sc) {
        free(a);
        return NULL;
    }
    *a = self->array->array;
    PyObject *ac = PyCapsule_New(a, CAP_ARRAY, array_capsule_free);
    if (!ac) {
        free(a);
        Py_DECREF(sc);
        return NULL;
    }
    free(self->array); /* moved into a: a shell now */
    self->array = NULL;
    return Py_BuildValue("(NN)", sc, ac);
}

static PyObject *aa_format(PgArrowArray *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->schema.format ? self->schema.format : "");
}

static PyObject *aa_consumed(PgArrowArray *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->array == NULL);
}

static PyObject *aa_repr(PgArrowArray *self)
{
    const char *fmt = self->schema.format ? self->schema.format : "";
    if (self->device_type == ARROW_DEVICE_CPU)
        return PyUnicode_FromFormat("<gser.ArrowArray format '%s' length %lld on the CPU%s>", fmt,
                                    (long long)self->length, self->array ? "" : " (handed over)");
    return PyUnicode_FromFormat("<gser.ArrowArray format '%s' length %lld on device %lld (type %d)%s>", fmt,
                                (long long)self->length, (long long)self->device_id, (int)self->device_type,
                                self->array ? "" : " (handed over)");
}

static PyMethodDef aa_methods[] = {
    {"__arrow_c_schema__", (PyCFunction)aa_c_schema, METH_NOARGS, aa_schema_doc},
    {"__arrow_c_device_array__", (PyCFunction)(void (*)(void))aa_c_device_array, METH_VARARGS | METH_KEYWORDS,
     aa_device_array_doc},
    {"__arrow_c_array__", (PyCFunction)(void (*)(void))aa_c_array, METH_VARARGS | METH_KEYWORDS, aa_array_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef aa_getset[] = {
    {"format", (getter)aa_format, NULL, "The Arrow format string of the top-level array (\"+s\": a struct).",
     NULL},
    {"consumed", (getter)aa_consumed, NULL, "Whether the table was handed over to a consumer.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef aa_members[] = {
    {"length", T_LONGLONG, offsetof(PgArrowArray, length), READONLY, "Rows of the top-level array."},
    {"device_type", T_INT, offsetof(PgArrowArray, device_type), READONLY,
     "Arrow device type: 1 (ARROW_DEVICE_CPU) or 2 (ARROW_DEVICE_CUDA)."},
    {"device_id", T_LONGLONG, offsetof(PgArrowArray, device_id), READONLY, "Device ordinal; -1 on the CPU."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot aa_slots[] = {
    {Py_tp_doc, "An Arrow table (array) returned by gser.loads / gser.from_bytes. It owns the table\n"
                "(nothing of the message) and hands it over once through the Arrow PyCapsule\n"
                "interface: __arrow_c_device_array__, __arrow_c_array__ (CPU tables), and\n"
                "__arrow_c_schema__ (copies)."},
    {Py_tp_dealloc, (void *)aa_dealloc},
    {Py_tp_repr, (void *)aa_repr},
    {Py_tp_methods, aa_methods},
    {Py_tp_getset, aa_getset},
    {Py_tp_members, aa_members},
    {0, NULL},
};

/* Not a GC type: it holds no Python objects (the table is C memory). */
static PyType_Spec aa_spec = {
    .name = "gser.ArrowArray",
    .basicsize = sizeof(PgArrowArray),
    .flags = PG_TPFLAGS,
    .slots = aa_slots,
};

int pg_arrow_add(PyObject *m, pg_state_t *s)
{
    return pg_type_add(m, &aa_spec, &s->ArrowArray, "ArrowArray");
}

PyObject *pg_arrow_take(pg_state_t *s, gser_value_t *v, gser_status_t *st_out)
{
    *st_out = GSER_OK;
    PgArrowArray *self = PyObject_New(PgArrowArray, s->ArrowArray);
    if (!self)
        return NULL;
    memset(&self->schema, 0, sizeof self->schema);
    self->length = 0;
    self->device_id = -1;
    self->device_type = ARROW_DEVICE_CPU;
    self->array = calloc(1, sizeof *self->array);
    if (!self->array) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
#ifdef GSER_PY_HAVE_ARROW
    struct ArrowDeviceArray *array = self->array;
    gser_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = gser_arrow_take_value(v, NULL, array, &self->schema);
    Py_END_ALLOW_THREADS
#else
    gser_status_t st = GSER_ERR_UNSUPPORTED;
    (void)v;
#endif
    if (st) {
        free(self->array);
        self->array = NULL;
        memset(&self->schema, 0, sizeof self->schema);
        Py_DECREF(self);
        *st_out = st;
        return NULL;
    }
    self->length = self->array->array.length;
    self->device_id = self->array->device_id;
    self->device_type = self->array->device_type;
    return (PyObject *)self;
}
