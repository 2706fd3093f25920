"""_trace.py: libpprun_trace through ctypes (tracer/pprun_trace.h).

pprun gives the library's path in PPRUN_TRACE_LIB (the libpprun_trace.so
beside the pprun binary). tracer() loads it once and returns the Tracer, or
None when this process does not record: not under pprun, --trace off, a
process the rank started (the ring's fd is the rank's alone: the library
checks it is the file PPRUN_TRACE_RING names), a child the
rank forked (os.fork, a DataLoader worker: reset at the fork, so it records
nothing and says nothing), or once tracing stopped (stop()).

After stop() the records the process would have made are counted, not
written (Tracer.lost(): a count), and the count is added to
the rank's drop counter (pprun_trace_count_dropped) by flush_lost(): at
each training step's end (pprun.torch) and at exit, so that the job's
"trace records lost" says how much is missing (docs/torch.md)."""
import atexit
import operator
import os
import struct
import sys
import threading
import time

_lock = threading.Lock()
_tracer = None
_loaded = False
_stopped = None  # the Tracer once stop() stopped it, counting what is not recorded (lost())

# An op through ctypes, where pprun._op is not there: pprun_trace_op_record
# (tracer/pprun_trace.h), packed by OP.pack(phase, gpu, step, microbatch,
# stage, peer, 0, bytes, start_ns, end_ns). One bytes argument costs ctypes
# a third of what eight numbers do.
OP = struct.Struct("=16s6i3Q")

try:  # the per-op call and wrappers in C (python/pprun/_op.c): built with pprun where Python's headers were
    from pprun import _op
except ImportError:
    _op = None


class Tracer:
    """The library's calls. A program's job has no step bound: it runs as
    many steps as it likes (PPRUN_STEPS is what pprun run --steps asked
    for), and every one is traced."""

    on = True  # records are written; False once tracing stopped (stop) or in a forked child

    def __init__(self, lib):
        self.lib = lib
        # pprun's clock is CLOCK_MONOTONIC (base/pp.c: the library reads it
        # through the TSC, within 1.5 us of the kernel's): Python's own read
        # of it costs a twentieth of a call into the library, and a traced
        # op reads it twice (docs/torch.md, "What tracing costs").
        self.now = time.monotonic_ns
        try:
            self.rank = int(os.environ.get("RANK", "0") or 0)
        except ValueError:  # the library refuses it too, naming it: not tracing
            self.rank = -1
        self.pid = os.getpid()  # a forked child's copy counts into nothing (flush_lost)
        self.not_made = 0  # records not made since the stop, not yet flushed (under _lock)
        # The per-op calls, with no Python frame of pprun's between them and
        # the library: op(phase, gpu, step, mb, stage, peer, bytes, start_ns,
        # end_ns) (pprun_trace_op_packed), loss and eval_loss(step, mb,
        # stage, value), as tracer/pprun_trace.h; OverflowError for a
        # number past its C type. An op is a builtin of pprun._op where it
        # loaded: right after PyTorch's work a record costs 0.6 of what it
        # does through ctypes (docs/torch.md, "What tracing costs").
        if _op is not None:
            import ctypes

            _op.bind(*(ctypes.cast(f, ctypes.c_void_p).value
                       for f in (lib.pprun_trace_op_packed, lib.pprun_trace_loss, lib.pprun_trace_eval_loss)))
            self.op, self.loss, self.eval_loss = _op.put, _op.loss, _op.eval_loss
        else:
            self.op = self._op_ctypes
            self.loss, self.eval_loss = _ints_checked(lib.pprun_trace_loss), _ints_checked(lib.pprun_trace_eval_loss)
        self.unpacked = None  # why the latest refuse(), for error()

    def _op_ctypes(self, phase, gpu, step, mb, stage, peer, nbytes, t0, t1):
        """op() through ctypes: the same record, refused the same way."""
        try:
            record = OP.pack(phase, gpu, step, mb, stage, peer, 0, nbytes, t0, t1)
        except struct.error as e:
            raise OverflowError(str(e)) from None
        return self.lib.pprun_trace_op_packed(record)

    def lost(self, n=1):
        """Counts n records this process would have written and did not
        (tracing stopped): added to the rank's drops at the next
        flush_lost(). Only after a stop, when nothing is traced: the lock
        costs no traced op anything."""
        with _lock:
            self.not_made += n

    def count_dropped(self, n):
        return self.lib.pprun_trace_count_dropped(n)

    def refuse(self, e):
        """An op that op() refused (a number past its C type:
        OverflowError e): refused as the library refuses a bad record,
        counted as dropped; -1, and error() says why."""
        self.count_dropped(1)
        self.unpacked = "a number out of its range: %s" % e
        return -1

    def error(self):
        why, self.unpacked = self.unpacked, None
        return why or self.lib.pprun_trace_error().decode(errors="replace")

    def span(self, name, step, mb, stage, peer, nbytes, t0, t1):
        """A span of name (UTF-8 bytes): (1, None) written, (-1, why)
        refused, counted as dropped: by the library, or here where ctypes
        would cut it short (a NUL in the name ends its C string) or wrap a
        number past its C type."""
        why = None
        if b"\0" in name:
            why = "name has control byte 0x00 at byte %d; names are printable text" % name.index(b"\0")
        for field, v, lo, hi in (("step", step, -(1 << 31), 1 << 31), ("microbatch", mb, -(1 << 31), 1 << 31),
                                 ("stage", stage, -(1 << 31), 1 << 31), ("peer", peer, -(1 << 31), 1 << 31),
                                 ("bytes", nbytes, 0, 1 << 64)):
            if why is None and not lo <= v < hi:
                why = "%s %d: out of its field's range %d..%d" % (field, v, lo, hi - 1)
        if why is not None:
            self.count_dropped(1)
            return -1, why
        rc = self.lib.pprun_trace_span(name, step, mb, stage, peer, nbytes, t0, t1)
        return rc, None if rc >= 0 else self.error()

    def schedule(self, name, ranks, stages, microbatches, actions):
        return self.lib.pprun_trace_schedule(name.encode(), ranks, stages, microbatches, actions.encode())


