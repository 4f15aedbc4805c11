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

static void fraction_slots(pg_std_t *st);

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
        !(st->str_is_safe = PyUnicode_InternFromString("is_safe")) ||
        !(st->gcd = import_attr("math", "gcd")) || !(st->str_start = PyUnicode_InternFromString("start")) ||
        !(st->str_stop = PyUnicode_InternFromString("stop")) ||
        !(st->str_step = PyUnicode_InternFromString("step"))) {
        Py_CLEAR(st->Decimal);
        Py_CLEAR(st->UUID);
        Py_CLEAR(st->SafeUUID);
        Py_CLEAR(st->SafeUUID_unknown);
        Py_CLEAR(st->Fraction);
        Py_CLEAR(st->ZoneInfo);
        Py_CLEAR(st->str_int);
        Py_CLEAR(st->str_is_safe);
        Py_CLEAR(st->gcd);
        Py_CLEAR(st->str_start);
        Py_CLEAR(st->str_stop);
        Py_CLEAR(st->str_step);
        return -1; /* tried again next time: an import can fail for a passing reason */
    }
    fraction_slots(st);
    st->tried = true;
    return 0;
}

/* Fraction's slot descriptors, where its instances hold nothing else: a
 * rebuilt Fraction then has its two ints set directly (Fraction(n, d) costs
 * ~1 us of Python: type checks, a gcd and two divisions). */
