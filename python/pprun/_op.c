/* _op.c: pprun._op, what a traced PyTorch program runs of pprun's for
 * every op, in C: the record call without ctypes, and the wrappers of
 * PyTorch's ops for the common case (docs/torch.md, "What tracing costs").
 *
 * An op recorded right after PyTorch's work finds every cache cold, and
 * there a record's own cost is 33 us through ctypes (its argument
 * conversion, libffi's call, the GIL's release and re-acquisition: code
 * that is not in cache) and 20 us through put(), a builtin function of
 * this module (bench/torch_record.py); the Python wrapper around it cost
 * as much again. So the package's per-op and per-loss calls come here
 * (put(), loss(), eval_loss()), its wrappers' common case too (wrap(),
 * below), and everything else (loading the library, the schedule, spans)
 * stays on ctypes and Python.
 *
 * The module does not link libpprun_trace: it calls the library that
 * pprun's package loaded through ctypes (PPRUN_TRACE_LIB), whose calls'
 * addresses bind() gives it, so the process has one
 * tracer (one writer of its ring) whatever paths the two were found at.
 * Built for CPython's stable ABI (Py_LIMITED_API, 3.10 on): one file loads
 * in every later Python. Where it is not built or does not load, the
 * package records through ctypes and its Python wrappers, the same records
 * (python/pprun/_trace.py, torch.py).
 *
 * The library is called with the GIL held, as by ctypes.PyDLL: a record
 * takes a microsecond or two, a read of /proc among them where the thread
 * was switched out since its previous record (tracer/cpuwait.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "tracer/pprun_trace.h"

typedef int (*op_fn)(const pprun_trace_op_record *);
typedef int (*loss_fn)(int step, int microbatch, int stage, double loss);

/* The loaded library's calls (bind()); NULL until then. */
static op_fn op_packed;               /* pprun_trace_op_packed */
static loss_fn loss_train, loss_eval; /* pprun_trace_loss, pprun_trace_eval_loss */

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

/* loss(step, microbatch, stage, value) and eval_loss(...): the library's
 * pprun_trace_loss and pprun_trace_eval_loss, a number past its C int an
 * OverflowError (as put's). value: a float, or what float() takes. */
static PyObject *op_loss(loss_fn fn, const char *name, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "%s() takes 4 arguments (step, microbatch, stage, value), %zd given",
                            name, nargs);
    if (!fn) return PyErr_Format(PyExc_RuntimeError, "%s(): no library bound (bind() first)", name);
    int32_t step, mb, stage;
    if (op_int32(args[0], "step", &step) < 0 || op_int32(args[1], "microbatch", &mb) < 0 ||
        op_int32(args[2], "stage", &stage) < 0)
        return NULL;
    double value = PyFloat_AsDouble(args[3]);
    if (value == -1.0 && PyErr_Occurred()) return NULL;
    return PyLong_FromLong(fn(step, mb, stage, value));
}

static PyObject *op_train_loss(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return op_loss(loss_train, "loss", args, nargs);
}

static PyObject *op_eval_loss(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return op_loss(loss_eval, "eval_loss", args, nargs);
}

/* ---- the fast path: a traced step's ops recorded from C -----------------
 *
 * Every F, B, W and BW of a traced stage, and every send and receive of
 * its batched p2p, goes through a wrapper of pprun's. In Python
 * (python/pprun/torch.py: the reference, and the path of every case but the
 * common one) a wrapper costs a rank more than the record itself right
 * after PyTorch's work: frames, argument packing, look-ups of cold
 * dictionaries, and torch.device's type getter (docs/torch.md, "What
 * tracing costs"). The wrappers here are those Python wrappers in C for the
 * common case, a CPU stage in a training step while tracing is on; they
 * hand everything else to the Python wrapper (slow) unchanged.
 *
 *   fast_on   set by the package at each training step's start, cleared at
 *             its end (context()); not in the step that records the order
 *             of a schedule without a plan, nor in an evaluation
 *   cur_step  that step: the records' step
 *   first_mb  its replica's first global microbatch (replica·n): a record's
 *             microbatch is the schedule's chunk id plus it (docs/schema.md)
 *   tracing   1 until tracing stops (stop(): a refused record, a fork)
 *
 * Three kinds of wrapper (wrapper.kind), one type:
 *   WRAP_COMPUTE  forward_one_chunk, backward_one_chunk, backward_weight_one_chunk:
 *                 the op's span (B where backward_one_chunk(full_backward=False))
 *   WRAP_TAG      get_{fwd,bwd}_{send,recv}_ops: each P2POp gets _pprun =
 *                 (phase, stage, microbatch), what it carries
 *   WRAP_BATCH    schedules._batch_p2p: its tagged ops' spans end when its
 *                 Work, or the last of its Works (torch >= 2.8), has been
 *                 waited for (work objects of this module's)
 * A record the library refuses goes to the package's refused(phase, stage,
 * microbatch, skipped), which stops tracing and counts the batch's records
 * skipped after it; records of a batch issued before a stop and waited for
 * after it go to lost(n) (hooks()). */

