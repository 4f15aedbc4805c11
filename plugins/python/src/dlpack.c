/* DLPack in both directions.
 *
 * In: an object with __dlpack__ / __dlpack_device__ (PyTorch, JAX, CuPy,
 * numpy, ...) becomes a buffer: host memory for CPU and pinned CUDA host
 * tensors, device memory for CUDA and managed ones. The tensor is borrowed
 * zero-copy; the consumer (us) calls its deleter when the message dies.
 * Out: gser.DeviceArray.__dlpack__ lends the array to torch.from_dlpack &c.
 *
 * The structs are DLPack's stable C ABI (dlpack.h, "DLManagedTensor", the
 * unversioned capsule every producer still gives when not asked for
 * max_version); Debian has no package with the header.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL: C-contiguous */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define CAP_NEW "dltensor"
#define CAP_USED "used_dltensor"

/* (code, bits) of each dtype, and back. */
static const DLDataType dl_types[GSER_DTYPE_COUNT] = {
    [GSER_DTYPE_BYTES] = {kDLUInt, 8, 1},     [GSER_DTYPE_BOOL] = {kDLBool, 8, 1},
    [GSER_DTYPE_INT8] = {kDLInt, 8, 1},       [GSER_DTYPE_INT16] = {kDLInt, 16, 1},
    [GSER_DTYPE_INT32] = {kDLInt, 32, 1},     [GSER_DTYPE_INT64] = {kDLInt, 64, 1},
    [GSER_DTYPE_UINT8] = {kDLUInt, 8, 1},     [GSER_DTYPE_UINT16] = {kDLUInt, 16, 1},
    [GSER_DTYPE_UINT32] = {kDLUInt, 32, 1},   [GSER_DTYPE_UINT64] = {kDLUInt, 64, 1},
    [GSER_DTYPE_FLOAT16] = {kDLFloat, 16, 1}, [GSER_DTYPE_BFLOAT16] = {kDLBfloat, 16, 1},
    [GSER_DTYPE_FLOAT32] = {kDLFloat, 32, 1}, [GSER_DTYPE_FLOAT64] = {kDLFloat, 64, 1},
    [GSER_DTYPE_COMPLEX64] = {kDLComplex, 64, 1}, [GSER_DTYPE_COMPLEX128] = {kDLComplex, 128, 1},
};

static gser_dtype_t dtype_of(DLDataType t)
{
    if (t.lanes != 1)
        return GSER_DTYPE_COUNT;
    for (int d = GSER_DTYPE_BOOL; d < GSER_DTYPE_COUNT; d++) /* BYTES and UINT8 share uint8: UINT8 wins */
        if (dl_types[d].code == t.code && dl_types[d].bits == t.bits)
            return (gser_dtype_t)d;
    return GSER_DTYPE_COUNT;
}

/* ---- in ------------------------------------------------------------------------------------ */

static void run_deleter(void *p)
{
    DLManagedTensor *mt = p;
    if (mt->deleter)
        mt->deleter(mt);
}

/* The device (type, id) the producer says the tensor is on. */
static int dlpack_device(PyObject *obj, int *type, int *id, const char **why)
{
    PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (!dev)
        return -1;
    int r = -1;
    if (!PyTuple_Check(dev) || PyTuple_GET_SIZE(dev) != 2)
        *why = "__dlpack_device__() did not return a (device_type, device_id) tuple";
    else if ((*type = (int)PyLong_AsLong(PyTuple_GET_ITEM(dev, 0))) == -1 && PyErr_Occurred())
        ;
    else if ((*id = (int)PyLong_AsLong(PyTuple_GET_ITEM(dev, 1))) == -1 && PyErr_Occurred())
        ;
    else
        r = 0;
    Py_DECREF(dev);
    return r;
}

/* Call obj.__dlpack__ and take the tensor out of its capsule: the owner runs
 * its deleter when the message dies. NULL with *why set (the producer broke
 * the protocol) or an exception. */
static DLManagedTensor *dlpack_take(PgOwner *owner, PyObject *obj, bool device, const char **why)
{
    /* CUDA: ordered after the producer's work on the per-thread default
     * stream (DLPack's 2), the one gser_serialize uses by default. CPU
     * producers take no stream. */
    PyObject *cap = NULL, *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (!meth)
        return NULL;
    if (device) { /* stream is keyword-only in the array API */
        PyObject *args = PyTuple_New(0), *kw = Py_BuildValue("{s:i}", "stream", 2);
        if (args && kw)
            cap = PyObject_Call(meth, args, kw);
        Py_XDECREF(args);
        Py_XDECREF(kw);
    } else {
        cap = PyObject_CallNoArgs(meth);
    }
    Py_DECREF(meth);
    if (!cap)
        return NULL;
    DLManagedTensor *mt = PyCapsule_IsValid(cap, CAP_NEW) ? PyCapsule_GetPointer(cap, CAP_NEW) : NULL;
    if (!mt) {
        PyErr_Clear();
        Py_DECREF(cap);
        *why = "__dlpack__() did not return an unused \"dltensor\" capsule";
        return NULL;
    }
    /* Ours from here on: renamed, so the capsule's destructor leaves it to
     * us, and released (deleter) when the message dies or on error. */
    if (PyCapsule_SetName(cap, CAP_USED) < 0) {
        Py_DECREF(cap);
        return NULL;
    }
    Py_DECREF(cap);
    return pg_owner_on_destroy(owner, run_deleter, mt) < 0 ? NULL : mt;
}

