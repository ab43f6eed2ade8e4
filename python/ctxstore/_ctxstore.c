/*
 * ctxstore._ctxstore: the C half of the Python package, over the public
 * header alone. The pure-Python half (__init__.py) subclasses SessionBase
 * and StoreBase, turns the tuples returned here into named types, and
 * parses options; everything that touches a handle or the mapping is here.
 *
 * Lifetime. A session's library handle (ctxs_session) belongs to a small
 * Mapping object, not to the Session: the Session holds one reference to
 * it, and every NumPy view over the mapping holds another (as its base).
 * Session.close() drops the Session's reference and marks the Session
 * closed for every call; ctxs_session_close() runs in Mapping's dealloc,
 * that is once the last view is gone too. So a view never points at
 * unmapped memory, and while one lives the file stays mapped and a
 * writer's lock stays held. The same rule, one level up: a Mapping opened
 * through a store holds a use of the Store, whose ctxs_store_close() waits
 * for its last use (the header asks that sessions be closed before their
 * store).
 *
 * Threads. A session handle is used by one thread at a time: each Session
 * has a lock, taken by every call that reaches the handle, so calls that
 * release the GIL (I/O: open, reserve, commit, sync, verify, fork, ...)
 * cannot run beside another call on the same session. A store handle is
 * thread-safe; the Store counts the calls in flight so that close() never
 * pulls it from under one.
 *
 * fork(): a child must not close its parent's handles (the header: "the
 * child must not use or close a store handle of its parent"), so handles
 * remember the pid that opened them and a child's dealloc leaves them be.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ctxstore.h>

#include "_ctxstore_api.h"

static PyObject *Error; /* ctxstore.Error */

/* --- Errors --------------------------------------------------------------- */

/* Raises ctxstore.Error for rc: message "<context>: <ctxs_strerror(rc)>:
 * <detail>", with .code = rc and .name = ctxs_err_name(rc). detail NULL:
 * why the library's call failed (ctxs_get_last_error()), when it said so
 * for this code. Returns NULL. */
static PyObject *raise_rc_obj(int rc, PyObject *context, const char *detail)
{
    PyObject *msg, *exc, *v;
    if (!detail && ctxs_get_last_error_code() == rc)
        detail = ctxs_get_last_error();
    const char *sep = detail && *detail ? ": " : "";
    if (!detail)
        detail = "";
    if (context)
        msg = PyUnicode_FromFormat("%U: %s%s%s", context, ctxs_strerror(rc), sep, detail);
    else
        msg = PyUnicode_FromFormat("%s%s%s", ctxs_strerror(rc), sep, detail);
    if (!msg)
        return NULL;
    exc = PyObject_CallOneArg(Error, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    v = PyLong_FromLong(rc);
    if (!v || PyObject_SetAttrString(exc, "code", v) < 0)
        goto fail;
    Py_DECREF(v);
    v = PyUnicode_FromString(ctxs_err_name(rc));
    if (!v || PyObject_SetAttrString(exc, "name", v) < 0)
        goto fail;
    Py_DECREF(v);
    PyErr_SetObject(Error, exc);
    Py_DECREF(exc);
    return NULL;
fail:
    Py_XDECREF(v);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *raise_rc_v(int rc, const char *detail, const char *fmt, va_list ap)
{
    PyObject *context = NULL;
    if (fmt && !(context = PyUnicode_FromFormatV(fmt, ap)))
        return NULL;
    raise_rc_obj(rc, context, detail);
    Py_XDECREF(context);
    return NULL;
}

static PyObject *raise_rc(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    raise_rc_v(rc, NULL, fmt, ap);
    va_end(ap);
    return NULL;
}

/* As raise_rc(), the message ending with what the library said beyond the
 * code (ctxs_remote_get_message(), ctxs_llama_get_last_error()). */
static PyObject *raise_rc_detail(int rc, const char *detail, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    raise_rc_v(rc, detail, fmt, ap);
    va_end(ap);
    return NULL;
}

/* As raise_rc(), and for CTXS_EINVAL names the first of the names given
 * (NULL ends the list) that breaks the rule, and why (ctxs_name_check()). */
static PyObject *raise_names(int rc, const char *op, const char *n1,
                             const char *n2)
{
    const char *names[2] = {n1, n2};
    if (rc == CTXS_EINVAL) {
        for (int i = 0; i < 2; i++) {
            const char *why = names[i] ? ctxs_name_check(names[i]) : NULL;
            if (why)
                return raise_rc(rc, "%s: name '%s' %s (%s)", op, names[i], why,
                                CTXS_NAME_RULE);
        }
    }
    if (n1)
        return raise_rc(rc, "%s '%s'", op, n1);
    return raise_rc(rc, "%s", op);
}

static PyObject *raise_closed(const char *what)
{
    return raise_rc(CTXS_EINVAL, "the %s is closed", what);
}

/* --- Argument converters (for "O&") -------------------------------------- */

static int conv_u64_range(PyObject *o, unsigned long long *out,
                          unsigned long long max)
{
    PyObject *i = PyNumber_Index(o);
    if (!i)
        return 0;
    /* Negative values raise OverflowError here too. */
    unsigned long long v = PyLong_AsUnsignedLongLong(i);
    Py_DECREF(i);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > max) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_OverflowError))
            return 0;
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%R is out of range (0 .. %llu)", o, max);
        return 0;
    }
    *out = v;
    return 1;
}

static int conv_u32(PyObject *o, void *out)
{
    unsigned long long v;
    if (!conv_u64_range(o, &v, UINT32_MAX))
        return 0;
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}

static int conv_u64(PyObject *o, void *out)
{
    unsigned long long v;
    if (!conv_u64_range(o, &v, UINT64_MAX))
        return 0;
    *(uint64_t *)out = (uint64_t)v;
    return 1;
}

/* None or an int: UINT64_MAX for None ("all"). */
static int conv_u64_or_all(PyObject *o, void *out)
{
    if (o == Py_None) {
        *(uint64_t *)out = UINT64_MAX;
        return 1;
    }
    return conv_u64(o, out);
}

/* A hash: a bytes-like object of CTXS_HASH_BYTES bytes. */
static int conv_hash(PyObject *o, void *out)
{
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0)
        return 0;
    int ok = b.len == CTXS_HASH_BYTES;
    if (ok)
        memcpy(out, b.buf, CTXS_HASH_BYTES);
    PyBuffer_Release(&b);
    if (!ok)
        PyErr_Format(PyExc_ValueError, "a hash is %d bytes", CTXS_HASH_BYTES);
    return ok;
}

/* A layer schedule: a tuple of at most CTXS_SCHEDULE_MAX windows, one per
 * layer of the pattern (0: global); () for every layer global. */
static int conv_schedule(PyObject *o, ctxs_geometry *g)
{
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) > CTXS_SCHEDULE_MAX) {
        PyErr_Format(PyExc_ValueError, "a schedule is a tuple of at most %d windows, one per "
                     "layer of its pattern (0: a global layer)", CTXS_SCHEDULE_MAX);
        return 0;
    }
    g->period = (uint32_t)PyTuple_GET_SIZE(o);
    for (uint32_t j = 0; j < g->period; j++)
        if (!conv_u32(PyTuple_GET_ITEM(o, j), &g->window[j]))
            return 0;
    return 1;
}

/* A model: the tuple ctxstore.Model is, (n_layers, n_kv_heads, head_dim,
 * dtype, model_hash, tokenizer_hash, schedule). */
static int conv_model(PyObject *o, void *out)
{
    ctxs_model *m = out;
    memset(m, 0, sizeof *m);
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) < 6 || PyTuple_GET_SIZE(o) > 7) {
        PyErr_SetString(PyExc_TypeError, "model must be a ctxstore.Model");
        return 0;
    }
    return conv_u32(PyTuple_GET_ITEM(o, 0), &m->geometry.n_layers) &&
           conv_u32(PyTuple_GET_ITEM(o, 1), &m->geometry.n_kv_heads) &&
           conv_u32(PyTuple_GET_ITEM(o, 2), &m->geometry.head_dim) &&
           conv_u32(PyTuple_GET_ITEM(o, 3), &m->geometry.dtype) &&
           conv_hash(PyTuple_GET_ITEM(o, 4), m->model_hash) &&
           conv_hash(PyTuple_GET_ITEM(o, 5), m->tokenizer_hash) &&
           (PyTuple_GET_SIZE(o) == 6 || conv_schedule(PyTuple_GET_ITEM(o, 6), &m->geometry));
}

/* A path: str, bytes or os.PathLike, to a PyBytes the caller releases. */
static int conv_path(PyObject *o, void *out)
{
    return PyUnicode_FSConverter(o, out);
}

/* The open options, as seven ints: window, pressure_window, durability,
 * background, then the attention windows: attn_period, attn_window,
 * attn_global_mask. */
static int parse_open_opts(PyObject *t, ctxs_open_options *o)
{
    *o = (ctxs_open_options)CTXS_OPEN_OPTIONS_INIT;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 7) {
        PyErr_SetString(PyExc_TypeError, "open options: a tuple of 7 ints");
        return 0;
    }
    return conv_u32(PyTuple_GET_ITEM(t, 0), &o->window) &&
           conv_u32(PyTuple_GET_ITEM(t, 1), &o->pressure_window) &&
           conv_u32(PyTuple_GET_ITEM(t, 2), &o->durability) &&
           conv_u32(PyTuple_GET_ITEM(t, 3), &o->background) &&
           conv_u32(PyTuple_GET_ITEM(t, 4), &o->attn_period) &&
           conv_u32(PyTuple_GET_ITEM(t, 5), &o->attn_window) &&
           conv_u32(PyTuple_GET_ITEM(t, 6), &o->attn_global_mask);
}

static int conv_open_opts(PyObject *t, void *out)
{
    return parse_open_opts(t, out);
}

/* The create options: capacity, n_sink, ring, then the open options. */
static int conv_create_opts(PyObject *t, void *out)
{
    ctxs_create_options *o = out;
    *o = (ctxs_create_options)CTXS_CREATE_OPTIONS_INIT;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "create options: (capacity, n_sink, ring, open options)");
        return 0;
    }
    return conv_u32(PyTuple_GET_ITEM(t, 0), &o->capacity) &&
           conv_u32(PyTuple_GET_ITEM(t, 1), &o->n_sink) &&
           conv_u32(PyTuple_GET_ITEM(t, 2), &o->ring) &&
           parse_open_opts(PyTuple_GET_ITEM(t, 3), &o->open);
}

/* Token ids: any 1-D sequence of ints in 0 .. 2^32-1 (a np.uint32 array is
 * taken as it is). *out is a new 1-D C-contiguous uint32 array. */
static PyArrayObject *token_array(PyObject *o)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(o, NPY_NOTYPE, 0, 0, 0);
    if (!a)
        return NULL;
    if (PyArray_NDIM(a) != 1) {
        PyErr_Format(PyExc_ValueError, "token ids: a 1-D sequence, not %d-D",
                     PyArray_NDIM(a));
        goto fail;
    }
    if (PyArray_TYPE(a) == NPY_UINT32 && PyArray_ISCARRAY_RO(a))
        return a;
    if (PyArray_SIZE(a) > 0 && !PyArray_ISINTEGER(a)) {
        PyErr_Format(PyExc_TypeError, "token ids must be integers, not %s",
                     PyArray_DESCR(a)->typeobj->tp_name);
        goto fail;
    }
    /* Through int64: a uint64 above 2^63 wraps negative and is refused. */
    PyArrayObject *w = (PyArrayObject *)PyArray_FROMANY((PyObject *)a, NPY_INT64,
                                                        1, 1, NPY_ARRAY_CARRAY_RO |
                                                              NPY_ARRAY_FORCECAST);
    Py_DECREF(a);
    if (!w)
        return NULL;
    npy_intp n = PyArray_SIZE(w);
    const int64_t *src = PyArray_DATA(w);
    PyArrayObject *u = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_UINT32);
    if (!u) {
        Py_DECREF(w);
        return NULL;
    }
    uint32_t *dst = PyArray_DATA(u);
    for (npy_intp i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] > (int64_t)UINT32_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "token id %lld (at %zd) is not in 0 .. 4294967295",
                         (long long)src[i], (Py_ssize_t)i);
            Py_DECREF(w);
            Py_DECREF(u);
            return NULL;
        }
        dst[i] = (uint32_t)src[i];
    }
    Py_DECREF(w);
    return u;
fail:
    Py_DECREF(a);
    return NULL;
}

/* "O&" (cleanup supported): token ids to a new uint32 array (token_array()),
 * released by the caller. */
static int conv_tokens(PyObject *o, void *out)
{
    PyArrayObject **a = out;
    if (!o) { /* cleanup after a later argument failed */
        Py_CLEAR(*a);
        return 0;
    }
    *a = token_array(o);
    return *a ? Py_CLEANUP_SUPPORTED : 0;
}

/* The ids of a token array, never NULL (an empty array's data may be). */
static const uint32_t *tokens_data(PyArrayObject *a)
{
    static const uint32_t none[1];
    return PyArray_SIZE(a) ? PyArray_DATA(a) : none;
}

/* "O&": None (*out set to NULL), or a model (conv_model into **out). */
static int conv_model_or_none(PyObject *o, void *out)
{
    ctxs_model **mp = out;
    if (o == Py_None) {
        *mp = NULL;
        return 1;
    }
    return conv_model(o, *mp);
}

/* --- Tuples out ----------------------------------------------------------- */

