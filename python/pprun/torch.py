"""pprun.torch: torch.distributed.pipelining traced into pprun, and pprun's
schedules run by PyTorch (docs/torch.md).

install() is called by the import hook once the program has imported
torch.distributed.pipelining under `pprun run` (never outside it). It wraps,
on PyTorch's own classes and module, with the program unchanged:

  schedule.step()                 counts training steps (the step of every
                                  record); a forward-only step (no loss
                                  function, or under torch.no_grad()) is an
                                  evaluation: its F, sends and receives are
                                  EVAL_F, EVAL_SEND_F, EVAL_RECV_F and its
                                  losses eval losses, under the training step
                                  it follows (0 before the first)
  stage.forward_one_chunk         F
  stage.backward_one_chunk        BW when it is PyTorch's full backward
                                  (GPipe, 1F1B, interleaved), B when the
                                  schedule splits it (full_backward=False)
  stage.backward_weight_one_chunk W
  stage.get_{fwd,bwd}_{send,recv}_ops and schedules._batch_p2p
                                  SEND_F RECV_F SEND_B RECV_B: from the
                                  batched p2p's issue to its work's wait(),
                                  with the peer rank and the tensor's bytes
  schedule._update_losses         each microbatch's loss on the last stage,
                                  the tensors the program gets in `losses`
  torch.optim step hooks          OPT (an optimizer's step of the stages'
                                  parameters, the outermost of nested ones)
  torch.distributed.all_reduce,   ALLREDUCE, REDUCE_SCATTER, ALL_GATHER spans
  reduce_scatter_tensor,          (pprun's own --dp names) where called on a
  all_gather_into_tensor          data-parallel group between ops, from the
                                  first training step on

Where pprun._op is built, the wrappers of the compute ops, of get_*_ops and
of _batch_p2p are its C ones (_fast): they run the common case, a CPU
stage's op in a training step with tracing on (the step's wrapper says so,
_op.context), and hand every other case to the Python wrappers here, the
reference, which record the same (docs/torch.md, "What tracing costs").

And, at the first training step (one with a backward), it declares the
schedule: its class (jobs.schedule), its shape and this rank's plan,
PyTorch's pipeline_order where the schedule has one, else the order it ran
in. A record the library refuses stops tracing for the rest of the process
(_trace.stop: one line on stderr; the library counts it as dropped), and
every record a wrapper would have written after it is counted instead
(Tracer.lost), added to the rank's drops at each step's end and at exit
(_trace.flush_lost).

Host spans: on a GPU an op's span ends when its kernels are queued, not
when they ran. On a CUDA device each F, B, W, BW and OPT also gets a gpu
span, timed with CUDA events on its stream (_GpuTime; docs/torch.md says
what is and is not measured).

A daemon thread (_watch) says on stderr which batched p2p wait went on
past pprun run's --recv-timeout (docs/torch.md, "A rank that waits")."""
import atexit
import collections
import functools
import importlib
import inspect
import os
import re
import threading
import time
import weakref

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules as _schedules
from torch.distributed.pipelining import stage as _stage
from torch.optim import optimizer as _optimizer

import pprun
from pprun import _trace

__all__ = ["install", "schedule", "stage_indices"]

# PyTorch's action letters (str of _ComputationType) in pprun's notation.
_OPS = {"F": "F", "I": "B", "W": "W", "B": "BW"}


class _State:
    def __init__(self):
        self.t = None            # the Tracer
        self.trained = False     # a training step (one with a backward) has begun
        self.declared = False    # the schedule is declared
        self.evaluated = None    # _shape_of the first schedule that evaluated, while none is declared (_at_exit)
        self.declared_as = None  # (class name, microbatches) of the schedule declared, to tell another one
        self.said_other = False  # a training step of another schedule than the declared one, said
        self.eval = None         # inside an evaluation step: (first microbatch, microbatches), to number them
        self.eval_next = (0, 0)  # (step, its next evaluation's first microbatch): evaluations under one step apart
        self.said_eval_wrap = False  # _evaluation's numbers started again from 0, said
        self.said_bucket_wrap = False  # a step's collectives passed _BUCKETS_MAX, said
        self.order = None        # the actions run in the first training step, while recording it
        self.replica = 0         # this rank's pipeline among the job's data-parallel replicas (_replica_of)
        self.first_mb = 0        # in a training step: its replica's first global microbatch (replica·n)
        self.opt_t0 = {}         # thread -> (optimizer, its step's start, gpu start) of the step() it is in
        self.opt_info = weakref.WeakKeyDictionary()  # optimizer -> _opt_info()
        self.lock = threading.Lock()
        self.in_step = False     # inside a wrapped step() (one step, whichever class's step() it reaches)
        self.pipe = None         # the global ranks of this rank's pipeline (its stages' group), once declared
        self.stages = ()         # (stage index, module) of this rank's stages, once declared; then its latest
        #                          training schedule's (_follow_stages)
        self.trainer = None      # a weak reference to the schedule of the latest training step
        self.dp_peer = {}        # process group -> its first rank where it is data-parallel, else -1 (_dp_peer)
        self.buckets = (0, {})   # (step, stage -> its next collective's number in the step) (_wrap_collective)
        self.grads = (-1, 0, {})  # (step, reads in it, data pointer -> stage) of the stages' parameters, gradients
        self.waiting = None      # (since_ns, step, ops) of the batched p2p the Python _Work waits for (_waiting)
        self.p2p_owners = []     # the modules whose _batch_p2p pprun wraps (_keep_batch_p2p_wrapped)
        self.batch_p2p = None    # pprun's wrapper maker for it


_st = _State()
_installed = False


# The clock of every record (_trace.Tracer.now), read without a look-up.
_clock = time.monotonic_ns


def _stop(why):
    """A record the library refused: tracing stops (every record after it
    is skipped: t.on is False), said once on stderr; the program goes on."""
    _trace.stop(why)


# An evaluation's microbatch numbers are below this (PP_SHAPE_MAX_MICROBATCHES,
# base/shape.h: libpprun_trace's bound of them).
_EVAL_MICROBATCHES_MAX = 100000

_EVAL = {b"F": b"EVAL_F", b"SEND_F": b"EVAL_SEND_F", b"RECV_F": b"EVAL_RECV_F"}


def _phase_mb(phase, mb):
    """An op's phase and microbatch as recorded: in an evaluation step its
    EVAL_ phase and its microbatch over every replica (replica·n + mb, as
    pprun's worker numbers an evaluation's), after those of the evaluations
    before it under the same step (_evaluation)."""
    if _st.eval is None or phase not in _EVAL:
        return phase, mb
    return _EVAL[phase], _st.eval[0] + mb


