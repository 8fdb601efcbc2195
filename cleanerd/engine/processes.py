"""The multiprocessing context every worker process of cleanerd starts from.

`forkserver`, never `fork`: the daemon holds locks, threads and open files a forked child
would inherit in whatever state they were in. The resource tracker that comes with it
(the process that reclaims the semaphores of the pools) is told not to warn: after a
`kill -9` of the daemon it reclaims the semaphores the pools left and says so with a
Python warning on the daemon's stderr, the one line there that is not a structured log
line, which a JSON log pipeline (journald to a collector) then fails to parse. The
reclaiming is what should happen, so the warning says nothing an operator acts on. The
filter quiets every warning of the tracker's module (a message filter cannot name its
text, which holds the `:` that separates a filter's fields); they are all about what a
dead process left, which the tracker goes on to reclaim.
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing.context import ForkServerContext
from typing import Final

QUIET_TRACKER: Final = "ignore::UserWarning:multiprocessing.resource_tracker"
"""A `-W` option: the tracker and the forkserver are started with the interpreter's
warning options (`sys.warnoptions`, read when each is started)."""


def worker_context() -> ForkServerContext:
    """The `forkserver` context, with the resource tracker quiet (see the module
    docstring)."""
    if QUIET_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(QUIET_TRACKER)
    return multiprocessing.get_context("forkserver")