def _ints_checked(fn):
    """fn(step, microbatch, stage, value) through ctypes, whose c_int would
    wrap a number past 32 bits: OverflowError instead, and TypeError for
    one that is not an int, as pprun._op's."""

    def call(step, mb, stage, value):
        for name, v in (("step", step), ("microbatch", mb), ("stage", stage)):
            if not -(1 << 31) <= operator.index(v) < 1 << 31:
                raise OverflowError("%s %d does not fit the record's 32-bit field" % (name, v))
        return fn(step, mb, stage, value)

    return call


def _load(path):
    import ctypes  # here: a program that never records never loads ctypes for pprun

    lib = ctypes.CDLL(path)
    u64, i = ctypes.c_uint64, ctypes.c_int
    lib.pprun_trace_init.restype = i
    lib.pprun_trace_error.restype = ctypes.c_char_p
    lib.pprun_trace_op_packed.restype = i  # no argtypes: a bytes object (OP) goes as its pointer, unconverted
    for f in (lib.pprun_trace_loss, lib.pprun_trace_eval_loss):
        f.restype = i
        f.argtypes = [i, i, i, ctypes.c_double]
    lib.pprun_trace_span.restype = i
    lib.pprun_trace_span.argtypes = [ctypes.c_char_p, i, i, i, i, u64, u64, u64]
    lib.pprun_trace_schedule.restype = i
    lib.pprun_trace_schedule.argtypes = [ctypes.c_char_p, i, i, i, ctypes.c_char_p]
    lib.pprun_trace_count_dropped.restype = i
    lib.pprun_trace_count_dropped.argtypes = [ctypes.c_int64]
    return lib


def say(text):
    """text on stderr, flushed; nothing where there is no stderr (closed,
    None): pprun's messages never raise into the program (a refused span
    is never raised, docs/torch.md)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (AttributeError, ValueError, OSError):
        pass


def _fd_open(text):
    try:
        os.fstat(int(text))
        return True
    except (OSError, ValueError, OverflowError):  # OverflowError: a number past a C int
        return False


def tracer():
    """The Tracer of this process, or None when it does not record."""
    global _tracer, _loaded
    with _lock:
        if _loaded:
            return _tracer
        _loaded = True
        fd, path = os.environ.get("PPRUN_TRACE_FD"), os.environ.get("PPRUN_TRACE_LIB")
        # A process the rank started inherits the variables, not the ring.
        if not fd or not path or not _fd_open(fd):
            return None
        try:
            lib = _load(path)
        except (OSError, AttributeError) as e:
            say("pprun: cannot load libpprun_trace (%s): %s; not tracing\n" % (path, e))
            return None
        t = Tracer(lib)
        rc = lib.pprun_trace_init()
        if rc < 0:
            say("pprun: not tracing: %s\n" % t.error())
        if rc <= 0:  # 0: not the rank's ring (a process it started), as outside pprun
            return None
        _tracer = t
        return _tracer


def stop(why):
    """A record the library refused: tracing of this process stops (every
    later record is skipped, tracer() is None), said in one line on stderr;
    the program goes on. The refused record is counted as dropped by the
    library, and every record skipped after it by lost() and flush_lost()
    (at each step's end and at exit), so the job shows them lost
    (docs/torch.md)."""
    global _tracer, _stopped
    with _lock:
        t, _tracer = _tracer, None
        if t is not None and t.on:
            _stopped = t
    if t is not None and t.on:
        t.on = False
        if _op is not None:  # its fast path records no more either
            _op.stop()
        atexit.register(flush_lost)
        say("pprun: rank %d: tracing stops, nothing more of this process is recorded: %s\n"
                         % (t.rank, why))


def lost():
    """One record of the program's own (pprun.span) not made because
    tracing stopped: counted (Tracer.lost); nothing when tracing did not
    stop (not under pprun, still recording, a forked child)."""
    t = _stopped
    if t is not None:
        t.lost()


def flush_lost():
    """Adds the records counted by lost() since the last flush to the
    rank's drop counter (pprun_trace_count_dropped); nothing in a forked
    child (its parent's counter is not its own) or before a stop."""
    t = _stopped
    if t is None or t.pid != os.getpid():
        return
    with _lock:
        n, t.not_made = t.not_made, 0
    cap = 1 << 30  # PPRUN_TRACE_COUNT_DROPPED_MAX: a call's most
    while n > 0:
        if t.count_dropped(min(n, cap)) < 0:
            say("pprun: rank %d: %d records not made are not counted: %s\n" % (t.rank, n, t.error()))
            return
        n -= min(n, cap)


def _forked_child():
    """In a child the rank forked: the parent's tracer is not this
    process's (the ring takes one writer, and the library refuses a
    child's records), so the child records nothing, silently."""
    global _lock, _tracer, _loaded, _stopped
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork
    if _tracer is not None:
        _tracer.on = False  # the child's copy: pprun.torch's reference to it records nothing either
        if _op is not None:  # nor pprun._op's fast path
            _op.stop()
    _tracer, _loaded, _stopped = None, True, None  # and counts nothing (flush_lost: not its pid)


os.register_at_fork(after_in_child=_forked_child)