enum { WRAP_COMPUTE, WRAP_TAG, WRAP_BATCH };

static int fast_on, tracing = 1;
static int32_t cur_step, first_mb;
static PyObject *hook_refused, *hook_lost; /* the package's callables (hooks()) */
static PyObject *method_type;              /* types.MethodType: a wrapper bound to a stage, where one is asked for */
static PyObject *str_device, *str_type, *str_stage_index, *str_full_backward, *str_cpu, *str_pprun, *str_peer,
    *str_tensor, *str_nbytes, *str_wait;
static PyObject *work_type;

typedef struct {
    PyObject_HEAD
    PyObject *orig; /* PyTorch's method or function */
    PyObject *slow; /* the package's Python wrapper of it */
    int kind;       /* WRAP_* */
    char phase[16]; /* WRAP_COMPUTE: "F", "BW" or "W"; WRAP_TAG: "SEND_F" ... */
} wrapper;

static uint64_t op_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the package's clock: time.monotonic_ns */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* An int as an int32 (op_int32's check), or 0 where it is not one, with no
 * exception set (the slow path takes it: its errors are the Python
 * wrapper's). */
static int op_as_int32(PyObject *v, int32_t *out) {
    if (v && PyLong_Check(v) && op_int32(v, "", out) == 0) return 1;
    PyErr_Clear();
    return 0;
}

/* self's attribute name, else inner's (NULL: self's AttributeError): what
 * a wrapper or a work passes through from the object it stands for. */
static PyObject *op_attr_through(PyObject *self, PyObject *name, PyObject *inner) {
    PyObject *v = PyObject_GenericGetAttr(self, name);
    if (v || !inner || !PyErr_ExceptionMatches(PyExc_AttributeError)) return v;
    PyErr_Clear();
    return PyObject_GetAttr(inner, name);
}

/* obj.name as an int32, or 0 (no such attribute, not an int32). */
static int op_attr_int32(PyObject *obj, PyObject *name, int32_t *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) PyErr_Clear();
    int ok = op_as_int32(v, out);
    Py_XDECREF(v);
    return ok;
}

/* Writes r: 0; a refusal goes to the package's refused(), with the records
 * of its batch skipped after it: 1, or -1 where refused() raised. */
static int op_write(const pprun_trace_op_record *r, Py_ssize_t skipped) {
    if (op_packed(r) >= 0) return 0;
    PyObject *rc = PyObject_CallFunction(hook_refused, "y#iin", r->phase, (Py_ssize_t)strnlen(r->phase, sizeof r->phase),
                                         (int)r->stage, (int)r->microbatch, skipped);
    Py_XDECREF(rc);
    return rc ? 1 : -1;
}

/* n records not made because tracing stopped: the package's lost(n). 0,
 * or -1 where it raised. */
static int op_lost(Py_ssize_t n) {
    PyObject *rc = PyObject_CallFunction(hook_lost, "n", n);
    Py_XDECREF(rc);
    return rc ? 0 : -1;
}

/* Whether the stage is on the CPU: its device a torch.device of type "cpu".
 * A stage keeps its device object, and reading a torch.device's type makes
 * a new string in libtorch's code, 17 us right after PyTorch's work: so the
 * device objects found to be the CPU are kept, and a stage's is recognised
 * by identity. */
#define CPU_DEVICES 16
static PyObject *cpu_devices[CPU_DEVICES]; /* strong references: an object's address stays its own */
static int n_cpu_devices;

