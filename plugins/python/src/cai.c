/* The reader of __cuda_array_interface__ dicts (version 3), which the
 * encoder (device arrays) and loads (device frames) share.
 *
 * A leaf but for the dtype and shape checks (dtypes.c).
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

/* Version 3: the stream the data is produced on (1: legacy default, 2:
 * per-thread default, as CUDA's own handles; 0 is forbidden), into *stream
 * (left NULL without one). 0, or -1 with *why set or an exception. */
static int cai_stream(PyObject *cai, void **stream, const char **why)
{
    PyObject *stream_obj = PyDict_GetItemString(cai, "stream");
    if (!stream_obj || stream_obj == Py_None)
        return 0;
    if (!PyLong_Check(stream_obj)) {
        *why = "the stream is not an int";
        return -1;
    }
    void *sp = PyLong_AsVoidPtr(stream_obj);
    if (!sp && PyErr_Occurred())
        return -1;
    if (!sp) {
        *why = "stream 0, which the CUDA Array Interface forbids (ambiguous)";
        return -1;
    }
    *stream = sp;
    return 0;
}

int pg_cai_read(PyObject *cai, pg_cai_t *out, const char **why)
{
    *why = NULL;
    pg_cai_t r = {.stream = NULL, .strided = false};
    if (!PyDict_Check(cai)) {
        *why = "__cuda_array_interface__ is not a dict";
        return -1;
    }
    PyObject *shp = PyDict_GetItemString(cai, "shape");
    PyObject *ts = PyDict_GetItemString(cai, "typestr");
    PyObject *data = PyDict_GetItemString(cai, "data");
    PyObject *mask = PyDict_GetItemString(cai, "mask");
    if (!shp || !PyTuple_Check(shp) || !ts || !PyUnicode_Check(ts) || !data || !PyTuple_Check(data) ||
        PyTuple_GET_SIZE(data) < 1) {
        *why = "__cuda_array_interface__ lacks a shape tuple, a typestr or a data tuple";
        return -1;
    }
    if (mask && mask != Py_None) {
        *why = "masked device arrays are not supported";
        return -1;
    }
    bool big;
    r.dtype = pg_typestr_dtype(PyUnicode_AsUTF8(ts), &big);
    if (PyErr_Occurred())
        return -1;
    if (big || r.dtype == GSER_DTYPE_COUNT) {
        *why = big ? "big-endian device arrays are not supported" : "a typestr gser has no dtype for";
        return -1;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(shp);
    if (nd == 0 || nd > GSER_MAX_NDIM) {
        *why = nd ? "more dimensions than gser buffers have" : "zero-dimensional device arrays are not supported";
        return -1;
    }
    for (Py_ssize_t d = 0; d < nd; d++) {
        long long ext = PyLong_AsLongLong(PyTuple_GET_ITEM(shp, d));
        if (ext == -1 && PyErr_Occurred())
            return -1;
        r.shape[d] = ext;
    }
    size_t es = gser_dtype_size(r.dtype);
    uint64_t total;
    if (pg_extents_total(r.shape, (int)nd, es, &total, why) < 0)
        return -1;
    PyObject *st = PyDict_GetItemString(cai, "strides");
    if (st && st != Py_None) {
        if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) != nd) {
            *why = "strides do not match the shape";
            return -1;
        }
        for (Py_ssize_t d = 0; d < nd; d++) {
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(st, d));
            if (v == -1 && PyErr_Occurred())
                return -1;
            r.strides[d] = v;
        }
        /* Any layout travels (the core sends the span); C order needs no strides. */
        r.strided = total && !pg_c_contiguous(r.shape, r.strides, (int)nd, (int64_t)es);
    }
    void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (!p && PyErr_Occurred())
        return -1;
    if (!p && total) {
        *why = "a NULL data pointer";
        return -1;
    }
    if (cai_stream(cai, &r.stream, why) < 0)
        return -1;
    r.ptr = p;
    r.nbytes = (size_t)total;
    r.ndim = (uint32_t)nd;
    *out = r;
    return 0;
}
