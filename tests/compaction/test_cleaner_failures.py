"""A pass that fails (full disk, I/O error, corrupt batch) removes its `.cleaned` output,
leaves the source segments byte for byte as they were and marks the partition
uncleanable with the reason."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from cleanerd.compaction import cleaner as cleaner_module
from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleaningAborted, CleanResult
from cleanerd.compaction.manager import UncleanablePartitions
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.swap import FileOps
from cleanerd.config import config_from_data
from cleanerd.errors import CleanerdError, CorruptRecordError, failure_text
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import SegmentMeta
from cleanerd.maintenance.cycle import cleaner_config_for
from tests.builders import control_bit_on_first_batch, set_base_offset
from tests.compaction.conftest import (
    LONG_MAX,
    TP,
    LogBuilder,
    T,
    active_base,
    clean,
    k,
    read_batches,
    segment_metas,
)
from tests.tools import tmpfs


def clean_or_mark(
    cleaner: Cleaner,
    registry: UncleanablePartitions,
    *,
    log_dir: Path,
    tp: TopicPartition,
    segments: Sequence[SegmentMeta],
    first_dirty: int,
    first_uncleanable: int,
    now_ms: int,
    config: CleanerConfig,
) -> CleanResult | None:
    """One pass; a failure marks `tp` uncleanable with its reason, as the cycle does
    (`Maintenance._finished`); a requested stop propagates without a mark."""
    try:
        return cleaner.clean(
            log_dir=log_dir,
            tp=tp,
            segments=segments,
            first_dirty=first_dirty,
            first_uncleanable=first_uncleanable,
            now_ms=now_ms,
            config=config,
        )
    except CleaningAborted:
        raise
    except (CleanerdError, OSError) as exc:
        registry.mark(tp, log_dir=str(log_dir), reason=failure_text(exc), now_ms=now_ms)
        return None


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
    assert (registry.reason(TP) or "").startswith(f"corrupt record batch in {seg} at position 0")


def test_a_data_batch_flagged_control_fails_the_pass_naming_the_file(tmp_path: Path) -> None:
    """A CRC-valid batch whose attributes say control but whose record is data (its key
    no control key): the pass fails naming the file and the batch's position. Before,
    the reason named the position only."""
    d = build(tmp_path / "logs")
    seg = d / "00000000000000000010.log"
    control_bit_on_first_batch(seg)
    before = files(d)
    with pytest.raises(CorruptRecordError, match="control record has a") as info:
        clean(d)
    assert (info.value.path, info.value.position) == (str(seg), 0)
    assert files(d) == before


@pytest.mark.parametrize("windowed", [False, True])
@pytest.mark.parametrize(
    ("batch", "value", "reason"),
    [
        (3, -5, "negative base offset -5"),
        (3, 11, "base offset 11 is not above the previous batch's last offset 12"),
        (0, 5, "last offset 5 is below the segment's base offset 10"),
        (-1, 25, "last offset 25 is not below the next segment's base offset 20"),
    ],
)
def test_a_damaged_base_offset_fails_the_pass_naming_the_batch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    batch: int,
    value: int,
    reason: str,
    windowed: bool,
) -> None:
    """No CRC covers a batch's base offset: one outside its segment's offsets (negative,
    not ascending, below the segment's base or reaching the next segment's) fails the
    pass with the file and position, whether the decode sees the batch before it in the
    same window or not; nothing is written and the partition is marked. (A negative one
    failed deep in the map build without a file; the others were cleaned as if sound.)"""
    d = build(tmp_path / "logs")
    seg = d / "00000000000000000010.log"
    position = set_base_offset(seg, batch, value)
    if windowed:
        monkeypatch.setattr(cleaner_module, "DECODE_WINDOW_BYTES", 1)  # a batch a window
    before = files(d)
    with pytest.raises(CorruptRecordError) as info:
        clean(d)
    assert str(info.value) == f"corrupt record batch in {seg} at position {position}: {reason}"
    assert files(d) == before
    registry = UncleanablePartitions()
    assert run_marked(d, registry) is None
    assert registry.reason(TP) == str(info.value)
    assert files(d) == before


def test_a_damaged_base_offset_past_the_cleanable_range_fails_the_pass(tmp_path: Path) -> None:
    """The batches past the first uncleanable offset are never decoded by the pass, but
    their producer headers are read for the producer state: a base offset damaged there
    fails the pass with the file and position too, not a producer state read from it."""
    d = build(tmp_path / "logs")
    seg = d / "00000000000000000030.log"
    position = set_base_offset(seg, 3, 31)
    before = files(d)
    with pytest.raises(CorruptRecordError) as info:
        clean(d, first_uncleanable=20)
    reason = "base offset 31 is not above the previous batch's last offset 32"
    assert str(info.value) == f"corrupt record batch in {seg} at position {position}: {reason}"
    assert files(d) == before


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
    with tmpfs(tmp_path / "mnt", "512k") as mnt:
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


def big_log(root: Path) -> Path:
    """Scenarios 17-19's log: 1 MiB records (k0, k1, k0 again), then an active segment."""
    log = LogBuilder(root)
    big = bytes(1024 * 1024)
    log.records([(k(0), big), (k(1), big), (k(0), big + b"!")])
    log.roll()
    log.append([(k(2), b"x")])
    return log.write()


def test_17_topic_limit_shrunk_after_writing(tmp_path: Path) -> None:
    """Scenario 17: 1 MiB records clean under a topic whose max.message.bytes was then
    set to 512 KiB (segments are read whole: no per-batch read buffer to outgrow)."""
    d = big_log(tmp_path / "logs")
    cfg = config_from_data(
        {"log.dirs": [str(tmp_path)], "topics": {"t": {"max.message.bytes": 512 * 1024}}}
    )
    topic = cfg.topic_config("t")
    assert topic.max_message_bytes == 512 * 1024
    config = cleaner_config_for(topic, producer_id_expiration_ms=LONG_MAX)
    clean(d, config=config)
    values = [r.value for b in read_batches(d) for r in b.records]
    assert [len(v or b"") for v in values] == [1024 * 1024, 1024 * 1024 + 1, 1]


def corrupt_and_check(d: Path, seg: Path, match: str | None) -> None:
    """The pass fails with a corrupt-record error naming `seg` and byte 0; the files stay
    as they were; clean_or_mark marks the partition with that reason."""
    before = files(d)
    with pytest.raises(CorruptRecordError, match=match) as info:
        clean(d)
    assert info.value.path == str(seg)
    assert info.value.position == 0
    assert files(d) == before
    registry = UncleanablePartitions()
    assert run_marked(d, registry) is None
    reason = registry.reason(TP) or ""
    assert reason.startswith(f"corrupt record batch in {seg} at position 0")
    assert files(d) == before


def test_18_bad_magic_is_corrupt(tmp_path: Path) -> None:
    """Scenario 18: the first batch's magic byte overwritten with 0xFF is a corrupt-record
    error naming the file and position; originals untouched, partition marked."""
    d = big_log(tmp_path / "logs")
    seg = d / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[16] = 0xFF
    seg.write_bytes(bytes(data))
    corrupt_and_check(d, seg, "magic")


def test_19_truncated_segment_is_corrupt(tmp_path: Path) -> None:
    """Scenario 19: the segment truncated to 1024 bytes: its first batch declares more
    bytes than are left, a corrupt-record error; originals untouched, partition marked."""
    d = big_log(tmp_path / "logs")
    seg = d / "00000000000000000000.log"
    seg.write_bytes(seg.read_bytes()[:1024])
    corrupt_and_check(d, seg, None)


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