static int op_on_cpu(PyObject *stage) {
    PyObject *device = PyObject_GetAttr(stage, str_device);
    if (!device) {
        PyErr_Clear();
        return 0;
    }
    for (int i = 0; i < n_cpu_devices; i++)
        if (cpu_devices[i] == device) {
            Py_DECREF(device);
            return 1;
        }
    PyObject *type = PyObject_GetAttr(device, str_type);
    if (!type) PyErr_Clear();
    int cpu = type && PyUnicode_Check(type) && PyUnicode_Compare(type, str_cpu) == 0;
    Py_XDECREF(type);
    if (cpu && n_cpu_devices < CPU_DEVICES)
        cpu_devices[n_cpu_devices++] = device; /* the reference kept */
    else
        Py_DECREF(device);
    return cpu;
}

/* A stage's method called as (stage, chunk_id, ...): 1 with the stage's
 * index and the microbatch where it is the fast path's case, else 0. */
static int op_stage_call(PyObject *args, int32_t *stage, int32_t *mb) {
    return PyTuple_Size(args) >= 2 && op_on_cpu(PyTuple_GetItem(args, 0)) &&
           op_as_int32(PyTuple_GetItem(args, 1), mb) && *mb >= 0 && *mb <= INT32_MAX - first_mb && /* global, fits */
           op_attr_int32(PyTuple_GetItem(args, 0), str_stage_index, stage);
}

/* The phase a compute op records: B for backward_one_chunk with
 * full_backward false (its 4th argument, or the keyword), else the
 * wrapper's own; NULL where it cannot tell (the slow path decides). */
static const char *compute_phase(const wrapper *w, PyObject *args, PyObject *kwargs) {
    if (strcmp(w->phase, "BW") != 0) return w->phase;
    PyObject *full = kwargs ? PyDict_GetItemWithError(kwargs, str_full_backward) : NULL;
    if (!full && PyErr_Occurred()) return NULL;
    if (!full && PyTuple_Size(args) > 3) full = PyTuple_GetItem(args, 3);
    if (!full) return w->phase;
    int yes = PyObject_IsTrue(full);
    if (yes < 0) return NULL;
    return yes ? "BW" : "B";
}

/* How deep this thread is in a compute op of the fast path (in_op()): a
 * collective the op runs (tensor parallelism's all-reduce in a forward) is
 * the op's time, not a data-parallel collective of the rank's
 * (python/pprun/torch.py, _wrap_collective). */
static _Thread_local int op_depth;

static PyObject *compute_call(wrapper *w, PyObject *args, PyObject *kwargs) {
    int32_t stage, mb;
    const char *phase;
    if (!op_stage_call(args, &stage, &mb) || !(phase = compute_phase(w, args, kwargs))) {
        PyErr_Clear();
        return PyObject_Call(w->slow, args, kwargs);
    }
    pprun_trace_op_record r;
    memset(&r, 0, sizeof r);
    memcpy(r.phase, phase, strlen(phase));
    r.step = cur_step, r.microbatch = mb + first_mb, r.stage = stage, r.peer = -1;
    r.start_ns = op_now();
    op_depth++;
    PyObject *out = PyObject_Call(w->orig, args, kwargs);
    op_depth--;
    if (!out) return NULL;
    r.end_ns = op_now();
    /* tracing may have stopped during the op (a refused span of the
     * program's inside it): then the op is lost, as in Python */
    if ((tracing ? op_write(&r, 0) : op_lost(1)) < 0) Py_CLEAR(out);
    return out;
}

static PyObject *tag_call(wrapper *w, PyObject *args, PyObject *kwargs) {
    int32_t stage, mb;
    if (!op_stage_call(args, &stage, &mb)) return PyObject_Call(w->slow, args, kwargs);
    PyObject *ops = PyObject_Call(w->orig, args, kwargs);
    if (!ops || !PyList_Check(ops)) return ops; /* torch's get_*_ops return a list; anything else goes untagged */
    PyObject *tag = Py_BuildValue("(yii)", w->phase, (int)stage, (int)(mb + first_mb));
    if (!tag) {
        Py_DECREF(ops);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_Size(ops); i++) {
        PyObject *op = Py_NewRef(PyList_GetItem(ops, i)); /* held: setting an attribute may run Python */
        int rc = PyObject_SetAttr(op, str_pprun, tag);
        Py_DECREF(op);
        if (rc < 0) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                Py_DECREF(tag);
                Py_DECREF(ops);
                return NULL;
            }
            PyErr_Clear(); /* a P2POp that takes no attribute (slots): its span is not recorded */
            break;
        }
    }
    Py_DECREF(tag);
    return ops;
}

