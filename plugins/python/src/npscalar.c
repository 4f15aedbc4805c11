/* numpy scalars ("numpy.scalar"): (descr, the item's bytes).
 *
 * descr is the dtype's numpy.lib.format description (data: a str such as
 * "<f8" or "<M8[ns]", lists for structured dtypes); the receiver rebuilds
 * the dtype with descr_to_dtype and the scalar with numpy's own
 * numpy._core.multiarray.scalar(dtype, bytes) (numpy.core in numpy 1.x),
 * which is what numpy's pickle calls, so the type and value come back
 * exactly. Descriptions are cached per dtype on both sides: a message
 * holding a number stays cheap.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <string.h>

/* Bounded caches: dtypes are few in practice, but datetime units and
 * structured dtypes could make them grow from the wire. */
#define NPS_CACHE_MAX 256

/* numpy, imported into the state on first use (pg_nps_t). */
static bool nps_ready(pg_state_t *s)
{
    pg_nps_t *nps = &s->nps;
    if (nps->tried)
        return nps->generic != NULL;
    nps->tried = true;
    PyObject *mod = PyImport_ImportModule("numpy");
    PyObject *fmt = mod ? PyImport_ImportModule("numpy.lib.format") : NULL;
    /* numpy 2 moved it to numpy._core (numpy.core is a deprecated alias
     * there, and the module numpy's own pickle names); numpy 1.x: numpy.core. */
    PyObject *ma = fmt ? PyImport_ImportModule("numpy._core.multiarray") : NULL;
    if (fmt && !ma) {
        PyErr_Clear();
        ma = PyImport_ImportModule("numpy.core.multiarray");
    }
    bool ok = ma && (nps->scalar = PyObject_GetAttrString(ma, "scalar")) &&
              (nps->dtype_to_descr = PyObject_GetAttrString(fmt, "dtype_to_descr")) &&
              (nps->descr_to_dtype = PyObject_GetAttrString(fmt, "descr_to_dtype")) &&
              (nps->descr_of = PyDict_New()) && (nps->dtype_of = PyDict_New()) &&
              (nps->generic = PyObject_GetAttrString(mod, "generic"));
    if (!ok) {
        PyErr_Clear();
        Py_CLEAR(nps->scalar);
        Py_CLEAR(nps->dtype_to_descr);
        Py_CLEAR(nps->descr_to_dtype);
        Py_CLEAR(nps->descr_of);
        Py_CLEAR(nps->dtype_of);
        Py_CLEAR(nps->generic);
    }
    Py_XDECREF(ma);
    Py_XDECREF(fmt);
    Py_XDECREF(mod);
    return nps->generic != NULL;
}

static int cache_put(PyObject *cache, PyObject *key, PyObject *value)
{
    if (PyDict_GET_SIZE(cache) >= NPS_CACHE_MAX)
        PyDict_Clear(cache);
    return PyDict_SetItem(cache, key, value);
}

/* Whether numpy dtype dt holds Python objects: 1, 0, or -1 with an exception set. */
static int dtype_has_objects(PyObject *dt)
{
    PyObject *hasobj = PyObject_GetAttrString(dt, "hasobject");
    int objects = hasobj ? PyObject_IsTrue(hasobj) : -1;
    Py_XDECREF(hasobj);
    return objects;
}

int pg_npscalar_check(pg_state_t *s, PyObject *o)
{
    /* numpy's scalar types are all named "numpy.<name>"; the isinstance check
     * only runs for those. */
    if (strncmp(Py_TYPE(o)->tp_name, "numpy.", 6) != 0)
        return 0;
    if (!nps_ready(s))
        return 0;
    return PyObject_TypeCheck(o, (PyTypeObject *)s->nps.generic);
}

