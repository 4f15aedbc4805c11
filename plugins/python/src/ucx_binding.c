/* gser._gser's bindings of gser::ucx (include/gser/ucx.h): _UcxContext,
 * _UcxWorker, _UcxListener, _UcxEndpoint and _UcxRequest. gser/ucx.py drives
 * them from an asyncio loop (event fd, arm, progress).
 *
 * Threads: workers are GSER_UCX_THREAD_SERIALIZED, and every gser_ucx call
 * here is made with the GIL held, which serializes them; received frames
 * may be released from any thread (the transport's cache locks).
 *
 * No Python code runs inside a gser_ucx call: completion and accept
 * callbacks (run inside progress, close, cancel and destroy) only record
 * what happened, without allocating Python objects (which could start the
 * garbage collector, whose finalizers could call back into the worker).
 * progress() then hands the completed requests and the accepted endpoints
 * to Python, and releases what the sends held.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#include <structmember.h>

#include <gser/ucx.h>

/* ---- errors ------------------------------------------------------------------------ */

/* Raise for a failed gser_ucx call: the transport's detailed message (or
 * what + the status). Returns NULL. */
static PyObject *ucx_raise(const pg_state_t *s, gser_status_t st, const char *what)
{
    const char *d = gser_ucx_get_last_error();
    return pg_raise_text(s, st, *d ? pg_text(d) : PyUnicode_FromFormat("%s: %s", what, gser_status_str(st)));
}

/* A call on an object closed (or destroyed) here: GSER_ERR_CANCELED, as
 * the transport reports operations on an endpoint closed from this side. */
static PyObject *closed_error(const pg_state_t *s, const char *what)
{
    return pg_raise_text(s, GSER_ERR_CANCELED, PyUnicode_FromFormat("%s: it was closed here", what));
}

/* ---- objects ----------------------------------------------------------------------- */

typedef struct PgUcxWorker PgUcxWorker;
typedef struct PgUcxListener PgUcxListener;
typedef struct PgUcxRequest PgUcxRequest;

/* A worker's listeners and endpoints, so that closing the worker (which
 * destroys their C objects) can let go of their pointers. */
typedef struct pg_child {
    struct pg_child *prev, *next;
    bool listener; /* else an endpoint */
} pg_child_t;

typedef struct {
    PyObject_HEAD
    gser_ucx_context_t *ctx;
} PgUcxContext;

/* An accepted connection not yet handed to Python. */
typedef struct {
    PgUcxListener *listener; /* a reference, taken in the callback (increfs are safe there) */
    gser_ucx_ep_t *ep;
} pg_accepted_t;

struct PgUcxWorker {
    PyObject_HEAD
    gser_ucx_worker_t *w; /* NULL once closed */
    PgUcxContext *context;
    int efd;
    /* completed requests, oldest first; each holds the request's in-flight reference */
    PgUcxRequest *done_head, *done_tail;
    pg_accepted_t *accepted;
    size_t naccepted, cap_accepted;
    pg_child_t children;
    unsigned handled; /* what the last gser_ucx_worker_progress returned */
};

struct PgUcxListener {
    PyObject_HEAD
    pg_child_t link; /* in the worker's children */
    PgUcxWorker *worker;
    gser_ucx_listener_t *l; /* NULL once closed */
    PyObject *user;
    unsigned long long failed; /* handshakes that failed */
    int last_failure;          /* the status of the latest one */
    uint16_t port;
};

typedef struct {
    PyObject_HEAD
    pg_child_t link; /* in the worker's children */
    PgUcxWorker *worker;
    gser_ucx_ep_t *ep; /* NULL once destroyed */
    PyObject *listener; /* the _UcxListener it came from, or None */
    PyObject *user;
} PgUcxEndpoint;

struct PgUcxRequest {
    PyObject_HEAD
    PgUcxRequest *next_done;
    PgUcxWorker *worker;
    gser_ucx_request_t *req;
    PgOwner *owner; /* a send's message and frames, held until it completes */
    PyObject *user;
    gser_status_t status;
    char *detail; /* the transport's message for a failure */
    bool recv;
    bool taken;
};

/* The module state of one of the module's objects (its type's module). */
static pg_state_t *ucx_state(const void *obj)
{
    return pg_state_of_type(Py_TYPE((PyObject *)obj));
}

#define CHILD_OBJ(c, type) ((type *)(void *)((char *)(c)-offsetof(type, link)))

static void child_link(PgUcxWorker *w, pg_child_t *c, bool listener)
{
    c->listener = listener;
    c->next = w->children.next;
    c->prev = &w->children;
    w->children.next->prev = c;
    w->children.next = c;
}

static void child_unlink(pg_child_t *c)
{
    if (!c->next)
        return;
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* ---- _UcxContext ---------------------------------------------------------------------- */

static PyObject *context_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"transports", "peer_timeout_ms", "secret", "net_devices", NULL};
    const char *transports = NULL, *secret = NULL, *net_devices = NULL;
    unsigned int timeout = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$zIzz:_UcxContext", kwlist, &transports, &timeout, &secret,
                                     &net_devices))
        return NULL;
    gser_ucx_context_options_t o = GSER_UCX_CONTEXT_OPTIONS_INIT;
    o.transports = transports;
    o.peer_timeout_ms = timeout;
    o.secret = secret;
    o.net_devices = net_devices;
    gser_ucx_context_t *ctx;
    gser_status_t st = gser_ucx_context_create(&o, &ctx);
    if (st)
        return ucx_raise(pg_state_of_type(type), st, "gser_ucx_context_create");
    PgUcxContext *self = (PgUcxContext *)type->tp_alloc(type, 0);
    if (!self) {
        gser_ucx_context_destroy(ctx);
        return NULL;
    }
    self->ctx = ctx;
    return (PyObject *)self;
}