/* The record of one tagged P2POp (its _pprun, peer and tensor's bytes): 1,
 * 0 for an op without a tag, -1 with an exception. */
static int batch_op(PyObject *op, pprun_trace_op_record *r) {
    PyObject *tag = PyObject_GetAttr(op, str_pprun);
    if (!tag) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    char *phase;
    Py_ssize_t len;
    int32_t stage, mb;
    int ok = PyTuple_Check(tag) && PyTuple_Size(tag) == 3 &&
             PyBytes_AsStringAndSize(PyTuple_GetItem(tag, 0), &phase, &len) == 0 &&
             op_as_int32(PyTuple_GetItem(tag, 1), &stage) && op_as_int32(PyTuple_GetItem(tag, 2), &mb);
    if (ok) {
        memset(r, 0, sizeof *r);
        memcpy(r->phase, phase, (size_t)len < sizeof r->phase ? (size_t)len : sizeof r->phase);
        r->stage = stage, r->microbatch = mb, r->step = cur_step;
    }
    Py_DECREF(tag);
    if (!ok) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a P2POp's _pprun is not (phase, stage, microbatch)");
        return -1;
    }
    PyObject *peer = PyObject_GetAttr(op, str_peer);
    PyObject *tensor = peer ? PyObject_GetAttr(op, str_tensor) : NULL;
    PyObject *nbytes = tensor ? PyObject_GetAttr(tensor, str_nbytes) : NULL; /* a p2p tensor is dense */
    ok = nbytes && op_as_int32(peer, &r->peer);
    if (ok) {
        r->bytes = PyLong_AsUnsignedLongLong(nbytes);
        ok = !PyErr_Occurred();
    }
    Py_XDECREF(peer);
    Py_XDECREF(tensor);
    Py_XDECREF(nbytes);
    if (!ok && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a P2POp's peer is not a rank");
    return ok ? 1 : -1;
}

/* One batched p2p's tagged ops: their records, written when the last of
 * the batch's Works has been waited for. Its works share it (holders);
 * the last one freed frees it. */
typedef struct {
    Py_ssize_t holders, left; /* work objects holding it; of them, not yet waited for */
    Py_ssize_t n;
    pprun_trace_op_record recs[];
} batch;

static void batch_release(batch *b) {
    if (b && --b->holders == 0) PyMem_Free(b);
}

/* The batch's spans, ending now: 0, or -1 with an exception. */
static int batch_write(batch *b) {
    uint64_t t1 = op_now();
    if (!tracing) return op_lost(b->n); /* stopped since the batch was issued: counted as lost */
    for (Py_ssize_t i = 0; i < b->n; i++) {
        b->recs[i].end_ns = t1 > b->recs[i].start_ns ? t1 : b->recs[i].start_ns;
        int rc = op_write(&b->recs[i], b->n - i - 1);
        if (rc) return rc < 0 ? -1 : 0; /* refused: the rest of the batch was counted as lost */
    }
    return 0;
}

/* A Work of a batched p2p (torch 2.6: the batch's one; later torch: one of
 * its Works): waited for, it counts towards its batch's spans; everything
 * else is the Work's own (attributes pass through). */
typedef struct {
    PyObject_HEAD
    PyObject *work;
    int done;
    batch *b;
} work;

/* The batched p2p this process waits for in work_wait, and since when
 * (op_now); NULL outside a wait. The package's watch reads it (waiting())
 * to say which wait went on past --recv-timeout. Written and read with
 * the GIL held: torch's wait() releases it while it blocks. */
static batch *waiting_batch;
static uint64_t waiting_since;

static PyObject *work_wait(PyObject *self, PyObject *args, PyObject *kwargs) {
    work *w = (work *)self;
    if (!w->work) return PyErr_Format(PyExc_RuntimeError, "pprun._op: a batched p2p's Work already collected");
    PyObject *wait = PyObject_GetAttr(w->work, str_wait);
    waiting_batch = w->b, waiting_since = op_now();
    PyObject *out = wait ? PyObject_Call(wait, args, kwargs) : NULL;
    waiting_batch = NULL;
    Py_XDECREF(wait);
    if (!out || w->done) return out;
    w->done = 1;
    if (--w->b->left == 0 && batch_write(w->b) < 0) Py_CLEAR(out);
    return out;
}

