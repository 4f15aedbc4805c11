/* gser._gser: dumps/loads, to_bytes/from_bytes, GserError, DeviceFrame,
 * DeviceArray, ArrowArray.
 *
 *   header, frames = dumps(obj, families=("device", "host"), *, strict=False)
 *   obj = loads(header, frames, *, device=False)
 *   b = to_bytes(obj, families=("host",))
 *   obj = from_bytes(b, *, device=False)
 *
 * The core runs with the GIL released; everything it borrows is held by a
 * PgOwner for as long as it is used. Device copies the core makes while
 * deserializing are waited for before the objects are handed out.
 *
 * The top of the module's files: it sets the module up (multi-phase
 * initialisation, PEP 489: the exec slot fills in the module's state) and
 * nothing calls back into it.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <string.h>

/* ---- serializing -------------------------------------------------------------------------- */

PyDoc_STRVAR(dumps_doc,
"dumps(obj, families=('device', 'host'), *, strict=False, compression=None,\n"
"      compression_threshold=None, compression_chunk_size=None) -> (header, frames)\n\n"
"Serialize obj into a header (bytes: gser's msgpack header) and a list of\n"
"frames: memoryviews over host memory, gser.DeviceFrame objects for device\n"
"memory. Frames borrow obj's buffers (numpy arrays, __cuda_array_interface__\n"
"and DLPack tensors are not copied): keep them unchanged while the frames are\n"
"in use. families orders the serializer\n"
"families tried for typed objects (Arrow tables) and says where device buffers\n"
"go: \"device\" keeps them in device frames, \"host\" stages them into host\n"
"frames. strict=True refuses (NotImplementedError) what would not come back as\n"
"the same type: buffers other than numpy.ndarray, bytes, bytearray and\n"
"memoryview; device arrays, DLPack tensors and Arrow tables unless their type\n"
"is registered (register_type). decline=\"object\" (an object Dask would pickle\n"
"whole) or \"collection\" (a list, tuple or dict whose items Dask would\n"
"serialize one by one) raises gser.Declined, a NotImplementedError, as soon\n"
"as gser is estimated to be slower than that (many small items); the\n"
"estimate is counted while encoding, so giving up costs little.\n"
"writable_header=True gives the header as a writable memoryview of gser's\n"
"own memory instead of bytes (small arrays inside it then load writable\n"
"without a copy, as Dask's writable frames do; memoryviews do not pickle).\n"
"compression=\"lz4\", \"zstd\" or \"auto\" (lz4) compresses host frames of at\n"
"least 10,000 bytes where a sample shrinks to 0.9 or less, as Dask's\n"
"maybe_compress does; such frames are gser's compressed copies, and the\n"
"header is wire version 3. loads decompresses them. compression_threshold\n"
"(in (0, 1], default 0.9) keeps a frame compressed only where its sample and\n"
"its whole shrink to that fraction or less. compression_chunk_size (bytes,\n"
"4096 to 2**30; default None: whole frames) compresses each frame larger\n"
"than that in chunks of that size, each sampled and kept compressed only\n"
"where it shrinks to the threshold (the others stored as they are): a\n"
"frame whose parts differ, a block of pandas columns one of which does not\n"
"compress, costs codec time only where the codec pays. Only gser builds\n"
"that know chunks (wire codecs 3 and 4) read such frames.");

/* owner's frames as a list, the header first (gser's own memory, writable,
 * zero-copy when writable_header; else bytes). */
/* (a, b), taking both references (also on failure): what Py_BuildValue("(NN)")
 * does without parsing a format string on every call. */
static PyObject *pair_steal(PyObject *a, PyObject *b)
{
    PyObject *t = PyTuple_New(2);
    if (!t) {
        Py_DECREF(a);
        Py_DECREF(b);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    return t;
}

static PyObject *dumps_frames(PgOwner *owner, bool writable_header)
{
    size_t n = gser_frames_get_count(owner->frames);
    const gser_frame_t *fr = gser_frames_get_array(owner->frames);
    PyObject *header;
    if (writable_header) { /* gser's own header memory, zero-copy */
        PyObject *exp = pg_frame_new(owner, fr[0].data, (Py_ssize_t)fr[0].size, false, "B", 1, 0, NULL);
        header = exp ? PyMemoryView_FromObject(exp) : NULL;
        Py_XDECREF(exp);
    } else {
        header = PyBytes_FromStringAndSize(fr[0].data, (Py_ssize_t)fr[0].size);
    }
    PyObject *list = header ? PyList_New((Py_ssize_t)n) : NULL;
    if (!list) {
        Py_XDECREF(header);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, header);
    Py_ssize_t next_obj = 0; /* frames come in the order their data was encoded */
    for (size_t i = 1; list && i < n; i++) {
        PyObject *f;
        const pg_frame_obj_t *fo = next_obj < owner->nfobjs ? &owner->fobjs[next_obj] : NULL;
        bool mine = fo && fr[i].memory == GSER_MEMORY_HOST && fo->ptr == fr[i].data && fo->len == fr[i].size;
        next_obj += mine;
        if (mine && fo->obj) {
            f = Py_NewRef(fo->obj); /* bytes, bytearray, memoryview: the object itself, as Dask's frame */
        } else if (fr[i].memory == GSER_MEMORY_HOST) {
            /* Writable when the memory is a writable array's or gser's copy
             * of one, as Dask's frames of a writable array; else read-only. */
            PyObject *exp = pg_frame_new(owner, fr[i].data, (Py_ssize_t)fr[i].size, !mine || fo->readonly, "B", 1, 0,
                                         NULL);
            f = exp ? PyMemoryView_FromObject(exp) : NULL;
            Py_XDECREF(exp);
        } else {
            f = pg_device_frame_new(owner, fr[i].data, fr[i].size, fr[i].device);
        }
        if (!f)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, f);
    }
    return list;
}

