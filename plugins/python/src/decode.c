/* A gser value tree -> Python objects.
 *
 * Scalars, str and bytes are copied into Python objects; lists and tuples
 * backed by a typed array are rebuilt in one loop over the array (an item
 * equal, bit for bit, to the one before it is shared, as ints and floats are
 * immutable). Host buffers become numpy arrays (memoryviews for untyped
 * bytes, and when numpy is not installed) that view the received memory:
 * numpy.ndarray(shape, dtype, buffer=<the frame's exporter>, offset, strides),
 * one exporter per frame, which keeps the message and its input alive.
 * Device buffers become gser.DeviceArray objects; "arrow.array" objects are
 * taken out of the message into gser.ArrowArray objects; the module's own
 * typed objects (pytypes.c) become what they were sent as. Inside a
 * "python.tree" (d->ext), tuples that start with a uint are Python's
 * standard types (dec_std) and packed lists (dec_packed), each rebuilt
 * with its own constructor, never with code the data names.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <datetime.h>
#include <stdlib.h>
#include <string.h>

#include <gser/arrow.h>

/* Per-item hot functions start on a cache line: without it their speed
 * moved by up to 10 % (std_mixed_1000: the same instructions, callgrind)
 * with the size of unrelated code linked before them (BENCHMARKS.md,
 * "the family's last rows over pickle's time"). */
#define PG_HOT __attribute__((aligned(64)))

typedef struct dec {
    pg_decode_ctx_t *dc;
    pg_state_t *s; /* the owner's */
    pg_path_t path;
    uint64_t cost, budget; /* what the objects built so far cost (estimated), and the most they may */
    bool ext; /* inside a "python.tree": tuples starting with a uint are tagged (pg_tag_t) */
} dec_t;

/* The estimated cost of what one value becomes in Python: a buffer, array
 * or typed object (a numpy array or memoryview and its share of the frame's
 * exporter: 0.78-0.86 KB measured) or any other value (an int, a str, a
 * container's slot). */
#define PG_COST_BUFFER 800
#define PG_COST_VALUE 64

static PyObject *dec_value(dec_t *d, gser_value_t *v, int depth);

/* ---- numpy, imported into the state on first use (pg_numpy_t) ------------------------- */

static bool numpy_ready(pg_state_t *s)
{
    pg_numpy_t *np = &s->np;
    if (np->tried)
        return np->ndarray != NULL;
    np->tried = true;
    PyObject *mod = PyImport_ImportModule("numpy");
    PyObject *fmt = mod ? PyImport_ImportModule("numpy.lib.format") : NULL;
    PyObject *dtype = mod ? PyObject_GetAttrString(mod, "dtype") : NULL;
    bool ok = fmt && dtype && (np->require = PyObject_GetAttrString(mod, "require")) &&
              (np->descr_to_dtype = PyObject_GetAttrString(fmt, "descr_to_dtype"));
    for (int t = GSER_DTYPE_BOOL; ok && t < GSER_DTYPE_COUNT; t++)
        if (t != GSER_DTYPE_BFLOAT16 && !(np->dtypes[t] = PyObject_CallFunction(dtype, "s", pg_dtype_typestr(t))))
            ok = false;
    if (ok)
        ok = (np->ndarray = PyObject_GetAttrString(mod, "ndarray")) != NULL;
    if (!ok) {
        PyErr_Clear();
        Py_CLEAR(np->require);
        Py_CLEAR(np->descr_to_dtype);
        for (int t = 0; t < GSER_DTYPE_COUNT; t++)
            Py_CLEAR(np->dtypes[t]);
    }
    Py_XDECREF(dtype);
    Py_XDECREF(fmt);
    Py_XDECREF(mod);
    return np->ndarray != NULL;
}

static PyObject *fail_st(dec_t *d, gser_status_t st, const char *what)
{
    return pg_raise(d->s, st, false, what);
}

/* A malformed sub-tree of one of the module's types. */
static PyObject *bad_tree(dec_t *d, pg_type_t t, const char *what)
{
    return pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path, "a \"%s\" object: %s", pg_type_names[t],
                         what);
}

/* ---- frames and their exporters ------------------------------------------------------- */

int pg_decode_ctx_init(pg_decode_ctx_t *dc, PgOwner *owner, size_t nframes)
{
    memset(dc, 0, sizeof *dc);
    dc->owner = owner;
    dc->frames = PyMem_Calloc(nframes ? nframes : 1, sizeof *dc->frames);
    if (!dc->frames) {
        PyErr_NoMemory();
        return -1;
    }
    dc->nframes = nframes;
    return 0;
}

void pg_decode_ctx_set_frame(pg_decode_ctx_t *dc, size_t i, const gser_frame_t *fr, bool readonly, PyObject *src)
{
    pg_frame_ref_t *ref = &dc->frames[i];
    ref->data = fr->data;
    ref->size = fr->size;
    ref->host = fr->memory == GSER_MEMORY_HOST;
    ref->readonly = readonly;
    ref->src = src;
    dc->any_readonly |= readonly;
}

void pg_decode_ctx_clear(pg_decode_ctx_t *dc)
{
    for (size_t i = 0; dc->frames && i < dc->nframes; i++) {
        Py_CLEAR(dc->frames[i].exp[0]);
        Py_CLEAR(dc->frames[i].exp[1]);
        Py_CLEAR(dc->frames[i].mview);
    }
    PyMem_Free(dc->frames);
    PyMem_Free(dc->by_addr);
    dc->frames = NULL;
    dc->by_addr = NULL;
}

/* A host frame's address and index, sorted by address. */
typedef struct frame_at {
    const char *data;
    size_t index;
} frame_at_t;

static int frame_at_cmp(const void *a, const void *b)
{
    const char *x = ((const frame_at_t *)a)->data, *y = ((const frame_at_t *)b)->data;
    return x < y ? -1 : x > y;
}

/* Index the host frames by address (once, when the first host buffer is met). */
static int index_frames(pg_decode_ctx_t *dc)
{
    if (dc->by_addr || !dc->nframes)
        return 0;
    frame_at_t *at = PyMem_Malloc(dc->nframes * sizeof *at);
    dc->by_addr = at ? PyMem_Malloc(dc->nframes * sizeof *dc->by_addr) : NULL;
    if (!dc->by_addr) {
        PyMem_Free(at);
        PyErr_NoMemory();
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < dc->nframes; i++)
        if (dc->frames[i].host && dc->frames[i].data)
            at[n++] = (frame_at_t){dc->frames[i].data, i};
    qsort(at, n, sizeof *at, frame_at_cmp);
    for (size_t i = 0; i < n; i++)
        dc->by_addr[i] = at[i].index;
    dc->nby_addr = n;
    PyMem_Free(at);
    return 0;
}

/* The frame that holds [p, p + n), or NULL: the core made a copy (data that
 * was not aligned for its type), or frames overlap (the nearest one is
 * tried only, so that hostile frame lists stay O(log n) per buffer). */
