"""A pass that fails (full disk, I/O error, corrupt batch) removes its `.cleaned` output,
leaves the source segments byte for byte as they were and marks the partition
uncleanable with the reason."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleaningAborted
from cleanerd.compaction.manager import UncleanablePartitions, clean_or_mark
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.swap import FileOps
from cleanerd.errors import CorruptRecordError
from tests.compaction.conftest import (
    LONG_MAX,
    TP,
    LogBuilder,
    T,
    active_base,
    clean,
    k,
    segment_metas,
)


def build(root: Path, n: int = 40, value_size: int = 10) -> Path:
    log = LogBuilder(root)
    for i in range(n):
        log.append([(k(i % 4), bytes(value_size))])
        if i % 10 == 9:
            log.roll()
    log.roll()
    return log.write()


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def run_marked(d: Path, registry: UncleanablePartitions, ops: FileOps | None = None) -> object:
    return clean_or_mark(
        Cleaner(OffsetMap(1024 * 24), ops=ops),
        registry,
        log_dir=d.parent,
        tp=TP,
        segments=segment_metas(d),
        first_dirty=0,
        first_uncleanable=active_base(d),
        now_ms=T,
        config=CleanerConfig(producer_id_expiration_ms=LONG_MAX),
    )


class FailingWrites(FileOps):
    """Every data write fails with the given errno."""

    def __init__(self, code: int) -> None:
        self.code = code

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        raise OSError(self.code, os.strerror(self.code))


def test_io_error_aborts_cleanly_and_marks(tmp_path: Path) -> None:
    """An I/O error while writing leaves no `.cleaned` file and the originals intact."""
    d = build(tmp_path / "logs")
    before = files(d)
    registry = UncleanablePartitions()
    assert run_marked(d, registry, FailingWrites(errno.EIO)) is None
    assert files(d) == before
    reason = registry.reason(TP)
    assert reason is not None
    assert "Input/output error" in reason
    assert registry.is_uncleanable(TP, now_ms=T)


def test_corrupt_batch_names_file_and_position(tmp_path: Path) -> None:
    """A bad CRC in the range to clean aborts with the file and byte position."""
    d = build(tmp_path / "logs")
    seg = d / "00000000000000000010.log"
    data = bytearray(seg.read_bytes())
    data[70] ^= 0x01
    seg.write_bytes(bytes(data))
    before = files(d)
    with pytest.raises(CorruptRecordError) as info:
        clean(d)
    assert info.value.path == str(seg)
    assert info.value.position == 0
    assert files(d) == before
    registry = UncleanablePartitions()
    assert run_marked(d, registry) is None
    assert "CorruptRecordError" in (registry.reason(TP) or "")


def fill_disk(path: Path) -> int | None:
    """Write zeros to `path` until the file system refuses; returns that errno."""
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(bytes(4096))
            except OSError as exc:
                return exc.errno


@pytest.mark.root
def test_enospc_on_tmpfs(tmp_path: Path) -> None:
    """A full disk (a real tmpfs) aborts the pass: `.cleaned` gone, originals intact."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
        check=False,
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        d = build(mnt / "logs", n=200, value_size=500)
        filler = mnt / "filler"
        assert fill_disk(filler) == errno.ENOSPC
        before = files(d)
        registry = UncleanablePartitions()
        assert run_marked(d, registry) is None
        assert "No space left on device" in (registry.reason(TP) or "")
        assert files(d) == before
        assert not [p for p in d.iterdir() if p.name.endswith((".cleaned", ".swap"))]
        filler.unlink()
        assert run_marked(d, UncleanablePartitions()) is not None
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_18_bad_magic_is_corrupt(tmp_path: Path) -> None:
    """Scenario 18: a batch whose magic byte is 0xFF is a corrupt-record error."""
    d = build(tmp_path / "logs")
    seg = d / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[16] = 0xFF
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="magic"):
        clean(d)


def test_19_truncated_segment_is_corrupt(tmp_path: Path) -> None:
    """Scenario 19: a batch declaring more bytes than the file holds is corrupt."""
    d = build(tmp_path / "logs")
    seg = d / "00000000000000000000.log"
    seg.write_bytes(seg.read_bytes()[:100])
    before = files(d)
    with pytest.raises(CorruptRecordError) as info:
        clean(d)
    assert info.value.path == str(seg)
    assert files(d) == before


def test_29_abort_during_copy(tmp_path: Path) -> None:
    """Scenario 29: a requested stop aborts the pass: no output, log unchanged, no mark."""
    d = build(tmp_path / "logs")
    before = files(d)
    polls = iter([False, False, False, False, False, True])
    cleaner = Cleaner(OffsetMap(1024 * 24), should_abort=lambda: next(polls, True))
    registry = UncleanablePartitions()
    with pytest.raises(CleaningAborted, match="aborted"):
        clean_or_mark(
            cleaner,
            registry,
            log_dir=d.parent,
            tp=TP,
            segments=segment_metas(d),
            first_dirty=0,
            first_uncleanable=active_base(d),
            now_ms=T,
            config=CleanerConfig(producer_id_expiration_ms=LONG_MAX),
        )
    assert files(d) == before
    assert registry.reason(TP) is None


def test_offset_overflow_in_a_source_segment_is_reported(tmp_path: Path) -> None:
    """A segment holding an offset 2^31 past its base (scenario 36's input) is refused
    with a clear error and the partition marked, instead of writing a bad index."""
    log = LogBuilder(tmp_path / "logs", index_interval=1 << 20)
    log.append([(k(0), b"a")], timestamps=[5000])
    log.append([(k(1), b"b")], offset=2**31 + 5, timestamps=[1000])
    log.roll()
    log.append([(k(2), b"c")])
    d = log.write()
    before = files(d)
    registry = UncleanablePartitions()
    assert run_marked(d, registry) is None
    assert "offset overflow" in (registry.reason(TP) or "")
    assert files(d) == before