static PyObject *model_tuple(const ctxs_model *m)
{
    PyObject *sched = PyTuple_New(m->geometry.period);
    if (!sched)
        return NULL;
    for (uint32_t j = 0; j < m->geometry.period; j++) {
        PyObject *w = PyLong_FromUnsignedLong(m->geometry.window[j]);
        if (!w) {
            Py_DECREF(sched);
            return NULL;
        }
        PyTuple_SET_ITEM(sched, j, w);
    }
    return Py_BuildValue("(IIIIy#y#N)", m->geometry.n_layers, m->geometry.n_kv_heads,
                         m->geometry.head_dim, m->geometry.dtype,
                         (const char *)m->model_hash, (Py_ssize_t)CTXS_HASH_BYTES,
                         (const char *)m->tokenizer_hash, (Py_ssize_t)CTXS_HASH_BYTES, sched);
}

/* --- Structs as dicts ---------------------------------------------------------
 *
 * A result struct of the library goes to Python as a dict of its fields,
 * described once by a table; __init__.py makes its named type from it. */

typedef enum { F_U32, F_I32, F_U64, F_BOOL, F_STR, F_HASH } field_kind;

typedef struct field {
    const char *name;
    size_t off;
    field_kind kind;
} field;

/* A field of the struct T (#define T before each table). */
#define F(member, kind) {#member, offsetof(T, member), F_##kind}
#define FIELDS_END {NULL, 0, F_U32}

static PyObject *field_value(const char *p, field_kind kind)
{
    switch (kind) {
    case F_U32: return PyLong_FromUnsignedLong(*(const uint32_t *)p);
    case F_I32: return PyLong_FromLong(*(const int32_t *)p);
    case F_U64: return PyLong_FromUnsignedLongLong(*(const uint64_t *)p);
    case F_BOOL: return PyBool_FromLong(*(const uint32_t *)p != 0);
    case F_STR: return PyUnicode_DecodeUTF8(p, (Py_ssize_t)strlen(p), "replace");
    case F_HASH: return PyBytes_FromStringAndSize(p, CTXS_HASH_BYTES);
    }
    Py_UNREACHABLE();
}

static PyObject *struct_dict(const void *st, const field *f)
{
    PyObject *d = PyDict_New();
    for (; d && f->name; f++) {
        PyObject *v = field_value((const char *)st + f->off, f->kind);
        if (!v || PyDict_SetItemString(d, f->name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* d[key] = v, both references taken over; NULL (and neither kept) if
 * either is NULL or the set fails. */
static PyObject *with_item(PyObject *d, const char *key, PyObject *v)
{
    if (d && v && PyDict_SetItemString(d, key, v) == 0) {
        Py_DECREF(v);
        return d;
    }
    Py_XDECREF(d);
    Py_XDECREF(v);
    return NULL;
}

#define T ctxs_session_entry
static const field entry_fields[] = {
    F(name, STR), F(id, U64), F(model_hash, HASH), F(n_tokens, U64), F(disk_bytes, U64),
    F(created_unix_ms, U64), F(last_used_unix_ms, U64), F(parent_id, U64), F(fork_tokens, U64),
    F(pinned, BOOL), FIELDS_END,
};
#undef T

static PyObject *entry_dict(const void *e)
{
    return struct_dict(e, entry_fields);
}

/* A listing the library returned (rc, and n items of size bytes, released
 * here): a list of one(item) each, or ctxstore.Error for rc < 0. */
static PyObject *listing(int rc, void *items, size_t n, size_t size,
                         PyObject *(*one)(const void *), const char *what)
{
    PyObject *l = rc < 0 ? raise_rc(rc, "%s", what) : PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *v = one((const char *)items + i * size);
        if (!v)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    ctxs_free(items);
    return l;
}

/* A tuple of n items of size bytes, each made by one(). */
static PyObject *tuple_of(const void *items, size_t n, size_t size, PyObject *(*one)(const void *))
{
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        PyObject *v = one((const char *)items + i * size);
        if (!v)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, v);
    }
    return t;
}

/* A slot span of a reservation or a window: two uint32, slot and count. */
static PyObject *slot_span(const void *p)
{
    const uint32_t *sp = p;
    return Py_BuildValue("(II)", sp[0], sp[1]);
}

static PyObject *attn_span(const void *p)
{
    const ctxs_attn_span *sp = p;
    return Py_BuildValue("(KII)", (unsigned long long)sp->pos, sp->slot, sp->count);
}

/* Runs stmt (a library call) with the GIL released. */
#define NOGIL(stmt)                                                            \
    do {                                                                       \
        PyThreadState *nogil_ts_ = PyEval_SaveThread();                        \
        stmt;                                                                  \
        PyEval_RestoreThread(nogil_ts_);                                       \
    } while (0)

/* stmt (a library call on the handle) within a use of the store, a use of
 * the remote or the session's lock, the GIL released around it (but for
 * SESS_CALL); the method returns NULL (Error set) when the handle is
 * closed. Only where nothing is to be released before such a return. */
#define CALL_WITH(enter, leave, self, stmt)                                    \
    do {                                                                       \
        if (enter(self) < 0)                                                   \
            return NULL;                                                       \
        stmt;                                                                  \
        leave(self);                                                           \
    } while (0)
#define STORE_CALL(self, stmt) CALL_WITH(store_enter, store_leave, self, NOGIL(stmt))
#define REMOTE_CALL(self, stmt) CALL_WITH(remote_enter, remote_leave, self, NOGIL(stmt))
#define SESS_CALL(self, stmt) CALL_WITH(sess_enter, sess_leave, self, stmt)
#define SESS_CALL_NOGIL(self, stmt) SESS_CALL(self, NOGIL(stmt))

/* --- Progress callbacks -------------------------------------------------------
 *
 * A long call runs without the GIL; its progress callback takes the GIL
 * back only to call the Python callable. An exception in the callable ends
 * the calls to it and is raised when the operation returns (the library's
 * callback cannot stop the operation). */

typedef struct progress {
    PyObject *fn;       /* the callable, or NULL */
    PyThreadState *ts;  /* the caller's thread state while the GIL is out */
    PyObject *type, *value, *tb; /* the callable's exception */
} progress;

static void progress_cb(void *arg, uint64_t done, uint64_t total)
{
    progress *p = arg;
    if (p->type)
        return;
    PyEval_RestoreThread(p->ts);
    PyObject *r = PyObject_CallFunction(p->fn, "KK", (unsigned long long)done,
                                        (unsigned long long)total);
    if (r)
        Py_DECREF(r);
    else
        PyErr_Fetch(&p->type, &p->value, &p->tb);
    p->ts = PyEval_SaveThread();
}

/* "O&" converter: None or a callable. */
static int conv_progress(PyObject *o, void *out)
{
    progress *p = out;
    memset(p, 0, sizeof *p);
    if (o == Py_None)
        return 1;
    if (!PyCallable_Check(o)) {
        PyErr_Format(PyExc_TypeError, "progress must be a callable(done, total) or None, not %R",
                     o);
        return 0;
    }
    p->fn = o;
    return 1;
}

#define PROGRESS_FN(p) ((p)->fn ? progress_cb : NULL)

/* Releases the GIL; the call between progress_begin() and progress_end()
 * may call back. */
static void progress_begin(progress *p)
{
    p->ts = PyEval_SaveThread();
}

/* Takes the GIL back; -1 (the callable's exception set) if it raised. */
static int progress_end(progress *p)
{
    PyEval_RestoreThread(p->ts);
    if (!p->type)
        return 0;
    PyErr_Restore(p->type, p->value, p->tb);
    p->type = p->value = p->tb = NULL;
    return -1;
}

/* --- Store ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ctxs_store *st;    /* NULL before open and once really closed */
    int closed;        /* close() was called: every call refuses */
    Py_ssize_t users;  /* calls in flight + open sessions' mappings */
    pid_t pid;         /* the process that opened st */
    PyObject *weakrefs;
} StoreObject;

static void store_really_close(StoreObject *self)
{
    ctxs_store *st = self->st;
    self->st = NULL;
    if (st && self->pid == getpid()) {
        NOGIL(ctxs_store_close(st));
    }
}

/* Takes a use of the store for a call; 0, or -1 with Error set. */
static int store_enter(StoreObject *self)
{
    if (!self->st || self->closed) {
        raise_closed("store");
        return -1;
    }
    self->users++;
    return 0;
}

static void store_leave(StoreObject *self)
{
    if (--self->users == 0 && self->closed)
        store_really_close(self);
}

static PyObject *Store_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    StoreObject *self = (StoreObject *)type->tp_alloc(type, 0);
    if (self)
        self->closed = 1;
    return (PyObject *)self;
}

static void Store_dealloc(StoreObject *self)
{
    /* Sessions hold a reference, so nothing uses st any more. */
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    store_really_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* --- Mapping: owns the session handle; views keep it alive ----------------- */

typedef struct {
    PyObject_HEAD
    ctxs_session *s;
    StoreObject *store; /* a use of it, or NULL */
    pid_t pid;
} MappingObject;

static void Mapping_dealloc(MappingObject *self)
{
    ctxs_session *s = self->s;
    self->s = NULL;
    if (s && self->pid == getpid()) {
        NOGIL(ctxs_session_close(s));
    }
    if (self->store) {
        store_leave(self->store);
        Py_CLEAR(self->store);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ctxstore._ctxstore.Mapping",
    .tp_doc = "A session's mapping: what views over it keep alive. "
              "The session's file is closed when the last reference goes.",
    .tp_basicsize = sizeof(MappingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Mapping_dealloc,
};

/* --- Session -------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    MappingObject *map;  /* NULL before open and after close */
    ctxs_session *s;     /* map->s while open, else NULL */
    ctxs_layout layout;  /* valid while map is: pointers into the mapping */
    int readonly;
    PyThread_type_lock lock; /* one call at a time on s */
    PyObject *weakrefs;
} SessionObject;

static PyTypeObject SessionType;

/* Takes the session's lock (waiting without the GIL); 0, or -1 with Error
 * set when the session is closed. Arguments that may call back into Python
 * are converted before this, never while the lock is held. */
static int sess_enter(SessionObject *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        NOGIL(PyThread_acquire_lock(self->lock, WAIT_LOCK));
    }
    if (!self->s) {
        PyThread_release_lock(self->lock);
        raise_closed("session");
        return -1;
    }
    return 0;
}

static void sess_leave(SessionObject *self)
{
    PyThread_release_lock(self->lock);
}

static PyObject *Session_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    SessionObject *self = (SessionObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void Session_dealloc(SessionObject *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    self->s = NULL;
    Py_CLEAR(self->map);
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Gives a freshly opened handle to self (which must not be open yet):
 * makes its Mapping, reads the layout. On failure closes s. */
static PyObject *sess_attach(SessionObject *self, ctxs_session *s,
                             StoreObject *store)
{
    MappingObject *m = PyObject_New(MappingObject, &MappingType);
    if (!m) {
        NOGIL(ctxs_session_close(s));
        return NULL;
    }
    m->s = s;
    m->pid = getpid();
    m->store = NULL;
    if (store) {
        Py_INCREF(store);
        store->users++;
        m->store = store;
    }
    ctxs_session_info info;
    int rc = ctxs_session_get_layout(&self->layout, s);
    if (rc == 0)
        rc = ctxs_session_get_info(&info, s);
    if (rc < 0) {
        Py_DECREF(m);
        return raise_rc(rc, "session layout");
    }
    self->readonly = (info.flags & CTXS_INFO_READONLY) != 0;
    self->map = m;
    self->s = s;
    Py_RETURN_NONE;
}

static int sess_check_fresh(SessionObject *self)
{
    if (self->map) {
        PyErr_SetString(PyExc_RuntimeError, "the session object is already open");
        return -1;
    }
    return 0;
}

/* "O&": a Session not yet open (what Session.__new__ made), or None. */
static int conv_fresh_session(PyObject *o, void *out)
{
    if (o == Py_None) {
        *(SessionObject **)out = NULL;
        return 1;
    }
    if (!PyObject_TypeCheck(o, &SessionType)) {
        PyErr_SetString(PyExc_TypeError, "a Session or None");
        return 0;
    }
    if (sess_check_fresh((SessionObject *)o) < 0)
        return 0;
    *(SessionObject **)out = (SessionObject *)o;
    return 1;
}

/* "O&": a Session not yet open (None refused). */
static int conv_new_session(PyObject *o, void *out)
{
    if (o == Py_None) {
        PyErr_SetString(PyExc_TypeError, "a Session, not None");
        return 0;
    }
    return conv_fresh_session(o, out);
}

/* None, or the create options (conv_create_opts). */
static int conv_create_opts_or_none(PyObject *o, void *out)
{
    ctxs_create_options **pp = out;
    if (o == Py_None) {
        *pp = NULL;
        return 1;
    }
    return conv_create_opts(o, *pp);
}

/* _file(path, model or None, flags, create_opts or None, open_opts): creates
 * the session file (with create options) or opens it. */
static PyObject *Session__file(SessionObject *self, PyObject *args)
{
    PyObject *path = NULL, *ret = NULL;
    ctxs_model model, *mp = &model;
    unsigned flags;
    ctxs_create_options co, *cop = &co;
    ctxs_open_options oo;
    ctxs_session *s = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "O&O&IO&O&:_file", conv_path, &path, conv_model_or_none, &mp,
                          &flags, conv_create_opts_or_none, &cop, conv_open_opts, &oo) ||
        sess_check_fresh(self) < 0)
        goto out;
    const char *p = PyBytes_AS_STRING(path);
    NOGIL(rc = cop ? ctxs_session_create(&s, p, mp, cop) : ctxs_session_open(&s, p, mp, flags, &oo));
    ret = rc < 0 ? raise_rc(rc, "%s '%s'", cop ? "create" : "open", p) : sess_attach(self, s, NULL);
out:
    Py_XDECREF(path);
    return ret;
}

static PyObject *Session__fork_to(SessionObject *self, PyObject *args)
{
    SessionObject *dst;
    PyObject *path = NULL;
    uint64_t n;
    ctxs_open_options o;
    if (!PyArg_ParseTuple(args, "O!O&O&O&:_fork_to", &SessionType, &dst, conv_path,
                          &path, conv_u64_or_all, &n, conv_open_opts, &o))
        goto out;
    if (sess_check_fresh(dst) < 0 || sess_enter(self) < 0)
        goto out;
    ctxs_session *s;
    int rc;
    NOGIL(rc = ctxs_session_fork(&s, self->s, PyBytes_AS_STRING(path), n, &o));
    sess_leave(self);
    if (rc < 0) {
        raise_rc(rc, "fork to '%s'", PyBytes_AS_STRING(path));
        goto out;
    }
    Py_DECREF(path);
    return sess_attach(dst, s, NULL);
out:
    Py_XDECREF(path);
    return NULL;
}

static PyObject *Session_close(SessionObject *self, PyObject *unused)
{
    (void)unused;
    /* Waits for a call in flight on another thread; then the handle is
     * closed now, or by the last view (Mapping_dealloc). */
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        NOGIL(PyThread_acquire_lock(self->lock, WAIT_LOCK));
    }
    MappingObject *m = self->map;
    self->map = NULL;
    self->s = NULL;
    PyThread_release_lock(self->lock);
    Py_XDECREF(m);
    Py_RETURN_NONE;
}

