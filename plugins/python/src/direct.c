/* The family's direct path: small messages of plain Python data straight
 * between Python objects and msgpack, skipping the core's value tree.
 *
 * gser.dask.dumps / loads of a 10-element set or list cost 2-3x pickle's
 * round trip, most of it building a gser value per item, encoding the tree,
 * parsing it back into values and walking them again (BENCHMARKS.md, "The
 * family's per-message cost in C"). Here a whole message of None, bool,
 * int, float, str, bytes, list, tuple and dict — and, inside a
 * "python.tree" (docs/wire-format.md 4.9), sets, frozensets, ints beyond 64
 * bits, complex, Ellipsis and dicts with keys that are not scalars — is
 * written with msgpack-c's pack template into the header bytes, and read
 * with msgpack-c's unpack template into Python objects.
 *
 * The bytes are exactly the ones the general path writes (the tests compare
 * them), so every reader accepts them. Anything else — a value of another
 * type, a container of 15 or more items (the general path may write those as
 * typed or packed arrays), nesting past 16, a str that is not UTF-8, more
 * than DIRECT_NODES values — is not handled: the caller falls back to the
 * general path, which starts from scratch (nothing was written). The reader
 * likewise takes only headers of at most DIRECT_HEADER_MAX bytes with no
 * data frames, and gives up on anything it does not expect — a marker other
 * than a tuple or a "python.tree" object, a tag it does not build, bytes that
 * are not well-formed, a set item that cannot be hashed — leaving the
 * general decoder to build the object or name the error and its path. It
 * never accepts what that decoder refuses: its depth bound is below the
 * limit's, and its size bound keeps every count and cost far below theirs.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <datetime.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack/object.h>
#include <msgpack/pack_define.h>
#include <msgpack/timestamp.h>
#include <msgpack/unpack.h>
#include <msgpack/unpack_define.h>

/* The wire's ext types (docs/wire-format.md 4.3). */
enum { EXT_MAGIC = 1, EXT_TUPLE = 2, EXT_UINT = 3, EXT_BUFFER = 4, EXT_ARRAY = 5, EXT_OBJECT = 6 };

/* Containers of at least this many items are left to the general path: from
 * 16 it may write typed arrays (the core's array_min) or packed lists
 * (PG_PACK_MIN), and an escaped tuple of 15 has 16 items. */
#define DIRECT_ITEMS_MAX 14
#define DIRECT_DEPTH_MAX 16  /* well under GSER_DEPTH_MAX (30), objects and markers counted */
#define DIRECT_NODES 512     /* values in a message: what a message past it wastes stays small */
#define DIRECT_HEADER_MAX 4096 /* bytes a header may have to be read here */

static bool direct_on = true;

/* The datetime C API, imported on first use (per translation unit). */
static bool dt_ready(void)
{
    if (!PyDateTimeAPI)
        PyDateTime_IMPORT;
    if (!PyDateTimeAPI)
        PyErr_Clear();
    return PyDateTimeAPI != NULL;
}

/* A naive datetime.datetime (exactly; no tzinfo): tag 6 (docs/wire-format.md 4.9). */
static bool is_naive_datetime(PyObject *o)
{
    return PyDateTimeAPI && Py_TYPE(o) == PyDateTimeAPI->DateTimeType &&
           !((_PyDateTime_BaseTZInfo *)o)->hastzinfo;
}

/* One of the standard types the general path packs when a list holds two
 * or more of it (encode.c's enc_packed): left to it. */
static bool packs(pg_state_t *s, PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type || t == &PyFloat_Type || t == &PyTuple_Type || t == &PyList_Type || t == &PyDict_Type)
        return false; /* never a packed kind: known without the imports */
    if (!s->std.tried && pg_std_ready(s) < 0) /* Decimal and UUID known before the first list of them */
        PyErr_Clear();
    return (PyDateTimeAPI && (t == PyDateTimeAPI->DateTimeType || t == PyDateTimeAPI->DateType ||
                              t == PyDateTimeAPI->TimeType || t == PyDateTimeAPI->DeltaType)) ||
           (s->std.Decimal && (PyObject *)t == s->std.Decimal) || (s->std.UUID && (PyObject *)t == s->std.UUID);
}

/* decimal.Decimal exactly (the module's types imported on first need). */
static bool is_decimal(pg_state_t *s, PyObject *o)
{
    if (!s->std.tried && pg_std_ready(s) < 0)
        PyErr_Clear();
    return s->std.Decimal && (PyObject *)Py_TYPE(o) == s->std.Decimal;
}
static unsigned long long direct_count[2]; /* messages written, read here */

void pg_direct_counts(unsigned long long *dumps, unsigned long long *loads)
{
    *dumps = direct_count[0];
    *loads = direct_count[1];
}

int pg_direct_set(int on)
{
    int was = direct_on;
    direct_on = on != 0;
    return was;
}

/* GSER_TRACE: the general path traces what it writes and reads. */
static bool trace_on(void)
{
    static int t = -1;
    if (t < 0) {
        const char *v = getenv("GSER_TRACE");
        t = v && *v && strcmp(v, "0") != 0;
    }
    return t;
}

/* ---- writing ---------------------------------------------------------------------------- */

/* The sink's append inlined into each token: a set of 10 ints is ~30 tokens,
 * each a call with a length-switch copy otherwise. */
#define GSER_MPSINK_INLINE inline __attribute__((always_inline))
#include "mpsink.h" /* the core encoder's sink and pack template: the same calls give the same bytes */
#undef msgpack_pack_ext

static void pk_uint_ext(obuf_t *pk, uint64_t u)
{
    unsigned char le[8];
    memcpy(le, &u, 8); /* little-endian host, as the core checks */
    pk_ext(pk, 8, EXT_UINT);
    pk_ext_body(pk, le, 8);
}

/* A tagged tuple's start: [ext(2), tag, ...] with nfields after the tag. */
static void pk_tag(obuf_t *pk, pg_tag_t tag, size_t nfields)
{
    pk_array(pk, nfields + 2);
    pk_ext(pk, 0, EXT_TUPLE);
    pk_uint_ext(pk, tag);
}

enum { WR_OK = 0, WR_BAIL = 1, WR_NEED_EXT = 2 };

typedef struct denc {
    pg_state_t *s;
    bool ext;   /* inside a "python.tree": standard types are tagged tuples */
    int nodes;  /* values left */
} denc_t;

static int w_value(denc_t *e, obuf_t *pk, PyObject *o, int depth);

/* An int64 as pk_int64 writes it; a fixint (-32..127, one byte) stored
 * straight, without the sink's call. */
static inline void pk_small(obuf_t *pk, int64_t v)
{
    if (v >= -32 && v <= 127 && pk->len < pk->cap)
        pk->p[pk->len++] = (char)(uint8_t)v;
    else
        pk_int64(pk, v);
}

/* An exact int: 0 int64, 1 uint64, 2 beyond 64 bits. */
static int int_class(PyObject *o, int64_t *i, uint64_t *u)
{
    if (pg_small_int(o, i))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) {
        *i = v; /* an exact int cannot fail here */
        return 0;
    }
    if (overflow > 0 && _PyLong_NumBits(o) <= 64) {
        *u = PyLong_AsUnsignedLongLong(o);
        return 1;
    }
    return 2;
}