static void fraction_slots(pg_std_t *st)
{
    PyTypeObject *t = (PyTypeObject *)st->Fraction;
    PyObject *slots = PyType_Check(st->Fraction) ? PyDict_GetItemString(t->tp_dict, "__slots__") : NULL;
    PyObject *num = PyType_Check(st->Fraction) ? PyDict_GetItemString(t->tp_dict, "_numerator") : NULL;
    PyObject *den = PyType_Check(st->Fraction) ? PyDict_GetItemString(t->tp_dict, "_denominator") : NULL;
    bool ok = slots && PyTuple_CheckExact(slots) && PyTuple_GET_SIZE(slots) == 2 && num && den &&
              Py_IS_TYPE(num, &PyMemberDescr_Type) && Py_IS_TYPE(den, &PyMemberDescr_Type) &&
              !(t->tp_flags & Py_TPFLAGS_IS_ABSTRACT) &&
              t->tp_dictoffset == 0; /* no __dict__: the two slots are all its state */
    if (PyErr_Occurred())
        PyErr_Clear();
    st->frac_num = ok ? Py_NewRef(num) : NULL;
    st->frac_den = ok ? Py_NewRef(den) : NULL;
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

int pg_fraction_parts(pg_state_t *s, PyObject *o, PyObject **num, PyObject **den)
{
    pg_std_t *st = &s->std;
    PyObject *n, *d;
    if (st->frac_num) {
        n = Py_TYPE(st->frac_num)->tp_descr_get(st->frac_num, o, st->Fraction);
        d = n ? Py_TYPE(st->frac_den)->tp_descr_get(st->frac_den, o, st->Fraction) : NULL;
    } else {
        n = PyObject_GetAttrString(o, "numerator");
        d = n ? PyObject_GetAttrString(o, "denominator") : NULL;
    }
    if (!d) {
        Py_XDECREF(n);
        return -1;
    }
    *num = n;
    *den = d;
    return 0;
}

/* gcd(|n|, d) == 1 and d > 0, for exact ints: 1 yes, 0 no, -1 error. */
static int lowest_terms(pg_std_t *st, PyObject *n, PyObject *d)
{
    int ovn = 0, ovd = 0;
    long long a = PyLong_AsLongLongAndOverflow(n, &ovn), b = PyLong_AsLongLongAndOverflow(d, &ovd);
    if (!ovd && b <= 0)
        return 0;
    if (ovd < 0)
        return 0;
    if (!ovn && !ovd) {
        uint64_t x = a < 0 ? 0 - (uint64_t)a : (uint64_t)a, y = (uint64_t)b;
        while (y) {
            uint64_t r = x % y;
            x = y;
            y = r;
        }
        return x == 1;
    }
    PyObject *g = PyObject_CallFunctionObjArgs(st->gcd, n, d, NULL);
    if (!g)
        return -1;
    int overflow = 0;
    long long one = PyLong_AsLongLongAndOverflow(g, &overflow);
    Py_DECREF(g);
    return !overflow && one == 1;
}

PyObject *pg_fraction_new(pg_state_t *s, PyObject *num, PyObject *den, const char **why)
{
    pg_std_t *st = &s->std;
    *why = NULL;
    int lt = lowest_terms(st, num, den);
    if (lt <= 0) {
        if (lt == 0)
            *why = "a Fraction not in lowest terms or with a denominator that is not positive";
        return NULL;
    }
    if (!st->frac_num)
        return PyObject_CallFunctionObjArgs(st->Fraction, num, den, NULL);
    /* object.__new__(Fraction): what Fraction.__new__ does before setting its slots */
    PyObject *empty = PyTuple_New(0);
    PyObject *f = empty ? PyBaseObject_Type.tp_new((PyTypeObject *)st->Fraction, empty, NULL) : NULL;
    Py_XDECREF(empty);
    if (f && (Py_TYPE(st->frac_num)->tp_descr_set(st->frac_num, f, num) < 0 ||
              Py_TYPE(st->frac_den)->tp_descr_set(st->frac_den, f, den) < 0))
        Py_CLEAR(f);
    return f;
}

int pg_range_parts(pg_state_t *s, PyObject *o, PyObject *parts[3])
{
    PyObject *names[3] = {s->std.str_start, s->std.str_stop, s->std.str_step};
    for (int i = 0; i < 3; i++) {
        parts[i] = PyObject_GetAttr(o, names[i]);
        if (!parts[i]) {
            while (i--)
                Py_CLEAR(parts[i]);
            return -1;
        }
    }
    return 0;
}

/* Where a fresh set's table may be set from outside: the layout and the
 * growth rule below checked on 3.11, 3.12 and 3.13, GIL builds. */
#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define PG_SET_PRESIZE 1
#endif

#ifdef PG_SET_PRESIZE
/* The table size (slots) CPython's set reaches after n adds of distinct
 * items (setobject.c's set_add_entry: a resize when fill*5 >= mask*3, to
 * the smallest power of 2 above used*4, used*2 past 50,000; test_stdtypes.py
 * checks it against sys.getsizeof). */
static size_t set_grown_slots(size_t n)
{
    size_t mask = PySet_MINSIZE - 1;
    for (;;) {
        size_t trigger = (3 * mask + 4) / 5; /* the first used count with 5*used >= 3*mask */
        if (n < trigger)
            return mask + 1;
        size_t min_used = trigger > 50000 ? trigger * 2 : trigger * 4, size = PySet_MINSIZE;
        while (size <= min_used)
            size <<= 1;
        mask = size - 1;
    }
}

size_t pg_set_presize(PyObject *set, size_t n, size_t max_bytes)
{
    PySetObject *so = (PySetObject *)set;
    if (n > (size_t)PY_SSIZE_T_MAX / 64 || !(PySet_CheckExact(set) || PyFrozenSet_CheckExact(set)) ||
        so->table != so->smalltable || so->fill != 0)
        return 0;
    size_t slots = set_grown_slots(n);
    if (slots <= PySet_MINSIZE || slots > max_bytes / sizeof(setentry))
        return 0;
    /* calloc: a fresh mapping is zero already, where CPython's resize clears it */
    setentry *t = PyMem_Calloc(slots, sizeof(setentry));
    if (!t)
        return 0; /* then grown as usual */
    so->table = t;
    so->mask = (Py_ssize_t)slots - 1;
    return slots * sizeof(setentry);
}
#else
size_t pg_set_presize(PyObject *set, size_t n, size_t max_bytes)
{
    (void)set, (void)n, (void)max_bytes; /* grown as CPython grows it */
    return 0;
}
#endif