static PyObject *py_dumps(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"obj",         "families", "strict", "decline", "writable_header", "compression",
                             "compression_threshold", "compression_chunk_size", NULL};
    PyObject *obj, *families = NULL, *compression = NULL, *threshold = NULL, *chunk = NULL;
    const char *decline = NULL;
    int strict = 0, writable_header = 0, codec;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$pzpOOO:dumps", kwlist, &obj, &families, &strict, &decline,
                                     &writable_header, &compression, &threshold, &chunk))
        return NULL;
    pg_encode_options_t eo = {.strict = strict};
    if (pg_squeeze_parse(compression, threshold, chunk, &codec, &eo) < 0)
        return NULL;
    if (decline && strcmp(decline, "object") == 0)
        eo.decline = PG_DECLINE_OBJECT;
    else if (decline && strcmp(decline, "collection") == 0)
        eo.decline = PG_DECLINE_COLLECTION;
    else if (decline)
        return PyErr_Format(PyExc_ValueError, "dumps: decline must be None, \"object\" or \"collection\"");
    PgOwner *owner = pg_serialize(s, obj, families, &eo, false, codec);
    if (!owner)
        return NULL;
    PyObject *list = dumps_frames(owner, writable_header);
    Py_DECREF(owner);
    if (!list)
        return NULL;
    /* The header went first into the list: hand it out on its own. */
    PyObject *header = Py_NewRef(PyList_GET_ITEM(list, 0));
    if (PySequence_DelItem(list, 0) < 0) {
        Py_DECREF(header);
        Py_DECREF(list);
        return NULL;
    }
    return Py_BuildValue("(NN)", header, list);
}

/* The Dask family's frames of obj (its gser header first, writable when obj
 * is a numpy array) and *comp, the header's "compression" entry for them:
 * False (never split or compressed) for a device frame, as Dask's "cuda"
 * family says of its frames, None for a host frame. Takes owner. */
static PyObject *family_frames(pg_state_t *s, PgOwner *owner, PyObject *obj, PyObject **comp)
{
    PyObject *list = dumps_frames(owner, strcmp(Py_TYPE(obj)->tp_name, "numpy.ndarray") == 0);
    Py_DECREF(owner);
    Py_ssize_t n = list ? PyList_GET_SIZE(list) : 0;
    PyObject *c = list ? PyTuple_New(n) : NULL;
    for (Py_ssize_t i = 0; c && i < n; i++)
        PyTuple_SET_ITEM(c, i, Py_NewRef(Py_IS_TYPE(PyList_GET_ITEM(list, i), s->DeviceFrame) ? Py_False : Py_None));
    if (!c) {
        Py_XDECREF(list);
        return NULL;
    }
    *comp = c;
    return list;
}

PyDoc_STRVAR(dask_dumps_doc,
"_dask_dumps(obj, families, collection) -> (frames, compression)\n\n"
"gser.dask's dumps in one call (a tiny object's whole dumps costs about a\n"
"microsecond, so the keyword parsing and list and tuple building of the\n"
"general entry point show): strict, declining (gser.Declined) as\n"
"decline=\"collection\" (collection true) or \"object\" does; frames: the\n"
"header first (writable when obj is a numpy array), then the data frames;\n"
"compression: False for a device frame, None for a host frame, as Dask's\n"
"header entry wants it.");

