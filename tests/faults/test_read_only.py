"""Read-only file systems, for real (tmpfs remounted read-only, a read-only bind mount):
a step that cannot write is an error naming the file, the exit status says so, and
nothing is half done."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanerd.cli import main
from cleanerd.log.files import TopicPartition
from cleanerd.maintenance.cycle import Maintenance
from tests.faults.workload import (
    TP,
    Workload,
    cleanerd,
    dir_state,
    started,
    verify,
    write_config,
    write_partition,
)
from tests.holders import HOLD_BROKER_LOCK, held_by_other_process
from tests.tools import unavailable

pytestmark = pytest.mark.root

TS = 1_700_000_000_000
SEGMENT_BYTES = 1024 * 1024
WAIT_S = 60.0


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        unavailable(f"mount {' '.join(args)}: {done.stderr.strip()}")


@contextlib.contextmanager
def read_only_bind(path: Path, source: Path | None = None) -> Iterator[None]:
    """`path` as a read-only bind mount of `source` (default: of itself) for the block."""
    mount("--bind", str(path if source is None else source), str(path))
    try:
        mount("-o", "remount,bind,ro", str(path))
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


class Lines:
    """A process's output, read as it comes (JSON log lines parsed)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.text: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.text.append(line)

    def events(self) -> list[dict[str, object]]:
        return [json.loads(x) for x in list(self.text) if x.startswith("{")]

    def wait_for(self, event: str) -> None:
        for _ in range(int(WAIT_S / 0.1)):
            if any(e.get("event") == event for e in self.events()):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {event} in {''.join(self.text)[-3000:]}")

    def join(self) -> str:
        """All of the output, once the process has closed it."""
        self._thread.join(WAIT_S)
        return "".join(self.text)


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`chattr +i path` for the block: no file can be created, renamed or removed in the
    dir, by root either (ext4, xfs, btrfs; tmpfs has no such attribute)."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        unavailable(f"chattr +i {path}: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_unwritable_checkpoint_at_shutdown_is_an_error_and_fails_the_exit(
    tmp_path: Path,
) -> None:
    """The log dir's root turns unwritable under a running daemon (an immutable dir, on
    which root gets EPERM too): SIGTERM gives exit status 1 and an error line naming the
    `recovery-point-offset-checkpoint` file; no traceback, no unretrieved task exception,
    and the partition is intact."""
    data, state = tmp_path / "data", tmp_path / "state"
    work = write_partition(
        data, state, records=20_000, keys=2_000, segment_bytes=SEGMENT_BYTES, ts=TS
    )
    config = write_config(
        tmp_path / "c.yaml",
        data,
        state,
        **{"log.segment.bytes": SEGMENT_BYTES, "metrics": {"listen": "127.0.0.1:0"}},
    )
    with started("run", "-c", str(config)) as daemon:
        lines = Lines(daemon)
        lines.wait_for("cycle.done")
        with immutable(data):
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(WAIT_S) == 1
        out = lines.join()
    failed = [e for e in lines.events() if e["event"] == "shutdown.checkpoint_failed"]
    assert failed, out[-3000:]
    assert str(data / "recovery-point-offset-checkpoint") in str(failed[0]["error"])
    assert failed[0]["level"] == "error"
    assert "Traceback" not in out
    assert "never retrieved" not in out
    verify(data / str(TP), work)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_unwritable_checkpoint_at_the_end_of_clean_is_printed_with_the_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    """The log dir's root turns unwritable once `clean`'s cycle is done, as it writes
    what a clean stop leaves: exit 1, and the report says why, naming the checkpoint
    file, among the failed steps. It printed no failure at all: the reason was only in
    the log on stderr."""
    data, state = tmp_path / "data", tmp_path / "state"
    write_partition(data, state, records=2_000, keys=200, segment_bytes=SEGMENT_BYTES, ts=TS)
    config = write_config(tmp_path / "c.yaml", data, state)
    stop = Maintenance.checkpoint

    def unwritable_at_stop(self: Maintenance, *, clean_stop: bool = False) -> list[object]:
        with immutable(data):
            return list(stop(self, clean_stop=clean_stop))

    monkeypatch.setattr(Maintenance, "checkpoint", unwritable_at_stop)
    assert main(["clean", "-c", str(config), *(["--json"] if as_json else [])]) == 1
    out = capsys.readouterr().out
    file = str(data / "recovery-point-offset-checkpoint")
    if as_json:
        [error] = json.loads(out)["stop_errors"]
        assert file in error, out
    else:
        [failed] = [x for x in out.splitlines() if x.startswith("stop: checkpoint failed: ")]
        assert file in failed, out
        assert out.splitlines()[-1].endswith(", 1 step failed"), out


def test_read_only_partition_dir_fails_clean_naming_the_file(tmp_path: Path) -> None:
    """One partition dir is a read-only mount: its pass fails naming the `.cleaned` file
    it could not create, `clean` exits 1, the partition is byte for byte as it was, and
    the other partition is cleaned."""
    data, state = tmp_path / "data", tmp_path / "state"
    other = TopicPartition("other", 0)
    work = {
        tp: write_partition(
            data, state, records=20_000, keys=2_000, segment_bytes=SEGMENT_BYTES, ts=TS, tp=tp
        )
        for tp in (TP, other)
    }
    config = write_config(tmp_path / "c.yaml", data, state, **{"log.segment.bytes": SEGMENT_BYTES})
    before = dir_state(data / str(TP))
    with read_only_bind(data / str(TP)):
        done = cleanerd("clean", "-c", str(config))
        assert done.returncode == 1, done.stdout + done.stderr
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"{TP}: uncleanable"))
        assert "Read-only file system (EROFS) while creating the cleaned segment" in line
        assert f"{data / str(TP)}/00000000000000000000.log.cleaned" in line
        assert dir_state(data / str(TP)) == before
    assert f"{other}: cleaned" in done.stdout
    for tp in (TP, other):
        verify(data / str(tp), work[tp])