static PyObject *Session_get_closed(SessionObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->s == NULL);
}

static PyObject *Session_get_readonly(SessionObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->readonly);
}

static PyObject *Session_get_n_tokens(SessionObject *self, void *c)
{
    (void)c;
    ctxs_session_info info;
    int rc;
    SESS_CALL(self, rc = ctxs_session_get_info(&info, self->s));
    if (rc < 0)
        return raise_rc(rc, "n_tokens");
    return PyLong_FromUnsignedLongLong(info.n_tokens);
}

static PyObject *Session__layout(SessionObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->s)
        return raise_closed("session");
    const ctxs_layout *L = &self->layout;
    return Py_BuildValue("(IIIIII)", L->geometry.n_layers, L->geometry.n_kv_heads,
                         L->geometry.head_dim, L->geometry.dtype, L->capacity,
                         L->n_sink);
}

static PyObject *Session__reserve(SessionObject *self, PyObject *arg)
{
    uint32_t n;
    ctxs_reservation r;
    int rc;
    if (!conv_u32(arg, &n))
        return NULL;
    SESS_CALL_NOGIL(self, rc = ctxs_session_reserve(&r, self->s, n));
    if (rc < 0)
        return raise_rc(rc, "reserve(%u)", n);
    return Py_BuildValue("(KIN)", (unsigned long long)r.first_pos, r.n_tokens,
                         tuple_of(r.spans, r.n_spans, sizeof r.spans[0], slot_span));
}

/* The reservation tuple that Session.reserve() returned: 1, or 0 with an
 * error set. Its spans are not needed by the write calls. */
static int reservation_arg(PyObject *res, ctxs_reservation *r)
{
    if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 3 &&
        conv_u64(PyTuple_GET_ITEM(res, 0), &r->first_pos) &&
        conv_u32(PyTuple_GET_ITEM(res, 1), &r->n_tokens))
        return 1;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "reservation must be what Session.reserve() returned");
    return 0;
}

/* k or v of write_token (lead = n_layers) or write_layer (lead = 0: any
 * number of tokens): float32 or float16, [lead, n_kv_heads, head_dim],
 * made C-contiguous. */
static PyArrayObject *kv_array(SessionObject *self, PyObject *o, const char *what,
                               npy_intp lead)
{
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(o, NPY_NOTYPE, 0, 0, 0);
    if (!a)
        return NULL;
    int t = PyArray_TYPE(a);
    if (t != NPY_FLOAT32 && t != NPY_FLOAT16) {
        PyErr_Format(PyExc_TypeError, "%s must be float32 or float16, not %s", what,
                     PyArray_DESCR(a)->typeobj->tp_name);
        goto fail;
    }
    const ctxs_geometry *g = &self->layout.geometry;
    npy_intp want[3] = {lead, g->n_kv_heads, g->head_dim};
    if (PyArray_NDIM(a) != 3 || (lead ? PyArray_DIM(a, 0) != lead : PyArray_DIM(a, 0) < 1) ||
        PyArray_DIM(a, 1) != want[1] || PyArray_DIM(a, 2) != want[2]) {
        PyObject *shape = PyObject_GetAttrString((PyObject *)a, "shape");
        if (lead)
            PyErr_Format(PyExc_ValueError,
                         "%s must have shape (%zd, %zd, %zd) [n_layers, n_kv_heads, head_dim], not %R",
                         what, (Py_ssize_t)want[0], (Py_ssize_t)want[1],
                         (Py_ssize_t)want[2], shape ? shape : Py_None);
        else
            PyErr_Format(PyExc_ValueError,
                         "%s must have shape (n, %zd, %zd) [tokens, n_kv_heads, head_dim], not %R",
                         what, (Py_ssize_t)want[1], (Py_ssize_t)want[2], shape ? shape : Py_None);
        Py_XDECREF(shape);
        goto fail;
    }
    PyArrayObject *c = (PyArrayObject *)PyArray_FROMANY((PyObject *)a, t, 3, 3,
                                                        NPY_ARRAY_CARRAY_RO);
    Py_DECREF(a);
    return c;
fail:
    Py_DECREF(a);
    return NULL;
}

static PyObject *Session_write_token(SessionObject *self, PyObject *args,
                                     PyObject *kw)
{
    static char *kwlist[] = {"reservation", "i", "k", "v", NULL};
    PyObject *res, *ko, *vo;
    uint32_t i;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&OO:write_token", kwlist, &res,
                                     conv_u32, &i, &ko, &vo))
        return NULL;
    if (!self->s)
        return raise_closed("session");
    ctxs_reservation r = {0};
    if (!reservation_arg(res, &r))
        return NULL;
    PyArrayObject *k = kv_array(self, ko, "k", self->layout.geometry.n_layers);
    PyArrayObject *v = k ? kv_array(self, vo, "v", self->layout.geometry.n_layers) : NULL;
    PyObject *ret = NULL;
    if (!v)
        goto out;
    if (PyArray_TYPE(k) != PyArray_TYPE(v)) {
        PyErr_SetString(PyExc_TypeError, "k and v must have the same dtype");
        goto out;
    }
    uint32_t dtype = PyArray_TYPE(k) == NPY_FLOAT32 ? CTXS_DTYPE_F32 : CTXS_DTYPE_F16;
    if (sess_enter(self) < 0)
        goto out;
    int rc;
    NOGIL(rc = ctxs_session_write_token(self->s, &r, i, PyArray_DATA(k), PyArray_DATA(v),
                                        dtype)); /* it may write the file */
    sess_leave(self);
    if (rc < 0) {
        raise_rc(rc, "write_token(i=%u) of a reservation of %u at %llu", i,
                 r.n_tokens, (unsigned long long)r.first_pos);
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    Py_XDECREF(k);
    Py_XDECREF(v);
    return ret;
}

static PyObject *Session_write_layer(SessionObject *self, PyObject *args,
                                     PyObject *kw)
{
    static char *kwlist[] = {"reservation", "layer", "i", "k", "v", NULL};
    PyObject *res, *ko, *vo;
    uint32_t layer, i;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO&O&OO:write_layer", kwlist, &res,
                                     conv_u32, &layer, conv_u32, &i, &ko, &vo))
        return NULL;
    if (!self->s)
        return raise_closed("session");
    ctxs_reservation r = {0};
    if (!reservation_arg(res, &r))
        return NULL;
    PyArrayObject *k = kv_array(self, ko, "k", 0), *v = k ? kv_array(self, vo, "v", 0) : NULL;
    PyObject *ret = NULL;
    if (!v)
        goto out;
    if (PyArray_TYPE(k) != PyArray_TYPE(v) || PyArray_DIM(k, 0) != PyArray_DIM(v, 0)) {
        PyErr_SetString(PyExc_TypeError, "k and v must have the same dtype and shape");
        goto out;
    }
    if (PyArray_DIM(k, 0) > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many tokens");
        goto out;
    }
    uint32_t n = (uint32_t)PyArray_DIM(k, 0);
    uint32_t dtype = PyArray_TYPE(k) == NPY_FLOAT32 ? CTXS_DTYPE_F32 : CTXS_DTYPE_F16;
    if (sess_enter(self) < 0)
        goto out;
    int rc;
    NOGIL(rc = ctxs_session_write_layer(self->s, &r, layer, i, n, PyArray_DATA(k),
                                        PyArray_DATA(v), dtype)); /* it may write the file */
    sess_leave(self);
    if (rc < 0) {
        raise_rc(rc, "write_layer(layer=%u, i=%u, n=%u) of a reservation of %u at %llu", layer,
                 i, n, r.n_tokens, (unsigned long long)r.first_pos);
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    Py_XDECREF(k);
    Py_XDECREF(v);
    return ret;
}

static PyObject *Session_commit(SessionObject *self, PyObject *arg)
{
    PyArrayObject *ids = token_array(arg);
    if (!ids)
        return NULL;
    npy_intp n = PyArray_SIZE(ids);
    if (n > (npy_intp)UINT32_MAX) {
        Py_DECREF(ids);
        return raise_rc(CTXS_EINVAL, "commit of %zd tokens", (Py_ssize_t)n);
    }
    if (sess_enter(self) < 0) {
        Py_DECREF(ids);
        return NULL;
    }
    int rc;
    const uint32_t *p = PyArray_DATA(ids);
    /* An empty array's data may be NULL; the library refuses n == 0 itself. */
    static const uint32_t none[1];
    if (n == 0)
        p = none;
    NOGIL(rc = ctxs_session_commit(self->s, p, (uint32_t)n));
    sess_leave(self);
    Py_DECREF(ids);
    return rc < 0 ? raise_rc(rc, "commit of %zd tokens", (Py_ssize_t)n) : Py_NewRef(Py_None);
}

static PyObject *Session_rollback(SessionObject *self, PyObject *arg)
{
    uint64_t n;
    int rc;
    if (!conv_u64(arg, &n))
        return NULL;
    SESS_CALL_NOGIL(self, rc = ctxs_session_rollback(self->s, n));
    return rc < 0 ? raise_rc(rc, "rollback(%llu)", (unsigned long long)n) : Py_NewRef(Py_None);
}

/* The calls that take only the session: sync, refresh, prefetch. */
#define SESSION_SIMPLE(pyname, call)                                           \
    static PyObject *Session_##pyname(SessionObject *self, PyObject *unused)   \
    {                                                                          \
        (void)unused;                                                          \
        int rc;                                                                \
        SESS_CALL_NOGIL(self, rc = call(self->s));                             \
        return rc < 0 ? raise_rc(rc, #pyname "()") : Py_NewRef(Py_None);       \
    }

SESSION_SIMPLE(sync, ctxs_session_sync)
SESSION_SIMPLE(refresh, ctxs_session_refresh)
SESSION_SIMPLE(prefetch, ctxs_session_prefetch)

static PyObject *verify_error(int rc, uint64_t bad, const char *what)
{
    raise_rc(rc, "%s: the token at position %llu does not match its checksum",
             what, (unsigned long long)bad);
    if (rc == CTXS_ECORRUPT) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *pos = PyLong_FromUnsignedLongLong(bad);
        if (pos && value)
            PyObject_SetAttrString(value, "pos", pos);
        Py_XDECREF(pos);
        PyErr_Restore(type, value, tb);
    }
    return NULL;
}

static PyObject *Session_verify(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"from_pos", "to_pos", NULL};
    uint64_t from = 0, to = UINT64_MAX, bad = 0;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&O&:verify", kwlist, conv_u64,
                                     &from, conv_u64_or_all, &to))
        return NULL;
    SESS_CALL_NOGIL(self, rc = ctxs_session_verify_range(&bad, self->s, from, to));
    if (rc == CTXS_ECORRUPT)
        return verify_error(rc, bad, "verify");
    return rc < 0 ? raise_rc(rc, "verify") : Py_NewRef(Py_None);
}

static PyObject *Session__info(SessionObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_session_info i;
    int rc;
    SESS_CALL(self, rc = ctxs_session_get_info(&i, self->s));
    if (rc < 0)
        return raise_rc(rc, "info");
    return Py_BuildValue("(NIIIIKKIIIIKKKKKI)", model_tuple(&i.model), i.format_major,
                         i.format_minor, i.capacity, i.n_sink,
                         (unsigned long long)i.n_tokens,
                         (unsigned long long)i.ring_start, i.n_held, i.n_reserved,
                         i.window, i.durability, (unsigned long long)i.seq,
                         (unsigned long long)i.verified_from,
                         (unsigned long long)i.lost_tokens,
                         (unsigned long long)i.file_bytes,
                         (unsigned long long)i.created_unix_ms, i.flags);
}

static PyObject *Session__window(SessionObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_window w;
    int rc;
    SESS_CALL(self, rc = ctxs_session_get_window(&w, self->s));
    if (rc < 0)
        return raise_rc(rc, "window");
    return Py_BuildValue("(IN)", w.n_tokens,
                         tuple_of(w.spans, w.n_spans, sizeof w.spans[0], slot_span));
}