/* A scalar that is a gser map key (encode.c's is_map_key and enc_scalar):
 * WR_OK written, WR_BAIL not one (nothing written). */
static int w_key(obuf_t *pk, PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(o, &len);
        if (!s) {
            PyErr_Clear(); /* surrogates: the general path says where */
            return WR_BAIL;
        }
        pk_str(pk, (size_t)len);
        pk_str_body(pk, s, (size_t)len);
    } else if (o == Py_None) {
        pk_nil(pk);
    } else if (o == Py_True) {
        pk_true(pk);
    } else if (o == Py_False) {
        pk_false(pk);
    } else if (t == &PyFloat_Type) {
        pk_double(pk, PyFloat_AS_DOUBLE(o));
    } else if (t == &PyLong_Type) {
        int64_t i = 0;
        uint64_t u = 0;
        int c = int_class(o, &i, &u);
        if (c == 2)
            return WR_BAIL;
        if (c == 0)
            pk_small(pk, i);
        else
            pk_uint_ext(pk, u);
    } else if (t == &PyBytes_Type && PyBytes_GET_SIZE(o) < PG_BYTES_FRAME_MIN) {
        pk_bin(pk, (size_t)PyBytes_GET_SIZE(o));
        pk_bin_body(pk, PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o));
    } else {
        return WR_BAIL;
    }
    return WR_OK;
}

static bool is_key(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type || o == Py_None || t == &PyBool_Type || t == &PyFloat_Type)
        return true;
    if (t == &PyBytes_Type)
        return PyBytes_GET_SIZE(o) < PG_BYTES_FRAME_MIN;
    int64_t i;
    uint64_t u;
    return t == &PyLong_Type && (pg_small_int(o, &i) || int_class(o, &i, &u) < 2);
}

/* A list of ints some of which are beyond 64 bits, packed (tag 18, kind 1). */
static int w_packed_ints(obuf_t *pk, PyObject *const *items, Py_ssize_t n, bool tuple)
{
    int64_t lens[DIRECT_ITEMS_MAX];
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t bits = _PyLong_NumBits(items[i]);
        if (bits == (size_t)-1 || bits / 8 >= 4096) {
            PyErr_Clear();
            return WR_BAIL;
        }
        lens[i] = (int64_t)(bits / 8 + 1);
        total += bits / 8 + 1;
    }
    pk_tag(pk, PG_TAG_PACKED, 4);
    pk_uint_ext(pk, PG_TAG_INT);
    if (tuple)
        pk_true(pk);
    else
        pk_false(pk);
    /* the lengths: an int array (wire-format 4.6), inline */
    pk_array(pk, 5);
    pk_ext(pk, 0, EXT_ARRAY);
    pk_uint8(pk, 0);
    pk_uint8(pk, 2); /* GSER_KIND_INT */
    pk_uint64(pk, (uint64_t)n);
    pk_bin(pk, (size_t)n * 8);
    pk_bin_body(pk, lens, (size_t)n * 8);
    unsigned char *b = PyMem_Malloc(total);
    if (!b) {
        PyErr_Clear();
        return WR_BAIL;
    }
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pg_long_write_le(items[i], b + at, (size_t)lens[i]) < 0) {
            PyErr_Clear();
            PyMem_Free(b);
            return WR_BAIL;
        }
        at += (size_t)lens[i];
    }
    pk_bin(pk, total);
    pk_bin_body(pk, b, total);
    PyMem_Free(b);
    return WR_OK;
}

/* A sequence of n items (encode.c's enc_seq for fewer than 15 items): a
 * list, or a tuple (escaped in a "python.tree" when it starts with a uint);
 * a list of ints of which some are beyond 64 bits is packed there. */
static int w_seq(denc_t *e, obuf_t *pk, PyObject *const *items, Py_ssize_t n, bool tuple, int depth)
{
    if (n > DIRECT_ITEMS_MAX || (n && depth + 1 > DIRECT_DEPTH_MAX))
        return WR_BAIL;
    if (n >= 2) {
        PyTypeObject *t = Py_TYPE(items[0]);
        if (t == &PyLong_Type || t == &PyComplex_Type) {
            bool one = true, big = false;
            for (Py_ssize_t i = 0; i < n && one; i++) {
                one = Py_TYPE(items[i]) == t;
                big = big || (one && t == &PyLong_Type && !is_key(items[i]));
            }
            if (one && t == &PyComplex_Type)
                return WR_BAIL; /* packed complex numbers: the general path */
            if (one && big)
                return e->ext ? w_packed_ints(pk, items, n, tuple) : WR_NEED_EXT;
        } else if (packs(e->s, items[0])) {
            bool one = true;
            for (Py_ssize_t i = 1; i < n && one; i++)
                one = Py_TYPE(items[i]) == t;
            if (one)
                return WR_BAIL; /* a packed list of them: the general path */
        }
    }
    bool escape = false;
    int64_t small;
    if (tuple && n && e->ext && PyLong_Check(items[0]) && !(PyLong_CheckExact(items[0]) && pg_small_int(items[0], &small))) {
        int overflow = 0;
        PyLong_AsLongLongAndOverflow(items[0], &overflow);
        escape = overflow > 0;
    }
    pk_array(pk, (size_t)n + tuple + escape);
    if (tuple)
        pk_ext(pk, 0, EXT_TUPLE);
    if (escape)
        pk_uint_ext(pk, PG_TAG_TUPLE);
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = w_value(e, pk, items[i], depth + 1);
        if (r)
            return r;
    }
    return WR_OK;
}

static int w_dict(denc_t *e, obuf_t *pk, PyObject *o, int depth)
{
    Py_ssize_t n = PyDict_GET_SIZE(o), pos = 0;
    PyObject *key, *value;
    if ((n && depth + 1 > DIRECT_DEPTH_MAX) || 2 * n > e->nodes)
        return WR_BAIL; /* a large dict: the general path, at once */
    bool keys = true;
    while (keys && PyDict_Next(o, &pos, &key, &value))
        keys = is_key(key);
    if (!keys) { /* (PG_TAG_DICT, [keys], [values]) */
        if (!e->ext)
            return WR_NEED_EXT;
        if (n > DIRECT_ITEMS_MAX || depth + 2 > DIRECT_DEPTH_MAX)
            return WR_BAIL;
        PyObject *ks[DIRECT_ITEMS_MAX], *vs[DIRECT_ITEMS_MAX];
        Py_ssize_t i = 0;
        pos = 0;
        while (PyDict_Next(o, &pos, &key, &value)) {
            ks[i] = key;
            vs[i++] = value;
        }
        pk_tag(pk, PG_TAG_DICT, 2);
        int r = w_seq(e, pk, ks, n, false, depth + 1);
        return r ? r : w_seq(e, pk, vs, n, false, depth + 1);
    }
    pk_map(pk, (size_t)n);
    pos = 0;
    while (PyDict_Next(o, &pos, &key, &value)) {
        if (--e->nodes < 0 || w_key(pk, key))
            return WR_BAIL;
        int r = w_value(e, pk, value, depth + 1);
        if (r)
            return r;
    }
    return WR_OK;
}