static PyObject *work_getattro(PyObject *self, PyObject *name) {
    return op_attr_through(self, name, ((work *)self)->work);
}

static int work_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self)); /* a heap type's instances hold it */
    Py_VISIT(((work *)self)->work);
    return 0;
}

/* A work cleared (by the collector, in a cycle: never to be waited for)
 * or freed: its Work and records go. */
static int work_clear(PyObject *self) {
    work *w = (work *)self;
    Py_CLEAR(w->work);
    batch_release(w->b);
    w->b = NULL;
    return 0;
}

/* Both types' dealloc: untracked, cleared by their tp_clear, freed. */
static void op_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    ((inquiry)PyType_GetSlot(type, Py_tp_clear))(self);
    PyObject_GC_Del(self);
    Py_DECREF(type);
}

static PyMethodDef work_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))work_wait, METH_VARARGS | METH_KEYWORDS, "the Work's wait(); then its spans"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot work_slots[] = {
    {Py_tp_getattro, work_getattro}, {Py_tp_methods, work_methods}, {Py_tp_traverse, work_traverse},
    {Py_tp_clear, work_clear},       {Py_tp_dealloc, op_dealloc}, {Py_tp_doc, "a batched p2p's Work, traced"},
    {0, NULL},
};

/* Made by _batch_p2p's wrapper only (DISALLOW_INSTANTIATION: no empty one
 * from Python), as wrappers by wrap(). */
static PyType_Spec work_spec = {"pprun._op.work", sizeof(work), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, work_slots};

/* A work object for torch's Work, holding b; NULL with an exception. */
static PyObject *work_of(PyObject *torch_work, batch *b) {
    work *wk = PyObject_GC_New(work, (PyTypeObject *)work_type);
    if (!wk) return NULL;
    wk->work = Py_NewRef(torch_work), wk->done = 0, wk->b = b;
    b->holders++;
    PyObject_GC_Track((PyObject *)wk);
    return (PyObject *)wk;
}

/* What the schedule gets for torch's batch `out` (its Work, or a list of
 * them), b's spans waiting on it: a work object, a list of them, or `out`
 * itself when it is empty or None (nothing to wait for: a program's own
 * _batch_p2p that waited itself; the spans end now). NULL with an
 * exception. Takes b: the work objects made hold it, and it is freed
 * where none does. */
static PyObject *batch_works(PyObject *out, batch *b) {
    PyObject *got;
    b->holders = 1; /* this call's, while it makes the work objects */
    if (out == Py_None) {
        got = batch_write(b) < 0 ? NULL : Py_NewRef(out);
    } else if (!PyList_Check(out) && !PyTuple_Check(out)) {
        b->left = 1;
        got = work_of(out, b);
    } else if ((b->left = PyList_Check(out) ? PyList_Size(out) : PyTuple_Size(out)) == 0) {
        got = batch_write(b) < 0 ? NULL : Py_NewRef(out);
    } else {
        Py_ssize_t m = b->left;
        got = PyList_New(m);
        for (Py_ssize_t i = 0; got && i < m; i++) {
            /* held: making a work object may collect garbage, and a finalizer change the list */
            PyObject *torch_work = PyList_Check(out) ? PyList_GetItem(out, i) : PyTuple_GetItem(out, i);
            Py_XINCREF(torch_work);
            PyObject *wk = torch_work ? work_of(torch_work, b) : NULL;
            Py_XDECREF(torch_work);
            if (!wk) Py_CLEAR(got);
            else PyList_SetItem(got, i, wk);
        }
    }
    batch_release(b);
    return got;
}

/* How deep this thread is in _batch_p2p's wrapper: torch's _batch_p2p may
 * call itself through its module (torch 2.14, a batch of two
 * communicators' ops with per-direction p2p: each communicator's as a
 * batch of its own), and the outer call's records hold the inner calls'
 * ops, which are written once. */
static _Thread_local int batch_depth;

