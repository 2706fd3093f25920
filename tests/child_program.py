"""child_program.py: a rank that starts programs of its own, for
tests/test_program.c (docs/torch.md, "How pprun gets into the program").
Standard library only. Under pprun, before it imports anything of pprun's:

- a subprocess (close_fds, as subprocess does by default) that records 50
  spans "helper": it inherits the variables, not the ring;
- another that opens files until it holds the descriptor number of
  PPRUN_TRACE_FD, then records a span "other".

Each child prints whether pprun traces it ("helper tracing=False"). Then
the rank records 3 spans "rank" and prints "rank tracing=True". Only the
rank's spans belong in the trace, and a child whose descriptor of that
number is another file says nothing about it."""
import os
import subprocess
import sys

HELPER = """
import pprun
for i in range(50):
    with pprun.span("helper", step=i):
        pass
print("helper tracing=%s" % pprun.tracing(), flush=True)
"""

OTHER = """
import os, tempfile
fd = int(os.environ["PPRUN_TRACE_FD"])
held = []
while not held or held[-1].fileno() < fd:
    held.append(tempfile.TemporaryFile())
import pprun
with pprun.span("other"):
    pass
print("other holds %s: tracing=%s" % (held[-1].fileno() == fd, pprun.tracing()), flush=True)
"""

subprocess.run([sys.executable, "-c", HELPER], check=True)
subprocess.run([sys.executable, "-c", OTHER], check=True)
import pprun  # noqa: E402 (after the children)

for i in range(3):
    with pprun.span("rank", step=i):
        pass
print("rank tracing=%s" % pprun.tracing(), flush=True)
