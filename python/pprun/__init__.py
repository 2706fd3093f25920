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
import sys
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


def _refused(t, name):
    """A span the library refused: dropped (the library counts it), the
    first one said on stderr; the program and the rest of its trace go on."""
    if not _said_refused[0]:
        _said_refused[0] = True
        sys.stderr.write("pprun: rank %d: span '%s' not recorded: %s (refused spans are dropped and counted as "
                         "dropped records)\n" % (t.rank, name, t.error()))
        sys.stderr.flush()


class span:
    """A named span of the program's own, as a context manager or a
    decorator: pprun.span(name, peer=-1, bytes=0, step=None, microbatch=-1,
    stage=-1). step None: the current step (current_step()). A name that is
    not a non-empty string raises ValueError (outside pprun too); a span
    the library refuses under pprun (a stage or microbatch outside the
    job's shape) is dropped, never raised: the first such says why in one
    line on stderr, and each is counted as a dropped record. Once tracing
    of the process stopped (pprun.torch, at a refused record) a span
    records nothing and is counted as a dropped record."""

    def __init__(self, name, peer=-1, bytes=0, step=None, microbatch=-1, stage=-1):
        if not isinstance(name, str) or not name:
            raise ValueError("pprun.span: the name must be a non-empty string, got %r" % (name,))
        self.name, self.peer, self.bytes = name, peer, bytes
        self.step, self.microbatch, self.stage = step, microbatch, stage
        self._starts = threading.local()

    def _record(self, t, t0):
        if not t.on:  # tracing stopped while the span ran: counted as lost (_trace.lost)
            t.lost()
            return
        step = _step[0] if self.step is None else self.step
        if t.span(self.name, step, self.microbatch, self.stage, self.peer, self.bytes, t0, t.now()) < 0:
            _refused(t, self.name)

    def __enter__(self):
        t = _trace.tracer()
        if t is not None:
            stack = getattr(self._starts, "stack", None)
            if stack is None:
                stack = self._starts.stack = []
            stack.append(t.now())
        return self

    def __exit__(self, *exc):
        t = _trace.tracer()
        if t is not None:
            self._record(t, self._starts.stack.pop())
        else:
            _trace.lost()  # after a stop: one record lost, counted (nothing outside pprun)
        return False

    def __call__(self, fn):
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
