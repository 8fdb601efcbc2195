"""Each one-shot command imports only what it uses (issue 12): no Spark, Arrow, audit or
daemon-only code for `check-config`, `plan`, `clean`, `dump` and `produce`, and no numba
for the commands that run no kernel. Each command runs in a fresh interpreter, which then
lists the modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

FORBIDDEN_PACKAGES = frozenset({"pyspark", "pyarrow", "aiomqtt", "prometheus_client", "uvloop"})
"""Third-party packages only Spark jobs, the audit on Spark or the daemon use."""
FORBIDDEN_PREFIXES = (
    "cleanerd.engine.spark",
    "cleanerd.engine.routing",
    "cleanerd.compaction.audit",
    "cleanerd.daemon.service",
    "cleanerd.daemon.events",
    "cleanerd.daemon.metrics",
    "cleanerd.commands.audit",
    "cleanerd.commands.run",
)

_PROBE = """
import json, sys
from cleanerd.cli import main
status = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"status": status, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def loaded(*argv: str, stdin: str = "") -> set[str]:
    """The modules a fresh interpreter has loaded after running `cleanerd argv`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0, done.stdout + done.stderr
    return set(report["modules"])


def forbidden(modules: set[str]) -> list[str]:
    return sorted(
        m
        for m in modules
        if m.split(".")[0] in FORBIDDEN_PACKAGES or m.startswith(FORBIDDEN_PREFIXES)
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    path = tmp_path / "cleanerd.yaml"
    path.write_text(f"log.dirs: [{tmp_path / 'data'}]\nstate_dir: {tmp_path / 'state'}\n")
    return path


def test_check_config_loads_no_engine_and_no_numba(config: Path) -> None:
    """`check-config` reads YAML and stats dirs: nothing of the engines, no numba."""
    modules = loaded("check-config", str(config))
    assert forbidden(modules) == []
    assert "numba" not in modules
    assert not [m for m in modules if m.startswith("cleanerd.engine")]


def test_plan_on_an_empty_dir_loads_no_numba(config: Path) -> None:
    """`plan` of an empty dir runs no kernel, so numba is never imported."""
    modules = loaded("plan", "-c", str(config))
    assert forbidden(modules) == []
    assert "numba" not in modules


def test_commands_that_log_nothing_load_neither_structlog_nor_package_metadata_for_crc(
    config: Path,
) -> None:
    """structlog (with asyncio) is imported by the first log line, not by the log layer's
    modules; the CRC-32C routine is loaded without the `crc32c` package's `__init__`."""
    for argv in (("check-config", str(config)), ("plan", "-c", str(config))):
        modules = loaded(*argv)
        assert "structlog" not in modules, argv
        assert "asyncio" not in modules, argv
        assert "crc32c" not in modules, argv
    assert "crc32c._crc32c" in modules


def test_clean_loads_only_the_local_engine(config: Path) -> None:
    """`clean` on the local engine loads neither the Spark engine nor the audit."""
    modules = loaded("clean", "-c", str(config))
    assert forbidden(modules) == []
    assert "cleanerd.engine.local" in modules


def test_produce_and_dump_load_no_engine(config: Path) -> None:
    """Appending records and dumping the segment load nothing of the engines."""
    produced = loaded("produce", "-c", str(config), "t-0", stdin='{"key": "k", "value": "v"}\n')
    segment = config.parent / "data" / "t-0" / "00000000000000000000.log"
    dumped = loaded("dump", str(segment))
    for modules in (produced, dumped):
        assert forbidden(modules) == []
        assert not [m for m in modules if m.startswith("cleanerd.engine")]