static PyObject *py_dask_dumps(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_dask_dumps(obj, families, collection)");
        return NULL;
    }
    pg_state_t *s = pg_state_of_module(self);
    PyObject *obj = args[0];
    int collection = PyObject_IsTrue(args[2]);
    if (collection < 0)
        return NULL;
    pg_encode_options_t eo = {.strict = 1, .decline = collection ? PG_DECLINE_COLLECTION : PG_DECLINE_OBJECT};
    PgOwner *owner = pg_serialize(s, obj, args[1], &eo, false, GSER_COMPRESSION_NONE);
    PyObject *comp;
    PyObject *list = owner ? family_frames(s, owner, obj, &comp) : NULL;
    return list ? pair_steal(list, comp) : NULL;
}

/* ---- the Dask family's entry points (gser.dask.dumps / loads) ------------------------------- */

/* What the family did: gser.dask.stats() adds these to its own. */
enum { PG_FAM_DUMPS, PG_FAM_DECLINED, PG_FAM_REFUSED, PG_FAM_LOADS };

/* Raise NotImplementedError(text naming obj's type and the error set now),
 * the error its cause, as gser.dask.dumps did in Python: Dask wants
 * NotImplementedError from a family that cannot carry an object. */
static void refused_as_not_implemented(PyObject *obj)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v)
        PyException_SetTraceback(v, tb);
    PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
    if (name)
        PyErr_Format(PyExc_NotImplementedError, "gser cannot serialize this %U: %S", name, v ? v : Py_None);
    Py_XDECREF(name);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    if (!v)
        return;
    PyObject *t2, *v2, *tb2;
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2) {
        PyException_SetContext(v2, Py_NewRef(v));
        PyException_SetCause(v2, v); /* steals v */
    } else {
        Py_DECREF(v);
    }
    PyErr_Restore(t2, v2, tb2);
}

PyDoc_STRVAR(family_dumps_doc,
"_family_dumps($module, x, /, context=None)\n--\n\n"
"gser.dask.dumps: ({\"gser\": 1, \"compression\": (...)}, [gser header, data\n"
"frames...]) for Dask's family contract, in one call (the Python function it\n"
"replaces cost ~0.2 us of a ~1 us round trip). Raises NotImplementedError for\n"
"a peer without gser (context[\"recipient\"] without \"gser\") and for what gser\n"
"cannot carry as the same type (GserError, OverflowError, UnicodeError become\n"
"its cause), gser.Declined for what Dask's own path carries faster. Towards a\n"
"peer whose handshake says \"gser-device\" device buffers stay device frames.");

static PyObject *py_family_dumps(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    pg_state_t *s = pg_state_of_module(self);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *context = nargs > 1 ? args[1] : NULL;
    bool kw_ok = nargs + nkw <= 2 && nargs >= 1;
    for (Py_ssize_t i = 0; kw_ok && i < nkw; i++) {
        kw_ok = !context && PyUnicode_Check(PyTuple_GET_ITEM(kwnames, i)) &&
                PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "context") == 0;
        context = args[nargs + i];
    }
    if (!kw_ok) {
        PyErr_SetString(PyExc_TypeError, "gser.dask.dumps(x, context=None)");
        return NULL;
    }
    PyObject *obj = args[0], *families = s->fam_host;
    int has = context && context != Py_None ? PyObject_IsTrue(context) : 0;
    if (has < 0)
        return NULL;
    if (has) {
        /* context.get("recipient"): the peer's handshake, None when the
         * reader is this process (spilling, serialize() called directly) */
        PyObject *recipient = PyDict_CheckExact(context) ? Py_XNewRef(PyDict_GetItemWithError(context, s->str_recipient))
                                                         : PyObject_CallMethod(context, "get", "O", s->str_recipient);
        if (!recipient && PyErr_Occurred())
            return NULL;
        if (recipient && recipient != Py_None) {
            int in = PySequence_Contains(recipient, s->str_gser);
            if (in == 0)
                PyErr_SetString(PyExc_NotImplementedError, "gser: the receiving process has not loaded gser");
            PyObject *dev = in > 0 ? PyObject_CallMethod(recipient, "get", "O", s->str_gser_device) : NULL;
            int device = dev ? PyObject_IsTrue(dev) : -1;
            Py_XDECREF(dev);
            Py_DECREF(recipient);
            if (device < 0)
                return NULL;
            if (device)
                families = s->fam_device_host;
        } else {
            Py_XDECREF(recipient);
        }
    }
    PyObject *direct = NULL, *comp = NULL, *list = NULL;
    int dr = families == s->fam_host ? pg_direct_dumps(s, obj, &direct) : 0;
    if (dr < 0)
        return NULL;
    if (dr) { /* the header is the whole message: one host frame, uncompressed */
        if ((list = PyList_New(1)))
            PyList_SET_ITEM(list, 0, direct);
        else
            Py_DECREF(direct);
    } else {
        pg_encode_options_t eo = {.strict = 1, .decline = PG_DECLINE_OBJECT};
        PgOwner *owner = pg_serialize(s, obj, families, &eo, false, GSER_COMPRESSION_NONE);
        if (!owner) {
            if (PyErr_ExceptionMatches(s->Declined)) {
                s->fam_count[PG_FAM_DECLINED]++;
            } else if (PyErr_ExceptionMatches(PyExc_NotImplementedError)) {
                s->fam_count[PG_FAM_REFUSED]++;
            } else if (PyErr_ExceptionMatches(s->GserError) || PyErr_ExceptionMatches(PyExc_OverflowError) ||
                       PyErr_ExceptionMatches(PyExc_UnicodeError)) {
                s->fam_count[PG_FAM_REFUSED]++;
                refused_as_not_implemented(obj);
            }
            return NULL;
        }
        list = family_frames(s, owner, obj, &comp);
    }
    /* A new header dict each time (Dask adds "serializer" to it), copied
     * from {"gser": 1, "compression": (None,)}; the general path's frames
     * say their own compression. */
    PyObject *header = list ? PyDict_Copy(s->fam_header1) : NULL;
    if (!header || (comp && PyDict_SetItem(header, s->str_compression, comp) < 0)) {
        Py_XDECREF(header);
        Py_XDECREF(comp);
        Py_XDECREF(list);
        return NULL;
    }
    Py_XDECREF(comp);
    s->fam_count[PG_FAM_DUMPS]++;
    return pair_steal(header, list);
}