def _evaluation(sched):
    """(first microbatch, microbatches) of this rank's replica in an
    evaluation, a forward-only step(), under the training step it follows
    (0 before the first): its microbatches are its own schedule's, numbered
    over the replicas, and on from those of the step's earlier evaluations
    (one before the first training step and one after it both follow step
    0; a program may evaluate twice between two steps), so that none
    replaces another's losses (docs/torch.md, "Evaluation steps"). Past
    what a record's microbatch may be (a program that evaluates and never
    trains: every evaluation under step 0), the numbers start again from 0,
    said once on stderr: later losses replace earlier ones, and tracing
    goes on."""
    stage, n = _stages_of(sched)[0], sched._n_microbatches
    replicas = max(1, dist.get_world_size() // stage.group_size)
    step, first = _st.eval_next
    if step != pprun._step[0]:
        step, first = pprun._step[0], 0
    if first > 0 and first + replicas * n > _EVAL_MICROBATCHES_MAX:
        if not _st.said_eval_wrap:
            _st.said_eval_wrap = True
            _trace.say("pprun: rank %d: the evaluations under step %d passed %d microbatches: their numbers "
                             "start again from 0, and a later evaluation's losses replace an earlier one's\n"
                             % (_st.t.rank, step, _EVAL_MICROBATCHES_MAX))
        first = 0
    _st.eval_next = (step, first + replicas * n)
    return first + _replica_of(stage) * n, n


# ---- GPU time ---------------------------------------------------------------


class _GpuTime:
    """The GPU side of the ops of a stage on a CUDA device, the ndtimeline
    way: a pair of CUDA events around the op on its stream, and no
    synchronisation added. The events are read once they have completed
    (Event.query(): at the end of every schedule step, and when many wait)
    and placed on the host clock by an anchor, an event recorded on an
    idle stream of the device's own, taken with the host time just before
    it (once per step and device; the GPU stamps it about a launch latency,
    microseconds, later). Each op becomes a gpu span (pprun_trace_gpu_op)
    beside its host span; at exit the events still out are waited for."""

    MAX_PENDING = 4096  # ops whose events are not read yet; past this, the oldest is waited for

    def __init__(self):
        self.pending = collections.deque()  # (phase, step, mb, stage, nbytes, anchor, start, end)
        self.anchors = {}                   # device -> (step, host ns, event)
        self.idle = {}                      # device -> the anchors' stream

    def begin(self, device):
        """An op on device starts: (anchor, start event), or None off a
        GPU; _LOST on a GPU once tracing stopped (end() counts it)."""
        if device is None or _HOST.get(id(device)) is device:
            return None
        given = device
        if not isinstance(device, torch.device):  # PipelineStage keeps its device as given: "cuda:0", 0
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError, ValueError):
                return None
        if device.type != "cuda":
            if len(_HOST) < 64:
                _HOST[id(given)] = given
            return None
        if not _st.t.on:
            return _LOST
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        step = pprun._step[0]
        with _st.lock:
            anchor = self.anchors.get(device)
            if anchor is None or anchor[0] != step:
                stream = self.idle.get(device)
                if stream is None:
                    stream = self.idle[device] = torch.cuda.Stream(device=device)
                ev = torch.cuda.Event(enable_timing=True)
                t0 = _clock()
                ev.record(stream)
                anchor = self.anchors[device] = (step, t0, ev)
        start = torch.cuda.Event(enable_timing=True)
        start.record(torch.cuda.current_stream(device))
        return anchor, start, device

    def end(self, begun, phase, step, mb, stage, nbytes=0):
        """The op begun (begin()'s) has been queued: its end event."""
        if begun is None:
            return
        if begun is _LOST:
            _st.t.lost()
            return
        anchor, start, device = begun
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(device))
        with _st.lock:
            self.pending.append((phase, step, mb, stage, nbytes, anchor, start, end))
        if len(self.pending) > self.MAX_PENDING:
            self.flush(wait=1)
        elif len(self.pending) % 256 == 0:
            self.flush()

    def flush(self, wait=0):
        """Records the ops whose events have completed, oldest first, up to
        the first that has not; the `wait` oldest are waited for (-1: all)."""
        with _st.lock:
            while self.pending:
                phase, step, mb, stage, nbytes, (_, host, anchor), start, end = self.pending[0]
                events = (anchor, start, end)  # elapsed_time wants both of a pair completed
                if wait != 0:
                    for ev in events:
                        ev.synchronize()
                    wait -= 1
                elif not all(ev.query() for ev in events):
                    return
                self.pending.popleft()
                t = _st.t
                if not t.on:  # measured before tracing stopped, written after: lost, counted
                    t.lost()
                    continue
                # elapsed_time: ms between two completed events (about 0.5 us resolution)
                t0 = host + int(anchor.elapsed_time(start) * 1e6)
                t1 = max(t0, host + int(anchor.elapsed_time(end) * 1e6))
                try:
                    rc = t.op(phase, 1, step, mb, stage, -1, nbytes, max(t0, 0), max(t1, 0))
                except OverflowError as e:
                    rc = t.refuse(e)
                if rc < 0:
                    _stop("gpu span of %s, stage %d microbatch %d: %s" % (phase.decode(), stage, mb, t.error()))


_gpu = _GpuTime()
# The device objects (a stage's, an optimizer's) found not to be a GPU, by
# id, kept so their ids stay theirs: a stage keeps its device object, and
# reading a torch.device's type makes a new string in libtorch's code, 17 us
# right after PyTorch's work (docs/torch.md, "What tracing costs").
_HOST = {}
_LOST = object()  # _GpuTime.begin()'s once tracing stopped: the gpu span is counted as lost


def _at_exit():
    """A program that only evaluated (inference, a forward-only schedule)
    declares the schedule it evaluated with, and no plan: the job is that
    schedule's class and microbatches, not pprun's --schedule, which never
    ran. The gpu spans still out are written, or counted as lost; then
    what was not recorded since a stop is counted (_trace.flush_lost)."""
    if not _st.declared and not _st.trained and _st.evaluated:
        _st.declared = True
        _declare(None, "", _st.evaluated)
    try:
        _gpu.flush(wait=-1)
    except Exception as e:  # the CUDA context may already be gone: the spans still out are lost, said so
        n = len(_gpu.pending)
        _trace.say("pprun: rank %d: %d gpu spans lost at exit: %s\n" % (_st.t.rank, n, e))
        if _st.t.on and n and _st.t.count_dropped(n) < 0:
            _trace.say("pprun: rank %d: the lost gpu spans are not counted: %s\n" % (_st.t.rank, _st.t.error()))
        elif not _st.t.on:
            _st.t.lost(n)
    _trace.flush_lost()


