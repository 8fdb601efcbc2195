"""The cyclic garbage collector around work that makes objects for the process's life.

CPython's collector runs a collection after every 700 net allocations of container
objects, and a full one whenever the objects that survived enough of them have grown by
a quarter. Work that makes hundreds of thousands of objects that all stay (a command's
imports, numba's; the daemon opening 10,000 partitions of 100,000 segments) pays for
collections that walk the same live objects again and again and find nothing: about
0.1 s of a 0.6 s `plan`, and 2.2 s of the daemon's 13 s first cycle on 10,000
partitions (`bench/idle.py`), seven full collections of up to 0.6 s each.

`long_lived_objects()` pauses the collector while such work runs, then moves every
object tracked by then into the permanent generation (`gc.freeze`), where no later
collection walks it, and resumes. What the work leaves as cyclic garbage in the window
is frozen with the rest and never reclaimed, so it is only used around work that makes
little of it (imports, opening partitions) and runs once or rarely; objects freed by
reference counting (nearly all) are freed as usual, frozen or not. The freeze also spares
a forked worker from copying pages that a collection would otherwise touch.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def long_lived_objects() -> Iterator[None]:
    """Run the body with the collector paused; freeze what is tracked at its end."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
