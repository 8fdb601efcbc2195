"""Loggers for the library layers, with structlog imported by the first log call.

structlog imports asyncio, ssl and sockets with it: about 50 ms, which a one-shot command
that logs nothing (`plan`, `check-config`, `dump`) should not pay at every start.
`get_logger(name)` returns a `Logger` whose first call imports structlog and keeps
structlog's own lazy proxy for `name`; that proxy reads structlog's configuration at
every call (`cleanerd.log_setup` sets `cache_logger_on_first_use=False`), so a
configuration made before or after the first call applies, as with
`structlog.get_logger`.

A one-shot command or a worker process says where it logs with `log_to_stderr`, which is
applied at the process's first log call: a command that logs nothing never imports
structlog, and one that logs sends every line where it asked, from any thread.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO, cast

if TYPE_CHECKING:
    from cleanerd.log_setup import LogFormat, LogLevel

_pending: Callable[[], None] | None = None
"""The logging configuration to apply at the first log call, if any."""
_pending_lock = threading.RLock()
"""Held while a pending configuration is applied: a thread's first log line waits for
it instead of going out through structlog's defaults (to stdout)."""


def log_to_stderr(format: LogFormat = "auto", level: LogLevel = "info") -> None:
    """Log in `format` at `level` to stderr (whatever it is at each line), from the
    process's next log line on (now, when structlog is imported already: a logger may
    have been bound): a one-shot command's stdout holds only its report (`--json` stays
    parseable), and a worker process's stdout is its parent's."""
    global _pending

    def configure() -> None:
        from cleanerd.log_setup import configure_logging

        configure_logging(format, level, cast(TextIO, _CurrentStderr()))

    with _pending_lock:
        if "structlog" not in sys.modules:
            _pending = configure
            return
        _pending = None
    configure()


def drop_pending() -> None:
    """Forget a pending configuration: an explicit one (`configure_logging`) replaces
    it."""
    global _pending
    with _pending_lock:
        _pending = None


def _apply_pending() -> None:
    global _pending
    with _pending_lock:
        configure, _pending = _pending, None
        if configure is not None:
            configure()


class _CurrentStderr:
    """Whatever `sys.stderr` is at the time of each write (a test's capture, a
    redirection made after the logging was configured): the log stream of the one-shot
    commands, whose stdout holds only their report (`--json` stays parseable)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


class Logger:
    """The structlog methods the library layers call, bound on first use."""

    __slots__ = ("_bound", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._bound: Any = None

    def _logger(self) -> Any:
        if self._bound is None:
            _apply_pending()
            import structlog

            self._bound = structlog.get_logger(self._name)
        return self._bound

    def debug(self, event: str, **fields: Any) -> Any:
        return self._logger().debug(event, **fields)

    def info(self, event: str, **fields: Any) -> Any:
        return self._logger().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> Any:
        return self._logger().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> Any:
        return self._logger().error(event, **fields)

    def exception(self, event: str, **fields: Any) -> Any:
        return self._logger().exception(event, **fields)


def get_logger(name: str) -> Logger:
    """A logger named `name` (a module's `__name__`), as `structlog.get_logger(name)`."""
    return Logger(name)