# ---- ops --------------------------------------------------------------------


def _chunk_id(args, kwargs, name):
    """The microbatch a stage's method is called for: its first argument,
    or by PyTorch's name for it (fwd_chunk_id, bwd_chunk_id); None where
    neither is given."""
    return args[0] if args else kwargs.get(name)


def _wrap_compute(orig, op):
    """forward_one_chunk (op b"F"), backward_one_chunk (b"BW": PyTorch's
    full backward; b"B" when the schedule splits it, full_backward=False)
    and backward_weight_one_chunk (b"W"): the op's host span, and its gpu
    span on a CUDA device. One body for the three; where pprun._op is
    built, its C wrapper runs their common case and this one the rest
    (_fast)."""

    chunk_name = "fwd_chunk_id" if op == b"F" else "bwd_chunk_id"

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        chunk_id = _chunk_id(args, kwargs, chunk_name)
        if chunk_id is None or (op != b"F" and _st.eval is not None):
            # no chunk id: PyTorch's own TypeError; later torch's forward-only
            # GPipe calls the backward ops, which do nothing
            return orig(self, *args, **kwargs)
        device = getattr(self, "device", None)  # a torch.device, or as the program gave it ("cpu")
        g = None if _HOST.get(id(device)) is device else _gpu.begin(device)
        t0 = _clock()
        _in_op.depth = getattr(_in_op, "depth", 0) + 1
        try:
            out = orig(self, *args, **kwargs)
        finally:
            _in_op.depth -= 1
        t1 = _clock()
        phase, mb, stage, step, t = op, chunk_id, self.stage_index, pprun._step[0], _st.t
        # backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, last_backward=False)
        if op == b"BW" and not kwargs.get("full_backward", args[2] if len(args) > 2 else True):
            phase = b"B"
        elif op == b"F" and _st.eval is not None:
            phase, mb = _phase_mb(op, mb)
        if _st.eval is None and mb >= 0:  # the step's global microbatch, as pprun's --dp jobs number theirs
            mb += _st.first_mb
        if g is not None:
            _gpu.end(g, phase, step, mb, stage)
        if not t.on:
            t.lost()
        else:
            try:
                rc = t.op(phase, 0, step, mb, stage, -1, 0, t0, t1)
            except OverflowError as e:
                rc = t.refuse(e)
            if rc < 0:
                _stop("%s of stage %d microbatch %d: %s" % (phase.decode(), stage, mb, t.error()))
        if _st.order is not None:
            _st.order.append("%d%s%d" % (stage, phase.decode(), chunk_id))
        return out

    return wrapper


# How deep this thread is in a compute op of the Python wrappers (those of
# pprun._op count their own: in_op()), for _wrap_collective.
_in_op = threading.local()
# The autograd graph task running on this thread, -1 outside a backward.
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _inside_op():
    """Whether a collective called now is an op's: this thread is inside a
    compute op, or runs a backward (on a GPU autograd runs it on a thread of
    its own, where hooks and autograd Functions call their collectives:
    tensor parallelism's, FSDP's reduce-scatter)."""
    fast = _trace._op
    return getattr(_in_op, "depth", 0) > 0 or (fast is not None and fast.in_op()) or _graph_task() != -1


# ---- sends and receives -----------------------------------------------------


def _wrap_get_ops(orig, phase):
    """A stage's get_*_ops: each P2POp learns what it carries."""

    chunk_name = "fwd_chunk_id" if phase.endswith(b"_F") else "bwd_chunk_id"

    @functools.wraps(orig)
    def get_ops(self, *args, **kwargs):
        ops = orig(self, *args, **kwargs)
        chunk_id = _chunk_id(args, kwargs, chunk_name)
        if chunk_id is None:  # PyTorch took a call without one: nothing to tag
            return ops
        if _st.eval is not None:
            tag, mb = _phase_mb(phase, chunk_id)
        else:  # the step's global microbatch, as the compute ops'
            tag, mb = phase, chunk_id + _st.first_mb if chunk_id >= 0 else chunk_id
        tag = (tag, self.stage_index, mb)
        try:
            for op in ops:
                op._pprun = tag
        except AttributeError:  # a P2POp that takes no attribute (slots): its span is not recorded
            pass
        return ops

    return get_ops


class _Work:
    """A Work of one batched p2p: the spans of the batch's ops (ops: (phase,
    stage, microbatch, peer, bytes) each) end when the last of its Works
    has been waited for: torch 2.6 returns one Work (left None), later
    torch every Work of the batch, which share one count of those not yet
    waited for (left: a list of one int). Two calls of pprun's own per
    batch (its __init__ and wait), a batch being most of a step's records."""

    __slots__ = ("_work", "_ops", "_t0", "_step", "_left", "_done")

    def __init__(self, work, ops, t0, left):
        self._work, self._ops, self._t0, self._step, self._left, self._done = work, ops, t0, pprun._step[0], left, False

    def wait(self, *args, **kwargs):
        _st.waiting = (_clock(), self._step, self._ops)
        try:
            out = self._work.wait(*args, **kwargs)
        finally:
            _st.waiting = None
        if self._done:
            return out
        self._done = True
        left = self._left
        if left is not None:
            left[0] -= 1
            if left[0] > 0:
                return out
        t1 = _clock()
        t, ops = _st.t, self._ops
        if not t.on:
            t.lost(len(ops))
            return out
        for i, (phase, stage, mb, peer, nbytes) in enumerate(ops):
            try:
                rc = t.op(phase, 0, self._step, mb, stage, peer, nbytes, self._t0, t1)
            except OverflowError as e:
                rc = t.refuse(e)
            if rc < 0:
                _stop("%s of stage %d microbatch %d: %s" % (phase.decode(), stage, mb, t.error()))
                t.lost(len(ops) - i - 1)  # the batch's ops after the refused one
                break
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


class _NoWork:
    """What a batch without a Work waits for: nothing."""

    @staticmethod
    def wait(*args, **kwargs):
        return None


_NO_WORK = _NoWork()


# How deep this thread is in _batch_p2p's wrappers, every one of them: torch's
# _batch_p2p may call itself through its module (torch 2.14: a batch of two
# communicators' ops with per-direction p2p, each communicator's as a batch
# of its own), and a program's own _batch_p2p, wrapped in its turn
# (_keep_batch_p2p_wrapped), may call the one pprun wrapped first: the
# outer call records its ops, the inner ones pass through (as pprun._op's
# batch_depth)
_p2p_inside = threading.local()


