"""Finding the system programs that integration tests drive for real (promtool, prometheus).

`scripts/test` installs them (Debian packages); elsewhere a test that needs a missing one
skips, except under CI (`CI` set), where a missing tool is a failure, not a silent skip.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str, package: str) -> str:
    """The path of the program `name`, or skip (fail under CI) naming its `package`."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        message = f"{name} is missing (apt-get install {package})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
