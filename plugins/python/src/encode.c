/* Python objects -> a gser value tree.
 *
 * Exact built-in types only, so that what comes back is of the same type:
 * None, bool, int (int64, or uint64 above INT64_MAX), float, str, bytes,
 * list, tuple, dict with scalar keys; Python's standard data types (ints
 * beyond 64 bits, complex, set, frozenset, dicts with other keys, datetime,
 * date, time, timedelta, timezone, ZoneInfo, Decimal, UUID, Fraction, range,
 * slice, Ellipsis) as tagged tuples inside a "python.tree" object, where
 * long lists of one such type, of mixed scalars, of records or of rows are
 * packed into typed columns (enc_scope, enc_std, enc_packed; the layouts in
 * docs/wire-format.md 4.9); then buffer-protocol objects (host
 * buffers with dtype and shape, borrowed zero-copy when C-contiguous, copied
 * to C order otherwise), Arrow PyCapsule producers ("arrow.array" values,
 * arrow_capsule.c), __cuda_array_interface__ objects (device buffers, borrowed) and
 * DLPack tensors (host or device buffers, borrowed; dlpack.c).
 * Anything else raises NotImplementedError: gser never pickles. Lists and tuples append their int, float and bool items unboxed
 * (gser_list_append_int/float/bool), so that one of a single kind stays a
 * contiguous typed array in the core and is sent as one.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <datetime.h>
#include <stdlib.h>
#include <string.h>

/* Per-item hot functions start on a cache line: without it their speed
 * moved by up to 10 % (std_mixed_1000: the same instructions, callgrind)
 * with the size of unrelated code linked before them (BENCHMARKS.md,
 * "the family's last rows over pickle's time"). */
#define PG_HOT __attribute__((aligned(64)))

typedef struct enc {
    PgOwner *owner;
    pg_state_t *s; /* the owner's */
    gser_msg_t *msg;
    bool strict;
    /* Give up (gser.Declined) as soon as gser is estimated to cost more than
     * pickle would: budget is what gser has saved so far, in ns; items at
     * depth >= charge_depth are counted (see PG_COST_*). */
    bool decline;
    int charge_depth;
    int64_t budget;
    pg_path_t path;
    /* Inside a "python.tree" sub-tree: Python's standard types are tagged
     * tuples (pg_tag_t). Outside one, meeting such a value sets need_ext and
     * returns -1 with no exception: the scope is encoded again as a
     * "python.tree" (enc_scope), so messages without them are unchanged. */
    bool ext;
    bool need_ext;
    /* The last datetime.timezone met and its fields (a timezone's name is
     * only had from __getinitargs__, a call per object otherwise). */
    PyObject *tz_obj, *tz_name;
    int64_t tz_off;
    struct enc_dask *dask; /* a whole Dask message ("dask.msg", below), or NULL */
    size_t work; /* what serializing the message will cost, roughly in values (pg_encode's *work) */
    /* to_gser's results in this encode, {id: (obj, value)}, or NULL: a scope
     * encoded again as a "python.tree" does not call a user's to_gser twice. */
    PyObject *memo;
    /* enc_scalars' count of a scope's root list that sent the scope round
     * again as a "python.tree" (need_ext): the retry, which meets that list
     * first with no Python code run in between, takes the count instead of
     * walking the list once more (enc_scope keeps it only then). */
    struct sc_count {
        PyObject *list; /* borrowed; NULL: none */
        Py_ssize_t n;
        size_t nint, nflt, nstr, sbytes;
        unsigned seen;
    } sc_kept;
} enc_t;

/* How enc_seq writes a sequence: a Python list or tuple as it is (in a Dask
 * message a list goes as a tuple: Dask's msgpack gives it back so), or a
 * list of gser's own (a set's items, a dict's keys): a list always. */
typedef enum { PG_SEQ_LIST, PG_SEQ_TUPLE, PG_SEQ_INNER } pg_seq_t;

/* A whole Dask message being encoded ("dask.msg", below). */
typedef struct enc_dask {
    PyObject *types, *cb; /* borrowed */
    PyObject *pending;    /* the parts met, in order */
    gser_value_t **slots; /* their trees, to fill in */
    size_t n, cap;
    bool filling;         /* in enc_dask_fill: a part's items hold no parts */
    bool pickles;         /* Dask pickles what its msgpack refuses (2026.x's fallback), else raises (2022.12) */
    int in_keys;          /* encoding a dict's keys: no parts there */
    PyObject *magic[4];   /* the dict keys Dask's loads acts on */
} enc_dask_t;

/* What gser costs more than pickle (dumps + loads), in ns per item, as
 * bench/python measures it (the runs are in BENCHMARKS.md); negative: what it
 * saves. Rounded toward declining. */
#define PG_COST_SLACK 2000  /* never decline for less: fixed costs are alike */
#define PG_COST_SEQ 250     /* a list or tuple carried item by item (+210..270) */
#define PG_COST_DICT 500    /* a dict (+450: pickle memoizes repeated keys) */
#define PG_COST_SCALAR 30   /* a boxed int, float, bool or None (+29) */
#define PG_COST_STR (-20)   /* a str (-38: pickle's memo costs more) */
#define PG_GAIN_FLOAT 20    /* an item of a float array (-24) */
#define PG_GAIN_INT 2       /* an item of an int or bool array (-2..-8) */
/* A top-level item of a collection that Dask would serialize on its own
 * (10..27 us: a serialize call, a sub-header, a frame). */
#define PG_GAIN_DASK_ITEM 10000
/* An item of a packed list of one standard type (pickle calls a
 * constructor or __reduce__ per item: -300..-2800). */
#define PG_COST_PACKED (-100)
/* An item of a packed list of mixed scalars (what pickle costs more). */
#define PG_GAIN_PACKED 10

/* Count ns of extra cost (negative: savings) for an item at depth; -1 with
 * gser.Declined set once gser is behind. No path: declining must be cheap. */
static int charge(enc_t *e, int depth, int64_t ns)
{
    if (!e->decline || depth < e->charge_depth)
        return 0;
    e->budget -= ns;
    if (e->budget >= 0)
        return 0;
    PyErr_SetString(e->s->Declined, "gser would be slower than pickle for this object (many small items)");
    return -1;
}

static int enc_value(enc_t *e, PyObject *o, int depth, gser_value_t **out);
static int enc_scope(enc_t *e, PyObject *o, int depth, gser_value_t **out);
static int enc_interfaces(enc_t *e, PyObject *o, gser_value_t **out);

/* A failed builder call: out of memory, in practice. */
static int fail_st(enc_t *e, gser_status_t st, const char *what)
{
    pg_raise(e->s, st, false, what);
    return -1;
}

static int not_impl(enc_t *e, PyObject *o, const char *why)
{
    pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path, "gser cannot serialize an object of type %s%s",
                  Py_TYPE(o)->tp_name, why);
    return -1;
}

/* ---- scalars ------------------------------------------------------------------ */

/* An exact int as int64 (kind INT) or, above INT64_MAX, uint64 (kind UINT):
 * 0; 1 for an int beyond 64 bits; -1 with an exception set. */
static int enc_int(enc_t *e, PyObject *o, gser_kind_t *kind, int64_t *i, uint64_t *u)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
        if (v == -1 && PyErr_Occurred())
            return -1;
        *kind = GSER_KIND_INT;
        *i = (int64_t)v;
        return 0;
    }
    if (overflow > 0 && _PyLong_NumBits(o) <= 64) {
        unsigned long long uv = PyLong_AsUnsignedLongLong(o);
        if (!(uv == (unsigned long long)-1 && PyErr_Occurred())) {
            *kind = GSER_KIND_UINT;
            *u = (uint64_t)uv;
            return 0;
        }
        PyErr_Clear();
    }
    (void)e;
    return 1; /* beyond 64 bits: a "python.tree" int (enc_bigint) */
}

static int need_ext(enc_t *e)
{
    e->need_ext = true;
    return -1;
}
static int enc_bigint(enc_t *e, PyObject *o, gser_value_t **out);

/* An int beyond 64 bits: a "python.tree" int, except in a Dask message,
 * where Dask's msgpack raises OverflowError (in 2022.12 and 2026.x alike):
 * declined, so that Dask's frames raise it. */
static int enc_big(enc_t *e, PyObject *o, gser_value_t **out)
{
    if (e->dask)
        return not_impl(e, o, ": an int beyond 64 bits in a Dask message (Dask's msgpack refuses it)");
    return !e->ext ? need_ext(e) : enc_bigint(e, o, out);
}

static int enc_str(enc_t *e, PyObject *o, gser_value_t **out)
{
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(o, &len);
    e->work += (size_t)len >> 4;
    if (!s) {
        pg_path_raise(e->s, e->s->GserError, GSER_ERR_INVALID_ARG, &e->path, "str cannot be encoded as UTF-8");
        return -1;
    }
    gser_status_t st = gser_msg_new_str(e->msg, s, (size_t)len, out);
    return st ? fail_st(e, st, "gser_msg_new_str") : 0;
}

static int enc_large_bytes(enc_t *e, PyObject *o, gser_value_t **out);

static int enc_bytes(enc_t *e, PyObject *o, gser_value_t **out)
{
    if (PyBytes_GET_SIZE(o) >= PG_BYTES_FRAME_MIN)
        return enc_large_bytes(e, o, out);
    e->work += (size_t)PyBytes_GET_SIZE(o) >> 4;
    /* The message borrows the bytes: keep them alive as long as it lives. */
    if (pg_owner_hold_ref(e->owner, o) < 0)
        return -1;
    gser_status_t st = gser_msg_new_bytes(e->msg, PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o), out);
    return st ? fail_st(e, st, "gser_msg_new_bytes") : 0;
}

/* Scalars that may be dict keys; 1 if o was one, 0 if not, -1 on error. */
static int enc_scalar(enc_t *e, PyObject *o, gser_value_t **out)
{
    gser_status_t st;
    PyTypeObject *t = Py_TYPE(o);
    if (o == Py_None)
        st = gser_msg_new_nil(e->msg, out);
    else if (o == Py_True || o == Py_False)
        st = gser_msg_new_bool(e->msg, o == Py_True, out);
    else if (t == &PyFloat_Type)
        st = gser_msg_new_float(e->msg, PyFloat_AS_DOUBLE(o), out);
    else if (t == &PyLong_Type) {
        gser_kind_t k;
        int64_t i = 0;
        uint64_t u = 0;
        int r = enc_int(e, o, &k, &i, &u);
        if (r)
            return r < 0 ? -1 : enc_big(e, o, out) < 0 ? -1 : 1;
        st = k == GSER_KIND_INT ? gser_msg_new_int(e->msg, i, out) : gser_msg_new_uint(e->msg, u, out);
    } else if (t == &PyUnicode_Type)
        return enc_str(e, o, out) < 0 ? -1 : 1;
    else if (t == &PyBytes_Type)
        return enc_bytes(e, o, out) < 0 ? -1 : 1;
    else
        return 0;
    return st ? fail_st(e, st, "gser_msg_new_*") : 1;
}

/* ---- containers --------------------------------------------------------------- */

static int check_depth(enc_t *e, int depth)
{
    if (depth + 1 > GSER_DEPTH_MAX) {
        pg_path_raise(e->s, e->s->GserError, GSER_ERR_LIMIT_DEPTH, &e->path,
                      "nesting deeper than %d levels (is there a cycle?)", GSER_DEPTH_MAX);
        return -1;
    }
    return 0;
}

/* Append item to a list or tuple value: ints, floats, bools and None go in
 * unboxed, so a run of one kind stays a contiguous array. */
static int enc_append(enc_t *e, gser_value_t *list, PyObject *item, int depth)
{
    PyTypeObject *t = Py_TYPE(item);
    gser_status_t st;
    if (e->decline && charge(e, depth + 1, t == &PyUnicode_Type ? PG_COST_STR : PG_COST_SCALAR) < 0)
        return -1;
    if (t == &PyFloat_Type) {
        st = gser_list_append_float(list, PyFloat_AS_DOUBLE(item));
    } else if (t == &PyLong_Type) {
        gser_kind_t k;
        int64_t i = 0;
        uint64_t u = 0;
        int r = enc_int(e, item, &k, &i, &u);
        if (r > 0) {
            gser_value_t *v;
            if (enc_big(e, item, &v) < 0)
                return -1;
            st = gser_list_append(list, v);
        } else if (r < 0) {
            return -1;
        } else {
            st = k == GSER_KIND_INT ? gser_list_append_int(list, i) : gser_list_append_uint(list, u);
        }
    } else if (item == Py_True || item == Py_False) {
        st = gser_list_append_bool(list, item == Py_True);
    } else if (item == Py_None) {
        st = gser_list_append_nil(list);
    } else {
        gser_value_t *v;
        /* Converting may run Python code (a buffer exporter, a
         * __cuda_array_interface__ property) that changes the container. */
        Py_INCREF(item);
        int r = enc_value(e, item, depth + 1, &v);
        Py_DECREF(item);
        if (r < 0)
            return -1;
        st = gser_list_append(list, v);
    }
    return st ? fail_st(e, st, "gser_list_append") : 0;
}