def _wrap_batch_p2p(orig):
    @functools.wraps(orig)
    def _batch_p2p(p2p_ops, *args, **kwargs):
        if getattr(_p2p_inside, "depth", 0):
            return orig(p2p_ops, *args, **kwargs)
        t0 = _clock()
        _p2p_inside.depth = 1
        try:
            work = orig(p2p_ops, *args, **kwargs)
        finally:
            _p2p_inside.depth = 0
        ops = []
        for op in p2p_ops:
            tag = getattr(op, "_pprun", None)
            if tag is not None:  # a p2p tensor is dense: nbytes is numel() x element_size()
                ops.append((tag[0], tag[1], tag[2], op.peer, op.tensor.nbytes))
        if not ops:
            return work
        if work is not None and not isinstance(work, (list, tuple)):
            return _Work(work, ops, t0, None)  # torch 2.6: the batch's last Work
        if not work:  # torch >= 2.8, a batch without a Work, or a program's own that waited: its spans end now
            _Work(_NO_WORK, ops, t0, None).wait()
            return work
        left = [len(work)]  # torch >= 2.8: every Work of the batch, each waited for
        return [_Work(w, ops, t0, left) for w in work]

    return _batch_p2p


# ---- a rank that waits long says for what ------------------------------------

def _waiting():
    """(since_ns, step, ops) of the batched p2p wait this process is in
    (ops: (phase, stage, microbatch, peer, bytes) each), or None: the
    Python _Work's, else pprun._op's work object's."""
    w = _st.waiting
    if w is None and _trace._op is not None:
        w = _trace._op.waiting()
    return w


def _waiting_line(w, limit_ns):
    """What the watch says of wait w (_waiting's), past limit_ns."""
    _, step, ops = w
    what = ", ".join("%s of stage %d microbatch %d %s rank %d (%d bytes)"
                     % (phase.decode(), stage, mb, "to" if phase.startswith(b"SEND") else "from", peer, nbytes)
                     for phase, stage, mb, peer, nbytes in ops)
    return ("pprun: rank %s has waited more than %g s (--recv-timeout) in step %d for %s; pprun does not stop "
            "it (docs/torch.md, \"A rank that waits\")\n" % (os.environ.get("RANK", "?"), limit_ns / 1e9, step, what))


def _watch(limit_ns):
    """The watch thread: a batched p2p wait longer than limit_ns (pprun
    run's --recv-timeout) is said on stderr, once a wait. A hang of
    PyTorch's own (a peer that never sends: a gradient a stage does not
    ask for, docs/torch.md) otherwise says nothing; PyTorch's timeout, its
    process group's, still decides when it fails."""
    said = None
    while True:
        time.sleep(min(1.0, limit_ns / 4e9))
        w = _waiting()
        if w is None or w[0] == said or _clock() - w[0] < limit_ns:
            continue
        said = w[0]
        _trace.say(_waiting_line(w, limit_ns))


def _start_watch():
    try:
        limit_ms = int(os.environ.get("PPRUN_RECV_TIMEOUT_MS", "0"))
    except ValueError:
        return
    if limit_ms > 0:
        threading.Thread(target=_watch, args=(limit_ms * 1000000,), name="pprun-watch", daemon=True).start()


# ---- the data-parallel collectives --------------------------------------------

# torch.distributed's collectives of a data-parallel step, each as the span
# pprun's own --dp ranks record (docs/schema.md, "Data parallelism"), and
# the argument whose bytes the span carries: the whole bucket, not a shard.
_COLLECTIVES = (("all_reduce", b"ALLREDUCE", "tensor"),
                ("reduce_scatter_tensor", b"REDUCE_SCATTER", "input"),
                ("all_gather_into_tensor", b"ALL_GATHER", "output_tensor"))


