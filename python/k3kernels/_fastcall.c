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

/*
 * Every run call's arguments: fn, plan, m, then np pointers (None for NULL), then ws_bytes and stream, as the C
 * functions take them after the plan and m. Refuses a wrong count, a non-int and a NULL fn with a Python error.
 */
static int arg_run(PyObject *const *args, Py_ssize_t n, int np, const char *name, void **fn, void **plan,
                   int64_t *m, void **p, size_t *ws_bytes, void **stream)
{
    if (n != np + 5) {
        PyErr_Format(PyExc_TypeError, "_fastcall.%s takes %d arguments (got %zd)", name, np + 5, n);
        return -1;
    }
    if (arg_ptr(args[0], fn, "fn") || arg_ptr(args[1], plan, "plan") || arg_i64(args[2], m, "m"))
        return -1;
    for (int i = 0; i < np; i++) {
        if (arg_ptr(args[3 + i], &p[i], "a pointer argument") != 0)
            return -1;
    }
    if (arg_size(args[3 + np], ws_bytes, "ws_bytes") || arg_ptr(args[4 + np], stream, "stream"))
        return -1;
    if (*fn == NULL) {
        PyErr_Format(PyExc_ValueError, "_fastcall.%s: fn is NULL", name);
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
    if (arg_run(args, n, 5, "linear_run", &fn, &plan, &m, p, &ws_bytes, &stream))
        return NULL;
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
    if (arg_run(args, n, 6, "router_run", &fn, &plan, &m, p, &ws_bytes, &stream))
        return NULL;
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
 * The weights' fields in k3_moe_weights order (p[3 .. 11]), the struct built here on the stack.
 */
static PyObject *fc_moe_run(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *fn, *plan, *p[15], *stream;
    int64_t m;
    size_t ws_bytes;
    if (arg_run(args, n, 15, "moe_run", &fn, &plan, &m, p, &ws_bytes, &stream))
        return NULL;
    k3_moe_weights w = {p[3], p[4], (const float *)p[5], (const float *)p[6], p[7], p[8],
                        (const float *)p[9], (const float *)p[10], (const int32_t *)p[11]};
    k3_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ((k3_moe_run_fn)fn)((k3_moe_plan *)plan, m, p[0], (const int32_t *)p[1], (const float *)p[2], &w, p[12],
                             (float *)p[13], p[14], ws_bytes, stream);
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