PyDoc_STRVAR(to_bytes_doc,
"to_bytes(obj, families=('host',), *, compression=None, compression_threshold=None,\n"
"         compression_chunk_size=None) -> gser.FlatBytes\n\n"
"Serialize obj into gser's flattened form: one immutable bytes-like object\n"
"(gser.FlatBytes: the buffer protocol, len, indexing, slicing, ==, bytes())\n"
"holding the header and every frame, copied once into memory allocated for\n"
"it (huge pages where the kernel allows). It holds host memory only: the \"host\" family is\n"
"always used (\"device\" is left out of families, \"host\" added when\n"
"missing), so device buffers and device Arrow tables are copied by one\n"
"batch straight from the device into their places in it (one copy each);\n"
"from_bytes(b, device=True) puts them back on the device.\n"
"compression, compression_threshold and compression_chunk_size as for dumps.");

static PyObject *py_to_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"obj", "families", "compression", "compression_threshold", "compression_chunk_size", NULL};
    PyObject *obj, *families = NULL, *compression = NULL, *threshold = NULL, *chunk = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$OOO:to_bytes", kwlist, &obj, &families, &compression, &threshold,
                                     &chunk))
        return NULL;
    return pg_to_flat_bytes(pg_state_of_module(self), obj, families, compression, threshold, chunk);
}

/* ---- deserializing ------------------------------------------------------------------------ */

/* One input frame: a host buffer (held by the owner) or a device array
 * (__cuda_array_interface__, kept alive by the owner). */
static int frame_get(PgOwner *owner, PyObject *o, Py_ssize_t index, gser_frame_t *fr, bool *readonly)
{
    pg_state_t *s = owner->state;
    memset(fr, 0, sizeof *fr);
    if (PyObject_CheckBuffer(o)) {
        Py_buffer view;
        if (PyObject_GetBuffer(o, &view, PyBUF_SIMPLE) < 0)
            return -1;
        fr->data = view.buf;
        fr->size = (size_t)view.len;
        fr->memory = GSER_MEMORY_HOST;
        *readonly = view.readonly;
        return pg_owner_hold_view(owner, &view);
    }
    if (index > 0) {
        PyObject *cai = PyObject_GetAttrString(o, "__cuda_array_interface__");
        if (cai) {
            pg_cai_t ci;
            const char *why;
            int r = pg_cai_read(cai, &ci, &why);
            Py_DECREF(cai);
            if (r == 0 && ci.strided) {
                why = "a strided device frame (frames are contiguous bytes)";
                r = -1;
            }
            if (r < 0) {
                if (why) {
                    PyObject *text = PyUnicode_FromFormat("gser.loads: frame %zd: %s", index, why);
                    PyObject *e = text ? pg_make_exc(s, s->GserUnsupported, GSER_ERR_UNSUPPORTED, text) : NULL;
                    if (e)
                        PyErr_SetObject(s->GserUnsupported, e);
                    Py_XDECREF(e);
                    Py_XDECREF(text);
                }
                return -1;
            }
            /* The interface's consumer synchronizes with the producer's
             * stream: the loaded arrays view this memory with no stream. */
            if (ci.stream) {
                gser_status_t st;
                Py_BEGIN_ALLOW_THREADS
                st = gser_stream_wait(pg_ctx, ci.stream);
                Py_END_ALLOW_THREADS
                if (st) {
                    pg_raise(s, st, true, "gser_stream_wait");
                    return -1;
                }
            }
            fr->data = ci.ptr;
            fr->size = ci.nbytes;
            fr->memory = GSER_MEMORY_DEVICE;
            *readonly = false;
            return pg_owner_hold_ref(owner, o);
        }
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    PyErr_Format(PyExc_TypeError, "gser.loads: %s %zd is a %s, not a bytes-like object%s",
                 index ? "frame" : "header", index, Py_TYPE(o)->tp_name,
                 index ? " or an object with __cuda_array_interface__" : "");
    return -1;
}

PyDoc_STRVAR(loads_doc,
"loads(header, frames, *, device=False) -> obj\n\n"
"Rebuild an object from a header and frames made by dumps (bytes-like\n"
"objects; device frames are objects with __cuda_array_interface__).\n"
"Arrays in the result view the frames without copying, and are writable\n"
"only when the frames are; buffers in device memory come back as\n"
"gser.DeviceArray, Arrow tables as gser.ArrowArray. device=True puts buffers\n"
"that were device memory at the sender but came in host frames (the \"host\"\n"
"family) back on the device. Device copies are waited for before loads\n"
"returns. copy_readonly=True gives numpy arrays the writability they had at\n"
"the sender, as Dask's numpy serializer does: an array that was writable but\n"
"views a read-only frame is copied (only then). Malformed input raises\n"
"GserError.");

/* frames_obj as a tuple, a snapshot: reading a frame may run Python code
 * (a __cuda_array_interface__ property) that changes the caller's list. */
static PyObject *frames_tuple(PyObject *frames_obj)
{
    PyObject *seq = PySequence_Check(frames_obj) ? PySequence_Tuple(frames_obj) : NULL;
    if (!seq && (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError))) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "gser.loads: frames must be a sequence");
    }
    return seq;
}