def _dp_peer(group):
    """The first rank of a process group (None: the world's) where it is a
    data-parallel group of this rank, a group of at least two ranks none
    of them another rank of its pipeline (the ranks holding its stages in
    the other replicas; a tensor-parallel group too, whose collectives run
    inside ops: _wrap_collective leaves those out), else -1. Known by the
    group once seen: a step runs the same groups again."""
    peer = _st.dp_peer.get(group)
    if peer is None:
        try:
            ranks = set(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
        except (RuntimeError, ValueError, TypeError):  # a group this rank is not in, or none torch knows
            ranks = set()
        me = dist.get_rank()
        peer = min(ranks) if len(ranks) > 1 and ranks & _st.pipe == {me} else -1
        if len(_st.dp_peer) < 256:
            _st.dp_peer[group] = peer
    return peer


def _stage_of(tensor, step):
    """The stage whose gradient or weights a collective's tensor is: the
    rank's one stage, else the stage of the parameter or gradient whose
    memory it is (the stages' read at the step's first collective, their
    gradients being made anew each step, and again on a miss), -1 where
    none is (a bucket of the program's own)."""
    stages = _st.stages
    if len(stages) == 1:
        return stages[0][0]
    try:
        ptr = tensor.data_ptr()
    except (AttributeError, RuntimeError):
        return -1
    seen, reads, where = _st.grads
    if seen != step:  # read at a step's first: last step's gradients' memory may be another stage's now
        reads, where = 0, {}
    # read again on a miss, a few times a step: a stage's gradients may be
    # made after another stage's were reduced (each reduced as its backward
    # ends); a tensor of none of them (a flat bucket) misses every time
    if ptr not in where and reads <= len(stages):
        where = {}
        for index, module in stages:
            for p in module.parameters() if module is not None else ():
                where[p.data_ptr()] = index
                if p.grad is not None:
                    where[p.grad.data_ptr()] = index
        _st.grads = (step, reads + 1, where)
    return where.get(ptr, -1)


def _nbytes(tensor):
    """numel() x element_size(), in one call where nbytes is defined (not
    for a sparse tensor)."""
    try:
        return tensor.nbytes
    except RuntimeError:
        return tensor.numel() * tensor.element_size()


def _collective_record(span, t1):
    name, step, bucket, stage, peer, nbytes, t0 = span
    t = _st.t
    if not t.on:
        t.lost()
        return
    rc, why = t.span(name, step, bucket, stage, peer, nbytes, t0, max(t0, t1))
    if rc < 0:
        _stop("%s of stage %d bucket %d: %s" % (name.decode(), stage, bucket, why))


def _when_complete(work, span):
    """The span of a collective issued with async_op=True ends when it
    completes: its Work's future's callback (a thread of the backend's;
    NCCL's completes when it is queued), whether or not the program waits
    for it. The program keeps torch's own Work (torch's code checks its
    type). Where the backend has no future, it ends at its issue's return."""

    def done(_):
        try:
            _collective_record(span, _clock())
        except Exception as e:  # never raised into the backend's thread: said, and tracing stops
            _stop("%s: %s" % (span[0].decode(), e))

    try:
        work.get_future().then(done)
    except (AttributeError, RuntimeError):
        done(None)


# A collective's bucket numbers are below this (PP_SHAPE_MAX_MICROBATCHES,
# base/shape.h: libpprun_trace's bound of a data-parallel span's bucket).
_BUCKETS_MAX = 100000


def _wrap_collective(orig, name, tensor_at, group_at, async_at):
    """torch.distributed.all_reduce, reduce_scatter_tensor or
    all_gather_into_tensor (name: the span's): called in a training step or
    after it (before the next), outside the rank's ops, on a data-parallel
    group (_dp_peer), a span of pprun's own name, as pprun's --dp ranks
    record theirs: stage, the collective's number among the stage's in the
    step (pprun's bucket), the group's first rank as peer, the tensor's
    bytes; from its call to its return, or to its completion (async_op=True:
    _when_complete). Others, and every call outside pprun's step, pass
    through. *_at: (position, keyword) of the arguments read."""

    def arg(args, kwargs, at, default=None):
        return args[at[0]] if len(args) > at[0] else kwargs.get(at[1], default)

    @functools.wraps(orig)
    def collective(*args, **kwargs):
        if not _st.trained or _st.eval is not None or _st.pipe is None or _inside_op():
            return orig(*args, **kwargs)
        peer = _dp_peer(arg(args, kwargs, group_at))
        if peer < 0:
            return orig(*args, **kwargs)
        t0 = _clock()
        out = orig(*args, **kwargs)
        t1 = _clock()
        if not _st.t.on:
            _st.t.lost()
            return out
        step, tensor = pprun._step[0], arg(args, kwargs, tensor_at)
        stage = _stage_of(tensor, step)
        seen, numbers = _st.buckets
        if seen != step:
            numbers = {}
            _st.buckets = (step, numbers)
        bucket = numbers.get(stage, 0)
        numbers[stage] = (bucket + 1) % _BUCKETS_MAX
        if bucket == _BUCKETS_MAX - 1 and not _st.said_bucket_wrap:
            _st.said_bucket_wrap = True
            _trace.say("pprun: rank %d: the data-parallel collectives of stage %d in step %d passed %d: their "
                             "bucket numbers start again from 0\n" % (_st.t.rank, stage, step, _BUCKETS_MAX))
        span = (name, step, bucket, stage, peer, _nbytes(tensor), t0)
        if arg(args, kwargs, async_at, False) and out is not None:
            _when_complete(out, span)
        else:
            _collective_record(span, t1)
        return out

    return collective


def _collective_wrappers():
    """(name, wrap) of each of _COLLECTIVES this torch has with the
    arguments read (inspect.signature, once)."""
    found = []
    for fn, span, tensor in _COLLECTIVES:
        orig = getattr(dist, fn, None)
        try:
            params = list(inspect.signature(orig).parameters)
        except (TypeError, ValueError):
            continue
        if not all(p in params for p in (tensor, "group", "async_op")):
            continue
        at = [(params.index(p), p) for p in (tensor, "group", "async_op")]
        found.append((fn, functools.partial(_wrap_collective, name=span, tensor_at=at[0], group_at=at[1],
                                            async_at=at[2])))
    return found


# ---- steps, losses, the optimizer --------------------------------------------


def _stages_of(sched):
    stages = getattr(sched, "_stages", None)
    return list(stages) if stages is not None else [sched._stage]


def _evaluates(sched):
    """Whether a step() of sched is forward-only, an evaluation: the
    schedule has no loss function (no backward runs: GPipe, 1F1B), or
    autograd is off (torch.no_grad(): nothing to run a backward on). Later
    torch's schedule.eval() turns _has_backward off around its step()."""
    return not getattr(sched, "_has_backward", False) or not torch.is_grad_enabled()


def _other_schedule(sched):
    """Says once when a training step runs another schedule than the one
    declared (another class, or another number of microbatches: fewer are
    recorded, more stop tracing, docs/torch.md): the plan, the planned
    bubble and the what-if's row of this job stay the first one's."""
    seen = (getattr(sched, "_pprun_name", None) or type(sched).__name__, sched._n_microbatches)
    if _st.declared_as is None or seen == _st.declared_as or _st.said_other:
        return
    _st.said_other = True
    _trace.say("pprun: rank %d: step %d runs %s of %d microbatches, after %s of %d was declared: the job's plan, "
               "planned bubble and what-if stay the first schedule's\n"
               % (_st.t.rank, pprun._step[0], seen[0], seen[1], _st.declared_as[0], _st.declared_as[1]))


def _follow_stages(sched):
    """A training step of another schedule than the last one's, once one
    was declared (a program that rebuilt its model, stages, schedule and
    optimizer mid-training): its stages are the rank's from now on, so
    that the new optimizer's step is the steps' OPT (_steps_stages)."""
    last = _st.trainer() if _st.trainer is not None else None
    if last is sched:
        return
    try:
        _st.trainer = weakref.ref(sched)
    except TypeError:  # a schedule that takes no weak reference: looked at every step
        _st.trainer = None
    if not _st.declared:
        return
    try:
        stages = tuple((s.stage_index, getattr(s, "submod", None)) for s in _stages_of(sched))
    except Exception:  # never raised into the program's step: the stages stay the declared ones
        return
    if len(stages) != len(_st.stages) or any(a is not b for (_, a), (_, b) in zip(stages, _st.stages)):
        _st.stages = stages


def _wrap_step(orig):
    @functools.wraps(orig)
    def step(self, *args, **kwargs):
        if _st.in_step:  # a step() calling another wrapped step(): the same step
            return orig(self, *args, **kwargs)
        try:
            _keep_batch_p2p_wrapped()
        except Exception as e:  # never raised into the program's step
            _trace.say("pprun: rank %d: the program's _batch_p2p is not wrapped: %s\n" % (_st.t.rank, e))
        evaluation = None
        if _evaluates(self):
            evaluation = _evaluation(self)
            if _st.evaluated is None and not _st.declared and not _st.trained:
                try:
                    _st.evaluated = _shape_of(self)
                except Exception as e:  # never raised into the program's step: said, and nothing declared
                    _st.evaluated = False
                    _trace.say("pprun: rank %d: the evaluating schedule's shape is not read: %s\n" % (_st.t.rank, e))
        else:
            if _st.trained:
                pprun._step[0] += 1
            _st.trained = True
            _st.opt_t0.pop(threading.get_ident(), None)  # an optimizer step() that raised never ended
            _other_schedule(self)
            _follow_stages(self)
        # The first training step declares the schedule before its first
        # record (its stages and microbatches bound the records), with
        # PyTorch's plan when it has one, else with the order it runs in,
        # once it has run.
        first = evaluation is None and not _st.declared
        planned = None
        if first:
            _st.declared = True
            planned = _declare(self, None)
            _st.order = [] if not planned else None
        _st.in_step, _st.eval = True, evaluation
        # a training step's ops are numbered over every replica's
        # microbatches (docs/schema.md): replica·n + the schedule's own
        _st.first_mb = _st.replica * self._n_microbatches if evaluation is None else 0
        fast = _trace._op
        try:
            if fast is not None:  # pprun._op's wrappers record this step's ops themselves (_fast)
                fast.context(pprun._step[0], evaluation is None and _st.order is None and _st.t.on, _st.first_mb)
            out = orig(self, *args, **kwargs)
        except BaseException:
            if first and not planned:  # its order half run: the next training step records it whole
                _st.declared = False
            raise
        finally:
            if fast is not None:
                fast.context(pprun._step[0], False, 0)
            _st.in_step, _st.eval, _st.first_mb = False, None, 0
            order, _st.order = _st.order, None
            _gpu.flush()
        if first and not planned and order:
            _declare(self, " ".join(order))
        _trace.flush_lost()
        return out

    return step


def _wrap_update_losses(orig):
    @functools.wraps(orig)
    def _update_losses(self, stages, losses):
        last = [s for s in (stages if isinstance(stages, list) else [stages]) if s.is_last]
        internal = list(getattr(self, "_internal_losses", ()))
        step, t = pprun._step[0], _st.t
        if last and internal:
            # global numbers: every replica's losses are kept; an evaluation's
            # (a schedule that computes losses in a forward-only step) apart
            put, what = (t.loss, "loss") if _st.eval is None else (t.eval_loss, "evaluation loss")
            first_mb = _st.replica * len(internal) if _st.eval is None else _st.eval[0]
            for mb, loss in enumerate(internal):
                if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                    if not t.on:  # tracing stopped (before, or at an earlier loss): counted as lost
                        t.lost()
                        continue
                    try:
                        # detached: later torch warns on the item of a tensor that requires grad
                        rc = put(step, first_mb + mb, last[0].stage_index, loss.detach().item())
                    except OverflowError as e:
                        rc = t.refuse(e)
                    if rc < 0:
                        _stop("%s of microbatch %d: %s" % (what, first_mb + mb, t.error()))
        return orig(self, stages, losses)

    return _update_losses


def _state_bytes(opt):
    """Bytes of an optimizer's parameters, gradients and state."""
    n, state, tensor = 0, opt.state, torch.Tensor
    for group in opt.param_groups:
        for p in group["params"]:
            n += _nbytes(p)
            if p.grad is not None:
                n += _nbytes(p.grad)
            if state:  # none yet (every step of a stateless one, plain SGD): no look-up per parameter
                for v in state.get(p, {}).values():
                    if isinstance(v, tensor):
                        n += v.numel() * v.element_size()
    return n


def _steps_stages(opt):
    """Whether opt steps a parameter of this rank's stages (any of them),
    or the stages are not known yet (none declared)."""
    ids = {id(p) for _, module in _st.stages if module is not None for p in module.parameters()}
    return not ids or any(id(p) in ids for group in opt.param_groups for p in group["params"])


def _opt_info(opt):
    """(state entries, parameter groups, bytes, device, whether it steps the
    stages' parameters, the stages that was read for) of an optimizer,
    measured when first seen (_state_bytes) and again whenever its count of
    state entries or parameter groups (or the stages) changed since: its
    sizes do not change between steps otherwise, so a step's hooks do not
    measure them again (the state appears during the first step, Adam's
    moments, SGD's momentum: measured again after it)."""
    info = _st.opt_info.get(opt)
    if info is None or info[0] != len(opt.state) or info[1] != len(opt.param_groups) or info[5] is not _st.stages:
        device = next((p.device for group in opt.param_groups for p in group["params"]), None)
        info = _st.opt_info[opt] = (len(opt.state), len(opt.param_groups), _state_bytes(opt), device,
                                    _steps_stages(opt), _st.stages)
    return info


def _opt_pre(opt, args, kwargs):
    """An OPT begins: the step() of an optimizer of the stages' parameters,
    the outermost one where its step() runs another's (a
    ZeroRedundancyOptimizer's, a Lookahead's inner one: one OPT). Another
    optimizer's step (an auxiliary model's, after the pipeline's step) is
    the program's own time, not the step's."""
    if not _st.trained:
        return
    thread = threading.get_ident()
    if thread in _st.opt_t0:  # inside another optimizer's step(): its OPT holds this one
        return
    info = _opt_info(opt)
    if info[4]:
        _st.opt_t0[thread] = (opt, _clock(), _gpu.begin(info[3]))


def _opt_post(opt, args, kwargs):
    thread = threading.get_ident()
    begun = _st.opt_t0.get(thread)
    if begun is None or begun[0] is not opt:
        return
    del _st.opt_t0[thread]
    t1 = _clock()
    (_, t0, g), step, t = begun, pprun._step[0], _st.t
    nbytes = _opt_info(opt)[2]
    _gpu.end(g, b"OPT", step, -1, -1, nbytes)
    if not t.on:
        t.lost()
        return
    try:
        rc = t.op(b"OPT", 0, step, -1, -1, -1, nbytes, t0, t1)
    except OverflowError as e:
        rc = t.refuse(e)
    if rc < 0:
        _stop("OPT: %s" % t.error())


# ---- the plan -----------------------------------------------------------------


def _ctype(ct):
    """The letter of a _ComputationType: its str() in torch 2.6 (an int Enum
    with its own __str__), its value later (a str Enum: str() gives
    '_ComputationType.FORWARD')."""
    value = getattr(ct, "value", None)
    return value if isinstance(value, str) else str(ct)


def _action_text(action):
    """pprun's notation of a PyTorch compute action, None for the others."""
    if action is None:
        return "."
    subs = getattr(action, "sub_actions", None)
    if subs:  # OVERLAP_F_B (DualPipeV): its F and its B, run one after the other
        texts = [x for x in (_action_text(a) for a in subs) if x not in (None, ".")]
        return " ".join(texts) or None
    op = _OPS.get(_ctype(action.computation_type))
    if op is None or action.microbatch_index is None:
        return None
    return "%d%s%d" % (action.stage_index, op, action.microbatch_index)


def _plan_of(sched, stage0):
    """This rank's plan as PyTorch has it: pipeline_order's row (idle cells
    kept), else the compute actions of pipeline_order_with_comms; "" when
    the schedule has neither (GPipe, 1F1B: their order is their code)."""
    if isinstance(sched, _schedules.PipelineScheduleSingle):
        return ""  # torch >= 2.8 gives them a pipeline_order too; what runs is still their code
    rank = stage0.group_rank
    for attr, keep_idle in (("pipeline_order", True), ("pipeline_order_with_comms", False)):
        rows = getattr(sched, attr, None)
        if rows and rows.get(rank):
            texts = [_action_text(a) for a in rows[rank]]
            texts = [x for x in texts if x is not None and (keep_idle or x != ".")]
            while texts and texts[-1] == ".":
                texts.pop()
            return " ".join(texts)
    return ""


def _replica_of(stage):
    """Which data-parallel replica of the pipeline this rank is in, 0 for a
    job of one pipeline: _replica_index of its stage's group's ranks."""
    group = getattr(stage, "group", None)
    if group is None or stage.group_size == dist.get_world_size():
        return 0
    return _replica_index(sorted(dist.get_process_group_ranks(group)))


def _replica_index(ranks):
    """The replica of the pipeline of these ranks (sorted) among the job's,
    0 .. world / P - 1, where pipelines are cut from a device mesh: P ranks
    s apart, s the product of the mesh's dimensions inside the pipeline's
    (1: pprun's layout, pipelines of consecutive ranks, docs/cli.md "Rank
    layout", replica r // P; D: a DeviceMesh with the pipeline dimension
    first, replica r mod D; 2 in a (dp, pp, tp) mesh with tp 2 inside).
    Such a pipeline's first rank f has its pipeline coordinate 0, and the
    replicas before it are the first ranks below it: (f // (s·P))·s + f mod
    s·P. A pipeline of ranks no mesh makes: its first rank (its records
    may then pass the job's bounds, and be refused, saying so)."""
    first, p = ranks[0], len(ranks)
    stride = ranks[1] - first if p > 1 else 1
    if ranks != [first + k * stride for k in range(p)]:
        return first
    return first // (stride * p) * stride + first % (stride * p)


def _shape_of(sched):
    """What declaring sched takes from torch, read while its process group
    lives: (name, ranks, stages, microbatches, this rank's replica, its
    pipeline's global ranks, (stage index, module) of its stages)."""
    stages = _stages_of(sched)
    s0 = stages[0]
    group = getattr(s0, "group", None)
    return (getattr(sched, "_pprun_name", None) or type(sched).__name__, s0.group_size, s0.num_stages,
            sched._n_microbatches, _replica_of(s0),
            set(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)),
            tuple((s.stage_index, getattr(s, "submod", None)) for s in stages))


