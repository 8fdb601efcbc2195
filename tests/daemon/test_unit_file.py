"""The shipped systemd unit: verified, rated by `systemd-analyze security`, and complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.paths import REPO
from tests.tools import require_tool

SYSTEMD_DIR = REPO / "systemd"
UNIT = SYSTEMD_DIR / "cleanerd.service"
SYSUSERS = SYSTEMD_DIR / "cleanerd.sysusers"
OBSERVE = SYSTEMD_DIR / "observe.conf"
MAX_EXPOSURE = 2.0


def _settings(text: str) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file (keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def _runnable_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this interpreter, which exists here."""
    text = UNIT.read_text()
    exec_start = f"ExecStart={sys.executable} -m cleanerd run -c /etc/cleanerd/cleanerd.yaml"
    text, count = re.subn(r"^ExecStart=.*$", exec_start, text, flags=re.MULTILINE)
    assert count == 1
    copy = tmp_path / "cleanerd.service"
    copy.write_text(text)
    return copy


def test_unit_has_the_lifecycle_and_hardening_settings() -> None:
    """The unit is Type=notify with reload, watchdog, restart, a dedicated user and the
    hardening the issue lists."""
    settings = _settings(UNIT.read_text())
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": "/usr/bin/cleanerd run -c /etc/cleanerd/cleanerd.yaml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure",
        "User": "cleanerd",
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "CacheDirectory": "cleanerd",
        "StateDirectory": "cleanerd",
        # The default state_dir, ./state, must not resolve in the read-only /.
        "WorkingDirectory": "/var/lib/cleanerd",
        "KillMode": "mixed",
    }
    for key, value in expected.items():
        assert settings.get(key) == [value], key
    assert "NUMBA_CACHE_DIR=/var/cache/cleanerd/numba" in settings["Environment"]
    assert settings["WatchdogSec"][0].endswith("s")
    assert settings["ReadWritePaths"] == ["-/var/lib/kafka"]  # a host without it starts
    assert settings["CapabilityBoundingSet"] == [""]
    # A filtered call fails (EPERM) rather than killing the process: `build-kernels
    # --background` calls setpriority, which @resources filters (it died of SIGSYS).
    assert settings["SystemCallErrorNumber"] == ["EPERM"]


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    """`systemd-analyze verify` reports nothing for the unit."""
    analyze = require_tool("systemd-analyze", "systemd")
    result = subprocess.run(
        [analyze, "verify", str(_runnable_copy(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_observe_drop_in_makes_the_log_dirs_read_only(tmp_path: Path) -> None:
    """The drop-in for running beside a broker drops every writable path but the
    service's own state and cache, makes the Kafka data read-only, and verifies with the
    unit."""
    settings = _settings(OBSERVE.read_text())
    assert settings["ReadWritePaths"] == [""]
    assert settings["ReadOnlyPaths"] == ["-/var/lib/kafka"]
    unit = _runnable_copy(tmp_path)
    drop_ins = tmp_path / "cleanerd.service.d"
    drop_ins.mkdir()
    (drop_ins / "observe.conf").write_text(OBSERVE.read_text())
    analyze = require_tool("systemd-analyze", "systemd")
    result = subprocess.run(
        [analyze, "verify", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def test_systemd_analyze_security_rates_it_ok(tmp_path: Path) -> None:
    """`systemd-analyze security --offline=true` rates the unit's exposure at most 2.0."""
    analyze = require_tool("systemd-analyze", "systemd")
    result = subprocess.run(
        [analyze, "security", "--offline=true", str(_runnable_copy(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


def test_sysusers_entry_parses(tmp_path: Path) -> None:
    """systemd-sysusers accepts the entry and would create the `cleanerd` user."""
    sysusers = require_tool("systemd-sysusers", "systemd")
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", "--dry-run", str(SYSUSERS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Creating user 'cleanerd'" in result.stderr + result.stdout
