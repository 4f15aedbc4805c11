/* Columns of str (pandas object and string[python] columns) as one offsets
 * buffer and one UTF-8 buffer, packed and unpacked in C: item by item in
 * Python (or pickle) costs far more than the copy.
 *
 *   _pack_str(arr, na) -> (offsets, data, kinds)
 *   _unpack_str(offsets, data, kinds, out, na)
 *
 * arr and out are C-contiguous numpy arrays of dtype object, read through
 * __array_interface__ (the module does not link numpy). offsets: n + 1
 * native int64, data: the items' UTF-8, kinds: None when every item is a
 * str, else one byte per item: 0 str, 1 None, 2 a float NaN, 3 na (pd.NA).
 * Anything else in arr raises NotImplementedError (gser never pickles).
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <math.h>
#include <string.h>

enum { K_STR, K_NONE, K_NAN, K_NA };

/* The item pointers of a C-contiguous object array, or NULL with an error. */
static PyObject **object_items(PyObject *arr, bool writable, Py_ssize_t *n_out)
{
    if (strcmp(Py_TYPE(arr)->tp_name, "numpy.ndarray") != 0) {
        PyErr_Format(PyExc_TypeError, "expected a numpy array of objects, not %s", Py_TYPE(arr)->tp_name);
        return NULL;
    }
    PyObject *ai = PyObject_GetAttrString(arr, "__array_interface__");
    if (!ai)
        return NULL;
    PyObject **items = NULL;
    PyObject *ts = PyDict_Check(ai) ? PyDict_GetItemString(ai, "typestr") : NULL;
    PyObject *shape = PyDict_Check(ai) ? PyDict_GetItemString(ai, "shape") : NULL;
    PyObject *strides = PyDict_Check(ai) ? PyDict_GetItemString(ai, "strides") : NULL;
    PyObject *data = PyDict_Check(ai) ? PyDict_GetItemString(ai, "data") : NULL;
    if (!ts || !PyUnicode_Check(ts) || PyUnicode_CompareWithASCIIString(ts, "|O") != 0 || !shape ||
        !PyTuple_Check(shape) || (strides && strides != Py_None) || !data || !PyTuple_Check(data) ||
        PyTuple_GET_SIZE(data) != 2) {
        PyErr_SetString(PyExc_TypeError, "expected a C-contiguous numpy array of objects");
        goto done;
    }
    if (writable && PyObject_IsTrue(PyTuple_GET_ITEM(data, 1))) {
        PyErr_SetString(PyExc_TypeError, "expected a writable numpy array of objects");
        goto done;
    }
    Py_ssize_t n = 1;
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++) {
        Py_ssize_t ext = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (ext < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a negative extent");
            goto done;
        }
        n *= ext;
    }
    items = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (!items && !PyErr_Occurred()) {
        static PyObject *none_items[1];
        items = none_items; /* numpy may give NULL for an empty array */
        if (n) {
            PyErr_SetString(PyExc_ValueError, "a NULL data pointer");
            items = NULL;
        }
    }
    *n_out = n;
done:
    Py_DECREF(ai);
    return items;
}

/* The UTF-8 length of s; -1 if it holds a surrogate (not UTF-8). */
static Py_ssize_t utf8_len(PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s))
        return n;
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    Py_ssize_t len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, i);
        if (c >= 0xD800 && c <= 0xDFFF)
            return -1;
        len += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    }
    return len;
}

static char *utf8_write(PyObject *s, char *p)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s)) {
        memcpy(p, PyUnicode_DATA(s), (size_t)n);
        return p + n;
    }
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, i);
        if (c < 0x80) {
            *p++ = (char)c;
        } else if (c < 0x800) {
            *p++ = (char)(0xC0 | (c >> 6));
            *p++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            *p++ = (char)(0xE0 | (c >> 12));
            *p++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (char)(0x80 | (c & 0x3F));
        } else {
            *p++ = (char)(0xF0 | (c >> 18));
            *p++ = (char)(0x80 | ((c >> 12) & 0x3F));
            *p++ = (char)(0x80 | ((c >> 6) & 0x3F));
            *p++ = (char)(0x80 | (c & 0x3F));
        }
    }
    return p;
}

