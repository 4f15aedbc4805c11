/* What the encoder (encode.c) and decoder (decode.c) share for Python's
 * standard data types in "python.tree" values: the classes of the standard
 * library, ints of any size as bytes, and the packed datetime fields.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

/* The class name of module mod, a new reference (NULL, exception set). */
static PyObject *import_attr(const char *mod, const char *name)
{
    PyObject *m = PyImport_ImportModule(mod);
    PyObject *a = m ? PyObject_GetAttrString(m, name) : NULL;
    Py_XDECREF(m);
    return a;
}

int pg_std_ready(pg_state_t *s)
{
    pg_std_t *st = &s->std;
    if (st->tried)
        return st->Decimal ? 0 : -1;
    if (!(st->Decimal = import_attr("decimal", "Decimal")) || !(st->UUID = import_attr("uuid", "UUID")) ||
        !(st->SafeUUID = import_attr("uuid", "SafeUUID")) ||
        !(st->SafeUUID_unknown = PyObject_GetAttrString(st->SafeUUID, "unknown")) ||
        !(st->Fraction = import_attr("fractions", "Fraction")) ||
        !(st->ZoneInfo = import_attr("zoneinfo", "ZoneInfo")) ||
        !(st->str_int = PyUnicode_InternFromString("int")) ||
        !(st->str_is_safe = PyUnicode_InternFromString("is_safe"))) {
        Py_CLEAR(st->Decimal);
        Py_CLEAR(st->UUID);
        Py_CLEAR(st->SafeUUID);
        Py_CLEAR(st->SafeUUID_unknown);
        Py_CLEAR(st->Fraction);
        Py_CLEAR(st->ZoneInfo);
        Py_CLEAR(st->str_int);
        Py_CLEAR(st->str_is_safe);
        return -1; /* tried again next time: an import can fail for a passing reason */
    }
    st->tried = true;
    return 0;
}

#if PY_VERSION_HEX >= 0x030D0000
PyObject *pg_long_from_le(const unsigned char *p, size_t n, bool is_signed)
{
    int flags = Py_ASNATIVEBYTES_LITTLE_ENDIAN;
    return is_signed ? PyLong_FromNativeBytes(p, n, flags)
                     : PyLong_FromUnsignedNativeBytes(p, n, flags | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
}
#else
PyObject *pg_long_from_le(const unsigned char *p, size_t n, bool is_signed)
{
    return _PyLong_FromByteArray(p, n, 1, is_signed);
}
#endif

PyObject *pg_long_from_be16(const unsigned char *p)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyLong_FromUnsignedNativeBytes(p, 16, Py_ASNATIVEBYTES_BIG_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
#else
    return _PyLong_FromByteArray(p, 16, 0, 0);
#endif
}

int pg_long_write_le(PyObject *o, unsigned char *p, size_t n)
{
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t r = PyLong_AsNativeBytes(o, p, (Py_ssize_t)n, Py_ASNATIVEBYTES_LITTLE_ENDIAN);
    if (r < 0)
        return -1;
    if ((size_t)r > n) {
        PyErr_SetString(PyExc_OverflowError, "int does not fit");
        return -1;
    }
    return 0;
#else
    return _PyLong_AsByteArray((PyLongObject *)o, p, n, 1, 1);
#endif
}

PyObject *pg_long_to_le(PyObject *o)
{
    /* bit_length() + 1 bits hold the value with its sign. */
    size_t bits = _PyLong_NumBits(o);
    if (bits == (size_t)-1 && PyErr_Occurred())
        return NULL;
    size_t n = bits / 8 + 1;
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (b && pg_long_write_le(o, (unsigned char *)PyBytes_AS_STRING(b), n) < 0)
        Py_CLEAR(b);
    return b;
}

/* datetime: year 14 bits (<< 46), month 4 (<< 42), day 5 (<< 37), hour 5
 * (<< 32), minute 6 (<< 26), second 6 (<< 20), microsecond 20, fold << 60. */
int64_t pg_pack_datetime(int y, int mo, int d, int h, int mi, int s, int us, int fold)
{
    return (int64_t)y << 46 | (int64_t)mo << 42 | (int64_t)d << 37 | (int64_t)h << 32 | (int64_t)mi << 26 |
           (int64_t)s << 20 | (int64_t)us | (int64_t)(fold != 0) << 60;
}

/* time: the same low 37 bits, fold << 37. */
int64_t pg_pack_time(int h, int mi, int s, int us, int fold)
{
    return (int64_t)h << 32 | (int64_t)mi << 26 | (int64_t)s << 20 | (int64_t)us | (int64_t)(fold != 0) << 37;
}

void pg_unpack_datetime(int64_t v, int *y, int *mo, int *d, int *h, int *mi, int *s, int *us, int *fold)
{
    uint64_t u = (uint64_t)v;
    *y = (int)(u >> 46 & 0x3fff);
    *mo = (int)(u >> 42 & 0xf);
    *d = (int)(u >> 37 & 0x1f);
    *h = (int)(u >> 32 & 0x1f);
    *mi = (int)(u >> 26 & 0x3f);
    *s = (int)(u >> 20 & 0x3f);
    *us = (int)(u & 0xfffff);
    /* Any other bit set makes the fold out of range: the constructor refuses it. */
    *fold = (int)(u >> 60);
}

void pg_unpack_time(int64_t v, int *h, int *mi, int *s, int *us, int *fold)
{
    uint64_t u = (uint64_t)v;
    *h = (int)(u >> 32 & 0x1f);
    *mi = (int)(u >> 26 & 0x3f);
    *s = (int)(u >> 20 & 0x3f);
    *us = (int)(u & 0xfffff);
    *fold = (int)((u >> 37) > 1 ? 2 : u >> 37); /* > 1: refused by the constructor */
}