/* Lists shorter than this go through the appends (the core sends them as
 * plain msgpack arrays, below its default array_min of 16). */
#define PG_ARRAY_MIN 16

/* The fast path for a list or tuple whose items are all exact floats, all
 * bools, or all ints that fit in int64: one pass into a C array the message
 * borrows (gser_msg_new_array), the same typed array the appends would build.
 * 1 if done, 0 if the items are not all of one such kind, -1 on error. */
static int enc_seq_array(enc_t *e, PyObject *o, bool as_tuple, gser_value_t **out, gser_kind_t *kind_out)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    if (n < PG_ARRAY_MIN)
        return 0;
    e->work += (size_t)n;
    PyObject **items = PySequence_Fast_ITEMS(o);
    PyObject *first = items[0];
    gser_kind_t kind;
    void *buf;
    if (Py_TYPE(first) == &PyFloat_Type) {
        double *d = malloc((size_t)n * sizeof *d);
        if (!d)
            goto nomem;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (Py_TYPE(items[i]) != &PyFloat_Type) {
                free(d);
                return 0;
            }
            d[i] = PyFloat_AS_DOUBLE(items[i]);
        }
        kind = GSER_KIND_FLOAT;
        buf = d;
    } else if (first == Py_True || first == Py_False) {
        unsigned char *b = malloc((size_t)n);
        if (!b)
            goto nomem;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (items[i] != Py_True && items[i] != Py_False) {
                free(b);
                return 0;
            }
            b[i] = items[i] == Py_True;
        }
        kind = GSER_KIND_BOOL;
        buf = b;
    } else if (Py_TYPE(first) == &PyLong_Type) {
        int64_t *v = malloc((size_t)n * sizeof *v);
        if (!v)
            goto nomem;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t small;
            if (Py_TYPE(items[i]) == &PyLong_Type && pg_small_int(items[i], &small)) {
                v[i] = small;
                continue;
            }
            int overflow = 0;
            long long x = Py_TYPE(items[i]) == &PyLong_Type ? PyLong_AsLongLongAndOverflow(items[i], &overflow) : 0;
            if (Py_TYPE(items[i]) != &PyLong_Type || overflow || (x == -1 && PyErr_Occurred())) {
                free(v);
                return PyErr_Occurred() ? -1 : 0;
            }
            v[i] = (int64_t)x;
        }
        kind = GSER_KIND_INT;
        buf = v;
    } else {
        return 0;
    }
    if (pg_owner_hold_alloc(e->owner, buf) < 0)
        return -1;
    gser_status_t st = gser_msg_new_array(e->msg, kind, buf, (size_t)n, as_tuple ? GSER_ARRAY_TUPLE : 0, out);
    *kind_out = kind;
    return st ? fail_st(e, st, "gser_msg_new_array") : 1;
nomem:
    PyErr_NoMemory();
    return -1;
}

static int enc_packed(enc_t *e, PyObject *o, bool tuple, int depth, gser_value_t **out);

PG_HOT static int enc_seq(enc_t *e, PyObject *o, pg_seq_t mode, int depth, gser_value_t **out)
{
    bool tuple = mode == PG_SEQ_TUPLE;
    /* A Dask message's lists go as tuples: Dask's msgpack gives them back so. */
    bool as_tuple = tuple || (e->dask && mode == PG_SEQ_LIST);
    gser_kind_t kind;
    int fast = enc_seq_array(e, o, as_tuple, out, &kind);
    if (fast < 0)
        return -1;
    if (fast) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        return charge(e, depth + 1, -(int64_t)n * (kind == GSER_KIND_FLOAT ? PG_GAIN_FLOAT : PG_GAIN_INT));
    }
    Py_ssize_t n = tuple ? PyTuple_GET_SIZE(o) : PyList_GET_SIZE(o);
    e->work += (size_t)n;
    /* Not in a Dask message: its lists come back as tuples, whatever they hold. */
    if (n >= 2 && !e->dask) {
        int packed = enc_packed(e, o, tuple, depth, out);
        if (packed)
            return packed < 0 ? -1 : 0;
    }
    if (charge(e, depth, PG_COST_SEQ) < 0)
        return -1;

    gser_value_t *list;
    gser_status_t st = as_tuple ? gser_msg_new_tuple(e->msg, &list) : gser_msg_new_list(e->msg, &list);
    if (st)
        return fail_st(e, st, "gser_msg_new_list");
    /* In a "python.tree", a tuple whose first item is a uint would read as a
     * tag: it is escaped as (PG_TAG_TUPLE, items...). */
    PyObject *first = n ? PySequence_Fast_ITEMS(o)[0] : NULL;
    if (as_tuple && n && e->ext && PyLong_Check(first)) { /* an int subclass: one in a Dask message */
        int overflow = 0;
        PyLong_AsLongLongAndOverflow(first, &overflow);
        if (overflow > 0 && (st = gser_list_append_uint(list, PG_TAG_TUPLE)))
            return fail_st(e, st, "gser_list_append_uint");
    }
    if (n && check_depth(e, depth) < 0)
        return -1;
    int slot = e->path.len++;
    e->path.seg[slot].key = NULL;
    /* A list's size is read again each time: Python code run while
     * converting an item may shrink it. */
    for (Py_ssize_t i = 0; i < (tuple ? n : PyList_GET_SIZE(o)); i++) {
        e->path.seg[slot].index = i;
        PyObject *item = tuple ? PyTuple_GET_ITEM(o, i) : PyList_GET_ITEM(o, i);
        if (enc_append(e, list, item, depth) < 0)
            return -1;
    }
    e->path.len--;
    *out = list;
    return 0;
}

/* Whether o is a gser map key as it is (a scalar; large bytes are typed objects). */
static bool is_map_key(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type || o == Py_None || t == &PyBool_Type || t == &PyFloat_Type)
        return true;
    if (t == &PyBytes_Type)
        return PyBytes_GET_SIZE(o) < PG_BYTES_FRAME_MIN;
    if (t != &PyLong_Type)
        return false;
    int64_t small;
    if (pg_small_int(o, &small))
        return true;
    int overflow = 0;
    PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow <= 0)
        return overflow == 0;
    return _PyLong_NumBits(o) <= 64; /* no exception to raise and clear */
}

static int enc_std_dict(enc_t *e, PyObject *o, int depth, gser_value_t **out);

static int enc_dict(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    if (e->ext) { /* keys that are not scalars: (PG_TAG_DICT, keys, values) */
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(o, &pos, &key, &value))
            if (!is_map_key(key))
                return enc_std_dict(e, o, depth, out);
    }
    gser_value_t *map;
    gser_status_t st = gser_msg_new_map(e->msg, &map);
    if (st)
        return fail_st(e, st, "gser_msg_new_map");
    if (charge(e, depth, PG_COST_DICT) < 0)
        return -1;
    e->work += (size_t)PyDict_GET_SIZE(o);
    if (PyDict_GET_SIZE(o) && check_depth(e, depth) < 0)
        return -1;
    int slot = e->path.len++;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    int r = 0;
    while (r == 0 && PyDict_Next(o, &pos, &key, &value)) {
        Py_INCREF(key);
        Py_INCREF(value);
        e->path.seg[slot].key = key;
        e->path.seg[slot].index = i++;
        gser_value_t *k, *v;
        PyTypeObject *vt = Py_TYPE(value);
        if (e->decline &&
            charge(e, depth + 1,
                   (Py_TYPE(key) == &PyUnicode_Type ? PG_COST_STR : PG_COST_SCALAR) +
                       (vt == &PyUnicode_Type ? PG_COST_STR
                        : vt == &PyFloat_Type || vt == &PyLong_Type || value == Py_None || vt == &PyBool_Type
                            ? PG_COST_SCALAR
                            : 0)) < 0) {
            Py_DECREF(key);
            Py_DECREF(value);
            return -1;
        }
        int sc = is_map_key(key) ? enc_scalar(e, key, &k) : 0;
        if (sc == 0 && !e->ext) {
            r = need_ext(e); /* a key the "python.tree" form may carry */
        } else if (sc == 0) {
            e->path.seg[slot].key = NULL; /* the key itself cannot be shown as a path */
            pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path,
                          "dict key of type %s: gser map keys are None, bool, int, float, str or bytes",
                          Py_TYPE(key)->tp_name);
            r = -1;
        } else if (sc < 0) {
            r = -1;
        } else if (enc_value(e, value, depth + 1, &v) < 0) {
            r = -1;
        } else if ((st = gser_map_put(map, k, v)) != GSER_OK) {
            r = fail_st(e, st, "gser_map_put");
        }
        Py_DECREF(key);
        Py_DECREF(value);
    }
    if (r < 0)
        return -1;
    e->path.len--;
    *out = map;
    return 0;
}

/* ---- buffers ------------------------------------------------------------------- */

/* A PEP 3118 format of one element -> a dtype; GSER_DTYPE_COUNT if gser has
 * none. Unsigned bytes are typed (uint8) only for numpy arrays: other
 * exporters (bytearray, memoryview) are untyped bytes. *big: big-endian. */
static gser_dtype_t format_dtype(const char *fmt, Py_ssize_t itemsize, bool numpy, bool *big)
{
    *big = false;
    if (!fmt)
        fmt = "B";
    if (*fmt && strchr("@=<>!", *fmt)) {
        *big = (*fmt == '>' || *fmt == '!') && itemsize > 1;
        fmt++;
    }
    bool cplx = *fmt == 'Z';
    if (cplx)
        fmt++;
    char c = *fmt;
    if (c == '\0' || fmt[1] != '\0')
        return GSER_DTYPE_COUNT;
    if (cplx) {
        if (c == 'f' && itemsize == 8)
            return GSER_DTYPE_COMPLEX64;
        if (c == 'd' && itemsize == 16)
            return GSER_DTYPE_COMPLEX128;
        return GSER_DTYPE_COUNT;
    }
    switch (c) {
    case '?': return itemsize == 1 ? GSER_DTYPE_BOOL : GSER_DTYPE_COUNT;
    case 'c': return itemsize == 1 ? GSER_DTYPE_BYTES : GSER_DTYPE_COUNT;
    case 'B':
        if (itemsize == 1)
            return numpy ? GSER_DTYPE_UINT8 : GSER_DTYPE_BYTES;
        return GSER_DTYPE_COUNT;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': return pg_int_dtype(itemsize, true);
    case 'H': case 'I': case 'L': case 'Q': case 'N': return pg_int_dtype(itemsize, false);
    case 'e': return itemsize == 2 ? GSER_DTYPE_FLOAT16 : GSER_DTYPE_COUNT;
    case 'f': return itemsize == 4 ? GSER_DTYPE_FLOAT32 : GSER_DTYPE_COUNT;
    case 'd': return itemsize == 8 ? GSER_DTYPE_FLOAT64 : GSER_DTYPE_COUNT;
    default: return GSER_DTYPE_COUNT;
    }
}

static void free_release(void *data, void *arg)
{
    (void)arg;
    free(data);
}

static bool is_numpy_array(PyObject *o)
{
    return strcmp(Py_TYPE(o)->tp_name, "numpy.ndarray") == 0;
}

/* Whether nd extents with byte strides lay items of size es out in C order,
 * or (fortran) in Fortran order; extents of 1 may have any stride. */
static bool dense_layout(int nd, const int64_t *shape, const int64_t *strides, int64_t es, bool fortran)
{
    int64_t expect = es;
    for (int i = 0; i < nd; i++) {
        int d = fortran ? i : nd - 1 - i;
        if (shape[d] > 1 && strides[d] != expect)
            return false;
        expect *= shape[d] ? shape[d] : 1;
    }
    return true;
}

