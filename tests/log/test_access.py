"""What an owner needs in a log dir's partitions (`log/access.py`), looked at through an
access check that refuses chosen paths (the suite runs as root, whom nothing refuses)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleanerd.cli import main
from cleanerd.commands import check_config
from cleanerd.log.access import Access, check_partitions


def _partition(log_dir: Path, name: str, bases: list[int]) -> Path:
    d = log_dir / name
    d.mkdir(parents=True)
    for base in bases:
        for kind in (".log", ".index", ".timeindex"):
            (d / f"{base:020d}{kind}").touch()
    return d


def _refusing(*refused: Path) -> Access:
    def may(path: Path, mode: int) -> bool:
        return path not in refused or mode == os.R_OK | os.X_OK

    return may


def test_unwritable_partition_dirs_and_active_segments_are_found(tmp_path: Path) -> None:
    """A partition dir the user cannot write in, and the active segment's files it cannot
    open to write, are found; a closed segment's files, never written in place, and the
    dirs that are not partitions are not looked at."""
    a = _partition(tmp_path, "a-0", [0, 10])
    b = _partition(tmp_path, "b-0", [0, 7])
    _partition(tmp_path, "c-0", [])
    deleting = _partition(tmp_path, "a-1.0123456789abcdef0123456789abcdef-delete", [0])
    refused = (a, b / f"{7:020d}.log", b / f"{7:020d}.index", b / f"{0:020d}.log", deleting)
    found = check_partitions(tmp_path, _refusing(*refused))
    assert found.partitions == 3
    assert found.unwritable_dirs == (a,)
    assert found.unwritable_files == (b / f"{7:020d}.log", b / f"{7:020d}.index")
    assert found.problems("log.dirs[0]", tmp_path, "kafka (uid 5)") == [
        f"log.dirs[0]: 1 ('a-0') of the 3 partition dirs in {str(tmp_path)!r} are not "
        "writable by user kafka (uid 5), and mode: owner creates, renames and deletes "
        "segment files in them (give the dirs to this user or to a group of it, with write "
        "permission)",
        f"log.dirs[0]: 2 ('b-0/00000000000000000007.log', 'b-0/00000000000000000007.index') "
        f"active segment files in {str(tmp_path)!r} cannot be opened to write by user kafka "
        "(uid 5), and mode: owner appends to them and trims their indexes when it rolls them "
        "(give them to this user or to a group of it, with write permission)",
    ]
    assert check_partitions(tmp_path, _refusing()).problems("k", tmp_path, "u") == []


def test_a_problem_names_three_paths_and_counts_the_rest(tmp_path: Path) -> None:
    dirs = [_partition(tmp_path, f"t-{i}", [0]) for i in range(5)]
    (line,) = check_partitions(tmp_path, _refusing(*dirs)).problems("k", tmp_path, "u")
    assert line.startswith("k: 5 ('t-0', 't-1', 't-2', ...) of the 5 partition dirs")


@pytest.mark.parametrize("mode", ["owner", "observe"])
def test_check_config_refuses_an_owned_log_dir_with_partitions_it_cannot_write(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """A broker's old partition dirs (0755, its user) in a log dir made writable: owner
    mode cannot do anything in them, and check-config says so (it said OK, and the daemon
    failed partition by partition); observe mode only reads them."""
    logs = tmp_path / "logs"
    old = _partition(logs, "orders-0", [0])
    config = tmp_path / "cleanerd.yaml"
    config.write_text(f"log.dirs: [{logs}]\nstate_dir: {tmp_path / 'state'}\nmode: {mode}\n")
    monkeypatch.setattr(check_config, "may", _refusing(old))
    status = main(["check-config", str(config)])
    out = capsys.readouterr()
    if mode == "observe":
        assert (status, out.out) == (0, f"{config}: OK\n")
        return
    assert (status, out.out) == (1, "")
    assert f"log.dirs[0]: 1 ('orders-0') of the 1 partition dirs in {str(logs)!r}" in out.err
