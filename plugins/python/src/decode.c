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
 * typed objects (pytypes.c) become what they were sent as.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#include <gser/arrow.h>

typedef struct dec {
    pg_decode_ctx_t *dc;
    pg_state_t *s; /* the owner's */
    pg_path_t path;
    uint64_t cost, budget; /* what the objects built so far cost (estimated), and the most they may */
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

static PyObject *dec_module_type(dec_t *d, pg_type_t t, gser_value_t *tree, int depth)
{
    switch (t) {
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

/* ---- dispatch ------------------------------------------------------------------------ */

static PyObject *dec_value(dec_t *d, gser_value_t *v, int depth)
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