static PyObject *loads_frames(pg_state_t *s, PyObject *header, PyObject *seq, Py_ssize_t first, bool device,
                              bool copy_readonly);

static PyObject *py_loads(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"header", "frames", "device", "copy_readonly", NULL};
    PyObject *header, *frames_obj;
    int device = 0, copy_readonly = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$pp:loads", kwlist, &header, &frames_obj, &device,
                                     &copy_readonly))
        return NULL;
    PyObject *seq = frames_tuple(frames_obj);
    if (!seq)
        return NULL;
    PyObject *out = loads_frames(s, header, seq, 0, device, copy_readonly);
    Py_DECREF(seq);
    return out;
}

/* The object of the Dask family's frames (the gser header first); read-only
 * frames of writable arrays are copied. */
static PyObject *family_loads(pg_state_t *s, PyObject *frames, bool device)
{
    /* A header with no data frames may be read straight into objects. */
    if ((PyList_CheckExact(frames) && PyList_GET_SIZE(frames) == 1) ||
        (PyTuple_CheckExact(frames) && PyTuple_GET_SIZE(frames) == 1)) {
        PyObject *obj;
        int r = pg_direct_loads(s, PySequence_Fast_ITEMS(frames)[0], &obj);
        if (r)
            return r < 0 ? NULL : obj;
    }
    PyObject *seq = frames_tuple(frames);
    if (!seq)
        return NULL;
    PyObject *out = NULL;
    if (PyTuple_GET_SIZE(seq) == 0)
        PyErr_SetString(PyExc_ValueError, "gser.dask: no frames (the first frame is gser's header)");
    else
        out = loads_frames(s, PyTuple_GET_ITEM(seq, 0), seq, 1, device, true);
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(dask_loads_doc,
"_dask_loads(frames, device) -> object\n\n"
"gser.dask's loads in one call: frames[0] is the header, the rest the data\n"
"frames; read-only frames of writable arrays are copied (copy_readonly).");

static PyObject *py_dask_loads(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_dask_loads(frames, device)");
        return NULL;
    }
    int device = PyObject_IsTrue(args[1]);
    return device < 0 ? NULL : family_loads(pg_state_of_module(self), args[0], device);
}

PyDoc_STRVAR(family_loads_doc,
"_family_loads($module, header, frames, /)\n--\n\n"
"gser.dask.loads for a process without a device backend, in one call: the\n"
"object dumps serialized, viewing the frames (frames[0] is gser's header);\n"
"ValueError for a header of another version or no frames.");