static void context_dealloc(PgUcxContext *self)
{
    gser_ucx_context_destroy(self->ctx);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *context_caps(PgUcxContext *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(gser_ucx_context_get_caps(self->ctx));
}

static PyGetSetDef context_getset[] = {
    {"caps", (getter)context_caps, NULL, "GSER_UCX_CAP_* bits (1: this UCX moves CUDA memory).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot context_slots[] = {
    {Py_tp_doc, "_UcxContext(*, transports=None, peer_timeout_ms=0, secret=None, net_devices=None): a gser::ucx\n"
                "transport context (gser_ucx_context_create). transports as UCX_TLS lists them."},
    {Py_tp_new, (void *)context_new},
    {Py_tp_dealloc, (void *)context_dealloc},
    {Py_tp_getset, context_getset},
    {0, NULL},
};

static PyType_Spec context_spec = {
    .name = "gser._gser._UcxContext",
    .basicsize = sizeof(PgUcxContext),
    .flags = PG_TPFLAGS,
    .slots = context_slots,
};

/* ---- completions ------------------------------------------------------------------ */

/* Completion callback of every request (inside a gser_ucx call): record, queue. */
static void request_done_cb(gser_ucx_request_t *req, gser_status_t st, void *user_data)
{
    (void)req;
    PgUcxRequest *r = user_data;
    r->status = st;
    if (st != GSER_OK && st != GSER_ERR_CANCELED) {
        const char *d = gser_ucx_get_last_error();
        if (*d)
            r->detail = strdup(d); /* NULL: the status alone is reported */
    }
    PgUcxWorker *w = r->worker;
    r->next_done = NULL;
    if (w->done_tail)
        w->done_tail->next_done = r;
    else
        w->done_head = r;
    w->done_tail = r;
}

/* Accept callback (inside a gser_ucx call): remember the endpoint. */
static void accept_cb(gser_ucx_listener_t *l, gser_ucx_ep_t *ep, gser_status_t st, void *user_data)
{
    (void)l;
    PgUcxListener *pl = user_data;
    if (!ep) {
        pl->failed++;
        pl->last_failure = st;
        return;
    }
    PgUcxWorker *w = pl->worker;
    if (w->naccepted == w->cap_accepted) {
        size_t cap = w->cap_accepted ? 2 * w->cap_accepted : 8;
        pg_accepted_t *n = realloc(w->accepted, cap * sizeof *n);
        if (!n) {
            /* Out of memory: drop the connection; the worker frees the
             * endpoint when it is destroyed (destroying it here is not allowed). */
            gser_ucx_ep_close(ep);
            pl->failed++;
            pl->last_failure = GSER_ERR_NO_MEMORY;
            return;
        }
        w->accepted = n;
        w->cap_accepted = cap;
    }
    Py_INCREF((PyObject *)pl);
    w->accepted[w->naccepted++] = (pg_accepted_t){pl, ep};
}

static PgUcxEndpoint *endpoint_wrap(PgUcxWorker *w, gser_ucx_ep_t *ep, PyObject *listener);

/* Hand what the callbacks recorded to Python: a tuple of accepted
 * _UcxEndpoint objects, then completed _UcxRequest objects, oldest first.
 * Sends let go of their message here, outside any gser_ucx call. Any
 * allocation or release here may run a finalizer that closes the worker,
 * which destroys the endpoints not wrapped yet: w->w is checked each time. */
static PyObject *take_events(PgUcxWorker *w)
{
    /* Detached first, for the same reason. */
    PgUcxRequest *head = w->done_head;
    w->done_head = w->done_tail = NULL;
    pg_accepted_t *acc = w->accepted;
    size_t nacc = w->naccepted;
    w->accepted = NULL;
    w->naccepted = w->cap_accepted = 0;

    Py_ssize_t n = (Py_ssize_t)nacc;
    for (PgUcxRequest *r = head; r; r = r->next_done)
        n++;
    PyObject *out = PyTuple_New(n);
    Py_ssize_t k = 0;
    for (size_t i = 0; i < nacc; i++) {
        PgUcxEndpoint *e = out && w->w ? endpoint_wrap(w, acc[i].ep, (PyObject *)acc[i].listener) : NULL;
        if (e)
            PyTuple_SET_ITEM(out, k++, (PyObject *)e);
        else if (w->w)
            gser_ucx_ep_destroy(acc[i].ep); /* out of memory: drop the connection */
        Py_DECREF((PyObject *)acc[i].listener);
    }
    free(acc);
    while (head) {
        PgUcxRequest *r = head;
        head = r->next_done;
        r->next_done = NULL;
        Py_CLEAR(r->owner);
        if (out)
            PyTuple_SET_ITEM(out, k++, (PyObject *)r); /* the in-flight reference */
        else
            Py_DECREF(r);
    }
    if (out && k < n) { /* endpoints dropped: the filled part (the rest is NULL) */
        PyObject *t = PyTuple_GetSlice(out, 0, k);
        Py_DECREF(out);
        out = t;
    }
    return out;
}

/* ---- compression ----------------------------------------------------------------------------- */

/* A worker's or endpoint's compression, as Dask's distributed.comm.compression
 * names it: "auto" (the default: by transport), None or False (none), "lz4",
 * "zstd". */
static int ucx_compression_parse(PyObject *o, int *out)
{
    const char *s = o && PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (!o || (s && strcmp(s, "auto") == 0))
        *out = GSER_UCX_COMPRESSION_DEFAULT;
    else if (o == Py_None || o == Py_False || (s && strcmp(s, "none") == 0))
        *out = GSER_UCX_COMPRESSION_NONE;
    else if (s && strcmp(s, "lz4") == 0)
        *out = GSER_UCX_COMPRESSION_LZ4;
    else if (s && strcmp(s, "zstd") == 0)
        *out = GSER_UCX_COMPRESSION_ZSTD;
    else {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError,
                         "compression must be \"auto\", None, False, \"lz4\" or \"zstd\" (as Dask's "
                         "distributed.comm.compression), not %R",
                         o);
        return -1;
    }
    return 0;
}

/* ---- _UcxWorker ----------------------------------------------------------------------------- */

static PyObject *worker_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"context", "inline_max", "inline_budget", "staging_chunk", "staging_depth",
                             "recv_cache_bytes", "recv_cache_max_bytes", "max_frames", "max_bytes", "compression",
                             "compression_level", NULL};
    PyObject *context, *compression = NULL;
    gser_ucx_worker_options_t o = GSER_UCX_WORKER_OPTIONS_INIT;
    gser_limits_t lim = GSER_LIMITS_INIT;
    unsigned long long max_bytes = 0;
    pg_state_t *s = pg_state_of_type(type);
    if (!s || !PyArg_ParseTupleAndKeywords(args, kw, "O!|$nnnInnnKOi:_UcxWorker", kwlist, s->UcxContext, &context,
                                     &o.inline_max, &o.inline_budget, &o.staging_chunk, &o.staging_depth,
                                     &o.recv_cache_bytes, &o.recv_cache_max_bytes, &lim.max_frames, &max_bytes,
                                     &compression, &o.compression_level) ||
        ucx_compression_parse(compression, &o.compression) < 0)
        return NULL;
    lim.max_bytes = max_bytes;
    o.thread_mode = GSER_UCX_THREAD_SERIALIZED; /* the GIL serializes the calls */
    o.gser_ctx = pg_ctx;                        /* device frames: the module's backend */
    o.limits = &lim;
    PgUcxWorker *self = (PgUcxWorker *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->children.next = self->children.prev = &self->children;
    self->efd = -1;
    gser_status_t st = gser_ucx_worker_create(((PgUcxContext *)context)->ctx, &o, &self->w);
    if (st == GSER_OK)
        st = gser_ucx_worker_get_efd(self->w, &self->efd);
    if (st) {
        ucx_raise(s, st, "gser_ucx_worker_create");
        Py_DECREF(self);
        return NULL;
    }
    self->context = (PgUcxContext *)Py_NewRef(context);
    return (PyObject *)self;
}

