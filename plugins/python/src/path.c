/* Paths of values in error messages, written the way the core writes them:
 * $ for the root, [3] for a list item, .name for a dict value under an
 * identifier-like str key, [key] (repr, shortened) for any other key. */
#include "pygser.h" /* first: Python.h sets the feature macros */

#include <stdarg.h>

static bool is_ident(PyObject *key)
{
    if (!PyUnicode_CheckExact(key) || !PyUnicode_IS_ASCII(key))
        return false;
    Py_ssize_t n = PyUnicode_GET_LENGTH(key);
    const unsigned char *s = PyUnicode_1BYTE_DATA(key);
    if (n == 0 || n > 64 || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_'))
        return false;
    for (Py_ssize_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_'))
            return false;
    return true;
}

PyObject *pg_path_str(const pg_path_t *p)
{
    PyObject *parts = PyList_New(0);
    if (!parts)
        return NULL;
    PyObject *s = PyUnicode_FromString("$");
    if (!s || PyList_Append(parts, s) < 0)
        goto fail;
    Py_DECREF(s);
    for (int i = 0; i < p->len; i++) {
        PyObject *key = p->seg[i].key;
        if (!key) {
            s = PyUnicode_FromFormat("[%zd]", p->seg[i].index);
        } else if (is_ident(key)) {
            s = PyUnicode_FromFormat(".%U", key);
        } else {
            PyObject *r = PyObject_Repr(key);
            if (!r)
                goto fail;
            if (PyUnicode_GET_LENGTH(r) > 40) {
                PyObject *cut = PyUnicode_Substring(r, 0, 40);
                Py_DECREF(r);
                if (!cut)
                    goto fail;
                s = PyUnicode_FromFormat("[%U...]", cut);
                Py_DECREF(cut);
            } else {
                s = PyUnicode_FromFormat("[%U]", r);
                Py_DECREF(r);
            }
        }
        if (!s || PyList_Append(parts, s) < 0)
            goto fail;
        Py_DECREF(s);
    }
    PyObject *empty = PyUnicode_FromString("");
    PyObject *out = empty ? PyUnicode_Join(empty, parts) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(parts);
    return out;
fail:
    Py_XDECREF(s);
    Py_DECREF(parts);
    return NULL;
}

PyObject *pg_path_raise(const pg_state_t *s, PyObject *exc, gser_status_t st, const pg_path_t *p, const char *fmt,
                        ...)
{
    PyObject *cause = NULL, *tb = NULL, *ctype = NULL;
    if (PyErr_Occurred()) {
        PyErr_Fetch(&ctype, &cause, &tb);
        PyErr_NormalizeException(&ctype, &cause, &tb);
        if (cause && tb)
            PyException_SetTraceback(cause, tb);
    }
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    PyObject *path = msg ? pg_path_str(p) : NULL;
    if (path) {
        PyObject *text = PyUnicode_FromFormat("%U: %U", path, msg);
        if (text) {
            PyObject *e = pg_make_exc(s, exc, st, text);
            Py_DECREF(text);
            if (e) {
                if (cause)
                    PyException_SetCause(e, Py_NewRef(cause));
                PyErr_SetObject(exc, e);
                Py_DECREF(e);
            }
        }
    }
    Py_XDECREF(path);
    Py_XDECREF(msg);
    Py_XDECREF(ctype);
    Py_XDECREF(cause);
    Py_XDECREF(tb);
    return NULL;
}