/* Zero-copy: the message borrows the exporter's memory (desc, but for its
 * data), and the owner holds the view (and so the exporter) until it dies. */
static int enc_host_borrow(enc_t *e, Py_buffer *view, gser_buffer_desc_t *desc, PyObject *frame_as,
                           gser_value_t **out)
{
    desc->data = view->buf;
    bool readonly = view->readonly;
    if (pg_owner_hold_view(e->owner, view) < 0)
        return -1;
    gser_status_t st = gser_msg_new_buffer(e->msg, desc, out);
    int64_t offset;
    size_t span;
    if (st == GSER_OK && gser_buffer_get_span(desc, &offset, &span) == GSER_OK && span >= PG_INLINE_MAX &&
        pg_owner_frame_obj(e->owner, (const char *)desc->data + offset, span, frame_as, readonly) < 0)
        return -1;
    return st ? fail_st(e, st, "gser_msg_new_buffer") : 0;
}

/* A host buffer value over view, which the owner takes over, laid out as
 * Dask's numpy serializer lays arrays out, so that it comes back alike and
 * never more bytes travel: C order as is; Fortran order, and broadcasts
 * (stride 0) of a C- or Fortran-ordered block, zero-copy with their strides
 * (the core sends the span: a broadcast's block only); anything else one copy
 * into C order (of the broadcast block only). nd 0: flat bytes. The last
 * inner dimensions of the view are the items' bytes (the uint8 view of a
 * dtype gser has no name for): they must stay contiguous. When the memory
 * will be a frame of its own, dumps hands it out as frame_as (if not NULL)
 * or as a memoryview as writable as the view (a copy: writable). *gathered
 * (if not NULL): the items were copied into C order, as numpy.ascontiguousarray. */
static int enc_host_view(enc_t *e, Py_buffer *view, gser_dtype_t dtype, int nd, int inner, gser_value_t **out,
                         PyObject *frame_as, bool *gathered)
{
    int64_t shape[GSER_MAX_NDIM], strides[GSER_MAX_NDIM], block[GSER_MAX_NDIM];
    int outer = nd - inner;
    int64_t es = view->itemsize;
    for (int d = 0; d < nd; d++) {
        shape[d] = view->shape ? (int64_t)view->shape[d] : (int64_t)(view->len / view->itemsize);
        strides[d] = view->strides ? (int64_t)view->strides[d] : 0;
        block[d] = strides[d] == 0 && d < outer ? (shape[d] ? 1 : 0) : shape[d];
    }
    for (int d = outer; d < nd; d++)
        es *= shape[d];
    bool c_order = PyBuffer_IsContiguous(view, 'C');
    bool inner_dense = c_order || (view->strides && dense_layout(inner, shape + outer, strides + outer,
                                                                  view->itemsize, false));
    /* The block: the array with its broadcast extents cut to one. */
    bool keep = !c_order && nd > 0 && view->strides && inner_dense &&
                (dense_layout(outer, block, strides, es, false) || dense_layout(outer, block, strides, es, true));
    bool broadcast = false;
    for (int d = 0; view->strides && inner_dense && d < outer; d++)
        broadcast |= strides[d] == 0 && shape[d] > 1;

    gser_buffer_desc_t desc = GSER_BUFFER_DESC_INIT;
    desc.nbytes = (size_t)view->len;
    desc.dtype = dtype;
    desc.memory = GSER_MEMORY_HOST;
    desc.ndim = (uint32_t)nd;
    desc.shape = nd ? shape : NULL;
    if (gathered)
        *gathered = !c_order && !keep && !broadcast;
    gser_status_t st;
    if (c_order || keep) {
        desc.strides = c_order ? NULL : strides;
        return enc_host_borrow(e, view, &desc, frame_as, out);
    }
    /* One copy into C order: of the block only for a broadcast, which keeps
     * its zero strides. */
    Py_buffer src = *view;
    int64_t total = es;
    for (int d = 0; d < outer; d++)
        total *= broadcast ? block[d] : shape[d];
    Py_ssize_t src_shape[GSER_MAX_NDIM];
    if (broadcast) {
        for (int d = 0; d < nd; d++)
            src_shape[d] = (Py_ssize_t)block[d];
        src.shape = src_shape;
        src.len = (Py_ssize_t)total;
    }
    void *copy = malloc(total ? (size_t)total : 1);
    int r = copy ? PyBuffer_ToContiguous(copy, &src, src.len, 'C') : -1;
    PyBuffer_Release(view);
    if (r < 0) {
        free(copy);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    desc.data = copy;
    desc.release = free_release;
    if (broadcast) { /* the block's C strides, 0 where it is broadcast */
        int64_t stride = view->itemsize;
        for (int d = nd; d-- > 0;) {
            bool zero = d < outer && strides[d] == 0 && shape[d] > 1;
            strides[d] = zero ? 0 : stride;
            stride *= block[d] ? block[d] : 1;
        }
        desc.strides = strides;
    }
    st = gser_msg_new_buffer(e->msg, &desc, out);
    if (st) {
        free(copy);
        return fail_st(e, st, "gser_msg_new_buffer");
    }
    if ((size_t)total >= PG_INLINE_MAX && pg_owner_frame_obj(e->owner, copy, (size_t)total, NULL, false) < 0)
        return -1; /* gser's own copy: a writable frame */
    return 0;
}

/* Wrap tree (a value of the message) into a typed object of the module. */
static int enc_typed(enc_t *e, pg_type_t t, gser_value_t *tree, gser_value_t **out)
{
    gser_status_t st = pg_type_new(e->msg, t, tree, out);
    return st ? fail_st(e, st, "gser_msg_new_object") : 0;
}

/* bytes of at least PG_BYTES_FRAME_MIN: "python.bytes", a buffer that is a
 * frame of its own (the bytes object itself, in dumps' frame list). */
static int enc_large_bytes(enc_t *e, PyObject *o, gser_value_t **out)
{
    e->work += PG_WORK_BUFFER;
    Py_buffer view;
    if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) < 0)
        return -1;
    gser_value_t *buf;
    if (enc_host_view(e, &view, GSER_DTYPE_BYTES, 0, 0, &buf, o, NULL) < 0)
        return -1;
    return enc_typed(e, PG_T_BYTES, buf, out);
}

/* bytearray ("python.bytearray") and memoryview ("python.memoryview", with
 * its format and shape; non-contiguous ones copied into C order). */
static int enc_bytes_like(enc_t *e, PyObject *o, pg_type_t t, gser_value_t **out)
{
    Py_buffer view;
    if (PyObject_GetBuffer(o, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return not_impl(e, o, ": it exports no plain buffer");
    }
    bool big;
    gser_dtype_t dtype = format_dtype(view.format, view.itemsize, false, &big);
    if (big || dtype == GSER_DTYPE_COUNT || view.ndim > GSER_MAX_NDIM) {
        PyBuffer_Release(&view);
        return not_impl(e, o, big ? ": big-endian items" : ": a format gser has no dtype for");
    }
    /* Untyped bytes in one dimension (or a 0-d byte) stay flat. */
    int nd = dtype == GSER_DTYPE_BYTES && view.ndim <= 1 ? 0 : view.ndim;
    if (nd == 0 && dtype != GSER_DTYPE_BYTES) {
        PyBuffer_Release(&view);
        return not_impl(e, o, ": a 0-d typed memoryview");
    }
    gser_value_t *buf;
    if (enc_host_view(e, &view, dtype, nd, 0, &buf, nd == 0 ? o : NULL, NULL) < 0)
        return -1;
    return enc_typed(e, t, buf, out);
}

/* An array of a dtype gser has no name for, as its description and bytes:
 * *descr the dtype's numpy.lib.format description (a new reference), *view
 * the items' bytes as unsigned ints of gcd(itemsize, 8) bytes (as Dask views
 * them, so that gser keeps them aligned: x[..., None].view(uN), one more
 * extent) and *dtype that uint. 0, or -1 with an exception set and nothing
 * held. */
static int ndarray_described(enc_t *e, PyObject *o, Py_buffer *view, PyObject **descr, gser_dtype_t *dtype)
{
    PyObject *dt = PyObject_GetAttrString(o, "dtype");
    PyObject *hasobj = dt ? PyObject_GetAttrString(dt, "hasobject") : NULL;
    PyObject *isz = hasobj ? PyObject_GetAttrString(dt, "itemsize") : NULL;
    int objects = hasobj ? PyObject_IsTrue(hasobj) : -1;
    Py_ssize_t itemsize = isz ? PyLong_AsSsize_t(isz) : -1;
    Py_XDECREF(hasobj);
    Py_XDECREF(isz);
    if (objects || itemsize <= 0) {
        Py_XDECREF(dt);
        if (PyErr_Occurred())
            return -1;
        return not_impl(e, o, objects ? " with Python objects in its dtype (gser never pickles)"
                                      : " with an empty dtype");
    }
    if (!e->s->np_dtype_to_descr) { /* imported on first use */
        PyObject *fmt = PyImport_ImportModule("numpy.lib.format");
        e->s->np_dtype_to_descr = fmt ? PyObject_GetAttrString(fmt, "dtype_to_descr") : NULL;
        Py_XDECREF(fmt);
    }
    PyObject *d = e->s->np_dtype_to_descr ? PyObject_CallOneArg(e->s->np_dtype_to_descr, dt) : NULL;
    Py_DECREF(dt);
    int width = (int)(itemsize % 8 == 0 ? 8 : itemsize % 4 == 0 ? 4 : itemsize % 2 == 0 ? 2 : 1);
    static const char *const uints[] = {[1] = "u1", [2] = "u2", [4] = "u4", [8] = "u8"};
    static const gser_dtype_t udtypes[] = {[1] = GSER_DTYPE_UINT8, [2] = GSER_DTYPE_UINT16,
                                           [4] = GSER_DTYPE_UINT32, [8] = GSER_DTYPE_UINT64};
    PyObject *idx = d ? Py_BuildValue("(OO)", Py_Ellipsis, Py_None) : NULL;
    PyObject *x1 = idx ? PyObject_GetItem(o, idx) : NULL;
    PyObject *bytes_of = x1 ? PyObject_CallMethod(x1, "view", "s", uints[width]) : NULL;
    Py_XDECREF(idx);
    Py_XDECREF(x1);
    if (!bytes_of || PyObject_GetBuffer(bytes_of, view, PyBUF_RECORDS_RO) < 0) {
        Py_XDECREF(d);
        Py_XDECREF(bytes_of);
        return -1;
    }
    Py_DECREF(bytes_of);
    *descr = d;
    *dtype = udtypes[width];
    return 0;
}

/* ("numpy.ndarray") (buffer, descr, writeable, ndim) of an array that a
 * plain buffer cannot say all of: read-only, 0-d, or of a dtype gser has no
 * name for (either byte order, structured, datetime, strings, void). Those
 * travel as unsigned ints with one more extent (the items' bytes) and the
 * dtype's numpy.lib.format description, which is data, as numpy.save writes it. */
static int enc_ndarray_typed(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    Py_buffer view;
    PyObject *descr = Py_None;
    bool big = false;
    gser_dtype_t dtype = GSER_DTYPE_COUNT;
    PyObject *nd_obj = PyObject_GetAttrString(o, "ndim");
    long ndim = nd_obj ? PyLong_AsLong(nd_obj) : -1;
    Py_XDECREF(nd_obj);
    if (ndim < 0)
        return -1;
    /* A 0-d array of gser's dtype travels as shape (1,). */
    PyObject *src = ndim ? Py_NewRef(o) : PyObject_CallMethod(o, "reshape", "i", 1);
    if (!src)
        return -1;
    int got = PyObject_GetBuffer(src, &view, PyBUF_RECORDS_RO);
    Py_DECREF(src);
    if (got == 0) {
        dtype = format_dtype(view.format, view.itemsize, true, &big);
        if (big || dtype == GSER_DTYPE_COUNT)
            PyBuffer_Release(&view);
    } else {
        PyErr_Clear(); /* numpy exports no buffer of datetimes: described below */
    }
    int inner = 0;
    if (big || dtype == GSER_DTYPE_COUNT) {
        if (ndarray_described(e, o, &view, &descr, &dtype) < 0)
            return -1;
        inner = 1;
    } else {
        Py_INCREF(descr);
    }
    bool writeable = !view.readonly, gathered = false;
    gser_value_t *tree, *buf, *dv = NULL;
    gser_status_t st = gser_msg_new_tuple(e->msg, &tree);
    int r = st ? fail_st(e, st, "gser_msg_new_tuple") : 0;
    if (r == 0 && view.ndim > GSER_MAX_NDIM) {
        PyBuffer_Release(&view);
        r = not_impl(e, o, ": more dimensions than gser buffers have");
    } else if (r == 0) {
        r = enc_host_view(e, &view, dtype, view.ndim, inner, &buf, NULL, &gathered);
        /* Dask sends a gathered copy as writable (numpy.ascontiguousarray's flag) */
        writeable |= gathered;
    } else {
        PyBuffer_Release(&view);
    }
    if (r == 0) { /* data of its own: no "python.tree" tags */
        bool ext = e->ext;
        e->ext = false;
        r = enc_value(e, descr, depth + 1, &dv);
        e->ext = ext;
    }
    Py_DECREF(descr);
    if (r == 0 && ((st = gser_list_append(tree, buf)) || (st = gser_list_append(tree, dv)) ||
                   (st = gser_list_append_bool(tree, writeable)) || (st = gser_list_append_int(tree, ndim))))
        r = fail_st(e, st, "gser_list_append");
    return r < 0 ? -1 : enc_typed(e, PG_T_NDARRAY, tree, out);
}

/* A numpy array: a plain buffer when gser's dtypes and shapes say all of it
 * (writable, at least one dimension, a dtype of gser's), else "numpy.ndarray". */
static int enc_numpy(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    Py_buffer view;
    if (PyObject_GetBuffer(o, &view, PyBUF_RECORDS_RO) == 0) {
        bool big;
        gser_dtype_t dtype = format_dtype(view.format, view.itemsize, true, &big);
        if (!big && dtype != GSER_DTYPE_COUNT && !view.readonly && view.ndim > 0 && view.ndim <= GSER_MAX_NDIM)
            return enc_host_view(e, &view, dtype, view.ndim, 0, out, NULL, NULL);
        PyBuffer_Release(&view);
    } else {
        PyErr_Clear();
    }
    return enc_ndarray_typed(e, o, depth, out);
}

/* Other buffer exporters (array.array, ...), outside strict mode: a buffer
 * with the exporter's format and shape; back as a numpy array. */
static int enc_buffer(enc_t *e, PyObject *o, gser_value_t **out)
{
    if (e->strict)
        return not_impl(e, o, " in strict mode (buffers must be numpy.ndarray, so that they come back as one)");
    Py_buffer view;
    if (PyObject_GetBuffer(o, &view, PyBUF_RECORDS_RO) < 0) {
        pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path,
                      "gser cannot serialize an object of type %s: it exports no plain buffer", Py_TYPE(o)->tp_name);
        return -1;
    }
    bool big;
    gser_dtype_t dtype = format_dtype(view.format, view.itemsize, true, &big);
    const char *why = NULL;
    if (big)
        why = "big-endian elements (gser buffers are little-endian; convert with .astype('<...'))";
    else if (dtype == GSER_DTYPE_COUNT)
        why = "an element format gser has no dtype for";
    else if (view.ndim == 0)
        why = "zero dimensions";
    else if (view.ndim > GSER_MAX_NDIM)
        why = "more dimensions than gser buffers have";
    if (why) {
        pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path,
                      "gser cannot serialize a buffer of type %s with format '%s': %s", Py_TYPE(o)->tp_name,
                      view.format ? view.format : "B", why);
        PyBuffer_Release(&view);
        return -1;
    }
    return enc_host_view(e, &view, dtype, view.ndim, 0, out, NULL, NULL);
}