static PyObject *py_pack_str(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *arr, *na;
    if (!PyArg_ParseTuple(args, "OO:_pack_str", &arr, &na))
        return NULL;
    Py_ssize_t n;
    PyObject **items = object_items(arr, false, &n);
    if (!items)
        return NULL;
    if (n > (PY_SSIZE_T_MAX / 8) - 1)
        return PyErr_NoMemory();
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 8);
    PyObject *kinds = NULL, *data = NULL;
    if (!offsets)
        return NULL;
    /* Pass 1: kinds and offsets. The array is held (arr), and nothing here
     * runs Python code, so its items stay put between the passes. */
    char *offp = PyBytes_AS_STRING(offsets);
    int64_t total = 0;
    memcpy(offp, &total, 8);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = items[i];
        int k;
        if (PyUnicode_CheckExact(x)) {
            if (PyUnicode_READY(x) < 0)
                goto fail;
            Py_ssize_t len = utf8_len(x);
            if (len < 0) {
                PyErr_Format(PyExc_NotImplementedError,
                             "gser cannot carry item %zd of a str column: it holds a surrogate (not UTF-8)", i);
                goto fail;
            }
            total += len;
            k = K_STR;
        } else if (x == Py_None) {
            k = K_NONE;
        } else if (PyFloat_CheckExact(x) && isnan(PyFloat_AS_DOUBLE(x))) {
            k = K_NAN;
        } else if (x == na) {
            k = K_NA;
        } else {
            PyErr_Format(PyExc_NotImplementedError,
                         "gser cannot carry item %zd of an object column, of type %s: gser carries object "
                         "columns of str (with None, NaN or pd.NA) only, never pickles",
                         i, Py_TYPE(x)->tp_name);
            goto fail;
        }
        if (k != K_STR && !kinds) {
            if (!(kinds = PyBytes_FromStringAndSize(NULL, n)))
                goto fail;
            memset(PyBytes_AS_STRING(kinds), K_STR, (size_t)n);
        }
        if (kinds)
            PyBytes_AS_STRING(kinds)[i] = (char)k;
        memcpy(offp + 8 * (i + 1), &total, 8);
    }
    if (!(data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total)))
        goto fail;
    char *p = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_CheckExact(items[i]))
            p = utf8_write(items[i], p);
    return Py_BuildValue("(NNN)", offsets, data, kinds ? kinds : Py_NewRef(Py_None));
fail:
    Py_XDECREF(offsets);
    Py_XDECREF(kinds);
    Py_XDECREF(data);
    return NULL;
}

static PyObject *bad(const pg_state_t *s, const char *fmt, Py_ssize_t i)
{
    PyObject *text = PyUnicode_FromFormat(fmt, i);
    return text ? pg_raise_text(s, GSER_ERR_FORMAT, text) : NULL;
}

/* Item i of a str column: kind k, its n bytes at p. A new reference, or NULL
 * with GserError (malformed) or another exception set. */
static PyObject *unpack_item(const pg_state_t *s, int k, const char *p, int64_t n, PyObject *na, Py_ssize_t i)
{
    if (k == K_STR) {
        PyObject *x = PyUnicode_DecodeUTF8(p, (Py_ssize_t)n, "strict");
        if (!x) {
            PyErr_Clear();
            bad(s, "item %zd of a str column is not valid UTF-8", i);
        }
        return x;
    }
    if (n != 0)
        return bad(s, "item %zd of a str column is missing but has bytes", i);
    if (k == K_NONE)
        return Py_NewRef(Py_None);
    if (k == K_NAN)
        return PyFloat_FromDouble(Py_NAN);
    if (k == K_NA)
        return Py_NewRef(na);
    return bad(s, "item %zd of a str column has an unknown kind", i);
}

static PyObject *py_unpack_str(PyObject *self, PyObject *args)
{
    const pg_state_t *s = pg_state_of_module(self);
    PyObject *offo, *datao, *kindso, *out, *na;
    if (!PyArg_ParseTuple(args, "OOOOO:_unpack_str", &offo, &datao, &kindso, &out, &na))
        return NULL;
    Py_ssize_t n;
    PyObject **items = object_items(out, true, &n);
    if (!items)
        return NULL;
    Py_buffer off, data, kinds = {0};
    if (PyObject_GetBuffer(offo, &off, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(datao, &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&off);
        return NULL;
    }
    bool have_kinds = kindso != Py_None;
    if (have_kinds && PyObject_GetBuffer(kindso, &kinds, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&off);
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *r = NULL;
    if (off.len != (n + 1) * 8) {
        bad(s, "a str column of %zd items whose offsets do not have n + 1 int64 entries", n);
        goto done;
    }
    if (have_kinds && kinds.len != n) {
        bad(s, "a str column of %zd items whose kinds do not have n entries", n);
        goto done;
    }
    const char *ob = off.buf, *db = data.buf;
    const unsigned char *kb = kinds.buf;
    int64_t lo;
    memcpy(&lo, ob, 8);
    if (lo != 0) {
        bad(s, "a str column whose first offset is not 0 (%zd)", 0);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t hi;
        memcpy(&hi, ob + 8 * (i + 1), 8);
        if (hi < lo || hi > (int64_t)data.len) {
            bad(s, "item %zd of a str column: its offsets are decreasing or past the data", i);
            goto done;
        }
        PyObject *x = unpack_item(s, have_kinds ? kb[i] : K_STR, db + lo, hi - lo, na, i);
        if (!x)
            goto done;
        /* numpy filled the fresh array with None: replace it. */
        PyObject *old = items[i];
        items[i] = x;
        Py_XDECREF(old);
        lo = hi;
    }
    r = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&off);
    PyBuffer_Release(&data);
    if (have_kinds)
        PyBuffer_Release(&kinds);
    return r;
}

PyMethodDef pg_strcol_methods[] = {
    {"_pack_str", py_pack_str, METH_VARARGS,
     "_pack_str(arr, na) -> (offsets, data, kinds): a C-contiguous object array of str (None, NaN, na) as "
     "n + 1 int64 offsets, UTF-8 data and per-item kinds (None: all str)."},
    {"_unpack_str", py_unpack_str, METH_VARARGS,
     "_unpack_str(offsets, data, kinds, out, na): fill the fresh object array out from _pack_str's buffers."},
    {NULL, NULL, 0, NULL},
};
