"""hostile_program.py MODE: a program that does to pprun's package what
programs do, for tests/test_program.c. Standard library only: it runs in
the host's python3 under pprun (one rank). Each mode prints what it saw
and ends with "done"; none may raise (pprun never breaks a program).

fork      forks before importing pprun: parent and child each make 200
          spans named after themselves ("parent", "child"), the parent
          first; the ring takes the first to record, the other is refused
          as a whole (one line)
stderr    closes stderr, then makes a span the library refuses
rank      RANK set to text before importing pprun: not tracing
fd        PPRUN_TRACE_FD set past a C int before importing pprun: not tracing
longname  a span whose 322-byte name starts with escape sequences: refused,
          and the refusal shows the name's start escaped"""
import os
import sys

mode = sys.argv[1]
if mode == "rank":
    os.environ["RANK"] = "worker-0"
elif mode == "fd":
    os.environ["PPRUN_TRACE_FD"] = "99999999999999999999"

if mode == "fork":
    parent_done, told = os.pipe()
    child = os.fork()
    if child == 0:
        os.read(parent_done, 1)  # the parent records first: the ring is its
    import pprun

    role = "child" if child == 0 else "parent"
    for step in range(200):
        with pprun.span(role, step=step):
            pass
    print(role, "tracing", pprun.tracing(), flush=True)
    if child == 0:
        os._exit(0)
    os.write(told, b"x")
    os.waitpid(child, 0)
else:
    import pprun

    if mode == "stderr":
        sys.stderr.close()
        with pprun.span("bad\x01"):
            pass
        sys.stderr = None
        with pprun.span("bad\x02"):
            pass
    elif mode == "longname":
        with pprun.span("\x1b]0;OWNED\x07\x1b[2J\x1b[31mRED" + "x" * 300):
            pass
    print("tracing", pprun.tracing(), flush=True)
print("done", flush=True)
