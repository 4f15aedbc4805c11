/* Private definitions of the gser CPython extension (module gser._gser).
 *
 * The module holds one gser context for the whole process (contexts are
 * thread-safe once set up; nothing is ever registered in this one). Python
 * objects are turned into a gser value tree (encode.c), serialized by the
 * core, and handed back as a header plus memoryviews over the frames; the
 * other way, frames are deserialized by the core and the tree is turned into
 * Python objects (decode.c). Every message lives in a PgOwner object, which
 * everything that points into its memory keeps alive (objects.c). Device
 * buffers come back as gser.DeviceArray (objects.c); Arrow tables, through
 * the Arrow PyCapsule interface and the type "arrow.array" of gser::arrow,
 * as gser.ArrowArray (arrow_capsule.c).
 */
#ifndef GSER_PY_PYGSER_H
#define GSER_PY_PYGSER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include <gser/extension.h>
#include <gser/gser.h>
#include <gser/testing.h> /* in-tree build: the test hooks the Python tests call */

/* Public API of 3.10 that 3.9 lacks, written with 3.9's (as pythoncapi-compat does). */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
static inline PyObject *Py_XNewRef(PyObject *o)
{
    Py_XINCREF(o);
    return o;
}
static inline int PyModule_AddObjectRef(PyObject *m, const char *name, PyObject *value)
{
    Py_XINCREF(value);
    int r = PyModule_AddObject(m, name, value);
    if (r < 0)
        Py_XDECREF(value);
    return r;
}
#define Py_NewRef(o) Py_NewRef((PyObject *)(o))
#define Py_XNewRef(o) Py_XNewRef((PyObject *)(o))
#endif

/* An exact int below 2^60 in magnitude read from its digits, without
 * PyLong_AsLongLongAndOverflow's call and checks: most ints in a message.
 * 3.11 keeps them in ob_digit (two 30-bit digits at most here; the layout
 * is 3.11's own, and 3.12 changed it); 3.12+ says whether one is compact
 * (one digit) and gives its value. false for a larger one. */
static inline bool pg_small_int(PyObject *o, int64_t *v)
{
#if PY_VERSION_HEX < 0x030C0000
    const digit *d = ((PyLongObject *)o)->ob_digit;
    switch (Py_SIZE(o)) {
    case 0: *v = 0; return true;
    case 1: *v = (int64_t)d[0]; return true;
    case -1: *v = -(int64_t)d[0]; return true;
    case 2: *v = (int64_t)d[0] | (int64_t)d[1] << PyLong_SHIFT; return true;
    case -2: *v = -((int64_t)d[0] | (int64_t)d[1] << PyLong_SHIFT); return true;
    default: return false;
    }
#else
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o))
        return false;
    *v = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
    return true;
#endif
}

/* ---- module state (state.c) -------------------------------------------------- */

/* What one instance of the module holds (PEP 489 multi-phase initialisation:
 * module.c's exec slot fills it in). Module functions reach it through the
 * module they are called with, methods through their type's module
 * (pg_state_of_type), and the encoder, decoder and every object made for a
 * message through the message's owner (PgOwner.state: the owner's type holds
 * the module, which holds the state, for as long as the owner lives). */
/* numpy for the decoder. */
typedef struct pg_numpy {
    bool tried;
    PyObject *ndarray; /* numpy.ndarray; NULL when numpy is not installed */
    PyObject *require; /* numpy.require */
    PyObject *descr_to_dtype;
    PyObject *dtypes[GSER_DTYPE_COUNT]; /* numpy.dtype of each gser dtype (NULL: none) */
} pg_numpy_t;

/* numpy for numpy scalars (and the dtype descriptions of typed arrays). */
typedef struct pg_nps {
    bool tried;
    PyObject *generic;        /* numpy.generic; NULL when numpy is absent */
    PyObject *scalar;         /* numpy.core.multiarray.scalar */
    PyObject *dtype_to_descr; /* numpy.lib.format */
    PyObject *descr_to_dtype;
    PyObject *descr_of;       /* cache: dtype -> descr */
    PyObject *dtype_of;       /* cache: descr (str) -> dtype */
} pg_nps_t;

/* The standard library's classes the family carries (stdtypes.c), imported
 * on first use: decimal.Decimal, uuid.UUID (and uuid.SafeUUID with its
 * member unknown), fractions.Fraction, zoneinfo.ZoneInfo. */
typedef struct pg_std {
    bool tried;
    PyObject *Decimal, *UUID, *SafeUUID, *SafeUUID_unknown, *Fraction, *ZoneInfo;
    PyObject *str_int, *str_is_safe; /* interned attribute names */
    /* Fraction's two slot descriptors (NULL where its __slots__ are not
     * exactly ("_numerator", "_denominator"): then its constructor is
     * called) and math.gcd; range's attribute names, interned. */
    PyObject *frac_num, *frac_den, *gcd, *str_start, *str_stop, *str_step;
} pg_std_t;