static PyObject *Session_set_window(SessionObject *self, PyObject *arg)
{
    uint32_t w;
    if (!conv_u32(arg, &w))
        return NULL;
    int rc;
    SESS_CALL(self, rc = ctxs_session_set_window(self->s, w));
    return rc < 0 ? raise_rc(rc, "set_window(%u)", w) : Py_NewRef(Py_None);
}

/* _attn_plan(n_pending, layer or None): the session's plan, or that of
 * one layer (ctxs_session_get_layer_attn()). */
static PyObject *Session__attn_plan(SessionObject *self, PyObject *args)
{
    uint32_t n_pending, layer = 0;
    PyObject *layer_or_none;
    ctxs_attn_plan p;
    if (!PyArg_ParseTuple(args, "O&O", conv_u32, &n_pending, &layer_or_none) ||
        (layer_or_none != Py_None && !conv_u32(layer_or_none, &layer)))
        return NULL;
    int rc;
    if (layer_or_none == Py_None) {
        SESS_CALL(self, rc = ctxs_session_get_attn_plan(&p, self->s, n_pending));
    } else {
        ctxs_layout unused;
        SESS_CALL(self, rc = ctxs_session_get_layer_attn(&unused, &p, self->s, layer, n_pending));
    }
    if (rc < 0)
        return layer_or_none == Py_None
                   ? raise_rc(rc, "attn_plan(n_pending=%u)", n_pending)
                   : raise_rc(rc, "attn_plan(n_pending=%u, layer=%u)", n_pending, layer);
    return Py_BuildValue("(KKIIIN)", (unsigned long long)p.n_tokens,
                         (unsigned long long)p.first_query, p.n_sink, p.window, p.n_keys,
                         tuple_of(p.spans, p.n_spans, sizeof p.spans[0], attn_span));
}

static PyObject *Session_read_token(SessionObject *self, PyObject *arg)
{
    uint64_t pos;
    if (!conv_u64(arg, &pos))
        return NULL;
    if (!self->s)
        return raise_closed("session");
    const ctxs_geometry *g = &self->layout.geometry;
    npy_intp dims[3] = {g->n_layers, g->n_kv_heads, g->head_dim};
    PyObject *k = PyArray_SimpleNew(3, dims, NPY_FLOAT32);
    PyObject *v = k ? PyArray_SimpleNew(3, dims, NPY_FLOAT32) : NULL;
    if (!v || sess_enter(self) < 0) {
        Py_XDECREF(k);
        Py_XDECREF(v);
        return NULL;
    }
    int rc = ctxs_session_read_token(PyArray_DATA((PyArrayObject *)k),
                                     PyArray_DATA((PyArrayObject *)v), self->s, pos,
                                     CTXS_DTYPE_F32);
    sess_leave(self);
    if (rc < 0) {
        Py_DECREF(k);
        Py_DECREF(v);
        return raise_rc(rc, "read_token(%llu)", (unsigned long long)pos);
    }
    return Py_BuildValue("(NN)", k, v);
}

static PyObject *Session_tokens(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"from_pos", "n", NULL};
    uint64_t from = 0, n = UINT64_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&O&:tokens", kwlist, conv_u64,
                                     &from, conv_u64_or_all, &n))
        return NULL;
    if (n == UINT64_MAX) {
        ctxs_session_info info;
        if (sess_enter(self) < 0)
            return NULL;
        int rc = ctxs_session_get_info(&info, self->s);
        sess_leave(self);
        if (rc < 0)
            return raise_rc(rc, "tokens");
        n = info.n_tokens > from ? info.n_tokens - from : 0;
    }
    if (n > UINT32_MAX)
        return raise_rc(CTXS_EINVAL, "tokens(%llu, %llu)", (unsigned long long)from,
                        (unsigned long long)n);
    /* Allocated before the lock is taken: an allocation may run a
     * collection, and a finalizer could call back into this session. */
    npy_intp dims[1] = {(npy_intp)n};
    PyObject *a = PyArray_SimpleNew(1, dims, NPY_UINT32);
    if (!a)
        return NULL;
    if (sess_enter(self) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    static uint32_t none[1];
    int rc = ctxs_session_get_tokens(n ? PyArray_DATA((PyArrayObject *)a) : none,
                                     self->s, from, (uint32_t)n);
    sess_leave(self);
    if (rc < 0) {
        Py_DECREF(a);
        return raise_rc(rc, "tokens(%llu, %llu)", (unsigned long long)from,
                        (unsigned long long)n);
    }
    return a;
}

static PyObject *Session_slot(SessionObject *self, PyObject *arg)
{
    uint64_t pos;
    uint32_t slot;
    if (!conv_u64(arg, &pos))
        return NULL;
    int rc;
    SESS_CALL(self, rc = ctxs_session_get_slot(&slot, self->s, pos));
    if (rc < 0)
        return raise_rc(rc, "slot(%llu)", (unsigned long long)pos);
    return PyLong_FromUnsignedLong(slot);
}

/* A view over the mapping: K or V of one layer [kv_heads, capacity,
 * head_dim], or its Q8 scales [kv_heads, capacity]; base = the Mapping. */
static PyObject *sess_view(SessionObject *self, PyObject *arg, int kind, int scales)
{
    /* Any integer: a layer below 0 is out of range as one past the last
     * is (an IndexError either way), not a conversion's ValueError. */
    long long want = PyLong_AsLongLong(arg);
    if (want == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        want = LLONG_MAX;
    }
    if (!self->map)
        return raise_closed("session");
    const ctxs_layout *L = &self->layout;
    const ctxs_geometry *g = &L->geometry;
    if (want < 0 || want >= (long long)g->n_layers) {
        PyErr_Format(PyExc_IndexError, "layer %R out of range: the session has %u layers, "
                     "0 to %u", arg, g->n_layers, g->n_layers - 1);
        return NULL;
    }
    uint32_t layer = (uint32_t)want;
    npy_intp dims[3], strides[3];
    int nd, type;
    char *data;
    /* With a layer schedule each layer has its own slots (a windowed
     * layer's ring): the layout's strides are not its. Its runs, from the
     * library: K's then V's, head after head. */
    char *run_k = (char *)L->kv + (size_t)layer * L->layer_stride;
    size_t head_stride = L->head_stride;
    uint32_t cap = L->capacity;
    float *run_scales = L->scales ? L->scales + (size_t)layer * 2 * g->n_kv_heads * cap : NULL;
    if (g->period) {
        void *k0;
        int rc = ctxs_session_get_kv(&k0, self->s, layer, CTXS_K, 0);
        if (rc == 0)
            rc = ctxs_session_get_layer_slots(&cap, self->s, layer);
        if (rc < 0)
            return raise_rc(rc, "the runs of layer %u", layer);
        run_k = k0;
        head_stride = (size_t)cap * L->slot_bytes;
        if (L->scales && (rc = ctxs_session_get_scales(&run_scales, self->s, layer, CTXS_K, 0)) < 0)
            return raise_rc(rc, "the scales of layer %u", layer);
    }
    if (scales) {
        if (g->dtype != CTXS_DTYPE_Q8 || !L->scales)
            return raise_rc(CTXS_EINVAL, "%s_scales(%u): only a Q8 session has scales",
                            kind ? "v" : "k", layer);
        nd = 2;
        type = NPY_FLOAT32;
        dims[0] = g->n_kv_heads;
        dims[1] = cap;
        strides[0] = (npy_intp)cap * 4;
        strides[1] = 4;
        data = (char *)(run_scales + (size_t)kind * g->n_kv_heads * cap);
    } else {
        switch (g->dtype) {
        case CTXS_DTYPE_F16: type = NPY_FLOAT16; break;
        case CTXS_DTYPE_BF16: type = NPY_UINT16; break;
        case CTXS_DTYPE_Q8: type = NPY_INT8; break;
        default: return raise_rc(CTXS_EINVAL, "a session of dtype %u", g->dtype);
        }
        nd = 3;
        dims[0] = g->n_kv_heads;
        dims[1] = cap;
        dims[2] = g->head_dim;
        strides[0] = (npy_intp)head_stride;
        strides[1] = (npy_intp)L->slot_bytes;
        strides[2] = (npy_intp)(L->slot_bytes / g->head_dim);
        data = run_k + (size_t)kind * g->n_kv_heads * head_stride;
    }
    int flags = NPY_ARRAY_ALIGNED | (self->readonly ? 0 : NPY_ARRAY_WRITEABLE);
    PyObject *a = PyArray_New(&PyArray_Type, nd, dims, type, strides, data, 0, flags,
                              NULL);
    if (!a)
        return NULL;
    Py_INCREF(self->map);
    if (PyArray_SetBaseObject((PyArrayObject *)a, (PyObject *)self->map) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

static PyObject *Session_k(SessionObject *self, PyObject *arg)
{
    return sess_view(self, arg, CTXS_K, 0);
}

static PyObject *Session_v(SessionObject *self, PyObject *arg)
{
    return sess_view(self, arg, CTXS_V, 0);
}

static PyObject *Session_k_scales(SessionObject *self, PyObject *arg)
{
    return sess_view(self, arg, CTXS_K, 1);
}

static PyObject *Session_v_scales(SessionObject *self, PyObject *arg)
{
    return sess_view(self, arg, CTXS_V, 1);
}

/* --- Checkpoints ---------------------------------------------------------- */

#define SESSION_NAMED(pyname, call, op)                                        \
    static PyObject *Session_##pyname(SessionObject *self, PyObject *args)     \
    {                                                                          \
        const char *name;                                                      \
        int rc;                                                                \
        if (!PyArg_ParseTuple(args, "s:" #pyname, &name))                      \
            return NULL;                                                       \
        SESS_CALL_NOGIL(self, rc = call(self->s, name));                       \
        return rc < 0 ? raise_names(rc, op, name, NULL) : Py_NewRef(Py_None);  \
    }

SESSION_NAMED(checkpoint, ctxs_checkpoint_create, "checkpoint")
SESSION_NAMED(restore, ctxs_checkpoint_restore, "restore checkpoint")
SESSION_NAMED(delete_checkpoint, ctxs_checkpoint_delete, "delete checkpoint")

static PyObject *Session__checkpoints(SessionObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_checkpoint_entry *e;
    size_t n;
    int rc;
    SESS_CALL(self, rc = ctxs_checkpoint_list(&e, &n, self->s));
    if (rc < 0)
        return raise_rc(rc, "checkpoints");
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *t = Py_BuildValue("(sKKO)", e[i].name, (unsigned long long)e[i].n_tokens,
                                    (unsigned long long)e[i].created_unix_ms,
                                    e[i].stale ? Py_True : Py_False);
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    ctxs_free(e);
    return l;
}

#define NOARGS(f) (PyCFunction)(void (*)(void))(f), METH_NOARGS
#define ONEARG(f) (PyCFunction)(void (*)(void))(f), METH_O
#define VARARGS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS
#define KWARGS(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

static PyMethodDef Session_methods[] = {
    {"_file", VARARGS(Session__file), NULL},
    {"_fork_to", VARARGS(Session__fork_to), NULL},
    {"_layout", NOARGS(Session__layout), NULL},
    {"_reserve", ONEARG(Session__reserve), NULL},
    {"_info", NOARGS(Session__info), NULL},
    {"_window", NOARGS(Session__window), NULL},
    {"_attn_plan", (PyCFunction)Session__attn_plan, METH_VARARGS, NULL},
    {"_checkpoints", NOARGS(Session__checkpoints), NULL},
    {"close", NOARGS(Session_close),
     "close($self, /)\n--\n\n"
     "Close the session. Every later call on it raises ctxstore.Error. The\n"
     "file itself is closed (ctxs_session_close: unmapped, writer lock\n"
     "released) at once when no view of it (k(), v(), ..., torch_k(), ...)\n"
     "is alive, else when the last one is garbage-collected: views stay\n"
     "valid. Idempotent."},
    {"write_token", KWARGS(Session_write_token),
     "write_token($self, /, reservation, i, k, v)\n--\n\n"
     "Store token i of a reservation (from reserve()). k and v are NumPy\n"
     "arrays (or anything np.asarray takes) of float32 or float16, shaped\n"
     "[n_layers, n_kv_heads, head_dim], converted to the session's dtype\n"
     "(Q8 is quantized). TypeError/ValueError for another dtype or shape."},
    {"write_layer", KWARGS(Session_write_layer),
     "write_layer($self, /, reservation, layer, i, k, v)\n--\n\n"
     "Store tokens i .. i + n - 1 of a reservation (from reserve()) for one\n"
     "layer, as a forward pass produces them: k and v are NumPy arrays (or\n"
     "anything np.asarray takes) of float32 or float16, shaped [n, n_kv_heads,\n"
     "head_dim], converted to the session's dtype exactly as write_token\n"
     "converts (Q8 is quantized). In the session, and in the views, when it\n"
     "returns; never a page fault on the mapping (ctxs_session_write_layer).\n"
     "TypeError/ValueError for another dtype or shape. Releases the GIL."},
    {"commit", ONEARG(Session_commit),
     "commit($self, token_ids, /)\n--\n\n"
     "Commit the first len(token_ids) reserved tokens with their ids (a\n"
     "sequence of ints in 0..2**32-1 or a np.uint32 array): checksums them,\n"
     "writes the commit record, syncs by the durability. Reserved tokens past\n"
     "them are released. Releases the GIL."},
    {"rollback", ONEARG(Session_rollback),
     "rollback($self, n_tokens, /)\n--\n\n"
     "Roll the committed token count back to n_tokens (durable at return)."},
    {"sync", NOARGS(Session_sync),
     "sync($self, /)\n--\n\nMake everything committed durable, as a FULL commit does."},
    {"refresh", NOARGS(Session_refresh),
     "refresh($self, /)\n--\n\nRe-read the newest commit record (a reader following a writer)."},
    {"prefetch", NOARGS(Session_prefetch),
     "prefetch($self, /)\n--\n\nBring the attention window into memory and return once it is in."},
    {"verify", KWARGS(Session_verify),
     "verify($self, /, from_pos=0, to_pos=None)\n--\n\n"
     "Check the checksum of every held token (in [from_pos, to_pos)). A bad\n"
     "token raises ctxstore.Error CTXS_ECORRUPT whose .pos is its position.\n"
     "Reads the whole KV region; releases the GIL."},
    {"set_window", ONEARG(Session_set_window),
     "set_window($self, window, /)\n--\n\n"
     "Set the attention window (recent tokens beside the sinks); 0 = all held."},
    {"read_token", ONEARG(Session_read_token),
     "read_token($self, pos, /)\n--\n\n"
     "(k, v) of committed token pos: two float32 arrays [n_layers, n_kv_heads,\n"
     "head_dim], copies (Q8 gives scale * q)."},
    {"tokens", KWARGS(Session_tokens),
     "tokens($self, /, from_pos=0, n=None)\n--\n\n"
     "The token ids of committed positions [from_pos, from_pos + n) as a\n"
     "np.uint32 array; n=None: up to the last committed one."},
    {"slot", ONEARG(Session_slot),
     "slot($self, pos, /)\n--\n\nThe slot (index in the capacity axis) that holds position pos."},
    {"k", ONEARG(Session_k),
     "k($self, layer, /)\n--\n\n"
     "The keys of one layer, in place: a NumPy array [n_kv_heads, capacity,\n"
     "head_dim] over the mapping (no copy): float16 for an f16 session,\n"
     "uint16 holding bfloat16 bits for bf16, int8 for Q8 (scales in\n"
     "k_scales()). Writable for a writer (write only reserved slots), read-\n"
     "only for a read-only open. It keeps the mapping alive (see close())."},
    {"v", ONEARG(Session_v),
     "v($self, layer, /)\n--\n\nThe values of one layer, in place: as k()."},
    {"k_scales", ONEARG(Session_k_scales),
     "k_scales($self, layer, /)\n--\n\n"
     "A Q8 session's key scales of one layer: float32 [n_kv_heads, capacity]\n"
     "over the mapping; element e of a slot is scale * q[e]."},
    {"v_scales", ONEARG(Session_v_scales),
     "v_scales($self, layer, /)\n--\n\nA Q8 session's value scales of one layer, as k_scales()."},
    {"checkpoint", VARARGS(Session_checkpoint),
     "checkpoint($self, name, /)\n--\n\n"
     "Name the current token count (a session opened through a Store)."},
    {"restore", VARARGS(Session_restore),
     "restore($self, name, /)\n--\n\nRoll back to a checkpoint, in O(1)."},
    {"delete_checkpoint", VARARGS(Session_delete_checkpoint),
     "delete_checkpoint($self, name, /)\n--\n\nDelete a checkpoint."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Session_getset[] = {
    {"closed", (getter)Session_get_closed, NULL, "True once close() was called.", NULL},
    {"readonly", (getter)Session_get_readonly, NULL, "True for a read-only open.", NULL},
    {"n_tokens", (getter)Session_get_n_tokens, NULL,
     "Tokens committed since the start (positions 0 .. n_tokens - 1).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* The base types that __init__.py subclasses: Prefix_new, _dealloc,
 * _methods and _getset, a weakrefs field in PrefixObject. */
#define BASE_TYPE(Prefix, pyname)                                              \
    static PyTypeObject Prefix##Type = {                                       \
        PyVarObject_HEAD_INIT(NULL, 0)                                         \
        .tp_name = "ctxstore._ctxstore." #Prefix "Base",                       \
        .tp_doc = "The C half of ctxstore." pyname ".",                        \
        .tp_basicsize = sizeof(Prefix##Object),                                \
        .tp_weaklistoffset = offsetof(Prefix##Object, weakrefs),               \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,                  \
        .tp_new = Prefix##_new,                                                \
        .tp_dealloc = (destructor)Prefix##_dealloc,                            \
        .tp_methods = Prefix##_methods,                                        \
        .tp_getset = Prefix##_getset,                                          \
    }

BASE_TYPE(Session, "Session");

/* --- Store methods -------------------------------------------------------- */

static PyObject *Store__open(StoreObject *self, PyObject *args)
{
    PyObject *path = NULL;
    unsigned flags;
    ctxs_store *st = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "O&I:_open", conv_path, &path, &flags))
        return NULL;
    if (self->st) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_RuntimeError, "the store object is already open");
        return NULL;
    }
    NOGIL(rc = ctxs_store_open(&st, PyBytes_AS_STRING(path), flags, NULL));
    PyObject *ret = rc < 0 ? raise_rc(rc, "store '%s'", PyBytes_AS_STRING(path)) : Py_None;
    Py_DECREF(path);
    if (rc < 0)
        return ret;
    self->st = st;
    self->closed = 0;
    self->pid = getpid();
    Py_RETURN_NONE;
}

static PyObject *Store_close(StoreObject *self, PyObject *unused)
{
    (void)unused;
    if (self->closed)
        Py_RETURN_NONE;
    self->closed = 1;
    if (self->users == 0)
        store_really_close(self);
    Py_RETURN_NONE;
}

static PyObject *Store_get_closed(StoreObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->closed);
}

/* The calls that take a store and one or two names (or a name and a flag)
 * and return only a code: one method each, this table says how. */
typedef int (*names_fn)(ctxs_store *st, const char *a, const char *b, int flag);

typedef struct names_op {
    const char *format; /* PyArg format: the names, or a name and "|p" */
    char *kwlist[3];
    const char *what;   /* for the error message */
    names_fn fn;
    int flag_arg;       /* the second argument is the flag, not a name */
} names_op;

static int op_rename(ctxs_store *st, const char *a, const char *b, int f)
{
    (void)f;
    return ctxs_store_session_rename(st, a, b);
}

static int op_delete(ctxs_store *st, const char *a, const char *b, int f)
{
    (void)b, (void)f;
    return ctxs_store_session_delete(st, a);
}

static int op_pin(ctxs_store *st, const char *a, const char *b, int f)
{
    (void)b;
    return ctxs_store_session_set_pinned(st, a, f);
}

static int op_delete_meta(ctxs_store *st, const char *a, const char *b, int f)
{
    (void)f;
    return ctxs_store_session_set_meta(st, a, b, NULL, 0);
}

static const names_op rename_op = {"ss:rename", {"old", "new", NULL}, "rename", op_rename, 0};
static const names_op delete_op = {"s:delete", {"name", NULL}, "delete", op_delete, 0};
static const names_op pin_op = {"s|p:pin", {"name", "pinned", NULL}, "pin", op_pin, 1};
static const names_op delete_meta_op = {"ss:delete_meta", {"name", "key", NULL}, "delete_meta",
                                        op_delete_meta, 0};

static PyObject *store_names(StoreObject *self, PyObject *args, PyObject *kw, const names_op *op)
{
    const char *a = NULL, *b = NULL;
    int flag = 1, rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, op->format, (char **)op->kwlist, &a,
                                     op->flag_arg ? (void *)&flag : (void *)&b))
        return NULL;
    STORE_CALL(self, rc = op->fn(self->st, a, b, flag));
    return rc < 0 ? raise_names(rc, op->what, a, b) : Py_NewRef(Py_None);
}

#define STORE_NAMES(name)                                                      \
    static PyObject *Store_##name(StoreObject *self, PyObject *args, PyObject *kw) \
    {                                                                          \
        return store_names(self, args, kw, &name##_op);                        \
    }

STORE_NAMES(rename)
STORE_NAMES(delete)
STORE_NAMES(pin)
STORE_NAMES(delete_meta)

static PyObject *Store_register_model(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "name", NULL};
    ctxs_model m;
    const char *name = NULL;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|z:register_model", kwlist,
                                     conv_model, &m, &name))
        return NULL;
    STORE_CALL(self, rc = ctxs_model_register(self->st, &m, name));
    return rc < 0 ? raise_names(rc, "register model", name, NULL) : Py_NewRef(Py_None);
}

