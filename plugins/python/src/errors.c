/* The module's errors: GserError (and GserUnsupported) with the status's
 * name and parts as attributes, MemoryError for GSER_ERR_NO_MEMORY.
 *
 * A leaf: every other file raises through here; nothing here calls back.
 */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <string.h>

static PyObject *status_name(gser_status_t st)
{
    const char *full = gser_status_str(st);
    const char *colon = strchr(full, ':');
    return PyUnicode_FromStringAndSize(full, colon ? colon - full : (Py_ssize_t)strlen(full));
}

PyObject *pg_make_exc(const pg_state_t *s, PyObject *exc, gser_status_t st, PyObject *text)
{
    if (exc != s->GserError && exc != s->GserUnsupported)
        return PyObject_CallOneArg(exc, text);
    PyObject *name = status_name(st);
    PyObject *msg = name ? PyUnicode_FromFormat("%U: %U", name, text) : NULL;
    PyObject *e = msg ? PyObject_CallOneArg(exc, msg) : NULL;
    PyObject *code = e ? PyLong_FromLong((long)st) : NULL;
    if (!code || PyObject_SetAttrString(e, "status", code) < 0 || PyObject_SetAttrString(e, "status_name", name) < 0 ||
        PyObject_SetAttrString(e, "detail", text) < 0)
        Py_CLEAR(e);
    Py_XDECREF(code);
    Py_XDECREF(msg);
    Py_XDECREF(name);
    return e;
}

PyObject *pg_text(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "backslashreplace");
}

PyObject *pg_raise_text(const pg_state_t *s, gser_status_t st, PyObject *text)
{
    if (!text)
        return NULL;
    if (st == GSER_ERR_NO_MEMORY) {
        PyErr_SetObject(PyExc_MemoryError, text);
    } else {
        PyObject *e = pg_make_exc(s, s->GserError, st, text);
        if (e) {
            PyErr_SetObject(s->GserError, e);
            Py_DECREF(e);
        }
    }
    Py_DECREF(text);
    return NULL;
}

PyObject *pg_raise(const pg_state_t *s, gser_status_t st, bool detail, const char *what)
{
    /* The detail may quote a type name or an Arrow format from the wire. */
    const char *d = detail ? gser_context_get_last_error(pg_ctx) : "";
    return pg_raise_text(s, st, *d ? pg_text(d)
                                   : PyUnicode_FromFormat("%s: %s", what ? what : "gser", gser_status_str(st)));
}

int pg_has_attr(PyObject *o, const char *name)
{
    PyObject *a = PyObject_GetAttrString(o, name);
    if (a) {
        Py_DECREF(a);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
    PyErr_Clear();
    return 0;
}
