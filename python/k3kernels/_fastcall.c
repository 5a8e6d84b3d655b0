/*
 * k3kernels._fastcall: the run calls of the torch front end's eager path as one compiled call each.
 *
 * The package binds the C API through ctypes; a ctypes call converts each argument through its argtypes and, for
 * fused_moe, needs a k3_moe_weights Structure built per call. That costs several microseconds of host time per
 * eager call, a large share of a decode call's budget. These functions take the same arguments as plain Python ints
 * (None for NULL) and call the library through the function pointer the caller passes: the address of the very
 * ctypes function the package loaded, so this module links nothing and the library the package loaded stays the
 * one source of truth. It holds no state. The package checks layouts() against its ctypes mirrors (which are
 * checked against the library) before it uses the module, and falls back to ctypes when the module is missing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "k3.h"

typedef k3_status (*k3_linear_run_fn)(k3_linear_plan *plan, int64_t m, const void *x, const void *w,
                                      const void *residual, void *y, void *ws, size_t ws_bytes, void *stream);
typedef k3_status (*k3_router_run_fn)(k3_router_plan *plan, int64_t m, const void *x, const void *gate,
                                      const float *bias, int32_t *topk_ids, float *topk_weights, void *ws,
                                      size_t ws_bytes, void *stream);
typedef k3_status (*k3_moe_run_fn)(k3_moe_plan *plan, int64_t m, const void *x, const int32_t *topk_ids,
                                   const float *topk_weights, const k3_moe_weights *w, void *out, float *out_f32,
                                   void *ws, size_t ws_bytes, void *stream);

/* An address argument: a Python int (any value a pointer holds) or None for NULL. */
static int arg_ptr(PyObject *o, void **out, const char *what)
{
    if (o == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "_fastcall: %s must be an int address or None", what);
        return -1;
    }
    *out = PyLong_AsVoidPtr(o);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

static int arg_i64(PyObject *o, int64_t *out, const char *what)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "_fastcall: %s must be an int", what);
        return -1;
    }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int arg_size(PyObject *o, size_t *out, const char *what)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "_fastcall: %s must be an int", what);
        return -1;
    }
    size_t v = PyLong_AsSize_t(o);
    if (v == (size_t)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static int arg_count(Py_ssize_t n, Py_ssize_t want, const char *fn)
{
    if (n == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "_fastcall.%s takes %zd arguments (got %zd)", fn, want, n);
    return -1;
}

/* Pointer arguments args[first .. first + n) into p[0 .. n). */
static int arg_ptrs(PyObject *const *args, Py_ssize_t first, Py_ssize_t n, void **p)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (arg_ptr(args[first + i], &p[i], "a pointer argument") != 0)
            return -1;
    }
    return 0;
}