static PyObject *model_entry(const void *p)
{
    const ctxs_model_entry *e = p;
    return Py_BuildValue("(NsK)", model_tuple(&e->model), e->name,
                         (unsigned long long)e->registered_unix_ms);
}

static PyObject *Store__models(StoreObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_model_entry *e = NULL;
    size_t n = 0;
    int rc;
    STORE_CALL(self, rc = ctxs_model_list(&e, &n, self->st));
    return listing(rc, e, n, sizeof *e, model_entry, "models");
}

/* hash_file(), tokenizer_hash_file(): 16 bytes of a file, cached. */
typedef int (*hash_file_fn)(uint8_t out[CTXS_HASH_BYTES], ctxs_store *st, const char *path);

static PyObject *store_hash(StoreObject *self, PyObject *arg, hash_file_fn fn, const char *op)
{
    PyObject *path = NULL, *ret;
    uint8_t h[CTXS_HASH_BYTES];
    int rc;
    if (!conv_path(arg, &path))
        return NULL;
    if (store_enter(self) < 0) {
        Py_DECREF(path);
        return NULL;
    }
    NOGIL(rc = fn(h, self->st, PyBytes_AS_STRING(path)));
    store_leave(self);
    ret = rc < 0 ? raise_rc(rc, "%s '%s'", op, PyBytes_AS_STRING(path))
                 : PyBytes_FromStringAndSize((const char *)h, CTXS_HASH_BYTES);
    Py_DECREF(path);
    return ret;
}

static PyObject *Store_hash_file(StoreObject *self, PyObject *arg)
{
    return store_hash(self, arg, ctxs_model_hash_file, "hash");
}

static PyObject *Store_tokenizer_hash_file(StoreObject *self, PyObject *arg)
{
    return store_hash(self, arg, ctxs_tokenizer_hash_file, "tokenizer hash");
}

/* _session_create(session, name, model, create_opts) */
static PyObject *Store__session_create(StoreObject *self, PyObject *args)
{
    SessionObject *sess;
    const char *name;
    ctxs_model m;
    ctxs_create_options o;
    ctxs_session *s = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "O&sO&O&:_session_create", conv_new_session, &sess, &name,
                          conv_model, &m, conv_create_opts, &o) ||
        store_enter(self) < 0)
        return NULL;
    NOGIL(rc = ctxs_store_session_create(&s, self->st, name, &m, &o));
    PyObject *ret = rc < 0 ? raise_names(rc, "create session", name, NULL)
                           : sess_attach(sess, s, self);
    store_leave(self);
    return ret;
}

/* _session_open(session, name, model or None, flags, open_opts) */
static PyObject *Store__session_open(StoreObject *self, PyObject *args)
{
    SessionObject *sess;
    const char *name;
    ctxs_model m, *mp = &m;
    unsigned flags;
    ctxs_open_options o;
    ctxs_session *s = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "O&sO&IO&:_session_open", conv_new_session, &sess, &name,
                          conv_model_or_none, &mp, &flags, conv_open_opts, &o) ||
        store_enter(self) < 0)
        return NULL;
    NOGIL(rc = ctxs_store_session_open(&s, self->st, name, mp, flags, &o));
    PyObject *ret = rc < 0 ? raise_names(rc, "open session", name, NULL)
                           : sess_attach(sess, s, self);
    store_leave(self);
    return ret;
}

/* _fork(session or None, name, src, n_tokens or None, checkpoint or None,
 * open_opts) */
static PyObject *Store__fork(StoreObject *self, PyObject *args)
{
    SessionObject *sess;
    const char *name, *src, *checkpoint;
    uint64_t n;
    ctxs_open_options o;
    ctxs_session *s = NULL;
    int rc;
    if (!PyArg_ParseTuple(args, "O&ssO&zO&:_fork", conv_fresh_session, &sess, &name, &src,
                          conv_u64_or_all, &n, &checkpoint, conv_open_opts, &o) ||
        store_enter(self) < 0)
        return NULL;
    ctxs_session **out = sess ? &s : NULL;
    NOGIL(rc = checkpoint
                   ? ctxs_store_session_fork_checkpoint(out, self->st, src, checkpoint, name, &o)
                   : ctxs_store_session_fork(out, self->st, src, name, n, &o));
    PyObject *ret;
    if (rc == CTXS_EINVAL && checkpoint && !ctxs_name_check(name) && !ctxs_name_check(src))
        ret = raise_names(rc, "fork", checkpoint, NULL);
    else if (rc == CTXS_EINVAL)
        ret = raise_names(rc, "fork", name, src);
    else if (rc < 0)
        ret = raise_rc(rc, "fork '%s' from '%s'", name, src);
    else
        ret = sess ? sess_attach(sess, s, self) : Py_NewRef(Py_None);
    store_leave(self);
    return ret;
}

static PyObject *Store__sessions(StoreObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_session_entry *e = NULL;
    size_t n = 0;
    int rc;
    STORE_CALL(self, rc = ctxs_store_session_list(&e, &n, self->st));
    return listing(rc, e, n, sizeof *e, entry_dict, "sessions");
}

static PyObject *Store__session(StoreObject *self, PyObject *args)
{
    const char *name;
    ctxs_session_entry e;
    int rc;
    if (!PyArg_ParseTuple(args, "s:session", &name))
        return NULL;
    STORE_CALL(self, rc = ctxs_store_session_get(&e, self->st, name));
    return rc < 0 ? raise_names(rc, "session", name, NULL) : entry_dict(&e);
}

