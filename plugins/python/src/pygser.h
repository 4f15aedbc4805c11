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
 * as gser.ArrowArray (arrow.c).
 */
#ifndef GSER_PY_PYGSER_H
#define GSER_PY_PYGSER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include <gser/extension.h>
#include <gser/gser.h>

/* ---- module state (module.c) ---------------------------------------------- */

/* The context every call uses. Created at import, never destroyed: messages
 * and Arrow arrays taken from them may outlive the module object at
 * interpreter exit. Its device backend follows GSER_DEVICE (cuda, emulated,
 * none; default: cuda when a GPU is present). "arrow.array" is registered in
 * it when the module is built with gser::arrow. */
extern gser_context_t *pg_ctx;
/* gser.GserError, a subclass of ValueError. */
extern PyObject *pg_GserError;
/* gser.Declined, a subclass of NotImplementedError: gser would be slower. */
extern PyObject *pg_Declined;
/* gser.GserUnsupported, a subclass of GserError and NotImplementedError: a
 * well-formed message holds what Python cannot (status GSER_ERR_UNSUPPORTED). */
extern PyObject *pg_GserUnsupported;

/* Raise the Python exception for a failed core call: MemoryError for
 * GSER_ERR_NO_MEMORY, GserError otherwise. With detail, the message is the
 * context's detailed error (it names the failing value's path); without, it
 * is what, followed by the status's description. Returns NULL. */
PyObject *pg_raise(gser_status_t st, bool detail, const char *what);
/* A new instance of exc with message text; for GserError the text is
 * prefixed with the status name and the instance gets the attributes
 * status, status_name and detail. NULL with an exception set on failure. */
PyObject *pg_make_exc(PyObject *exc, gser_status_t st, PyObject *text);
/* A str of bytes that came from the wire or the core (a type name, an Arrow
 * format string, an error message naming one): UTF-8, with whatever is not
 * written as backslash escapes, so that a hostile name cannot turn an error
 * into a UnicodeDecodeError. NULL (exception set) only without memory. */
PyObject *pg_text(const char *s);

/* ---- owners and exporters (objects.c) ---------------------------------------- */

/* Something to run when an owner dies, after its message and frames. */
typedef struct pg_cleanup {
    void (*fn)(void *p);
    void *p;
} pg_cleanup_t;

/* Owns one gser message (and, after dumps, its frames object), the Python
 * buffers the message borrows, and the objects it must keep alive. */
typedef struct {
    PyObject_HEAD
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

extern PyTypeObject PgOwner_Type;
extern PyTypeObject PgFrame_Type;
extern PyTypeObject PgDeviceFrame_Type;
extern PyTypeObject PgDeviceArray_Type;

PgOwner *pg_owner_new(void);
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

/* The __cuda_array_interface__ typestr of a dtype ("<f4", "|u1" for bytes,
 * "|V2" for bfloat16, which numpy has no type for). */
const char *pg_dtype_typestr(gser_dtype_t dtype);

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
} pg_encode_options_t;

/* Build the tree of obj as the root of owner->msg (created here). */
int pg_encode(PgOwner *owner, PyObject *obj, const pg_encode_options_t *opts);

/* Read a __cuda_array_interface__ dict: pointer (element 0), length of the
 * items, dtype, shape, byte strides (*strided false for C order; shape and
 * strides have room for GSER_MAX_NDIM) and the stream that produces the data
 * (a cudaStream_t: the interface's 1 and 2 are CUDA's legacy and per-thread
 * default stream handles; NULL when the dict has no stream, or None: no
 * synchronization needed). Masked arrays, and stream 0 (which the interface
 * forbids), are refused. Returns 0, or -1 with *why set and no exception,
 * or -1 with an exception set and *why NULL. */
int pg_cai_read(PyObject *cai, void **ptr, size_t *nbytes, gser_dtype_t *dtype, uint32_t *ndim, int64_t *shape,
                int64_t *strides, bool *strided, void **stream, const char **why);

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
} pg_decode_ctx_t;

/* Allocate room for nframes frames (zeroed); the caller fills them in. */
int pg_decode_ctx_init(pg_decode_ctx_t *dc, PgOwner *owner, size_t nframes);
/* Drop what the decoder made (exporters, the index); the arrays it returned
 * keep what they need. */
void pg_decode_ctx_clear(pg_decode_ctx_t *dc);

PyObject *pg_decode(pg_decode_ctx_t *dc, gser_value_t *root);

/* ---- Arrow (arrow.c) ------------------------------------------------------------------ */