int pg_npscalar_encode(pg_state_t *s, gser_msg_t *msg, PyObject *o, const char **why, gser_value_t **tree_out)
{
    pg_nps_t *nps = &s->nps;
    *why = NULL;
    PyObject *dt = PyObject_GetAttrString(o, "dtype");
    if (!dt)
        return -1;
    PyObject *descr = PyDict_GetItemWithError(nps->descr_of, dt);
    if (descr) {
        Py_INCREF(descr);
    } else if (!PyErr_Occurred()) {
        int objects = dtype_has_objects(dt);
        if (objects) {
            Py_DECREF(dt);
            if (objects > 0)
                *why = " with Python objects in its dtype (gser never pickles)";
            return -1;
        }
        descr = PyObject_CallOneArg(nps->dtype_to_descr, dt);
        if (descr && cache_put(nps->descr_of, dt, descr) < 0)
            Py_CLEAR(descr);
    }
    Py_DECREF(dt);
    if (!descr)
        return -1;
    /* The descr is a str, or lists and tuples of them for structured dtypes:
     * plain gser values, written here without the encoder's checks. */
    Py_buffer view;
    PyObject *raw = NULL;
    const void *p;
    size_t n;
    if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) == 0) {
        p = view.buf;
        n = (size_t)view.len;
    } else {
        PyErr_Clear();
        raw = PyObject_CallMethod(o, "tobytes", NULL);
        if (!raw || !PyBytes_Check(raw)) {
            Py_XDECREF(raw);
            Py_DECREF(descr);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "numpy scalar tobytes() did not return bytes");
            return -1;
        }
        p = PyBytes_AS_STRING(raw);
        n = (size_t)PyBytes_GET_SIZE(raw);
    }
    gser_value_t *tree = NULL, *dv = NULL, *bv = NULL;
    gser_status_t st = gser_msg_new_tuple(msg, &tree);
    if (!st)
        st = gser_msg_new_bytes(msg, p, n, &bv);
    if (raw)
        Py_DECREF(raw);
    else
        PyBuffer_Release(&view);
    int r = 0;
    if (!st) {
        r = pg_encode_plain(s, msg, descr, &dv);
        if (r == 0 && ((st = gser_list_append(tree, dv)) || (st = gser_list_append(tree, bv))))
            r = -1;
    }
    Py_DECREF(descr);
    if (st) {
        pg_raise(s, st, false, "numpy scalar");
        return -1;
    }
    if (r < 0)
        return -1;
    *tree_out = tree;
    return 0;
}

/* str, int, lists and tuples of those: a dtype description. */
int pg_encode_plain(pg_state_t *s, gser_msg_t *msg, PyObject *o, gser_value_t **out)
{
    gser_status_t st;
    if (PyUnicode_CheckExact(o)) {
        Py_ssize_t len;
        const char *u = PyUnicode_AsUTF8AndSize(o, &len);
        if (!u)
            return -1;
        st = gser_msg_new_str(msg, u, (size_t)len, out);
    } else if (PyLong_CheckExact(o)) {
        long long v = PyLong_AsLongLong(o);
        if (v == -1 && PyErr_Occurred())
            return -1;
        st = gser_msg_new_int(msg, (int64_t)v, out);
    } else if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        bool tuple = PyTuple_CheckExact(o);
        gser_value_t *seq;
        st = tuple ? gser_msg_new_tuple(msg, &seq) : gser_msg_new_list(msg, &seq);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        for (Py_ssize_t i = 0; !st && i < n; i++) {
            gser_value_t *item;
            if (pg_encode_plain(s, msg, PySequence_Fast_GET_ITEM(o, i), &item) < 0)
                return -1;
            st = gser_list_append(seq, item);
        }
        *out = seq;
    } else {
        PyErr_Format(PyExc_NotImplementedError, "gser: a numpy dtype description holding a %s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (st) {
        pg_raise(s, st, false, "numpy dtype description");
        return -1;
    }
    return 0;
}

PyObject *pg_npscalar_decode(pg_state_t *s, PyObject *descr, const void *p, size_t n, const char **why)
{
    pg_nps_t *nps = &s->nps;
    *why = NULL;
    if (!nps_ready(s)) {
        PyErr_SetString(PyExc_NotImplementedError, "a numpy scalar, and numpy is not installed");
        return NULL;
    }
    PyObject *dt = PyUnicode_CheckExact(descr) ? PyDict_GetItemWithError(nps->dtype_of, descr) : NULL;
    if (dt) {
        Py_INCREF(dt);
    } else {
        if (PyErr_Occurred())
            return NULL;
        /* numpy.load's reader of descriptions: no code runs from the data. */
        dt = PyObject_CallOneArg(nps->descr_to_dtype, descr);
        if (!dt) {
            PyErr_Clear();
            *why = "a bad dtype description";
            return NULL;
        }
        int objects = dtype_has_objects(dt);
        if (objects) {
            Py_DECREF(dt);
            if (objects > 0)
                *why = "Python objects in its dtype";
            return NULL;
        }
        if (PyUnicode_CheckExact(descr) && cache_put(nps->dtype_of, descr, dt) < 0) {
            Py_DECREF(dt);
            return NULL;
        }
    }
    PyObject *isz = PyObject_GetAttrString(dt, "itemsize");
    Py_ssize_t itemsize = isz ? PyLong_AsSsize_t(isz) : -1;
    Py_XDECREF(isz);
    PyObject *out = NULL;
    if (itemsize < 0) {
        ;
    } else if ((size_t)itemsize != n) {
        *why = "the dtype's item size does not match the bytes";
    } else {
        PyObject *b = PyBytes_FromStringAndSize(n ? p : "", (Py_ssize_t)n);
        out = b ? PyObject_CallFunctionObjArgs(nps->scalar, dt, b, NULL) : NULL;
        Py_XDECREF(b);
    }
    Py_DECREF(dt);
    return out;
}
