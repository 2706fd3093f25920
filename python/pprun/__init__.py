"""pprun: a PyTorch program's side of pprun (docs/torch.md).

Under `pprun run -- python3 train.py` a program that uses
torch.distributed.pipelining is traced without a change (pprun.torch,
installed by the import hook in ../sitecustomize.py). What a program may
add itself:

    import pprun
    with pprun.span("data"):
        batch = next(loader)

    @pprun.span("allreduce", peer=1, bytes=4 << 20)
    def sync(): ...

A span is stored with its name under its rank, at the current step: the
step of the schedule's latest step() call (0 before the first), so a span
between two steps takes the one before (the optimizer step, a log line);
give step=N for one that belongs to the next (its batch). Outside pprun every
call does nothing and costs next to nothing. Standard library only; the
torch part is pprun.torch."""
import functools
import operator
import threading

from pprun import _trace

__all__ = ["span", "tracing", "current_step"]

# The step the torch instrumentation is in (pprun.torch sets it): the
# schedule's step() calls counted from 0.
_step = [0]


def tracing():
    """True when this process records into pprun's trace."""
    return _trace.tracer() is not None


def current_step():
    """The step records are stamped with: that of the schedule's latest
    step() call, counted from 0 (0 before the first)."""
    return _step[0]


_said_refused = [False]


def _shown(name):
    """A name as an error line shows it: its first 40 characters, each one
    that is not printable (an ESC that would drive the terminal, a
    newline) escaped, as the library shows names (base/term.h)."""
    short = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in name[:40])
    return short + ("..." if len(name) > 40 else "")


def _refused(t, name, why=None):
    """A span the library refused: dropped (counted as dropped), the first
    one said on stderr; the program and the rest of its trace go on."""
    if not _said_refused[0]:
        _said_refused[0] = True
        _trace.say("pprun: rank %d: span '%s' not recorded: %s (refused spans are dropped and counted as "
                         "dropped records)\n" % (t.rank, _shown(name), why or t.error()))


def _int_field(what, v):
    """A span's number field: an int (or what stands for one: operator.index),
    else TypeError, outside pprun too."""
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError("pprun.span: %s must be an int, got %r" % (what, v)) from None


class span:
    """A named span of the program's own, as a context manager or a
    decorator: pprun.span(name, peer=-1, bytes=0, step=None, microbatch=-1,
    stage=-1). step None: the current step (current_step()). Misuse raises,
    outside pprun too: a name that is not a non-empty string of text
    (ValueError), a field that is not an int (TypeError), a decorated
    generator function (TypeError: a with inside it times its work). A
    span the library refuses under pprun (a name with a control
    character, a stage or microbatch outside the job's shape, a number
    past its field) is dropped, never raised: the first such says why in
    one line on stderr, and each is counted as a dropped record. Once
    tracing of the process stopped (pprun.torch, at a refused record) a
    span records nothing and is counted as a dropped record. A span may
    end in another thread than it began in (a generator resumed by
    another thread)."""

    def __init__(self, name, peer=-1, bytes=0, step=None, microbatch=-1, stage=-1):
        if not isinstance(name, str) or not name:
            raise ValueError("pprun.span: the name must be a non-empty string, got %r" % (name,))
        try:
            self._name = name.encode()
        except UnicodeEncodeError:  # a lone surrogate (os.fsdecode of bytes that are not UTF-8)
            raise ValueError("pprun.span: the name %s is not text (it has no UTF-8)" % ascii(name)) from None
        self.name = name
        self.peer, self.bytes = _int_field("peer", peer), _int_field("bytes", bytes)
        self.step = None if step is None else _int_field("step", step)
        self.microbatch, self.stage = _int_field("microbatch", microbatch), _int_field("stage", stage)
        # (thread, start) of each entry not yet exited: a thread's latest
        # first, else the latest of any thread (exited elsewhere); the lock
        # keeps another thread's exit from taking it between find and pop
        self._open, self._lock = [], threading.Lock()

    def _record(self, t, t0):
        if not t.on:  # tracing stopped while the span ran: counted as lost (_trace.lost)
            t.lost()
            return
        step = _step[0] if self.step is None else self.step
        rc, why = t.span(self._name, step, self.microbatch, self.stage, self.peer, self.bytes, t0, t.now())
        if rc < 0:
            _refused(t, self.name, why)

    def __enter__(self):
        t = _trace.tracer()
        if t is not None:
            with self._lock:
                self._open.append((threading.get_ident(), t.now()))
        return self

    def __exit__(self, *exc):
        t = _trace.tracer()
        if t is None:
            _trace.lost()  # after a stop: one record lost, counted (nothing outside pprun)
            return False
        me, t0 = threading.get_ident(), None
        with self._lock:
            mine = [i for i, (thread, _) in enumerate(self._open) if thread == me]
            if mine or self._open:
                t0 = self._open.pop(mine[-1] if mine else -1)[1]
        if t0 is not None:
            self._record(t, t0)
        return False

    def __call__(self, fn):
        import inspect  # here: importing pprun stays cheap

        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError("pprun.span: %s is a generator function: its call only makes the generator; "
                            "put a `with pprun.span(...)` in its body" % getattr(fn, "__qualname__", fn))
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def traced_async(*args, **kwargs):  # its own start: calls of it interleave on one thread
                t = _trace.tracer()
                if t is None:
                    _trace.lost()
                    return await fn(*args, **kwargs)
                t0 = t.now()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self._record(t, t0)

            return traced_async

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            t = _trace.tracer()
            if t is None:
                _trace.lost()
                return fn(*args, **kwargs)
            t0 = t.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self._record(t, t0)

        return traced