/* Destroy the C worker: its listeners and endpoints go with it (their
 * objects let go of the pointers), requests in flight complete canceled. */
static void worker_close_c(PgUcxWorker *self)
{
    if (!self->w)
        return;
    while (self->children.next != &self->children) {
        pg_child_t *c = self->children.next;
        if (c->listener)
            CHILD_OBJ(c, PgUcxListener)->l = NULL;
        else
            CHILD_OBJ(c, PgUcxEndpoint)->ep = NULL;
        child_unlink(c);
    }
    gser_ucx_worker_destroy(self->w);
    self->w = NULL;
    self->efd = -1;
    /* Accepted endpoints not handed out yet went with the worker. */
    pg_accepted_t *acc = self->accepted;
    size_t nacc = self->naccepted;
    self->accepted = NULL;
    self->naccepted = self->cap_accepted = 0;
    for (size_t i = 0; i < nacc; i++)
        Py_DECREF((PyObject *)acc[i].listener);
    free(acc);
}

static int worker_traverse(PgUcxWorker *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->context);
    for (PgUcxRequest *r = self->done_head; r; r = r->next_done)
        Py_VISIT(r);
    for (size_t i = 0; i < self->naccepted; i++)
        Py_VISIT(self->accepted[i].listener);
    return 0;
}

static void worker_drop_done(PgUcxWorker *self)
{
    PgUcxRequest *r = self->done_head;
    self->done_head = self->done_tail = NULL;
    while (r) {
        PgUcxRequest *next = r->next_done;
        r->next_done = NULL;
        Py_DECREF(r);
        r = next;
    }
}

static int worker_clear(PgUcxWorker *self)
{
    /* Unreachable: its endpoints and listeners are garbage too. Closing it
     * drops the listeners that accepts still refer to. */
    worker_close_c(self);
    worker_drop_done(self);
    return 0;
}

static void worker_dealloc(PgUcxWorker *self)
{
    PyObject_GC_UnTrack(self);
    /* Nothing refers to the worker any more: no listener, endpoint or request in flight. */
    worker_close_c(self);
    worker_drop_done(self);
    Py_CLEAR(self->context);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *worker_fileno(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.fileno");
    return PyLong_FromLong(self->efd);
}

static PyObject *worker_status(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.status");
    gser_status_t st = gser_ucx_worker_get_status(self->w);
    if (st == GSER_OK || st == GSER_INPROGRESS)
        return Py_BuildValue("(iO)", (int)st, Py_None);
    return Py_BuildValue("(is)", (int)st, gser_ucx_get_last_error());
}

static PyObject *worker_check_queue(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.check_queue");
    gser_status_t st = gser_ucx_worker_check_queue(self->w);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_worker_check_queue");
    Py_RETURN_NONE;
}

static PyObject *worker_set_check_fault(PgUcxWorker *self, PyObject *arg)
{
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker._set_check_fault");
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    gser_ucx_worker_set_check_fault(self->w, on);
    Py_RETURN_NONE;
}

static PyObject *worker_arm(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.arm");
    gser_status_t st = gser_ucx_worker_arm(self->w);
    if (st == GSER_OK)
        Py_RETURN_TRUE;
    if (st == GSER_INPROGRESS)
        Py_RETURN_FALSE;
    return ucx_raise(ucx_state(self), st, "gser_ucx_worker_arm");
}

static PyObject *worker_progress(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.progress");
    self->handled = gser_ucx_worker_progress(self->w);
    return take_events(self);
}

static PyObject *worker_close(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    worker_close_c(self);
    return take_events(self);
}

static PyObject *worker_listen(PgUcxWorker *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"address", "port", NULL};
    const char *address = NULL;
    unsigned short port = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zH:listen", kwlist, &address, &port))
        return NULL;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.listen");
    PgUcxListener *l = PyObject_GC_New(PgUcxListener, ucx_state(self)->UcxListener);
    if (!l)
        return NULL;
    l->link.prev = l->link.next = NULL;
    l->worker = (PgUcxWorker *)Py_NewRef((PyObject *)self);
    l->l = NULL;
    l->user = Py_NewRef(Py_None);
    l->failed = 0;
    l->last_failure = 0;
    l->port = 0;
    PyObject_GC_Track(l);
    if (!self->w) { /* a finalizer closed the worker */
        Py_DECREF(l);
        return closed_error(ucx_state(self), "_UcxWorker.listen");
    }
    gser_ucx_listener_options_t o = GSER_UCX_LISTENER_OPTIONS_INIT;
    o.address = address;
    o.port = port;
    o.accept_cb = accept_cb;
    o.user_data = l;
    gser_status_t st = gser_ucx_listener_create(self->w, &o, &l->l);
    if (st) {
        Py_DECREF(l);
        return ucx_raise(ucx_state(self), st, "gser_ucx_listener_create");
    }
    l->port = gser_ucx_listener_get_port(l->l);
    child_link(self, &l->link, true);
    return (PyObject *)l;
}

static PyObject *worker_connect(PgUcxWorker *self, PyObject *args)
{
    const char *host;
    unsigned short port;
    if (!PyArg_ParseTuple(args, "sH:connect", &host, &port))
        return NULL;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.connect");
    gser_ucx_ep_t *ep;
    gser_status_t st = gser_ucx_ep_connect_nb(self->w, host, port, &ep);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_connect_nb");
    PgUcxEndpoint *e = endpoint_wrap(self, ep, Py_None);
    if (!e && self->w)
        gser_ucx_ep_destroy(ep);
    return (PyObject *)e;
}

static PyObject *worker_cache_stats(PgUcxWorker *self, PyObject *unused)
{
    (void)unused;
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.cache_stats");
    gser_ucx_cache_stats_t s = GSER_UCX_CACHE_STATS_INIT;
    gser_status_t st = gser_ucx_worker_get_cache_stats(self->w, &s);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_worker_get_cache_stats");
    return Py_BuildValue("{s:n,s:n,s:K,s:K}", "cached_bytes", (Py_ssize_t)s.cached_bytes, "limit_bytes",
                         (Py_ssize_t)s.limit_bytes, "hits", (unsigned long long)s.hits, "misses",
                         (unsigned long long)s.misses);
}

/* A frame of the worker's receive cache, handed back when its owner dies. */
static void host_frame_release(void *p)
{
    gser_frame_t *f = p;
    f->release((void *)f->data, f->release_arg);
    free(f);
}