def _declare(sched, order, shape=None):
    """Declares the schedule with its plan (order: the actions it ran, for
    a schedule without a plan of its own; shape: _shape_of(sched), read
    earlier); returns the plan declared."""
    t = _st.t
    plan = order if order is not None else _plan_of(sched, _stages_of(sched)[0])
    if not t.on:
        if plan:  # its head and its actions: counted as lost (an empty plan is declared from the order, later)
            t.lost(1 + sum(1 for a in plan.split() if a != "."))
        return plan
    name, ranks, stages, microbatches, _st.replica, _st.pipe, _st.stages = shape or _shape_of(sched)
    _st.declared_as = (name, microbatches)
    if t.schedule(name, ranks, stages, microbatches, plan) < 0:
        _stop("the schedule %s: %s" % (name, t.error()))
    return plan


# ---- installing -------------------------------------------------------------


# pprun's wrappers, by identity (id -> the wrapper, held: its id is never
# another's): a program's function made with functools.wraps(pprun's
# Python wrapper) copies its _pprun_wrapped, and is no wrapper of pprun's
_ours = {}


def _replace(owner, name, wrap, *extra):
    orig = getattr(owner, name)
    if _ours.get(id(orig)) is orig:
        return
    new = wrap(orig, *extra)
    if not getattr(new, "_pprun_wrapped", False):  # pprun._op's wrappers say so themselves
        new._pprun_wrapped = True  # how bench/torch_alternate.py finds them
    _ours[id(new)] = new
    setattr(owner, name, new)


