/* The module's device allocator: a Python function, or the backend's own.
 *
 *   set_device_allocator(fn)   fn(size) -> an object with __cuda_array_interface__
 *                               whose memory gser uses; None = the backend's pool
 *   device_allocation(ptr)      (object, size) of the allocation at ptr, or None
 *
 * The module's context is created with this allocator (pg_allocator), so
 * every piece of device memory gser allocates in this process (received
 * device frames, device=True restores, packed frames) comes from the user's
 * function once one is set: gser keeps the object while it uses the memory
 * and drops it when done, as it would free the memory. Memory allocated
 * before the function was set (or changed) is given back to where it came
 * from. The calls may come from any thread, with or without the GIL.
 *
 * Its state is the process's, as the context it serves is (pygser.h,
 * pg_ctx): the core calls the trampolines with no module at hand, so what
 * they need lives here, set by set_device_allocator and read under the GIL
 * (or, for the two atomics, without it).
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The backend's own allocator: a context of the same backend, without one. */
static gser_context_t *g_backend;
static PyObject *g_fn;     /* the user's function, or NULL */
static PyObject *g_allocs; /* dict: ptr -> list of (object, size), objects gser still uses */
/* The address given for an empty allocation whose object has no pointer. */
static char g_empty[1];
/* Read without the GIL: with no function set and no Python allocation alive,
 * the backend's allocator serves a thread that does not hold the GIL
 * without taking it. */
static atomic_bool g_have_fn;
static atomic_long g_live;

/* The pointer and byte size of an object's __cuda_array_interface__. */
static int cai_extent(PyObject *obj, unsigned long long *ptr, unsigned long long *nbytes)
{
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (!cai)
        return -1;
    int rc = -1;
    PyObject *data = PyDict_Check(cai) ? PyDict_GetItemString(cai, "data") : NULL;
    PyObject *shape = PyDict_Check(cai) ? PyDict_GetItemString(cai, "shape") : NULL;
    PyObject *typestr = PyDict_Check(cai) ? PyDict_GetItemString(cai, "typestr") : NULL;
    if (!data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) < 1 || !shape || !PyTuple_Check(shape) || !typestr ||
        !PyUnicode_Check(typestr)) {
        PyErr_SetString(PyExc_TypeError, "gser: the device allocator returned an object whose "
                                         "__cuda_array_interface__ lacks data, shape or typestr");
        goto done;
    }
    *ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
    if (PyErr_Occurred())
        goto done;
    const char *ts = PyUnicode_AsUTF8(typestr);
    if (!ts)
        goto done;
    unsigned long long n = strlen(ts) > 2 ? strtoull(ts + 2, NULL, 10) : 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        unsigned long long d = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape, i));
        if (PyErr_Occurred())
            goto done;
        n *= d;
    }
    *nbytes = n;
    rc = 0;
done:
    Py_DECREF(cai);
    return rc;
}

/* Call the user's function for size bytes; GIL held. */
static gser_status_t py_alloc(PyObject *fn, size_t size, void **ptr)
{
    PyObject *obj = PyObject_CallFunction(fn, "n", (Py_ssize_t)size);
    unsigned long long p = 0, nbytes = 0;
    if (!obj || cai_extent(obj, &p, &nbytes) < 0)
        goto fail;
    if (nbytes < size || (!p && size)) {
        PyErr_Format(PyExc_ValueError, "gser: the device allocator returned %llu bytes at %#llx for a %zu-byte "
                     "allocation", nbytes, p, size);
        goto fail;
    }
    void *at = p ? (void *)(uintptr_t)p : (void *)g_empty;
    PyObject *key = PyLong_FromVoidPtr(at);
    PyObject *entry = key ? Py_BuildValue("(On)", obj, (Py_ssize_t)size) : NULL;
    PyObject *list = entry ? PyDict_GetItemWithError(g_allocs, key) : NULL;
    int rc = -1;
    if (entry && !list && !PyErr_Occurred()) {
        list = PyList_New(0);
        if (list && PyDict_SetItem(g_allocs, key, list) == 0)
            Py_DECREF(list); /* the dict holds it */
        else
            Py_CLEAR(list);
    }
    if (list && (rc = PyList_Append(list, entry)) == 0)
        atomic_fetch_add(&g_live, 1);
    Py_XDECREF(entry);
    Py_XDECREF(key);
    Py_DECREF(obj);
    if (rc < 0)
        goto fail_noobj;
    *ptr = at;
    return GSER_OK;
fail:
    Py_XDECREF(obj);
fail_noobj:
    /* gser reports a failed allocation by its status; what the function
     * raised is shown, as an exception in a callback is. */
    PyErr_WriteUnraisable(fn);
    return GSER_ERR_NO_MEMORY;
}

