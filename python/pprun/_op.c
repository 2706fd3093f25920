/* _op.c: pprun._op, the one call of libpprun_trace that a traced PyTorch
 * program makes for every op, without ctypes (docs/torch.md, "What tracing
 * costs").
 *
 * An op recorded right after PyTorch's work finds every cache cold, and
 * there a record's own cost is 33 us through ctypes (its argument
 * conversion, libffi's call, the GIL's release and re-acquisition: code
 * that is not in cache) and 20 us through a builtin function of this
 * module (bench/torch_record.py). So the package's per-op call comes here,
 * and everything else (loading the library, the schedule, losses, spans)
 * stays on ctypes.
 *
 * The module does not link libpprun_trace: it calls the library that
 * pprun's package loaded through ctypes (PPRUN_TRACE_LIB), whose
 * pprun_trace_op_packed's address bind() gives it, so the process has one
 * tracer (one writer of its ring) whatever paths the two were found at.
 * Built for CPython's stable ABI (Py_LIMITED_API, 3.10 on): one file loads
 * in every later Python. Where it is not built or does not load, the
 * package records through ctypes, the same records (python/pprun/_trace.py).
 *
 * The library is called with the GIL held, as by ctypes.PyDLL: a record
 * takes a microsecond or two, one read of /proc among them. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "tracer/pprun_trace.h"

typedef int (*op_fn)(const pprun_trace_op_record *);

static op_fn op_packed; /* pprun_trace_op_packed of the loaded library; NULL until bind() */

/* One int argument of put(): the C int32 field it fills, or -1 with
 * OverflowError (what struct.pack raises as struct.error on the ctypes
 * path: the caller refuses the record either way). */
static int op_int32(PyObject *arg, const char *field, int32_t *out) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s %ld does not fit the record's 32-bit field", field, v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int op_uint64(PyObject *arg, uint64_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* put(phase, gpu, step, microbatch, stage, peer, bytes, start_ns, end_ns):
 * pprun_trace_op_packed's return (1 written, 0 not under pprun, -1 refused:
 * the library's pprun_trace_error says why). phase: bytes (b"F"); more than
 * 15 of them fill the field without its NUL, which the library refuses. */
static PyObject *op_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9)
        return PyErr_Format(PyExc_TypeError, "put() takes 9 arguments (phase, gpu, step, microbatch, stage, peer, "
                            "bytes, start_ns, end_ns), %zd given", nargs);
    if (!op_packed) return PyErr_Format(PyExc_RuntimeError, "put(): no library bound (bind() first)");
    char *phase;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(args[0], &phase, &len) < 0) return NULL;
    pprun_trace_op_record r;
    memset(&r, 0, sizeof r);
    memcpy(r.phase, phase, (size_t)len < sizeof r.phase ? (size_t)len : sizeof r.phase);
    if (op_int32(args[1], "gpu", &r.gpu) < 0 || op_int32(args[2], "step", &r.step) < 0 ||
        op_int32(args[3], "microbatch", &r.microbatch) < 0 || op_int32(args[4], "stage", &r.stage) < 0 ||
        op_int32(args[5], "peer", &r.peer) < 0 || op_uint64(args[6], &r.bytes) < 0 ||
        op_uint64(args[7], &r.start_ns) < 0 || op_uint64(args[8], &r.end_ns) < 0)
        return NULL;
    return PyLong_FromLong(op_packed(&r));
}

/* bind(address): the address of pprun_trace_op_packed in the library the
 * package loaded (ctypes.cast(lib.pprun_trace_op_packed, c_void_p).value). */
static PyObject *op_bind(PyObject *self, PyObject *arg) {
    (void)self;
    void *address = PyLong_AsVoidPtr(arg);
    if (!address) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind(): a NULL address");
        return NULL;
    }
    op_packed = (op_fn)address;
    Py_RETURN_NONE;
}

static PyMethodDef op_methods[] = {
    {"put", (PyCFunction)(void (*)(void))op_put, METH_FASTCALL,
     "put(phase, gpu, step, microbatch, stage, peer, bytes, start_ns, end_ns): one op, as pprun_trace_op_packed"},
    {"bind", op_bind, METH_O, "bind(address): the loaded library's pprun_trace_op_packed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef op_module = {PyModuleDef_HEAD_INIT, "pprun._op", NULL, -1, op_methods,
                                       NULL,  NULL,       NULL, NULL};

PyMODINIT_FUNC PyInit__op(void) { return PyModule_Create(&op_module); }
