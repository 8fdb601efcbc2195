"""The library layers' loggers: structlog imported by the first call, configuration read
at every call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from structlog.testing import capture_logs

from cleanerd.logger import get_logger
from tests.paths import REPO
from tests.tools import run_python


def test_events_reach_structlog_with_the_configuration_made_after_the_logger() -> None:
    log = get_logger("cleanerd.test")
    with capture_logs() as first:
        log.info("segment.rolled", base_offset=120)
        log.warning("partition.uncleanable", reason="x")
    with capture_logs() as second:
        log.error("cycle.failed")
    assert [(e["event"], e["log_level"]) for e in first] == [
        ("segment.rolled", "info"),
        ("partition.uncleanable", "warning"),
    ]
    assert first[0]["base_offset"] == 120
    assert [(e["event"], e["log_level"]) for e in second] == [("cycle.failed", "error")]


def test_each_method_goes_to_structlogs_method_of_that_name() -> None:
    """(debug included, which the level another test configured may filter out.)"""
    calls: list[tuple[str, str, dict[str, object]]] = []

    class Bound:
        def __getattr__(self, method: str) -> object:
            return lambda event, **fields: calls.append((method, event, fields))

    log = get_logger("cleanerd.test")
    log._bound = Bound()
    for method in ("debug", "info", "warning", "error", "exception"):
        getattr(log, method)("e", n=1)
    assert calls == [(m, "e", {"n": 1}) for m in ("debug", "info", "warning", "error", "exception")]


def test_exception_carries_the_exception_being_handled() -> None:
    log = get_logger("cleanerd.test")
    with capture_logs() as logs:
        try:
            raise ValueError("bad offset 7")
        except ValueError:
            log.exception("cycle.failed", partition="t-0")
    assert logs[0]["log_level"] == "error"
    assert logs[0]["exc_info"] is True
    assert logs[0]["partition"] == "t-0"


def test_structlog_is_imported_by_the_first_call_only() -> None:
    probe = (
        "import sys\n"
        "from cleanerd.logger import get_logger\n"
        "log = get_logger('x')\n"
        "print('structlog' in sys.modules)\n"
        "log.info('event')\n"
        "print('structlog' in sys.modules)\n"
    )
    lines = run_python(probe).splitlines()  # structlog's default prints the event too
    assert (lines[0], lines[-1]) == ("False", "True")


def test_threads_first_lines_wait_for_the_pending_configuration() -> None:
    """Four threads log their first line at once after a command left its configuration
    pending: every line goes where it says (stderr, JSON), none through structlog's
    defaults to stdout while another thread is still configuring."""
    probe = (
        "import sys, threading\n"
        "from cleanerd.logger import get_logger, log_to_stderr\n"
        "log_to_stderr('json', 'info')\n"
        "go = threading.Barrier(4)\n"
        "def work(i):\n"
        "    go.wait()\n"
        "    get_logger(f't{i}').warning('first.line', thread=i)\n"
        "ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print('done')\n"
    )
    assert run_python(probe).splitlines() == ["done"]


def test_an_explicit_configuration_replaces_a_pending_one() -> None:
    """A command's pending configuration (nothing logged yet) does not override a later
    explicit `configure_logging` at the next logger's first line."""
    probe = (
        "import io\n"
        "from cleanerd.logger import get_logger, log_to_stderr\n"
        "log_to_stderr('json', 'info')\n"
        "from cleanerd.log_setup import configure_logging\n"
        "buf = io.StringIO()\n"
        "configure_logging('json', 'info', buf)\n"
        "get_logger('x').warning('hello')\n"
        "print('hello' in buf.getvalue())\n"
    )
    assert run_python(probe).splitlines() == ["True"]


def log_a_warning() -> None:
    """What the worker test below runs in a worker process."""
    get_logger("cleanerd.test").warning("worker.line", pid=os.getpid())


def test_a_workers_lines_go_to_stderr_in_the_configured_format() -> None:
    """A reader process (forkserver: a fresh interpreter, no configuration inherited)
    logs to stderr in the format it was started with, never to stdout, which is its
    parent's (a command's report)."""
    probe = (
        "from cleanerd.engine.first_reads import ReaderPool\n"
        "from tests.test_logger import log_a_warning\n"
        "pool = ReaderPool(1, 'json', 'info')\n"
        "pool._pool.submit(log_a_warning).result()\n"
        "pool._pool.shutdown()\n"
        "print('done')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", probe]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=True)
    assert done.stdout.splitlines() == ["done"]
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert (line["event"], line["level"]) == ("worker.line", "warning")