/* linear_run(fn, plan, m, x, w, residual, y, ws, ws_bytes, stream) -> k3_status as int */
static PyObject *fc_linear_run(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *fn, *plan, *p[5], *stream;
    int64_t m;
    size_t ws_bytes;
    if (arg_count(n, 10, "linear_run") || arg_ptr(args[0], &fn, "fn") || arg_ptr(args[1], &plan, "plan") ||
        arg_i64(args[2], &m, "m") || arg_ptrs(args, 3, 5, p) || arg_size(args[8], &ws_bytes, "ws_bytes") ||
        arg_ptr(args[9], &stream, "stream"))
        return NULL;
    if (fn == NULL) {
        PyErr_SetString(PyExc_ValueError, "_fastcall.linear_run: fn is NULL");
        return NULL;
    }
    k3_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ((k3_linear_run_fn)fn)((k3_linear_plan *)plan, m, p[0], p[1], p[2], p[3], p[4], ws_bytes, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong((long)st);
}

/* router_run(fn, plan, m, x, gate, bias, topk_ids, topk_weights, ws, ws_bytes, stream) -> k3_status as int */
static PyObject *fc_router_run(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *fn, *plan, *p[6], *stream;
    int64_t m;
    size_t ws_bytes;
    if (arg_count(n, 11, "router_run") || arg_ptr(args[0], &fn, "fn") || arg_ptr(args[1], &plan, "plan") ||
        arg_i64(args[2], &m, "m") || arg_ptrs(args, 3, 6, p) || arg_size(args[9], &ws_bytes, "ws_bytes") ||
        arg_ptr(args[10], &stream, "stream"))
        return NULL;
    if (fn == NULL) {
        PyErr_SetString(PyExc_ValueError, "_fastcall.router_run: fn is NULL");
        return NULL;
    }
    k3_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ((k3_router_run_fn)fn)((k3_router_plan *)plan, m, p[0], p[1], (const float *)p[2], (int32_t *)p[3],
                                (float *)p[4], p[5], ws_bytes, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong((long)st);
}

/*
 * moe_run(fn, plan, m, x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
 *         w2_scale_2, w2_input_scale, expert_map, out, out_f32, ws, ws_bytes, stream) -> k3_status as int
 * The weights' fields in k3_moe_weights order, the struct built here on the stack.
 */
static PyObject *fc_moe_run(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *fn, *plan, *io[3], *wp[9], *dst[2], *ws, *stream;
    int64_t m;
    size_t ws_bytes;
    if (arg_count(n, 20, "moe_run") || arg_ptr(args[0], &fn, "fn") || arg_ptr(args[1], &plan, "plan") ||
        arg_i64(args[2], &m, "m") || arg_ptrs(args, 3, 3, io) || arg_ptrs(args, 6, 9, wp) ||
        arg_ptrs(args, 15, 2, dst) || arg_ptr(args[17], &ws, "ws") || arg_size(args[18], &ws_bytes, "ws_bytes") ||
        arg_ptr(args[19], &stream, "stream"))
        return NULL;
    if (fn == NULL) {
        PyErr_SetString(PyExc_ValueError, "_fastcall.moe_run: fn is NULL");
        return NULL;
    }
    k3_moe_weights w = {wp[0], wp[1], (const float *)wp[2], (const float *)wp[3], wp[4], wp[5],
                        (const float *)wp[6], (const float *)wp[7], (const int32_t *)wp[8]};
    k3_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ((k3_moe_run_fn)fn)((k3_moe_plan *)plan, m, io[0], (const int32_t *)io[1], (const float *)io[2], &w,
                             dst[0], (float *)dst[1], ws, ws_bytes, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong((long)st);
}

/* The sizes of the structs this module builds, for the package to compare with its ctypes mirrors. */
static PyObject *fc_layouts(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue("{s:n,s:n}", "k3_moe_weights", (Py_ssize_t)sizeof(k3_moe_weights), "pointer",
                         (Py_ssize_t)sizeof(void *));
}

static PyMethodDef fc_methods[] = {
    {"linear_run", (PyCFunction)(void (*)(void))fc_linear_run, METH_FASTCALL,
     "linear_run(fn, plan, m, x, w, residual, y, ws, ws_bytes, stream) -> status: k3_linear_run through fn"},
    {"router_run", (PyCFunction)(void (*)(void))fc_router_run, METH_FASTCALL,
     "router_run(fn, plan, m, x, gate, bias, topk_ids, topk_weights, ws, ws_bytes, stream) -> status"},
    {"moe_run", (PyCFunction)(void (*)(void))fc_moe_run, METH_FASTCALL,
     "moe_run(fn, plan, m, x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, "
     "w2_scale_2, w2_input_scale, expert_map, out, out_f32, ws, ws_bytes, stream) -> status"},
    {"layouts", fc_layouts, METH_NOARGS, "layouts() -> {struct name: sizeof}"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fc_module = {
    PyModuleDef_HEAD_INIT, "_fastcall",
    "Compiled run calls for the torch front end's eager path (see the source's opening comment).", 0, fc_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void);
PyMODINIT_FUNC PyInit__fastcall(void)
{
    return PyModule_Create(&fc_module);
}