typedef struct pg_state {
    /* gser.GserError, a subclass of ValueError. */
    PyObject *GserError;
    /* gser.Declined, a subclass of NotImplementedError: gser would be slower. */
    PyObject *Declined;
    /* gser.GserUnsupported, a subclass of GserError and NotImplementedError: a
     * well-formed message holds what Python cannot (status GSER_ERR_UNSUPPORTED). */
    PyObject *GserUnsupported;
    /* The module's types (heap types of this instance). */
    PyTypeObject *Owner, *Frame, *DeviceFrame, *DeviceArray, *ArrowArray, *FlatBytes;
    PyTypeObject *UcxContext, *UcxWorker, *UcxListener, *UcxEndpoint, *UcxRequest;
    /* gser.register_type's registry (pytypes.c): dicts, NULL until first used. */
    PyObject *reg_by_type, *reg_by_name, *reg_lazy;
    /* numpy, imported on first use: what the decoder (decode.c) and the
     * numpy-scalar type (npscalar.c) use. */
    pg_numpy_t np;
    pg_nps_t nps;
    PyObject *np_dtype_to_descr; /* numpy.lib.format.dtype_to_descr, for typed arrays (encode.c) */
    /* The standard library's data types ("python.tree", stdtypes.c). */
    pg_std_t std;
    /* The Dask family's entry points (gser.dask.dumps / loads, module.c):
     * its families, header and context keys, and what it did (dumps,
     * declined, refused, loads), which gser.dask.stats() adds up. */
    PyObject *fam_host, *fam_device_host, *str_gser, *str_compression, *str_recipient, *str_gser_device;
    /* every family header's start, {"gser": 1, "compression": (None,)}:
     * copied for each message (Dask sets keys of the one it gets; the tuple
     * is never changed, only replaced) */
    PyObject *fam_header1;
    unsigned long long fam_count[4];
} pg_state_t;

/* The state of module m (an instance of gser._gser). */
pg_state_t *pg_state_of_module(PyObject *m);
/* The state of the module instance that made type t, one of the module's
 * (final) types. NULL with TypeError set for a type that is not ours. */
pg_state_t *pg_state_of_type(PyTypeObject *t);
/* Make a heap type of module m from spec and store it in *slot (a reference
 * the state keeps); attr: the module attribute it is published as, or NULL.
 * A spec without Py_tp_new cannot be instantiated from Python. */
int pg_type_add(PyObject *m, PyType_Spec *spec, PyTypeObject **slot, const char *attr);
/* The module's m_traverse and m_clear: every reference the state holds. */
int pg_state_traverse(pg_state_t *s, visitproc visit, void *arg);
void pg_state_clear(pg_state_t *s);

/* Flags of every type of the module: immutable and, where a spec has no
 * Py_tp_new, not instantiable (as static types were); 3.9 has neither flag
 * (pg_type_add clears tp_new there). */
#ifdef Py_TPFLAGS_IMMUTABLETYPE
#define PG_TPFLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define PG_TPFLAGS Py_TPFLAGS_DEFAULT
#endif

/* The process's gser context, which every call uses: created when the first
 * module instance is executed, never destroyed (messages and Arrow arrays
 * taken from them may outlive the module at interpreter exit, and device
 * memory the context allocated may still be in use), and never changed after
 * it is set: a C resource of the process, not state of a module instance.
 * Its device backend follows GSER_DEVICE (cuda, emulated, none; default: cuda
 * when a GPU is present). "arrow.array" is registered in it when the module
 * is built with gser::arrow. */
extern gser_context_t *pg_ctx;

/* ---- errors (errors.c) ---------------------------------------------------------- */

/* Raise the Python exception for a failed core call: MemoryError for
 * GSER_ERR_NO_MEMORY, GserError otherwise. With detail, the message is the
 * context's detailed error (it names the failing value's path); without, it
 * is what, followed by the status's description. Returns NULL. */
PyObject *pg_raise(const pg_state_t *s, gser_status_t st, bool detail, const char *what);
/* Raise for status st with message text (a new reference, taken; NULL: an
 * exception is set already): MemoryError for GSER_ERR_NO_MEMORY, GserError
 * otherwise. Returns NULL. */
PyObject *pg_raise_text(const pg_state_t *s, gser_status_t st, PyObject *text);
/* A new instance of exc with message text; for GserError and its subclass
 * GserUnsupported the text is prefixed with the status name and the
 * instance gets the attributes status, status_name and detail. NULL with an
 * exception set on failure. */
PyObject *pg_make_exc(const pg_state_t *s, PyObject *exc, gser_status_t st, PyObject *text);
/* A str of bytes that came from the wire or the core (a type name, an Arrow
 * format string, an error message naming one): UTF-8, with whatever is not
 * written as backslash escapes, so that a hostile name cannot turn an error
 * into a UnicodeDecodeError. NULL (exception set) only without memory. */
PyObject *pg_text(const char *s);
/* 1 if o has the attribute, 0 if not, -1 with an exception set. */
int pg_has_attr(PyObject *o, const char *name);

/* ---- owners (owner.c) and the objects over their memory (objects.c) --------------- */