int pg_dlpack_encode(PgOwner *owner, PyObject *obj, gser_buffer_desc_t *desc, int64_t *shape, int64_t *strides,
                     const char **why)
{
    *why = NULL;
    int type = 0, id = 0;
    if (dlpack_device(obj, &type, &id, why) < 0)
        return -1;
    bool device = type == kDLCUDA || type == kDLCUDAManaged;
    if (!device && type != kDLCPU && type != kDLCUDAHost) {
        *why = "a DLPack device type other than CPU, CUDA, CUDA host or CUDA managed";
        return -1;
    }
    DLManagedTensor *mt = dlpack_take(owner, obj, device, why);
    if (!mt)
        return -1;
    const DLTensor *t = &mt->dl_tensor;
    gser_dtype_t dtype = dtype_of(t->dtype);
    if (dtype == GSER_DTYPE_COUNT) {
        *why = t->dtype.lanes != 1 ? "vector (lanes > 1) elements" : "an element type gser has no dtype for";
        return -1;
    }
    if (t->ndim <= 0 || t->ndim > GSER_MAX_NDIM) {
        *why = t->ndim ? "more dimensions than gser buffers have"
                       : "zero dimensions (a scalar tensor: reshape it to one element first)";
        return -1;
    }
    memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
    uint64_t total;
    if (pg_extents_total(shape, t->ndim, gser_dtype_size(dtype), &total, why) < 0)
        return -1;
    /* DLPack strides count items; gser's count bytes. C order needs none. */
    bool strided = t->strides && total && !pg_c_contiguous(shape, t->strides, t->ndim, 1);
    int64_t es = (int64_t)gser_dtype_size(dtype);
    for (int d = 0; strided && d < t->ndim; d++) {
        if (__builtin_mul_overflow(t->strides[d], es, &strides[d])) {
            *why = "strides too large";
            return -1;
        }
    }
    char *data = (char *)t->data + t->byte_offset;
    if (!t->data && total) {
        *why = "a NULL data pointer";
        return -1;
    }
    *desc = (gser_buffer_desc_t)GSER_BUFFER_DESC_INIT;
    desc->data = data;
    desc->nbytes = (size_t)total;
    desc->dtype = dtype;
    desc->ndim = (uint32_t)t->ndim;
    desc->shape = shape;
    desc->strides = strided ? strides : NULL;
    desc->memory = device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST;
    desc->device = device ? id : 0;
    return 0;
}

/* ---- out ----------------------------------------------------------------------------------- */

typedef struct lent {
    DLManagedTensor mt;
    PyObject *keep; /* what the memory belongs to */
    int64_t shape[GSER_MAX_NDIM];
    int64_t strides[GSER_MAX_NDIM]; /* in items */
} lent_t;

/* The consumer is done (it may be any thread: DLPack does not say). */
static void lent_delete(DLManagedTensor *mt)
{
    lent_t *l = mt->manager_ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(l->keep);
    PyGILState_Release(g);
    free(l);
}

/* A capsule nobody consumed: its tensor is still ours to delete. */
static void capsule_destroy(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, CAP_NEW))
        return; /* consumed: the consumer deletes it */
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, CAP_NEW);
    if (mt && mt->deleter)
        mt->deleter(mt);
}

PyObject *pg_dlpack_export(PyObject *keep, void *data, gser_dtype_t dtype, int ndim, const Py_ssize_t *shape,
                           const Py_ssize_t *strides, bool device, int device_id)
{
    if ((unsigned)dtype >= GSER_DTYPE_COUNT || ndim < 0 || ndim > GSER_MAX_NDIM) {
        PyErr_SetString(PyExc_ValueError, "gser: this array cannot be described to DLPack");
        return NULL;
    }
    Py_ssize_t es = (Py_ssize_t)gser_dtype_size(dtype);
    for (int d = 0; strides && d < ndim; d++) {
        if (strides[d] % es) {
            PyErr_SetString(PyExc_BufferError, "gser: DLPack strides count items, and these byte strides do not");
            return NULL;
        }
    }
    lent_t *l = calloc(1, sizeof *l);
    if (!l)
        return PyErr_NoMemory();
    for (int d = 0; d < ndim; d++) {
        l->shape[d] = (int64_t)shape[d];
        l->strides[d] = strides ? (int64_t)(strides[d] / es) : 0;
    }
    l->mt.dl_tensor = (DLTensor){.data = data,
                                 .device = {device ? kDLCUDA : kDLCPU, device ? device_id : 0},
                                 .ndim = ndim,
                                 .dtype = dl_types[dtype],
                                 .shape = l->shape,
                                 .strides = strides ? l->strides : NULL,
                                 .byte_offset = 0};
    l->mt.manager_ctx = l;
    l->mt.deleter = lent_delete;
    Py_INCREF(keep);
    l->keep = keep;
    PyObject *cap = PyCapsule_New(&l->mt, CAP_NEW, capsule_destroy);
    if (!cap)
        lent_delete(&l->mt);
    return cap;
}