/* ---- types registered from Python ------------------------------------------------------ */

/* ("python.type") (name, to_gser(o)): what to_gser returns comes back as
 * the receiver's from_gser makes it, so the strict rules do not apply inside
 * (a device array comes back as the registered type, not gser.DeviceArray). */
static int enc_registered(enc_t *e, PyObject *o, PyObject *entry, int depth, gser_value_t **out)
{
    if (check_depth(e, depth) < 0)
        return -1;
    PyObject *key = PyLong_FromVoidPtr(o), *hit = NULL, *value = NULL;
    if (!key || (!e->memo && !(e->memo = PyDict_New())))
        goto fail;
    hit = PyDict_GetItemWithError(e->memo, key); /* borrowed */
    if (hit && PyTuple_GET_ITEM(hit, 0) == o) { /* the object itself, kept alive by the entry */
        value = Py_NewRef(PyTuple_GET_ITEM(hit, 1));
    } else if (!PyErr_Occurred() && (value = PyObject_CallOneArg(PyTuple_GET_ITEM(entry, 1), o))) {
        PyObject *pair = PyTuple_Pack(2, o, value);
        if (!pair || PyDict_SetItem(e->memo, key, pair) < 0)
            Py_CLEAR(value);
        Py_XDECREF(pair);
    }
fail:
    Py_XDECREF(key);
    if (!value)
        return -1;
    gser_value_t *tree, *name, *payload;
    /* The registration says how the object travels: no strict rules, and no
     * cost estimate (its parts are few, whatever their size). */
    bool strict = e->strict, decline = e->decline;
    e->strict = false;
    e->decline = false;
    gser_status_t st = gser_msg_new_tuple(e->msg, &tree);
    int r = st ? fail_st(e, st, "gser_msg_new_tuple") : enc_str(e, PyTuple_GET_ITEM(entry, 0), &name);
    /* to_gser may hand back the object itself, or one of its type (a
     * contiguous copy): that one goes by its interfaces, not the registry. */
    if (r == 0)
        r = Py_TYPE(value) == Py_TYPE(o) ? enc_interfaces(e, value, &payload) : enc_scope(e, value, depth + 1, &payload);
    e->strict = strict;
    e->decline = decline;
    Py_DECREF(value);
    if (r == 0 && ((st = gser_list_append(tree, name)) || (st = gser_list_append(tree, payload))))
        r = fail_st(e, st, "gser_list_append");
    return r < 0 ? -1 : enc_typed(e, PG_T_PYTYPE, tree, out);
}

/* ---- __cuda_array_interface__ ------------------------------------------------------ */

static int enc_cai(enc_t *e, PyObject *o, PyObject *cai, gser_value_t **out)
{
    if (e->strict)
        return not_impl(e, o, " in strict mode (device arrays come back as gser.DeviceArray, not as their own type)");
    pg_cai_t ci;
    const char *why;
    if (pg_cai_read(cai, &ci, &why) < 0) {
        if (why)
            pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path,
                          "gser cannot serialize a device array of type %s: %s", Py_TYPE(o)->tp_name, why);
        return -1;
    }
    /* The message borrows the device memory: keep its owner alive. */
    if (pg_owner_hold_ref(e->owner, o) < 0)
        return -1;
    gser_buffer_desc_t desc = GSER_BUFFER_DESC_INIT;
    desc.data = ci.ptr;
    desc.nbytes = ci.nbytes;
    desc.dtype = ci.dtype;
    desc.ndim = ci.ndim;
    desc.shape = ci.shape;
    desc.strides = ci.strided ? ci.strides : NULL;
    desc.memory = GSER_MEMORY_DEVICE;
    desc.device = 0; /* the interface does not say; the pointer does, to CUDA */
    desc.stream = ci.stream; /* gser's reads are ordered after the producer's work */
    gser_status_t st = gser_msg_new_buffer(e->msg, &desc, out);
    return st ? fail_st(e, st, "gser_msg_new_buffer") : 0;
}

/* ---- DLPack ------------------------------------------------------------------------------ */

static int enc_dlpack(enc_t *e, PyObject *o, gser_value_t **out)
{
    if (e->strict)
        return not_impl(e, o, " in strict mode (DLPack tensors come back as numpy arrays or gser.DeviceArray)");
    gser_buffer_desc_t desc = GSER_BUFFER_DESC_INIT;
    int64_t shape[GSER_MAX_NDIM], strides[GSER_MAX_NDIM];
    const char *why;
    if (pg_dlpack_encode(e->owner, o, &desc, shape, strides, &why) < 0) {
        if (why)
            pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path,
                          "gser cannot serialize a DLPack tensor of type %s: %s", Py_TYPE(o)->tp_name, why);
        return -1;
    }
    gser_status_t st = gser_msg_new_buffer(e->msg, &desc, out);
    return st ? fail_st(e, st, "gser_msg_new_buffer") : 0;
}

/* ---- the Arrow PyCapsule interface ---------------------------------------------------- */

static int enc_arrow(enc_t *e, PyObject *o, int method, gser_value_t **out)
{
    if (e->strict)
        return not_impl(e, o, " in strict mode (Arrow tables come back as gser.ArrowArray, not as their own type)");
    if (!pg_have_arrow)
        return not_impl(e, o, ": an Arrow table, and this module was built without gser::arrow");
    const char *why;
    if (pg_arrow_encode(e->owner, o, method, out, &why) == 0)
        return 0;
    /* The producer's own exceptions go through as they are. */
    if (why)
        pg_path_raise(e->s, PyExc_ValueError, GSER_OK, &e->path, "an Arrow table of type %s: %s", Py_TYPE(o)->tp_name,
                      why);
    return -1;
}

/* ---- numpy scalars ("numpy.scalar", npscalar.c) ---------------------------------------- */

static int enc_npscalar(enc_t *e, PyObject *o, gser_value_t **out)
{
    const char *why;
    gser_value_t *tree;
    if (pg_npscalar_encode(e->s, e->msg, o, &why, &tree) < 0)
        return why ? not_impl(e, o, why) : -1;
    return enc_typed(e, PG_T_NPSCALAR, tree, out);
}

/* ---- Python's standard types ("python.tree") ---------------------------------------- */

/* The datetime C API, imported on first use (datetime.h's PyDateTimeAPI is
 * per translation unit). */
static int dt_ready(void)
{
    if (!PyDateTimeAPI)
        PyDateTime_IMPORT;
    return PyDateTimeAPI ? 0 : -1;
}

/* Which standard type o is exactly (a pg_tag_t), or -1: subclasses are not
 * these types (they come back as themselves only through the registry). */
static int std_kind(enc_t *e, PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyComplex_Type)
        return PG_TAG_COMPLEX;
    if (t == &PySet_Type)
        return PG_TAG_SET;
    if (t == &PyFrozenSet_Type)
        return PG_TAG_FROZENSET;
    if (t == &PyRange_Type)
        return PG_TAG_RANGE;
    if (t == &PySlice_Type)
        return PG_TAG_SLICE;
    if (o == Py_Ellipsis)
        return PG_TAG_ELLIPSIS;
    if (dt_ready() < 0) {
        PyErr_Clear();
        return -1;
    }
    if (t == PyDateTimeAPI->DateTimeType)
        return PG_TAG_DATETIME;
    if (t == PyDateTimeAPI->DateType)
        return PG_TAG_DATE;
    if (t == PyDateTimeAPI->TimeType)
        return PG_TAG_TIME;
    if (t == PyDateTimeAPI->DeltaType)
        return PG_TAG_TIMEDELTA;
    if (t == Py_TYPE(PyDateTime_TimeZone_UTC))
        return PG_TAG_TZ;
    if (pg_std_ready(e->s) < 0) {
        PyErr_Clear();
        return -1;
    }
    const pg_std_t *sd = &e->s->std;
    if ((PyObject *)t == sd->Decimal)
        return PG_TAG_DECIMAL;
    if ((PyObject *)t == sd->UUID)
        return PG_TAG_UUID;
    if ((PyObject *)t == sd->Fraction)
        return PG_TAG_FRACTION;
    if ((PyObject *)t == sd->ZoneInfo)
        return PG_TAG_ZONEINFO;
    return -1;
}

/* A new tagged tuple (tag, ...). */
static int esc_new(enc_t *e, pg_tag_t tag, gser_value_t **out)
{
    gser_status_t st = gser_msg_new_tuple(e->msg, out);
    if (!st)
        st = gser_list_append_uint(*out, tag);
    return st ? fail_st(e, st, "gser_msg_new_tuple") : 0;
}

static int esc_append(enc_t *e, gser_value_t *t, gser_value_t *v)
{
    gser_status_t st = gser_list_append(t, v);
    return st ? fail_st(e, st, "gser_list_append") : 0;
}

/* bytes the message borrows from a bytes object it keeps. */
static int held_bytes(enc_t *e, PyObject *b, gser_value_t **out)
{
    if (pg_owner_hold_ref(e->owner, b) < 0)
        return -1;
    gser_status_t st = gser_msg_new_bytes(e->msg, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b), out);
    return st ? fail_st(e, st, "gser_msg_new_bytes") : 0;
}