static PyObject *py_family_loads(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "gser.dask.loads(header, frames)");
        return NULL;
    }
    pg_state_t *s = pg_state_of_module(self);
    PyObject *version = PyDict_CheckExact(args[0]) ? Py_XNewRef(PyDict_GetItemWithError(args[0], s->str_gser))
                                                   : PyObject_CallMethod(args[0], "get", "O", s->str_gser);
    if (!version && PyErr_Occurred())
        return NULL;
    PyObject *one = PyLong_FromLong(1); /* the small int: the version as written is this object */
    int same = one && version ? version == one || PyObject_RichCompareBool(version, one, Py_EQ) : 0;
    Py_XDECREF(one);
    if (same < 0) {
        Py_XDECREF(version);
        return NULL;
    }
    if (!same) {
        PyErr_Format(PyExc_ValueError, "gser.dask: header version %R, this gser reads 1", version ? version : Py_None);
        Py_XDECREF(version);
        return NULL;
    }
    Py_DECREF(version);
    s->fam_count[PG_FAM_LOADS]++;
    return family_loads(s, args[1], false);
}

PyDoc_STRVAR(direct_doc,
"_direct(on) -> bool\n\n"
"Turn the family's direct path for small plain messages on or off (tests\n"
"compare its bytes with the general path's; benchmarks compare the two);\n"
"returns the previous setting. _direct(None): the counts of messages it\n"
"wrote and read, (dumps, loads), changing nothing. _direct(header bytes): what\n"
"the direct reader makes of a header, Ellipsis where it leaves it to the\n"
"general decoder (tests, benchmarks).");

static PyObject *py_direct(PyObject *self, PyObject *on)
{
    (void)self;
    if (PyBytes_Check(on)) {
        PyObject *obj;
        int r = pg_direct_loads(pg_state_of_module(self), on, &obj);
        return r < 0 ? NULL : r ? obj : Py_NewRef(Py_Ellipsis);
    }
    if (on == Py_None) {
        unsigned long long d, l;
        pg_direct_counts(&d, &l);
        return Py_BuildValue("(KK)", d, l);
    }
    int t = PyObject_IsTrue(on);
    return t < 0 ? NULL : PyBool_FromLong(pg_direct_set(t));
}

static PyObject *py_family_stats(PyObject *self, PyObject *unused)
{
    (void)unused;
    pg_state_t *s = pg_state_of_module(self);
    return Py_BuildValue("{sKsKsKsK}", "dumps", s->fam_count[PG_FAM_DUMPS], "declined", s->fam_count[PG_FAM_DECLINED],
                         "refused", s->fam_count[PG_FAM_REFUSED], "loads", s->fam_count[PG_FAM_LOADS]);
}

/* The family's constants in the state. */
static int family_init(pg_state_t *s)
{
    return (s->fam_host = Py_BuildValue("(s)", "host")) && (s->fam_device_host = Py_BuildValue("(ss)", "device", "host")) &&
                   (s->str_gser = PyUnicode_InternFromString("gser")) &&
                   (s->str_compression = PyUnicode_InternFromString("compression")) &&
                   (s->str_recipient = PyUnicode_InternFromString("recipient")) &&
                   (s->str_gser_device = PyUnicode_InternFromString("gser-device")) &&
                   (s->fam_header1 = Py_BuildValue("{sis(O)}", "gser", 1, "compression", Py_None))
               ? 0
               : -1;
}

/* Load header and the frames seq[first:]. */
static PyObject *loads_frames(pg_state_t *s, PyObject *header, PyObject *seq, Py_ssize_t first, bool device,
                              bool copy_readonly)
{
    Py_ssize_t nf = PyTuple_GET_SIZE(seq) - first;
    PyObject *out = NULL;
    pg_decode_ctx_t dc = {0};
    gser_frame_t *fr = PyMem_Calloc((size_t)nf + 1, sizeof *fr);
    PgOwner *owner = fr ? pg_owner_new(s) : NULL;
    if (!owner) {
        if (!fr)
            PyErr_NoMemory();
        goto done;
    }
    if (pg_decode_ctx_init(&dc, owner, (size_t)nf + 1) < 0)
        goto done;
    dc.copy_readonly = copy_readonly;
    size_t total = 0; /* a small host message is decoded keeping the GIL */
    bool release = device;
    for (Py_ssize_t i = 0; i <= nf; i++) {
        PyObject *o = i ? PyTuple_GET_ITEM(seq, first + i - 1) : header;
        bool ro = false;
        if (frame_get(owner, o, i, &fr[i], &ro) < 0)
            goto done;
        pg_decode_ctx_set_frame(&dc, (size_t)i, &fr[i], ro, o);
        total += fr[i].size;
        release |= fr[i].memory != GSER_MEMORY_HOST;
    }
    release |= total >= PG_GIL_BYTES;
    gser_deserialize_options_t opts = {.size = sizeof(gser_deserialize_options_t), .flags = device ? GSER_DESERIALIZE_RESTORE_DEVICE : 0};
    gser_status_t st;
    gser_msg_t *msg = NULL;
    if (release) {
        Py_BEGIN_ALLOW_THREADS
        st = gser_deserialize(pg_ctx, fr, (size_t)nf + 1, &opts, &msg);
        Py_END_ALLOW_THREADS
    } else {
        st = gser_deserialize(pg_ctx, fr, (size_t)nf + 1, &opts, &msg);
    }
    if (st) {
        pg_raise(s, st, true, "gser_deserialize");
        goto done;
    }
    owner->msg = msg;
    if (pg_msg_wait_gil(s, msg, release) == 0)
        out = pg_decode(&dc, gser_msg_get_root(msg));
done:
    pg_decode_ctx_clear(&dc);
    Py_XDECREF(owner);
    PyMem_Free(fr);
    return out;
}