/* Something to run when an owner dies, after its message and frames. */
typedef struct pg_cleanup {
    void (*fn)(void *p);
    void *p;
} pg_cleanup_t;

/* Owns one gser message (and, after dumps, its frames object), the Python
 * buffers the message borrows, and the objects it must keep alive. */
typedef struct {
    PyObject_HEAD
    pg_state_t *state;  /* of the module that made the owner's type */
    gser_msg_t *msg;
    gser_frames_t *frames;
    Py_buffer *views;   /* held until the owner dies */
    Py_ssize_t nviews;
    Py_ssize_t capviews;
    PyObject *refs;     /* list of objects kept alive, or NULL */
    pg_cleanup_t *cleanups; /* memory the message borrows: freed after it, in order */
    Py_ssize_t ncleanups;
    Py_ssize_t capcleanups;
    struct pg_frame_obj *fobjs; /* objects dumps hands out as frames of their own */
    Py_ssize_t nfobjs;
    Py_ssize_t capfobjs;
} PgOwner;

/* Borrowed memory [ptr, ptr + len) that becomes a frame of its own: dumps
 * hands out obj itself when set (bytes, bytearray, memoryview, as Dask's
 * serializers do), else a memoryview, read-only when the memory is. */
typedef struct pg_frame_obj {
    const void *ptr;
    size_t len;
    PyObject *obj;
    bool readonly;
} pg_frame_obj_t;

/* Add the type _Owner to module m (owner.c). */
int pg_owner_add(PyObject *m, pg_state_t *s);
/* Add the types _Frame, DeviceFrame and DeviceArray to module m (objects.c). */
int pg_objects_add(PyObject *m, pg_state_t *s);

/* A new owner, of module state s, holding nothing yet. */
PgOwner *pg_owner_new(pg_state_t *s);
/* Take over a Py_buffer (it is released when the owner dies). On failure the
 * view is released and -1 returned with an exception set. */
int pg_owner_hold_view(PgOwner *o, Py_buffer *view);
/* Keep obj alive as long as the owner. */
int pg_owner_hold_ref(PgOwner *o, PyObject *obj);
/* Remember borrowed memory [ptr, ptr + len) that should become a frame of its
 * own, handed out as obj (a reference is held) or, obj NULL, as a memoryview
 * read-only as said. Called in encoding order. */
int pg_owner_frame_obj(PgOwner *o, const void *ptr, size_t len, PyObject *obj, bool readonly);
/* Free p (malloc'd) when the owner dies, after its message. On failure p is
 * freed and -1 returned with an exception set. */
int pg_owner_hold_alloc(PgOwner *o, void *p);
/* Run fn(p) when the owner dies, after its frames and message are destroyed
 * (cleanups run in the order they were added). On failure fn(p) runs at once
 * and -1 is returned with an exception set. */
int pg_owner_on_destroy(PgOwner *o, void (*fn)(void *p), void *p);

/* The core's default inline_max, which the module's context keeps: host
 * buffers smaller than this are copied into the header. */
#define PG_INLINE_MAX 256
/* bytes objects of at least this many bytes travel as a frame of their own
 * ("python.bytes"), smaller ones inside the header. */
#define PG_BYTES_FRAME_MIN (64 * 1024)

/* The most dimensions a loaded array may have (numpy's NPY_MAXDIMS is 32). */
#define PG_MAX_NDIM 32

/* A buffer exporter over memory an owner keeps alive: memoryview(frame) and
 * numpy.asarray(frame) view it without copying. format is a static string;
 * ndim 0 means flat bytes. */
PyObject *pg_frame_new(PgOwner *owner, const void *ptr, Py_ssize_t len, bool readonly, const char *format,
                       Py_ssize_t itemsize, int ndim, const int64_t *shape);
/* The same with byte strides (NULL: C order): ptr is element 0, len the
 * items' bytes; the core checked that the elements lie in memory the owner
 * keeps. */
PyObject *pg_frame_new_strided(PgOwner *owner, const void *ptr, Py_ssize_t len, bool readonly, const char *format,
                               Py_ssize_t itemsize, int ndim, const int64_t *shape, const int64_t *strides);

/* A device frame: an object with __cuda_array_interface__ (one-dimensional
 * bytes) over device memory an owner keeps alive. */
PyObject *pg_device_frame_new(PgOwner *owner, const void *ptr, size_t len, int32_t device);

/* A gser.DeviceArray over a device buffer of a loaded message (desc, as
 * gser_value_get_buffer gives it; the device work that filled it must be
 * done): __cuda_array_interface__ with dtype and shape, copy_to_host(). */
PyObject *pg_device_array_new(PgOwner *owner, const gser_buffer_desc_t *desc);

/* ---- Python -> gser (encode.c) ------------------------------------------------ */

/* Where the Dask family encodes: an object on its own (Dask would pickle
 * it whole), or a collection Dask would serialize item by item. */
enum { PG_DECLINE_NONE, PG_DECLINE_OBJECT, PG_DECLINE_COLLECTION };