/* (PG_TAG_INT, bytes) */
static int enc_bigint(enc_t *e, PyObject *o, gser_value_t **out)
{
    PyObject *b = pg_long_to_le(o);
    gser_value_t *bv;
    int r = b ? held_bytes(e, b, &bv) : -1;
    Py_XDECREF(b);
    if (r == 0 && (r = esc_new(e, PG_TAG_INT, out)) == 0)
        r = esc_append(e, *out, bv);
    return r;
}

/* An exact int of any size (an attribute of a range or a Fraction). */
static int enc_anyint(enc_t *e, PyObject *o, gser_value_t **out)
{
    if (!PyLong_CheckExact(o)) {
        pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path, "an int field of type %s",
                      Py_TYPE(o)->tp_name);
        return -1;
    }
    int r = enc_scalar(e, o, out);
    return r < 0 ? -1 : 0;
}

/* A tzinfo: None, (PG_TAG_TZ, offset us, name or None), (PG_TAG_ZONEINFO, key). */
static int enc_tz(enc_t *e, PyObject *tz, gser_value_t **out)
{
    gser_status_t st;
    if (tz == Py_None) {
        st = gser_msg_new_nil(e->msg, out);
        return st ? fail_st(e, st, "gser_msg_new_nil") : 0;
    }
    if (Py_TYPE(tz) == Py_TYPE(PyDateTime_TimeZone_UTC)) {
        if (tz != e->tz_obj) {
            PyObject *args = PyObject_CallMethod(tz, "__getinitargs__", NULL);
            if (!args)
                return -1;
            if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) < 1 || !PyDelta_Check(PyTuple_GET_ITEM(args, 0))) {
                Py_DECREF(args);
                return not_impl(e, tz, ": its __getinitargs__ is not (offset[, name])");
            }
            PyObject *off = PyTuple_GET_ITEM(args, 0);
            Py_XSETREF(e->tz_name, PyTuple_GET_SIZE(args) > 1 ? Py_NewRef(PyTuple_GET_ITEM(args, 1)) : NULL);
            e->tz_off = ((int64_t)PyDateTime_DELTA_GET_DAYS(off) * 86400 + PyDateTime_DELTA_GET_SECONDS(off)) *
                            1000000 + PyDateTime_DELTA_GET_MICROSECONDS(off);
            Py_XSETREF(e->tz_obj, Py_NewRef(tz));
            Py_DECREF(args);
        }
        gser_value_t *name = NULL;
        int r = esc_new(e, PG_TAG_TZ, out);
        if (r == 0 && (st = gser_list_append_int(*out, e->tz_off)))
            r = fail_st(e, st, "gser_list_append_int");
        if (r == 0 && e->tz_name && !PyUnicode_CheckExact(e->tz_name))
            r = not_impl(e, tz, ": a timezone whose name is not a str");
        if (r == 0)
            r = e->tz_name ? enc_str(e, e->tz_name, &name) : (st = gser_msg_new_nil(e->msg, &name)) ? fail_st(e, st, "nil") : 0;
        return r ? r : esc_append(e, *out, name);
    }
    if (pg_std_ready(e->s) < 0)
        return -1;
    if ((PyObject *)Py_TYPE(tz) == e->s->std.ZoneInfo) {
        PyObject *key = PyObject_GetAttrString(tz, "key");
        if (!key)
            return -1;
        gser_value_t *kv;
        int r = PyUnicode_CheckExact(key) ? enc_str(e, key, &kv) : not_impl(e, tz, " without a key (ZoneInfo.from_file)");
        Py_DECREF(key);
        if (r == 0 && (r = esc_new(e, PG_TAG_ZONEINFO, out)) == 0)
            r = esc_append(e, *out, kv);
        return r;
    }
    pg_path_raise(e->s, PyExc_NotImplementedError, GSER_OK, &e->path,
                  "a tzinfo of type %s (gser carries datetime.timezone and zoneinfo.ZoneInfo)", Py_TYPE(tz)->tp_name);
    return -1;
}

static PyObject *dt_tzinfo(PyObject *o, bool is_time)
{
    if (is_time)
        return ((_PyDateTime_BaseTZInfo *)o)->hastzinfo ? ((PyDateTime_Time *)o)->tzinfo : Py_None;
    return ((_PyDateTime_BaseTZInfo *)o)->hastzinfo ? ((PyDateTime_DateTime *)o)->tzinfo : Py_None;
}

static int64_t pack_dt(PyObject *o)
{
    return pg_pack_datetime(PyDateTime_GET_YEAR(o), PyDateTime_GET_MONTH(o), PyDateTime_GET_DAY(o),
                            PyDateTime_DATE_GET_HOUR(o), PyDateTime_DATE_GET_MINUTE(o),
                            PyDateTime_DATE_GET_SECOND(o), PyDateTime_DATE_GET_MICROSECOND(o),
                            PyDateTime_DATE_GET_FOLD(o));
}

static int64_t pack_date(PyObject *o)
{
    return (int64_t)PyDateTime_GET_YEAR(o) << 9 | PyDateTime_GET_MONTH(o) << 5 | PyDateTime_GET_DAY(o);
}

static int64_t pack_time(PyObject *o)
{
    return pg_pack_time(PyDateTime_TIME_GET_HOUR(o), PyDateTime_TIME_GET_MINUTE(o), PyDateTime_TIME_GET_SECOND(o),
                        PyDateTime_TIME_GET_MICROSECOND(o), PyDateTime_TIME_GET_FOLD(o));
}

/* The 16 bytes of a UUID (big-endian, as UUID.bytes) into p; its is_safe
 * as None (unknown) or an int in *safe (a new reference). */
static int uuid_fields(enc_t *e, PyObject *o, unsigned char *p, PyObject **safe)
{
    PyObject *i = PyObject_GetAttrString(o, "int");
    if (!i)
        return -1;
    int r;
    if (!PyLong_CheckExact(i)) {
        r = not_impl(e, o, ": its int is not an int");
    } else {
#if PY_VERSION_HEX >= 0x030D0000
        Py_ssize_t w = PyLong_AsNativeBytes(i, p, 16, Py_ASNATIVEBYTES_BIG_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER);
        r = w < 0 ? -1 : w > 16 ? not_impl(e, o, ": its int has more than 128 bits") : 0;
#else
        r = _PyLong_AsByteArray((PyLongObject *)i, p, 16, 0, 0);
#endif
    }
    Py_DECREF(i);
    if (r < 0 || !safe)
        return r;
    PyObject *s = PyObject_GetAttrString(o, "is_safe");
    if (!s)
        return -1;
    if (s == e->s->std.SafeUUID_unknown) {
        *safe = Py_NewRef(Py_None);
    } else {
        *safe = PyObject_GetAttrString(s, "value");
        if (*safe && !PyLong_CheckExact(*safe)) {
            Py_CLEAR(*safe);
            not_impl(e, o, ": its is_safe is not a SafeUUID");
        }
    }
    Py_DECREF(s);
    return *safe ? 0 : -1;
}

/* A standard type (std_kind's tag) as a tagged tuple. */
static int enc_std(enc_t *e, PyObject *o, int tag, int depth, gser_value_t **out)
{
    /* What one costs more than pickle, in ns (bench_family.py's std_* rows;
     * a tagged tuple costs about what a tuple does, pickle calls a
     * constructor or __reduce__ per object); a set's or dict's items are
     * charged on their own. Rounded toward declining. */
    static const int16_t cost[PG_TAG_COUNT] = {
        [PG_TAG_COMPLEX] = -200,  [PG_TAG_DATETIME] = -200, [PG_TAG_DATE] = -200,   [PG_TAG_TIME] = -200,
        [PG_TAG_TIMEDELTA] = -200, [PG_TAG_DECIMAL] = -150, [PG_TAG_UUID] = -800,   [PG_TAG_FRACTION] = -300,
        [PG_TAG_RANGE] = -30,     [PG_TAG_SLICE] = -100,    [PG_TAG_SET] = 100,     [PG_TAG_FROZENSET] = 100,
    };
    if (charge(e, depth, cost[tag]) < 0)
        return -1;
    if (check_depth(e, depth) < 0)
        return -1;
    gser_value_t *t, *v;
    gser_status_t st = GSER_OK;
    if (tag == PG_TAG_TZ || tag == PG_TAG_ZONEINFO)
        return enc_tz(e, o, out);
    if (esc_new(e, tag, &t) < 0)
        return -1;
    int r = 0;
    switch (tag) {
    case PG_TAG_COMPLEX: {
        Py_complex c = ((PyComplexObject *)o)->cval;
        if ((st = gser_list_append_float(t, c.real)) || (st = gser_list_append_float(t, c.imag)))
            r = fail_st(e, st, "gser_list_append_float");
        break;
    }
    case PG_TAG_SET:
    case PG_TAG_FROZENSET: {
        PyObject *items = PySequence_List(o);
        e->budget += PG_COST_SEQ; /* the list of the items is not the user's */
        r = items ? enc_seq(e, items, PG_SEQ_INNER, depth + 1, &v) : -1;
        Py_XDECREF(items);
        if (r == 0)
            r = esc_append(e, t, v);
        break;
    }
    case PG_TAG_DATETIME:
    case PG_TAG_TIME:
        if ((st = gser_list_append_int(t, tag == PG_TAG_TIME ? pack_time(o) : pack_dt(o))))
            r = fail_st(e, st, "gser_list_append_int");
        else if ((r = enc_tz(e, dt_tzinfo(o, tag == PG_TAG_TIME), &v)) == 0)
            r = esc_append(e, t, v);
        break;
    case PG_TAG_DATE:
        if ((st = gser_list_append_int(t, pack_date(o))))
            r = fail_st(e, st, "gser_list_append_int");
        break;
    case PG_TAG_TIMEDELTA:
        if ((st = gser_list_append_int(t, PyDateTime_DELTA_GET_DAYS(o))) ||
            (st = gser_list_append_int(t, (int64_t)PyDateTime_DELTA_GET_SECONDS(o) * 1000000 +
                                              PyDateTime_DELTA_GET_MICROSECONDS(o))))
            r = fail_st(e, st, "gser_list_append_int");
        break;
    case PG_TAG_DECIMAL: {
        PyObject *str = PyObject_Str(o);
        r = str ? enc_str(e, str, &v) : -1;
        Py_XDECREF(str);
        if (r == 0)
            r = esc_append(e, t, v);
        break;
    }
    case PG_TAG_UUID: {
        PyObject *safe = NULL, *b = PyBytes_FromStringAndSize(NULL, 16);
        gser_value_t *sv;
        r = b ? uuid_fields(e, o, (unsigned char *)PyBytes_AS_STRING(b), &safe) : -1;
        if (r == 0 && (r = held_bytes(e, b, &v)) == 0 && (r = esc_append(e, t, v)) == 0 &&
            (r = enc_scalar(e, safe, &sv) < 0 ? -1 : 0) == 0)
            r = esc_append(e, t, sv);
        Py_XDECREF(b);
        Py_XDECREF(safe);
        break;
    }
    case PG_TAG_FRACTION:
    case PG_TAG_RANGE: {
        PyObject *parts[3] = {NULL, NULL, NULL};
        r = tag == PG_TAG_RANGE ? pg_range_parts(e->s, o, parts) : pg_fraction_parts(e->s, o, &parts[0], &parts[1]);
        for (int i = 0; r == 0 && i < 3 && parts[i]; i++) {
            if (tag == PG_TAG_FRACTION && PyLong_CheckExact(parts[i]) &&
                _PyLong_NumBits(parts[i]) / 8 >= PG_FRACTION_MAX_BYTES)
                r = not_impl(e, o, ": a numerator or denominator of 2 KiB or more (rebuilding it would cost a "
                                   "gcd of that size)");
            if (r == 0 && (r = enc_anyint(e, parts[i], &v)) == 0)
                r = esc_append(e, t, v);
        }
        for (int i = 0; i < 3; i++)
            Py_XDECREF(parts[i]);
        break;
    }
    case PG_TAG_SLICE: {
        PySliceObject *sl = (PySliceObject *)o;
        PyObject *parts[3] = {sl->start, sl->stop, sl->step};
        for (int i = 0; r == 0 && i < 3; i++) {
            Py_INCREF(parts[i]);
            r = enc_value(e, parts[i], depth + 1, &v);
            Py_DECREF(parts[i]);
            if (r == 0)
                r = esc_append(e, t, v);
        }
        break;
    }
    case PG_TAG_ELLIPSIS: break;
    default: r = not_impl(e, o, ": no encoding");
    }
    if (r == 0)
        *out = t;
    return r;
}