static PyObject *batch_call(wrapper *w, PyObject *args, PyObject *kwargs) {
    PyObject *p2p_ops = PyTuple_Size(args) >= 1 ? PyTuple_GetItem(args, 0) : NULL;
    if (batch_depth > 0) return PyObject_Call(w->orig, args, kwargs);
    batch_depth++;
    if (!p2p_ops || !PyList_Check(p2p_ops)) {
        PyObject *out = PyObject_Call(w->slow, args, kwargs);
        batch_depth--;
        return out;
    }
    uint64_t t0 = op_now();
    PyObject *out = PyObject_Call(w->orig, args, kwargs);
    batch_depth--;
    if (!out) return out;
    Py_ssize_t n = PyList_Size(p2p_ops);
    batch *b = PyMem_Calloc(1, sizeof *b + (size_t)n * sizeof b->recs[0]);
    if (!b) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n && i < PyList_Size(p2p_ops); i++) { /* reading an op may run Python */
        PyObject *op = Py_NewRef(PyList_GetItem(p2p_ops, i));
        int rc = batch_op(op, &b->recs[b->n]);
        Py_DECREF(op);
        if (rc < 0) {
            PyMem_Free(b);
            Py_DECREF(out);
            return NULL;
        }
        if (rc) b->recs[b->n++].start_ns = t0;
    }
    if (b->n == 0) { /* nothing of pprun's in it: torch's as it is */
        PyMem_Free(b);
        return out;
    }
    PyObject *got = batch_works(out, b);
    Py_DECREF(out);
    return got;
}

static PyObject *wrapper_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    wrapper *w = (wrapper *)self;
    if (!fast_on) return PyObject_Call(w->slow, args, kwargs);
    switch (w->kind) {
    case WRAP_COMPUTE: return compute_call(w, args, kwargs);
    case WRAP_TAG: return tag_call(w, args, kwargs);
    default: return batch_call(w, args, kwargs);
    }
}

/* A wrapper bound to a stage, where the interpreter does not call it as a
 * method directly (getattr(stage, "forward_one_chunk")). */
static PyObject *wrapper_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (!obj || obj == Py_None) return Py_NewRef(self);
    return PyObject_CallFunctionObjArgs(method_type, self, obj, NULL);
}

/* What the package and functools read of a wrapper: the method it wraps,
 * and that it is pprun's (python/pprun/torch.py, _replace). */
static PyObject *wrapper_wrapped(PyObject *self, void *closure) {
    (void)closure;
    return Py_NewRef(((wrapper *)self)->orig);
}

static PyObject *wrapper_is_pprun(PyObject *self, void *closure) {
    (void)self, (void)closure;
    Py_RETURN_TRUE;
}

static PyGetSetDef wrapper_getset[] = {
    {"__wrapped__", wrapper_wrapped, NULL, "the method wrapped", NULL},
    {"_pprun_wrapped", wrapper_is_pprun, NULL, "True: a wrapper of pprun's", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int wrapper_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((wrapper *)self)->orig);
    Py_VISIT(((wrapper *)self)->slow);
    return 0;
}

static int wrapper_clear(PyObject *self) {
    Py_CLEAR(((wrapper *)self)->orig);
    Py_CLEAR(((wrapper *)self)->slow);
    return 0;
}

/* What functools.wraps would have copied (__name__, __qualname__ ...):
 * read from the method wrapped. */
static PyObject *wrapper_getattro(PyObject *self, PyObject *name) {
    return op_attr_through(self, name, ((wrapper *)self)->orig);
}

static PyType_Slot wrapper_slots[] = {
    {Py_tp_getattro, wrapper_getattro},
    {Py_tp_call, wrapper_call},   {Py_tp_descr_get, wrapper_get},   {Py_tp_getset, wrapper_getset},
    {Py_tp_traverse, wrapper_traverse}, {Py_tp_clear, wrapper_clear}, {Py_tp_dealloc, op_dealloc},
    {Py_tp_doc, "a wrapper of pprun's: its common case in C, the rest in the package's Python wrapper"},
    {0, NULL},
};

/* METHOD_DESCRIPTOR: called on a stage, the interpreter passes the stage as
 * the first argument, with no bound object made per call (as for a Python
 * function). */
static PyType_Spec wrapper_spec = {"pprun._op.wrapper", sizeof(wrapper), 0,
                                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_METHOD_DESCRIPTOR |
                                       Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                   wrapper_slots};
static PyObject *wrapper_type;

static const struct {
    const char *phase;
    int kind;
} wrap_kinds[] = {{"F", WRAP_COMPUTE},      {"BW", WRAP_COMPUTE},     {"W", WRAP_COMPUTE},
                  {"SEND_F", WRAP_TAG},     {"RECV_F", WRAP_TAG},     {"SEND_B", WRAP_TAG},
                  {"RECV_B", WRAP_TAG},     {"", WRAP_BATCH}};