typedef struct pg_encode_options {
    /* Accept only what comes back as the same Python type: numpy arrays, not
     * other buffer exporters; no device arrays or Arrow tables unless their
     * type is registered (gser.register_type). The Dask family uses this so
     * that Dask falls through for the rest. */
    bool strict;
    /* PG_DECLINE_*: raise gser.Declined (a NotImplementedError) as soon as
     * gser is estimated to be slower than Dask's own path would be. */
    int decline;
    /* gser_serialize_options_t.compression_threshold (0: the default) and
     * .compression_chunk_size (0: whole frames). */
    double compression_threshold;
    size_t compression_chunk_size;
    /* A whole Dask message (gser://; see "dask.msg" in encode.c): (types,
     * callback), borrowed, or NULL. */
    PyObject *dask_parts;
} pg_encode_options_t;

/* Build the tree of obj as the root of owner->msg (created here); *work
 * (when work is not NULL): what serializing it will cost, roughly in values
 * (a buffer or typed object counts PG_WORK_BUFFER). */
int pg_encode(PgOwner *owner, PyObject *obj, const pg_encode_options_t *opts, size_t *work);
#define PG_WORK_BUFFER ((size_t)1 << 20)
/* Serializing or deserializing less than this (values; header and frame
 * bytes) keeps the GIL: releasing and taking it again costs more than the
 * work (0.1-0.2 us a switch, as much as a tiny object's whole dumps). */
#define PG_GIL_WORK 4096
#define PG_GIL_BYTES 65536

/* ---- __cuda_array_interface__ (cai.c) -------------------------------------------------- */

/* What a __cuda_array_interface__ dict says. */
typedef struct pg_cai {
    void *ptr;                       /* element 0 */
    size_t nbytes;                   /* the items' bytes */
    gser_dtype_t dtype;
    uint32_t ndim;
    int64_t shape[GSER_MAX_NDIM];
    int64_t strides[GSER_MAX_NDIM];  /* bytes; meaningful when strided */
    bool strided;                    /* false: C order */
    /* The stream that produces the data (a cudaStream_t: the interface's 1
     * and 2 are CUDA's legacy and per-thread default stream handles); NULL
     * when the dict has no stream, or None: no synchronization needed. */
    void *stream;
} pg_cai_t;

/* Read a __cuda_array_interface__ dict into *out. Masked arrays, and stream
 * 0 (which the interface forbids), are refused. Returns 0, or -1 with *why
 * set and no exception, or -1 with an exception set and *why NULL. */
int pg_cai_read(PyObject *cai, pg_cai_t *out, const char **why);

/* ---- DLPack (dlpack.c) ------------------------------------------------------------ */

/* Borrow obj's tensor through DLPack into *desc (shape and strides have room
 * for GSER_MAX_NDIM; desc->strides is set for a tensor not in C order): host
 * memory for CPU and CUDA host tensors, device memory for CUDA and managed
 * ones. The owner calls the tensor's deleter when the message dies. Returns
 * 0, or -1 with *why set and no exception, or -1 with an exception set and
 * *why NULL. */
int pg_dlpack_encode(PgOwner *owner, PyObject *obj, gser_buffer_desc_t *desc, int64_t *shape, int64_t *strides,
                     const char **why);
/* A "dltensor" capsule lending data (ndim extents of dtype, byte strides or
 * NULL for C order) while keeping keep alive, until the consumer deletes it.
 * BufferError for strides DLPack cannot say (not a multiple of the item size). */
PyObject *pg_dlpack_export(PyObject *keep, void *data, gser_dtype_t dtype, int ndim, const Py_ssize_t *shape,
                           const Py_ssize_t *strides, bool device, int device_id);

/* ---- gser -> Python (decode.c) ------------------------------------------------- */

/* One frame a message was read from (frames[0] is the header). Host buffers
 * of the message become numpy arrays and memoryviews over one exporter per
 * frame (made when first needed), so that a message of a million buffers
 * costs a million small arrays and not a million exporters. */
typedef struct pg_frame_ref {
    const char *data;
    size_t size;
    bool host;        /* device frames hold no host buffers */
    bool readonly;    /* the memory may not be written */
    PyObject *src;    /* the object handed to loads (borrowed: the owner holds it), or NULL */
    PyObject *exp[2]; /* flat exporters over the frame: [0] writable as the frame is, [1] read-only */
    PyObject *mview;  /* memoryview(exp[0]) */
} pg_frame_ref_t;

/* What the decoder needs to know about the frames a message was read from. */
typedef struct pg_decode_ctx {
    PgOwner *owner;
    pg_frame_ref_t *frames;
    size_t nframes;
    size_t *by_addr;    /* host frame indexes sorted by address */
    size_t nby_addr;
    bool any_readonly;  /* some frame is read-only */
    /* Dask's numpy flags: an array that was writable at the sender but views a
     * read-only frame is copied (numpy.require(x, requirements="W")). */
    bool copy_readonly;
    /* A whole Dask message (gser://): the callback that rebuilds its parts
     * (borrowed), or NULL: "dask.msg" and "dask.part" are refused. */
    PyObject *dask_parts;
    bool dask_msg; /* the root was a "dask.msg" */
} pg_decode_ctx_t;