static gser_status_t trampoline_alloc(void *user, size_t size, void *stream, void **ptr)
{
    (void)user;
    if (!atomic_load(&g_have_fn) || !Py_IsInitialized())
        return gser_device_alloc(g_backend, size, stream, ptr);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = g_fn ? Py_NewRef(g_fn) : NULL;
    if (fn) {
        PyObject *et, *ev, *etb; /* a caller may be raising (a message dying in an unwind) */
        PyErr_Fetch(&et, &ev, &etb);
        gser_status_t st = py_alloc(fn, size, ptr);
        Py_DECREF(fn);
        PyErr_Restore(et, ev, etb);
        PyGILState_Release(g);
        /* Python libraries (RMM, Numba) allocate on CUDA's legacy default
         * stream: the memory is ready for gser's streams once that stream
         * is, as Dask's ucx:// synchronizes it before receiving. */
        if (!st && pg_ctx && strcmp(gser_context_get_device_backend(pg_ctx), "cuda") == 0)
            (void)gser_stream_wait(pg_ctx, (void *)(uintptr_t)1 /* cudaStreamLegacy; a failure shows later */);
        return st;
    }
    PyGILState_Release(g);
    return gser_device_alloc(g_backend, size, stream, ptr);
}

static void trampoline_free(void *user, void *ptr, size_t size, void *stream)
{
    (void)user;
    if (atomic_load(&g_live) == 0 || !Py_IsInitialized()) {
        gser_device_free(g_backend, ptr, size, stream);
        return;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *entry = NULL;
    if (g_allocs && PyDict_GET_SIZE(g_allocs)) {
        PyObject *key = PyLong_FromVoidPtr(ptr);
        PyObject *list = key ? PyDict_GetItemWithError(g_allocs, key) : NULL;
        if (list && PyList_GET_SIZE(list)) {
            Py_ssize_t last = PyList_GET_SIZE(list) - 1;
            entry = Py_NewRef(PyList_GET_ITEM(list, last));
            atomic_fetch_sub(&g_live, 1);
            if (PyList_SetSlice(list, last, last + 1, NULL) < 0 || (last == 0 && PyDict_DelItem(g_allocs, key) < 0))
                PyErr_WriteUnraisable(NULL);
        }
        if (PyErr_Occurred())
            PyErr_WriteUnraisable(NULL);
        Py_XDECREF(key);
    }
    if (!entry) {
        PyErr_Restore(et, ev, etb);
        PyGILState_Release(g);
        gser_device_free(g_backend, ptr, size, stream);
        return;
    }
    /* Freed in stream order by gser: work queued on stream may still use the
     * memory, and the object frees it at once when dropped. */
    Py_BEGIN_ALLOW_THREADS
    (void)gser_stream_wait(pg_ctx, stream);
    Py_END_ALLOW_THREADS
    Py_DECREF(entry);
    PyErr_Restore(et, ev, etb);
    PyGILState_Release(g);
}

static gser_allocator_t g_allocator = {
    .size = sizeof(gser_allocator_t),
    .alloc = trampoline_alloc,
    .free = trampoline_free,
};

const gser_allocator_t *pg_allocator_prepare(void)
{
    if (!g_backend) {
        gser_status_t st = gser_context_create(NULL, &g_backend);
        if (st) {
            const char *d = gser_context_get_last_error(NULL);
            PyErr_Format(st == GSER_ERR_NO_MEMORY ? PyExc_MemoryError : PyExc_RuntimeError,
                         "gser: cannot create a context: %s", *d ? d : gser_status_str(st));
            return NULL;
        }
    }
    if (!g_allocs && !(g_allocs = PyDict_New()))
        return NULL;
    return &g_allocator;
}

PyDoc_STRVAR(set_device_allocator_doc,
             "set_device_allocator(fn) -> the previous fn (or None)\n\n"
             "Where gser allocates device memory in this process (received device frames,\n"
             "loads/from_bytes(device=True), packing): fn(size) returns an object with\n"
             "__cuda_array_interface__ of at least size bytes (rmm.DeviceBuffer(size=size),\n"
             "a Numba or CuPy array), which gser keeps while it uses the memory. None: the\n"
             "device backend's own pool.");

static PyObject *py_set_device_allocator(PyObject *self, PyObject *fn)
{
    (void)self;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "gser.set_device_allocator: expected a callable or None, got %.100s",
                     Py_TYPE(fn)->tp_name);
        return NULL;
    }
    PyObject *old = g_fn ? g_fn : Py_NewRef(Py_None);
    g_fn = fn == Py_None ? NULL : Py_NewRef(fn);
    atomic_store(&g_have_fn, g_fn != NULL);
    return old;
}

