/*
 * ctxstore._llama: the C half of ctxstore.llama, over the llama.cpp adapter
 * (include/ctxstore_llama.h). It binds the adapter to a llama_context that
 * llama-cpp-python made (its address, from Llama._ctx.ctx) and to a
 * ctxstore.Session, which owns the session handle: the store, the session
 * and their locks are ctxstore._ctxstore's (the capsule of
 * _ctxstore_api.h), so that one copy of the library serves the process.
 *
 * The adapter's calls run without the GIL (llama_decode, the save's copy,
 * the restore), under the Session's lock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <ctxstore.h>
#include <ctxstore_llama.h>

#include "_ctxstore_api.h"

static const ctxs_py_api *api;

/* ctxstore.Error for rc, the adapter's own words after the code's
 * (ctxs_get_last_error(), which raise_rc adds). */
static PyObject *raise_llama(int rc, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    PyOS_vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return api->raise_rc(rc, NULL, "%s", what);
}

/* An address that llama-cpp-python holds (an int, or a ctypes pointer). */
static int conv_ptr(PyObject *o, void *out)
{
    if (PyObject_HasAttrString(o, "value") && !PyLong_Check(o)) {
        PyObject *v = PyObject_GetAttrString(o, "value");
        if (!v)
            return 0;
        int ok = conv_ptr(v, out);
        Py_DECREF(v);
        return ok;
    }
    void *p = o == Py_None ? NULL : PyLong_AsVoidPtr(o);
    if (PyErr_Occurred())
        return 0;
    if (!p) {
        PyErr_SetString(PyExc_ValueError, "a NULL llama.cpp pointer (a closed Llama?)");
        return 0;
    }
    *(void **)out = p;
    return 1;
}

/* Token ids as a buffer of uint32 (llama_token is int32; the adapter
 * refuses negative ones). */
typedef struct tokens {
    PyObject *array;
    Py_buffer buf;
    uint32_t n;
} tokens;

static int tokens_get(tokens *t, PyObject *o)
{
    memset(t, 0, sizeof *t);
    if (!(t->array = api->token_array(o)))
        return -1;
    if (PyObject_GetBuffer(t->array, &t->buf, PyBUF_C_CONTIGUOUS) < 0) {
        Py_CLEAR(t->array);
        return -1;
    }
    if (t->buf.len / 4 > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many tokens");
        PyBuffer_Release(&t->buf);
        Py_CLEAR(t->array);
        return -1;
    }
    t->n = (uint32_t)(t->buf.len / 4);
    return 0;
}

static void tokens_release(tokens *t)
{
    if (t->array)
        PyBuffer_Release(&t->buf);
    Py_CLEAR(t->array);
}

/* model_init(store, gguf_path, model, cparams): ctxs_llama_model_init(). */
static PyObject *mod_model_init(PyObject *m, PyObject *args)
{
    (void)m;
    PyObject *store, *path = NULL;
    void *model, *cparams;
    ctxs_model out;
    int rc;
    if (!PyArg_ParseTuple(args, "OO&O&O&:model_init", &store, api->conv_path, &path, conv_ptr,
                          &model, conv_ptr, &cparams))
        return NULL;
    ctxs_store *st = NULL;
    if (store != Py_None && !(st = api->store_enter(store))) {
        Py_DECREF(path);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = ctxs_llama_model_init(&out, st, PyBytes_AS_STRING(path), model, cparams);
    Py_END_ALLOW_THREADS
    if (st)
        api->store_leave(store);
    PyObject *ret = rc < 0 ? raise_llama(rc, "the model of '%s'", PyBytes_AS_STRING(path))
                           : api->model_tuple(&out);
    Py_DECREF(path);
    return ret;
}

/* --- Conversation ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ctxs_llama *lc;
    PyObject *session; /* the ctxstore.Session that owns the handle */
} ConvObject;