/* Allocate room for nframes frames (zeroed); the caller fills them in. */
int pg_decode_ctx_init(pg_decode_ctx_t *dc, PgOwner *owner, size_t nframes);
/* Frame i is fr, read-only or not, given as the object src (NULL: none of
 * its own; borrowed, the owner holds it). */
void pg_decode_ctx_set_frame(pg_decode_ctx_t *dc, size_t i, const gser_frame_t *fr, bool readonly, PyObject *src);
/* Drop what the decoder made (exporters, the index); the arrays it returned
 * keep what they need. */
void pg_decode_ctx_clear(pg_decode_ctx_t *dc);

PyObject *pg_decode(pg_decode_ctx_t *dc, gser_value_t *root);

/* ---- Arrow (arrow_capsule.c) ---------------------------------------------------------- */

/* Whether the module was built with gser::arrow ("arrow.array"). */
extern const bool pg_have_arrow;
/* Add the type ArrowArray to module m. */
int pg_arrow_add(PyObject *m, pg_state_t *s);

/* Register "arrow.array" in ctx (a no-op without gser::arrow). */
gser_status_t pg_arrow_register(gser_context_t *ctx);

/* Which Arrow PyCapsule method obj has: 2 for __arrow_c_device_array__,
 * 1 for __arrow_c_array__ only, 0 for neither; -1 with an exception set
 * when looking it up failed. */
int pg_arrow_probe(PyObject *obj);

/* Export obj's table through the method pg_arrow_probe found, move it out of
 * the capsules (the producer's structs are left released: release NULL),
 * and make an "arrow.array" value of it in owner->msg. The owner releases
 * the table after the frames and the message. Returns 0, or -1 with *why
 * set and no exception (the producer broke the protocol), or -1 with an
 * exception set and *why NULL. */
int pg_arrow_encode(PgOwner *owner, PyObject *obj, int method, gser_value_t **out, const char **why);

/* Take the table of a deserialized "arrow.array" value into a new
 * gser.ArrowArray (which needs nothing of the message: the table is copied
 * out of the frames, which Python lends, once). On failure NULL, with an
 * exception set and *st_out GSER_OK, or with no exception and *st_out the
 * status of gser_arrow_take_value. */
PyObject *pg_arrow_take(pg_state_t *s, gser_value_t *v, gser_status_t *st_out);

/* ---- the module's gser types and the registry (pytypes.c) ------------------------------- */

/* Typed objects of the module: the encoder builds the sub-tree, the type only
 * hands it over; loaded, the "object" is the received sub-tree (decode.c). */
typedef enum pg_type {
    PG_T_NDARRAY,    /* numpy arrays gser buffers cannot say all of: (buffer, descr, writeable, ndim) */
    PG_T_BYTES,      /* large bytes: a buffer in a frame of its own */
    PG_T_BYTEARRAY,  /* bytearray: a buffer */
    PG_T_MEMORYVIEW, /* memoryview: a buffer (with its format and shape) */
    PG_T_PYTYPE,     /* gser.register_type: (name, what to_gser returned) */
    PG_T_NPSCALAR,   /* numpy scalars: (dtype description, the item's bytes) */
    PG_T_TREE,       /* a value holding the standard types below: tuples starting with a uint tag */
    PG_T_DASK_MSG,   /* a whole Dask message on gser:// (the root): its tree */
    PG_T_DASK_PART,  /* its Serialize/Serialized (0) and ToPickle/Pickled (1) parts: (kind, header, frames...) */
    PG_T_COUNT
} pg_type_t;

extern const char *const pg_type_names[PG_T_COUNT];
/* Register the types in ctx, for the families "device" and "host". */
gser_status_t pg_types_register(gser_context_t *ctx);
/* Which of the module's types name is; -1 if none. */
int pg_type_find(const char *name);
/* A typed object of type t whose sub-tree is tree (a value of msg). */
gser_status_t pg_type_new(gser_msg_t *msg, pg_type_t t, gser_value_t *tree, gser_value_t **out);

/* The registration of exactly type t (a new ref to (name, to_gser, from_gser))
 * or of name (a new ref to (cls, to_gser, from_gser)), running a lazy loader
 * for the top-level module first if one is registered: 1 found, 0 not, -1
 * with an exception set. */
int pg_registry_lookup_type(pg_state_t *s, PyTypeObject *t, PyObject **entry);
int pg_registry_lookup_name(pg_state_t *s, PyObject *name, PyObject **entry);
/* register_type, unregister_type, register_lazy, registered. */
extern PyMethodDef pg_registry_methods[];

/* ---- numpy scalars (npscalar.c) ------------------------------------------------------ */

/* check: 1 if o is one (numpy.generic). encode: the "numpy.scalar"
 * sub-tree; -1 with why set (a NotImplementedError reason, no exception) or
 * an exception. decode: the scalar, or NULL with why set (a malformed
 * object) or an exception. */
