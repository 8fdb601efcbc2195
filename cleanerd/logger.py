"""Loggers for the library layers, with structlog imported by the first log call.

structlog imports asyncio, ssl and sockets with it: about 50 ms, which a one-shot command
that logs nothing (`plan`, `check-config`, `dump`) should not pay at every start.
`get_logger(name)` returns a `Logger` whose first call imports structlog and keeps
structlog's own lazy proxy for `name`; that proxy reads structlog's configuration at
every call (`cleanerd.daemon.logging` sets `cache_logger_on_first_use=False`), so a
configuration made before or after the first call applies, as with
`structlog.get_logger`.
"""

from __future__ import annotations

from typing import Any


class Logger:
    """The structlog methods the library layers call, bound on first use."""

    __slots__ = ("_bound", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._bound: Any = None

    def _logger(self) -> Any:
        if self._bound is None:
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