PyDoc_STRVAR(from_bytes_doc,
"from_bytes(b, *, device=False) -> obj\n\n"
"Rebuild an object from gser's flattened form (any bytes-like object:\n"
"bytes, gser.FlatBytes, a mmap, ...).\n"
"Arrays in the result view b without copying (writable only if b is); device\n"
"buffers of the sender come back as host numpy arrays, or with device=True\n"
"(GSER_DESERIALIZE_RESTORE_DEVICE) as gser.DeviceArray, copied to the device;\n"
"Arrow tables as gser.ArrowArray, on the device with device=True.");

static PyObject *py_from_bytes(PyObject *self, PyObject *args, PyObject *kw)
{
    pg_state_t *s = pg_state_of_module(self);
    static char *kwlist[] = {"b", "device", NULL};
    PyObject *arg;
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$p:from_bytes", kwlist, &arg, &device))
        return NULL;
    PgOwner *owner = pg_owner_new(s);
    if (!owner)
        return NULL;
    PyObject *out = NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        goto done;
    const void *buf = view.buf;
    size_t len = (size_t)view.len;
    bool readonly = view.readonly;
    if (pg_owner_hold_view(owner, &view) < 0)
        goto done;
    gser_deserialize_options_t opts = {.size = sizeof(gser_deserialize_options_t), .flags = device ? GSER_DESERIALIZE_RESTORE_DEVICE : 0};
    gser_status_t st;
    gser_msg_t *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = gser_deserialize_flat(pg_ctx, buf, len, NULL, NULL, &opts, &msg);
    Py_END_ALLOW_THREADS
    out = pg_load_finish(owner, st, msg, readonly, "gser_deserialize_flat"); /* the frames are slices of b */
done:
    Py_DECREF(owner);
    return out;
}

/* ---- module ------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"dumps", (PyCFunction)(void (*)(void))py_dumps, METH_VARARGS | METH_KEYWORDS, dumps_doc},
    {"loads", (PyCFunction)(void (*)(void))py_loads, METH_VARARGS | METH_KEYWORDS, loads_doc},
    {"_dask_dumps", (PyCFunction)(void (*)(void))py_dask_dumps, METH_FASTCALL, dask_dumps_doc},
    {"_dask_loads", (PyCFunction)(void (*)(void))py_dask_loads, METH_FASTCALL, dask_loads_doc},
    {"_direct", py_direct, METH_O, direct_doc},
    {"_family_dumps", (PyCFunction)(void (*)(void))py_family_dumps, METH_FASTCALL | METH_KEYWORDS, family_dumps_doc},
    {"_family_loads", (PyCFunction)(void (*)(void))py_family_loads, METH_FASTCALL, family_loads_doc},
    {"_family_stats", py_family_stats, METH_NOARGS, "_family_stats() -> dict: what _family_dumps/_family_loads did"},
    {"to_bytes", (PyCFunction)(void (*)(void))py_to_bytes, METH_VARARGS | METH_KEYWORDS, to_bytes_doc},
    {"_device_stats", pg_device_stats, METH_VARARGS,
     "_device_stats(reset=False) -> dict: what the emulated device backend copied (tests only)"},
    {"from_bytes", (PyCFunction)(void (*)(void))py_from_bytes, METH_VARARGS | METH_KEYWORDS, from_bytes_doc},
    {NULL, NULL, 0, NULL},
};

/* The process's context (pg_ctx), made by the first instance executed. */
static int context_init(void)
{
    if (pg_ctx)
        return 0;
    /* The device backend follows GSER_DEVICE (cuda, emulated, none). */
    gser_context_t *ctx;
    const gser_allocator_t *alloc = pg_allocator_prepare();
    if (!alloc)
        return -1;
    gser_context_options_t opts = GSER_CONTEXT_OPTIONS_INIT;
    opts.device_allocator = alloc;
    gser_status_t st = gser_context_create(&opts, &ctx);
    if (st) {
        const char *d = gser_context_get_last_error(NULL);
        PyErr_Format(st == GSER_ERR_NO_MEMORY ? PyExc_MemoryError : PyExc_RuntimeError,
                     "gser: cannot create a context: %s", *d ? d : gser_status_str(st));
        return -1;
    }
    if ((st = pg_arrow_register(ctx)) || (st = pg_types_register(ctx))) {
        PyErr_Format(PyExc_RuntimeError, "gser: cannot register the module's types: %s", gser_status_str(st));
        gser_context_destroy(ctx);
        return -1;
    }
    pg_ctx = ctx;
    return 0;
}