static pg_frame_ref_t *frame_of(pg_decode_ctx_t *dc, const char *p, size_t n)
{
    if (!p || index_frames(dc) < 0) {
        PyErr_Clear(); /* no index: every buffer gets an exporter of its own */
        return NULL;
    }
    size_t lo = 0, hi = dc->nby_addr;
    while (lo < hi) { /* the last frame starting at or before p */
        size_t mid = lo + (hi - lo) / 2;
        if (dc->frames[dc->by_addr[mid]].data <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo)
        return NULL;
    pg_frame_ref_t *f = &dc->frames[dc->by_addr[lo - 1]];
    return (size_t)(p - f->data) <= f->size && n <= f->size - (size_t)(p - f->data) ? f : NULL;
}

/* A flat exporter over the frame holding [p, p + n) and p's offset in it (or
 * over [p, p + n) alone, offset 0). A new reference. */
static PyObject *exporter(dec_t *d, const char *p, size_t n, bool readonly, size_t *off, pg_frame_ref_t **frame)
{
    pg_decode_ctx_t *dc = d->dc;
    pg_frame_ref_t *f = frame_of(dc, p, n);
    *frame = f;
    if (!f) {
        *off = 0;
        return pg_frame_new(dc->owner, p, (Py_ssize_t)n, readonly || dc->any_readonly, "B", 1, 0, NULL);
    }
    *off = (size_t)(p - f->data);
    int which = readonly && !f->readonly;
    if (!f->exp[which] &&
        !(f->exp[which] = pg_frame_new(dc->owner, f->data, (Py_ssize_t)f->size, f->readonly || which, "B", 1, 0, NULL)))
        return NULL;
    return Py_NewRef(f->exp[which]);
}

/* memoryview of the bytes [p, p + n), a slice of the frame's memoryview. */
static PyObject *bytes_view(dec_t *d, const char *p, size_t n)
{
    size_t off;
    pg_frame_ref_t *f;
    PyObject *exp = exporter(d, p, n, false, &off, &f);
    if (!exp || !f) {
        PyObject *mv = exp ? PyMemoryView_FromObject(exp) : NULL;
        Py_XDECREF(exp);
        return mv;
    }
    Py_DECREF(exp);
    if (!f->mview && !(f->mview = PyMemoryView_FromObject(f->exp[0])))
        return NULL;
    if (off == 0 && n == f->size)
        return Py_NewRef(f->mview);
    return PySequence_GetSlice(f->mview, (Py_ssize_t)off, (Py_ssize_t)(off + n));
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

static PyObject *dec_std(dec_t *d, gser_value_t *v, gser_value_t *first, size_t n, int depth);

static PyObject *dec_list(dec_t *d, gser_value_t *v, int depth)
{
    bool tuple = gser_value_get_kind(v) == GSER_KIND_TUPLE;
    size_t n = gser_value_get_len(v);
    gser_value_t *first;
    if (d->ext && tuple && n && gser_list_get(v, 0, &first) == GSER_OK &&
        gser_value_get_kind(first) == GSER_KIND_UINT)
        return dec_std(d, v, first, n, depth);
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
        PyObject *x = st ? fail_st(d, st, "gser_list_get") : dec_value(d, item, depth + 1);
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
            return fail_st(d, st, "gser_map_get_at");
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

/* The memory a buffer's elements cover, [*lo, *lo + *span) (gser checked
 * that it lies in the received memory). */
static void desc_span(const gser_buffer_desc_t *desc, const char **lo, size_t *span)
{
    int64_t offset = 0;
    if (gser_buffer_get_span(desc, &offset, span) != GSER_OK) { /* cannot be: gser built it */
        offset = 0;
        *span = desc->nbytes;
    }
    *lo = (const char *)desc->data + offset;
}

/* The host buffer of v, checked so that Python can hold it. */
static int host_desc(dec_t *d, const gser_value_t *v, gser_buffer_desc_t *desc)
{
    *desc = (gser_buffer_desc_t)GSER_BUFFER_DESC_INIT;
    gser_status_t st = gser_value_get_buffer(v, desc);
    if (st) {
        fail_st(d, st, "gser_value_get_buffer");
        return -1;
    }
    if (desc->memory != GSER_MEMORY_HOST) {
        pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path, "a buffer in unknown memory kind %d",
                      (int)desc->memory);
        return -1;
    }
    const char *why = NULL;
    uint64_t total;
    if (desc->ndim > PG_MAX_NDIM)
        why = "more dimensions than numpy arrays have";
    else if (desc->nbytes > (size_t)PY_SSIZE_T_MAX)
        why = "too large for Python";
    else if (desc->ndim && pg_extents_total(desc->shape, (int)desc->ndim, gser_dtype_size(desc->dtype), &total, &why) == 0)
        why = NULL;
    if (why) {
        pg_path_raise(d->s, d->s->GserError, GSER_ERR_UNSUPPORTED, &d->path, "a buffer Python cannot hold: %s", why);
        return -1;
    }
    return 0;
}

/* A shape tuple of nd extents (checked by host_desc or the caller). */
static PyObject *shape_tuple(int nd, const int64_t *shape)
{
    PyObject *t = PyTuple_New(nd);
    for (int i = 0; t && i < nd; i++) {
        PyObject *x = PyLong_FromLongLong(shape[i]);
        if (!x)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* numpy.ndarray(shape, dtype, buffer=<exporter>, offset, strides) with element
 * 0 at p, strides NULL for C order, over the span [lo, lo + span): read-only
 * when the frame is, or when readonly is asked (the sender's array was
 * read-only). Dask's flags (dc->copy_readonly): an array writable at the
 * sender over a read-only frame is copied. */
static PyObject *np_view(dec_t *d, PyObject *dtype, int nd, const int64_t *shape, const int64_t *strides,
                         const char *p, const char *lo, size_t span, bool readonly)
{
    size_t off;
    pg_frame_ref_t *f;
    PyObject *exp = exporter(d, lo, span, readonly, &off, &f);
    if (!exp)
        return NULL;
    /* An array without items has zero strides, as numpy makes them (and
     * Dask hands them back); gser carries no strides for it. */
    static const int64_t zeros[PG_MAX_NDIM];
    for (int i = 0; !strides && i < nd; i++)
        if (shape[i] == 0)
            strides = zeros;
    PyObject *shp = shape_tuple(nd, shape);
    PyObject *str = shp && strides ? shape_tuple(nd, strides) : shp ? Py_NewRef(Py_None) : NULL;
    Py_ssize_t at = (Py_ssize_t)(off + (p - lo));
    PyObject *arr = str ? PyObject_CallFunction(d->s->np.ndarray, "OOOnO", shp, dtype, exp, at, str) : NULL;
    Py_XDECREF(shp);
    Py_XDECREF(str);
    bool frame_ro = f ? f->readonly : d->dc->any_readonly;
    Py_DECREF(exp);
    if (arr && !readonly && frame_ro && d->dc->copy_readonly) {
        PyObject *w = PyObject_CallFunction(d->s->np.require, "OOs", arr, Py_None, "W");
        Py_SETREF(arr, w);
    }
    return arr;
}

/* Without numpy: a memoryview with the buffer's format and shape. */
static PyObject *typed_memoryview(dec_t *d, const gser_buffer_desc_t *desc, bool readonly)
{
    const char *fmt = pg_dtype_format(desc->dtype);
    size_t es = gser_dtype_size(desc->dtype);
    int64_t flat[1] = {(int64_t)(desc->nbytes / es)};
    bool ro = readonly || d->dc->any_readonly;
    const char *lo;
    size_t span;
    desc_span(desc, &lo, &span);
    pg_frame_ref_t *f = frame_of(d->dc, lo, span);
    if (f)
        ro = readonly || f->readonly;
    PyObject *frame = pg_frame_new_strided(d->dc->owner, desc->data, (Py_ssize_t)desc->nbytes, ro, fmt,
                                           (Py_ssize_t)es, desc->ndim ? (int)desc->ndim : 1,
                                           desc->ndim ? desc->shape : flat, desc->strides);
    if (!frame)
        return NULL;
    PyObject *mv = PyMemoryView_FromObject(frame);
    Py_DECREF(frame);
    return mv;
}

/* A host buffer as a numpy array of its dtype (readonly: see np_view). */
static PyObject *host_array(dec_t *d, const gser_buffer_desc_t *desc, bool readonly)
{
    if (!pg_dtype_format(desc->dtype))
        return pg_path_raise(d->s, d->s->GserUnsupported, GSER_ERR_UNSUPPORTED, &d->path,
                             "a buffer of dtype %s, which Python's buffer protocol and numpy cannot express",
                             gser_dtype_str(desc->dtype));
    if (!numpy_ready(d->s))
        return typed_memoryview(d, desc, readonly);
    size_t es = gser_dtype_size(desc->dtype);
    int64_t flat[1] = {(int64_t)(desc->nbytes / es)};
    const char *lo;
    size_t span;
    desc_span(desc, &lo, &span);
    return np_view(d, d->s->np.dtypes[desc->dtype == GSER_DTYPE_BYTES ? GSER_DTYPE_UINT8 : desc->dtype],
                   desc->ndim ? (int)desc->ndim : 1, desc->ndim ? desc->shape : flat, desc->strides, desc->data, lo,
                   span, readonly);
}

static PyObject *dec_buffer(dec_t *d, const gser_value_t *v)
{
    gser_buffer_desc_t desc = GSER_BUFFER_DESC_INIT;
    gser_status_t st = gser_value_get_buffer(v, &desc);
    if (st)
        return fail_st(d, st, "gser_value_get_buffer");
    /* loads waited for the device copies gser made (desc.event) already. */
    if (desc.memory == GSER_MEMORY_DEVICE) {
        const char *why;
        uint64_t total;
        if (desc.ndim > PG_MAX_NDIM ||
            (desc.ndim && pg_extents_total(desc.shape, (int)desc.ndim, gser_dtype_size(desc.dtype), &total, &why)))
            return pg_path_raise(d->s, d->s->GserError, GSER_ERR_UNSUPPORTED, &d->path,
                                 "a device buffer Python cannot describe: %s",
                                 desc.ndim > PG_MAX_NDIM ? "more dimensions than numpy arrays have" : why);
        return pg_device_array_new(d->dc->owner, &desc);
    }
    if (host_desc(d, v, &desc) < 0)
        return NULL;
    /* Untyped flat bytes: a memoryview, as bytearray and memoryview went in. */
    if (desc.dtype == GSER_DTYPE_BYTES && desc.ndim == 0)
        return bytes_view(d, desc.data, desc.nbytes);
    return host_array(d, &desc, false);
}

/* ---- the module's typed objects ------------------------------------------------------------- */

/* The sub-tree item i of kind kind (-1: any), or NULL with GserError set. */
static gser_value_t *tree_item(dec_t *d, pg_type_t t, gser_value_t *tree, size_t i, int kind)
{
    gser_value_t *item = NULL;
    if (gser_list_get(tree, i, &item) || (kind >= 0 && gser_value_get_kind(item) != (gser_kind_t)kind)) {
        bad_tree(d, t, "the sub-tree does not have the items its type says");
        return NULL;
    }
    return item;
}

/* ("numpy.ndarray") (buffer, descr, writeable, ndim): descr None for a buffer
 * of gser's own dtype; else numpy.lib.format's description of the dtype, and
 * the buffer holds unsigned ints with one more extent, the items' bytes. */
static PyObject *dec_ndarray(dec_t *d, gser_value_t *tree, int depth)
{
    const pg_type_t T = PG_T_NDARRAY;
    if (gser_value_get_kind(tree) != GSER_KIND_TUPLE || gser_value_get_len(tree) != 4)
        return bad_tree(d, T, "the sub-tree is not a tuple of 4");
    gser_value_t *bv = tree_item(d, T, tree, 0, GSER_KIND_BUFFER);
    gser_value_t *dv = bv ? tree_item(d, T, tree, 1, -1) : NULL;
    gser_value_t *wv = dv ? tree_item(d, T, tree, 2, GSER_KIND_BOOL) : NULL;
    gser_value_t *nv = wv ? tree_item(d, T, tree, 3, GSER_KIND_INT) : NULL;
    if (!nv)
        return NULL;
    bool writeable = false;
    int64_t ndim = -1;
    gser_buffer_desc_t desc;
    if (gser_value_get_bool(wv, &writeable) || gser_value_get_int(nv, &ndim) || host_desc(d, bv, &desc) < 0)
        return PyErr_Occurred() ? NULL : bad_tree(d, T, "bad flags");
    if (!numpy_ready(d->s))
        return pg_path_raise(d->s, d->s->GserUnsupported, GSER_ERR_UNSUPPORTED, &d->path,
                             "a numpy array, and numpy is not installed");
    int64_t flat[1] = {(int64_t)desc.nbytes};
    int bnd = desc.ndim ? (int)desc.ndim : 1;
    const int64_t *bshape = desc.ndim ? desc.shape : flat;
    const char *lo;
    size_t span;
    desc_span(&desc, &lo, &span);
    if (gser_value_get_kind(dv) == GSER_KIND_NIL) {
        /* gser's dtype; a 0-d array travels as shape (1,). */
        if (ndim == 0 && !(bnd == 1 && bshape[0] == 1))
            return bad_tree(d, T, "a 0-d array whose buffer does not hold one item");
        if (ndim != 0 && ndim != bnd)
            return bad_tree(d, T, "ndim does not match the buffer");
        if (!pg_dtype_format(desc.dtype) || desc.dtype == GSER_DTYPE_BYTES)
            return bad_tree(d, T, "a buffer without a numpy dtype");
        return np_view(d, d->s->np.dtypes[desc.dtype], (int)ndim, bshape, ndim ? desc.strides : NULL, desc.data, lo,
                       span, !writeable);
    }
    /* A dtype gser has no name for: the description is data (str, lists and
     * tuples), and numpy.lib.format.descr_to_dtype, which numpy.load uses for
     * untrusted files, rebuilds it without running code. */
    size_t width = gser_dtype_size(desc.dtype);
    bool uint = desc.dtype == GSER_DTYPE_UINT8 || desc.dtype == GSER_DTYPE_UINT16 ||
                desc.dtype == GSER_DTYPE_UINT32 || desc.dtype == GSER_DTYPE_UINT64;
    if (!uint || ndim < 0 || ndim + 1 != bnd ||
        (desc.strides && bshape[bnd - 1] > 1 && desc.strides[bnd - 1] != (int64_t)width))
        return bad_tree(d, T, "the items of a described dtype must be unsigned ints with one more, contiguous, extent");
    int slot = d->path.len++;
    d->path.seg[slot].key = NULL;
    d->path.seg[slot].index = 1;
    PyObject *descr = dec_value(d, dv, depth + 1);
    d->path.len--;
    if (!descr)
        return NULL;
    PyObject *dt = PyObject_CallOneArg(d->s->np.descr_to_dtype, descr);
    Py_DECREF(descr);
    if (!dt)
        return pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path,
                             "a \"%s\" object: a bad dtype description", pg_type_names[T]);
    PyObject *hasobj = PyObject_GetAttrString(dt, "hasobject");
    PyObject *isz = hasobj ? PyObject_GetAttrString(dt, "itemsize") : NULL;
    Py_ssize_t itemsize = isz ? PyLong_AsSsize_t(isz) : -1;
    int objects = hasobj ? PyObject_IsTrue(hasobj) : -1;
    Py_XDECREF(hasobj);
    Py_XDECREF(isz);
    PyObject *out = NULL;
    if (objects < 0 || itemsize < 0)
        ;
    else if (objects) /* never: bytes read as object pointers would be anything */
        pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path,
                      "a \"%s\" object with Python objects in its dtype", pg_type_names[T]);
    else if (itemsize == 0 || (uint64_t)itemsize != (uint64_t)bshape[bnd - 1] * width)
        bad_tree(d, T, "the dtype's item size does not match the buffer");
    else
        out = np_view(d, dt, (int)ndim, bshape, desc.strides, desc.data, lo, span, !writeable);
    Py_DECREF(dt);
    return out;
}

/* ("python.bytes", "python.bytearray") a buffer of bytes: the object handed
 * to loads as that frame when it is one of the type and covers the buffer
 * exactly (zero-copy, as Dask returns its frame), else a copy. */
static PyObject *dec_bytes_like(dec_t *d, pg_type_t t, gser_value_t *tree)
{
    gser_buffer_desc_t desc;
    if (gser_value_get_kind(tree) != GSER_KIND_BUFFER)
        return bad_tree(d, t, "the sub-tree is not a buffer");
    if (host_desc(d, tree, &desc) < 0)
        return NULL;
    PyTypeObject *want = t == PG_T_BYTES ? &PyBytes_Type : &PyByteArray_Type;
    pg_frame_ref_t *f = frame_of(d->dc, desc.data, desc.nbytes);
    if (f && f->src && Py_TYPE(f->src) == want && f->data == desc.data && f->size == desc.nbytes)
        return Py_NewRef(f->src);
    const char *p = desc.nbytes ? desc.data : "";
    return t == PG_T_BYTES ? PyBytes_FromStringAndSize(p, (Py_ssize_t)desc.nbytes)
                           : PyByteArray_FromStringAndSize(p, (Py_ssize_t)desc.nbytes);
}

/* ("python.memoryview") a buffer: a memoryview of its format and shape. */
static PyObject *dec_memoryview(dec_t *d, gser_value_t *tree)
{
    gser_buffer_desc_t desc;
    if (gser_value_get_kind(tree) != GSER_KIND_BUFFER)
        return bad_tree(d, PG_T_MEMORYVIEW, "the sub-tree is not a buffer");
    if (host_desc(d, tree, &desc) < 0)
        return NULL;
    if (desc.dtype == GSER_DTYPE_BYTES && desc.ndim == 0)
        return bytes_view(d, desc.data, desc.nbytes);
    if (!pg_dtype_format(desc.dtype))
        return bad_tree(d, PG_T_MEMORYVIEW, "a dtype memoryview has no format for");
    return typed_memoryview(d, &desc, false);
}

/* ("python.type") (name, value): the receiver's from_gser(value). */
static PyObject *dec_pytype(dec_t *d, gser_value_t *tree, int depth)
{
    const pg_type_t T = PG_T_PYTYPE;
    if (gser_value_get_kind(tree) != GSER_KIND_TUPLE || gser_value_get_len(tree) != 2)
        return bad_tree(d, T, "the sub-tree is not a tuple of 2");
    gser_value_t *nv = tree_item(d, T, tree, 0, GSER_KIND_STR);
    gser_value_t *vv = nv ? tree_item(d, T, tree, 1, -1) : NULL;
    if (!vv)
        return NULL;
    PyObject *name = dec_value(d, nv, depth + 1);
    if (!name)
        return NULL;
    PyObject *entry = NULL, *out = NULL;
    int found = pg_registry_lookup_name(d->s, name, &entry);
    if (found == 0)
        pg_path_raise(d->s, d->s->GserError, GSER_ERR_UNKNOWN_TYPE, &d->path,
                      "Python type %R was registered with gser.register_type by the sender, not here: import the "
                      "library that registers it, or call gser.register_type(cls, to_gser, from_gser, name=%R)",
                      name, name);
    if (found == 1) {
        PyObject *value = dec_value(d, vv, depth + 1);
        out = value ? PyObject_CallOneArg(PyTuple_GET_ITEM(entry, 2), value) : NULL;
        Py_XDECREF(value);
    }
    Py_XDECREF(entry);
    Py_DECREF(name);
    return out;
}

/* ("numpy.scalar") (descr, bytes): numpy's own scalar of that dtype. */
static PyObject *dec_npscalar(dec_t *d, gser_value_t *tree, int depth)
{
    const pg_type_t T = PG_T_NPSCALAR;
    if (gser_value_get_kind(tree) != GSER_KIND_TUPLE || gser_value_get_len(tree) != 2)
        return bad_tree(d, T, "the sub-tree is not a tuple of 2");
    gser_value_t *dv = tree_item(d, T, tree, 0, -1);
    gser_value_t *bv = dv ? tree_item(d, T, tree, 1, GSER_KIND_BYTES) : NULL;
    const void *p;
    size_t n;
    if (!bv || gser_value_get_bytes(bv, &p, &n))
        return bv ? bad_tree(d, T, "bad bytes") : NULL;
    PyObject *descr = dec_value(d, dv, depth + 1);
    if (!descr)
        return NULL;
    const char *why;
    PyObject *out = pg_npscalar_decode(d->s, descr, p, n, &why);
    Py_DECREF(descr);
    return out || !why ? out : bad_tree(d, T, why);
}

/* ---- whole Dask messages on gser:// ("dask.msg", "dask.part"; encode.c) ------------------------ */

/* ("dask.msg") the message's tree, at the root only, and only for a
 * receiver that rebuilds the parts (a Dask comm). */
static PyObject *dec_dask_msg(dec_t *d, gser_value_t *tree, int depth)
{
    if (!d->dc->dask_parts || depth != 1)
        return bad_tree(d, PG_T_DASK_MSG, d->dc->dask_parts ? "not at the root of the message"
                                                             : "a Dask message, to a receiver that is not a Dask comm");
    d->dc->dask_msg = true;
    return dec_value(d, tree, depth + 1);
}

/* ("dask.part") (kind 0 or 1, header bytes, frames...): what the callback
 * makes of it (Dask's own loads), the frames as memoryviews (host) or
 * gser.DeviceArray (device), as Dask's comms hand frames over. */
static PyObject *dec_dask_part(dec_t *d, gser_value_t *tree, int depth)
{
    const pg_type_t T = PG_T_DASK_PART;
    if (!d->dc->dask_msg)
        return bad_tree(d, T, "a Dask part outside a Dask message");
    size_t n = gser_value_get_kind(tree) == GSER_KIND_TUPLE ? gser_value_get_len(tree) : 0;
    if (n < 2)
        return bad_tree(d, T, "the sub-tree is not a tuple of (kind, header, frames...)");
    gser_value_t *kv = tree_item(d, T, tree, 0, GSER_KIND_INT);
    int64_t kind = -1;
    if (!kv)
        return NULL;
    if (gser_value_get_int(kv, &kind) || (kind != 0 && kind != 1))
        return bad_tree(d, T, "a kind other than 0 (serialized) or 1 (pickled)");
    gser_value_t *hv = tree_item(d, T, tree, 1, -1);
    PyObject *header = hv ? dec_value(d, hv, depth + 1) : NULL;
    if (!header)
        return NULL;
    if (!PyBytes_CheckExact(header)) {
        Py_DECREF(header);
        return bad_tree(d, T, "a header that is not bytes");
    }
    PyObject *frames = PyList_New((Py_ssize_t)(n - 2));
    for (size_t i = 2; frames && i < n; i++) {
        gser_value_t *fv = tree_item(d, T, tree, i, GSER_KIND_BUFFER);
        PyObject *f = fv ? dec_buffer(d, fv) : NULL;
        if (f && !PyMemoryView_Check(f) && !Py_IS_TYPE(f, d->s->DeviceArray)) {
            Py_DECREF(f);
            f = bad_tree(d, T, "a frame that is not flat bytes or device memory");
        }
        if (!f)
            Py_CLEAR(frames);
        else
            PyList_SET_ITEM(frames, (Py_ssize_t)(i - 2), f);
    }
    PyObject *out = frames ? PyObject_CallFunction(d->dc->dask_parts, "LOO", (long long)kind, header, frames) : NULL;
    Py_DECREF(header);
    Py_XDECREF(frames);
    return out;
}

static PyObject *dec_module_type_in(dec_t *d, pg_type_t t, gser_value_t *tree, int depth)
{
    switch (t) {
    case PG_T_TREE: return dec_value(d, tree, depth + 1);
    case PG_T_NDARRAY: return dec_ndarray(d, tree, depth);
    case PG_T_BYTES:
    case PG_T_BYTEARRAY: return dec_bytes_like(d, t, tree);
    case PG_T_MEMORYVIEW: return dec_memoryview(d, tree);
    case PG_T_PYTYPE: return dec_pytype(d, tree, depth);
    case PG_T_NPSCALAR: return dec_npscalar(d, tree, depth);
    case PG_T_DASK_MSG: return dec_dask_msg(d, tree, depth);
    case PG_T_DASK_PART: return dec_dask_part(d, tree, depth);
    default: return bad_tree(d, t, "unknown");
    }
}

/* A module type's sub-tree: tagged tuples inside a "python.tree" only. */
static PyObject *dec_module_type(dec_t *d, pg_type_t t, gser_value_t *tree, int depth)
{
    bool ext = d->ext;
    d->ext = t == PG_T_TREE;
    PyObject *x = dec_module_type_in(d, t, tree, depth);
    d->ext = ext;
    return x;
}

/* Typed objects: the module's own, "arrow.array", or one Python cannot load. */
static PyObject *dec_object(dec_t *d, gser_value_t *v, int depth)
{
    const char *type = "?";
    void *obj = NULL;
    gser_status_t st = GSER_OK;
    gser_serialized_info_t info = GSER_SERIALIZED_INFO_INIT;
    if (gser_value_get_serialized(v, &info) == GSER_OK) {
        type = info.type_name;
    } else if (gser_value_get_object(v, &type, &obj) == GSER_OK) {
        int t = pg_type_find(type);
        if (t >= 0)
            return dec_module_type(d, (pg_type_t)t, obj, depth);
        if (pg_have_arrow && strcmp(type, GSER_ARROW_TYPE) == 0) {
            PyObject *a = pg_arrow_take(d->s, v, &st);
            if (!a && st)
                return pg_path_raise(d->s, d->s->GserError, st, &d->path, "gser_arrow_take_value: %s",
                                     gser_status_str(st));
            return a;
        }
    }
    /* The name came from the wire: it may be anything but UTF-8. */
    PyObject *name = pg_text(type);
    if (!name)
        return NULL;
    PyObject *r = pg_path_raise(d->s, d->s->GserUnsupported, GSER_ERR_UNSUPPORTED, &d->path,
                                pg_have_arrow ? "a typed object of type \"%U\": the Python module loads its own types "
                                                "and \"" GSER_ARROW_TYPE "\" only"
                                              : "a typed object of type \"%U\": the Python module loads its own types "
                                                "only (it was built without gser::arrow)",
                                name);
    Py_DECREF(name);
    return r;
}

/* ---- Python's standard types ("python.tree") ---------------------------------------- */

static int dt_ready(void)
{
    if (!PyDateTimeAPI)
        PyDateTime_IMPORT;
    return PyDateTimeAPI ? 0 : -1;
}

/* A malformed tagged tuple. */
static PyObject *bad_std(dec_t *d, uint64_t tag, const char *what)
{
    return pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path,
                         "a \"%s\" value with tag %llu: %s", pg_type_names[PG_T_TREE], (unsigned long long)tag, what);
}

/* A Python constructor refused the fields: GserError (the cause chained),
 * MemoryError as it is. */
static PyObject *std_refused(dec_t *d, uint64_t tag)
{
    if (PyErr_ExceptionMatches(PyExc_MemoryError))
        return NULL;
    return bad_std(d, tag, "its fields are out of range for the type");
}

/* Count n more objects against the decoder's budget. */
static int charge_objects(dec_t *d, uint64_t n, uint64_t each)
{
    d->cost += n * each;
    if (d->cost <= d->budget)
        return 0;
    pg_path_raise(d->s, d->s->GserError, GSER_ERR_LIMIT_BYTES, &d->path,
                  "the Python objects of this message would take more than %llu bytes (estimated)",
                  (unsigned long long)d->budget);
    return -1;
}

/* A new set about to get n items: its table made at its final size at once
 * where the budget has room for it (a hostile count of duplicates then costs
 * no more than the limits allow), else grown as usual. */
static void presize_set(dec_t *d, PyObject *x, size_t n)
{
    if (n > 64 && d->cost < d->budget)
        d->cost += pg_set_presize(x, n, d->budget - d->cost);
}

/* Field i of tagged tuple v, of kind kind (-1: any). */
static gser_value_t *std_field(dec_t *d, gser_value_t *v, uint64_t tag, size_t i, int kind)
{
    gser_value_t *f = NULL;
    if (gser_list_get(v, i, &f) || (kind >= 0 && gser_value_get_kind(f) != (gser_kind_t)kind)) {
        bad_std(d, tag, "a field is missing or of the wrong kind");
        return NULL;
    }
    return f;
}

/* Field i decoded (into a Python object). */
static PyObject *std_obj(dec_t *d, gser_value_t *v, uint64_t tag, size_t i, int depth)
{
    gser_value_t *f = std_field(d, v, tag, i, -1);
    if (!f)
        return NULL;
    int slot = d->path.len++;
    d->path.seg[slot].key = NULL;
    d->path.seg[slot].index = (Py_ssize_t)i;
    PyObject *x = dec_value(d, f, depth + 1);
    if (x)
        d->path.len--;
    return x;
}

/* Field i as an exact int (of any size). */
static PyObject *std_int(dec_t *d, gser_value_t *v, uint64_t tag, size_t i, int depth)
{
    PyObject *x = std_obj(d, v, tag, i, depth);
    if (x && !PyLong_CheckExact(x)) {
        Py_DECREF(x);
        return bad_std(d, tag, "a field that should be an int is not");
    }
    return x;
}

static int std_i64(dec_t *d, gser_value_t *v, uint64_t tag, size_t i, int64_t *out)
{
    gser_value_t *f = std_field(d, v, tag, i, -1);
    if (!f)
        return -1;
    if (gser_value_get_kind(f) != GSER_KIND_INT || gser_value_get_int(f, out)) {
        bad_std(d, tag, "a field that should be an int64 is not");
        return -1;
    }
    return 0;
}

/* A list of count int64 or float64 items: the array behind it, or its items one by one. */
typedef struct vec {
    gser_value_t *list;
    const unsigned char *data; /* NULL: item by item */
    size_t n;
    gser_kind_t kind;
} vec_t;

static int vec_open(dec_t *d, gser_value_t *v, uint64_t tag, gser_kind_t kind, vec_t *out)
{
    gser_kind_t k = gser_value_get_kind(v);
    if (k != GSER_KIND_LIST && k != GSER_KIND_TUPLE) {
        bad_std(d, tag, "a packed field is not a list");
        return -1;
    }
    out->list = v;
    out->kind = kind;
    out->n = gser_value_get_len(v);
    const void *data;
    size_t count;
    out->data = NULL;
    if (gser_list_get_array(v, &k, &data, &count) == GSER_OK && count == out->n) {
        if (k != kind && count) {
            bad_std(d, tag, "a packed field has items of the wrong kind");
            return -1;
        }
        out->data = data;
    }
    return 0;
}

/* Item i (int64 bits, or a float's bits). */
PG_HOT static int vec_get(dec_t *d, vec_t *vc, uint64_t tag, size_t i, int64_t *out)
{
    if (vc->data) {
        memcpy(out, vc->data + 8 * i, 8);
        return 0;
    }
    gser_value_t *f;
    double x;
    if (gser_list_get(vc->list, i, &f) || gser_value_get_kind(f) != vc->kind ||
        (vc->kind == GSER_KIND_INT ? gser_value_get_int(f, out) : gser_value_get_float(f, &x))) {
        bad_std(d, tag, "a packed field has items of the wrong kind");
        return -1;
    }
    if (vc->kind == GSER_KIND_FLOAT)
        memcpy(out, &x, 8);
    return 0;
}

/* A tzinfo value: None, a timezone, a ZoneInfo. */
static PyObject *dec_tz(dec_t *d, gser_value_t *v, uint64_t tag, int depth)
{
    if (gser_value_get_kind(v) == GSER_KIND_NIL)
        return Py_NewRef(Py_None);
    PyObject *tz = dec_value(d, v, depth + 1);
    if (!tz)
        return NULL;
    if (tz != Py_None && Py_TYPE(tz) != Py_TYPE(PyDateTime_TimeZone_UTC) &&
        (PyObject *)Py_TYPE(tz) != d->s->std.ZoneInfo) {
        Py_DECREF(tz);
        return bad_std(d, tag, "a tzinfo that is not a timezone or a ZoneInfo");
    }
    return tz;
}

static PyObject *make_datetime(dec_t *d, uint64_t tag, int64_t bits, PyObject *tz)
{
    int y, mo, dd, h, mi, s, us, fold;
    PyObject *x;
    if (tag == PG_TAG_DATETIME) {
        pg_unpack_datetime(bits, &y, &mo, &dd, &h, &mi, &s, &us, &fold);
        x = PyDateTimeAPI->DateTime_FromDateAndTimeAndFold(y, mo, dd, h, mi, s, us, tz, fold,
                                                            PyDateTimeAPI->DateTimeType);
    } else if (tag == PG_TAG_TIME) {
        pg_unpack_time(bits, &h, &mi, &s, &us, &fold);
        x = PyDateTimeAPI->Time_FromTimeAndFold(h, mi, s, us, tz, fold, PyDateTimeAPI->TimeType);
    } else {
        if (bits < 0 || bits >> 23)
            return bad_std(d, tag, "a date out of range");
        x = PyDateTimeAPI->Date_FromDate((int)(bits >> 9), (int)(bits >> 5 & 0xf), (int)(bits & 0x1f),
                                         PyDateTimeAPI->DateType);
    }
    return x ? x : std_refused(d, tag);
}

static PyObject *make_delta(dec_t *d, uint64_t tag, int64_t days, int64_t us)
{
    if (days < -999999999 || days > 999999999 || us < 0 || us >= 86400LL * 1000000)
        return bad_std(d, tag, "a timedelta out of range");
    PyObject *x = PyDateTimeAPI->Delta_FromDelta((int)days, (int)(us / 1000000), (int)(us % 1000000), 1,
                                                 PyDateTimeAPI->DeltaType);
    return x ? x : std_refused(d, tag);
}

static PyObject *make_uuid(dec_t *d, uint64_t tag, const unsigned char *p, PyObject *safe)
{
    /* As pickle rebuilds one (UUID.__setstate__): no __init__, the two slots set. */
    PyObject *i = NULL, *empty = PyTuple_New(0);
    PyObject *u = empty ? PyBaseObject_Type.tp_new((PyTypeObject *)d->s->std.UUID, empty, NULL) : NULL;
    Py_XDECREF(empty);
    if (u)
        i = pg_long_from_be16(p);
    if (!i || PyObject_GenericSetAttr(u, d->s->std.str_int, i) < 0 ||
        PyObject_GenericSetAttr(u, d->s->std.str_is_safe, safe) < 0)
        Py_CLEAR(u);
    Py_XDECREF(i);
    (void)tag;
    return u;
}

/* (PACKED, SCALARS, tuple, codes, int64s, float64s, str lengths, str bytes) */
static PyObject *dec_scalars(dec_t *d, gser_value_t *v, bool tuple, int depth)
{
    const uint64_t T = PG_TAG_PACKED;
    gser_value_t *cv = std_field(d, v, T, 3, GSER_KIND_BYTES), *f[3];
    gser_value_t *bv = cv ? std_field(d, v, T, 7, GSER_KIND_BYTES) : NULL;
    gser_value_t *ov = bv ? std_field(d, v, T, 8, GSER_KIND_LIST) : NULL;
    if (!ov)
        return NULL;
    size_t no = gser_value_get_len(ov);
    vec_t ints, flts, lens;
    const void *cp, *bp;
    size_t n, nb;
    for (int i = 0; i < 3; i++)
        if (!(f[i] = std_field(d, v, T, 4 + (size_t)i, -1)))
            return NULL;
    if (gser_value_get_bytes(cv, &cp, &n) || gser_value_get_bytes(bv, &bp, &nb) ||
        vec_open(d, f[0], T, GSER_KIND_INT, &ints) < 0 || vec_open(d, f[1], T, GSER_KIND_FLOAT, &flts) < 0 ||
        vec_open(d, f[2], T, GSER_KIND_INT, &lens) < 0)
        return PyErr_Occurred() ? NULL : bad_std(d, T, "bad columns");
    if (n > (size_t)PY_SSIZE_T_MAX || charge_objects(d, n, PG_COST_VALUE) < 0)
        return NULL;
    const unsigned char *codes = cp;
    const char *blob = bp;
    PyObject *seq = tuple ? PyTuple_New((Py_ssize_t)n) : PyList_New((Py_ssize_t)n);
    if (!seq)
        return NULL;
    size_t ai = 0, af = 0, as = 0, at = 0, ao = 0, prev_at = 0, prev_len = 0;
    PyObject *prev_str = NULL; /* borrowed: the list holds it */
    int slot = d->path.len++;
    d->path.seg[slot].key = NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *x = NULL;
        int64_t bits = 0;
        d->path.seg[slot].index = (Py_ssize_t)i;
        switch (codes[i]) {
        case PG_SC_OTHER: {
            gser_value_t *item;
            if (ao >= no) {
                bad_std(d, T, "more other items than the list holds");
                break;
            }
            if (gser_list_get(ov, ao++, &item) == GSER_OK)
                x = dec_value(d, item, depth + 1);
            break;
        }
        case PG_SC_NONE: x = Py_NewRef(Py_None); break;
        case PG_SC_FALSE: x = Py_NewRef(Py_False); break;
        case PG_SC_TRUE: x = Py_NewRef(Py_True); break;
        case PG_SC_ELLIPSIS: x = Py_NewRef(Py_Ellipsis); break;
        case PG_SC_INT:
        case PG_SC_UINT:
            if (ai >= ints.n) {
                bad_std(d, T, "more ints than the column holds");
                break;
            }
            if (vec_get(d, &ints, T, ai++, &bits) == 0)
                x = codes[i] == PG_SC_INT ? PyLong_FromLongLong(bits)
                                          : PyLong_FromUnsignedLongLong((unsigned long long)(uint64_t)bits);
            break;
        case PG_SC_FLOAT:
            if (af >= flts.n) {
                bad_std(d, T, "more floats than the column holds");
                break;
            }
            if (vec_get(d, &flts, T, af++, &bits) == 0) {
                double fl;
                memcpy(&fl, &bits, 8);
                x = PyFloat_FromDouble(fl);
            }
            break;
        case PG_SC_STR:
            if (as >= lens.n) {
                bad_std(d, T, "more strs than the column holds");
                break;
            }
            if (vec_get(d, &lens, T, as++, &bits) < 0)
                break;
            if (bits < 0 || (uint64_t)bits > nb - at) {
                bad_std(d, T, "str lengths that do not fit the bytes");
                break;
            }
            /* The same str as the one before (a repeated key): one object, as pickle's memo gives. */
            if (prev_str && (size_t)bits == prev_len && memcmp(blob + at, blob + prev_at, prev_len) == 0) {
                x = Py_NewRef(prev_str);
            } else {
                x = PyUnicode_DecodeUTF8(blob + at, (Py_ssize_t)bits, NULL);
                if (!x) {
                    bad_std(d, T, "a str that is not valid UTF-8");
                    break;
                }
                prev_str = x;
                prev_at = at;
                prev_len = (size_t)bits;
            }
            at += (size_t)bits;
            break;
        default: bad_std(d, T, "an unknown scalar code");
        }
        if (!x) {
            Py_DECREF(seq);
            return NULL;
        }
        if (tuple)
            PyTuple_SET_ITEM(seq, (Py_ssize_t)i, x);
        else
            PyList_SET_ITEM(seq, (Py_ssize_t)i, x);
    }
    d->path.len--;
    if (ai != ints.n || af != flts.n || as != lens.n || at != nb || ao != no) {
        Py_DECREF(seq);
        return bad_std(d, T, "columns longer than the codes say");
    }
    return seq;
}

