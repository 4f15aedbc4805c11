/* A gser value tree -> Python objects.
 *
 * Scalars, str and bytes are copied into Python objects; lists and tuples
 * backed by a typed array are rebuilt in one loop over the array (an item
 * equal, bit for bit, to the one before it is shared, as ints and floats are
 * immutable); buffers become numpy arrays (memoryviews when numpy is not
 * installed, and for untyped bytes) that view the received memory through a
 * PgFrame, which keeps the message and its input alive; device buffers
 * become gser.DeviceArray objects, which keep them alive too. "arrow.array"
 * objects are taken out of the message into gser.ArrowArray objects.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <string.h>

#include <gser/arrow.h>

typedef struct dec {
    const pg_decode_ctx_t *dc;
    pg_path_t path;
} dec_t;

static PyObject *dec_value(dec_t *d, gser_value_t *v, int depth);

/* numpy.asarray, imported on first use; NULL when numpy is not installed. */
static PyObject *np_asarray;
static bool np_tried;

static PyObject *numpy_asarray(void)
{
    if (!np_tried) {
        np_tried = true;
        PyObject *np = PyImport_ImportModule("numpy");
        if (np) {
            np_asarray = PyObject_GetAttrString(np, "asarray");
            Py_DECREF(np);
        }
        if (!np_asarray)
            PyErr_Clear();
    }
    return np_asarray;
}

static PyObject *fail_st(gser_status_t st, const char *what)
{
    return pg_raise(st, false, what);
}

/* ---- lists -------------------------------------------------------------------------- */

static inline void seq_set(PyObject *seq, bool tuple, Py_ssize_t i, PyObject *x)
{
    if (tuple)
        PyTuple_SET_ITEM(seq, i, x);
    else
        PyList_SET_ITEM(seq, i, x);
}

/* Fill seq from a typed array; consecutive equal items share one object. */
static int dec_array(PyObject *seq, bool tuple, gser_kind_t kind, const void *data, size_t count)
{
    const unsigned char *p = data;
    PyObject *prev = NULL;
    uint64_t prev_bits = 0;
    for (size_t i = 0; i < count; i++) {
        PyObject *x;
        if (kind == GSER_KIND_BOOL) {
            x = Py_NewRef(p[i] ? Py_True : Py_False);
        } else {
            uint64_t bits;
            memcpy(&bits, p + 8 * i, 8);
            if (prev && bits == prev_bits) {
                x = Py_NewRef(prev);
            } else {
                if (kind == GSER_KIND_FLOAT) {
                    double f;
                    memcpy(&f, &bits, 8);
                    x = PyFloat_FromDouble(f);
                } else if (kind == GSER_KIND_INT) {
                    x = PyLong_FromLongLong((long long)(int64_t)bits);
                } else {
                    x = PyLong_FromUnsignedLongLong((unsigned long long)bits);
                }
                if (!x)
                    return -1;
                prev = x;
                prev_bits = bits;
            }
        }
        seq_set(seq, tuple, (Py_ssize_t)i, x);
    }
    return 0;
}