/* (PG_TAG_DICT, [keys], [values]): a dict with a key that is not a scalar. */
static int enc_std_dict(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    if (charge(e, depth, PG_COST_DICT) < 0 || check_depth(e, depth) < 0)
        return -1;
    PyObject *keys = PyDict_Keys(o), *values = keys ? PyDict_Values(o) : NULL;
    gser_value_t *t, *kv, *vv;
    int r = values ? esc_new(e, PG_TAG_DICT, &t) : -1;
    e->budget += 2 * PG_COST_SEQ; /* the lists of keys and values are not the user's */
    /* Keys hold no Dask parts (msgpack would make dicts of them). */
    if (r == 0 && e->dask) {
        e->dask->in_keys++;
        r = enc_seq(e, keys, PG_SEQ_INNER, depth + 1, &kv);
        e->dask->in_keys--;
    } else if (r == 0) {
        r = enc_seq(e, keys, PG_SEQ_INNER, depth + 1, &kv);
    }
    if (r == 0)
        r = enc_seq(e, values, PG_SEQ_INNER, depth + 1, &vv);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    if (r == 0 && (r = esc_append(e, t, kv)) == 0 && (r = esc_append(e, t, vv)) == 0)
        *out = t;
    return r;
}

/* ---- packed lists of scalars, records and rows (in a "python.tree") ----------------- */

/* Lists at least this long of mixed scalars (None, bool, int, float, str),
 * of dicts with the same str keys, or of tuples of one length go packed:
 * the core carries a few typed columns instead of a value per item. */
#define PG_PACK_MIN 16


PG_HOT static int sc_code(PyObject *x, uint64_t *bits)
{
    PyTypeObject *t = Py_TYPE(x);
    if (t == &PyFloat_Type) {
        double f = PyFloat_AS_DOUBLE(x);
        memcpy(bits, &f, 8);
        return PG_SC_FLOAT;
    }
    if (t == &PyUnicode_Type)
        return PG_SC_STR;
    if (t == &PyLong_Type) {
        int64_t small;
        if (pg_small_int(x, &small)) {
            *bits = (uint64_t)small;
            return PG_SC_INT;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (!overflow) {
            *bits = (uint64_t)v;
            return PG_SC_INT;
        }
        if (overflow < 0 || _PyLong_NumBits(x) > 64)
            return -1;
        *bits = PyLong_AsUnsignedLongLong(x);
        return PG_SC_UINT;
    }
    if (x == Py_None)
        return PG_SC_NONE;
    if (x == Py_False)
        return PG_SC_FALSE;
    if (x == Py_True)
        return PG_SC_TRUE;
    if (x == Py_Ellipsis)
        return PG_SC_ELLIPSIS;
    return -1;
}

/* (PG_TAG_PACKED, PG_TAG_SCALARS, tuple, codes, int64s, float64s, str byte
 * lengths, str bytes, [other items]): a list of mixed scalars, and at most
 * as many other items. 1 done, 0 not such a list. */
static int enc_scalars(enc_t *e, PyObject *o, bool tuple, int depth, gser_value_t **out)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    if (n < PG_PACK_MIN)
        return 0;
    size_t nint = 0, nflt = 0, nstr = 0, sbytes = 0, nother = 0;
    unsigned seen = 0;
    struct sc_count kept = e->sc_kept;
    e->sc_kept.list = NULL; /* taken (or not this list's): never used twice */
    if (kept.list == o && kept.n == n && e->ext) {
        nint = kept.nint;
        nflt = kept.nflt;
        nstr = kept.nstr;
        sbytes = kept.sbytes;
        seen = kept.seen;
        n = 0; /* counted: the loop below is skipped */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t bits;
        int c = sc_code(items[i], &bits);
        if (c < 0) {
            c = PG_SC_OTHER;
            if (++nother * 2 > (size_t)n)
                return 0; /* mostly containers or objects: item by item */
        }
        seen |= 1u << c;
        nint += c == PG_SC_INT || c == PG_SC_UINT;
        nflt += c == PG_SC_FLOAT;
        if (c == PG_SC_STR) {
            Py_ssize_t len;
            if (!PyUnicode_AsUTF8AndSize(items[i], &len)) {
                PyErr_Clear(); /* surrogates: the item by item path says where */
                return 0;
            }
            nstr++;
            sbytes += (size_t)len;
        }
    }
    /* One kind: a typed array already, or a list of str (packed too inside
     * a "python.tree", where it is no reason to start one). */
    n = PySequence_Fast_GET_SIZE(o);
    if (!(seen & (seen - 1)) && !(e->ext && seen == 1u << PG_SC_STR) && seen != 1u << PG_SC_ELLIPSIS)
        return 0;
    if (!e->ext) {
        e->sc_kept = (struct sc_count){o, n, nint, nflt, nstr, sbytes, seen};
        return need_ext(e);
    }
    if (charge(e, depth + 1, -(int64_t)n * PG_GAIN_PACKED) < 0)
        return -1;
    /* codes, int64s, str lengths, float64s, str bytes: freed with the message */
    size_t sizes[5] = {(size_t)n, nint * 8, nstr * 8, nflt * 8, sbytes};
    void *all[5];
    for (int i = 0; i < 5; i++) {
        if (!(all[i] = malloc(sizes[i] ? sizes[i] : 1))) {
            PyErr_NoMemory();
            return -1;
        }
        if (pg_owner_hold_alloc(e->owner, all[i]) < 0)
            return -1;
    }
    unsigned char *codes = all[0];
    int64_t *ints = all[1], *lens = all[2];
    double *flts = all[3];
    char *blob = all[4];
    size_t ai = 0, af = 0, as = 0, at = 0;
    gser_value_t *others;
    gser_status_t st = gser_msg_new_list(e->msg, &others);
    if (st)
        return fail_st(e, st, "gser_msg_new_list");
    if (check_depth(e, depth + 1) < 0)
        return -1;
    int slot = e->path.len++;
    e->path.seg[slot].key = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t bits = 0;
        int c = sc_code(items[i], &bits);
        if (c < 0) { /* anything else, in a list of its own */
            gser_value_t *ov;
            e->path.seg[slot].index = i;
            PyObject *x = Py_NewRef(items[i]);
            int r = enc_value(e, x, depth + 2, &ov);
            Py_DECREF(x);
            if (r < 0)
                return -1;
            if ((st = gser_list_append(others, ov)))
                return fail_st(e, st, "gser_list_append");
            c = PG_SC_OTHER;
        }
        codes[i] = (unsigned char)c;
        if (c == PG_SC_INT || c == PG_SC_UINT)
            memcpy(&ints[ai++], &bits, 8);
        else if (c == PG_SC_FLOAT)
            memcpy(&flts[af++], &bits, 8);
        else if (c == PG_SC_STR) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(items[i], &len);
            memcpy(blob + at, s, (size_t)len);
            lens[as++] = len;
            at += (size_t)len;
        }
    }
    e->path.len--;
    gser_value_t *pk, *v;
    if (esc_new(e, PG_TAG_PACKED, &pk) < 0)
        return -1;
    if ((st = gser_list_append_uint(pk, PG_TAG_SCALARS)) || (st = gser_list_append_bool(pk, tuple)) ||
        (st = gser_msg_new_bytes(e->msg, codes, (size_t)n, &v)) || (st = gser_list_append(pk, v)) ||
        (st = gser_msg_new_array(e->msg, GSER_KIND_INT, ints, nint, 0, &v)) || (st = gser_list_append(pk, v)) ||
        (st = gser_msg_new_array(e->msg, GSER_KIND_FLOAT, flts, nflt, 0, &v)) || (st = gser_list_append(pk, v)) ||
        (st = gser_msg_new_array(e->msg, GSER_KIND_INT, lens, nstr, 0, &v)) || (st = gser_list_append(pk, v)) ||
        (st = gser_msg_new_bytes(e->msg, blob, sbytes, &v)) || (st = gser_list_append(pk, v)) ||
        (st = gser_list_append(pk, others)))
        return fail_st(e, st, "a packed list");
    *out = pk;
    return 1;
}

/* (PG_TAG_PACKED, PG_TAG_RECORDS, tuple, [keys], [column lists]): a list of
 * dicts with the same str keys in the same order; (PG_TAG_PACKED,
 * PG_TAG_ROWS, tuple, width, [column lists]): a list of tuples of one
 * length. 1 done, 0 not such a list. */
static int enc_columns(enc_t *e, PyObject *o, bool tuple, int depth, gser_value_t **out)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    PyTypeObject *t = Py_TYPE(items[0]);
    bool rec = t == &PyDict_Type;
    if (n < PG_PACK_MIN || (!rec && t != &PyTuple_Type))
        return 0;
    Py_ssize_t k = rec ? PyDict_GET_SIZE(items[0]) : PyTuple_GET_SIZE(items[0]);
    if (k == 0 || k > 4096)
        return 0;
    PyObject *keys = NULL;
    if (rec) {
        keys = PyDict_Keys(items[0]);
        if (!keys)
            return -1;
        for (Py_ssize_t j = 0; j < k; j++)
            if (!PyUnicode_CheckExact(PyList_GET_ITEM(keys, j))) {
                Py_DECREF(keys);
                return 0;
            }
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *x = items[i];
        bool ok = Py_TYPE(x) == t && (rec ? PyDict_GET_SIZE(x) : PyTuple_GET_SIZE(x)) == k;
        if (ok && rec) {
            Py_ssize_t pos = 0, j = 0;
            PyObject *key, *val;
            while (ok && PyDict_Next(x, &pos, &key, &val)) {
                PyObject *want = PyList_GET_ITEM(keys, j++);
                ok = key == want || (PyUnicode_CheckExact(key) && PyUnicode_Compare(key, want) == 0);
            }
        }
        if (!ok) {
            Py_XDECREF(keys);
            return 0;
        }
    }
    if (!e->ext) {
        Py_XDECREF(keys);
        return need_ext(e);
    }
    /* Each dict or tuple saves its container's cost (charged by the columns' items). */
    int r = charge(e, depth + 1, -(int64_t)n * (rec ? PG_COST_DICT : PG_COST_SEQ));
    gser_value_t *pk = NULL, *cols = NULL, *v;
    gser_status_t st = GSER_OK;
    if (r == 0 && (r = check_depth(e, depth + 1)) == 0 && (r = esc_new(e, PG_TAG_PACKED, &pk)) == 0 &&
        ((st = gser_list_append_uint(pk, rec ? PG_TAG_RECORDS : PG_TAG_ROWS)) ||
         (st = gser_list_append_bool(pk, tuple)) || (st = gser_msg_new_list(e->msg, &cols))))
        r = fail_st(e, st, "a packed list");
    if (r == 0) {
        if (rec)
            r = enc_seq(e, keys, PG_SEQ_INNER, depth + 1, &v);
        else
            r = (st = gser_msg_new_int(e->msg, k, &v)) ? fail_st(e, st, "gser_msg_new_int") : 0;
        if (r == 0)
            r = esc_append(e, pk, v);
    }
    /* One column at a time, as a list of its own (its items kept alive by it). */
    int slot = e->path.len++;
    for (Py_ssize_t j = 0; r == 0 && j < k; j++) {
        e->path.seg[slot].key = rec ? PyList_GET_ITEM(keys, j) : NULL;
        e->path.seg[slot].index = j;
        PyObject *col = PyList_New(n);
        if (!col) {
            r = -1;
            break;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = rec ? PyDict_GetItemWithError(items[i], PyList_GET_ITEM(keys, j)) : PyTuple_GET_ITEM(items[i], j);
            if (!x) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "a dict changed while it was being serialized");
                r = -1;
                break;
            }
            PyList_SET_ITEM(col, i, Py_NewRef(x));
        }
        e->budget += PG_COST_SEQ; /* a column is not a list of the user's */
        if (r == 0)
            r = enc_seq(e, col, PG_SEQ_INNER, depth + 2, &v);
        Py_DECREF(col);
        if (r == 0)
            r = esc_append(e, cols, v);
    }
    if (r == 0)
        e->path.len--;
    Py_XDECREF(keys);
    if (r == 0 && (r = esc_append(e, pk, cols)) == 0)
        *out = pk;
    return r < 0 ? -1 : 1;
}