/* (PACKED, RECORDS, tuple, [keys], [columns]) and (PACKED, ROWS, tuple, width, [columns]) */
static PyObject *dec_columns(dec_t *d, gser_value_t *v, uint64_t kind, bool tuple, int depth)
{
    const uint64_t T = PG_TAG_PACKED;
    bool rec = kind == PG_TAG_RECORDS;
    gser_value_t *colsv = std_field(d, v, T, 4, GSER_KIND_LIST);
    if (!colsv)
        return NULL;
    PyObject *keys = NULL, *cols = NULL, *seq = NULL;
    Py_ssize_t k;
    if (rec) {
        if (!std_field(d, v, T, 3, GSER_KIND_LIST) || !(keys = std_obj(d, v, T, 3, depth)))
            return NULL;
        k = PyList_GET_SIZE(keys);
        for (Py_ssize_t j = 0; j < k; j++)
            if (!PyUnicode_CheckExact(PyList_GET_ITEM(keys, j))) {
                Py_DECREF(keys);
                return bad_std(d, T, "a record key that is not a str");
            }
    } else {
        int64_t w;
        if (std_i64(d, v, T, 3, &w) < 0)
            return NULL;
        if (w < 1 || (uint64_t)w != gser_value_get_len(colsv))
            return bad_std(d, T, "a width that is not the number of columns");
        k = (Py_ssize_t)w;
    }
    if ((size_t)k != gser_value_get_len(colsv) || k == 0) {
        Py_XDECREF(keys);
        return bad_std(d, T, "not one column per key");
    }
    cols = std_obj(d, v, T, 4, depth);
    if (!cols)
        goto fail;
    Py_ssize_t n = -1;
    for (Py_ssize_t j = 0; j < k; j++) {
        PyObject *c = PyList_GET_ITEM(cols, j);
        if (!PyList_CheckExact(c) || (n >= 0 && PyList_GET_SIZE(c) != n)) {
            bad_std(d, T, "columns that are not lists of one length");
            goto fail;
        }
        n = PyList_GET_SIZE(c);
    }
    if (charge_objects(d, (uint64_t)n, PG_COST_VALUE * 2) < 0)
        goto fail;
    seq = tuple ? PyTuple_New(n) : PyList_New(n);
    for (Py_ssize_t i = 0; seq && i < n; i++) {
        PyObject *x = rec ? _PyDict_NewPresized(k) : PyTuple_New(k);
        for (Py_ssize_t j = 0; x && j < k; j++) {
            PyObject *y = PyList_GET_ITEM(PyList_GET_ITEM(cols, j), i);
            if (!rec)
                PyTuple_SET_ITEM(x, j, Py_NewRef(y));
            else if (PyDict_SetItem(x, PyList_GET_ITEM(keys, j), y) < 0)
                Py_CLEAR(x);
        }
        if (!x)
            goto fail;
        if (tuple)
            PyTuple_SET_ITEM(seq, i, x);
        else
            PyList_SET_ITEM(seq, i, x);
    }
    if (!seq)
        goto fail;
    Py_XDECREF(keys);
    Py_DECREF(cols);
    return seq;
fail:
    Py_XDECREF(keys);
    Py_XDECREF(cols);
    Py_XDECREF(seq);
    return NULL;
}

