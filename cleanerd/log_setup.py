"""structlog setup: one processor chain for cleanerd's lines and for stdlib loggers.

Output format, one line per event on `stream` (stderr by default, which journald
collects under systemd):

- `json`: a JSON object per line with `event`, `level`, `timestamp` (ISO 8601, UTC),
  the bound context (`topic`, `partition`, `log_dir` for lines about a partition),
  `logger` for stdlib loggers, and `exception` as a list of dicts (structlog's
  dict tracebacks) when there is one;
- `console`: structlog's aligned key=value rendering, coloured on a terminal;
- `auto` (the default): `console` when `stream` is a terminal, else `json`.

Third-party libraries that log through the standard library (paho-mqtt under aiomqtt as
`mqtt`, py4j) go through `structlog.stdlib.ProcessorFormatter` with the same chain, so
the journal holds a single format. Loggers are not cached, so a SIGHUP that changes the
level applies to loggers that already exist. The compiler's loggers (`COMPILER_LOGGERS`)
are held at `warning` whatever the level: at `debug` numba logs its compiler's internals
(bytecode dumps, every SSA pass), megabytes per kernel compiled, which would drown the
lines an operator turned `debug` on for.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from typing import Literal, TextIO

import structlog
from structlog.typing import Processor

from cleanerd.logger import drop_pending

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]


COMPILER_LOGGERS = ("numba", "llvmlite")
"""Loggers of the kernel compiler, never below `warning` (see the module docstring)."""


class _CleanerdHandler(logging.StreamHandler[TextIO]):
    """The stdlib handler this module installs; marked so reconfiguring replaces it."""


def shared_processors() -> list[Processor]:
    """The chain every line goes through before rendering, structlog's or stdlib's."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def resolve_format(format: LogFormat, stream: TextIO) -> Literal["json", "console"]:
    """`auto` is `console` on a terminal and `json` otherwise."""
    if format != "auto":
        return format
    return "console" if _isatty(stream) else "json"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or file-like without a terminal
        return False


def _renderers(fmt: Literal["json", "console"], stream: TextIO) -> list[Processor]:
    if fmt == "json":
        return [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
    return [structlog.dev.ConsoleRenderer(colors=_isatty(stream))]


class _LogStream:
    """The log's stream, with a write that fails dropped: a line that cannot be written
    (its reader gone, EPIPE: `cleanerd run 2>&1 | tee`, a collector that died; a closed
    stream) must not fail the work that logged it. Before, a cycle logging into a broken
    pipe failed, its `cycle.failed` line failed the same way, the next cycle did too, and
    the SIGTERM handler's own line lost the stop: the daemon spun and could not be
    stopped. The standard library's handlers already drop such lines (`handleError`)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except (OSError, ValueError):  # ValueError: a closed stream
            return 0

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()


def configure_logging(
    format: LogFormat = "auto", level: LogLevel = "info", stream: TextIO | None = None
) -> Literal["json", "console"]:
    """Route structlog and the standard library's loggers to `stream` in one format.

    Safe to call again (on reload): it replaces its own handler and leaves other
    handlers on the root logger alone. Returns the format chosen.
    """
    drop_pending()  # this configuration replaces one a command left for later
    out = sys.stderr if stream is None else stream
    fmt = resolve_format(format, out)
    level_no = logging.getLevelNamesMapping()[level.upper()]
    shared = shared_processors()
    renderers = _renderers(fmt, out)
    structlog.configure(
        processors=[*shared, *renderers],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.WriteLoggerFactory(_LogStream(out)),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderers],
    )
    handler = _CleanerdHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _CleanerdHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_no)
    for name in COMPILER_LOGGERS:
        logging.getLogger(name).setLevel(max(level_no, logging.WARNING))
    return fmt


@contextmanager
def partition_context(topic: str, partition: int, log_dir: str | PathLike[str]) -> Iterator[None]:
    """Bind `topic`, `partition` and `log_dir` to every line logged inside the block.

    Context variables follow the current task, so bind inside the task that does the
    work: a task copies the context when it is created.
    """
    with structlog.contextvars.bound_contextvars(
        topic=topic, partition=partition, log_dir=str(log_dir)
    ):
        yield