/* wrap(orig, slow, phase): orig PyTorch's method (or _batch_p2p), slow the
 * package's Python wrapper of it, phase what it records (wrap_kinds: b""
 * for _batch_p2p). */
static PyObject *op_wrap(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *orig, *slow, *given;
    if (!PyArg_ParseTuple(args, "OOS:wrap", &orig, &slow, &given)) return NULL;
    const char *phase = PyBytes_AsString(given);
    int kind = -1;
    for (size_t i = 0; kind < 0 && i < sizeof wrap_kinds / sizeof wrap_kinds[0]; i++)
        if ((size_t)PyBytes_Size(given) == strlen(wrap_kinds[i].phase) && strcmp(phase, wrap_kinds[i].phase) == 0)
            kind = wrap_kinds[i].kind;
    if (kind < 0) /* %R: the bytes escaped, as Python shows them */
        return PyErr_Format(PyExc_ValueError, "wrap(): phase %R is none of pprun's wrappers'", given);
    if (!op_packed || !hook_refused)
        return PyErr_Format(PyExc_RuntimeError, "wrap(): no library bound or no hooks (bind() and hooks() first)");
    wrapper *w = PyObject_GC_New(wrapper, (PyTypeObject *)wrapper_type);
    if (!w) return NULL;
    w->orig = Py_NewRef(orig);
    w->slow = Py_NewRef(slow);
    w->kind = kind;
    memset(w->phase, 0, sizeof w->phase);
    memcpy(w->phase, phase, strlen(phase));
    PyObject_GC_Track((PyObject *)w);
    return (PyObject *)w;
}

/* hooks(refused, lost): the package's callables, refused(phase, stage,
 * microbatch, skipped) for a record the library refused, lost(n) for
 * records not made because tracing stopped. */
static PyObject *op_hooks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *hook[2], **kept[2] = {&hook_refused, &hook_lost};
    if (!PyArg_ParseTuple(args, "OO:hooks", &hook[0], &hook[1])) return NULL;
    for (int i = 0; i < 2; i++)
        if (!PyCallable_Check(hook[i])) return PyErr_Format(PyExc_TypeError, "hooks(): argument %d is not callable", i + 1);
    for (int i = 0; i < 2; i++) {
        PyObject *old = *kept[i];
        *kept[i] = Py_NewRef(hook[i]);
        Py_XDECREF(old);
    }
    Py_RETURN_NONE;
}

/* context(step, fast, first_mb): the step the fast path records, whether
 * it may (a training step whose number fits a record, tracing on), and
 * its replica's first global microbatch. */
static PyObject *op_context(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *step_obj, *first_obj;
    int fast, overflow, first_overflow;
    if (!PyArg_ParseTuple(args, "O!pO!:context", &PyLong_Type, &step_obj, &fast, &PyLong_Type, &first_obj))
        return NULL;
    long long step = PyLong_AsLongLongAndOverflow(step_obj, &overflow);
    long long first = PyLong_AsLongLongAndOverflow(first_obj, &first_overflow);
    if (PyErr_Occurred()) return NULL;
    /* past a record's field: the Python wrappers refuse its ops */
    if (overflow || step < 0 || step > INT32_MAX || first_overflow || first < 0 || first > INT32_MAX) fast = 0;
    if (fast && (!op_packed || !hook_refused))
        return PyErr_Format(PyExc_RuntimeError, "context(): no library bound or no hooks (bind() and hooks() first)");
    cur_step = (int32_t)(fast ? step : 0), first_mb = (int32_t)(fast ? first : 0), fast_on = fast && tracing;
    Py_RETURN_NONE;
}

/* stop(): tracing stopped (a refused record, a forked child): the fast path
 * records nothing more; its batches in flight count their records as lost. */
static PyObject *op_stop(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    tracing = 0, fast_on = 0;
    Py_RETURN_NONE;
}

/* in_op(): whether this thread is inside a compute op of the fast path. */
static PyObject *op_in_op(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(op_depth > 0);
}

/* bind(op_packed, loss, eval_loss): the addresses of pprun_trace_op_packed,
 * pprun_trace_loss and pprun_trace_eval_loss in the library the package
 * loaded (ctypes.cast(lib.pprun_trace_op_packed, c_void_p).value ...). */