def test_a_brokers_dir_seen_read_only_is_observed_in_owner_mode(tmp_path: Path) -> None:
    """A dir a broker holds, which cleanerd sees through a read-only mount (the unit's
    observe drop-in makes it so), is observed under an owner-mode config, as a writable
    one is: `check-config` warned no more than that but refused it as read-only, `clean`
    could open no log dir, and the daemon did not start."""
    data, seen, state = tmp_path / "data", tmp_path / "seen", tmp_path / "state"
    work = write_partition(data, state, records=2_000, keys=200, segment_bytes=SEGMENT_BYTES, ts=TS)
    seen.mkdir()
    config = write_config(tmp_path / "c.yaml", seen, state)
    before = dir_state(data / str(TP))
    with held_by_other_process(HOLD_BROKER_LOCK, data), read_only_bind(seen, data):
        checked = cleanerd("check-config", str(config))
        assert checked.returncode == 0, checked.stderr
        assert "is held by pid" in checked.stderr
        assert "read-only" not in checked.stderr
        done = cleanerd("clean", "-c", str(config), "--json")
        assert "no log dir could be opened" not in done.stderr
        assert "log_dir.observe_forced" in done.stderr
        assert json.loads(done.stdout)["cleaned"] == []
    assert dir_state(data / str(TP)) == before
    verify(data / str(TP), work)


def watched(tmp_path: Path, data: Path) -> tuple[Workload, Path]:
    """A small partition in the log dir `data`, and the config of a daemon that looks at
    it every 200 ms (its state dir in `tmp_path`)."""
    state = tmp_path / "state"
    work = write_partition(data, state, records=2_000, keys=200, segment_bytes=SEGMENT_BYTES, ts=TS)
    config = write_config(
        tmp_path / "c.yaml",
        data,
        state,
        **{"log.retention.check.interval.ms": 200, "metrics": {"listen": "127.0.0.1:0"}},
    )
    return work, config


def test_a_log_dir_whose_file_system_turns_read_only_goes_offline_until_writable(
    tmp_path: Path,
) -> None:
    """The file system under an owned log dir turns read-only while the daemon runs (as
    the kernel remounts one after an I/O error; here a read-only bind mount over the dir,
    the same files and the same `.lock` seen through a read-only mount): the next cycle
    takes the dir offline, saying why, rather than failing each of its steps with an
    error of its own while it looked online; once writable again it is back online, and
    the partition is intact."""
    data = tmp_path / "data"
    work, config = watched(tmp_path, data)
    with started("run", "-c", str(config)) as daemon:
        lines = Lines(daemon)
        lines.wait_for("cycle.done")
        with read_only_bind(data):
            lines.wait_for("log_dir.offline")
        lines.wait_for("log_dir.online")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(WAIT_S) == 0
        out = lines.join()
    (offline,) = [e for e in lines.events() if e["event"] == "log_dir.offline"]
    assert offline["log_dir"] == str(data)
    assert str(offline["error"]).startswith(f"{data}: its file system refuses writes, read-only")
    errors = [e["event"] for e in lines.events() if e["level"] == "error"]
    assert errors == ["log_dir.offline"], out[-3000:]
    verify(data / str(TP), work)


@contextlib.contextmanager
def ext4_image(path: Path, size: str) -> Iterator[Path]:
    """A fresh ext4 file system in a loop-mounted image at `path`, which the kernel makes
    read-only at its first error (`errors=remount-ro`); unmounted at the end."""
    image, mnt = path.with_suffix(".img"), path
    mnt.mkdir()
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    done = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    if done.returncode != 0:
        unavailable(f"mkfs.ext4: {done.stderr.strip()}")
    mount("-o", "loop,errors=remount-ro", str(image), str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_log_dir_the_kernel_makes_read_only_after_an_error_goes_offline(
    tmp_path: Path,
) -> None:
    """An ext4 error under a running daemon (`errors=remount-ro`; recent kernels refuse
    every write from then on without setting the read-only mount flag, so `statvfs`
    still says read-write): the next cycle takes the dir offline saying its file system
    refuses writes, and the stop writes nothing there. Each step failed on its own, the
    dir counted online."""
    with ext4_image(tmp_path / "mnt", "24M") as mnt:
        data = mnt / "data"
        _, config = watched(tmp_path, data)
        source = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(mnt)], capture_output=True, text=True
        ).stdout.strip()
        trigger = Path("/sys/fs/ext4") / Path(source).name / "trigger_fs_error"
        if not trigger.exists():
            unavailable(f"no {trigger}: this kernel cannot be asked for an ext4 error")
        with started("run", "-c", str(config)) as daemon:
            lines = Lines(daemon)
            lines.wait_for("cycle.done")
            trigger.write_text("1")
            lines.wait_for("log_dir.offline")
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(WAIT_S) == 0
            out = lines.join()
    (offline,) = [e for e in lines.events() if e["event"] == "log_dir.offline"]
    assert str(offline["error"]).startswith(f"{data}: its file system refuses writes"), out