def _fast(wrap):
    """wrap's wrappers behind pprun._op's where the module is there: those
    (_op.wrap, in C) run the common case, a CPU stage's op in a training
    step with tracing on, and hand every other case to wrap's, the reference
    (docs/torch.md, "What tracing costs")."""

    def make(orig, phase=b""):
        slow = wrap(orig, phase) if phase else wrap(orig)
        return slow if _trace._op is None else _trace._op.wrap(orig, slow, phase)

    return make


def _refused(phase, stage, mb, skipped):
    """A record of pprun._op's fast path that the library refused: as the
    Python wrappers do, tracing stops, and the records of its batch after
    it are counted as lost."""
    _stop("%s of stage %d microbatch %d: %s" % (phase.decode(), stage, mb, _st.t.error()))
    if skipped:
        _st.t.lost(skipped)


def _keep_batch_p2p_wrapped():
    """The modules' _batch_p2p (the schedules' and the runtime's, which
    look it up at each call) under pprun's wrapper. Also at each step: a
    program that replaced one after pprun wrapped it (a gloo workaround
    that waits for every Work of a batch) has its replacement wrapped, so
    that its sends and receives are recorded (they were not, silently)."""
    for owner in _st.p2p_owners:
        _replace(owner, "_batch_p2p", _st.batch_p2p)


def _runtime_module():
    """torch.distributed.pipelining.runtime where _PipelineScheduleRuntime
    moved (it imports _batch_p2p by name), None where it does not exist."""
    try:
        return importlib.import_module("torch.distributed.pipelining.runtime")
    except ImportError:
        return None


def _step_owners():
    """The schedule classes with a step() of their own (not abstract)."""
    owners = []
    for cls in (_schedules._PipelineSchedule, _schedules.PipelineScheduleSingle, _schedules.PipelineScheduleMulti):
        fn = cls.__dict__.get("step")
        if fn is not None and not getattr(fn, "__isabstractmethod__", False):
            owners.append(cls)
    return owners