PyDoc_STRVAR(device_allocation_doc,
             "device_allocation(ptr) -> (object, size) or None\n\n"
             "The object set_device_allocator's function returned for the allocation gser\n"
             "made at ptr (an int) and still uses, with the size gser asked for; None when\n"
             "the memory at ptr is not such an allocation.");

static PyObject *py_device_allocation(PyObject *self, PyObject *arg)
{
    (void)self;
    void *p = PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred())
        return NULL;
    PyObject *key = PyLong_FromVoidPtr(p ? p : (void *)g_empty);
    if (!key)
        return NULL;
    PyObject *list = g_allocs ? PyDict_GetItemWithError(g_allocs, key) : NULL;
    Py_DECREF(key);
    if (list && PyList_GET_SIZE(list))
        return Py_NewRef(PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1));
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(device_copy_doc,
             "device_copy(dst, src)\n\n"
             "Copy the bytes of src into dst, both device memory with __cuda_array_interface__\n"
             "(contiguous; dst at least as large), and wait for the copy.");

static PyObject *py_device_copy(PyObject *self, PyObject *args)
{
    PyObject *dst, *src;
    if (!PyArg_ParseTuple(args, "OO:device_copy", &dst, &src))
        return NULL;
    unsigned long long dp, dn, sp, sn;
    if (cai_extent(dst, &dp, &dn) < 0 || cai_extent(src, &sp, &sn) < 0)
        return NULL;
    if (dn < sn) {
        PyErr_Format(PyExc_ValueError, "gser.device_copy: %llu bytes do not fit in %llu", sn, dn);
        return NULL;
    }
    if (!sn)
        Py_RETURN_NONE;
    gser_status_t st;
    Py_BEGIN_ALLOW_THREADS
    st = gser_device_memcpy(pg_ctx, (void *)(uintptr_t)dp, GSER_MEMORY_DEVICE, (const void *)(uintptr_t)sp,
                            GSER_MEMORY_DEVICE, (size_t)sn, NULL);
    if (!st)
        st = gser_stream_wait(pg_ctx, NULL);
    Py_END_ALLOW_THREADS
    if (st)
        return pg_raise(pg_state_of_module(self), st, true, "gser.device_copy");
    Py_RETURN_NONE;
}

PyMethodDef pg_allocator_methods[] = {
    {"device_copy", (PyCFunction)py_device_copy, METH_VARARGS, device_copy_doc},
    {"set_device_allocator", (PyCFunction)py_set_device_allocator, METH_O, set_device_allocator_doc},
    {"device_allocation", (PyCFunction)py_device_allocation, METH_O, device_allocation_doc},
    {NULL, NULL, 0, NULL},
};
