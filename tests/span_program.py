"""span_program.py: pprun.span used well and badly, for tests/test_program.c
(docs/torch.md, "Spans of your own"). Standard library only: it runs in
the host's python3, under pprun (one rank) and outside it.

It prints one line for each misuse that raises, which must be the same
under pprun and outside it ("raised TypeError: ..."); the spans the library
or the package refuses raise nothing. Recorded under pprun: "ok", "gen"
(begun in one thread, ended in another, 20 ms apart), "async" twice (an
async function called twice at once on one thread, sleeping 20 ms, and
50 ms from 10 ms later) and "work" (a decorated function whose
KeyError passes through as it is); refused, each dropped and counted:
seven, the first one (its name an OSC escape sequence that would set the
terminal's title) said on stderr, escaped. Ends with "done"."""
import asyncio
import threading
import time

import pprun


def raises(what, make):
    try:
        make()
    except Exception as e:
        print("raised %s: %s" % (type(e).__name__, what), flush=True)
    else:
        print("no exception: %s" % what, flush=True)


raises("a name that is not text", lambda: pprun.span("bad \udcff"))
raises("a float step", lambda: pprun.span("x", step=1.0))
raises("bytes None", lambda: pprun.span("x", bytes=None))


def generator():
    yield 1


raises("a generator function decorated", lambda: pprun.span("x")(generator))

with pprun.span("ok"):
    pass

refused = [pprun.span("\x1b]0;owned\x07"), pprun.span("a", step=2**40), pprun.span("b", peer=2**33),
           pprun.span("c", bytes=-1), pprun.span("d", bytes=2**64), pprun.span("e\0f"),
           pprun.span("f", bytes=2**60)]
for s in refused:
    with s:
        pass


def across_threads():
    with pprun.span("gen"):
        yield 1
        time.sleep(0.02)
        yield 2


g = across_threads()
threads = [threading.Thread(target=next, args=(g,)) for _ in range(2)]
for t in threads:
    t.start()
    t.join()


@pprun.span("async")
async def slept(seconds):
    await asyncio.sleep(seconds)
    return 7


async def later(delay, seconds):
    await asyncio.sleep(delay)
    return await slept(seconds)


async def both():  # two calls at once on one thread, each timed from its own start: 20 ms, and 50 ms from 10 ms on
    return await asyncio.gather(slept(0.02), later(0.01, 0.05))


assert asyncio.run(both()) == [7, 7]


@pprun.span("work")
def work():
    raise KeyError("its own")


try:
    work()
except KeyError as e:
    print("KeyError passed through: %s" % e, flush=True)
print("done", flush=True)