PG_HOT static PyObject *dec_packed(dec_t *d, gser_value_t *v, size_t n, int depth)
{
    const uint64_t T = PG_TAG_PACKED;
    gser_value_t *kv = std_field(d, v, T, 1, GSER_KIND_UINT);
    gser_value_t *cv = kv ? std_field(d, v, T, 2, GSER_KIND_BOOL) : NULL;
    uint64_t kind = 0;
    bool tuple = false;
    if (!cv || gser_value_get_uint(kv, &kind) || gser_value_get_bool(cv, &tuple))
        return cv ? bad_std(d, T, "bad kind") : NULL;
    bool has_tz = kind == PG_TAG_DATETIME || kind == PG_TAG_TIME;
    size_t nf = kind == PG_TAG_SCALARS ? 9 : kind == PG_TAG_INT || has_tz || kind >= PG_TAG_RECORDS ? 5 : 4;
    if (n != nf)
        return bad_std(d, T, "the wrong number of fields for its kind");
    if (kind == PG_TAG_SCALARS)
        return dec_scalars(d, v, tuple, depth);
    if (kind == PG_TAG_RECORDS || kind == PG_TAG_ROWS)
        return dec_columns(d, v, kind, tuple, depth);
    PyObject *tz = NULL, *seq = NULL;
    gser_value_t *pv = std_field(d, v, T, nf - 1, -1);
    if (!pv)
        return NULL;
    if (has_tz) {
        gser_value_t *tv = std_field(d, v, T, 3, -1);
        if (!tv || !(tz = dec_tz(d, tv, T, depth)))
            return NULL;
    }
    size_t count = 0;
    vec_t vc, lens;
    const void *bytes = NULL;
    size_t nbytes = 0;
    switch (kind) {
    case PG_TAG_DATETIME:
    case PG_TAG_DATE:
    case PG_TAG_TIME:
    case PG_TAG_TIMEDELTA:
    case PG_TAG_COMPLEX:
        if (vec_open(d, pv, T, kind == PG_TAG_COMPLEX ? GSER_KIND_FLOAT : GSER_KIND_INT, &vc) < 0)
            goto fail;
        count = kind == PG_TAG_TIMEDELTA || kind == PG_TAG_COMPLEX ? vc.n / 2 : vc.n;
        if (count * (kind == PG_TAG_TIMEDELTA || kind == PG_TAG_COMPLEX ? 2 : 1) != vc.n) {
            bad_std(d, T, "an odd number of packed items");
            goto fail;
        }
        break;
    case PG_TAG_DECIMAL:
        if (gser_value_get_kind(pv) != GSER_KIND_LIST) {
            bad_std(d, T, "Decimals not in a list");
            goto fail;
        }
        count = gser_value_get_len(pv);
        break;
    case PG_TAG_UUID:
        if (gser_value_get_kind(pv) != GSER_KIND_BYTES || gser_value_get_bytes(pv, &bytes, &nbytes) || nbytes % 16) {
            bad_std(d, T, "UUIDs not in bytes of 16 each");
            goto fail;
        }
        count = nbytes / 16;
        break;
    case PG_TAG_INT: {
        gser_value_t *lv = std_field(d, v, T, 3, -1);
        if (!lv || vec_open(d, lv, T, GSER_KIND_INT, &lens) < 0)
            goto fail;
        if (gser_value_get_kind(pv) != GSER_KIND_BYTES || gser_value_get_bytes(pv, &bytes, &nbytes)) {
            bad_std(d, T, "ints not in bytes");
            goto fail;
        }
        count = lens.n;
        break;
    }
    default: bad_std(d, T, "an unknown kind"); goto fail;
    }
    if (count > (size_t)PY_SSIZE_T_MAX || charge_objects(d, count, PG_COST_VALUE) < 0)
        goto fail;
    if (kind == PG_TAG_UUID || kind == PG_TAG_DECIMAL) {
        if (pg_std_ready(d->s) < 0)
            goto fail;
    }
    seq = tuple ? PyTuple_New((Py_ssize_t)count) : PyList_New((Py_ssize_t)count);
    if (!seq)
        goto fail;
    size_t at = 0;
    int slot = d->path.len++;
    d->path.seg[slot].key = NULL;
    for (size_t i = 0; i < count; i++) {
        d->path.seg[slot].index = (Py_ssize_t)i;
        PyObject *x = NULL;
        int64_t a = 0, b = 0;
        switch (kind) {
        case PG_TAG_DATETIME:
        case PG_TAG_DATE:
        case PG_TAG_TIME:
            if (vec_get(d, &vc, T, i, &a) == 0)
                x = make_datetime(d, kind, a, tz);
            break;
        case PG_TAG_TIMEDELTA:
            if (vec_get(d, &vc, T, 2 * i, &a) == 0 && vec_get(d, &vc, T, 2 * i + 1, &b) == 0)
                x = make_delta(d, kind, a, b);
            break;
        case PG_TAG_COMPLEX:
            if (vec_get(d, &vc, T, 2 * i, &a) == 0 && vec_get(d, &vc, T, 2 * i + 1, &b) == 0) {
                double re, im;
                memcpy(&re, &a, 8);
                memcpy(&im, &b, 8);
                x = PyComplex_FromDoubles(re, im);
            }
            break;
        case PG_TAG_DECIMAL: {
            gser_value_t *sv;
            const char *s;
            size_t len;
            if (gser_list_get(pv, i, &sv) || gser_value_get_str(sv, &s, &len)) {
                bad_std(d, kind, "a Decimal that is not a str");
                break;
            }
            PyObject *str = PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, NULL);
            x = str ? PyObject_CallOneArg(d->s->std.Decimal, str) : NULL;
            Py_XDECREF(str);
            if (!x)
                std_refused(d, kind);
            break;
        }
        case PG_TAG_UUID: x = make_uuid(d, kind, (const unsigned char *)bytes + 16 * i, d->s->std.SafeUUID_unknown); break;
        case PG_TAG_INT:
            if (vec_get(d, &lens, T, i, &a) < 0)
                break;
            if (a <= 0 || (uint64_t)a > nbytes - at) {
                bad_std(d, kind, "int lengths that do not fit the bytes");
                break;
            }
            x = pg_long_from_le((const unsigned char *)bytes + at, (size_t)a, true);
            at += (size_t)a;
            break;
        }
        if (!x)
            goto fail;
        if (tuple)
            PyTuple_SET_ITEM(seq, (Py_ssize_t)i, x);
        else
            PyList_SET_ITEM(seq, (Py_ssize_t)i, x);
    }
    if (kind == PG_TAG_INT && at != nbytes) {
        bad_std(d, kind, "int lengths that do not fit the bytes");
        goto fail;
    }
    d->path.len--;
    Py_XDECREF(tz);
    return seq;