static void Conv_dealloc(ConvObject *self)
{
    /* Frees the adapter's buffers only: the context is llama-cpp-python's,
     * the session the Session's. */
    ctxs_llama_detach(self->lc);
    self->lc = NULL;
    Py_CLEAR(self->session);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* _start(session, store, name, ctx, model, prompt, capacity, verify, background) */
static PyObject *Conv__start(ConvObject *self, PyObject *args)
{
    PyObject *session, *store, *prompt_o, *cap_o;
    const char *name;
    void *ctx;
    ctxs_model model;
    int verify, background, rc;
    if (!PyArg_ParseTuple(args, "OOsO&O&OOpp:_start", &session, &store, &name, conv_ptr, &ctx,
                          api->conv_model, &model, &prompt_o, &cap_o, &verify, &background))
        return NULL;
    if (self->lc) {
        PyErr_SetString(PyExc_RuntimeError, "the conversation is already started");
        return NULL;
    }
    ctxs_create_options co = CTXS_CREATE_OPTIONS_INIT;
    ctxs_llama_options lo = CTXS_LLAMA_OPTIONS_INIT;
    lo.open_flags = verify ? CTXS_OPEN_VERIFY : 0;
    ctxs_open_options oo = CTXS_OPEN_OPTIONS_INIT;
    oo.background = (uint32_t)background;
    lo.open = &oo;
    if (cap_o != Py_None) {
        unsigned long cap = PyLong_AsUnsignedLong(cap_o);
        if (PyErr_Occurred() || cap > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "capacity %R is out of range", cap_o);
            return NULL;
        }
        co.capacity = (uint32_t)cap;
        co.ring = 0;
        co.n_sink = 0;
        co.open = oo;
        lo.create = &co;
    }
    tokens prompt;
    if (tokens_get(&prompt, prompt_o) < 0)
        return NULL;
    ctxs_store *st = api->store_enter(store);
    if (!st) {
        tokens_release(&prompt);
        return NULL;
    }
    ctxs_llama *lc = NULL;
    ctxs_llama_start_info info;
    static const int32_t none[1];
    const int32_t *p = prompt.n ? prompt.buf.buf : none;
    Py_BEGIN_ALLOW_THREADS
    rc = ctxs_llama_start(&lc, st, name, ctx, &model, p, prompt.n, &lo, &info);
    Py_END_ALLOW_THREADS
    tokens_release(&prompt);
    PyObject *ret = NULL;
    if (rc < 0) {
        raise_llama(rc, "start '%s'", name);
    } else if (api->session_adopt(session, ctxs_llama_get_session(lc), store) == 0) {
        /* The Session owns the handle now: the adapter only detaches. */
        self->lc = lc;
        self->session = Py_NewRef(session);
        lc = NULL;
        static const char *how[] = {"", "resumed", "forked", "created"};
        ret = Py_BuildValue("(Kss)", (unsigned long long)info.n_tokens,
                            info.how < 4 ? how[info.how] : "", info.from);
    }
    ctxs_llama_detach(lc); /* after a failed adopt, which closed the session */
    api->store_leave(store);
    return ret;
}

/* Takes the session's lock; NULL (an exception set) if there is none. */
static ctxs_session *conv_enter(ConvObject *self)
{
    if (!self->lc) {
        PyErr_SetString(PyExc_RuntimeError, "the conversation is not started, or detached");
        return NULL;
    }
    return api->session_enter(self->session);
}

typedef int (*tokens_fn)(ctxs_llama *lc, const int32_t *tokens, uint32_t n);

static PyObject *conv_tokens_call(ConvObject *self, PyObject *arg, tokens_fn fn,
                                  const char *what)
{
    tokens t;
    int rc;
    if (tokens_get(&t, arg) < 0)
        return NULL;
    if (!conv_enter(self)) {
        tokens_release(&t);
        return NULL;
    }
    static const int32_t none[1];
    const int32_t *p = t.n ? t.buf.buf : none;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(self->lc, p, t.n);
    Py_END_ALLOW_THREADS
    api->session_leave(self->session);
    tokens_release(&t);
    if (rc < 0)
        return raise_llama(rc, "%s of %u tokens", what, t.n);
    Py_RETURN_NONE;
}

static PyObject *Conv_save(ConvObject *self, PyObject *arg)
{
    return conv_tokens_call(self, arg, ctxs_llama_save, "save");
}

static PyObject *Conv_decode(ConvObject *self, PyObject *arg)
{
    return conv_tokens_call(self, arg, ctxs_llama_decode, "decode");
}

static PyObject *Conv_restore(ConvObject *self, PyObject *unused)
{
    (void)unused;
    int rc;
    if (!conv_enter(self))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ctxs_llama_restore(self->lc);
    Py_END_ALLOW_THREADS
    api->session_leave(self->session);
    if (rc < 0)
        return raise_llama(rc, "restore");
    Py_RETURN_NONE;
}

