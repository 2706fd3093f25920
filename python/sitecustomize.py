"""sitecustomize.py: pprun's. Python imports it at start-up from PYTHONPATH,
where only `pprun run` and `pprun launch` put this directory
(runner/launch/launch_env.c); outside pprun it is never on the path.

With tracing on (the launcher gave this rank a trace ring, PPRUN_TRACE_FD)
it installs pprun's import hook (pprun/_hook.py): if and when the program
imports torch.distributed.pipelining, pprun.torch instruments it. A program
that never imports it gets nothing more than the hook's name check on each
import; libpprun_trace is not even loaded. Then the sitecustomize this file
shadows (Debian ships one) runs, as it would outside pprun."""
import os
import sys


def _run_shadowed():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("PPRUN_TRACE_FD"):
    try:
        from pprun import _hook

        _hook.install()
    except Exception as e:  # never stop the program for its trace
        sys.stderr.write("pprun: PyTorch pipelining is not traced in this process: %s\n" % e)
_run_shadowed()
