"""structlog setup: JSON off a terminal, console on one, stdlib loggers in the same format."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from cleanerd.log_setup import (
    COMPILER_LOGGERS,
    configure_logging,
    partition_context,
    resolve_format,
)

LOG_DIR = Path("/var/lib/kafka/data")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Each test starts from and leaves behind structlog's and the root logger's state."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()
        root.handlers[:] = handlers
        root.setLevel(level)
        for name in COMPILER_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)


def _json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_bound_partition() -> None:
    """In JSON mode every line inside partition_context has topic, partition, log_dir,
    an ISO UTC timestamp and the level."""
    out = io.StringIO()
    assert configure_logging("json", "info", out) == "json"
    with partition_context("orders", 3, LOG_DIR):
        structlog.get_logger().info("segment.rolled", base_offset=120)
    structlog.get_logger().info("cycle.done")
    rolled, done = _json_lines(out)
    assert rolled["event"] == "segment.rolled"
    assert (rolled["topic"], rolled["partition"], rolled["log_dir"]) == ("orders", 3, str(LOG_DIR))
    assert rolled["base_offset"] == 120
    assert rolled["level"] == "info"
    assert rolled["timestamp"].endswith("Z")
    assert "topic" not in done


def test_auto_is_json_off_a_terminal() -> None:
    """`auto` picks JSON for a stream that is not a terminal (journald, a pipe)."""
    out = io.StringIO()
    assert configure_logging("auto", "info", out) == "json"
    structlog.get_logger().info("started")
    assert _json_lines(out)[0]["event"] == "started"


def test_auto_is_console_on_a_terminal() -> None:
    """`auto` picks the console renderer on a pseudo-terminal."""
    master, slave = os.openpty()
    with os.fdopen(master, "rb", buffering=0) as reader, open(slave, "w") as tty:
        assert resolve_format("auto", tty) == "console"
        assert configure_logging("auto", "info", tty) == "console"
        with partition_context("orders", 0, LOG_DIR):
            structlog.get_logger().info("segment.rolled")
        tty.flush()
        text = reader.read(4096).decode()
    assert "segment.rolled" in text
    assert "topic" in text
    assert "orders" in text
    assert not text.lstrip().startswith("{")


def test_forced_console_off_a_terminal_has_no_colours() -> None:
    """A forced console format writes key=value text without ANSI escapes to a file."""
    out = io.StringIO()
    configure_logging("console", "info", out)
    with partition_context("orders", 1, LOG_DIR):
        structlog.get_logger().warning("partition.uncleanable")
    text = out.getvalue()
    assert "partition.uncleanable" in text
    assert "topic=orders" in text
    assert "partition=1" in text
    assert "\x1b[" not in text


def test_stdlib_loggers_come_out_as_json() -> None:
    """A third-party stdlib logger (paho's `mqtt`) is rendered by the same chain,
    bound context included."""
    out = io.StringIO()
    configure_logging("json", "info", out)
    with partition_context("orders", 2, LOG_DIR):
        logging.getLogger("mqtt").warning("Message queue is full: %d", 7)
    (line,) = _json_lines(out)
    assert line["event"] == "Message queue is full: 7"
    assert (line["logger"], line["level"]) == ("mqtt", "warning")
    assert (line["topic"], line["partition"]) == ("orders", 2)
    assert line["timestamp"].endswith("Z")


def test_level_filters_both_kinds_of_logger() -> None:
    """Lines below the configured level are dropped, for structlog and stdlib alike."""
    out = io.StringIO()
    configure_logging("json", "warning", out)
    structlog.get_logger().info("quiet")
    logging.getLogger("py4j").info("quiet too")
    structlog.get_logger().error("loud")
    assert [line["event"] for line in _json_lines(out)] == ["loud"]


def test_debug_leaves_out_the_compilers_internals() -> None:
    """At `debug` the kernel compiler's loggers stay at `warning` (numba's debug lines
    are its compiler's internals, megabytes per kernel); other libraries' debug lines
    come out, and a compiler warning still does."""
    out = io.StringIO()
    configure_logging("json", "debug", out)
    logging.getLogger("numba.core.ssa").debug("==== SSA block rewrite pass on 0")
    logging.getLogger("numba.core.byteflow").info("stack: []")
    logging.getLogger("llvmlite.binding").debug("add symbol")
    logging.getLogger("py4j.clientserver").debug("Command to send")
    logging.getLogger("numba.core.caching").warning("cannot cache")
    structlog.get_logger().debug("segment.read")
    events = [(line.get("logger"), line["event"]) for line in _json_lines(out)]
    assert events == [
        ("py4j.clientserver", "Command to send"),
        ("numba.core.caching", "cannot cache"),
        (None, "segment.read"),
    ]
    configure_logging("json", "error", out)  # a reload to a higher level raises them too
    assert logging.getLogger("numba").level == logging.ERROR


def test_exceptions_render_as_structured_tracebacks() -> None:
    """In JSON mode a logged exception becomes a list of dicts, not a text blob."""
    out = io.StringIO()
    configure_logging("json", "info", out)
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        structlog.get_logger().exception("clean.aborted")
    (line,) = _json_lines(out)
    assert isinstance(line["exception"], list)
    assert line["exception"][0]["exc_type"] == "OSError"


def test_reconfiguring_replaces_its_handler() -> None:
    """Calling configure_logging again (a reload) does not duplicate stdlib lines and
    applies the new level and stream."""
    logger = structlog.get_logger()  # made before, like a module-level logger
    first, second = io.StringIO(), io.StringIO()
    configure_logging("json", "info", first)
    logger.debug("dropped")
    configure_logging("json", "debug", second)
    logging.getLogger("py4j").debug("once")  # (aiomqtt pins `mqtt` to WARNING)
    logger.debug("also once")
    assert first.getvalue() == ""
    assert [line["event"] for line in _json_lines(second)] == ["once", "also once"]