static PyObject *dec_list(dec_t *d, gser_value_t *v, int depth)
{
    bool tuple = gser_value_get_kind(v) == GSER_KIND_TUPLE;
    size_t n = gser_value_get_len(v);
    if (n > (size_t)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *seq = tuple ? PyTuple_New((Py_ssize_t)n) : PyList_New((Py_ssize_t)n);
    if (!seq)
        return NULL;
    gser_kind_t kind;
    const void *data;
    size_t count;
    if (gser_list_get_array(v, &kind, &data, &count) == GSER_OK && count == n) {
        if (dec_array(seq, tuple, kind, data, count) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        return seq;
    }
    int slot = d->path.len++;
    d->path.seg[slot].key = NULL;
    for (size_t i = 0; i < n; i++) {
        d->path.seg[slot].index = (Py_ssize_t)i;
        gser_value_t *item;
        gser_status_t st = gser_list_get(v, i, &item);
        PyObject *x = st ? fail_st(st, "gser_list_get") : dec_value(d, item, depth + 1);
        if (!x) {
            Py_DECREF(seq);
            return NULL;
        }
        seq_set(seq, tuple, (Py_ssize_t)i, x);
    }
    d->path.len--;
    return seq;
}

static PyObject *dec_map(dec_t *d, gser_value_t *v, int depth)
{
    PyObject *dict = PyDict_New();
    if (!dict)
        return NULL;
    size_t n = gser_value_get_len(v);
    int slot = d->path.len++;
    for (size_t i = 0; i < n; i++) {
        gser_value_t *k, *val;
        gser_status_t st = gser_map_get_at(v, i, &k, &val);
        if (st) {
            Py_DECREF(dict);
            return fail_st(st, "gser_map_get_at");
        }
        d->path.seg[slot].key = NULL;
        d->path.seg[slot].index = (Py_ssize_t)i;
        PyObject *key = dec_value(d, k, depth + 1);
        if (!key) {
            Py_DECREF(dict);
            return NULL;
        }
        d->path.seg[slot].key = key;
        PyObject *x = dec_value(d, val, depth + 1);
        int r = x ? PyDict_SetItem(dict, key, x) : -1;
        Py_XDECREF(x);
        Py_DECREF(key);
        if (r < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    d->path.len--;
    return dict;
}

/* ---- buffers -------------------------------------------------------------------------- */

static PyObject *dec_buffer(dec_t *d, const gser_value_t *v)
{
    gser_buffer_desc_t desc = GSER_BUFFER_DESC_INIT;
    gser_status_t st = gser_value_get_buffer(v, &desc);
    if (st)
        return fail_st(st, "gser_value_get_buffer");
    if (desc.strides) /* data..data+nbytes is not the memory of a strided buffer */
        return pg_path_raise(PyExc_NotImplementedError, GSER_OK, &d->path, "a strided buffer (not read here yet)");
    /* loads waited for the device copies gser made (desc.event) already. */
    if (desc.memory == GSER_MEMORY_DEVICE)
        return pg_device_array_new(d->dc->owner, &desc);
    if (desc.memory != GSER_MEMORY_HOST)
        return pg_path_raise(pg_GserError, GSER_ERR_FORMAT, &d->path, "a buffer in unknown memory kind %d",
                             (int)desc.memory);
    const char *fmt = pg_dtype_format(desc.dtype);
    if (!fmt)
        return pg_path_raise(PyExc_NotImplementedError, GSER_OK, &d->path,
                             "a buffer of dtype %s, which Python's buffer protocol and numpy cannot express",
                             gser_dtype_str(desc.dtype));
    if (desc.nbytes > (size_t)PY_SSIZE_T_MAX || desc.ndim > PG_MAX_NDIM)
        return pg_path_raise(PyExc_NotImplementedError, GSER_OK, &d->path, "a buffer too large for Python");
    size_t es = gser_dtype_size(desc.dtype);
    int64_t flat[1] = {(int64_t)(desc.nbytes / es)};
    bool bytes = desc.dtype == GSER_DTYPE_BYTES;
    int ndim = desc.ndim ? (int)desc.ndim : bytes ? 0 : 1;
    const int64_t *shape = desc.ndim ? desc.shape : flat;

    /* Writable exactly when the memory viewed may be written. */
    const pg_decode_ctx_t *dc = d->dc;
    const char *p = desc.data;
    bool in_header = p && p >= dc->header && p < dc->header + dc->header_len;
    bool readonly = in_header ? dc->header_readonly : dc->data_readonly;

    PyObject *frame = pg_frame_new(dc->owner, desc.data, (Py_ssize_t)desc.nbytes, readonly, fmt, (Py_ssize_t)es,
                                   ndim, shape);
    if (!frame)
        return NULL;
    PyObject *asarray = bytes ? NULL : numpy_asarray();
    PyObject *out = asarray ? PyObject_CallOneArg(asarray, frame) : PyMemoryView_FromObject(frame);
    Py_DECREF(frame);
    return out;
}

/* ---- dispatch ------------------------------------------------------------------------ */

static PyObject *dec_value(dec_t *d, gser_value_t *v, int depth)
{
    gser_status_t st = GSER_OK;
    switch (gser_value_get_kind(v)) {
    case GSER_KIND_NIL: Py_RETURN_NONE;
    case GSER_KIND_BOOL: {
        bool b = false;
        st = gser_value_get_bool(v, &b);
        if (st)
            break;
        return Py_NewRef(b ? Py_True : Py_False);
    }
    case GSER_KIND_INT: {
        int64_t i = 0;
        if ((st = gser_value_get_int(v, &i)))
            break;
        return PyLong_FromLongLong((long long)i);
    }
    case GSER_KIND_UINT: {
        uint64_t u = 0;
        if ((st = gser_value_get_uint(v, &u)))
            break;
        return PyLong_FromUnsignedLongLong((unsigned long long)u);
    }
    case GSER_KIND_FLOAT: {
        double f = 0;
        if ((st = gser_value_get_float(v, &f)))
            break;
        return PyFloat_FromDouble(f);
    }
    case GSER_KIND_STR: {
        const char *s;
        size_t len;
        if ((st = gser_value_get_str(v, &s, &len)))
            break;
        if (len > (size_t)PY_SSIZE_T_MAX)
            return PyErr_NoMemory();
        PyObject *u = PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, NULL);
        if (!u)
            return pg_path_raise(pg_GserError, GSER_ERR_FORMAT, &d->path, "a str that is not valid UTF-8");
        return u;
    }
    case GSER_KIND_BYTES: {
        const void *p;
        size_t len;
        if ((st = gser_value_get_bytes(v, &p, &len)))
            break;
        if (len > (size_t)PY_SSIZE_T_MAX)
            return PyErr_NoMemory();
        return PyBytes_FromStringAndSize(p, (Py_ssize_t)len);
    }
    case GSER_KIND_LIST:
    case GSER_KIND_TUPLE: return dec_list(d, v, depth);
    case GSER_KIND_MAP: return dec_map(d, v, depth);
    case GSER_KIND_BUFFER: return dec_buffer(d, v);
    case GSER_KIND_OBJECT:
    case GSER_KIND_SERIALIZED: {
        const char *type = "?";
        gser_serialized_info_t info = GSER_SERIALIZED_INFO_INIT;
        if (gser_value_get_serialized(v, &info) == GSER_OK) {
            type = info.type_name;
        } else if (gser_value_get_object(v, &type, NULL) == GSER_OK && pg_have_arrow &&
                   strcmp(type, GSER_ARROW_TYPE) == 0) {
            PyObject *t = pg_arrow_take((gser_value_t *)v, &st);
            if (!t && st)
                return pg_path_raise(pg_GserError, st, &d->path, "gser_arrow_take_value: %s", gser_status_str(st));
            return t;
        }
        if (pg_have_arrow)
            return pg_path_raise(PyExc_NotImplementedError, GSER_OK, &d->path,
                                 "a typed object of type \"%s\": the Python module loads \"" GSER_ARROW_TYPE
                                 "\" objects only",
                                 type);
        return pg_path_raise(PyExc_NotImplementedError, GSER_OK, &d->path,
                             "a typed object of type \"%s\": the Python module registers no gser types (it was "
                             "built without gser::arrow)",
                             type);
    }
    }
    if (st)
        return fail_st(st, "gser_value_get_*");
    return pg_path_raise(pg_GserError, GSER_ERR_FORMAT, &d->path, "a value of unknown kind %d",
                         (int)gser_value_get_kind(v));
}

PyObject *pg_decode(const pg_decode_ctx_t *dc, gser_value_t *root)
{
    dec_t d;
    d.dc = dc;
    d.path.len = 0;
    return dec_value(&d, root, 1);
}