static PyObject *Conv_rollback(ConvObject *self, PyObject *arg)
{
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    int rc;
    if (PyErr_Occurred() || !conv_enter(self))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ctxs_llama_rollback(self->lc, n);
    Py_END_ALLOW_THREADS
    api->session_leave(self->session);
    if (rc < 0)
        return raise_llama(rc, "rollback to %llu tokens", n);
    Py_RETURN_NONE;
}

static PyObject *Conv_checkpoint_restore(ConvObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    int rc;
    if (!name || !conv_enter(self))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = ctxs_llama_checkpoint_restore(self->lc, name);
    Py_END_ALLOW_THREADS
    api->session_leave(self->session);
    if (rc < 0)
        return raise_llama(rc, "restore checkpoint '%s'", name);
    Py_RETURN_NONE;
}

static PyObject *Conv_detach(ConvObject *self, PyObject *unused)
{
    (void)unused;
    /* Waits for a call in flight (the session's lock), then unbinds. */
    if (self->lc && api->session_enter(self->session)) {
        ctxs_llama_detach(self->lc);
        self->lc = NULL;
        api->session_leave(self->session);
    } else {
        PyErr_Clear(); /* the session was closed: nothing runs on it */
        ctxs_llama_detach(self->lc);
        self->lc = NULL;
    }
    Py_RETURN_NONE;
}

#define NOARGS(f) (PyCFunction)(void (*)(void))(f), METH_NOARGS
#define ONEARG(f) (PyCFunction)(void (*)(void))(f), METH_O
#define VARARGS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS

static PyMethodDef Conv_methods[] = {
    {"_start", VARARGS(Conv__start), NULL},
    {"save", ONEARG(Conv_save),
     "save($self, tokens, /)\n--\n\n"
     "ctxs_llama_save(): the tokens the sequence holds after the session's,\n"
     "just decoded, saved (their K/V as llama.cpp holds them) and committed."},
    {"decode", ONEARG(Conv_decode),
     "decode($self, tokens, /)\n--\n\nctxs_llama_decode(): llama_decode in batches, each saved."},
    {"restore", NOARGS(Conv_restore),
     "restore($self, /)\n--\n\nctxs_llama_restore(): the session put back into the sequence."},
    {"rollback", ONEARG(Conv_rollback),
     "rollback($self, n_tokens, /)\n--\n\nctxs_llama_rollback(): session and sequence to n_tokens."},
    {"checkpoint_restore", ONEARG(Conv_checkpoint_restore),
     "checkpoint_restore($self, name, /)\n--\n\n"
     "ctxs_llama_checkpoint_restore(): session and sequence back to a checkpoint."},
    {"detach", NOARGS(Conv_detach),
     "detach($self, /)\n--\n\nUnbind the adapter; the session and the context stay as they are."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ConvType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctxstore._llama.ConversationBase",
    .tp_doc = "The C half of ctxstore.llama.Conversation.",
    .tp_basicsize = sizeof(ConvObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Conv_dealloc,
    .tp_methods = Conv_methods,
};

static PyMethodDef module_methods[] = {
    {"model_init", VARARGS(mod_model_init),
     "model_init(store, gguf_path, model, cparams, /)\n--\n\n"
     "ctxs_llama_model_init(): the ctxstore.Model tuple of a llama_model (its\n"
     "address) for contexts made with cparams (the address of a\n"
     "llama_context_params); store (or None) caches the weights hash."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ctxstore._llama",
    .m_doc = "The llama.cpp adapter under ctxstore.llama; use ctxstore.llama itself.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__llama(void);
PyMODINIT_FUNC PyInit__llama(void)
{
    api = PyCapsule_Import(CTXS_PY_API_CAPSULE, 0);
    if (!api)
        return NULL;
    if (api->version != CTXS_PY_API_VERSION) {
        PyErr_Format(PyExc_ImportError, "ctxstore._ctxstore lends version %u, not %u",
                     api->version, CTXS_PY_API_VERSION);
        return NULL;
    }
    if (PyType_Ready(&ConvType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "ConversationBase", (PyObject *)&ConvType) < 0 ||
        PyModule_AddStringConstant(m, "LLAMA_LIBDIR", CTXS_PY_LLAMA_LIBDIR) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