int pg_npscalar_check(pg_state_t *s, PyObject *o);
int pg_npscalar_encode(pg_state_t *s, gser_msg_t *msg, PyObject *o, const char **why, gser_value_t **tree_out);
PyObject *pg_npscalar_decode(pg_state_t *s, PyObject *descr, const void *p, size_t n, const char **why);
/* str, int, and lists and tuples of them, as gser values (dtype descriptions). */
int pg_encode_plain(pg_state_t *s, gser_msg_t *msg, PyObject *o, gser_value_t **out);

/* ---- the standard data types ("python.tree": encode.c, decode.c, stdtypes.c) -------------- */

/* Inside a "python.tree" object's sub-tree, a tuple whose first item is a
 * uint (never an int: the core keeps the two kinds apart) is one of these
 * (docs/wire-format.md, "Python's standard types"): (tag, fields...). */
typedef enum pg_tag {
    PG_TAG_TUPLE = 0,     /* (0, items...): a user tuple whose first item is a uint */
    PG_TAG_INT = 1,       /* (1, bytes): an int beyond 64 bits, little-endian two's complement */
    PG_TAG_COMPLEX = 2,   /* (2, real, imag) */
    PG_TAG_SET = 3,       /* (3, [items]) */
    PG_TAG_FROZENSET = 4, /* (4, [items]) */
    PG_TAG_DICT = 5,      /* (5, [keys], [values]): a dict with a key that is not a scalar */
    PG_TAG_DATETIME = 6,  /* (6, packed fields, tz) */
    PG_TAG_DATE = 7,      /* (7, packed fields) */
    PG_TAG_TIME = 8,      /* (8, packed fields, tz) */
    PG_TAG_TIMEDELTA = 9, /* (9, days, microseconds of the day) */
    PG_TAG_TZ = 10,       /* (10, offset in microseconds, name or None): datetime.timezone */
    PG_TAG_ZONEINFO = 11, /* (11, key): zoneinfo.ZoneInfo(key) */
    PG_TAG_DECIMAL = 12,  /* (12, str) */
    PG_TAG_UUID = 13,     /* (13, 16 bytes big-endian, is_safe: None or int) */
    PG_TAG_FRACTION = 14, /* (14, numerator, denominator) */
    PG_TAG_RANGE = 15,    /* (15, start, stop, step) */
    PG_TAG_SLICE = 16,    /* (16, start, stop, step) */
    PG_TAG_ELLIPSIS = 17, /* (17,) */
    PG_TAG_PACKED = 18,   /* (18, kind tag, tuple, payload...): a list of one kind */
    /* Kinds of packed lists only: */
    PG_TAG_SCALARS = 19,  /* mixed None, bool, int, float, str, Ellipsis (and others aside) */
    PG_TAG_RECORDS = 20,  /* dicts with the same str keys */
    PG_TAG_ROWS = 21,     /* tuples of one length */
    PG_TAG_COUNT
} pg_tag_t;

/* The item codes of a packed list of mixed scalars (PG_TAG_SCALARS). */
enum { PG_SC_NONE, PG_SC_FALSE, PG_SC_TRUE, PG_SC_INT, PG_SC_FLOAT, PG_SC_STR, PG_SC_UINT, PG_SC_OTHER, PG_SC_ELLIPSIS };

/* The most bytes of a Fraction's numerator or denominator: rebuilding one
 * normalizes it (a gcd, quadratic in the size), so a hostile message could
 * otherwise cost seconds per item. 2 KiB: about 4,900 decimal digits,
 * Python's own int_max_str_digits bound is 4,300. */
#define PG_FRACTION_MAX_BYTES 2048

/* Import the classes of pg_std_t (once): 0, or -1 with an exception set. */
int pg_std_ready(pg_state_t *s);
/* A Fraction's numerator and denominator (exact ints, new references): 0,
 * or -1 with an exception set. o is exactly fractions.Fraction. */
int pg_fraction_parts(pg_state_t *s, PyObject *o, PyObject **num, PyObject **den);
/* fractions.Fraction(num, den) for exact ints already in lowest terms with
 * den > 0, without the constructor's parsing and gcd division; NULL with
 * *why set and no exception where they are not (a message's fields never
 * normalised), NULL with an exception set for anything else. */
PyObject *pg_fraction_new(pg_state_t *s, PyObject *num, PyObject *den, const char **why);
/* range(start, stop, step) of o (exactly a range), new references: 0, or -1. */
int pg_range_parts(pg_state_t *s, PyObject *o, PyObject *parts[3]);
/* An int of n little-endian two's complement bytes, and the other way: the
 * fewest bytes that hold o (an exact int), in a new bytes object. */
/* The family's direct path for small plain messages (direct.c): 1 with
 * *header_out (the whole message: a header with no data frames) or *out
 * set, 0 when the message is not one it handles (no exception: the general
 * path takes it), -1 with an exception set. */
