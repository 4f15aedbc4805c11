/* Owners of messages (PgOwner): one gser message, its frames, the Python
 * buffers it borrows and the memory to free after it. Everything that
 * points into a message's memory holds its owner (objects.c).
 *
 * A leaf but for the module state (state.c): the encoder, the decoder, the
 * DLPack and Arrow importers and the objects all hold memory here.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>

/* ---- PgOwner ------------------------------------------------------------------- */

static void owner_dealloc(PgOwner *self)
{
    PyObject_GC_UnTrack(self);
    /* Cleanups may run Python code (an Arrow producer's release callback),
     * and the owner may die while an exception is being raised. */
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    /* The frames borrow the message, the message borrows the views. */
    gser_frames_destroy(self->frames);
    self->frames = NULL;
    gser_msg_destroy(self->msg);
    self->msg = NULL;
    for (Py_ssize_t i = self->nviews; i-- > 0;)
        PyBuffer_Release(&self->views[i]);
    PyMem_Free(self->views);
    self->views = NULL;
    self->nviews = 0;
    for (Py_ssize_t i = 0; i < self->ncleanups; i++)
        self->cleanups[i].fn(self->cleanups[i].p);
    PyMem_Free(self->cleanups);
    self->cleanups = NULL;
    self->ncleanups = 0;
    for (Py_ssize_t i = 0; i < self->nfobjs; i++)
        Py_XDECREF(self->fobjs[i].obj);
    PyMem_Free(self->fobjs);
    self->fobjs = NULL;
    self->nfobjs = 0;
    Py_CLEAR(self->refs);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
    PyErr_Restore(et, ev, etb);
}

/* The exporters of the held views (self->views[i].obj) are not visited, on
 * purpose: to the collector they are referenced from outside, so it never
 * puts them in a garbage cycle while this owner still holds their buffers.
 * A memoryview in such a cycle is cleared (memoryview's tp_clear) even with
 * buffers exported: its tp_clear fails ("memoryview has 1 exported buffer"),
 * then drops the managed buffer anyway, which releases the memory the
 * message still reads; the owner's later PyBuffer_Release then works on
 * freed state. The cost: a cycle that runs through an exporter back to
 * this owner is not collected; none is made by gser (an owner is made
 * after the exporters it views, which therefore cannot refer to it). */
static int owner_traverse(PgOwner *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->refs);
    for (Py_ssize_t i = 0; i < self->nfobjs; i++)
        Py_VISIT(self->fobjs[i].obj);
    return 0;
}

static PyType_Slot owner_slots[] = {
    {Py_tp_doc, "Keeps a gser message and the memory it views alive (internal)."},
    {Py_tp_dealloc, (void *)owner_dealloc},
    {Py_tp_traverse, (void *)owner_traverse},
    {0, NULL},
};

static PyType_Spec owner_spec = {
    .name = "gser._gser._Owner",
    .basicsize = sizeof(PgOwner),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = owner_slots,
};

PgOwner *pg_owner_new(pg_state_t *s)
{
    PgOwner *o = PyObject_GC_New(PgOwner, s->Owner);
    if (!o)
        return NULL;
    o->state = s;
    o->msg = NULL;
    o->frames = NULL;
    o->views = NULL;
    o->nviews = 0;
    o->capviews = 0;
    o->refs = NULL;
    o->cleanups = NULL;
    o->ncleanups = 0;
    o->capcleanups = 0;
    o->fobjs = NULL;
    o->nfobjs = 0;
    o->capfobjs = 0;
    PyObject_GC_Track(o);
    return o;
}

int pg_owner_hold_view(PgOwner *o, Py_buffer *view)
{
    if (o->nviews == o->capviews) {
        Py_ssize_t cap = o->capviews ? o->capviews * 2 : 4;
        Py_buffer *nv = PyMem_Realloc(o->views, (size_t)cap * sizeof *nv);
        if (!nv) {
            PyBuffer_Release(view);
            PyErr_NoMemory();
            return -1;
        }
        o->views = nv;
        o->capviews = cap;
    }
    o->views[o->nviews++] = *view;
    return 0;
}

int pg_owner_hold_ref(PgOwner *o, PyObject *obj)
{
    if (!o->refs && !(o->refs = PyList_New(0)))
        return -1;
    return PyList_Append(o->refs, obj);
}

int pg_owner_on_destroy(PgOwner *o, void (*fn)(void *p), void *p)
{
    if (o->ncleanups == o->capcleanups) {
        Py_ssize_t cap = o->capcleanups ? o->capcleanups * 2 : 4;
        pg_cleanup_t *nc = PyMem_Realloc(o->cleanups, (size_t)cap * sizeof *nc);
        if (!nc) {
            fn(p);
            PyErr_NoMemory();
            return -1;
        }
        o->cleanups = nc;
        o->capcleanups = cap;
    }
    o->cleanups[o->ncleanups++] = (pg_cleanup_t){fn, p};
    return 0;
}

int pg_owner_frame_obj(PgOwner *o, const void *ptr, size_t len, PyObject *obj, bool readonly)
{
    if (o->nfobjs == o->capfobjs) {
        Py_ssize_t cap = o->capfobjs ? o->capfobjs * 2 : 4;
        pg_frame_obj_t *nf = PyMem_Realloc(o->fobjs, (size_t)cap * sizeof *nf);
        if (!nf) {
            PyErr_NoMemory();
            return -1;
        }
        o->fobjs = nf;
        o->capfobjs = cap;
    }
    o->fobjs[o->nfobjs++] = (pg_frame_obj_t){ptr, len, Py_XNewRef(obj), readonly};
    return 0;
}

int pg_owner_hold_alloc(PgOwner *o, void *p)
{
    return pg_owner_on_destroy(o, free, p);
}

int pg_owner_add(PyObject *m, pg_state_t *s)
{
    return pg_type_add(m, &owner_spec, &s->Owner, NULL);
}