static PyObject *worker_alloc_host(PgUcxWorker *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0)
        return PyErr_Format(PyExc_ValueError, "_UcxWorker.alloc_host: %zd bytes", n);
    if (!self->w)
        return closed_error(ucx_state(self), "_UcxWorker.alloc_host");
    gser_frame_t *f = malloc(sizeof *f);
    if (!f)
        return PyErr_NoMemory();
    gser_status_t st = gser_ucx_worker_alloc_host(self->w, (size_t)n, f);
    if (st) {
        free(f);
        return ucx_raise(ucx_state(self), st, "gser_ucx_worker_alloc_host");
    }
    PgOwner *owner = pg_owner_new(ucx_state(self));
    if (!owner) {
        host_frame_release(f);
        return NULL;
    }
    if (pg_owner_on_destroy(owner, host_frame_release, f)) { /* released already */
        Py_DECREF(owner);
        return NULL;
    }
    PyObject *out = pg_frame_new(owner, f->data, n, false, "B", 1, 0, NULL);
    Py_DECREF(owner);
    return out;
}

static PyObject *worker_closed(PgUcxWorker *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->w == NULL);
}

static PyMethodDef worker_methods[] = {
    {"fileno", (PyCFunction)worker_fileno, METH_NOARGS, "The event file descriptor (gser_ucx_worker_get_efd)."},
    {"status", (PyCFunction)worker_status, METH_NOARGS,
     "status() -> (int, str | None): gser_ucx_worker_get_status and, when the worker\n"
     "failed for good, why."},
    {"check_queue", (PyCFunction)worker_check_queue, METH_NOARGS,
     "Start a check of the worker's receive queue (gser_ucx_worker_check_queue)."},
    {"_set_check_fault", (PyCFunction)worker_set_check_fault, METH_O,
     "Tests: the check's message never arrives (gser_ucx_worker_set_check_fault)."},
    {"arm", (PyCFunction)worker_arm, METH_NOARGS,
     "arm() -> bool: True when armed (sleep until the fd is readable), False when\n"
     "events are pending (progress again)."},
    {"progress", (PyCFunction)worker_progress, METH_NOARGS,
     "progress() -> tuple: one gser_ucx_worker_progress, then the endpoints accepted\n"
     "and the requests completed since the last call, oldest first."},
    {"close", (PyCFunction)worker_close, METH_NOARGS,
     "close() -> tuple: destroy the worker, its listeners and endpoints; returns the\n"
     "events still due (requests in flight complete canceled). Idempotent."},
    {"listen", (PyCFunction)(void (*)(void))worker_listen, METH_VARARGS | METH_KEYWORDS,
     "listen(address=None, port=0) -> _UcxListener; accepted endpoints come out of progress()."},
    {"connect", (PyCFunction)worker_connect, METH_VARARGS,
     "connect(host, port) -> _UcxEndpoint, connecting (gser_ucx_ep_connect_nb): see its state."},
    {"cache_stats", (PyCFunction)worker_cache_stats, METH_NOARGS, "The receive cache's numbers (a dict)."},
    {"alloc_host", (PyCFunction)worker_alloc_host, METH_O,
     "alloc_host(n) -> a writable buffer of n bytes (contents undefined) from the receive cache\n"
     "(gser_ucx_worker_alloc_host), handed back when the last view of it is gone."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef worker_getset[] = {
    {"closed", (getter)worker_closed, NULL, "Whether close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef worker_members[] = {
    {"handled", T_UINT, offsetof(PgUcxWorker, handled), READONLY,
     "Events the last progress() handled (0: nothing moved)."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot worker_slots[] = {
    {Py_tp_doc, "_UcxWorker(context, *, inline_max=0, inline_budget=0, staging_chunk=0,\n"
                "staging_depth=0, recv_cache_bytes=0, recv_cache_max_bytes=0, max_frames=0,\n"
                "max_bytes=0): a gser::ucx worker whose device frames use the module's device\n"
                "backend. 0 means the transport's default for every option."},
    {Py_tp_new, (void *)worker_new},
    {Py_tp_dealloc, (void *)worker_dealloc},
    {Py_tp_traverse, (void *)worker_traverse},
    {Py_tp_clear, (void *)worker_clear},
    {Py_tp_methods, worker_methods},
    {Py_tp_members, worker_members},
    {Py_tp_getset, worker_getset},
    {0, NULL},
};

static PyType_Spec worker_spec = {
    .name = "gser._gser._UcxWorker",
    .basicsize = sizeof(PgUcxWorker),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = worker_slots,
};

/* ---- _UcxListener ------------------------------------------------------------------------------ */

static void listener_close_c(PgUcxListener *self)
{
    if (!self->l)
        return;
    gser_ucx_listener_destroy(self->l);
    self->l = NULL;
    child_unlink(&self->link);
}

static int listener_traverse(PgUcxListener *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->worker);
    Py_VISIT(self->user);
    return 0;
}

static int listener_clear(PgUcxListener *self)
{
    Py_CLEAR(self->user);
    return 0;
}

static void listener_dealloc(PgUcxListener *self)
{
    PyObject_GC_UnTrack(self);
    listener_close_c(self);
    Py_CLEAR(self->user);
    Py_CLEAR(self->worker);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *listener_close(PgUcxListener *self, PyObject *unused)
{
    (void)unused;
    listener_close_c(self);
    Py_RETURN_NONE;
}

static PyMethodDef listener_methods[] = {
    {"close", (PyCFunction)listener_close, METH_NOARGS,
     "Stop listening (gser_ucx_listener_destroy); accepted endpoints stay. Idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyObject *listener_closed(PgUcxListener *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->l == NULL);
}

static PyGetSetDef listener_getset[] = {
    {"closed", (getter)listener_closed, NULL, "Whether it stopped listening.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef listener_members[] = {
    {"port", T_USHORT, offsetof(PgUcxListener, port), READONLY, "The port it listens on."},
    {"failed", T_ULONGLONG, offsetof(PgUcxListener, failed), READONLY,
     "Connections whose handshake failed (the listener went on serving)."},
    {"last_failure", T_INT, offsetof(PgUcxListener, last_failure), READONLY,
     "The status of the latest failed handshake (0: none)."},
    {"user", T_OBJECT, offsetof(PgUcxListener, user), 0, "Anything the caller wants to keep here."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot listener_slots[] = {
    {Py_tp_doc, "A gser::ucx listener (from _UcxWorker.listen)."},
    {Py_tp_dealloc, (void *)listener_dealloc},
    {Py_tp_traverse, (void *)listener_traverse},
    {Py_tp_clear, (void *)listener_clear},
    {Py_tp_methods, listener_methods},
    {Py_tp_members, listener_members},
    {Py_tp_getset, listener_getset},
    {0, NULL},
};

static PyType_Spec listener_spec = {
    .name = "gser._gser._UcxListener",
    .basicsize = sizeof(PgUcxListener),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = listener_slots,
};

/* ---- _UcxEndpoint ----------------------------------------------------------------------------- */

/* A new _UcxEndpoint over ep. If the allocation ran a finalizer that
 * closed the worker, ep went with it: the object is a destroyed endpoint. */
static PgUcxEndpoint *endpoint_wrap(PgUcxWorker *w, gser_ucx_ep_t *ep, PyObject *listener)
{
    PgUcxEndpoint *e = PyObject_GC_New(PgUcxEndpoint, ucx_state(w)->UcxEndpoint);
    if (!e)
        return NULL;
    e->worker = (PgUcxWorker *)Py_NewRef((PyObject *)w);
    e->ep = w->w ? ep : NULL;
    e->listener = Py_NewRef(listener);
    e->user = Py_NewRef(Py_None);
    e->link.prev = e->link.next = NULL;
    if (e->ep)
        child_link(w, &e->link, false);
    PyObject_GC_Track(e);
    return e;
}

static void endpoint_destroy_c(PgUcxEndpoint *self)
{
    if (!self->ep)
        return;
    gser_ucx_ep_t *ep = self->ep;
    self->ep = NULL;
    child_unlink(&self->link);
    gser_ucx_ep_destroy(ep);
}

static int endpoint_traverse(PgUcxEndpoint *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->worker);
    Py_VISIT(self->listener);
    Py_VISIT(self->user);
    return 0;
}

static int endpoint_clear(PgUcxEndpoint *self)
{
    Py_CLEAR(self->user);
    return 0;
}

static void endpoint_dealloc(PgUcxEndpoint *self)
{
    PyObject_GC_UnTrack(self);
    endpoint_destroy_c(self);
    Py_CLEAR(self->user);
    Py_CLEAR(self->listener);
    Py_CLEAR(self->worker);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static gser_status_t endpoint_status(const PgUcxEndpoint *self)
{
    return self->ep ? gser_ucx_ep_get_status(self->ep) : GSER_ERR_CANCELED;
}

static PyObject *endpoint_state(PgUcxEndpoint *self, void *closure)
{
    (void)closure;
    gser_status_t st = endpoint_status(self);
    const char *s = st == GSER_OK ? "ready" : st == GSER_INPROGRESS ? "connecting" : !self->ep ? "destroyed"
                                          : st == GSER_ERR_CANCELED                ? "closed"
                                                                                   : "failed";
    return PyUnicode_FromString(s);
}

static PyObject *endpoint_status_get(PgUcxEndpoint *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong((long)endpoint_status(self));
}

static PyObject *endpoint_error(PgUcxEndpoint *self, PyObject *unused)
{
    (void)unused;
    gser_status_t st = endpoint_status(self);
    if (st == GSER_OK || st == GSER_INPROGRESS)
        Py_RETURN_NONE;
    /* gser_ucx_ep_get_status left the endpoint's reason in the last error. */
    const char *why = self->ep ? gser_ucx_get_last_error() : "";
    PyObject *text;
    if (*why) {
        PyObject *w = pg_text(why);
        text = w ? PyUnicode_FromFormat("endpoint failed: %U", w) : NULL;
        Py_XDECREF(w);
    } else {
        text = PyUnicode_FromFormat("endpoint %s: %s", self->ep ? "failed" : "destroyed", gser_status_str(st));
    }
    PyObject *e = text ? pg_make_exc(ucx_state(self), ucx_state(self)->GserError, st, text) : NULL;
    Py_XDECREF(text);
    return e;
}

static PyObject *endpoint_peer_info(PgUcxEndpoint *self, PyObject *unused)
{
    (void)unused;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.peer_info");
    gser_ucx_peer_info_t info = GSER_UCX_PEER_INFO_INIT;
    gser_status_t st = gser_ucx_ep_get_peer_info(self->ep, &info);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_get_peer_info");
    return Py_BuildValue("{s:k,s:k,s:k,s:s,s:H,s:s,s:H,s:k}", "wire_version", (unsigned long)info.wire_version,
                         "gser_wire_version", (unsigned long)info.gser_wire_version, "caps", (unsigned long)info.caps,
                         "local_host", info.local_host, "local_port", info.local_port, "peer_host", info.peer_host,
                         "peer_port", info.peer_port, "mm_fifo_size", (unsigned long)info.mm_fifo_size);
}

/* Serialize (and compress) without the endpoint: may run on any thread,
 * so that large frames are compressed off the event loop. */
static PyObject *endpoint_prepare(PgUcxEndpoint *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"obj", "families", "compression", "parts", NULL};
    PyObject *obj, *families = NULL, *compression = NULL, *parts = NULL;
    int codec;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO$O:prepare", kwlist, &obj, &families, &compression, &parts) ||
        pg_compression_parse(compression, &codec) < 0)
        return NULL;
    pg_encode_options_t eo = {0};
    eo.dask_parts = parts != Py_None ? parts : NULL;
    PgOwner *owner = pg_serialize(ucx_state(self), obj, families, &eo, false, codec);
    if (!owner || !eo.dask_parts)
        return (PyObject *)owner;
    /* A whole Dask message (parts: (types, callback)): (owner, the bytes it
     * sends), the size a Dask comm's write returns. */
    size_t n = gser_frames_get_count(owner->frames), total = 0;
    const gser_frame_t *fr = gser_frames_get_array(owner->frames);
    for (size_t i = 0; i < n; i++)
        total += fr[i].size;
    PyObject *out = Py_BuildValue("(On)", (PyObject *)owner, (Py_ssize_t)total);
    Py_DECREF(owner);
    return out;
}

static PyObject *endpoint_set_compression(PgUcxEndpoint *self, PyObject *arg)
{
    int c;
    if (ucx_compression_parse(arg, &c) < 0)
        return NULL;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.set_compression");
    gser_status_t st = gser_ucx_ep_set_compression(self->ep, c);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_set_compression");
    Py_RETURN_NONE;
}

static PyObject *codec_object(int codec);

static PyObject *endpoint_compression(PgUcxEndpoint *self, void *closure)
{
    (void)closure;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.compression");
    int codec;
    gser_status_t st = gser_ucx_ep_get_compression(self->ep, &codec);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_get_compression");
    return codec_object(codec);
}

/* "lz4", "zstd" or None for a gser_compression_t. */
static PyObject *codec_object(int codec)
{
    if (codec == GSER_COMPRESSION_LZ4)
        return PyUnicode_FromString("lz4");
    if (codec == GSER_COMPRESSION_ZSTD)
        return PyUnicode_FromString("zstd");
    Py_RETURN_NONE;
}

static PyObject *endpoint_choose_compression(PgUcxEndpoint *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"frames", "pipelined", NULL};
    PyObject *frames;
    int pipelined = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:choose_compression", kwlist, &frames, &pipelined))
        return NULL;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.choose_compression");
    PyObject *seq = PySequence_Fast(frames, "choose_compression: frames must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof *views);
    gser_frame_t *fr = PyMem_Calloc(n ? (size_t)n : 1, sizeof *fr);
    bool *held = PyMem_Calloc(n ? (size_t)n : 1, sizeof *held);
    PyObject *result = NULL;
    if (!views || !fr || !held) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* host buffers are sampled; anything else (a device frame) is not a candidate */
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &views[i], PyBUF_ANY_CONTIGUOUS) < 0) {
            PyErr_Clear();
            continue;
        }
        held[i] = true;
        fr[i].data = views[i].buf;
        fr[i].size = (size_t)views[i].len;
        fr[i].memory = GSER_MEMORY_HOST;
    }
    int codec = GSER_COMPRESSION_NONE;
    /* the GIL stays held: a sample is timed at most every 100 ms, and the
     * endpoint must not be destroyed meanwhile */
    gser_status_t st = gser_ucx_ep_choose_compression(self->ep, fr, (size_t)n, pipelined != 0, 0, &codec);
    result = st ? ucx_raise(ucx_state(self), st, "gser_ucx_ep_choose_compression") : codec_object(codec);
out:
    for (Py_ssize_t i = 0; held && i < n; i++)
        if (held[i])
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(fr);
    PyMem_Free(held);
    Py_DECREF(seq);
    return result;
}

static PyObject *endpoint_raw_wins(PgUcxEndpoint *self, PyObject *args)
{
    Py_ssize_t nbytes;
    int pipelined = 0;
    if (!PyArg_ParseTuple(args, "n|p:raw_wins", &nbytes, &pipelined))
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "raw_wins: nbytes must be >= 0, not %zd", nbytes);
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.raw_wins");
    bool raw = false;
    gser_status_t st = gser_ucx_ep_raw_wins(self->ep, (size_t)nbytes, pipelined != 0, &raw);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_raw_wins");
    return PyBool_FromLong(raw);
}

static PyObject *endpoint_mark_posted(PgUcxEndpoint *self, PyObject *unused)
{
    (void)unused;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.mark_posted");
    gser_status_t st = gser_ucx_ep_mark_posted(self->ep);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_mark_posted");
    Py_RETURN_NONE;
}

static PyObject *endpoint_link_stats(PgUcxEndpoint *self, void *closure)
{
    (void)closure;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.link_stats");
    gser_ucx_link_stats_t s = GSER_UCX_LINK_STATS_INIT;
    gser_status_t st = gser_ucx_ep_get_link_stats(self->ep, &s);
    if (st)
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_get_link_stats");
    PyObject *codec = codec_object(s.codec);
    if (!codec)
        return NULL;
    return Py_BuildValue("{s:N,s:O,s:d,s:(dd),s:(dd),s:(dd),s:(ddd),s:K,s:K,s:K,s:K,s:(dd),s:K,s:K,s:K,s:(dd)}", "codec", codec,
                         "link_aware",
                         s.link_aware ? Py_True : Py_False, "send_rate", s.send_rate, "ratio", s.ratio[0], s.ratio[1],
                         "compress_rate", s.compress_rate[0], s.compress_rate[1], "decompress_rate",
                         s.decompress_rate[0], s.decompress_rate[1], "estimate", s.estimate[0], s.estimate[1],
                         s.estimate[2], "decisions", (unsigned long long)s.decisions, "samples",
                         (unsigned long long)s.samples, "rate_samples", (unsigned long long)s.rate_samples, "probes",
                         (unsigned long long)s.probes, "fix", s.fix[0], s.fix[1], "runs", (unsigned long long)s.runs,
                         "explores", (unsigned long long)s.explores, "raw_wins", (unsigned long long)s.raw_wins,
                         "ratio_fix", s.ratio_fix[0], s.ratio_fix[1]);
}

static PgUcxRequest *request_new(PgUcxEndpoint *ep, PyObject *user, bool recv)
{
    PgUcxRequest *r = PyObject_GC_New(PgUcxRequest, ucx_state(ep)->UcxRequest);
    if (!r)
        return NULL;
    r->next_done = NULL;
    r->worker = (PgUcxWorker *)Py_NewRef((PyObject *)ep->worker);
    r->req = NULL;
    r->owner = NULL;
    r->user = Py_NewRef(user);
    r->status = GSER_INPROGRESS;
    r->detail = NULL;
    r->recv = recv;
    r->taken = false;
    PyObject_GC_Track(r);
    return r;
}

static PyObject *endpoint_send(PgUcxEndpoint *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"obj", "families", "user", NULL};
    PyObject *obj, *families = NULL, *user = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$O:send", kwlist, &obj, &families, &user))
        return NULL;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.send");
    PgUcxRequest *r = request_new(self, user, false);
    if (!r)
        return NULL;
    PgOwner *owner;
    if (Py_IS_TYPE(obj, ucx_state(self)->Owner) && ((PgOwner *)obj)->frames) { /* from prepare() */
        owner = (PgOwner *)Py_NewRef(obj);
    } else {
        int codec = GSER_COMPRESSION_NONE;
        if (gser_ucx_ep_get_compression(self->ep, &codec))
            codec = GSER_COMPRESSION_NONE; /* not ready: the send fails below */
        pg_encode_options_t eo = {0};
        owner = pg_serialize(ucx_state(self), obj, families, &eo, false, codec);
    }
    if (!owner) {
        Py_DECREF(r);
        return NULL;
    }
    if (!self->ep) { /* Python code run meanwhile (the encoder, a finalizer) destroyed it */
        Py_DECREF(owner);
        Py_DECREF(r);
        return closed_error(ucx_state(self), "_UcxEndpoint.send");
    }
    gser_ucx_op_params_t p = GSER_UCX_OP_PARAMS_INIT;
    p.cb = request_done_cb;
    p.user_data = r;
    gser_status_t st = gser_ucx_ep_send_nb(self->ep, gser_frames_get_array(owner->frames),
                                           gser_frames_get_count(owner->frames), &p, &r->req);
    if (st) {
        Py_DECREF(owner);
        Py_DECREF(r);
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_send_nb");
    }
    r->owner = owner;       /* the bytes stay valid until the send completes */
    Py_INCREF((PyObject *)r); /* the in-flight reference, handed on by the callback */
    return (PyObject *)r;
}

static PyObject *endpoint_recv(PgUcxEndpoint *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"user", NULL};
    PyObject *user = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$O:recv", kwlist, &user))
        return NULL;
    if (!self->ep)
        return closed_error(ucx_state(self), "_UcxEndpoint.recv");
    PgUcxRequest *r = request_new(self, user, true);
    if (!r)
        return NULL;
    if (!self->ep) { /* a finalizer run by the allocation destroyed it */
        Py_DECREF(r);
        return closed_error(ucx_state(self), "_UcxEndpoint.recv");
    }
    gser_ucx_op_params_t p = GSER_UCX_OP_PARAMS_INIT;
    p.cb = request_done_cb;
    p.user_data = r;
    gser_status_t st = gser_ucx_ep_recv_nb(self->ep, &p, &r->req);
    if (st) {
        Py_DECREF(r);
        return ucx_raise(ucx_state(self), st, "gser_ucx_ep_recv_nb");
    }
    Py_INCREF((PyObject *)r);
    return (PyObject *)r;
}

static PyObject *endpoint_close(PgUcxEndpoint *self, PyObject *unused)
{
    (void)unused;
    if (self->ep) {
        gser_status_t st = gser_ucx_ep_close(self->ep);
        if (st)
            return ucx_raise(ucx_state(self), st, "gser_ucx_ep_close");
    }
    Py_RETURN_NONE;
}

static PyObject *endpoint_destroy(PgUcxEndpoint *self, PyObject *unused)
{
    (void)unused;
    endpoint_destroy_c(self);
    Py_RETURN_NONE;
}

static PyMethodDef endpoint_methods[] = {
    {"send", (PyCFunction)(void (*)(void))endpoint_send, METH_VARARGS | METH_KEYWORDS,
     "send(obj, families=None, *, user=None) -> _UcxRequest: serialize obj as gser.dumps\n"
     "does (buffers borrowed until the send completes) and send it as one message."},
    {"recv", (PyCFunction)(void (*)(void))endpoint_recv, METH_VARARGS | METH_KEYWORDS,
     "recv(*, user=None) -> _UcxRequest: receive the next message; result() loads it."},
    {"close", (PyCFunction)endpoint_close, METH_NOARGS,
     "Close now (gser_ucx_ep_close): what is in flight completes canceled, the peer\n"
     "sees the connection drop."},
    {"destroy", (PyCFunction)endpoint_destroy, METH_NOARGS,
     "Destroy it (gser_ucx_ep_destroy): completed sends are flushed to the peer first\n"
     "(bounded), anything in flight is canceled. Idempotent."},
    {"error", (PyCFunction)endpoint_error, METH_NOARGS,
     "error() -> GserError or None: why the endpoint failed or closed."},
    {"prepare", (PyCFunction)(void (*)(void))endpoint_prepare, METH_VARARGS | METH_KEYWORDS,
     "prepare(obj, families=None, compression=None) -> a serialized message for send(): the\n"
     "serializing and compressing (GIL released) of send(), on any thread."},
    {"choose_compression", (PyCFunction)(void (*)(void))endpoint_choose_compression, METH_VARARGS | METH_KEYWORDS,
     "choose_compression(frames, pipelined=False) -> \"lz4\", \"zstd\" or None: the codec to send these\n"
     "frames with (gser_ucx_ep_choose_compression: by the link's measurements when the endpoint\n"
     "decides by its link, else the compression property)."},
    {"raw_wins", (PyCFunction)endpoint_raw_wins, METH_VARARGS,
     "raw_wins(nbytes, pipelined=False) -> bool: whether the link's measurements already say a message\n"
     "of nbytes goes fastest raw whatever its data (gser_ucx_ep_raw_wins: then recorded as its\n"
     "decision, no sample); False: ask choose_compression."},
    {"mark_posted", (PyCFunction)endpoint_mark_posted, METH_NOARGS,
     "mark_posted(): every send of the message choose_compression last decided for is posted\n"
     "(gser_ucx_ep_mark_posted): the link times it to its last send's completion."},
    {"set_compression", (PyCFunction)endpoint_set_compression, METH_O,
     "set_compression(c): what this endpoint compresses (\"auto\": by transport, None/False,\n"
     "\"lz4\", \"zstd\"), over its worker's; only codecs the peer announced are used."},
    {"peer_info", (PyCFunction)endpoint_peer_info, METH_NOARGS,
     "peer_info() -> dict: what the peer announced in the handshake (wire_version, gser_wire_version, caps, "
     "mm_fifo_size: the segments of its shared-memory FIFO), "
     "and the connection's addresses (local_host, local_port, peer_host, peer_port)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef endpoint_getset[] = {
    {"state", (getter)endpoint_state, NULL, "'connecting', 'ready', 'failed', 'closed' or 'destroyed'.", NULL},
    {"status", (getter)endpoint_status_get, NULL, "gser_ucx_ep_get_status (GSER_ERR_CANCELED once destroyed).",
     NULL},
    {"link_stats", (getter)endpoint_link_stats, NULL,
     "dict: the link-aware compression's measurements and last decision (gser_ucx_ep_get_link_stats;\n"
     "ratio, compress_rate, decompress_rate: (lz4, zstd); estimate: seconds (raw, lz4, zstd)).",
     NULL},
    {"compression", (getter)endpoint_compression, NULL,
     "The codec its sends are compressed with after negotiation: \"lz4\", \"zstd\" or None\n"
     "(gser_ucx_ep_get_compression; frames that do not shrink go as they are).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef endpoint_members[] = {
    {"listener", T_OBJECT, offsetof(PgUcxEndpoint, listener), READONLY,
     "The _UcxListener that accepted it, or None (connected from here)."},
    {"user", T_OBJECT, offsetof(PgUcxEndpoint, user), 0, "Anything the caller wants to keep here."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot endpoint_slots[] = {
    {Py_tp_doc, "A gser::ucx endpoint (from _UcxWorker.connect or accepted by a listener)."},
    {Py_tp_dealloc, (void *)endpoint_dealloc},
    {Py_tp_traverse, (void *)endpoint_traverse},
    {Py_tp_clear, (void *)endpoint_clear},
    {Py_tp_methods, endpoint_methods},
    {Py_tp_members, endpoint_members},
    {Py_tp_getset, endpoint_getset},
    {0, NULL},
};

static PyType_Spec endpoint_spec = {
    .name = "gser._gser._UcxEndpoint",
    .basicsize = sizeof(PgUcxEndpoint),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = endpoint_slots,
};

/* Received compressed messages of at least this many bytes are
 * deserialized (and decompressed) with the GIL released. */
#define PG_UCX_NOGIL_BYTES ((size_t)1 << 20)

/* ---- _UcxRequest -------------------------------------------------------------------------------- */

static int request_traverse(PgUcxRequest *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->worker);
    Py_VISIT(self->owner);
    Py_VISIT(self->user);
    return 0;
}

static int request_clear(PgUcxRequest *self)
{
    Py_CLEAR(self->user);
    return 0;
}

static void request_dealloc(PgUcxRequest *self)
{
    PyObject_GC_UnTrack(self);
    /* Never in flight here (the in-flight reference): freeing cancels nothing. */
    gser_ucx_request_free(self->req);
    self->req = NULL;
    free(self->detail);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->user);
    Py_CLEAR(self->worker);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Raise the exception of a request that failed, as GserError. */
static PyObject *request_raise(PgUcxRequest *self)
{
    const char *what = self->recv ? "receive" : "send";
    return pg_raise_text(ucx_state(self), self->status,
                         self->detail ? pg_text(self->detail)
                         : self->status == GSER_ERR_CANCELED
                             ? PyUnicode_FromFormat("%s: canceled (the endpoint was closed or destroyed here)", what)
                             : PyUnicode_FromFormat("%s: %s", what, gser_status_str(self->status)));
}

static PyObject *request_result(PgUcxRequest *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"device", "parts", NULL};
    int device = 0;
    PyObject *parts = NULL; /* a Dask comm's: rebuilds a whole Dask message's parts (pg_decode_msg_dask) */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$pO:result", kwlist, &device, &parts))
        return NULL;
    if (self->status == GSER_INPROGRESS)
        return pg_raise_text(ucx_state(self), GSER_ERR_STATE,
                             PyUnicode_FromString("_UcxRequest.result: the request is still running"));
    if (self->status != GSER_OK)
        return request_raise(self);
    if (!self->recv)
        Py_RETURN_NONE;
    if (self->taken)
        return pg_raise_text(ucx_state(self), GSER_ERR_STATE,
                             PyUnicode_FromString("_UcxRequest.result: the message was taken already"));
    self->taken = true;
    PgOwner *owner = pg_owner_new(ucx_state(self));
    if (!owner)
        return NULL;
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = device ? GSER_DESERIALIZE_RESTORE_DEVICE : 0;
    gser_status_t st;
    size_t nbytes = 0;
    bool compressed = false;
    gser_ucx_request_get_size(self->req, &nbytes, &compressed); /* a failure leaves 0: deserialize says why */
    if (compressed && nbytes >= PG_UCX_NOGIL_BYTES) {
        /* Decompressing a large message: other threads (the event loop,
         * when this runs on Dask's offload thread) go on meanwhile. The
         * detached half calls nothing of the worker, which they may use. */
        gser_msg_t *msg = NULL;
        Py_BEGIN_ALLOW_THREADS
        st = gser_ucx_request_deserialize_detached(self->req, pg_ctx, &o, &msg);
        Py_END_ALLOW_THREADS
        /* A malformed message closes its endpoint: with the GIL, which
         * serializes the worker's calls. */
        if (st)
            st = gser_ucx_request_reject(self->req, st);
        owner->msg = msg;
    } else {
        /* A malformed or over-limit message closes its endpoint. */
        st = gser_ucx_request_deserialize(self->req, pg_ctx, &o, &owner->msg);
    }
    /* Received frames are ours: arrays over them are writable. */
    PyObject *out = st ? ucx_raise(ucx_state(self), st, "gser_ucx_request_deserialize")
                       : pg_decode_msg_dask(owner, false, parts != Py_None ? parts : NULL);
    Py_DECREF(owner);
    return out;
}

/* (bytes as they came, whether compressed), or (0, False) once taken or
 * for anything but a completed receive. */
static PyObject *request_size(PgUcxRequest *self, void *closure)
{
    (void)closure;
    size_t nbytes = 0;
    bool compressed = false;
    if (!self->recv || self->taken || self->status != GSER_OK ||
        gser_ucx_request_get_size(self->req, &nbytes, &compressed))
        nbytes = 0, compressed = false;
    return Py_BuildValue("(nO)", (Py_ssize_t)nbytes, compressed ? Py_True : Py_False);
}

static PyObject *request_cancel(PgUcxRequest *self, PyObject *unused)
{
    (void)unused;
    if (self->req && self->status == GSER_INPROGRESS) {
        gser_status_t st = gser_ucx_request_cancel(self->req);
        if (st)
            return ucx_raise(ucx_state(self), st, "gser_ucx_request_cancel");
    }
    Py_RETURN_NONE;
}

static PyObject *request_done(PgUcxRequest *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->status != GSER_INPROGRESS);
}

static PyMethodDef request_methods[] = {
    {"result", (PyCFunction)(void (*)(void))request_result, METH_VARARGS | METH_KEYWORDS,
     "result(*, device=False): None for a send, the loaded object for a receive (once;\n"
     "as gser.loads, arrays view the received frames); raises GserError if it failed."},
    {"cancel", (PyCFunction)request_cancel, METH_NOARGS,
     "Cancel it (gser_ucx_request_cancel): a receive that matched no message yet\n"
     "leaves the endpoint usable; a send or a half-received message closes it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef request_getset[] = {
    {"done", (getter)request_done, NULL, "Whether it completed (progress() returned it).", NULL},
    {"size", (getter)request_size, NULL,
     "A completed receive's (bytes as they came, compressed frames at their size as sent;\n"
     "whether its header says frames are compressed): gser_ucx_request_get_size; (0, False)\n"
     "for a send, a failed receive or once result() took it.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef request_members[] = {
    {"status", T_INT, offsetof(PgUcxRequest, status), READONLY, "GSER_INPROGRESS (1), then its final status."},
    {"user", T_OBJECT, offsetof(PgUcxRequest, user), 0, "Anything the caller wants to keep here."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot request_slots[] = {
    {Py_tp_doc, "A send or receive in flight (from _UcxEndpoint.send / recv)."},
    {Py_tp_dealloc, (void *)request_dealloc},
    {Py_tp_traverse, (void *)request_traverse},
    {Py_tp_clear, (void *)request_clear},
    {Py_tp_methods, request_methods},
    {Py_tp_members, request_members},
    {Py_tp_getset, request_getset},
    {0, NULL},
};

static PyType_Spec request_spec = {
    .name = "gser._gser._UcxRequest",
    .basicsize = sizeof(PgUcxRequest),
    .flags = PG_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = request_slots,
};

/* ---- module ----------------------------------------------------------------------------------- */

int pg_ucx_add(PyObject *m, pg_state_t *s)
{
    if (pg_type_add(m, &context_spec, &s->UcxContext, "_UcxContext") < 0 ||
        pg_type_add(m, &worker_spec, &s->UcxWorker, "_UcxWorker") < 0 ||
        pg_type_add(m, &listener_spec, &s->UcxListener, "_UcxListener") < 0 ||
        pg_type_add(m, &endpoint_spec, &s->UcxEndpoint, "_UcxEndpoint") < 0 ||
        pg_type_add(m, &request_spec, &s->UcxRequest, "_UcxRequest") < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "UCX_WIRE_VERSION", GSER_UCX_WIRE_VERSION) < 0 ||
        PyModule_AddObject(m, "UCX_PEER_TIMEOUT_NONE", PyLong_FromUnsignedLong(GSER_UCX_PEER_TIMEOUT_NONE)) < 0 ||
        PyModule_AddIntConstant(m, "UCX_CAP_CUDA", GSER_UCX_CAP_CUDA) < 0)
        return -1;
    return 0;
}