int pg_direct_dumps(pg_state_t *s, PyObject *obj, PyObject **header_out);
int pg_direct_loads(pg_state_t *s, PyObject *header, PyObject **out);
/* Turn the direct path on or off (tests, benchmarks); the previous setting. */
int pg_direct_set(int on);
void pg_direct_counts(unsigned long long *dumps, unsigned long long *loads);
/* Give a new, empty set or frozenset the table CPython's growth would reach
 * after n distinct adds, at once (stdtypes.c): the bytes of that table, 0
 * where it is left to grow as usual (not fresh, a table over max_bytes, a
 * build whose layout is not known, no memory). The items then go in with
 * PySet_Add; duplicates only leave it emptier. */
size_t pg_set_presize(PyObject *set, size_t n, size_t max_bytes);
PyObject *pg_long_from_le(const unsigned char *p, size_t n, bool is_signed);
PyObject *pg_long_to_le(PyObject *o);
/* Write exact int o as n little-endian two's complement bytes: 0, or -1 (OverflowError). */
int pg_long_write_le(PyObject *o, unsigned char *p, size_t n);
/* The unsigned int of 16 big-endian bytes (a UUID's). */
PyObject *pg_long_from_be16(const unsigned char *p);
/* Pack and unpack datetime fields into an int64 (the layouts in
 * docs/wire-format.md). */
int64_t pg_pack_datetime(int y, int mo, int d, int h, int mi, int s, int us, int fold);
int64_t pg_pack_time(int h, int mi, int s, int us, int fold);
void pg_unpack_datetime(int64_t v, int *y, int *mo, int *d, int *h, int *mi, int *s, int *us, int *fold);
void pg_unpack_time(int64_t v, int *h, int *mi, int *s, int *us, int *fold);

/* ---- pandas columns (strcol.c) ----------------------------------------------------------- */

/* gser._gser._pack_str, _unpack_str. */
extern PyMethodDef pg_strcol_methods[];

/* ---- the device allocator (allocator.c) ------------------------------------------------ */

/* The device allocator the process's context is created with: the user's
 * Python function (set_device_allocator) or the backend's own. NULL with an
 * exception set on failure. */
const gser_allocator_t *pg_allocator_prepare(void);
extern PyMethodDef pg_allocator_methods[];

/* ---- paths (path.c) ------------------------------------------------------------------ */

/* The path of the value being converted: "$", then [i] for list items and
 * .name or [key] for dict values, as the core writes them. */
typedef struct pg_path {
    int len;
    struct {
        PyObject *key; /* borrowed dict key, or NULL for an index */
        Py_ssize_t index;
    } seg[GSER_DEPTH_MAX + 2];
} pg_path_t;

/* A new str with the formatted path, or NULL (exception set). */
PyObject *pg_path_str(const pg_path_t *p);
/* Raise exc with "<path>: <message>" (st is the status when exc is
 * GserError); returns NULL. An exception set already becomes the cause. */
PyObject *pg_path_raise(const pg_state_t *s, PyObject *exc, gser_status_t st, const pg_path_t *p, const char *fmt,
                        ...);

/* ---- shapes and dtypes (dtypes.c) ---------------------------------------------------------- */

/* The bytes of a C-order array of nd extents (checked: none negative, and
 * the product of the non-zero ones, times elem_size, within Py_ssize_t, as
 * numpy requires even of an array with no elements): 0, or -1 with *why set. */
int pg_extents_total(const int64_t *shape, int nd, size_t elem_size, uint64_t *total, const char **why);
/* Whether strides, counted in units of unit (1: elements, or the element
 * size: bytes), lay shape out in C order. */
bool pg_c_contiguous(const int64_t *shape, const int64_t *strides, int nd, int64_t unit);
/* The buffer-protocol format character(s) of a dtype for this machine; NULL
 * for a dtype Python has no format for (bfloat16). */
const char *pg_dtype_format(gser_dtype_t dtype);
/* The __cuda_array_interface__ typestr of a dtype ("<f4", "|u1" for bytes,
 * "|V2" for bfloat16, which numpy has no type for). */
const char *pg_dtype_typestr(gser_dtype_t dtype);
/* The dtype of an array interface typestr ("<f4", "|u1", "|b1", ...);
 * GSER_DTYPE_COUNT if none fits. *big: the typestr says big-endian. */
gser_dtype_t pg_typestr_dtype(const char *ts, bool *big);
/* The integer dtype of size bytes; GSER_DTYPE_COUNT for another size. */
gser_dtype_t pg_int_dtype(Py_ssize_t size, bool is_signed);

/* ---- serializing and deserializing whole messages (serial.c) ----------------------- */

/* Serialize obj (families: None, a str or a sequence of str; compression a
 * gser_compression_t): an owner holding the message and its frames, whose
 * device work is done. flat: for the flattened form, "device" left out of
 * families and "host" always there, so every frame is host memory. NULL
 * with an exception set. */
PgOwner *pg_serialize(pg_state_t *s, PyObject *obj, PyObject *families, const pg_encode_options_t *eo, bool flat,
                      int compression);
