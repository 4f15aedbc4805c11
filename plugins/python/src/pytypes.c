/* The module's gser types, and the registry of Python types.
 *
 * Python objects that need more than gser's plain values to come back as
 * themselves travel as typed objects of the types below. The encoder builds
 * an object's sub-tree beforehand, with the GIL, in the message itself; the
 * type's serializer only hands that tree over. The deserializer hands the
 * received sub-tree back as the "object", and decode.c turns it into Python
 * objects once the core is done (the core runs without the GIL).
 *
 * Python types registered with gser.register_type travel as "python.type":
 * (name, what to_gser returned), rebuilt by the receiver's from_gser.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <string.h>

const char *const pg_type_names[PG_T_COUNT] = {
    [PG_T_NDARRAY] = "numpy.ndarray",
    [PG_T_BYTES] = "python.bytes",
    [PG_T_BYTEARRAY] = "python.bytearray",
    [PG_T_MEMORYVIEW] = "python.memoryview",
    [PG_T_PYTYPE] = "python.type",
    [PG_T_NPSCALAR] = "numpy.scalar",
    [PG_T_TREE] = "python.tree",
    [PG_T_DASK_MSG] = "dask.msg",
    [PG_T_DASK_PART] = "dask.part",
};

static gser_status_t tree_serialize(gser_context_t *ctx, const void *obj, gser_writer_t *w, void *user_data)
{
    (void)ctx;
    (void)user_data;
    return gser_writer_set_root(w, (gser_value_t *)obj);
}

/* The sub-tree lives as long as the message being built: decode.c reads it. */
static gser_status_t tree_deserialize(gser_context_t *ctx, gser_reader_t *r, void **obj_out, void *user_data)
{
    (void)ctx;
    (void)user_data;
    gser_value_t *t = gser_reader_get_tree(r);
    if (!t)
        return gser_reader_fail(r, GSER_ERR_FORMAT, "no sub-tree");
    *obj_out = t;
    return GSER_OK;
}

gser_status_t pg_types_register(gser_context_t *ctx)
{
    /* Both built-in families: with "device" first, device buffers inside (a
     * registered CuPy array) stay in device frames; with "host" they are staged. */
    static const char *const families[] = {"device", "host"};
    for (int t = 0; t < PG_T_COUNT; t++) {
        gser_status_t st = gser_type_register(ctx, pg_type_names[t], 1, NULL);
        for (size_t f = 0; st == GSER_OK && f < sizeof families / sizeof *families; f++)
            st = gser_type_add_family(ctx, pg_type_names[t], families[f], tree_serialize, tree_deserialize);
        if (st)
            return st;
    }
    return GSER_OK;
}

int pg_type_find(const char *name)
{
    for (int t = 0; t < PG_T_COUNT; t++)
        if (strcmp(name, pg_type_names[t]) == 0)
            return t;
    return -1;
}

gser_status_t pg_type_new(gser_msg_t *msg, pg_type_t t, gser_value_t *tree, gser_value_t **out)
{
    return gser_msg_new_object(msg, pg_type_names[t], tree, out);
}

/* ---- the registry of Python types ------------------------------------------------------ */

/* The registry lives in the module state: reg_by_type, type -> (name,
 * to_gser, from_gser); reg_by_name, name -> (cls, to_gser, from_gser);
 * reg_lazy, top-level module name -> loader (called once, then forgotten).
 * Changed only with the GIL held. */
static int registry_init(pg_state_t *s)
{
    if (!s->reg_by_type && !(s->reg_by_type = PyDict_New()))
        return -1;
    if (!s->reg_by_name && !(s->reg_by_name = PyDict_New()))
        return -1;
    if (!s->reg_lazy && !(s->reg_lazy = PyDict_New()))
        return -1;
    return 0;
}

/* Run the loader registered for module name top (if any), once. 1 if one ran. */
static int run_lazy(pg_state_t *s, PyObject *top)
{
    if (!s->reg_lazy || !PyDict_GET_SIZE(s->reg_lazy))
        return 0;
    PyObject *loader = PyDict_GetItemWithError(s->reg_lazy, top);
    if (!loader)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(loader);
    int r = PyDict_DelItem(s->reg_lazy, top);
    PyObject *res = r < 0 ? NULL : PyObject_CallNoArgs(loader);
    Py_DECREF(loader);
    if (!res)
        return -1;
    Py_DECREF(res);
    return 1;
}