def install():
    """Instruments torch.distributed.pipelining for this process's trace;
    False (nothing changed) when it does not record or this torch lacks
    what is wrapped (said on stderr)."""
    global _installed
    if _installed:
        return True
    t = _trace.tracer()
    if t is None:
        return False
    base = _stage._PipelineStageBase
    wanted = [(base, n) for n in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk",
                                  "get_fwd_send_ops", "get_fwd_recv_ops", "get_bwd_send_ops", "get_bwd_recv_ops")]
    wanted += [(_schedules, "_batch_p2p"), (_schedules._PipelineSchedule, "_update_losses")]
    missing = ["%s.%s" % (getattr(o, "__name__", o), n) for o, n in wanted if not hasattr(o, n)]
    steps = _step_owners()
    if not steps:
        missing.append("a schedule step()")
    if missing:
        _trace.say("pprun: torch %s has no %s: its pipelining is not traced\n"
                         % (torch.__version__, ", ".join(missing)))
        return False
    _st.t = t
    atexit.register(_at_exit)
    _optimizer.register_optimizer_step_pre_hook(_opt_pre)
    _optimizer.register_optimizer_step_post_hook(_opt_post)
    if _trace._op is not None:
        _trace._op.hooks(_refused, t.lost)
    compute, get_ops, batch_p2p = _fast(_wrap_compute), _fast(_wrap_get_ops), _fast(_wrap_batch_p2p)
    _replace(base, "forward_one_chunk", compute, b"F")
    _replace(base, "backward_one_chunk", compute, b"BW")
    _replace(base, "backward_weight_one_chunk", compute, b"W")
    _replace(base, "get_fwd_send_ops", get_ops, b"SEND_F")
    _replace(base, "get_fwd_recv_ops", get_ops, b"RECV_F")
    _replace(base, "get_bwd_send_ops", get_ops, b"SEND_B")
    _replace(base, "get_bwd_recv_ops", get_ops, b"RECV_B")
    runtime = _runtime_module()
    _st.p2p_owners = [m for m in (_schedules, runtime) if m is not None and hasattr(m, "_batch_p2p")]
    _st.batch_p2p = batch_p2p
    _keep_batch_p2p_wrapped()
    _replace(_schedules._PipelineSchedule, "_update_losses", _wrap_update_losses)
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    for fn, wrap in _collective_wrappers():  # the module's and torch.distributed's name: one wrapper
        _replace(c10d, fn, wrap)
        setattr(dist, fn, getattr(c10d, fn))
    for cls in steps:
        _replace(cls, "step", _wrap_step)
    _start_watch()
    _installed = True
    return True


# ---- pprun's schedule, run by PyTorch ------------------------------------------


def _env(name):
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError("pprun.torch.schedule: %s is not set; run the program as "
                           "`pprun run --schedule KIND -- python3 ...`" % name)
    return value


def stage_indices(rank=None):
    """The stages pprun's schedule gives this rank (PPRUN_STAGE_RANKS), in
    order: build these PipelineStages and pass them to schedule()."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    return [s for s, r in enumerate(int(x) for x in _env("PPRUN_STAGE_RANKS").split(",")) if r == rank]


_ACTION = re.compile(r"([0-9]+)(BW|F|B|W)([0-9]+)")


def _parse_actions(text):
    """PPRUN_ACTIONS ("0F0 0B0 0W0", dualpipev's "0BW1") as PyTorch actions
    (B is PyTorch's I, BW its full backward)."""
    ct = _schedules._ComputationType
    kinds = {"F": ct.FORWARD, "B": ct.BACKWARD_INPUT, "W": ct.BACKWARD_WEIGHT, "BW": ct.FULL_BACKWARD}
    actions = []
    for token in text.split():
        m = _ACTION.fullmatch(token)
        if m is None:
            raise RuntimeError("pprun.torch.schedule: action %r of PPRUN_ACTIONS is not {stage}{F|B|W|BW}{mb}"
                               % token)
        actions.append(_schedules._Action(int(m.group(1)), kinds[m.group(2)], int(m.group(3))))
    return actions


def schedule(stages, n_microbatches, loss_fn=None, **kwargs):
    """The schedule `pprun run --schedule KIND` planned, as a PyTorch
    schedule: a _PipelineScheduleRuntime loaded with every rank's
    PPRUN_ACTIONS (gathered over the stages' process group), pprun's stage
    placement (PPRUN_STAGE_RANKS) and its microbatches. stages: this rank's
    PipelineStages, those stage_indices() names. Call it on every rank."""
    runtime = getattr(_schedules, "_PipelineScheduleRuntime", None)
    if runtime is None:
        raise RuntimeError("pprun.torch.schedule: torch %s has no _PipelineScheduleRuntime" % torch.__version__)
    if not isinstance(stages, (list, tuple)):
        stages = [stages]
    stages = list(stages)
    if not stages:
        raise ValueError("pprun.torch.schedule: no stages")
    want_mb, want_stages = int(_env("PPRUN_MICROBATCHES")), int(_env("PPRUN_NUM_STAGES"))
    if n_microbatches != want_mb:
        raise ValueError("pprun.torch.schedule: %d microbatches, but pprun planned %d (pprun run --microbatches)"
                         % (n_microbatches, want_mb))
    if stages[0].num_stages != want_stages:
        raise ValueError("pprun.torch.schedule: %d stages, but pprun planned %d" % (stages[0].num_stages, want_stages))
    stage_rank = [int(x) for x in _env("PPRUN_STAGE_RANKS").split(",")]
    group, rank = stages[0].group, stages[0].group_rank
    mine = sorted(s.stage_index for s in stages)
    if mine != stage_indices(rank):
        raise ValueError("pprun.torch.schedule: rank %d has stages %s, but pprun's schedule gives it %s "
                         "(pprun.torch.stage_indices())" % (rank, mine, stage_indices(rank)))
    texts = [None] * stages[0].group_size
    dist.all_gather_object(texts, _env("PPRUN_ACTIONS"), group=group)
    if "stage_index_to_group_rank" in inspect.signature(_schedules.PipelineScheduleMulti.__init__).parameters:
        kwargs["stage_index_to_group_rank"] = {s: r for s, r in enumerate(stage_rank)}  # torch 2.6
    # later torch infers the placement from the actions (_validate_and_set_stage_mapping)
    sched = runtime(stages, n_microbatches, loss_fn=loss_fn, **kwargs)
    load = getattr(sched, "_prepare_schedule_with_comms", None) or sched._load_actions  # renamed after 2.6
    load({r: _parse_actions(text) for r, text in enumerate(texts)}, format="compute_only")
    sched._pprun_name = _env("PPRUN_SCHEDULE")
    return sched


# The program imported pprun.torch before torch.distributed.pipelining:
# pprun's import hook ran while this module was half made, and left the
# install to it (../sitecustomize.py).
if globals().pop("_install_when_imported", False):
    try:
        install()
    except Exception as e:  # never stop the program for its trace
        _trace.say("pprun: PyTorch pipelining is not traced: %s\n" % e)