static PyObject *Store_prefix_find(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model_hash", "tokens", NULL};
    uint8_t h[CTXS_HASH_BYTES];
    PyArrayObject *t;
    ctxs_prefix_match m;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&:prefix_find", kwlist, conv_hash, h,
                                     conv_tokens, &t))
        return NULL;
    if (store_enter(self) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    NOGIL(rc = ctxs_prefix_find(&m, self->st, h, tokens_data(t), (uint64_t)PyArray_SIZE(t)));
    store_leave(self);
    Py_DECREF(t);
    if (rc == CTXS_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc < 0)
        return raise_rc(rc, "prefix_find");
    return Py_BuildValue("(sK)", m.session, (unsigned long long)m.n_tokens);
}

#define T ctxs_store_gc_result
static const field gc_fields[] = {
    F(bytes_before, U64), F(bytes_after, U64), F(skipped_open, U64), F(skipped_pinned, U64),
    FIELDS_END,
};
#undef T

static PyObject *Store__gc(StoreObject *self, PyObject *args)
{
    uint64_t budget;
    int dry = 0, rc;
    ctxs_store_gc_result r;
    memset(&r, 0, sizeof r);
    if (!PyArg_ParseTuple(args, "O&p:_gc", conv_u64, &budget, &dry))
        return NULL;
    STORE_CALL(self, rc = ctxs_store_gc(&r, self->st, budget, dry ? CTXS_GC_DRY_RUN : 0));
    PyObject *d = rc < 0 ? raise_rc(rc, "gc") : struct_dict(&r, gc_fields);
    /* listing() releases r.sessions, also after a failure */
    PyObject *l = listing(0, r.sessions, r.n_sessions, sizeof *r.sessions, entry_dict, "gc");
    return with_item(d, "sessions", l);
}

#define T ctxs_store_compact_result
static const field compact_fields[] = {
    F(sessions, U64), F(skipped_busy, U64), F(bytes_before, U64), F(bytes_after, U64),
    F(index_bytes_before, U64), F(index_bytes_after, U64), F(index_compacted, BOOL),
    F(index_busy, BOOL), F(orphans_removed, U64), FIELDS_END,
};
#undef T

static PyObject *Store__compact(StoreObject *self, PyObject *args)
{
    const char *name = NULL;
    ctxs_store_compact_result r;
    progress prog = {0};
    int rc;
    memset(&r, 0, sizeof r);
    if (!PyArg_ParseTuple(args, "zO&:_compact", &name, conv_progress, &prog) ||
        store_enter(self) < 0)
        return NULL;
    progress_begin(&prog);
    ctxs_store_compact_options co = CTXS_STORE_COMPACT_OPTIONS_INIT;
    co.progress = PROGRESS_FN(&prog);
    co.progress_arg = &prog;
    rc = ctxs_store_compact(&r, self->st, name, &co);
    int raised = progress_end(&prog);
    store_leave(self);
    if (raised)
        return NULL;
    return rc < 0 ? raise_names(rc, "compact", name, NULL) : struct_dict(&r, compact_fields);
}

#define T ctxs_store_repair_result
static const field repair_fields[] = {
    F(files_adopted, U64), F(files_removed, U64), F(entries_removed, U64),
    F(prefixes_updated, U64), FIELDS_END,
};
#undef T

#define T ctxs_store_reindex_result
static const field reindex_fields[] = {
    F(sessions, U64), F(skipped, U64), FIELDS_END,
};
#undef T

static PyObject *Store_repair(StoreObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_store_repair_result r;
    int rc;
    memset(&r, 0, sizeof r);
    STORE_CALL(self, rc = ctxs_store_repair(&r, self->st));
    return rc < 0 ? raise_rc(rc, "repair") : struct_dict(&r, repair_fields);
}

static PyObject *Store_reindex(StoreObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_store_reindex_result r;
    int rc;
    memset(&r, 0, sizeof r);
    STORE_CALL(self, rc = ctxs_store_reindex(&r, self->st));
    return rc < 0 ? raise_rc(rc, "reindex") : struct_dict(&r, reindex_fields);
}

static PyObject *Store_export(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "path", "progress", NULL};
    const char *name;
    PyObject *path = NULL, *ret = NULL;
    progress prog = {0};
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO&|O&:export", kwlist, &name, conv_path, &path,
                                     conv_progress, &prog))
        goto out;
    if (store_enter(self) < 0)
        goto out;
    progress_begin(&prog);
    ctxs_store_session_export_options xo = CTXS_STORE_SESSION_EXPORT_OPTIONS_INIT;
    xo.progress = PROGRESS_FN(&prog);
    xo.progress_arg = &prog;
    rc = ctxs_store_session_export(self->st, name, PyBytes_AS_STRING(path), &xo);
    int raised = progress_end(&prog);
    store_leave(self);
    if (raised)
        goto out;
    if (rc == CTXS_EINVAL && ctxs_name_check(name))
        ret = raise_names(rc, "export", name, NULL);
    else
        ret = rc < 0 ? raise_rc(rc, "export '%s' to '%s'", name, PyBytes_AS_STRING(path))
                     : Py_NewRef(Py_None);
out:
    Py_XDECREF(path);
    return ret;
}

static PyObject *Store_import_(StoreObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "name", "progress", NULL};
    const char *name = NULL;
    PyObject *path = NULL, *ret = NULL;
    progress prog = {0};
    char out[CTXS_NAME_MAX + 1];
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|zO&:import_", kwlist, conv_path, &path,
                                     &name, conv_progress, &prog))
        goto out;
    if (store_enter(self) < 0)
        goto out;
    progress_begin(&prog);
    ctxs_store_session_import_options io = CTXS_STORE_SESSION_IMPORT_OPTIONS_INIT;
    io.progress = PROGRESS_FN(&prog);
    io.progress_arg = &prog;
    rc = ctxs_store_session_import(out, self->st, PyBytes_AS_STRING(path), name, &io);
    int raised = progress_end(&prog);
    store_leave(self);
    if (raised)
        goto out;
    if (rc == CTXS_EINVAL && name && ctxs_name_check(name))
        ret = raise_names(rc, "import", name, NULL);
    else
        ret = rc < 0 ? raise_rc(rc, "import '%s'", PyBytes_AS_STRING(path))
                     : PyUnicode_FromString(out);
out:
    Py_XDECREF(path);
    return ret;
}

static PyObject *Store_set_meta(StoreObject *self, PyObject *args)
{
    const char *name, *key;
    Py_buffer val;
    int rc;
    if (!PyArg_ParseTuple(args, "sss*:set_meta", &name, &key, &val))
        return NULL;
    if (store_enter(self) < 0) {
        PyBuffer_Release(&val);
        return NULL;
    }
    /* A value of 0 bytes is stored as such: NULL only deletes. */
    static const char empty[1];
    const void *p = val.len ? val.buf : empty;
    NOGIL(rc = ctxs_store_session_set_meta(self->st, name, key, p, (size_t)val.len));
    store_leave(self);
    PyBuffer_Release(&val);
    return rc < 0 ? raise_names(rc, "set_meta", name, key) : Py_NewRef(Py_None);
}

static PyObject *Store_get_meta(StoreObject *self, PyObject *args)
{
    const char *name, *key;
    size_t n = CTXS_META_VALUE_MAX;
    int rc;
    char *buf = PyMem_RawMalloc(CTXS_META_VALUE_MAX);
    if (!buf)
        return PyErr_NoMemory();
    PyObject *ret = NULL;
    if (PyArg_ParseTuple(args, "ss:get_meta", &name, &key) && store_enter(self) == 0) {
        NOGIL(rc = ctxs_store_session_get_meta(buf, &n, self->st, name, key));
        store_leave(self);
        ret = rc < 0 ? raise_names(rc, "get_meta", name, key)
                     : PyBytes_FromStringAndSize(buf, (Py_ssize_t)n);
    }
    PyMem_RawFree(buf);
    return ret;
}

