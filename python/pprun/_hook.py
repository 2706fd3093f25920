"""_hook.py: the import hook sitecustomize.py installs under pprun.

A finder first on sys.meta_path that answers for one module only,
torch.distributed.pipelining: it lets the usual finders find it, and wraps
the loader so that once the module has run, pprun.torch instruments it
(and the finder takes itself off the path). Every other import is passed
on after one string comparison."""
import sys

WATCHED = "torch.distributed.pipelining"


class _Loader:
    """The module's own loader, then pprun.torch.install()."""

    def __init__(self, real):
        self._real = real

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        self._real.exec_module(module)
        try:
            from pprun import torch as pprun_torch

            pprun_torch.install()
        except Exception as e:  # never stop the program for its trace
            sys.stderr.write("pprun: PyTorch pipelining is not traced: %s\n" % e)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._real, name)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != WATCHED:
            return None
        uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def install():
    """Watches for torch.distributed.pipelining (now, if it is loaded already)."""
    if WATCHED in sys.modules:
        from pprun import torch as pprun_torch

        pprun_torch.install()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall():
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