/* None, "lz4", "zstd", "auto" -> a gser_compression_t; -1 with ValueError. */
int pg_compression_parse(PyObject *o, int *out);
/* compression=, compression_threshold= (None -> 0, the default, else a
 * number in (0, 1]) and compression_chunk_size= (None or 0 -> whole frames,
 * else GSER_COMPRESS_CHUNK_MIN.._MAX bytes): *codec and eo's two fields; -1
 * with ValueError or TypeError. */
int pg_squeeze_parse(PyObject *compression, PyObject *threshold, PyObject *chunk, int *codec,
                     pg_encode_options_t *eo);

/* Memory for a FlatBytes that gser_serialize_flat fills (flatio.c):
 * pg_flat_mem_alloc is its gser_flat_alloc_fn (no GIL needed), adopt makes
 * the FlatBytes of its first len bytes (taking the memory, also on failure). */
typedef struct pg_flat_mem {
    char *data;
    size_t size;
    size_t maplen;
} pg_flat_mem_t;
void *pg_flat_mem_alloc(void *arg, size_t size);
void pg_flat_mem_free(pg_flat_mem_t *m);
PyObject *pg_flat_bytes_adopt(pg_state_t *s, pg_flat_mem_t *m, size_t len);
/* _device_stats(reset=False): the emulated backend's copy counters, for tests. */
PyObject *pg_device_stats(PyObject *self, PyObject *args);
/* to_bytes: obj serialized straight into a FlatBytes (device buffers copied
 * once, into it). NULL with an exception set. */
PyObject *pg_to_flat_bytes(pg_state_t *s, PyObject *obj, PyObject *families, PyObject *compression,
                           PyObject *threshold, PyObject *chunk);

/* Serialize obj straight into its flattened form, in memory alloc returns
 * (gser_serialize_flat; codec and eo as pg_squeeze_parse gives them). 0, or
 * -1 with an exception set (what alloc returned is the caller's to free). */
int pg_serialize_flat(pg_state_t *s, PyObject *obj, PyObject *families, int codec, const pg_encode_options_t *eo,
                      gser_flat_alloc_fn alloc, void *alloc_arg, size_t *written);

/* A message serialized in the flattened form, ready to be written. */
typedef struct pg_flat {
    PgOwner *owner;          /* holds the message and frames (a reference) */
    const gser_frame_t *fr;  /* its frames */
    size_t n;
    size_t size;             /* the flattened form's bytes */
} pg_flat_t;
/* Serialize obj for the flattened form (compression, threshold and chunk
 * as pg_squeeze_parse reads them) and size it. 0, or -1 with an exception
 * set and nothing held. */
int pg_flat_prepare(pg_state_t *s, PyObject *obj, PyObject *families, PyObject *compression, PyObject *threshold,
                    PyObject *chunk, pg_flat_t *out);

/* Wait for the device copies gser made while deserializing msg. 0, or -1
 * with an exception set. */
int pg_msg_wait(pg_state_t *s, gser_msg_t *msg);
/* The same, keeping the GIL (a small host message: nothing to wait for). */
int pg_msg_wait_gil(pg_state_t *s, gser_msg_t *msg, bool release);
/* The objects of owner->msg, a deserialized message whose frames belong
 * to no Python object (readonly: whether their memory may not be written),
 * once the device copies it carries are done. NULL with an exception set. */
PyObject *pg_decode_msg(PgOwner *owner, bool readonly);
/* The same for a Dask comm: dask_parts (or NULL) rebuilds the parts of a
 * whole Dask message ("dask.msg"), which comes back as (message,). */
PyObject *pg_decode_msg_dask(PgOwner *owner, bool readonly, PyObject *dask_parts);
/* The end of a load into owner: st the status of the deserializing call
 * what (msg its message); the objects as pg_decode_msg gives them, or NULL
 * with an exception set. */
PyObject *pg_load_finish(PgOwner *owner, gser_status_t st, gser_msg_t *msg, bool readonly, const char *what);

/* ---- the UCX bindings (ucx_binding.c) ------------------------------------------------- */

/* Add the gser::ucx types (_UcxContext, _UcxWorker, ...) to the module
 * (only when built with gser::ucx, GSER_PY_HAVE_UCX). */
int pg_ucx_add(PyObject *m, pg_state_t *s);

/* ---- the flattened form (flatio.c) ---------------------------------------------------- */

/* A new gser.FlatBytes (immutable bytes in memory of its own, huge pages
 * from 1 MiB up: what to_bytes returns) of size bytes, left for the caller
 * to write once through *data before it is handed out. NULL with an
 * exception set. */
PyObject *pg_flat_bytes_new(pg_state_t *s, size_t size, char **data);
/* Add FlatBytes and the primitives of gser.dump / gser.load (_dump_fd,
 * _dump_write, _load_fd, _flat_need) to the module. */
int pg_flatio_add(PyObject *m, pg_state_t *s);

#endif /* GSER_PY_PYGSER_H */