static int w_value(denc_t *e, obuf_t *pk, PyObject *o, int depth)
{
    if (--e->nodes < 0)
        return WR_BAIL;
    PyTypeObject *t = Py_TYPE(o);
    int64_t small;
    if (t == &PyLong_Type && pg_small_int(o, &small)) { /* the commonest item of sets, keys and lists */
        pk_small(pk, small);
        return WR_OK;
    }
    if (t == &PyUnicode_Type || t == &PyFloat_Type || o == Py_None || t == &PyBool_Type)
        return w_key(pk, o); /* the commonest scalars next */
    if (t == &PyList_Type)
        return w_seq(e, pk, PySequence_Fast_ITEMS(o), PyList_GET_SIZE(o), false, depth);
    if (t == &PyTuple_Type)
        return w_seq(e, pk, PySequence_Fast_ITEMS(o), PyTuple_GET_SIZE(o), true, depth);
    if (t == &PyDict_Type)
        return w_dict(e, pk, o, depth);
    if (t == &PyLong_Type) {
        int64_t i = 0;
        uint64_t u = 0;
        int c = int_class(o, &i, &u);
        if (c == 0) {
            pk_small(pk, i);
            return WR_OK;
        }
        if (c == 1) {
            pk_uint_ext(pk, u);
            return WR_OK;
        }
        if (!e->ext)
            return WR_NEED_EXT;
        if (_PyLong_NumBits(o) / 8 >= 4096) {
            PyErr_Clear();
            return WR_BAIL;
        }
        PyObject *b = pg_long_to_le(o);
        if (!b) {
            PyErr_Clear();
            return WR_BAIL;
        }
        pk_tag(pk, PG_TAG_INT, 1);
        pk_bin(pk, (size_t)PyBytes_GET_SIZE(b));
        pk_bin_body(pk, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
        Py_DECREF(b);
        return WR_OK;
    }
    if (t == &PySet_Type || t == &PyFrozenSet_Type) {
        if (!e->ext)
            return WR_NEED_EXT;
        Py_ssize_t n = PySet_GET_SIZE(o);
        if (n > DIRECT_ITEMS_MAX || depth + 1 > DIRECT_DEPTH_MAX)
            return WR_BAIL;
        /* the items in iteration order, as PySequence_List gives them */
        PyObject *items[DIRECT_ITEMS_MAX], *x;
        Py_ssize_t i = 0;
#if PY_VERSION_HEX < 0x030D0000
        /* the set's table walked as its iterator walks it, without one */
        Py_ssize_t pos = 0;
        Py_hash_t hash;
        while (i < n && _PySet_NextEntry(o, &pos, &x, &hash))
            items[i++] = x; /* borrowed: the set holds it */
#else
        PyObject *it = PyObject_GetIter(o);
        if (!it) {
            PyErr_Clear();
            return WR_BAIL;
        }
        while (i < n && (x = PyIter_Next(it)) != NULL) {
            items[i++] = x;
            Py_DECREF(x); /* the set holds it */
        }
        Py_DECREF(it);
#endif
        if (i != n || PyErr_Occurred()) {
            PyErr_Clear();
            return WR_BAIL;
        }
        pk_tag(pk, t == &PySet_Type ? PG_TAG_SET : PG_TAG_FROZENSET, 1);
        return w_seq(e, pk, items, n, false, depth + 1);
    }
    if (t == &PyComplex_Type) {
        if (!e->ext)
            return WR_NEED_EXT;
        Py_complex c = ((PyComplexObject *)o)->cval;
        pk_tag(pk, PG_TAG_COMPLEX, 2);
        pk_double(pk, c.real);
        pk_double(pk, c.imag);
        return WR_OK;
    }
    if (o == Py_Ellipsis) {
        if (!e->ext)
            return WR_NEED_EXT;
        pk_tag(pk, PG_TAG_ELLIPSIS, 0);
        return WR_OK;
    }
    if (is_naive_datetime(o)) { /* (6, packed fields, None) */
        if (!e->ext)
            return WR_NEED_EXT;
        pk_tag(pk, PG_TAG_DATETIME, 2);
        pk_int64(pk, pg_pack_datetime(PyDateTime_GET_YEAR(o), PyDateTime_GET_MONTH(o), PyDateTime_GET_DAY(o),
                                      PyDateTime_DATE_GET_HOUR(o), PyDateTime_DATE_GET_MINUTE(o),
                                      PyDateTime_DATE_GET_SECOND(o), PyDateTime_DATE_GET_MICROSECOND(o),
                                      PyDateTime_DATE_GET_FOLD(o)));
        pk_nil(pk);
        return WR_OK;
    }
    if (w_key(pk, o) == WR_OK) /* the other scalars */
        return WR_OK;
    if (is_decimal(e->s, o)) { /* (12, its str) */
        if (!e->ext)
            return WR_NEED_EXT;
        PyObject *str = PyObject_Str(o);
        Py_ssize_t len;
        const char *u = str ? PyUnicode_AsUTF8AndSize(str, &len) : NULL;
        if (!u) {
            Py_XDECREF(str);
            PyErr_Clear();
            return WR_BAIL;
        }
        pk_tag(pk, PG_TAG_DECIMAL, 1);
        pk_str(pk, (size_t)len);
        pk_str_body(pk, u, (size_t)len);
        Py_DECREF(str);
        return WR_OK;
    }
    return WR_BAIL;
}

static const char header_start[8] = {(char)0x94, (char)0xd6, 0x01, 'G', 'S', 'E', 'R', 0x02};

int pg_direct_dumps(pg_state_t *s, PyObject *obj, PyObject **header_out)
{
    if (!direct_on || trace_on() || !dt_ready())
        return 0;
    char initial[1024], subinit[1024];
    obuf_t hdr, sub;
    obuf_init(&hdr, initial, sizeof initial);
    obuf_init(&sub, subinit, sizeof subinit);
    obuf_write(&hdr, header_start, sizeof header_start);
    denc_t e = {.s = s, .ext = false, .nodes = DIRECT_NODES};
    int r = w_value(&e, &hdr, obj, 1);
    if (r == WR_NEED_EXT) { /* again, as a "python.tree" object (encode.c's enc_scope) */
        hdr.len = sizeof header_start;
        e = (denc_t){.s = s, .ext = true, .nodes = DIRECT_NODES};
        r = w_value(&e, &sub, obj, 2);
        if (r == WR_OK && !sub.oom) {
            pk_array(&hdr, 7);
            pk_ext(&hdr, 0, EXT_OBJECT);
            pk_str(&hdr, 11);
            pk_str_body(&hdr, "python.tree", 11);
            pk_str(&hdr, 4);
            pk_str_body(&hdr, "host", 4);
            pk_uint32(&hdr, 1);
            pk_uint64(&hdr, 0);
            pk_uint64(&hdr, 0);
            pk_bin(&hdr, sub.len);
            pk_bin_body(&hdr, sub.p, sub.len);
        }
    }
    pk_array(&hdr, 0); /* no data frames */
    PyObject *b = NULL;
    if (r == WR_OK && !hdr.oom && !sub.oom)
        b = PyBytes_FromStringAndSize(hdr.p, (Py_ssize_t)hdr.len);
    obuf_free(&hdr);
    obuf_free(&sub);
    if (r != WR_OK || hdr.oom || sub.oom)
        return 0;
    if (!b)
        return -1;
    *header_out = b;
    direct_count[0]++;
    return 1;
}

/* ---- reading ---------------------------------------------------------------------------- */

/* An empty ext where a marker starts, the magic, or a uint just read are
 * told apart from values by these addresses (never objects, never freed). */
static char sentinel[5];
#define S_TUPLE ((PyObject *)&sentinel[0])
#define S_OBJECT ((PyObject *)&sentinel[1])
#define S_MAGIC ((PyObject *)&sentinel[2])
#define S_ARRAY ((PyObject *)&sentinel[3])
/* A container whose first item has not come yet: made then, as a list or,
 * after a tuple marker, straight as a tuple. */
#define S_PENDING ((PyObject *)&sentinel[4])
#define IS_SENTINEL(o) ((char *)(o) >= sentinel && (char *)(o) < sentinel + sizeof sentinel)

/* What an open container is, set at its first item. */
enum { C_LIST, C_TUPLE, C_TAG, C_OBJECT, C_ARRAY, C_HEADER, C_SET, C_DICTV };

/* names[] of a C_TAG: its last field was built as the object (a set's
 * items as the set, a dict's values into the dict). */
#define BUILT_IN_PLACE 0x80

/* Where the value just read came from, when a tag's field must be of one
 * wire kind: a uint, or an int array marker. */
enum { O_OTHER, O_UINT, O_INTARR };

typedef struct dunit {
    pg_state_t *s;
    int base;          /* value depth of the unit's root container minus its level */
    bool ext;          /* a "python.tree" sub-header */
    bool header;       /* the header unit: [magic, version, root, frames] */
    uint8_t last;      /* the value just read: O_* */
    bool made_intarr;  /* the container just finished was an int array */
    PyObject *root;    /* the header's root, once read */
    const char *sub;   /* an object marker's sub-header, not copied */
    size_t sub_len;
    size_t open;       /* open containers */
    size_t bytes_left; /* bytes a container's items may still take */
    uint8_t kind[MSGPACK_EMBED_STACK_SIZE];
    uint8_t names[MSGPACK_EMBED_STACK_SIZE];
    uint8_t tag[MSGPACK_EMBED_STACK_SIZE];    /* a tagged tuple's tag */  /* an object's type and family were "python.tree", "host" */
    unsigned int n[MSGPACK_EMBED_STACK_SIZE]; /* items the open containers declared */
    uint8_t uints[MSGPACK_EMBED_STACK_SIZE];  /* bit i: item i was a uint (i < 8) */
    uint8_t intarr[MSGPACK_EMBED_STACK_SIZE]; /* bit i: item i was an int array marker */
} dunit_t;

enum { R_FAIL = -10 };

static PyObject *read_unit(pg_state_t *s, const char *p, size_t len, int base, bool ext, bool header);

#define msgpack_unpack_struct(name) struct pg_direct##name
#define msgpack_unpack_func(ret, name) static ret pg_direct##name
#define msgpack_unpack_callback(name) rcb##name
#define msgpack_unpack_object PyObject *
#define msgpack_unpack_user dunit_t

static inline PyObject *rcb_root(dunit_t *u);
static inline int rcb_uint8(dunit_t *u, uint8_t d, PyObject **o);
static inline int rcb_uint16(dunit_t *u, uint16_t d, PyObject **o);
static inline int rcb_uint32(dunit_t *u, uint32_t d, PyObject **o);
static inline int rcb_uint64(dunit_t *u, uint64_t d, PyObject **o);
static inline int rcb_int8(dunit_t *u, int8_t d, PyObject **o);
static inline int rcb_int16(dunit_t *u, int16_t d, PyObject **o);
static inline int rcb_int32(dunit_t *u, int32_t d, PyObject **o);
static inline int rcb_int64(dunit_t *u, int64_t d, PyObject **o);
static inline int rcb_float(dunit_t *u, float d, PyObject **o);
static inline int rcb_double(dunit_t *u, double d, PyObject **o);
static inline int rcb_nil(dunit_t *u, PyObject **o);
static inline int rcb_true(dunit_t *u, PyObject **o);
static inline int rcb_false(dunit_t *u, PyObject **o);
static inline int rcb_array(dunit_t *u, unsigned int n, PyObject **o);
static inline int rcb_array_item(dunit_t *u, PyObject **c, PyObject *o);
static inline int rcb_map(dunit_t *u, unsigned int n, PyObject **o);
static inline int rcb_map_item(dunit_t *u, PyObject **c, PyObject *k, PyObject *v);
static inline int rcb_str(dunit_t *u, const char *b, const char *p, unsigned int l, PyObject **o);
static inline int rcb_bin(dunit_t *u, const char *b, const char *p, unsigned int l, PyObject **o);
static inline int rcb_ext(dunit_t *u, const char *b, const char *p, unsigned int l, PyObject **o);

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include <msgpack/unpack_template.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

typedef struct pg_direct_context rctx_t;
typedef struct pg_direct_stack rstack_t;
_Static_assert(offsetof(rctx_t, user) == 0, "the unit is the template context's first member");
_Static_assert(offsetof(rstack_t, obj) == 0, "a container is its stack entry's first member");

static inline rstack_t *stack_of(dunit_t *u)
{
    return ((rctx_t *)(void *)u)->stack;
}

/* A dict for n items, sized once (PyDict_New grows twice by 10 items). */
static inline PyObject *dict_for(unsigned int n)
{
#if PY_VERSION_HEX < 0x030D0000
    return n > 5 ? _PyDict_NewPresized((Py_ssize_t)n) : PyDict_New();
#else
    (void)n;
    return PyDict_New();
#endif
}

/* Every failure gives up: the general decoder reads the header again. */
static int give_up(void)
{
    if (PyErr_Occurred())
        PyErr_Clear();
    return R_FAIL;
}

static inline int put(dunit_t *u, PyObject *x, bool uint, PyObject **o)
{
    if (!x)
        return give_up();
    u->last = uint ? O_UINT : O_OTHER;
    *o = x;
    return 0;
}

static inline PyObject *rcb_root(dunit_t *u)
{
    (void)u;
    return NULL;
}

static inline int rcb_uint64(dunit_t *u, uint64_t d, PyObject **o)
{
    return put(u, PyLong_FromUnsignedLongLong(d), d > (uint64_t)INT64_MAX, o);
}

static inline int rcb_int64(dunit_t *u, int64_t d, PyObject **o)
{
    return put(u, PyLong_FromLongLong(d), false, o);
}

#define DIRECT_NARROW(name, T)                                                                                       \
    static inline int rcb_##name(dunit_t *u, T d, PyObject **o)                                                      \
    {                                                                                                                \
        return rcb_int64(u, d, o);                                                                                   \
    }
DIRECT_NARROW(uint8, uint8_t)
DIRECT_NARROW(uint16, uint16_t)
DIRECT_NARROW(uint32, uint32_t)
DIRECT_NARROW(int8, int8_t)
DIRECT_NARROW(int16, int16_t)
DIRECT_NARROW(int32, int32_t)

static inline int rcb_double(dunit_t *u, double d, PyObject **o)
{
    return put(u, PyFloat_FromDouble(d), false, o);
}

static inline int rcb_float(dunit_t *u, float d, PyObject **o)
{
    return rcb_double(u, d, o);
}

static inline int rcb_nil(dunit_t *u, PyObject **o)
{
    return put(u, Py_NewRef(Py_None), false, o);
}

static inline int rcb_true(dunit_t *u, PyObject **o)
{
    return put(u, Py_NewRef(Py_True), false, o);
}

static inline int rcb_false(dunit_t *u, PyObject **o)
{
    return put(u, Py_NewRef(Py_False), false, o);
}

static inline int rcb_str(dunit_t *u, const char *b, const char *p, unsigned int l, PyObject **o)
{
    (void)b;
    if (u->open && u->kind[u->open - 1] == C_OBJECT) {
        /* an object's type and family: compared, not made */
        size_t level = u->open - 1, i = u->n[level] - stack_of(u)[level].count;
        if ((i == 1 && l == 11 && memcmp(p, "python.tree", 11) == 0) || (i == 2 && l == 4 && memcmp(p, "host", 4) == 0)) {
            u->names[level] |= (uint8_t)i;
            return put(u, Py_NewRef(Py_None), false, o);
        }
        return R_FAIL; /* another type or family: the general path's */
    }
    return put(u, PyUnicode_DecodeUTF8(p, (Py_ssize_t)l, NULL), false, o);
}

static inline int rcb_bin(dunit_t *u, const char *b, const char *p, unsigned int l, PyObject **o)
{
    (void)b;
    if (u->open && u->kind[u->open - 1] == C_OBJECT && stack_of(u)[u->open - 1].count == 1) {
        /* an object's sub-header (its last field): read in place, not copied */
        u->sub = p;
        u->sub_len = l;
        return put(u, Py_NewRef(Py_None), false, o);
    }
    return put(u, PyBytes_FromStringAndSize(p, (Py_ssize_t)l), false, o);
}

/* l counts the type byte. A uint is the only ext that is a value; an empty
 * tuple or object ext starts a marker (checked by its array); the magic
 * only starts the header. */
static inline int rcb_ext(dunit_t *u, const char *b, const char *p, unsigned int l, PyObject **o)
{
    (void)b;
    int8_t type = (int8_t)*p;
    if (l == 1 && (type == EXT_TUPLE || type == EXT_OBJECT || type == EXT_ARRAY)) {
        *o = type == EXT_TUPLE ? S_TUPLE : type == EXT_OBJECT ? S_OBJECT : S_ARRAY;
        return 0;
    }
    if (l == 5 && type == EXT_MAGIC && memcmp(p + 1, "GSER", 4) == 0) {
        *o = S_MAGIC;
        return 0;
    }
    if (l != 9 || type != EXT_UINT)
        return R_FAIL;
    uint64_t v;
    memcpy(&v, p + 1, 8); /* little-endian host */
    return put(u, PyLong_FromUnsignedLongLong(v), true, o);
}

/* A new container: its items must fit in the bytes left, it must not be a
 * map key, and it must be within the depth bound. */
static inline int container_ok(dunit_t *u, unsigned int n)
{
    if (n > u->bytes_left)
        return R_FAIL;
    u->bytes_left -= n;
    if (u->open && stack_of(u)[u->open - 1].ct == MSGPACK_CT_MAP_KEY)
        return R_FAIL;
    if (u->base + (int)u->open > DIRECT_DEPTH_MAX)
        return R_FAIL;
    return 0;
}

static inline int rcb_array(dunit_t *u, unsigned int n, PyObject **o)
{
    if (container_ok(u, n))
        return R_FAIL;
    u->last = O_OTHER;
    if (n == 0) {
        PyObject *l = PyList_New(0);
        return l ? (*o = l, 0) : give_up();
    }
    *o = S_PENDING;
    u->kind[u->open] = C_LIST; /* its level once open; its first item may change it */
    u->n[u->open] = n;
    u->open++;
    return 0;
}

static inline int rcb_map(dunit_t *u, unsigned int n, PyObject **o)
{
    if (container_ok(u, n) || n > u->bytes_left)
        return R_FAIL;
    u->bytes_left -= n; /* a pair takes two bytes at least */
    PyObject *d = dict_for(n);
    if (!d)
        return give_up();
    *o = d;
    u->kind[u->open] = C_LIST;
    u->n[u->open] = n;
    u->last = O_OTHER;
    u->open += n != 0;
    return 0;
}

static PyObject *finish(dunit_t *u, int kind, PyObject *c, size_t level);

static inline int rcb_array_item(dunit_t *u, PyObject **c, PyObject *o)
{
    rstack_t *s = (rstack_t *)(void *)c;
    size_t level = (size_t)(s - stack_of(u));
    uint8_t origin = u->last;
    u->last = O_OTHER;
    size_t n = u->n[level];
    size_t i = n - s->count; /* this item's index in the msgpack array */
    if (i == 0) {
        u->uints[level] = u->intarr[level] = u->names[level] = 0;
        if (o == S_MAGIC || o == S_OBJECT) {
            /* the header's and an object's fields are checked as they come:
             * no container is made for them */
            if (o == S_MAGIC ? !u->header || level != 0 || n != 4 : n != 7)
                return R_FAIL;
            u->kind[level] = o == S_MAGIC ? C_HEADER : C_OBJECT;
            u->sub = NULL;
        } else if (level && !IS_SENTINEL(o) && u->kind[level - 1] == C_TAG && u->n[level - 1] == 3 &&
                   (u->tag[level - 1] == PG_TAG_SET || u->tag[level - 1] == PG_TAG_FROZENSET) &&
                   stack_of(u)[level - 1].count == 1) {
            /* a set's items (its tag's last field): the set itself, not a
             * list to build it from (PySet_New of the list adds them in
             * the same order); a frozenset is filled before anything sees it */
            PyObject *x = u->tag[level - 1] == PG_TAG_SET ? PySet_New(NULL) : PyFrozenSet_New(NULL);
            int r = x ? PySet_Add(x, o) : -1;
            Py_DECREF(o);
            if (r < 0) {
                Py_XDECREF(x);
                return give_up();
            }
            *c = x;
            u->kind[level] = C_SET;
            u->names[level - 1] |= BUILT_IN_PLACE;
        } else if (level && !IS_SENTINEL(o) && u->kind[level - 1] == C_TAG && u->n[level - 1] == 4 &&
                   u->tag[level - 1] == PG_TAG_DICT && stack_of(u)[level - 1].count == 1 &&
                   PyList_CheckExact(PyTuple_GET_ITEM(stack_of(u)[level - 1].obj, 1)) &&
                   PyList_GET_SIZE(PyTuple_GET_ITEM(stack_of(u)[level - 1].obj, 1)) == (Py_ssize_t)n) {
            /* a dict's values (its tag's last field, its keys read): the
             * dict itself, each value set as it comes */
            PyObject *x = dict_for(n);
            int r = x ? PyDict_SetItem(x, PyList_GET_ITEM(PyTuple_GET_ITEM(stack_of(u)[level - 1].obj, 1), 0), o) : -1;
            Py_DECREF(o);
            if (r < 0) {
                Py_XDECREF(x);
                return give_up();
            }
            *c = x;
            u->kind[level] = C_DICTV;
            u->names[level - 1] |= BUILT_IN_PLACE;
        } else {
            PyObject *x = o == S_TUPLE ? PyTuple_New((Py_ssize_t)n - 1) : PyList_New((Py_ssize_t)n);
            if (!x) {
                if (!IS_SENTINEL(o))
                    Py_DECREF(o);
                return give_up();
            }
            *c = x;
            if (o == S_TUPLE)
                u->kind[level] = C_TUPLE;
            else if (o == S_ARRAY)
                u->kind[level] = C_ARRAY;
            else if (IS_SENTINEL(o))
                return R_FAIL;
            else
                PyList_SET_ITEM(x, 0, o);
        }
    } else if (((1u << u->kind[level]) & (1u << C_LIST | 1u << C_SET | 1u << C_DICTV)) ||
               (u->kind[level] == C_TUPLE && (i >= 2 || origin != O_UINT))) {
        /* An item of a list, a set, a dict's values or a plain tuple past
         * its first: no field to check, no bits to keep (only tags', arrays'
         * and objects' fields are checked by them). Tested one by one, not
         * through the switch's jump table: its indirect jump, mispredicted as
         * the kinds alternate (a tuple key, then a value), was a tenth of a
         * tuple-key dict's read. */
        uint8_t kind = u->kind[level];
        if (IS_SENTINEL(o))
            return R_FAIL;
        if (kind == C_TUPLE) {
            PyTuple_SET_ITEM(*c, (Py_ssize_t)i - 1, o);
        } else if (kind == C_LIST) {
            PyList_SET_ITEM(*c, (Py_ssize_t)i, o);
        } else {
            /* a dict's keys: its tag's field 2, checked to have n items */
            int r = kind == C_SET ? PySet_Add(*c, o)
                                  : PyDict_SetItem(*c, PyList_GET_ITEM(PyTuple_GET_ITEM(stack_of(u)[level - 1].obj, 1), i), o);
            Py_DECREF(o);
            if (r < 0)
                return give_up();
        }
    } else {
        if (IS_SENTINEL(o))
            return R_FAIL;
        if (i < 8) {
            u->uints[level] |= (uint8_t)((origin == O_UINT) << i);
            u->intarr[level] |= (uint8_t)((origin == O_INTARR) << i);
        }
        PyObject *x = *c;
        bool ok = true;
        switch (u->kind[level]) {
        case C_HEADER: /* [magic, 2, root, []] */
            if (i == 2) {
                u->root = o;
                break;
            }
            ok = i == 1 ? origin != O_UINT && PyLong_CheckExact(o) && PyLong_AsLong(o) == 2
                        : PyList_CheckExact(o) && PyList_GET_SIZE(o) == 0;
            Py_DECREF(o);
            break;
        case C_OBJECT: /* "python.tree", "host", 1, 0, 0, sub-header (rcb_str, rcb_bin) */
            if (i <= 2)
                ok = o == Py_None && (u->names[level] & i);
            else if (i <= 5)
                ok = origin != O_UINT && PyLong_CheckExact(o) && PyLong_AsLong(o) == (i == 3);
            else
                ok = o == Py_None && u->sub;
            Py_DECREF(o);
            break;
        case C_TUPLE:
        case C_TAG:
            PyTuple_SET_ITEM(x, (Py_ssize_t)i - 1, o);
            if (i == 1 && origin == O_UINT && u->ext) {
                /* A tag this path does not build gives up here, before the
                 * rest of the message is read twice. */
                static const uint32_t built = 1u << PG_TAG_TUPLE | 1u << PG_TAG_INT | 1u << PG_TAG_COMPLEX |
                                              1u << PG_TAG_SET | 1u << PG_TAG_FROZENSET | 1u << PG_TAG_DICT |
                                              1u << PG_TAG_DATETIME | 1u << PG_TAG_DECIMAL | 1u << PG_TAG_ELLIPSIS |
                                              1u << PG_TAG_PACKED;
                unsigned long long tag = PyLong_AsUnsignedLongLong(o);
                ok = tag < 32 && (built >> tag & 1);
                u->kind[level] = C_TAG;
                u->tag[level] = (uint8_t)tag;
            } else if (i == 2 && u->kind[level] == C_TAG && u->tag[level] == PG_TAG_PACKED) {
                ok = origin == O_UINT && PyLong_AsLongLong(o) == PG_TAG_INT; /* packed ints only */
            }
            break;
        case C_ARRAY: PyList_SET_ITEM(x, (Py_ssize_t)i - 1, o); break;
        default: PyList_SET_ITEM(x, (Py_ssize_t)i, o); break;
        }
        if (!ok)
            return give_up();
    }
    if (s->count != 1)
        return 0;
    /* the last item: the container is complete */
    u->open--;
    int kind = u->kind[level];
    if (kind == C_LIST || kind == C_TUPLE || kind == C_HEADER || kind == C_SET || kind == C_DICTV)
        return 0;
    PyObject *x = *c, *y = finish(u, kind, x, level);
    if (!y)
        return give_up();
    if (!IS_SENTINEL(x))
        Py_DECREF(x);
    *c = y;
    /* what the parent sees next (the template hands it y at once) */
    u->last = u->made_intarr ? O_INTARR : O_OTHER;
    u->made_intarr = false;
    return 0;
}

static inline int rcb_map_item(dunit_t *u, PyObject **c, PyObject *k, PyObject *v)
{
    rstack_t *s = (rstack_t *)(void *)c;
    u->last = O_OTHER;
    int r = 0;
    if (IS_SENTINEL(k) || IS_SENTINEL(v))
        r = R_FAIL;
    else if (PyDict_SetItem(*c, k, v) < 0)
        r = give_up();
    if (!IS_SENTINEL(k))
        Py_DECREF(k);
    if (!IS_SENTINEL(v))
        Py_DECREF(v);
    s->map_key = NULL; /* taken */
    if (r == 0 && s->count == 1)
        u->open--;
    return r;
}

/* An array marker [ext(5), container, kind, count, data] with its data
 * inline, of kind bool, int, uint or float (wire-format 4.6); a narrow int
 * array or a frame reference is the general path's. */
static PyObject *finish_array(dunit_t *u, PyObject *l, size_t level)
{
    if (PyList_GET_SIZE(l) != 5)
        return NULL;
    PyObject *ct = PyList_GET_ITEM(l, 0), *kd = PyList_GET_ITEM(l, 1), *cn = PyList_GET_ITEM(l, 2),
             *data = PyList_GET_ITEM(l, 3);
    if (!PyLong_CheckExact(ct) || !PyLong_CheckExact(kd) || !PyLong_CheckExact(cn) || !PyBytes_CheckExact(data) ||
        (u->uints[level] & 0x0e)) /* the fields are positive ints, not uints */
        return NULL;
    long container = PyLong_AsLong(ct), kind = PyLong_AsLong(kd);
    Py_ssize_t count = PyLong_AsSsize_t(cn);
    if ((container != 0 && container != 1) || kind < 1 || kind > 4 || count < 1 || count > DIRECT_HEADER_MAX)
        return NULL;
    size_t es = kind == 1 ? 1 : 8;
    if ((size_t)PyBytes_GET_SIZE(data) != (size_t)count * es)
        return NULL;
    if (kind == 2 && level && u->kind[level - 1] == C_TAG && u->tag[level - 1] == PG_TAG_PACKED &&
        u->n[level - 1] - stack_of(u)[level - 1].count == 4) {
        /* a packed list's lengths (its tag's field 4): their bytes, read
         * there as int64s, not a list of ints made to be read back */
        u->made_intarr = true;
        return Py_NewRef(data);
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    PyObject *seq = container ? PyTuple_New(count) : PyList_New(count);
    for (Py_ssize_t i = 0; seq && i < count; i++) {
        PyObject *x;
        uint64_t bits = 0;
        if (kind != 1)
            memcpy(&bits, p + 8 * i, 8); /* little-endian host */
        double f;
        switch (kind) {
        case 1: x = p[i] > 1 ? NULL : Py_NewRef(p[i] ? Py_True : Py_False); break;
        case 2: x = PyLong_FromLongLong((long long)(int64_t)bits); break;
        case 3: x = PyLong_FromUnsignedLongLong((unsigned long long)bits); break;
        default: memcpy(&f, &bits, 8); x = PyFloat_FromDouble(f); break;
        }
        if (!x) {
            Py_CLEAR(seq);
            break;
        }
        if (container)
            PyTuple_SET_ITEM(seq, i, x);
        else
            PyList_SET_ITEM(seq, i, x);
    }
    u->made_intarr = seq && kind == 2;
    return seq;
}

/* A packed list of ints, some beyond 64 bits (tag 18, kind 1):
 * (18, kind uint 1, tuple bool, lengths: an int array, bytes). */
static PyObject *finish_packed_ints(dunit_t *u, PyObject *t, size_t level)
{
    if (PyTuple_GET_SIZE(t) != 5 || !(u->uints[level] & 0x04) || !(u->intarr[level] & 0x10))
        return NULL;
    PyObject *kd = PyTuple_GET_ITEM(t, 1), *tp = PyTuple_GET_ITEM(t, 2), *lens = PyTuple_GET_ITEM(t, 3),
             *bytes = PyTuple_GET_ITEM(t, 4);
    /* the lengths: an int array's bytes (finish_array), int64s */
    if (!PyLong_CheckExact(kd) || PyLong_AsLong(kd) != PG_TAG_INT || (tp != Py_True && tp != Py_False) ||
        !PyBytes_CheckExact(bytes) || !PyBytes_CheckExact(lens))
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(lens) / 8;
    const unsigned char *ls = (const unsigned char *)PyBytes_AS_STRING(lens);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(bytes);
    size_t nbytes = (size_t)PyBytes_GET_SIZE(bytes), at = 0;
    PyObject *seq = tp == Py_True ? PyTuple_New(n) : PyList_New(n);
    for (Py_ssize_t i = 0; seq && i < n; i++) {
        int64_t a;
        memcpy(&a, ls + 8 * i, 8); /* little-endian host */
        PyObject *x = a > 0 && (unsigned long long)a <= nbytes - at ? pg_long_from_le(p + at, (size_t)a, true) : NULL;
        if (!x) {
            Py_CLEAR(seq);
            break;
        }
        at += (size_t)a;
        if (tp == Py_True)
            PyTuple_SET_ITEM(seq, i, x);
        else
            PyList_SET_ITEM(seq, i, x);
    }
    if (seq && at != nbytes)
        Py_CLEAR(seq);
    return seq;
}

/* A tagged tuple (tag, fields...) of a "python.tree" as its object, for the
 * tags this path builds; NULL (no exception needed) for anything else. */
static PyObject *finish_tag(dunit_t *u, PyObject *t, size_t level)
{
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    int overflow = 0;
    long long tag = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(t, 0), &overflow);
    PyObject *a = n > 1 ? PyTuple_GET_ITEM(t, 1) : NULL, *b = n > 2 ? PyTuple_GET_ITEM(t, 2) : NULL;
    if (overflow)
        return NULL;
    switch (tag) {
    case PG_TAG_TUPLE: return PyTuple_GetSlice(t, 1, n);
    case PG_TAG_INT:
        if (n != 2 || !PyBytes_CheckExact(a) || PyBytes_GET_SIZE(a) == 0)
            return NULL;
        return pg_long_from_le((const unsigned char *)PyBytes_AS_STRING(a), (size_t)PyBytes_GET_SIZE(a), true);
    case PG_TAG_COMPLEX:
        if (n != 3 || !PyFloat_CheckExact(a) || !PyFloat_CheckExact(b))
            return NULL;
        return PyComplex_FromDoubles(PyFloat_AS_DOUBLE(a), PyFloat_AS_DOUBLE(b));
    case PG_TAG_SET:
    case PG_TAG_FROZENSET:
        if (n != 2)
            return NULL;
        if (u->names[level] & BUILT_IN_PLACE) /* made as its items came (rcb_array_item) */
            return Py_IS_TYPE(a, tag == PG_TAG_SET ? &PySet_Type : &PyFrozenSet_Type) ? Py_NewRef(a) : NULL;
        if (!PyList_CheckExact(a) || PyList_GET_SIZE(a))
            return NULL; /* an empty one comes as an empty list */
        return tag == PG_TAG_SET ? PySet_New(NULL) : PyFrozenSet_New(NULL);
    case PG_TAG_DICT: {
        if (n == 3 && (u->names[level] & BUILT_IN_PLACE)) /* its values set as they came (rcb_array_item) */
            return PyDict_CheckExact(b) && PyDict_GET_SIZE(b) <= PyList_GET_SIZE(a) ? Py_NewRef(b) : NULL;
        if (n != 3 || !PyList_CheckExact(a) || !PyList_CheckExact(b) || PyList_GET_SIZE(a) != PyList_GET_SIZE(b))
            return NULL;
        PyObject *d = PyDict_New();
        for (Py_ssize_t i = 0; d && i < PyList_GET_SIZE(a); i++)
            if (PyDict_SetItem(d, PyList_GET_ITEM(a, i), PyList_GET_ITEM(b, i)) < 0)
                Py_CLEAR(d);
        return d;
    }
    case PG_TAG_ELLIPSIS: return n == 1 ? Py_NewRef(Py_Ellipsis) : NULL;
    case PG_TAG_DATETIME: { /* a naive one: (6, int64 fields, None); the fields an int, not a uint */
        if (n != 3 || !PyLong_CheckExact(a) || (u->uints[level] & 0x04) || b != Py_None)
            return NULL;
        int y, mo, dd, h, mi, sec, us, fold;
        pg_unpack_datetime((int64_t)PyLong_AsLongLong(a), &y, &mo, &dd, &h, &mi, &sec, &us, &fold);
        return PyDateTimeAPI->DateTime_FromDateAndTimeAndFold(y, mo, dd, h, mi, sec, us, Py_None, fold,
                                                             PyDateTimeAPI->DateTimeType);
    }
    case PG_TAG_PACKED: return finish_packed_ints(u, t, level);
    case PG_TAG_DECIMAL: /* (12, str): Decimal(str), which refuses what is not one */
        if (n != 2 || !PyUnicode_CheckExact(a) || (!u->s->std.tried && pg_std_ready(u->s) < 0) || !u->s->std.Decimal)
            return NULL;
        return PyObject_CallOneArg(u->s->std.Decimal, a);
    default: return NULL;
    }
}

/* Whether a sub-tree starts with a tagged tuple of a tag not built here,
 * as its root or as its first item (the general path's packed lists, a list
 * of Fractions): then it is left at once, not read up to there first. A
 * look at the bytes the writers put there — a fixarray, ext(2), the tag as
 * d7 03 and 8 bytes little-endian — that only ever declines. */
static bool unbuilt_tag(const unsigned char *q, size_t len)
{
    for (int at = 0; at < 2; at++, q++, len--) {
        if (len < 14 || (q[0] & 0xf0) != 0x90)
            return false;
        if (memcmp(q + 1, "\xc7\x00\x02\xd7\x03", 5) == 0) {
            uint64_t tag;
            memcpy(&tag, q + 6, 8); /* little-endian host */
            return tag > PG_TAG_COMPLEX && tag != PG_TAG_SET && tag != PG_TAG_FROZENSET && tag != PG_TAG_DICT &&
                   tag != PG_TAG_DATETIME && tag != PG_TAG_DECIMAL && tag != PG_TAG_ELLIPSIS &&
                   !(tag == PG_TAG_PACKED && len >= 17 && memcmp(q + 14, "\xd7\x03\x01", 3) == 0);
        }
    }
    return false;
}

/* A typed object: only a "python.tree" of the "host" family, version 1,
 * with no frames, is read here (its sub-header a unit of its own). */
static PyObject *finish_object(dunit_t *u, size_t level)
{
    /* The object's value depth is its array's; its sub-tree starts one deeper. */
    int depth = u->base + (int)level;
    const char *sub = u->sub;
    u->sub = NULL;
    if (unbuilt_tag((const unsigned char *)sub, u->sub_len))
        return NULL;
    return read_unit(u->s, sub, u->sub_len, depth + 1, true, false);
}

static PyObject *finish(dunit_t *u, int kind, PyObject *c, size_t level)
{
    PyObject *y = kind == C_TAG      ? finish_tag(u, c, level)
                  : kind == C_ARRAY ? finish_array(u, c, level)
                                    : finish_object(u, level);
    if (!y && PyErr_Occurred())
        PyErr_Clear();
    return y;
}

/* One msgpack unit into its object, or NULL (no exception) if not read here.
 * base: the value depth of the unit's root. */
static PyObject *read_unit(pg_state_t *s, const char *p, size_t len, int base, bool ext, bool header)
{
    rctx_t ctx;
    pg_direct_init(&ctx);
    /* the per-level arrays are set as containers open */
    dunit_t *u = &ctx.user;
    u->s = s;
    u->base = header ? 0 : base;
    u->ext = ext;
    u->header = header;
    u->last = O_OTHER;
    u->made_intarr = false;
    u->root = NULL;
    u->sub = NULL;
    u->sub_len = 0;
    u->open = 0;
    u->bytes_left = len;
    size_t off = 0;
    int ret = pg_direct_execute(&ctx, p, len, &off);
    PyObject *o = ret > 0 ? pg_direct_data(&ctx) : NULL;
    if (ret > 0 && off == len && (header ? u->root != NULL : !IS_SENTINEL(o)))
        return header ? u->root : o;
    /* the open containers own what was read so far */
    for (unsigned int i = 0; ret <= 0 && i < ctx.top; i++) {
        rstack_t *st = &ctx.stack[i];
        if (st->obj && !IS_SENTINEL(st->obj))
            Py_DECREF(st->obj);
        if (st->ct == MSGPACK_CT_MAP_VALUE && st->map_key && !IS_SENTINEL(st->map_key))
            Py_DECREF(st->map_key);
    }
    if (o && !IS_SENTINEL(o)) /* complete, but bytes after it */
        Py_DECREF(o);
    Py_XDECREF(u->root);
    if (PyErr_Occurred())
        PyErr_Clear();
    return NULL;
}

static int direct_loads(pg_state_t *s, const char *p, Py_ssize_t len, PyObject **out)
{
    if (len < (Py_ssize_t)sizeof header_start || len > DIRECT_HEADER_MAX || memcmp(p, header_start, 7) != 0 ||
        p[7] != 0x02)
        return 0;
    /* Only with limits no stricter than the defaults: the bounds above keep
     * every count and cost of a message read here under them. */
    static int limits_ok = -1; /* the context's limits are fixed once it is made */
    if (limits_ok < 0) {
        gser_limits_t lim = GSER_LIMITS_INIT;
        limits_ok = gser_context_get_limits(pg_ctx, &lim) == GSER_OK && lim.max_depth >= GSER_DEPTH_MAX &&
                    lim.max_nodes >= 65536 && lim.max_bytes >= DIRECT_HEADER_MAX && lim.max_expansion >= 64;
    }
    if (!limits_ok)
        return 0;
    /* A "python.tree" root, as both writers put it, whose sub-tree starts
     * with a tag not built here: the general decoder's, at once. */
    static const char tree_start[] = "\x94\xd6\x01GSER\x02\x97\xc7\x00\x06\xabpython.tree\xa4host\x01\x00\x00";
    const size_t ts = sizeof tree_start - 1;
    /* [magic, 2, root, []] with the frames' empty array last (as both
     * writers put it): the root is read on its own, the header's other
     * fields being these fixed bytes; a "python.tree" root's fields too,
     * its sub-header read straight (one pass, not two). A root that does
     * not end just before that last byte is not read whole: declined. */
    bool bare = p[len - 1] == (char)0x90;
    if ((size_t)len > ts + 3 && memcmp(p, tree_start, ts) == 0) {
        const unsigned char *q = (const unsigned char *)p + ts;
        size_t sl = q[0] == 0xc4 ? q[1] : q[0] == 0xc5 ? (size_t)q[1] << 8 | q[2] : 0;
        size_t at = q[0] == 0xc4 ? 2 : 3;
        if (sl && ts + at + sl <= (size_t)len && unbuilt_tag(q + at, sl))
            return 0;
        if (sl && bare && ts + at + sl + 1 == (size_t)len) {
            /* the object's value depth is 1 (the header's root), its sub-tree's 2 */
            PyObject *obj = read_unit(s, (const char *)q + at, sl, 2, true, false);
            if (!obj)
                return 0;
            *out = obj;
            direct_count[1]++;
            return 1;
        }
    }
    PyObject *obj = bare ? read_unit(s, p + sizeof header_start, (size_t)len - sizeof header_start - 1, 1, false, false)
                         : read_unit(s, p, (size_t)len, 0, false, true);
    if (!obj)
        return 0;
    *out = obj;
    direct_count[1]++;
    return 1;
}

int pg_direct_loads(pg_state_t *s, PyObject *header, PyObject **out)
{
    if (!direct_on || trace_on() || !dt_ready())
        return 0;
    if (PyBytes_CheckExact(header))
        return direct_loads(s, PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header), out);
    /* a comm's frame: a bytearray or a memoryview (read, not kept) */
    if (!PyByteArray_CheckExact(header) && !PyMemoryView_Check(header))
        return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(header, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    int r = direct_loads(s, view.buf, view.len, out);
    PyBuffer_Release(&view);
    return r;
}