/* The first component of a dotted name ("cupy" of "cupy._core.core"). */
static PyObject *top_name(PyObject *dotted)
{
    if (!PyUnicode_Check(dotted))
        return NULL;
    Py_ssize_t dot = PyUnicode_FindChar(dotted, '.', 0, PyUnicode_GET_LENGTH(dotted), 1);
    if (dot == -2)
        return NULL;
    return dot < 0 ? Py_NewRef(dotted) : PyUnicode_Substring(dotted, 0, dot);
}

int pg_registry_lookup_type(pg_state_t *s, PyTypeObject *t, PyObject **entry)
{
    *entry = NULL;
    if (!s->reg_by_type)
        return 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        PyObject *e = PyDict_GET_SIZE(s->reg_by_type) ? PyDict_GetItemWithError(s->reg_by_type, (PyObject *)t) : NULL;
        if (e) {
            *entry = Py_NewRef(e);
            return 1;
        }
        if (PyErr_Occurred() || attempt || !PyDict_GET_SIZE(s->reg_lazy))
            return PyErr_Occurred() ? -1 : 0;
        PyObject *mod = PyObject_GetAttrString((PyObject *)t, "__module__");
        if (!mod) {
            PyErr_Clear();
            return 0;
        }
        PyObject *top = top_name(mod);
        Py_DECREF(mod);
        if (!top) {
            PyErr_Clear();
            return 0;
        }
        int ran = run_lazy(s, top);
        Py_DECREF(top);
        if (ran <= 0)
            return ran;
    }
    return 0;
}

int pg_registry_lookup_name(pg_state_t *s, PyObject *name, PyObject **entry)
{
    *entry = NULL;
    if (!s->reg_by_name)
        return 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        PyObject *e = PyDict_GetItemWithError(s->reg_by_name, name);
        if (e) {
            *entry = Py_NewRef(e);
            return 1;
        }
        if (PyErr_Occurred() || attempt)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *top = top_name(name);
        if (!top)
            return PyErr_Occurred() ? -1 : 0;
        int ran = run_lazy(s, top);
        Py_DECREF(top);
        if (ran <= 0)
            return ran;
    }
    return 0;
}

PyDoc_STRVAR(register_type_doc,
"register_type(cls, to_gser, from_gser, *, name=None)\n\n"
"Send objects of exactly type cls as themselves: dumps calls to_gser(obj) and\n"
"sends what it returns (anything gser carries: device arrays through\n"
"__cuda_array_interface__ or DLPack, Arrow tables, numpy arrays, dicts, ...)\n"
"as the typed object \"python.type\" under name (default\n"
"\"<cls.__module__>.<cls.__qualname__>\"); loads calls the receiver's\n"
"from_gser(value) with that value rebuilt (gser.DeviceArray, gser.ArrowArray,\n"
"...). The receiver must have registered the same name (or a loader for its\n"
"top-level module, register_lazy). Registering a type or a name again\n"
"replaces it. Inside what to_gser returns, the Dask family's strict rules do\n"
"not apply: the registration says how the object comes back.");

