/* The module's per-instance state and how code reaches it (see pygser.h).
 *
 * A leaf: it knows nothing of the module's other files.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

gser_context_t *pg_ctx;

pg_state_t *pg_state_of_module(PyObject *m)
{
    return (pg_state_t *)PyModule_GetState(m);
}

pg_state_t *pg_state_of_type(PyTypeObject *t)
{
    /* The module's types are final (no Py_TPFLAGS_BASETYPE): an object's
     * type is the one its module made, whose module PyType_GetModule gives
     * (3.9+; PyType_GetModuleByDef, 3.11+, would also search base classes,
     * which no type here has). */
    PyObject *m = PyType_GetModule(t);
    return m ? pg_state_of_module(m) : NULL;
}

int pg_type_add(PyObject *m, PyType_Spec *spec, PyTypeObject **slot, const char *attr)
{
    /* A heap type inherits object.__new__: the module's types without a
     * constructor of their own are made by the module only. */
    bool has_new = false;
    for (const PyType_Slot *sl = spec->slots; sl->slot; sl++)
        has_new |= sl->slot == Py_tp_new;
#ifdef Py_TPFLAGS_DISALLOW_INSTANTIATION
    if (!has_new)
        spec->flags |= Py_TPFLAGS_DISALLOW_INSTANTIATION;
#endif
    PyTypeObject *t = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    if (!t)
        return -1;
#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION
    if (!has_new) { /* 3.9 has no flag for it */
        t->tp_new = NULL;
        PyType_Modified(t);
    }
#endif
    *slot = t;
    return attr ? PyModule_AddObjectRef(m, attr, (PyObject *)t) : 0;
}

/* Every Python object the state holds, for traverse and clear. */
#define PG_STATE_OBJECTS(s, X)                                                                                 \
    X((s)->GserError) X((s)->Declined) X((s)->GserUnsupported) X((s)->Owner) X((s)->Frame) X((s)->DeviceFrame) \
    X((s)->DeviceArray) X((s)->ArrowArray) X((s)->FlatBytes) X((s)->UcxContext) X((s)->UcxWorker)               \
    X((s)->UcxListener) X((s)->UcxEndpoint) X((s)->UcxRequest) X((s)->reg_by_type) X((s)->reg_by_name)          \
    X((s)->reg_lazy) X((s)->np.ndarray) X((s)->np.require) X((s)->np.descr_to_dtype) X((s)->nps.generic)        \
    X((s)->nps.scalar) X((s)->nps.dtype_to_descr) X((s)->nps.descr_to_dtype) X((s)->nps.descr_of)               \
    X((s)->nps.dtype_of) X((s)->np_dtype_to_descr) X((s)->std.Decimal) X((s)->std.UUID)          \
    X((s)->std.SafeUUID) X((s)->std.SafeUUID_unknown) X((s)->std.Fraction) X((s)->std.ZoneInfo)  \
    X((s)->std.str_int) X((s)->std.str_is_safe) X((s)->std.frac_num) X((s)->std.frac_den) X((s)->std.gcd)             \
    X((s)->std.str_start) X((s)->std.str_stop) X((s)->std.str_step) X((s)->fam_host) X((s)->fam_device_host) X((s)->str_gser)      \
    X((s)->str_compression) X((s)->str_recipient) X((s)->str_gser_device) X((s)->fam_header1)

int pg_state_traverse(pg_state_t *s, visitproc visit, void *arg)
{
#define PG_VISIT(o) Py_VISIT(o);
    PG_STATE_OBJECTS(s, PG_VISIT)
#undef PG_VISIT
    for (int t = 0; t < GSER_DTYPE_COUNT; t++)
        Py_VISIT(s->np.dtypes[t]);
    return 0;
}

void pg_state_clear(pg_state_t *s)
{
#define PG_CLEAR(o) Py_CLEAR(o);
    PG_STATE_OBJECTS(s, PG_CLEAR)
#undef PG_CLEAR
    for (int t = 0; t < GSER_DTYPE_COUNT; t++)
        Py_CLEAR(s->np.dtypes[t]);
}
