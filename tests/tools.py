"""What integration tests need from the system: programs they drive for real (promtool,
prometheus, mosquitto ...), real tmpfs mounts (root), and fresh interpreters.

`scripts/test` installs the programs (Debian packages) and CI runs as root; elsewhere a test
whose need is not met skips, except under CI (`CI` set), where it is a failure, not a
silent skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from tests.paths import REPO


def unavailable(message: str) -> None:
    """Skip the test, or fail it under CI, where every requirement must be met."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(reason=message)


def require_tool(name: str, package: str) -> str:
    """The path of the program `name`, or skip (fail under CI) naming its `package`."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        unavailable(f"{name} is missing (apt-get install {package})")
    assert path is not None
    return path


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` (mount's syntax: 512k, 4m) mounted at `path` (created) for
    the block; skip (fail under CI) when not root or the mount is refused."""
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs needs root")
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a tmpfs at {path}: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def session_processes(sid: int) -> list[int]:
    """The live processes of session `sid` (a process started with
    `start_new_session=True` leads one): whatever a command started and left behind."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return found


def wait_for_session_end(sid: int, timeout_s: float) -> float:
    """Wait until no process of session `sid` is alive; returns how long that took.
    Fails (with the survivors) after `timeout_s`."""
    start = time.monotonic()
    while alive := session_processes(sid):
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"processes of session {sid} outlived it by {timeout_s} s: {alive}")
        time.sleep(0.02)
    return time.monotonic() - start


def free_port() -> int:
    """A TCP port free on loopback now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_python(
    code: str, *args: str, timeout_s: float = 120, env: Mapping[str, str] | None = None
) -> str:
    """What a fresh interpreter running `code` (with `args` as `sys.argv[1:]`, this
    checkout first on its path, `env` added to the environment) prints: for what only a
    new process shows (the modules an import loads, the collector's state, numba's
    cache)."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=timeout_s,
        check=True,
    )
    return done.stdout