/* A list or tuple of at least 2 items of one standard type (datetimes with
 * one tzinfo, dates, times with one tzinfo, timedeltas, complex numbers,
 * Decimals, UUIDs whose is_safe is unknown, ints not all within 64 bits):
 * (PG_TAG_PACKED, kind tag, tuple, payload...), one value for all items.
 * 1 if done, 0 if the items are not all of one such kind, -1 on error. */
static int enc_packed(enc_t *e, PyObject *o, bool tuple, int depth, gser_value_t **out)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    PyTypeObject *t = Py_TYPE(items[0]);
    if (t == &PyDict_Type || t == &PyTuple_Type)
        return enc_columns(e, o, tuple, depth, out);
    int tag = t == &PyLong_Type ? PG_TAG_INT : std_kind(e, items[0]);
    bool one = tag == PG_TAG_INT || tag == PG_TAG_DATETIME || tag == PG_TAG_DATE || tag == PG_TAG_TIME ||
               tag == PG_TAG_TIMEDELTA || tag == PG_TAG_COMPLEX || tag == PG_TAG_DECIMAL || tag == PG_TAG_UUID;
    bool is_time = tag == PG_TAG_TIME;
    PyObject *tz = one && (tag == PG_TAG_DATETIME || is_time) ? dt_tzinfo(items[0], is_time) : NULL;
    for (Py_ssize_t i = 1; one && i < n; i++)
        if (Py_TYPE(items[i]) != t || (tz && dt_tzinfo(items[i], is_time) != tz))
            one = false;
    if (one && tag == PG_TAG_INT) { /* ints within 64 bits (uints among them): mixed scalars */
        bool big = false;
        for (Py_ssize_t i = 0; i < n && !big; i++)
            big = !is_map_key(items[i]); /* beyond int64 and uint64 */
        one = big;
    }
    if (!one) /* not all of one standard type: mixed scalars, maybe */
        return n >= PG_PACK_MIN ? enc_scalars(e, o, tuple, depth, out) : 0;
    if (!e->ext)
        return need_ext(e);
    if (charge(e, depth + 1, (int64_t)n * PG_COST_PACKED) < 0 || check_depth(e, depth) < 0)
        return -1;
    gser_value_t *pk, *v = NULL;
    gser_status_t st;
    if (esc_new(e, PG_TAG_PACKED, &pk) < 0)
        return -1;
    if ((st = gser_list_append_uint(pk, (uint64_t)tag)) || (st = gser_list_append_bool(pk, tuple)))
        return fail_st(e, st, "gser_list_append");
    if (tz) {
        if (enc_tz(e, tz, &v) < 0 || esc_append(e, pk, v) < 0)
            return -1;
    }
    int r = 0;
    switch (tag) {
    case PG_TAG_DATETIME:
    case PG_TAG_DATE:
    case PG_TAG_TIME:
    case PG_TAG_TIMEDELTA:
    case PG_TAG_COMPLEX: {
        size_t per = tag == PG_TAG_TIMEDELTA || tag == PG_TAG_COMPLEX ? 2 : 1;
        int64_t *a = malloc((size_t)n * per * sizeof *a);
        if (!a) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = items[i];
            if (tag == PG_TAG_DATETIME)
                a[i] = pack_dt(x);
            else if (tag == PG_TAG_DATE)
                a[i] = pack_date(x);
            else if (tag == PG_TAG_TIME)
                a[i] = pack_time(x);
            else if (tag == PG_TAG_TIMEDELTA) {
                a[2 * i] = PyDateTime_DELTA_GET_DAYS(x);
                a[2 * i + 1] = (int64_t)PyDateTime_DELTA_GET_SECONDS(x) * 1000000 + PyDateTime_DELTA_GET_MICROSECONDS(x);
            } else {
                Py_complex c = ((PyComplexObject *)x)->cval;
                memcpy(&a[2 * i], &c.real, 8);
                memcpy(&a[2 * i + 1], &c.imag, 8);
            }
        }
        if (pg_owner_hold_alloc(e->owner, a) < 0)
            return -1;
        st = gser_msg_new_array(e->msg, tag == PG_TAG_COMPLEX ? GSER_KIND_FLOAT : GSER_KIND_INT, a, (size_t)n * per, 0,
                                &v);
        r = st ? fail_st(e, st, "gser_msg_new_array") : 0;
        break;
    }
    case PG_TAG_DECIMAL:
        if ((st = gser_msg_new_list(e->msg, &v)))
            return fail_st(e, st, "gser_msg_new_list");
        for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
            PyObject *str = PyObject_Str(items[i]);
            gser_value_t *sv;
            r = str ? enc_str(e, str, &sv) : -1;
            Py_XDECREF(str);
            if (r == 0)
                r = esc_append(e, v, sv);
        }
        break;
    case PG_TAG_UUID: {
        unsigned char *b = malloc((size_t)n * 16);
        if (!b || pg_owner_hold_alloc(e->owner, b) < 0) {
            if (!b)
                PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; r == 0 && i < n; i++) {
            PyObject *safe = PyObject_GetAttrString(items[i], "is_safe");
            if (!safe)
                return -1;
            Py_DECREF(safe);
            if (safe != e->s->std.SafeUUID_unknown)
                return 0; /* each with its own is_safe */
            r = uuid_fields(e, items[i], b + 16 * i, NULL);
        }
        if (r == 0 && (st = gser_msg_new_bytes(e->msg, b, (size_t)n * 16, &v)))
            r = fail_st(e, st, "gser_msg_new_bytes");
        break;
    }
    case PG_TAG_INT: { /* the byte lengths, then every int's bytes */
        int64_t *lens = malloc((size_t)n * sizeof *lens);
        if (!lens) {
            PyErr_NoMemory();
            return -1;
        }
        if (pg_owner_hold_alloc(e->owner, lens) < 0)
            return -1;
        size_t total = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            size_t bits = _PyLong_NumBits(items[i]);
            if (bits == (size_t)-1 && PyErr_Occurred())
                return -1;
            lens[i] = (int64_t)(bits / 8 + 1);
            total += bits / 8 + 1;
        }
        unsigned char *b = malloc(total ? total : 1);
        if (!b) {
            PyErr_NoMemory();
            return -1;
        }
        if (pg_owner_hold_alloc(e->owner, b) < 0)
            return -1;
        size_t at = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (pg_long_write_le(items[i], b + at, (size_t)lens[i]) < 0)
                return -1;
            at += (size_t)lens[i];
        }
        gser_value_t *lv;
        st = gser_msg_new_array(e->msg, GSER_KIND_INT, lens, (size_t)n, 0, &lv);
        r = st ? fail_st(e, st, "gser_msg_new_array") : esc_append(e, pk, lv);
        if (r == 0 && (st = gser_msg_new_bytes(e->msg, b, total, &v)))
            r = fail_st(e, st, "gser_msg_new_bytes");
        break;
    }
    }
    if (r < 0 || esc_append(e, pk, v) < 0)
        return -1;
    *out = pk;
    return 1;
}

/* Whether x is one of Python's standard types that only a "python.tree"
 * carries (an int beyond 64 bits included). */
static bool is_std(enc_t *e, PyObject *x)
{
    if (Py_TYPE(x) == &PyLong_Type) {
        int overflow = 0;
        PyLong_AsLongLongAndOverflow(x, &overflow);
        return overflow < 0 || (overflow > 0 && _PyLong_NumBits(x) > 64); /* as enc_int decides */
    }
    return std_kind(e, x) >= 0;
}

/* A look at o and its first item (a shallow pre-scan): true when o will
 * need a "python.tree" (a set, a list of datetimes, a dict with tuple keys),
 * so that the scope starts as one instead of running up to the first such
 * value twice. Deeper ones are still found by the first try. */
static bool scope_needs_ext(enc_t *e, PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyList_Type || t == &PyTuple_Type)
        return PySequence_Fast_GET_SIZE(o) && is_std(e, PySequence_Fast_ITEMS(o)[0]);
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        return PyDict_Next(o, &pos, &key, &value) && (!is_map_key(key) || is_std(e, value));
    }
    return t != &PyUnicode_Type && t != &PyFloat_Type && t != &PyBytes_Type && is_std(e, o);
}

/* Encode o as a value of a scope of its own (the message's root, a
 * registered type's payload): as it is when it holds none of Python's
 * standard types, else again as a "python.tree" object. */
static int enc_scope(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    if (scope_needs_ext(e, o)) {
        bool ext = e->ext;
        gser_value_t *inner;
        e->ext = true;
        int r = enc_value(e, o, depth + 1, &inner);
        if (r == 0)
            r = enc_typed(e, PG_T_TREE, inner, out);
        e->ext = ext;
        return r;
    }
    bool ext = e->ext;
    int plen = e->path.len;
    int64_t budget = e->budget;
    Py_ssize_t nfobjs = e->owner->nfobjs;
    e->ext = false;
    e->need_ext = false;
    e->sc_kept.list = NULL;
    int r = enc_value(e, o, depth, out);
    if (r < 0 && e->need_ext && !PyErr_Occurred()) {
        /* The root list's count is kept only when it is what sent the scope
         * round, with nothing noted: then no Python code runs before the
         * retry meets it again (its first look), so it is unchanged. */
        if (e->sc_kept.list != o || e->owner->nfobjs != nfobjs)
            e->sc_kept.list = NULL;
        /* The first try's values stay in the message unused; the frames it
         * noted (large bytes) are forgotten, as they will be noted again. */
        while (e->owner->nfobjs > nfobjs)
            Py_CLEAR(e->owner->fobjs[--e->owner->nfobjs].obj);
        e->need_ext = false;
        e->ext = true;
        e->path.len = plen;
        e->budget = budget;
        gser_value_t *inner;
        r = enc_value(e, o, depth + 1, &inner);
        if (r == 0)
            r = enc_typed(e, PG_T_TREE, inner, out);
    }
    e->sc_kept.list = NULL;
    e->ext = ext;
    return r;
}

/* ---- whole Dask messages on gser:// ("dask.msg", "dask.part") ----------------------------
 *
 * The message's dicts, lists (as tuples: Dask's msgpack gives them back as
 * tuples), tuples and plain scalars are gser values; its parts (objects of
 * exactly one of the types given: Serialize, Serialized, ToPickle, Pickled)
 * are "dask.part" objects, (kind, header, frames...) as the callback makes
 * them with Dask's own dumps, filled in once the tree is built, so that a
 * message gser declines costs no serialization. Anything else (a dict with
 * keys Dask's msgpack hooks act on, other types, subclasses) raises
 * NotImplementedError: the comm sends Dask's own frames for that message. */


static const char *const dask_magic_keys[4] = {"__Serialized__", "__Pickled__", "__Enum__", "__Set__"};

/* 1 if dict o has a key Dask's loads would act on (it would not come back as
 * it went), 0 if not, -1 on error. */
static int dask_magic(enc_dask_t *k, PyObject *o)
{
    for (int i = 0; i < 4; i++) {
        int r = PyDict_Contains(o, k->magic[i]);
        if (r)
            return r;
    }
    return 0;
}

static int enc_dask_part(enc_t *e, PyObject *o, gser_value_t **out)
{
    enc_dask_t *k = e->dask;
    Py_ssize_t nt = PyTuple_GET_SIZE(k->types), i = 0;
    while (i < nt && (PyObject *)Py_TYPE(o) != PyTuple_GET_ITEM(k->types, i))
        i++;
    if (i == nt || k->filling || k->in_keys)
        return not_impl(e, o, i == nt       ? " in a Dask message (Dask's own frames carry it)"
                              : k->filling ? " inside a Dask part"
                                           : " as a dict key in a Dask message");
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 8;
        gser_value_t **s = realloc(k->slots, cap * sizeof *s);
        if (!s) {
            PyErr_NoMemory();
            return -1;
        }
        k->slots = s;
        k->cap = cap;
    }
    gser_value_t *tree;
    gser_status_t st = gser_msg_new_tuple(e->msg, &tree);
    if (st)
        return fail_st(e, st, "gser_msg_new_tuple");
    if (PyList_Append(k->pending, o) < 0)
        return -1;
    k->slots[k->n++] = tree;
    return enc_typed(e, PG_T_DASK_PART, tree, out);
}

