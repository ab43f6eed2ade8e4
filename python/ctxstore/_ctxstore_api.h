/*
 * What ctxstore._ctxstore lends the package's other extension modules
 * (ctxstore._llama), as a capsule: the calls that reach a Store's or a
 * Session's handle under the same rules as its own methods (a use of the
 * store, the session's lock), and its errors. A module that links
 * libctxstore itself must not keep handles of its own beside these: one
 * copy of the library serves the process.
 *
 *     const ctxs_py_api *api = PyCapsule_Import(CTXS_PY_API_CAPSULE, 0);
 */
#ifndef CTXSTORE_PY_API_H
#define CTXSTORE_PY_API_H

#include <Python.h>

#include <ctxstore.h>

#define CTXS_PY_API_CAPSULE "ctxstore._ctxstore._api"
#define CTXS_PY_API_VERSION 2u

typedef struct ctxs_py_api {
    unsigned version; /* CTXS_PY_API_VERSION */
    /* Raises ctxstore.Error for rc: "<what>: <ctxs_strerror(rc)>[: <detail>]"
     * (detail NULL: why the library said it failed, ctxs_get_last_error(),
     * when it said so for rc; "" for none). Returns NULL. */
    PyObject *(*raise_rc)(int rc, const char *detail, const char *fmt, ...);
    /* The handle of an open ctxstore.Store with a use of it taken (the
     * store stays open until store_leave()); NULL with an exception set. */
    ctxs_store *(*store_enter)(PyObject *store);
    void (*store_leave)(PyObject *store);
    /* The handle of an open ctxstore.Session with its lock held (waiting
     * without the GIL); NULL with an exception set. */
    ctxs_session *(*session_enter)(PyObject *session);
    void (*session_leave)(PyObject *session);
    /* Gives a handle just opened through store (NULL: none) to a
     * ctxstore.Session made by Session.__new__ and not yet open; the
     * Session owns it from then on. On failure s is closed; -1 with an
     * exception set. */
    int (*session_adopt)(PyObject *session, ctxs_session *s, PyObject *store);
    /* "O&" converters: a ctxstore.Model to ctxs_model; a path to a PyBytes
     * the caller releases. */
    int (*conv_model)(PyObject *o, void *out);
    int (*conv_path)(PyObject *o, void *out);
    /* Token ids (any 1-D sequence of ints in 0 .. 2^32-1) as a new
     * C-contiguous NumPy uint32 array; NULL with an exception set. */
    PyObject *(*token_array)(PyObject *o);
    /* A ctxs_model as the tuple ctxstore.Model is made from (the schedule
     * last, a tuple of the pattern's windows); NULL with an exception set. */
    PyObject *(*model_tuple)(const ctxs_model *m);
} ctxs_py_api;

#endif