static PyObject *op_bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arg[3];
    void *address[3];
    if (!PyArg_ParseTuple(args, "OOO:bind", &arg[0], &arg[1], &arg[2])) return NULL;
    for (int i = 0; i < 3; i++) {
        address[i] = PyLong_AsVoidPtr(arg[i]);
        if (!address[i]) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "bind(): address %d is NULL", i + 1);
            return NULL;
        }
    }
    op_packed = (op_fn)address[0], loss_train = (loss_fn)address[1], loss_eval = (loss_fn)address[2];
    Py_RETURN_NONE;
}

/* waiting(): (since_ns, step, ((phase, stage, microbatch, peer, bytes), ...))
 * of the batched p2p this process waits for, or None (the Python
 * wrapper's _Work.wait keeps the same in pprun.torch). */
static PyObject *op_waiting(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    batch *b = waiting_batch;
    if (!b) Py_RETURN_NONE;
    PyObject *ops = PyTuple_New(b->n);
    for (Py_ssize_t i = 0; ops && i < b->n; i++) {
        const pprun_trace_op_record *r = &b->recs[i];
        PyObject *one = Py_BuildValue("(yiiiK)", r->phase, r->stage, r->microbatch, r->peer,
                                      (unsigned long long)r->bytes);
        if (!one || PyTuple_SetItem(ops, i, one) < 0) Py_CLEAR(ops); /* SetItem takes one, even failing */
    }
    return ops ? Py_BuildValue("(KiN)", (unsigned long long)waiting_since, b->n ? b->recs[0].step : 0, ops) : NULL;
}

static PyMethodDef op_methods[] = {
    {"put", (PyCFunction)(void (*)(void))op_put, METH_FASTCALL,
     "put(phase, gpu, step, microbatch, stage, peer, bytes, start_ns, end_ns): one op, as pprun_trace_op_packed"},
    {"loss", (PyCFunction)(void (*)(void))op_train_loss, METH_FASTCALL,
     "loss(step, microbatch, stage, value): a training loss, as pprun_trace_loss"},
    {"eval_loss", (PyCFunction)(void (*)(void))op_eval_loss, METH_FASTCALL,
     "eval_loss(step, microbatch, stage, value): an evaluation's loss, as pprun_trace_eval_loss"},
    {"bind", op_bind, METH_VARARGS,
     "bind(op_packed, loss, eval_loss): the loaded library's pprun_trace_op_packed, pprun_trace_loss and "
     "pprun_trace_eval_loss"},
    {"wrap", op_wrap, METH_VARARGS, "wrap(orig, slow, phase): a wrapper of pprun's, its common case in C"},
    {"hooks", op_hooks, METH_VARARGS, "hooks(refused, lost): the package's callables for the fast path"},
    {"context", op_context, METH_VARARGS,
     "context(step, fast, first_mb): the fast path's step, whether it records, its first microbatch"},
    {"stop", op_stop, METH_NOARGS, "stop(): tracing stopped; the fast path records nothing more"},
    {"in_op", op_in_op, METH_NOARGS, "in_op(): whether this thread is inside a compute op of the fast path"},
    {"waiting", op_waiting, METH_NOARGS,
     "waiting(): (since_ns, step, ops) of the batched p2p this process waits for, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef op_module = {PyModuleDef_HEAD_INIT, "pprun._op", NULL, -1, op_methods,
                                       NULL,  NULL,       NULL, NULL};

PyMODINIT_FUNC PyInit__op(void) {
    PyObject *types = PyImport_ImportModule("types");
    if (!types) return NULL;
    method_type = PyObject_GetAttrString(types, "MethodType");
    Py_DECREF(types);
    if (!method_type) return NULL;
    static const struct {
        PyObject **str;
        const char *text;
    } names[] = {{&str_device, "device"},   {&str_type, "type"},   {&str_stage_index, "stage_index"},
                 {&str_full_backward, "full_backward"},          {&str_cpu, "cpu"},
                 {&str_pprun, "_pprun"},    {&str_peer, "peer"},   {&str_tensor, "tensor"},
                 {&str_nbytes, "nbytes"},   {&str_wait, "wait"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].str = PyUnicode_InternFromString(names[i].text))) return NULL;
    if (!(wrapper_type = PyType_FromSpec(&wrapper_spec)) || !(work_type = PyType_FromSpec(&work_spec))) return NULL;
    return PyModule_Create(&op_module);
}