/* A frame of a part: host bytes as one flat buffer (borrowed; a copy when
 * not contiguous), device memory as a device buffer. */
static int enc_dask_frame(enc_t *e, PyObject *f, gser_value_t **out)
{
    e->work += PG_WORK_BUFFER;
    if (!PyObject_CheckBuffer(f))
        return Py_TYPE(f) == &PyLong_Type || Py_TYPE(f) == &PyUnicode_Type || f == Py_None
                   ? enc_value(e, f, 1, out) /* for tests of what a receiver refuses */
                   : enc_interfaces(e, f, out);
    Py_buffer view;
    if (PyObject_GetBuffer(f, &view, PyBUF_SIMPLE) == 0)
        return enc_host_view(e, &view, GSER_DTYPE_BYTES, 0, 0, out, NULL, NULL);
    PyErr_Clear();
    PyObject *c = PyMemoryView_GetContiguous(f, PyBUF_READ, 'C');
    if (!c)
        return -1;
    int r = PyObject_GetBuffer(c, &view, PyBUF_SIMPLE);
    Py_DECREF(c); /* the view holds it */
    return r < 0 ? -1 : enc_host_view(e, &view, GSER_DTYPE_BYTES, 0, 0, out, NULL, NULL);
}

/* A standard type in a Dask message, as Dask's protocol gives it to the
 * receiver: a set as a set (its msgpack hook; its items as msgpack gives
 * them), anything else, where Dask pickles what its msgpack refuses (2026.x),
 * exactly as it went (lists stay lists in it); declined where Dask raises
 * (2022.12). Dicts with tuple keys are enc_dict's (msgpack carries them). */
static int enc_dask_std(enc_t *e, PyObject *o, int tag, int depth, gser_value_t **out)
{
    enc_dask_t *k = e->dask;
    if (tag != PG_TAG_SET && !k->pickles)
        return not_impl(e, o, " in a Dask message (Dask's msgpack refuses it in this version)");
    if (!e->ext)
        return need_ext(e);
    if (tag == PG_TAG_SET)
        return enc_std(e, o, tag, depth, out);
    e->dask = NULL; /* what Dask pickles: the plain "python.tree" rules, no parts in it */
    int r = enc_std(e, o, tag, depth, out);
    e->dask = k;
    return r;
}

/* Anything else in a Dask message: what Dask's msgpack packs as its base
 * type (it does not ask for strict types), so that the receiver gets the base
 * type: subclasses of dict (a Counter in 2026's heartbeats, an OrderedDict),
 * list, tuple (a namedtuple), int (an IntEnum), float and str; else a part. */
static int enc_dask_other(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    gser_status_t st;
    if (PyDict_Check(o)) {
        int magic = dask_magic(e->dask, o);
        return magic ? magic < 0 ? -1 : not_impl(e, o, " with a key Dask's protocol acts on, in a Dask message")
                     : enc_dict(e, o, depth, out);
    }
    if (PyList_Check(o) || PyTuple_Check(o))
        return enc_seq(e, o, PyList_Check(o) ? PG_SEQ_LIST : PG_SEQ_TUPLE, depth, out);
    if (PyUnicode_Check(o))
        return enc_str(e, o, out);
    if (PyFloat_Check(o)) {
        double d = PyFloat_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        st = gser_msg_new_float(e->msg, d, out);
        return st ? fail_st(e, st, "gser_msg_new_float") : 0;
    }
    if (PyLong_Check(o)) {
        gser_kind_t k;
        int64_t i = 0;
        uint64_t u = 0;
        int r = enc_int(e, o, &k, &i, &u);
        if (r)
            return r < 0 ? -1 : enc_big(e, o, out);
        st = k == GSER_KIND_INT ? gser_msg_new_int(e->msg, i, out) : gser_msg_new_uint(e->msg, u, out);
        return st ? fail_st(e, st, "gser_msg_new_int") : 0;
    }
    return enc_dask_part(e, o, out);
}

/* Fill in the parts: the callback's (kind, header, frames...) for each. */
static int enc_dask_fill(enc_t *e)
{
    enc_dask_t *k = e->dask;
    k->filling = true;
    for (size_t i = 0; i < k->n; i++) {
        PyObject *r = PyObject_CallOneArg(k->cb, PyList_GET_ITEM(k->pending, (Py_ssize_t)i));
        if (!r)
            return -1;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) < 2) {
            PyErr_Format(PyExc_TypeError, "gser: a Dask part's callback returned %.100s, not (kind, header, frames...)",
                         Py_TYPE(r)->tp_name);
            Py_DECREF(r);
            return -1;
        }
        int rc = 0;
        for (Py_ssize_t j = 0; rc == 0 && j < PyTuple_GET_SIZE(r); j++) {
            gser_value_t *v;
            PyObject *item = PyTuple_GET_ITEM(r, j);
            gser_status_t st;
            rc = j < 2 ? enc_value(e, item, 1, &v) : enc_dask_frame(e, item, &v);
            if (rc == 0 && (st = gser_list_append(k->slots[i], v)))
                rc = fail_st(e, st, "gser_list_append");
        }
        Py_DECREF(r);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ---- dispatch ------------------------------------------------------------------------ */

PG_HOT static int enc_value(enc_t *e, PyObject *o, int depth, gser_value_t **out)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyList_Type)
        return enc_seq(e, o, PG_SEQ_LIST, depth, out);
    if (t == &PyTuple_Type)
        return enc_seq(e, o, PG_SEQ_TUPLE, depth, out);
    if (t == &PyDict_Type) {
        int magic = e->dask ? dask_magic(e->dask, o) : 0;
        if (magic)
            return magic < 0 ? -1 : not_impl(e, o, " with a key Dask's protocol acts on, in a Dask message");
        return enc_dict(e, o, depth, out);
    }
    int sc = enc_scalar(e, o, out);
    if (sc)
        return sc < 0 ? -1 : 0;
    int tag = std_kind(e, o);
    if (e->dask) /* a whole Dask message: its parts, and standard types as Dask gives them */
        return tag >= 0 ? enc_dask_std(e, o, tag, depth, out) : enc_dask_other(e, o, depth, out);
    if (tag >= 0)
        return e->ext ? enc_std(e, o, tag, depth, out) : need_ext(e);
    e->work += PG_WORK_BUFFER; /* buffers, typed objects: frames to pack, stage or compress */
    if (t == &PyByteArray_Type)
        return enc_bytes_like(e, o, PG_T_BYTEARRAY, out);
    if (t == &PyMemoryView_Type)
        return enc_bytes_like(e, o, PG_T_MEMORYVIEW, out);
    if (is_numpy_array(o))
        return enc_numpy(e, o, depth, out);
    if (pg_npscalar_check(e->s, o))
        return enc_npscalar(e, o, out);
    PyObject *entry;
    int reg = pg_registry_lookup_type(e->s, t, &entry);
    if (reg) {
        int r = reg < 0 ? -1 : enc_registered(e, o, entry, depth, out);
        Py_XDECREF(entry);
        return r;
    }
    return enc_interfaces(e, o, out);
}

/* What an object's interfaces make of it: a buffer, an Arrow table, a device
 * array or a DLPack tensor; anything else is refused. */
static int enc_interfaces(enc_t *e, PyObject *o, gser_value_t **out)
{
    if (PyObject_CheckBuffer(o))
        return enc_buffer(e, o, out);
    int arrow = pg_arrow_probe(o);
    if (arrow)
        return arrow < 0 ? -1 : enc_arrow(e, o, arrow, out);
    PyObject *cai = PyObject_GetAttrString(o, "__cuda_array_interface__");
    if (cai) {
        int r = enc_cai(e, o, cai, out);
        Py_DECREF(cai);
        return r;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    int dl = pg_has_attr(o, "__dlpack__");
    if (dl)
        return dl < 0 ? -1 : enc_dlpack(e, o, out);
    return not_impl(e, o, " (gser never pickles: send it with another serializer, or register it with "
                          "gser.register_type)");
}

/* A whole Dask message: parts is (types, callback). */
static int enc_dask_msg(enc_t *e, PyObject *obj, PyObject *parts)
{
    enc_dask_t k = {0};
    Py_ssize_t np = PyTuple_Check(parts) ? PyTuple_GET_SIZE(parts) : 0;
    if ((np != 2 && np != 3) || !PyTuple_Check(PyTuple_GET_ITEM(parts, 0)) ||
        (np == 3 && !PyBool_Check(PyTuple_GET_ITEM(parts, 2)))) {
        PyErr_SetString(PyExc_TypeError, "gser: parts must be (a tuple of types, a callback[, Dask pickles what "
                                         "its msgpack refuses])");
        return -1;
    }
    k.types = PyTuple_GET_ITEM(parts, 0);
    k.cb = PyTuple_GET_ITEM(parts, 1);
    k.pickles = np == 3 && PyTuple_GET_ITEM(parts, 2) == Py_True;
    int r = (k.pending = PyList_New(0)) ? 0 : -1;
    for (int i = 0; r == 0 && i < 4; i++)
        r = (k.magic[i] = PyUnicode_InternFromString(dask_magic_keys[i])) ? 0 : -1;
    e->dask = &k;
    gser_value_t *root;
    gser_status_t st;
    Py_ssize_t nfobjs = e->owner->nfobjs;
    if (r == 0)
        r = enc_value(e, obj, 1, &root);
    if (r < 0 && e->need_ext && !PyErr_Occurred()) {
        /* Standard types (a tuple dict key, a set): the message again as a
         * "python.tree", its parts met again (enc_scope's way). */
        while (e->owner->nfobjs > nfobjs)
            Py_CLEAR(e->owner->fobjs[--e->owner->nfobjs].obj);
        r = PyList_SetSlice(k.pending, 0, PY_SSIZE_T_MAX, NULL);
        k.n = 0;
        e->need_ext = false;
        e->ext = true;
        e->path.len = 0;
        gser_value_t *inner;
        if (r == 0)
            r = enc_value(e, obj, 2, &inner);
        if (r == 0)
            r = enc_typed(e, PG_T_TREE, inner, &root);
    }
    if (r == 0)
        r = enc_dask_fill(e);
    if (r == 0)
        r = enc_typed(e, PG_T_DASK_MSG, root, &root);
    if (r == 0 && (st = gser_msg_set_root(e->msg, root)))
        r = fail_st(e, st, "gser_msg_set_root");
    e->dask = NULL;
    Py_XDECREF(k.pending);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(k.magic[i]);
    free(k.slots);
    return r;
}

int pg_encode(PgOwner *owner, PyObject *obj, const pg_encode_options_t *opts, size_t *work)
{
    gser_status_t st = gser_msg_create(pg_ctx, &owner->msg);
    if (st) {
        pg_raise(owner->state, st, false, "gser_msg_create");
        return -1;
    }
    enc_t e;
    e.owner = owner;
    e.s = owner->state;
    e.msg = owner->msg;
    e.strict = opts && opts->strict;
    e.decline = opts && opts->decline;
    e.charge_depth = opts && opts->decline == PG_DECLINE_COLLECTION ? 3 : 2;
    e.budget = PG_COST_SLACK;
    e.path.len = 0;
    e.ext = e.need_ext = false;
    e.tz_obj = e.tz_name = NULL;
    e.work = 0;
    e.memo = NULL;
    e.sc_kept.list = NULL;
    /* A collection Dask would serialize item by item: each top-level item
     * gser carries in the one message saves Dask's per-item work. */
    if (e.decline && opts->decline == PG_DECLINE_COLLECTION) {
        Py_ssize_t n = PyList_Check(obj) ? PyList_GET_SIZE(obj) : PyTuple_Check(obj) ? PyTuple_GET_SIZE(obj)
                       : PyDict_Check(obj)                     ? PyDict_GET_SIZE(obj)
                                                               : 0;
        e.budget += (int64_t)n * PG_GAIN_DASK_ITEM;
    }
    gser_value_t *root;
    e.dask = NULL;
    int r = opts && opts->dask_parts ? enc_dask_msg(&e, obj, opts->dask_parts) : enc_scope(&e, obj, 1, &root);
    Py_XDECREF(e.tz_obj);
    Py_XDECREF(e.tz_name);
    Py_XDECREF(e.memo);
    if (work)
        *work = e.work;
    if (r < 0 || (opts && opts->dask_parts))
        return r < 0 ? -1 : 0;
    st = gser_msg_set_root(owner->msg, root);
    return st ? fail_st(&e, st, "gser_msg_set_root") : 0;
}