static PyObject *py_register_type(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"cls", "to_gser", "from_gser", "name", NULL};
    PyObject *cls, *to, *from, *name = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|$O:register_type", kwlist, &cls, &to, &from, &name))
        return NULL;
    if (!PyType_Check(cls))
        return PyErr_Format(PyExc_TypeError, "register_type: cls must be a type, not %s", Py_TYPE(cls)->tp_name);
    if (!PyCallable_Check(to) || !PyCallable_Check(from))
        return PyErr_Format(PyExc_TypeError, "register_type: to_gser and from_gser must be callable");
    if (registry_init(s) < 0)
        return NULL;
    PyObject *n;
    if (name == Py_None) {
        PyObject *mod = PyObject_GetAttrString(cls, "__module__");
        PyObject *qual = mod ? PyObject_GetAttrString(cls, "__qualname__") : NULL;
        n = qual ? PyUnicode_FromFormat("%S.%S", mod, qual) : NULL;
        Py_XDECREF(mod);
        Py_XDECREF(qual);
    } else if (PyUnicode_Check(name) && PyUnicode_GET_LENGTH(name) > 0) {
        n = Py_NewRef(name);
    } else {
        return PyErr_Format(PyExc_TypeError, "register_type: name must be a non-empty str");
    }
    if (!n)
        return NULL;
    /* Forget what cls or name was registered as before. */
    PyObject *old = PyDict_GetItemWithError(s->reg_by_type, cls);
    int r = old ? PyDict_DelItem(s->reg_by_name, PyTuple_GET_ITEM(old, 0)) : PyErr_Occurred() ? -1 : 0;
    if (r == 0) {
        old = PyDict_GetItemWithError(s->reg_by_name, n);
        r = old ? PyDict_DelItem(s->reg_by_type, PyTuple_GET_ITEM(old, 0)) : PyErr_Occurred() ? -1 : 0;
    }
    PyObject *te = r == 0 ? PyTuple_Pack(3, n, to, from) : NULL;
    PyObject *ne = te ? PyTuple_Pack(3, cls, to, from) : NULL;
    if (!ne || PyDict_SetItem(s->reg_by_type, cls, te) < 0 || PyDict_SetItem(s->reg_by_name, n, ne) < 0) {
        Py_XDECREF(te);
        Py_XDECREF(ne);
        Py_DECREF(n);
        return NULL;
    }
    Py_DECREF(te);
    Py_DECREF(ne);
    Py_DECREF(n);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(unregister_type_doc,
"unregister_type(cls_or_name) -> bool\n\n"
"Forget a registration (by type or by name); False if there was none.");

static PyObject *py_unregister_type(PyObject *self, PyObject *key)
{
    pg_state_t *s = pg_state_of_module(self);
    if (registry_init(s) < 0)
        return NULL;
    PyObject *e = PyDict_GetItemWithError(PyUnicode_Check(key) ? s->reg_by_name : s->reg_by_type, key);
    if (!e) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE;
    }
    Py_INCREF(e);
    PyObject *cls = PyUnicode_Check(key) ? PyTuple_GET_ITEM(e, 0) : key;
    PyObject *name = PyUnicode_Check(key) ? key : PyTuple_GET_ITEM(e, 0);
    int r = PyDict_DelItem(s->reg_by_type, cls) < 0 || PyDict_DelItem(s->reg_by_name, name) < 0 ? -1 : 0;
    Py_DECREF(e);
    if (r < 0)
        return NULL;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(register_lazy_doc,
"register_lazy(toplevel, loader)\n\n"
"Call loader() (once, with no arguments) the first time gser meets an object\n"
"whose type's module is in the package toplevel (\"cupy\"), or a \"python.type\"\n"
"name under it (\"cupy.ndarray\"), and not before: loader imports the library\n"
"and calls register_type, as Dask's dask_serialize.register_lazy does.");

static PyObject *py_register_lazy(PyObject *self, PyObject *args)
{
    pg_state_t *s = pg_state_of_module(self);
    PyObject *top, *loader;
    if (!PyArg_ParseTuple(args, "UO:register_lazy", &top, &loader))
        return NULL;
    if (!PyCallable_Check(loader))
        return PyErr_Format(PyExc_TypeError, "register_lazy: loader must be callable");
    if (registry_init(s) < 0 || PyDict_SetItem(s->reg_lazy, top, loader) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_registered(PyObject *self, PyObject *unused)
{
    pg_state_t *s = pg_state_of_module(self);
    (void)unused;
    if (registry_init(s) < 0)
        return NULL;
    return Py_BuildValue("{s:N,s:N}", "types", PyDict_Copy(s->reg_by_name), "lazy", PyDict_Copy(s->reg_lazy));
}

PyMethodDef pg_registry_methods[] = {
    {"register_type", (PyCFunction)(void (*)(void))py_register_type, METH_VARARGS | METH_KEYWORDS,
     register_type_doc},
    {"unregister_type", py_unregister_type, METH_O, unregister_type_doc},
    {"register_lazy", py_register_lazy, METH_VARARGS, register_lazy_doc},
    {"registered", py_registered, METH_NOARGS,
     "registered() -> {\"types\": {name: (cls, to_gser, from_gser)}, \"lazy\": {toplevel: loader}} (copies)."},
    {NULL, NULL, 0, NULL},
};