fail:
    Py_XDECREF(tz);
    Py_XDECREF(seq);
    return NULL;
}

/* A tuple of a "python.tree" whose first item is a uint: (tag, fields...). */
static PyObject *dec_std(dec_t *d, gser_value_t *v, gser_value_t *first, size_t n, int depth)
{
    uint64_t tag = 0;
    if (gser_value_get_uint(first, &tag))
        return bad_std(d, tag, "a bad tag");
    if (dt_ready() < 0)
        return NULL;
    if (tag >= PG_TAG_DATETIME && pg_std_ready(d->s) < 0) /* ZoneInfo, Decimal, UUID, Fraction */
        return NULL;
    static const unsigned char fields[PG_TAG_COUNT] = {
        [PG_TAG_INT] = 2,      [PG_TAG_COMPLEX] = 3,  [PG_TAG_SET] = 2,    [PG_TAG_FROZENSET] = 2,
        [PG_TAG_DICT] = 3,     [PG_TAG_DATETIME] = 3, [PG_TAG_DATE] = 2,   [PG_TAG_TIME] = 3,
        [PG_TAG_TIMEDELTA] = 3, [PG_TAG_TZ] = 3,      [PG_TAG_ZONEINFO] = 2, [PG_TAG_DECIMAL] = 2,
        [PG_TAG_UUID] = 3,     [PG_TAG_FRACTION] = 3, [PG_TAG_RANGE] = 4,  [PG_TAG_SLICE] = 4,
        [PG_TAG_ELLIPSIS] = 1,
    };
    if (tag >= PG_TAG_COUNT)
        return bad_std(d, tag, "an unknown tag");
    if (tag != PG_TAG_TUPLE && tag != PG_TAG_PACKED && n != fields[tag])
        return bad_std(d, tag, "the wrong number of fields");
    PyObject *a = NULL, *b = NULL, *c = NULL, *x = NULL;
    int64_t i1 = 0, i2 = 0;
    switch (tag) {
    case PG_TAG_TUPLE: {
        PyObject *t = PyTuple_New((Py_ssize_t)(n - 1));
        if (!t)
            return NULL;
        gser_kind_t kind;
        const void *data;
        size_t count;
        if (gser_list_get_array(v, &kind, &data, &count) == GSER_OK && count == n) {
            if (dec_array(t, true, kind, (const unsigned char *)data + 8, count - 1) < 0)
                Py_CLEAR(t);
            return t;
        }
        int slot = d->path.len++;
        d->path.seg[slot].key = NULL;
        for (size_t i = 1; i < n; i++) {
            d->path.seg[slot].index = (Py_ssize_t)(i - 1);
            gser_value_t *item;
            gser_status_t st = gser_list_get(v, i, &item);
            PyObject *y = st ? fail_st(d, st, "gser_list_get") : dec_value(d, item, depth + 1);
            if (!y) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, (Py_ssize_t)(i - 1), y);
        }
        d->path.len--;
        return t;
    }
    case PG_TAG_INT: {
        gser_value_t *f = std_field(d, v, tag, 1, GSER_KIND_BYTES);
        const void *p;
        size_t len;
        if (!f || gser_value_get_bytes(f, &p, &len))
            return f ? bad_std(d, tag, "bad bytes") : NULL;
        if (!len)
            return bad_std(d, tag, "no bytes");
        return pg_long_from_le(p, len, true);
    }
    case PG_TAG_COMPLEX: {
        gser_value_t *re = std_field(d, v, tag, 1, GSER_KIND_FLOAT);
        gser_value_t *im = re ? std_field(d, v, tag, 2, GSER_KIND_FLOAT) : NULL;
        double r = 0, j = 0;
        if (!im || gser_value_get_float(re, &r) || gser_value_get_float(im, &j))
            return NULL;
        return PyComplex_FromDoubles(r, j);
    }
    case PG_TAG_SET:
    case PG_TAG_FROZENSET: {
        gser_value_t *iv = std_field(d, v, tag, 1, -1);
        gser_kind_t ak;
        const void *data;
        size_t count;
        if (!iv)
            return NULL;
        if (gser_value_get_kind(iv) == GSER_KIND_LIST && gser_list_get_array(iv, &ak, &data, &count) == GSER_OK &&
            count == gser_value_get_len(iv) && ak != GSER_KIND_BOOL) {
            /* numbers in a typed array: straight into the set, no list between */
            if (charge_objects(d, count, PG_COST_VALUE) < 0)
                return NULL;
            x = tag == PG_TAG_SET ? PySet_New(NULL) : PyFrozenSet_New(NULL);
            if (x)
                presize_set(d, x, count);
            for (size_t i = 0; x && i < count; i++) {
                uint64_t bits;
                memcpy(&bits, (const unsigned char *)data + 8 * i, 8);
                double f;
                memcpy(&f, &bits, 8);
                PyObject *y = ak == GSER_KIND_FLOAT ? PyFloat_FromDouble(f)
                              : ak == GSER_KIND_INT ? PyLong_FromLongLong((long long)(int64_t)bits)
                                                    : PyLong_FromUnsignedLongLong((unsigned long long)bits);
                if (!y || PySet_Add(x, y) < 0)
                    Py_CLEAR(x);
                Py_XDECREF(y);
            }
            return x;
        }
        if (!(a = std_obj(d, v, tag, 1, depth)))
            return NULL;
        if (!PyList_CheckExact(a)) {
            bad_std(d, tag, "the items are not a list");
            break;
        }
        x = tag == PG_TAG_SET ? PySet_New(NULL) : PyFrozenSet_New(NULL);
        if (x)
            presize_set(d, x, (size_t)PyList_GET_SIZE(a));
        for (Py_ssize_t i = 0; x && i < PyList_GET_SIZE(a); i++)
            if (PySet_Add(x, PyList_GET_ITEM(a, i)) < 0) {
                Py_CLEAR(x);
                std_refused(d, tag); /* an item that cannot be hashed */
            }
        break;
    }
    case PG_TAG_DICT: {
        if (!(a = std_obj(d, v, tag, 1, depth)) || !(b = std_obj(d, v, tag, 2, depth)))
            break;
        if (!PyList_CheckExact(a) || !PyList_CheckExact(b)) {
            bad_std(d, tag, "keys or values that are not a list");
            break;
        }
        if (PyList_GET_SIZE(a) != PyList_GET_SIZE(b)) {
            bad_std(d, tag, "not as many keys as values");
            break;
        }
        x = PyDict_New();
        for (Py_ssize_t i = 0; x && i < PyList_GET_SIZE(a); i++)
            if (PyDict_SetItem(x, PyList_GET_ITEM(a, i), PyList_GET_ITEM(b, i)) < 0) {
                Py_CLEAR(x);
                std_refused(d, tag);
            }
        break;
    }
    case PG_TAG_DATETIME:
    case PG_TAG_TIME:
    case PG_TAG_DATE: {
        if (std_i64(d, v, tag, 1, &i1) < 0)
            return NULL;
        gser_value_t *tv = tag == PG_TAG_DATE ? NULL : std_field(d, v, tag, 2, -1);
        if (tag != PG_TAG_DATE && (!tv || !(a = dec_tz(d, tv, tag, depth))))
            return NULL;
        x = make_datetime(d, tag, i1, a);
        break;
    }
    case PG_TAG_TIMEDELTA:
        if (std_i64(d, v, tag, 1, &i1) < 0 || std_i64(d, v, tag, 2, &i2) < 0)
            return NULL;
        return make_delta(d, tag, i1, i2);
    case PG_TAG_TZ: {
        if (std_i64(d, v, tag, 1, &i1) < 0)
            return NULL;
        gser_value_t *nv = std_field(d, v, tag, 2, -1);
        if (!nv)
            return NULL;
        gser_kind_t nk = gser_value_get_kind(nv);
        if (nk != GSER_KIND_NIL && nk != GSER_KIND_STR)
            return bad_std(d, tag, "a name that is not a str");
        if (i1 <= -86400LL * 1000000 || i1 >= 86400LL * 1000000)
            return bad_std(d, tag, "an offset of a day or more");
        int64_t days = i1 < 0 ? -1 : 0, us = i1 - days * 86400LL * 1000000;
        a = make_delta(d, tag, days, us);
        if (a && nk == GSER_KIND_STR)
            b = dec_value(d, nv, depth + 1);
        if (a && (nk == GSER_KIND_NIL || b))
            x = b ? PyTimeZone_FromOffsetAndName(a, b) : PyTimeZone_FromOffset(a);
        if (a && (nk == GSER_KIND_NIL || b) && !x)
            std_refused(d, tag);
        break;
    }
    case PG_TAG_ZONEINFO:
        if (!std_field(d, v, tag, 1, GSER_KIND_STR) || !(a = std_obj(d, v, tag, 1, depth)))
            return NULL;
        /* ZoneInfo(key) reads the tz database (no code); a key it refuses (a
         * path) is an error of the message. */
        x = PyObject_CallOneArg(d->s->std.ZoneInfo, a);
        if (!x)
            std_refused(d, tag);
        break;
    case PG_TAG_DECIMAL:
        if (!std_field(d, v, tag, 1, GSER_KIND_STR) || !(a = std_obj(d, v, tag, 1, depth)))
            return NULL;
        x = PyObject_CallOneArg(d->s->std.Decimal, a);
        if (!x)
            std_refused(d, tag);
        break;
    case PG_TAG_UUID: {
        gser_value_t *bv = std_field(d, v, tag, 1, GSER_KIND_BYTES);
        const void *p;
        size_t len;
        if (!bv || gser_value_get_bytes(bv, &p, &len) || len != 16)
            return bv ? bad_std(d, tag, "not 16 bytes") : NULL;
        gser_value_t *sv = std_field(d, v, tag, 2, -1);
        if (!sv)
            return NULL;
        if (gser_value_get_kind(sv) == GSER_KIND_NIL) {
            a = Py_NewRef(d->s->std.SafeUUID_unknown);
        } else if (gser_value_get_kind(sv) != GSER_KIND_INT || !(b = dec_value(d, sv, depth + 1))) {
            return b ? NULL : bad_std(d, tag, "is_safe is not None or an int");
        } else if (!(a = PyObject_CallOneArg(d->s->std.SafeUUID, b))) {
            std_refused(d, tag);
            break;
        }
        x = make_uuid(d, tag, p, a);
        break;
    }
    case PG_TAG_FRACTION:
    case PG_TAG_RANGE:
        if (!(a = std_int(d, v, tag, 1, depth)) || !(b = std_int(d, v, tag, 2, depth)) ||
            (tag == PG_TAG_RANGE && !(c = std_int(d, v, tag, 3, depth))))
            break;
        if (tag == PG_TAG_FRACTION && (_PyLong_NumBits(a) / 8 >= PG_FRACTION_MAX_BYTES ||
                                       _PyLong_NumBits(b) / 8 >= PG_FRACTION_MAX_BYTES)) {
            bad_std(d, tag, "a numerator or denominator of 2 KiB or more");
            break;
        }
        if (tag == PG_TAG_RANGE) {
            PyObject *args[3] = {a, b, c};
            x = PyObject_Vectorcall((PyObject *)&PyRange_Type, args, 3, NULL);
        } else { /* in lowest terms, as every writer puts it: a message's fraction is never normalised here */
            const char *why;
            x = pg_fraction_new(d->s, a, b, &why);
            if (!x && why) {
                bad_std(d, tag, why);
                break;
            }
        }
        if (!x)
            std_refused(d, tag);
        break;
    case PG_TAG_SLICE:
        if ((a = std_obj(d, v, tag, 1, depth)) && (b = std_obj(d, v, tag, 2, depth)) &&
            (c = std_obj(d, v, tag, 3, depth)))
            x = PySlice_New(a, b, c);
        break;
    case PG_TAG_ELLIPSIS: return Py_NewRef(Py_Ellipsis);
    case PG_TAG_PACKED: return dec_packed(d, v, n, depth);
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    return x;
}