static PyObject *Store_list_meta(StoreObject *self, PyObject *args)
{
    const char *name;
    ctxs_meta_entry *e = NULL;
    size_t n = 0;
    int rc;
    if (!PyArg_ParseTuple(args, "s:list_meta", &name))
        return NULL;
    STORE_CALL(self, rc = ctxs_store_session_list_meta(&e, &n, self->st, name));
    if (rc < 0)
        return raise_names(rc, "list_meta", name, NULL);
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        PyObject *v = PyBytes_FromStringAndSize(e[i].value, (Py_ssize_t)e[i].value_bytes);
        if (!v || PyDict_SetItemString(d, e[i].key, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    ctxs_free(e);
    return d;
}

static PyMethodDef Store_methods[] = {
    {"_open", VARARGS(Store__open), NULL},
    {"_models", NOARGS(Store__models), NULL},
    {"_session_create", VARARGS(Store__session_create), NULL},
    {"_session_open", VARARGS(Store__session_open), NULL},
    {"_fork", VARARGS(Store__fork), NULL},
    {"_sessions", NOARGS(Store__sessions), NULL},
    {"_session", VARARGS(Store__session), NULL},
    {"_gc", VARARGS(Store__gc), NULL},
    {"_compact", VARARGS(Store__compact), NULL},
    {"close", NOARGS(Store_close),
     "close($self, /)\n--\n\n"
     "Close the store: every later call on it raises ctxstore.Error. The\n"
     "index itself is closed once no session opened through it is left open\n"
     "(nor a view of one). Idempotent."},
    {"register_model", KWARGS(Store_register_model),
     "register_model($self, /, model, name=None)\n--\n\n"
     "Register a Model under its model hash with a display name; again\n"
     "updates the name. The same hash with another geometry: CTXS_EMODEL."},
    {"hash_file", ONEARG(Store_hash_file),
     "hash_file($self, path, /)\n--\n\n"
     "XXH3-128 of a weights file (16 bytes), cached by the store under the\n"
     "file's inode, size and mtime. Releases the GIL."},
    {"tokenizer_hash_file", ONEARG(Store_tokenizer_hash_file),
     "tokenizer_hash_file($self, path, /)\n--\n\n"
     "A tokenizer hash (16 bytes) of a vocabulary file, cached like hash_file()."},
    {"rename", KWARGS(Store_rename),
     "rename($self, old, new, /)\n--\n\nRename a session; open handles stay valid."},
    {"delete", KWARGS(Store_delete),
     "delete($self, name, /)\n--\n\n"
     "Delete a session with its checkpoints, metadata and pin. CTXS_EBUSY\n"
     "while a handle (or a view of one) has it open."},
    {"pin", KWARGS(Store_pin),
     "pin($self, /, name, pinned=True)\n--\n\nPin (or unpin) a session: gc never deletes it."},
    {"prefix_find", KWARGS(Store_prefix_find),
     "prefix_find($self, /, model_hash, tokens)\n--\n\n"
     "The session holding the longest cached prefix of tokens for the model:\n"
     "(session_name, n_tokens), or None. Fork it at n_tokens and prefill only\n"
     "the rest."},
    {"repair", NOARGS(Store_repair),
     "repair($self, /)\n--\n\nCompare the index with the session files and mend it; a dict of counts."},
    {"reindex", NOARGS(Store_reindex),
     "reindex($self, /)\n--\n\nRebuild the index from the session files; a dict of counts."},
    {"export", KWARGS(Store_export),
     "export($self, /, name, path, progress=None)\n--\n\n"
     "Write the session's committed tokens, model and metadata to a new,\n"
     "self-checking export file at path. progress: None or a callable\n"
     "(done, total), in tokens, called now and then and once at the end.\n"
     "Releases the GIL (taken back only to call progress)."},
    {"import_", KWARGS(Store_import_),
     "import_($self, /, path, name=None, progress=None)\n--\n\n"
     "Check an export file whole, then create its session (named name, or\n"
     "the name it carries); returns the name used. progress: as export(),\n"
     "in bytes of the file over both passes. Releases the GIL."},
    {"set_meta", VARARGS(Store_set_meta),
     "set_meta($self, name, key, value, /)\n--\n\n"
     "Set a metadata key of a session to value (bytes, or str as UTF-8)."},
    {"get_meta", VARARGS(Store_get_meta),
     "get_meta($self, name, key, /)\n--\n\n"
     "A metadata value of a session (bytes); CTXS_ENOTFOUND without it."},
    {"delete_meta", KWARGS(Store_delete_meta),
     "delete_meta($self, name, key, /)\n--\n\nDelete a metadata key of a session."},
    {"list_meta", VARARGS(Store_list_meta),
     "list_meta($self, name, /)\n--\n\nA session's metadata: a dict of key -> bytes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Store_getset[] = {
    {"closed", (getter)Store_get_closed, NULL, "True once close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

BASE_TYPE(Store, "Store");

/* --- Remote (the Redis tier) ---------------------------------------------------
 *
 * A Remote holds a use of its Store (sessions it pulls are opened through
 * that store) and counts its calls in flight, as a Store does, so that
 * close() never frees the handle under a call on another thread. */

typedef struct {
    PyObject_HEAD
    ctxs_remote *r;
    StoreObject *store; /* a use of it while r is open */
    int closed;
    Py_ssize_t users;
    pid_t pid;
    PyObject *weakrefs;
} RemoteObject;

#define T ctxs_remote_stats
static const field remote_stats_fields[] = {
    F(chunks_pushed, U64), F(chunks_present, U64), F(bytes_pushed, U64), F(records_pushed, U64),
    F(jobs_queued, U64), F(chunks_dropped, U64), F(retries, U64), F(last_error, I32),
    F(connected, BOOL), FIELDS_END,
};
#undef T

#define T ctxs_remote_push_result
static const field remote_push_fields[] = {
    F(n_tokens, U64), F(chunks_sent, U64), F(chunks_present, U64), F(bytes_sent, U64), FIELDS_END,
};
#undef T

#define T ctxs_remote_pull_result
static const field remote_pull_fields[] = {
    F(n_tokens, U64), F(remote_tokens, U64), F(chunks_pulled, U64), F(chunks_missing, U64),
    F(chunks_refused, U64), FIELDS_END,
};
#undef T

#define T ctxs_remote_entry
static const field remote_entry_fields[] = {
    F(name, STR), F(model_hash, HASH), F(n_tokens, U64), F(updated_unix_ms, U64),
    F(tail_pushed, BOOL), F(status, I32), FIELDS_END,
};
#undef T

#define T ctxs_remote_info
static const field remote_info_fields[] = {
    F(server_version, STR), F(used_memory, U64), F(maxmemory, U64), F(maxmemory_policy, STR),
    F(evicted_keys, U64), F(keys, U64), FIELDS_END,
};
#undef T

static PyObject *raise_remote(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    raise_rc_v(rc, NULL, fmt, ap);
    va_end(ap);
    return NULL;
}

static int remote_enter(RemoteObject *self)
{
    if (!self->r || self->closed) {
        raise_closed("remote");
        return -1;
    }
    self->users++;
    return 0;
}

static void remote_really_close(RemoteObject *self, ctxs_remote_stats *out, uint32_t timeout_ms,
                                int *rc)
{
    ctxs_remote *r = self->r;
    self->r = NULL;
    if (r && self->pid == getpid()) {
        NOGIL(*rc = ctxs_remote_close(out, r, timeout_ms));
    }
    if (self->store) {
        store_leave(self->store);
        Py_CLEAR(self->store);
    }
}

static void remote_leave(RemoteObject *self)
{
    int rc = 0;
    if (--self->users == 0 && self->closed)
        remote_really_close(self, NULL, CTXS_DEFAULT_REMOTE_TIMEOUT_MS, &rc);
}

static PyObject *Remote_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    RemoteObject *self = (RemoteObject *)type->tp_alloc(type, 0);
    if (self)
        self->closed = 1;
    return (PyObject *)self;
}

static void Remote_dealloc(RemoteObject *self)
{
    int rc = 0;
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    remote_really_close(self, NULL, CTXS_DEFAULT_REMOTE_TIMEOUT_MS, &rc);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* _open(store, url, (timeout_ms, retries, backoff_ms, queue_max,
 * push_on_commit, pull_on_open, key_prefix, call_ms)) */
static PyObject *Remote__open(RemoteObject *self, PyObject *args)
{
    StoreObject *store;
    const char *url, *prefix;
    ctxs_remote_options o = CTXS_REMOTE_OPTIONS_INIT;
    int push, pull, rc;
    if (!PyArg_ParseTuple(args, "O!s(O&O&O&O&ppzO&):_open", &StoreType, &store, &url, conv_u32,
                          &o.timeout_ms, conv_u32, &o.retries, conv_u32, &o.backoff_ms,
                          conv_u32, &o.queue_max, &push, &pull, &prefix, conv_u32, &o.call_ms))
        return NULL;
    o.push_on_commit = (uint32_t)push;
    o.pull_on_open = (uint32_t)pull;
    o.key_prefix = prefix;
    if (self->r) {
        PyErr_SetString(PyExc_RuntimeError, "the remote object is already open");
        return NULL;
    }
    if (store_enter(store) < 0)
        return NULL;
    ctxs_remote *r;
    NOGIL(rc = ctxs_remote_open(&r, store->st, url, &o));
    if (rc < 0) {
        store_leave(store);
        return raise_remote(rc, "remote %s", url);
    }
    Py_INCREF(store);
    self->store = store; /* keeps the use taken above */
    self->r = r;
    self->closed = 0;
    self->pid = getpid();
    Py_RETURN_NONE;
}

static PyObject *Remote_close(RemoteObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    uint32_t timeout_ms = CTXS_DEFAULT_REMOTE_TIMEOUT_MS;
    ctxs_remote_stats st;
    int rc = 0;
    memset(&st, 0, sizeof st);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&:close", kwlist, conv_u32, &timeout_ms))
        return NULL;
    if (self->closed)
        Py_RETURN_NONE;
    self->closed = 1;
    if (self->users > 0) /* a call on another thread: the last one closes */
        Py_RETURN_NONE;
    remote_really_close(self, &st, timeout_ms, &rc);
    if (rc < 0)
        return raise_remote(rc, "close: background pushes left (counted in chunks_dropped)");
    return struct_dict(&st, remote_stats_fields);
}

static PyObject *Remote_get_closed(RemoteObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->closed);
}

static PyObject *Remote_stats(RemoteObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_remote_stats st;
    if (remote_enter(self) < 0)
        return NULL;
    int rc = ctxs_remote_get_stats(&st, self->r);
    remote_leave(self);
    if (rc < 0)
        return raise_remote(rc, "stats");
    return struct_dict(&st, remote_stats_fields);
}

static PyObject *Remote_flush(RemoteObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    uint32_t timeout_ms = CTXS_DEFAULT_REMOTE_TIMEOUT_MS;
    ctxs_remote_stats st;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&:flush", kwlist, conv_u32, &timeout_ms))
        return NULL;
    REMOTE_CALL(self, rc = ctxs_remote_flush(&st, self->r, timeout_ms));
    if (rc < 0)
        return raise_remote(rc, "flush (%u ms)", timeout_ms);
    return struct_dict(&st, remote_stats_fields);
}

static PyObject *Remote_push(RemoteObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "progress", NULL};
    const char *name;
    progress prog = {0};
    ctxs_remote_push_result res;
    PyObject *prog_o = Py_None;
    int rc;
    memset(&res, 0, sizeof res);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:push", kwlist, &name, &prog_o) ||
        !conv_progress(prog_o, &prog) || remote_enter(self) < 0)
        return NULL;
    ctxs_remote_push_options po = CTXS_REMOTE_PUSH_OPTIONS_INIT;
    po.progress = PROGRESS_FN(&prog);
    po.progress_arg = &prog;
    progress_begin(&prog);
    rc = ctxs_remote_push(&res, self->r, name, &po);
    int raised = progress_end(&prog);
    remote_leave(self);
    if (raised)
        return NULL;
    if (rc < 0)
        return raise_remote(rc, "push '%s'", name);
    return struct_dict(&res, remote_push_fields);
}

static PyObject *pull_result(ctxs_remote_pull_result *res)
{
    PyObject *d = struct_dict(res, remote_pull_fields);
    npy_intp n = (npy_intp)res->n_rest;
    PyObject *rest = PyArray_SimpleNew(1, &n, NPY_UINT32);
    PyObject *model = model_tuple(&res->model);
    if (d && rest && model) {
        if (n)
            memcpy(PyArray_DATA((PyArrayObject *)rest), res->rest_ids, (size_t)n * 4);
        if (PyDict_SetItemString(d, "rest_ids", rest) < 0 ||
            PyDict_SetItemString(d, "model", model) < 0)
            Py_CLEAR(d);
    } else {
        Py_CLEAR(d);
    }
    Py_XDECREF(rest);
    Py_XDECREF(model);
    ctxs_free(res->rest_ids);
    res->rest_ids = NULL;
    return d;
}

/* The pulled session to its Session object (or closed), and the result. */
static PyObject *pulled(RemoteObject *self, SessionObject *sess, ctxs_session *s,
                        ctxs_remote_pull_result *res)
{
    PyObject *d = pull_result(res);
    if (!sess) {
        NOGIL(ctxs_session_close(s));
        return d;
    }
    PyObject *ok = sess_attach(sess, s, self->store);
    if (!ok) {
        Py_XDECREF(d);
        return NULL;
    }
    Py_DECREF(ok);
    return d;
}

static PyObject *Remote__pull(RemoteObject *self, PyObject *args)
{
    SessionObject *sess;
    const char *remote_name, *local_name;
    ctxs_create_options co, *cop = &co;
    progress prog = {0};
    ctxs_remote_pull_result res;
    ctxs_session *s = NULL;
    int rc;
    memset(&res, 0, sizeof res);
    if (!PyArg_ParseTuple(args, "O&szO&O&:_pull", conv_fresh_session, &sess, &remote_name,
                          &local_name, conv_create_opts_or_none, &cop, conv_progress, &prog) ||
        remote_enter(self) < 0)
        return NULL;
    ctxs_remote_pull_options po = CTXS_REMOTE_PULL_OPTIONS_INIT;
    po.progress = PROGRESS_FN(&prog);
    po.progress_arg = &prog;
    progress_begin(&prog);
    rc = ctxs_remote_pull(&s, &res, self->r, remote_name, local_name, cop, &po);
    int raised = progress_end(&prog);
    PyObject *ret;
    if (rc < 0) {
        ret = raised ? NULL : raise_remote(rc, "pull '%s'", remote_name);
        ctxs_free(res.rest_ids);
    } else {
        ret = pulled(self, sess, s, &res);
        if (raised)
            Py_CLEAR(ret);
    }
    remote_leave(self);
    return ret;
}

static PyObject *Remote__pull_prefix(RemoteObject *self, PyObject *args)
{
    SessionObject *sess;
    const char *local_name;
    ctxs_model m;
    PyObject *tok_o;
    ctxs_create_options co, *cop = &co;
    ctxs_remote_pull_result res;
    ctxs_session *s = NULL;
    int rc;
    memset(&res, 0, sizeof res);
    if (!PyArg_ParseTuple(args, "O&sO&OO&:_pull_prefix", conv_fresh_session, &sess, &local_name,
                          conv_model, &m, &tok_o, conv_create_opts_or_none, &cop))
        return NULL;
    PyArrayObject *t = token_array(tok_o);
    if (!t)
        return NULL;
    if (remote_enter(self) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    static const uint32_t none[1];
    npy_intp n = PyArray_SIZE(t);
    const uint32_t *p = n ? PyArray_DATA(t) : none;
    NOGIL(rc = ctxs_remote_pull_prefix(&s, &res, self->r, local_name, &m, p, (uint64_t)n, cop,
                                       NULL));
    Py_DECREF(t);
    PyObject *ret = rc < 0 ? raise_remote(rc, "pull_prefix into '%s'", local_name)
                           : pulled(self, sess, s, &res);
    remote_leave(self);
    return ret;
}

static PyObject *Remote__list(RemoteObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_remote_entry *e = NULL;
    size_t n = 0;
    int rc;
    REMOTE_CALL(self, rc = ctxs_remote_list(&e, &n, self->r));
    if (rc < 0)
        return raise_remote(rc, "ls");
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *d = struct_dict(&e[i], remote_entry_fields);
        if (!d)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, d);
    }
    ctxs_free(e);
    return l;
}

static PyObject *Remote__info(RemoteObject *self, PyObject *unused)
{
    (void)unused;
    ctxs_remote_info info;
    int rc;
    REMOTE_CALL(self, rc = ctxs_remote_get_info(&info, self->r));
    if (rc < 0)
        return raise_remote(rc, "info");
    return struct_dict(&info, remote_info_fields);
}

static PyMethodDef Remote_methods[] = {
    {"_open", VARARGS(Remote__open), NULL},
    {"_pull", VARARGS(Remote__pull), NULL},
    {"_pull_prefix", VARARGS(Remote__pull_prefix), NULL},
    {"_list", NOARGS(Remote__list), NULL},
    {"_info", NOARGS(Remote__info), NULL},
    {"_stats", NOARGS(Remote_stats), NULL},
    {"_flush", KWARGS(Remote_flush), NULL},
    {"_close", KWARGS(Remote_close), NULL},
    {"_push", KWARGS(Remote_push), NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Remote_getset[] = {
    {"closed", (getter)Remote_get_closed, NULL, "True once close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

BASE_TYPE(Remote, "Remote");

/* --- Module functions ----------------------------------------------------- */

/* A return code from Python: an int; past int32 it is no code (INT32_MIN). */
static int rc_arg(PyObject *arg, int *rc)
{
    int overflow;
    long v = PyLong_AsLongAndOverflow(arg, &overflow);
    if (v == -1 && PyErr_Occurred())
        return 0;
    *rc = overflow || v < INT32_MIN || v > INT32_MAX ? INT32_MIN : (int)v;
    return 1;
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    int rc;
    return rc_arg(arg, &rc) ? PyUnicode_FromString(ctxs_strerror(rc)) : NULL;
}

static PyObject *mod_err_name(PyObject *m, PyObject *arg)
{
    (void)m;
    int rc;
    return rc_arg(arg, &rc) ? PyUnicode_FromString(ctxs_err_name(rc)) : NULL;
}

static PyObject *mod_name_check(PyObject *m, PyObject *args)
{
    (void)m;
    const char *name;
    if (!PyArg_ParseTuple(args, "s:name_check", &name))
        return NULL;
    const char *why = ctxs_name_check(name);
    if (!why)
        Py_RETURN_NONE;
    return PyUnicode_FromString(why);
}

static PyObject *mod_set_pressure(PyObject *m, PyObject *arg)
{
    (void)m;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    ctxs_set_pressure(on);
    Py_RETURN_NONE;
}

static PyObject *mod_get_pressure(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyBool_FromLong(ctxs_get_pressure());
}

static PyObject *mod_attention_isa(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    return PyUnicode_FromString(ctxs_attention_get_isa());
}

#define T ctxs_record_report
static const field record_report_fields[] = {
    F(status, I32), F(current, BOOL), F(seq, U64), F(n_tokens, U64), F(ring_start, U64),
    F(verified_from, U64), F(written_unix_ms, U64), F(this_boot, BOOL), F(boot_known, BOOL),
    FIELDS_END,
};
#undef T

#define T ctxs_file_report
static const field file_report_fields[] = {
    F(status, I32), F(format_major, U32), F(format_minor, U32), F(header_status, I32),
    F(header_crc_ok, BOOL), F(capacity, U32), F(n_sink, U32), F(ring, BOOL),
    F(created_unix_ms, U64), F(file_bytes, U64), F(size_bytes, U64), F(disk_bytes, U64),
    F(label_status, I32), F(label_id, U64), F(label_name, STR), F(writer_open, BOOL),
    F(reader_open, BOOL), F(writer_pid, I32), F(writer_command, STR), FIELDS_END,
};
#undef T

static PyObject *mod_inspect(PyObject *m, PyObject *arg)
{
    (void)m;
    PyObject *path = NULL;
    ctxs_file_report r;
    int rc;
    if (!conv_path(arg, &path))
        return NULL;
    NOGIL(rc = ctxs_file_inspect(&r, PyBytes_AS_STRING(path)));
    if (rc < 0) {
        raise_rc(rc, "inspect '%s'", PyBytes_AS_STRING(path));
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    PyObject *d = struct_dict(&r, file_report_fields);
    PyObject *model = r.header_status == 0 ? model_tuple(&r.model) : Py_NewRef(Py_None);
    PyObject *r0 = struct_dict(&r.records[0], record_report_fields);
    PyObject *r1 = struct_dict(&r.records[1], record_report_fields);
    PyObject *recs = r0 && r1 ? PyTuple_Pack(2, r0, r1) : NULL;
    if (!d || !model || !recs || PyDict_SetItemString(d, "model", model) < 0 ||
        PyDict_SetItemString(d, "records", recs) < 0)
        Py_CLEAR(d);
    Py_XDECREF(model);
    Py_XDECREF(r0);
    Py_XDECREF(r1);
    Py_XDECREF(recs);
    return d;
}

/* The token strings of a vocabulary, in id order: str (as UTF-8) or bytes. */
static PyObject *mod_tokenizer_hash_strings(PyObject *m, PyObject *arg)
{
    (void)m;
    PyObject *seq = PySequence_Fast(arg, "tokens must be a sequence of str or bytes");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **ptrs = PyMem_Calloc((size_t)n + 1, sizeof *ptrs);
    size_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    PyObject *ret = NULL;
    if (!ptrs || !lens) {
        PyErr_NoMemory();
        goto out;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        if (PyUnicode_Check(items[i])) {
            ptrs[i] = PyUnicode_AsUTF8AndSize(items[i], &len);
            if (!ptrs[i])
                goto out;
        } else if (PyBytes_Check(items[i])) {
            ptrs[i] = PyBytes_AS_STRING(items[i]);
            len = PyBytes_GET_SIZE(items[i]);
        } else {
            PyErr_Format(PyExc_TypeError, "token %zd is %s, not str or bytes", i,
                         Py_TYPE(items[i])->tp_name);
            goto out;
        }
        lens[i] = (size_t)len;
    }
    uint8_t h[CTXS_HASH_BYTES];
    int rc;
    NOGIL(rc = ctxs_tokenizer_hash_strings(h, ptrs, lens, (size_t)n));
    ret = rc < 0 ? raise_rc(rc, "tokenizer_hash_strings of %zd tokens", n)
                 : PyBytes_FromStringAndSize((const char *)h, CTXS_HASH_BYTES);
out:
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return ret;
}

static PyObject *mod_watcher_start(PyObject *m, PyObject *args, PyObject *kw)
{
    (void)m;
    static char *kwlist[] = {"poll_ms", "min_available", "psi_some_avg10", NULL};
    ctxs_watcher_options o = CTXS_WATCHER_OPTIONS_INIT;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&O&O&:watcher_start", kwlist, conv_u32,
                                     &o.poll_ms, conv_u64, &o.min_available, conv_u32,
                                     &o.psi_some_avg10))
        return NULL;
    NOGIL(rc = ctxs_watcher_start(&o));
    return rc < 0 ? raise_rc(rc, "watcher_start") : Py_NewRef(Py_None);
}

static PyObject *mod_watcher_stop(PyObject *m, PyObject *unused)
{
    (void)m;
    (void)unused;
    NOGIL(ctxs_watcher_stop());
    Py_RETURN_NONE;
}

static PyObject *mod_set_error_class(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyType_Check(arg) ||
        !PyType_IsSubtype((PyTypeObject *)arg, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "an Exception subclass");
        return NULL;
    }
    Py_INCREF(arg);
    Py_XSETREF(Error, arg);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"strerror", ONEARG(mod_strerror),
     "strerror(code, /)\n--\n\nThe library's message for a return code (ctxs_strerror)."},
    {"err_name", ONEARG(mod_err_name),
     "err_name(code, /)\n--\n\nA return code's name: 'CTXS_EBUSY', 'ENOENT', 'OK'."},
    {"name_check", VARARGS(mod_name_check),
     "name_check(name, /)\n--\n\nNone for a valid name, else why it is refused."},
    {"set_pressure", ONEARG(mod_set_pressure),
     "set_pressure(on, /)\n--\n\n"
     "Tell the library the process is (or no longer is) under memory pressure:\n"
     "every open session's window halves, and grows back when cleared."},
    {"get_pressure", NOARGS(mod_get_pressure),
     "get_pressure($module, /)\n--\n\nTrue while memory pressure is in force."},
    {"attention_isa", NOARGS(mod_attention_isa),
     "attention_isa($module, /)\n--\n\nThe CPU attention kernel's instruction set."},
    {"inspect", ONEARG(mod_inspect),
     "inspect(path, /)\n--\n\n"
     "What the session file at path says of itself (ctxs_file_inspect): its\n"
     "header, both commit records, its label, whether a handle has it open;\n"
     "also for a file that does not open. A dict; takes no lock."},
    {"tokenizer_hash_strings", ONEARG(mod_tokenizer_hash_strings),
     "tokenizer_hash_strings(tokens, /)\n--\n\n"
     "A tokenizer hash (16 bytes) of a vocabulary's token strings in id\n"
     "order (str as UTF-8, or bytes)."},
    {"watcher_start", KWARGS(mod_watcher_start),
     "watcher_start($module, /, poll_ms=..., min_available=..., psi_some_avg10=...)\n--\n\n"
     "Start the process's memory-pressure watcher thread (MemAvailable,\n"
     "PSI), which sets the pressure state on changes."},
    {"watcher_stop", NOARGS(mod_watcher_stop),
     "watcher_stop($module, /)\n--\n\n"
     "Stop the watcher; the pressure state it set stays until set_pressure()."},
    {"_set_error_class", ONEARG(mod_set_error_class), NULL},
    {NULL, NULL, 0, NULL},
};

/* --- What the package's other extension modules borrow (_ctxstore_api.h) -- */

static ctxs_store *api_store_enter(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &StoreType)) {
        PyErr_Format(PyExc_TypeError, "a ctxstore.Store, not %s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    return store_enter((StoreObject *)o) < 0 ? NULL : ((StoreObject *)o)->st;
}

static void api_store_leave(PyObject *o)
{
    store_leave((StoreObject *)o);
}

static ctxs_session *api_session_enter(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &SessionType)) {
        PyErr_Format(PyExc_TypeError, "a ctxstore.Session, not %s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    return sess_enter((SessionObject *)o) < 0 ? NULL : ((SessionObject *)o)->s;
}

static void api_session_leave(PyObject *o)
{
    sess_leave((SessionObject *)o);
}

static int api_session_adopt(PyObject *o, ctxs_session *s, PyObject *store)
{
    SessionObject *sess = NULL;
    PyObject *ok = NULL;
    if (!conv_fresh_session(o, &sess) || !sess ||
        (store && !PyObject_TypeCheck(store, &StoreType))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a fresh ctxstore.Session and a ctxstore.Store");
        NOGIL(ctxs_session_close(s));
        return -1;
    }
    ok = sess_attach(sess, s, (StoreObject *)store);
    Py_XDECREF(ok);
    return ok ? 0 : -1;
}

static PyObject *api_token_array(PyObject *o)
{
    return (PyObject *)token_array(o);
}

static const ctxs_py_api py_api = {
    .version = CTXS_PY_API_VERSION,
    .raise_rc = raise_rc_detail,
    .store_enter = api_store_enter,
    .store_leave = api_store_leave,
    .session_enter = api_session_enter,
    .session_leave = api_session_leave,
    .session_adopt = api_session_adopt,
    .conv_model = conv_model,
    .conv_path = conv_path,
    .token_array = api_token_array,
    .model_tuple = model_tuple,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ctxstore._ctxstore",
    .m_doc = "The C extension under the ctxstore package; use ctxstore itself.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__ctxstore(void);
PyMODINIT_FUNC PyInit__ctxstore(void)
{
    import_array();
    if (PyType_Ready(&MappingType) < 0 || PyType_Ready(&SessionType) < 0 ||
        PyType_Ready(&StoreType) < 0 || PyType_Ready(&RemoteType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    /* A plain Exception until __init__.py hands over ctxstore.Error. */
    Error = Py_NewRef(PyExc_Exception);
    if (PyModule_AddObjectRef(m, "SessionBase", (PyObject *)&SessionType) < 0 ||
        PyModule_AddObjectRef(m, "StoreBase", (PyObject *)&StoreType) < 0 ||
        PyModule_AddObjectRef(m, "Mapping", (PyObject *)&MappingType) < 0 ||
        PyModule_AddObjectRef(m, "RemoteBase", (PyObject *)&RemoteType) < 0)
        goto fail;
    PyObject *capsule = PyCapsule_New((void *)&py_api, CTXS_PY_API_CAPSULE, NULL);
    int added = capsule ? PyModule_AddObjectRef(m, "_api", capsule) : -1;
    Py_XDECREF(capsule);
    if (added < 0)
        goto fail;
    struct { const char *name; long value; } ints[] = {
#define CTXS_PY_ERR_(name, value, text) {"E" #name, value},
        CTXS_ERRNO_MAP(CTXS_PY_ERR_)
#undef CTXS_PY_ERR_
        {"DTYPE_F16", CTXS_DTYPE_F16}, {"DTYPE_BF16", CTXS_DTYPE_BF16},
        {"DTYPE_Q8", CTXS_DTYPE_Q8}, {"DTYPE_F32", CTXS_DTYPE_F32},
        {"SYNC_NONE", CTXS_SYNC_NONE}, {"SYNC_ASYNC", CTXS_SYNC_ASYNC},
        {"SYNC_FULL", CTXS_SYNC_FULL},
        {"RDONLY", CTXS_RDONLY}, {"OPEN_VERIFY", CTXS_OPEN_VERIFY},
        {"STORE_CREATE", CTXS_STORE_CREATE},
        {"INFO_READONLY", CTXS_INFO_READONLY}, {"INFO_WRAPPED", CTXS_INFO_WRAPPED},
        {"INFO_RECOVERED", CTXS_INFO_RECOVERED}, {"INFO_VERIFIED", CTXS_INFO_VERIFIED},
        {"INFO_FAILED", CTXS_INFO_FAILED}, {"INFO_PRESSURE", CTXS_INFO_PRESSURE},
        {"INFO_RING", CTXS_INFO_RING}, {"INFO_PARTIAL_WINDOW", CTXS_INFO_PARTIAL_WINDOW},
        {"INFO_BACKGROUND", CTXS_INFO_BACKGROUND},
        {"HASH_BYTES", CTXS_HASH_BYTES}, {"NAME_MAX", CTXS_NAME_MAX},
        {"PREFIX_CHUNK", CTXS_PREFIX_CHUNK},
        {"META_VALUE_MAX", CTXS_META_VALUE_MAX},
        {"META_SESSION_MAX", CTXS_META_SESSION_MAX},
        {"DEFAULT_CAPACITY", CTXS_DEFAULT_CAPACITY},
        {"DEFAULT_N_SINK", CTXS_DEFAULT_N_SINK},
        {"DEFAULT_POLL_MS", CTXS_DEFAULT_POLL_MS},
        {"DEFAULT_MIN_AVAILABLE", (long)CTXS_DEFAULT_MIN_AVAILABLE},
        {"DEFAULT_PSI_SOME_AVG10", CTXS_DEFAULT_PSI_SOME_AVG10},
        {"DEFAULT_REMOTE_TIMEOUT_MS", CTXS_DEFAULT_REMOTE_TIMEOUT_MS},
        {"DEFAULT_REMOTE_RETRIES", CTXS_DEFAULT_REMOTE_RETRIES},
        {"DEFAULT_REMOTE_BACKOFF_MS", CTXS_DEFAULT_REMOTE_BACKOFF_MS},
        {"DEFAULT_REMOTE_QUEUE_MAX", CTXS_DEFAULT_REMOTE_QUEUE_MAX},
        {"DEFAULT_REMOTE_CALL_MS", CTXS_DEFAULT_REMOTE_CALL_MS},
        {"VERSION_MAJOR", CTXS_VERSION_MAJOR}, {"VERSION_MINOR", CTXS_VERSION_MINOR},
        {"VERSION_PATCH", CTXS_VERSION_PATCH},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (PyModule_AddIntConstant(m, ints[i].name, ints[i].value) < 0)
            goto fail;
    if (PyModule_AddStringConstant(m, "NAME_RULE", CTXS_NAME_RULE) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