/* Whether the module was built with gser::arrow ("arrow.array"). */
extern const bool pg_have_arrow;
extern PyTypeObject PgArrowArray_Type;

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
PyObject *pg_arrow_take(gser_value_t *v, gser_status_t *st_out);

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
/* numpy scalars (npscalar.c). check: 1 if o is one (numpy.generic). encode:
 * the "numpy.scalar" sub-tree; -1 with why set (a NotImplementedError
 * reason, no exception) or an exception. decode: the scalar, or NULL with
 * why set (a malformed object) or an exception. */
int pg_npscalar_check(PyObject *o);
int pg_npscalar_encode(gser_msg_t *msg, PyObject *o, const char **why, gser_value_t **tree_out);
PyObject *pg_npscalar_decode(PyObject *descr, const void *p, size_t n, const char **why);
/* str, int, and lists and tuples of them, as gser values (dtype descriptions). */
int pg_encode_plain(gser_msg_t *msg, PyObject *o, gser_value_t **out);

/* pandas column helpers (strcol.c): gser._gser._pack_str, _unpack_str. */
extern PyMethodDef pg_strcol_methods[];

int pg_registry_lookup_type(PyTypeObject *t, PyObject **entry);
int pg_registry_lookup_name(PyObject *name, PyObject **entry);
extern PyMethodDef pg_registry_methods[];

/* The device allocator the module's context is created with (allocator.c):
 * the user's Python function (set_device_allocator) or the backend's own.
 * NULL with an exception set on failure. */
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
PyObject *pg_path_raise(PyObject *exc, gser_status_t st, const pg_path_t *p, const char *fmt, ...);

/* ---- shapes (encode.c) ------------------------------------------------------------------ */

/* The bytes of a C-order array of nd extents (checked: none negative, and
 * the product of the non-zero ones, times elem_size, within Py_ssize_t, as
 * numpy requires even of an array with no elements): 0, or -1 with *why set. */
int pg_extents_total(const int64_t *shape, int nd, size_t elem_size, uint64_t *total, const char **why);
/* Whether strides, counted in units of unit (1: elements, or the element
 * size: bytes), lay shape out in C order. */
bool pg_c_contiguous(const int64_t *shape, const int64_t *strides, int nd, int64_t unit);
/* 1 if o has the attribute, 0 if not, -1 with an exception set (arrow.c). */
int pg_has_attr(PyObject *o, const char *name);

/* ---- dtypes (encode.c) ------------------------------------------------------------------ */

/* The buffer-protocol format character(s) of a dtype for this machine; NULL
 * for a dtype Python has no format for (bfloat16). */
const char *pg_dtype_format(gser_dtype_t dtype);

/* ---- shared by the module and the UCX bindings (module.c, ucx.c) ------------------- */

/* Serialize obj as dumps does (families: None, a str or a sequence of
 * str): an owner holding the message and its frames, whose device work is
 * done. NULL with an exception set. */
PgOwner *pg_serialize(PyObject *obj, PyObject *families);
/* pg_serialize with host frames compressed as compression (a gser_compression_t) says. */
PgOwner *pg_serialize_compressed(PyObject *obj, PyObject *families, int compression);
/* The same for the flattened form (to_bytes, dump): "device" left out of
 * families, "host" always there, so every frame is host memory. */
PgOwner *pg_serialize_flat(PyObject *obj, PyObject *families, int compression);
/* None, "lz4", "zstd", "auto" -> a gser_compression_t; -1 with ValueError. */
int pg_compression_parse(PyObject *o, int *out);
/* Raise for status st with message text (a new reference, taken; NULL: an
 * exception is set already): MemoryError for GSER_ERR_NO_MEMORY, GserError
 * otherwise. Returns NULL. */
PyObject *pg_raise_text(gser_status_t st, PyObject *text);
/* The objects of owner->msg, a deserialized message whose frames belong
 * to no Python object (readonly: whether their memory may not be written),
 * once the device copies it carries are done. NULL with an exception set. */
PyObject *pg_decode_msg(PgOwner *owner, bool readonly);
/* Add the gser::ucx types (_UcxContext, _UcxWorker, ...) to the module
 * (ucx.c; only when built with gser::ucx, GSER_PY_HAVE_UCX). */
int pg_ucx_add(PyObject *m);

/* ---- the flattened form (flatio.c) ---------------------------------------------------- */

/* gser.FlatBytes: immutable bytes in memory of its own (huge pages from
 * 1 MiB up), what to_bytes returns. */
extern PyTypeObject PgFlatBytes_Type;
/* A new FlatBytes of size bytes, left for the caller to write once through
 * *data before it is handed out. NULL with an exception set. */
PyObject *pg_flat_bytes_new(size_t size, char **data);
/* Add FlatBytes and the primitives of gser.dump / gser.load (_dump_fd,
 * _dump_write, _load_fd, _flat_need) to the module. */
int pg_flatio_add(PyObject *m);

#endif /* GSER_PY_PYGSER_H */
