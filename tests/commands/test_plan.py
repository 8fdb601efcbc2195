"""Tests of `cleanerd plan` as a whole process: its report on stdout, its log on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.compaction.conftest import LogBuilder, k
from tests.paths import REPO


def test_json_report_stays_parseable_when_a_warning_is_logged(tmp_path: Path) -> None:
    """A file named like a segment but not one is reported with a warning when its
    partition is opened; with `--json` that line goes to stderr and stdout holds the
    report alone (the log went to stdout before, in front of the JSON document)."""
    log = LogBuilder(tmp_path / "logs")
    log.append([(k("a"), b"1")])
    (log.write() / "00000000000000000abc.log").touch()
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
        "topics:\n  t: {cleanup.policy: compact}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cleanerd", "plan", "-c", str(config), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0
    assert "partition.malformed_file_name" in done.stderr
    assert "00000000000000000abc.log" in done.stderr
    assert [p["topic"] for p in json.loads(done.stdout)["partitions"]] == ["t"]