/* A new exception class of module m in *slot, published as attr. */
static int exception_add(PyObject *m, PyObject **slot, const char *attr, const char *name, const char *doc,
                         PyObject *base)
{
    *slot = PyErr_NewExceptionWithDoc(name, doc, base, NULL);
    return *slot ? PyModule_AddObjectRef(m, attr, *slot) : -1;
}

static int exceptions_add(PyObject *m, pg_state_t *s)
{
    if (exception_add(m, &s->GserError, "GserError", "gser.GserError",
                      "An error reported by gser's core: a malformed or truncated message, a limit\n"
                      "exceeded, an unknown family, ... str() is \"<STATUS_NAME>: <detail>\", where the\n"
                      "detail names the failing value's path ($[2].payload); the attributes status\n"
                      "(the negative gser_status_t), status_name and detail hold the parts.",
                      PyExc_ValueError) < 0)
        return -1;
    /* Both: what the decoder raises on bad input is a GserError, and code
     * written for NotImplementedError still catches it. */
    PyObject *bases = PyTuple_Pack(2, s->GserError, PyExc_NotImplementedError);
    if (!bases)
        return -1;
    int r = exception_add(m, &s->GserUnsupported, "GserUnsupported", "gser.GserUnsupported",
                          "A message (or a frame handed to loads) holds what this Python module cannot\n"
                          "give back: a dtype numpy cannot express, a typed object of a type it does not\n"
                          "load, ... A GserError (status GSER_ERR_UNSUPPORTED) and a NotImplementedError.",
                          bases);
    Py_DECREF(bases);
    if (r < 0)
        return -1;
    return exception_add(m, &s->Declined, "Declined", "gser.Declined",
                         "Raised by dumps(..., decline=...) when gser would be slower than Dask's own\n"
                         "path for the object (many small items that pickle carries faster). A\n"
                         "NotImplementedError: Dask then tries its next serializer family.",
                         PyExc_NotImplementedError);
}

/* Py_mod_exec: fill in the state of module m and publish its contents. */
static int module_exec(PyObject *m)
{
    pg_state_t *s = pg_state_of_module(m);
    if (context_init() < 0 || exceptions_add(m, s) < 0 || family_init(s) < 0 || pg_owner_add(m, s) < 0 || pg_objects_add(m, s) < 0 ||
        pg_arrow_add(m, s) < 0 || pg_flatio_add(m, s) < 0 || PyModule_AddFunctions(m, pg_registry_methods) < 0 ||
        PyModule_AddFunctions(m, pg_allocator_methods) < 0 || PyModule_AddFunctions(m, pg_strcol_methods) < 0)
        return -1;
#ifdef GSER_PY_HAVE_UCX
    if (pg_ucx_add(m, s) < 0 || PyModule_AddObjectRef(m, "HAVE_UCX", Py_True) < 0)
        return -1;
#else
    if (PyModule_AddObjectRef(m, "HAVE_UCX", Py_False) < 0)
        return -1;
#endif
    if (PyModule_AddStringConstant(m, "DEVICE_BACKEND", gser_context_get_device_backend(pg_ctx)) < 0 ||
        PyModule_AddObjectRef(m, "HAVE_ARROW", pg_have_arrow ? Py_True : Py_False) < 0 ||
        PyModule_AddStringConstant(m, "__version__", gser_version_str()) < 0 ||
        PyModule_AddIntConstant(m, "WIRE_VERSION", GSER_WIRE_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "DEPTH_MAX", GSER_DEPTH_MAX) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    pg_state_t *s = pg_state_of_module(m);
    return s ? pg_state_traverse(s, visit, arg) : 0;
}

static int module_clear(PyObject *m)
{
    pg_state_t *s = pg_state_of_module(m);
    if (s)
        pg_state_clear(s);
    return 0;
}

static void module_free(void *m)
{
    (void)module_clear(m);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
#ifdef Py_mod_multiple_interpreters
    /* The process's context and device allocator (allocator.c) call into
     * the interpreter that set them: one interpreter only. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gser._gser",
    .m_doc = "gser's C core for Python: dumps/loads, to_bytes/from_bytes, device arrays, Arrow tables.",
    .m_size = sizeof(pg_state_t),
    .m_methods = methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__gser(void)
{
    return PyModuleDef_Init(&module_def);
}