/* ---- dispatch ------------------------------------------------------------------------ */

PG_HOT static PyObject *dec_value(dec_t *d, gser_value_t *v, int depth)
{
    gser_status_t st = GSER_OK;
    gser_kind_t kind = gser_value_get_kind(v);
    d->cost += kind == GSER_KIND_BUFFER || kind == GSER_KIND_OBJECT || kind == GSER_KIND_SERIALIZED ? PG_COST_BUFFER
                                                                                                      : PG_COST_VALUE;
    if (d->cost > d->budget)
        return pg_path_raise(d->s, d->s->GserError, GSER_ERR_LIMIT_BYTES, &d->path,
                             "the Python objects of this message would take more than %llu bytes (estimated; "
                             "max_expansion times the message's size, plus %llu): a message that costs this much "
                             "more than its own bytes is refused",
                             (unsigned long long)d->budget, (unsigned long long)GSER_EXPANSION_ALLOWANCE);
    switch (kind) {
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
            return pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path, "a str that is not valid UTF-8");
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
    case GSER_KIND_SERIALIZED: return dec_object(d, v, depth);
    }
    if (st)
        return fail_st(d, st, "gser_value_get_*");
    return pg_path_raise(d->s, d->s->GserError, GSER_ERR_FORMAT, &d->path, "a value of unknown kind %d",
                         (int)gser_value_get_kind(v));
}

PyObject *pg_decode(pg_decode_ctx_t *dc, gser_value_t *root)
{
    dec_t d;
    d.dc = dc;
    d.s = dc->owner->state;
    d.path.len = 0;
    d.cost = 0;
    d.ext = false;
    /* The same bound as the core's: max_expansion times the message's size. */
    gser_limits_t lim = GSER_LIMITS_INIT;
    uint64_t size = 0;
    for (size_t i = 0; i < dc->nframes; i++)
        size += dc->frames[i].size;
    if (gser_context_get_limits(pg_ctx, &lim) != GSER_OK || !lim.max_expansion)
        lim.max_expansion = 64;
    d.budget = size > (UINT64_MAX - GSER_EXPANSION_ALLOWANCE) / lim.max_expansion
                   ? UINT64_MAX
                   : size * lim.max_expansion + GSER_EXPANSION_ALLOWANCE;
    return dec_value(&d, root, 1);
}
