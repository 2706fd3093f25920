"""sitecustomize.py: pprun's. Python imports it at start-up from PYTHONPATH,
where only `pprun run` and `pprun launch` put this directory
(runner/launch/launch_env.c); outside pprun it is never on the path.

With tracing on (the launcher gave this rank a trace ring, PPRUN_TRACE_FD,
and this process holds it: _own_ring) it puts a finder first on sys.meta_path that answers for one module,
torch.distributed.pipelining: the usual finders find it, and once it has
run, pprun.torch instruments it (and the finder leaves the path; a child
forked before that never has it). Every
other import is passed on after one string comparison; a program that
never imports torch's pipelining loads nothing of pprun's, not even its
package. Then the sitecustomize this file shadows (Debian ships one) runs,
as it would outside pprun: the first one on the path after every copy of
this file (a PYTHONPATH with pprun's python/ besides the one the launcher
adds holds two; each ran the other, a RecursionError and a finder a
level)."""
import os
import sys

_WATCHED = "torch.distributed.pipelining"
# Marks this file as pprun's: _run_shadowed skips every file that has it.
_MARKER = b"\n_PPRUN_SITECUSTOMIZE = True\n"
_PPRUN_SITECUSTOMIZE = True


class _PprunLoader:
    """The module's own loader, then pprun.torch.install()."""

    def __init__(self, real):
        self._real = real

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        ours = sys.modules.get("pprun.torch")
        if ours is not None and getattr(getattr(ours, "__spec__", None), "_initializing", False):
            # the program imported pprun.torch first, which imports this
            # module: it installs itself at the end of its own import
            ours._install_when_imported = True
            return
        try:
            import pprun.torch

            pprun.torch.install()
        except Exception as e:  # never stop the program for its trace
            try:
                sys.stderr.write("pprun: PyTorch pipelining is not traced: %s\n" % e)
            except (AttributeError, ValueError, OSError):  # no stderr
                pass

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._real, name)


class _PprunFinder:
    def find_spec(self, name, path=None, target=None):
        if name != _WATCHED:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PprunLoader(spec.loader)
                return spec
        return None


def _is_pprun_copy(origin):
    try:
        with open(origin, "rb") as f:
            return _MARKER in f.read()
    except OSError:
        return False


def _run_shadowed():
    import importlib.machinery
    import importlib.util

    rest = list(sys.path)
    while True:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        if not (spec.origin and _is_pprun_copy(spec.origin)):
            break
        where = os.path.dirname(os.path.abspath(spec.origin))
        rest = [p for p in rest if os.path.abspath(p or os.curdir) != where]
    module = importlib.util.module_from_spec(spec)
    # `import sitecustomize` is then the program's own, as without pprun:
    # the import of this file keeps what sys.modules holds once it has run
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _own_ring():
    """Whether this process holds the rank's trace ring: PPRUN_TRACE_FD is
    the file PPRUN_TRACE_RING names (its "DEV:INODE", tracer/ring.h
    trace_fd_identity). A process the rank started inherits the variables,
    not the ring: its descriptor of that number is another file, or none.
    (The ring stays inheritable until pprun's library loads: a wrapper that
    execs the real program, poetry run, keeps it.)"""
    fd, identity = os.environ.get("PPRUN_TRACE_FD"), os.environ.get("PPRUN_TRACE_RING")
    try:
        st = os.fstat(int(fd))
    except (TypeError, ValueError, OverflowError, OSError):
        return False
    return identity is None or identity == "%d:%d" % (st.st_dev, st.st_ino)


def _drop_finder():
    """In a child forked before torch's pipelining was imported (a
    multiprocessing pool made early): the child is no rank, and its import
    of pipelining must not load pprun's tracer, which would take the rank's
    ring from the process that trains (docs/torch.md). A child forked later
    drops the tracer itself (pprun.torch)."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_PprunFinder"]


# One finder, whichever copy runs first (the others never run: above).
if _own_ring() and not any(type(f).__name__ == "_PprunFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _PprunFinder())
    os.register_at_fork(after_in_child=_drop_finder)
_run_shadowed()
