"""Tests of cleanerd.log.recovery: Kafka's leftover handling and damaged-data policy."""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest
from structlog.testing import capture_logs

from cleanerd.errors import CorruptRecordError, FileStepError
from cleanerd.log import recovery
from cleanerd.log.checkpoint import RECOVERY_POINT_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.files import TopicPartition, log_file, offset_index_file, time_index_file
from cleanerd.log.index import IndexPastLogError, OffsetIndex
from cleanerd.log.known_reader import read_dir
from cleanerd.log.partition_log import LogConfig, PartitionLog
from cleanerd.log.producer_state import ProducerEntry, ProducerState, write_snapshot
from cleanerd.log.recovery import SpecialFileRefused, SymlinkRefused
from cleanerd.log.txnindex import TXN_ENTRY, AbortedTxn, TransactionIndex
from cleanerd.records.control import ControlRecordType
from cleanerd.records.record import Record
from cleanerd.records.walker import walk
from tests.builders import (
    build_log,
    encode_records,
    kv,
    offsets_and_values,
    set_base_offset,
    write_segment,
)
from tests.compaction.conftest import LogBuilder
from tests.records.oracles import build_legacy

CONFIG = LogConfig(index_interval_bytes=100)
KEYS = [f"k{j % 10}" for j in range(20)]  # offsets 0..19, two per segment


def _build(tmp_path: Path) -> Path:
    """Ten segments of two one-record batches each; keys k0..k9 twice."""
    segments = [
        [[kv(KEYS[2 * s], f"v{2 * s}")], [kv(KEYS[2 * s + 1], f"v{2 * s + 1}")]] for s in range(10)
    ]
    plog = build_log(tmp_path / "logs", segments, state_dir=tmp_path / "state", config=CONFIG)
    return plog.dir


def _open(path: Path, *, full_check: bool = False) -> PartitionLog:
    state = path.parent.parent / "state"
    return PartitionLog.open(path, state_dir=state, config=CONFIG, full_check=full_check)


def _names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


ORIGINAL = [(o, KEYS[o].encode(), f"v{o}".encode()) for o in range(20)]
# The cleaner's output for segments 0..8 when odd keys are superseded: even keys only.
CLEANED_OFFSETS = [o for o in range(18) if int(KEYS[o][1:]) % 2 == 0]
CLEANED = [r for r in ORIGINAL if r[0] in CLEANED_OFFSETS or r[0] >= 18]


def _write_cleaned(path: Path, suffix: str) -> None:
    batches = [encode_records([kv(KEYS[o], f"v{o}")], o) for o in CLEANED_OFFSETS]
    write_segment(path, 0, batches, suffix=suffix, index_interval_bytes=100)


def _rename(path: Path, bases: list[int], kinds: list[str], old: str, new: str) -> None:
    for base in bases:
        for kind in kinds:
            src = path / f"{base:020d}{kind}{old}"
            if src.exists():
                src.rename(path / f"{base:020d}{kind}{new}")


OLD_BASES = list(range(0, 18, 2))
KINDS = [".log", ".index", ".timeindex"]


def _stage1(path: Path) -> None:
    _write_cleaned(path, ".cleaned")


def _stage2(path: Path) -> None:
    _write_cleaned(path, ".cleaned")
    _rename(path, [0], [".log"], ".cleaned", ".swap")


def _stage3(path: Path) -> None:
    _write_cleaned(path, ".cleaned")
    _rename(path, [0], KINDS, ".cleaned", ".swap")


def _stage4(path: Path) -> None:
    _stage3(path)
    _rename(path, OLD_BASES, KINDS, "", ".deleted")


def _stage5(path: Path) -> None:
    _stage4(path)
    _rename(path, [0], [".log", ".index"], ".swap", "")
    for file in path.glob("*.deleted"):
        file.unlink()


def _stage6(path: Path) -> None:
    _stage4(path)
    _rename(path, [0], KINDS, ".swap", "")


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        pytest.param(_stage1, ORIGINAL, id="1-output-still-cleaned"),
        pytest.param(_stage2, ORIGINAL, id="2-cleaned-with-log-swap"),
        pytest.param(_stage3, CLEANED, id="3-swap-old-not-deleted"),
        pytest.param(_stage4, CLEANED, id="4-swap-old-deleted"),
        pytest.param(_stage5, CLEANED, id="5-only-timeindex-swap"),
        pytest.param(_stage6, CLEANED, id="6-deleted-files-left"),
    ],
)
def test_crash_at_each_swap_stage(
    tmp_path: Path,
    stage: Callable[[Path], None],
    expected: list[tuple[int, bytes, bytes]],
) -> None:
    """Kafka scenario 37: after a crash at each stage of the swap, reopening yields either
    all original records or exactly the cleaned ones, with no leftovers and consistent
    indexes."""
    path = _build(tmp_path)
    stage(path)
    plog = _open(path, full_check=True)
    assert offsets_and_values(plog) == expected
    assert plog.corrupt is None
    assert not [n for n in _names(path) if n.endswith((".cleaned", ".swap", ".deleted"))]
    bases = [0] if expected is CLEANED else OLD_BASES
    assert [s.base_offset for s in plog.segments] == [*bases, 18]
    for segment in plog.segments:
        assert not segment.sanity_check()
    assert plog.append([kv("new", "x")]) == (20, 20)


def test_deleted_files_are_removed(tmp_path: Path) -> None:
    """Every `*.deleted` file, producer snapshots included, is deleted, and said in one
    info line for the partition (each file at debug, as Kafka's loader says it: a line
    each flooded the journal with thousands after a kill of a busy daemon)."""
    path = _build(tmp_path)
    (path / "00000000000000000000.snapshot.deleted").write_bytes(b"x")
    (path / "00000000000000000002.log").rename(path / "00000000000000000002.log.deleted")
    with capture_logs() as logs:
        plog = _open(path)
    assert not [n for n in _names(path) if n.endswith(".deleted")]
    info = [e for e in logs if e["log_level"] == "info"]
    assert [e["files"] for e in info if e["event"] == "recovery.files_deleted"] == [2]
    assert not [e for e in info if e.get("path", "").endswith(".deleted")]
    assert any(
        d.endswith("00000000000000000000.snapshot.deleted") for d in plog.recovery_report.deleted
    )
    # The orphan index files of the deleted segment go too, as in Kafka.
    assert not offset_index_file(path, 2).exists()


def test_swaps_at_or_above_min_cleaned_are_dropped(tmp_path: Path) -> None:
    """`.swap` files at or above the lowest `.cleaned` base are deleted with every
    `.cleaned` file; a `.swap` below it is completed."""
    path = _build(tmp_path)
    write_segment(path, 4, [encode_records([kv("k4", "v4")], 4)], suffix=".cleaned")
    write_segment(path, 6, [encode_records([kv("k6", "v6")], 6)], suffix=".swap")
    write_segment(path, 2, [encode_records([kv("k2", "v2")], 2)], suffix=".swap")
    plog = _open(path)
    names = _names(path)
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]
    # The swap at base 2 covered [2, 3): the old segment 2 (offsets 2, 3) was replaced.
    assert [o for o, _, _ in offsets_and_values(plog)] == [0, 1, 2, *range(4, 20)]


def test_swap_deletes_old_segments_in_its_range(tmp_path: Path) -> None:
    """Non-swap files with offsets in [min swap base, max swap next offset) are deleted,
    including snapshots; files outside the range stay."""
    path = _build(tmp_path)
    (path / "00000000000000000004.snapshot").write_bytes(b"s")
    (path / "00000000000000000008.snapshot").write_bytes(b"s")
    write_segment(
        path,
        2,
        [encode_records([kv("k3", "v3")], 3), encode_records([kv("k6", "v6")], 6)],
        suffix=".swap",
    )
    plog = _open(path)
    assert not (path / "00000000000000000004.snapshot").exists()
    assert (path / "00000000000000000008.snapshot").exists()
    assert [s.base_offset for s in plog.segments] == [0, 2, 8, 10, 12, 14, 16, 18]
    assert [o for o, _, _ in offsets_and_values(plog)] == [0, 1, 3, 6, *range(8, 20)]


def _torn(path: Path) -> None:
    """stage 4 (old segments renamed .deleted), with the swap's last batch cut short."""
    _stage4(path)
    swap = log_file(path, 0, ".swap")
    swap.write_bytes(swap.read_bytes()[:-3])


def _damaged(path: Path) -> None:
    """stage 3 (old segments still in place), with one byte of the swap's first batch
    changed."""
    _stage3(path)
    swap = log_file(path, 0, ".swap")
    data = bytearray(swap.read_bytes())
    data[-1] ^= 0xFF
    swap.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    """stage 3, the swap's log replaced by bytes that hold no batch."""
    _stage3(path)
    log_file(path, 0, ".swap").write_bytes(bytes(range(7, 250)) * 2)


@pytest.mark.parametrize(
    ("stage", "reason"),
    [
        pytest.param(_torn, "bytes left", id="torn-after-old-deleted"),
        pytest.param(_damaged, "CRC mismatch", id="bad-crc"),
        pytest.param(_garbage, "", id="garbage"),
    ],
)
def test_a_damaged_swap_is_refused_and_nothing_is_deleted(
    tmp_path: Path, stage: Callable[[Path], None], reason: str
) -> None:
    """A `.swap` segment that does not walk clean to its end would replace good
    segments with less than it claims (a torn one lost the offsets after its cut, a
    garbage one every old record): the open fails naming the swap file and position, and
    no file is deleted or renamed, the `.deleted` old segments included."""
    path = _build(tmp_path)
    stage(path)
    before = _files(path)
    with pytest.raises(CorruptRecordError) as caught:
        _open(path)
    assert caught.value.path == str(log_file(path, 0, ".swap"))
    assert caught.value.position is not None
    assert reason in str(caught.value)
    assert "the interrupted swap is left as it is" in str(caught.value)
    assert _files(path) == before


def test_lone_index_swap_is_renamed(tmp_path: Path) -> None:
    """An index `.swap` without a `.log.swap` is renamed to its final name."""
    path = _build(tmp_path)
    index = offset_index_file(path, 4)
    content = index.read_bytes()
    index.rename(offset_index_file(path, 4, ".swap"))
    _open(path)
    assert index.read_bytes() == content


def test_orphan_index_is_deleted(tmp_path: Path) -> None:
    """Index files without a `.log` are deleted, as Kafka's loader does."""
    path = _build(tmp_path)
    orphan = time_index_file(path, 100)
    orphan.write_bytes(b"")
    _open(path)
    assert not orphan.exists()


MALFORMED = [
    "00000000000000000abc.log",
    "0000000000000000002.log.deleted",
    "4.index.swap",
    "000000000000000000004.snapshot",
    "orders.log.cleaned",
]


@pytest.mark.parametrize("read_only", [False, True], ids=["owner", "observe"])
def test_malformed_segment_names_are_reported_never_touched(
    tmp_path: Path, read_only: bool
) -> None:
    """Files named like segment files without the 20-digit stem are warned about, by
    path, in every mode, and survive recovery byte for byte: not deleted as `.deleted`
    or `.cleaned` leftovers, not renamed as a `.swap`, not deleted as an old segment in a
    swap's range (the 21-digit snapshot reads as offset 4, inside [2, 7))."""
    path = _build(tmp_path)
    for n, name in enumerate(MALFORMED):
        (path / name).write_bytes(f"not Kafka's {n}".encode())
    write_segment(
        path,
        2,
        [encode_records([kv("k3", "v3")], 3), encode_records([kv("k6", "v6")], 6)],
        suffix=".swap",
    )
    before = {name: (path / name).read_bytes() for name in MALFORMED}
    with capture_logs() as logs:
        if read_only:
            plog = PartitionLog.open(path, read_only=True, config=CONFIG)
        else:
            plog = _open(path)
    assert {name: (path / name).read_bytes() for name in MALFORMED} == before
    warned = {e["path"] for e in logs if e["event"] == "partition.malformed_file_name"}
    assert warned == {str(path / name) for name in MALFORMED}
    assert sorted(plog.recovery_report.malformed) == sorted(str(path / n) for n in MALFORMED)
    if not read_only:
        assert [s.base_offset for s in plog.segments] == [0, 2, 8, 10, 12, 14, 16, 18]


@pytest.mark.parametrize(
    "name",
    [
        "00000000000000000018.log",  # the active segment: appends would go through it
        "00000000000000000004.index",
        "00000000000000000030.timeindex",  # an orphan index: recovery would delete it
        "00000000000000000000.log.deleted",
        "00000000000000000006.snapshot",
        "00000000000000000abc.log",  # malformed names are no exception
    ],
)
@pytest.mark.parametrize("read_only", [False, True], ids=["owner", "observe"])
def test_symlinked_segment_files_are_refused(tmp_path: Path, name: str, read_only: bool) -> None:
    """A link among the segment files (any kind, any state suffix) makes the whole
    partition refused, in every mode, before recovery changes anything in the dir or at
    the link's target."""
    path = _build(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "file"
    target.write_bytes(b"not yours")
    link = path / name
    if link.exists():
        link.unlink()
    link.symlink_to(target)
    (path / "00000000000000000002.log.deleted").write_bytes(b"a leftover recovery deletes")
    before = _files(path)
    with capture_logs() as logs, pytest.raises(SymlinkRefused, match=name):
        PartitionLog.open(path, state_dir=tmp_path / "state", config=CONFIG, read_only=read_only)
    assert _files(path) == before
    assert target.read_bytes() == b"not yours"
    assert _names(outside) == ["file"]
    warning = next(e for e in logs if e["event"] == "partition.symlink_refused")
    assert (warning["path"], warning["target"]) == (str(link), str(target))


@pytest.mark.parametrize(
    "name",
    ["00000000000000000018.log", "00000000000000000018.timeindex", "00000000000000000004.index"],
)
@pytest.mark.parametrize("read_only", [False, True], ids=["owner", "observe"])
def test_a_fifo_named_like_a_segment_file_is_refused_never_opened(
    tmp_path: Path, name: str, read_only: bool
) -> None:
    """A FIFO among the segment files: its open would block the process for ever (every
    log dir's cycle, and the daemon's stop with it). The partition is refused from the
    listing, in every mode, before anything is opened or changed; the first reads of a
    big start skip it too."""
    path = _build(tmp_path)
    fifo = path / name
    fifo.unlink()
    os.mkfifo(fifo)
    others = [p for p in path.iterdir() if p != fifo]
    before = {p.name: p.read_bytes() for p in others}
    result: list[BaseException] = []

    def open_it() -> None:
        try:
            PartitionLog.open(
                path, state_dir=tmp_path / "state", config=CONFIG, read_only=read_only
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            result.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(timeout=30)
    if opener.is_alive():
        with open(fifo, "wb"):  # let the blocked open go, so the process can end
            pass
        pytest.fail(f"the open of {path} blocked on the FIFO {fifo}")
    (error,) = result
    assert isinstance(error, SpecialFileRefused)
    assert f"{fifo} is not a regular file" in str(error)
    assert {p.name: p.read_bytes() for p in others} == before
    assert sorted(p.name for p in path.iterdir()) == sorted([fifo.name, *before])
    assert read_dir(str(path)) == []


def _active_log(path: Path) -> Path:
    return log_file(path, 18)


def test_truncated_active_tail_is_cut_and_logged(tmp_path: Path) -> None:
    """A partial last batch of the active segment is quarantined, cut, and logged with the
    file and the number of bytes cut."""
    path = _build(tmp_path)
    tail = encode_records([kv("x", "partial")], 20)[:40]
    with open(_active_log(path), "ab") as f:
        f.write(tail)
    with capture_logs() as logs:
        plog = _open(path)
    assert plog.corrupt is None
    assert offsets_and_values(plog) == ORIGINAL
    cut = [e for e in logs if e["event"] == "segment.tail_truncated"]
    assert len(cut) == 1
    assert cut[0]["path"] == str(_active_log(path))
    assert cut[0]["bytes_cut"] == 40
    saved = Path(cut[0]["quarantined_to"])
    assert saved.is_relative_to(tmp_path / "state" / "quarantine")
    assert saved.read_bytes() == tail


def test_a_recovery_point_past_the_log_end_is_brought_back_to_it(tmp_path: Path) -> None:
    """A recovery point checkpointed past the log end with nothing cut (an edited
    checkpoint, or one restored with other data) comes back to the log end, as in Kafka's
    loader, and the owner's open says so, naming the file: kept, it was written back, and
    offsets appended up to it would have passed for flushed after a crash. An observer
    takes the log end too, without a word (a broker may have appended since its listing)."""
    path = _build(tmp_path)
    checkpoint = path.parent / RECOVERY_POINT_OFFSET_CHECKPOINT
    OffsetCheckpointFile(checkpoint).write({TopicPartition("topic", 0): 99999})
    with capture_logs() as logs:
        observed = PartitionLog.open(path, read_only=True, config=CONFIG)
    assert (observed.log_end_offset, observed.recovery_point) == (20, 20)
    assert logs == []
    with capture_logs() as logs:
        plog = _open(path)
    assert plog.recovery_report.truncated == []
    assert (plog.recovery_point, plog.recovery_point_to_checkpoint) == (20, 20)
    (warned,) = [e for e in logs if e["event"] == "checkpoint.recovery_point_past_log_end"]
    assert warned["path"] == str(checkpoint)
    assert (warned["recovery_point"], warned["log_end_offset"]) == (99999, 20)


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="last-batch-crc"),
        pytest.param(lambda b: bytes(len(b)), id="zeros"),
    ],
)
def test_crc_failing_last_batch_or_zero_tail_is_cut(
    tmp_path: Path, mangle: Callable[[bytes], bytes]
) -> None:
    """A final batch failing its CRC with nothing after it, or a zero-filled tail, is cut."""
    path = _build(tmp_path)
    batch = encode_records([kv("x", "last")], 20)
    with open(_active_log(path), "ab") as f:
        f.write(mangle(batch))
    plog = _open(path)
    assert plog.corrupt is None
    assert plog.recovery_report.truncated[0].bytes_cut == len(batch)
    assert plog.log_end_offset == 20


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        (None, "last batch fails its CRC, zero bytes after it"),
        (8, "a batch header cut short, zero bytes after it"),
        (12, "a batch header cut short, zero bytes after it"),
        (16, "a batch header cut short, zero bytes after it"),
    ],
    ids=["half-the-batch", "base-offset", "and-length", "and-leader-epoch"],
)
@pytest.mark.parametrize("extended_to_its_end", [False, True], ids=["preallocated", "to-its-end"])
def test_a_last_batch_cut_short_before_zeros_is_cut(
    tmp_path: Path, written: int | None, reason: str, extended_to_its_end: bool
) -> None:
    """A last batch of which only a part reached a file extended past it with zeros (a
    crash mid-append, or, in a preallocated segment, `log.preallocate`, an append read
    while it happens): its first half, or only the first fields of its header (not yet
    its magic byte), is cut with the zeros, as Kafka's loader cuts it; the cut bytes are
    quarantined. Both were reported as damage and left in place (the header ones as
    'batch size 12 is below the magic 0 minimum'; an observer called the partition
    unreadable); the header ones too when the zeros end where the batch does (a file
    extended to the batch's end)."""
    path = _build(tmp_path)
    batch = encode_records([kv("x", "last" * 20)], 20)
    torn = batch[: len(batch) // 2 if written is None else written] + bytes(8000)
    if extended_to_its_end:
        torn = torn[: len(batch)]
        if written is None:  # all its bytes there, failing its CRC
            reason = "last batch fails its CRC: "
    active = _active_log(path)
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(torn)
    plog = _open(path)
    assert plog.corrupt is None
    (cut,) = plog.recovery_report.truncated
    assert (cut.position, cut.bytes_cut) == (size, len(torn))
    assert reason in cut.reason
    assert cut.quarantined_to is not None
    assert Path(cut.quarantined_to).read_bytes() == torn
    assert offsets_and_values(plog) == ORIGINAL


def _no_append(shape: str) -> bytes:
    """Bytes at offset 20 of the active segment, then zeros, that no append cut short
    writes (see the test below)."""
    batch = encode_records([kv("x", "last" * 20)], 20)
    if shape == "offset-goes-back":
        return encode_records([kv("x", "last" * 20)], 19)[:12]
    if shape == "magic-not-2":
        return batch[:16] + bytes([7])
    if shape == "epoch-without-length":
        return batch[:8] + bytes(4) + b"\x00\x00\x00\x01"
    if shape == "length-below-a-batch":
        return batch[:8] + (10).to_bytes(4, "big")
    entry = bytearray(build_legacy("aiokafka", 1, 0, [Record(20, 1000, None, bytes(40))]))
    entry[-45] ^= 1  # its timestamp: a whole entry failing its CRC, no torn write
    return bytes(entry)


@pytest.mark.parametrize(
    "shape",
    [
        "offset-goes-back",
        "magic-not-2",
        "epoch-without-length",
        "length-below-a-batch",
        "legacy-entry-failing-its-crc",
    ],
)
def test_bytes_before_zeros_that_no_append_writes_are_damage(tmp_path: Path, shape: str) -> None:
    """Bytes before zeros that are no first fields of a batch header written in order (a
    base offset not above the last one, a magic byte other than 2, a leader epoch with no
    length before it, a length no batch has, a whole legacy entry whose CRC fails) are
    reported at their position, nothing cut."""
    path = _build(tmp_path)
    active = _active_log(path)
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(_no_append(shape) + bytes(8000))
    before = active.read_bytes()
    plog = _open(path)
    assert isinstance(plog.corrupt, CorruptRecordError)
    assert plog.corrupt.position == size
    assert plog.recovery_report.truncated == []
    assert active.read_bytes() == before


@pytest.mark.parametrize(("base", "torn"), [(20, True), (3, False)])
def test_a_header_before_zeros_opening_a_segment_is_judged_by_its_base(
    tmp_path: Path, base: int, torn: bool
) -> None:
    """A new active segment holding only the first bytes of a header, then zeros: cut
    when it names the segment's base offset, damage when it names an offset below it."""
    path = _build(tmp_path)
    header = encode_records([kv("x", "first")], base)[:12]
    new = log_file(path, 20)
    new.write_bytes(header + bytes(8000))
    plog = _open(path)
    assert (plog.corrupt is None) is torn
    assert bool(plog.recovery_report.truncated) is torn


def test_an_observer_judges_an_appended_header_as_the_owner_does(tmp_path: Path) -> None:
    """Read beside its writer (read-only, the active segment growing), the first bytes of
    a header appended after what was read are judged by the offsets before them, as an
    open walking the whole segment judges them: one that goes back is damage, one that
    follows is an append in flight."""
    path = _build(tmp_path)
    active = _active_log(path)
    state = tmp_path / "state"
    plog = PartitionLog.open(path, state_dir=state, config=CONFIG, read_only=True)
    assert plog.meta().log_end_offset == 20
    good = active.read_bytes()
    for base, torn in ((19, False), (20, True)):
        active.write_bytes(good + encode_records([kv("x", "y" * 80)], base)[:12] + bytes(8000))
        if torn:
            assert plog.meta().log_end_offset == 20
        else:
            with pytest.raises(CorruptRecordError):
                plog.meta()
        owner = _open(path) if not torn else None
        assert owner is None or isinstance(owner.corrupt, CorruptRecordError)
        active.write_bytes(good)


@pytest.mark.parametrize(("base", "torn"), [(19, False), (20, True)])
def test_plan_foresees_the_cut_of_an_appended_header_only_as_the_owner_makes_it(
    tmp_path: Path, base: int, torn: bool
) -> None:
    """`plan` beside the writer (the segment read before the bytes came) foresees a cut
    of the first bytes of a header before zeros only where the owner's open makes it:
    not for one whose offset goes back, which the open reports as damage."""
    path = _build(tmp_path)
    observed = PartitionLog.open(path, config=CONFIG, read_only=True)
    assert observed.meta().log_end_offset == 20
    with open(_active_log(path), "ab") as f:
        f.write(encode_records([kv("x", "y" * 80)], base)[:12] + bytes(8000))
    assert (recovery.foreseen_torn_tail(observed.active_segment) is not None) is torn
    assert (_open(path).corrupt is None) is torn


def test_a_header_past_what_the_active_segment_holds_is_damage_to_a_writer_too(
    tmp_path: Path,
) -> None:
    """The first bytes of a header naming an offset more than 2^31 - 1 past the active
    segment's base, before zeros: damage to a writer that opened the log before they
    came, as to an open (the segment's index cannot hold it). The writer cut them."""
    path = _build(tmp_path)
    plog = _open(path)
    active = _active_log(path)
    with open(active, "ab") as f:
        f.write(encode_records([kv("x", "y" * 80)], 18 + 2**31 + 5)[:12] + bytes(8000))
    before = active.read_bytes()
    with pytest.raises(CorruptRecordError):
        plog.append([kv("z", "w")])
    assert active.read_bytes() == before


FLUSHED_DAMAGE: Final = [
    pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), "CRC mismatch", id="failing-its-crc"),
    pytest.param(lambda b: b[:-10], "runs past the end", id="cut-short"),
    pytest.param(lambda b: bytes(len(b)), "", id="zeroed"),
    pytest.param(lambda b: b[:12] + bytes(len(b) - 12), "", id="zeroed-after-its-length"),
]


@pytest.mark.parametrize(("mangle", "says"), FLUSHED_DAMAGE)
def test_a_last_batch_damaged_where_the_log_was_flushed_is_damage(
    tmp_path: Path, mangle: Callable[[bytes], bytes], says: str
) -> None:
    """A last batch at offsets the recovery point calls flushed, changed or lost on disk
    since (its bytes failing their CRC, cut short, zeroed: no append was cut short
    there, as a crash cuts only what was not flushed): the owner's open reports it at
    its position and cuts nothing, a writer refuses to append after it, and the recovery
    point it checkpoints stays, so that the next open does not take the batch for a torn
    append either. Cut, its offset would go to the next record; a cut short or zeroed one
    was cut after a crash, though a clean stop's dir reported it as damage, so the same
    bytes got two verdicts, one run after the other."""
    path = _build(tmp_path)
    batch = encode_records([kv("x", "last")], 20)
    active = _active_log(path)
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(mangle(batch))
    OffsetCheckpointFile(path.parent / RECOVERY_POINT_OFFSET_CHECKPOINT).write(
        {TopicPartition("topic", 0): 21}
    )
    before = active.read_bytes()
    plog = _open(path)
    assert isinstance(plog.corrupt, CorruptRecordError)
    assert (plog.corrupt.path, plog.corrupt.position) == (str(active), size)
    assert says in str(plog.corrupt)
    assert plog.recovery_report.truncated == []
    assert plog.recovery_point_to_checkpoint == 21
    with pytest.raises(CorruptRecordError):
        plog.append([kv("y", "new")])
    assert active.read_bytes() == before
    assert _open(path).recovery_report.truncated == []


@pytest.mark.parametrize(("recovery_point", "torn"), [(21, False), (20, True)])
def test_a_read_only_open_judges_a_bad_last_batch_as_the_owners_open(
    tmp_path: Path, recovery_point: int, torn: bool
) -> None:
    """Open read-only (`plan`, an observer), the active segment's last batch failing its
    CRC is judged by the recovery point the checkpoint names, as the owner's open judges
    it: below it, damage (the partition's snapshot says so, and nothing is foreseen cut);
    at it, an append in flight, which the owner's open will cut. Before, the read-only
    open brought the recovery point down to the end it read first, so `plan` foresaw a
    cut of a batch the owner then called damage."""
    path = _build(tmp_path)
    batch = encode_records([kv("x", "last")], 20)
    with open(_active_log(path), "ab") as f:
        f.write(batch[:-1] + bytes([batch[-1] ^ 1]))
    OffsetCheckpointFile(path.parent / RECOVERY_POINT_OFFSET_CHECKPOINT).write(
        {TopicPartition("topic", 0): recovery_point}
    )
    observed = PartitionLog.open(path, config=CONFIG, read_only=True)
    damage = observed.readable_meta().damage
    foreseen = recovery.foreseen_torn_tail(observed.active_segment)
    owner = _open(path)
    if torn:
        assert (damage, owner.corrupt) == (None, None)
        assert foreseen is not None
        assert owner.recovery_report.truncated[0].position == foreseen.position
    else:
        assert foreseen is None
        assert damage is not None
        assert "CRC mismatch" in damage
        assert isinstance(owner.corrupt, CorruptRecordError)


def test_a_flushed_tail_a_write_finds_cut_short_is_damage(tmp_path: Path) -> None:
    """A flushed last batch found cut short by a write (its bytes lost since the open) is
    damage to the write as to an open: refused, nothing cut. It was cut, and the record
    appended next took its offset."""
    path = _build(tmp_path)
    OffsetCheckpointFile(path.parent / RECOVERY_POINT_OFFSET_CHECKPOINT).write(
        {TopicPartition("topic", 0): 20}
    )
    plog = _open(path)
    assert (plog.recovery_point, plog.log_end_offset) == (20, 20)
    active = _active_log(path)
    os.truncate(active, active.stat().st_size - 10)
    before = active.read_bytes()
    with pytest.raises(CorruptRecordError, match="runs past the end"):
        plog.append([kv("new", "x")])
    assert active.read_bytes() == before
    assert plog.recovery_point == 20


def test_flipped_byte_with_data_after_is_reported_not_cut(tmp_path: Path) -> None:
    """A bad CRC followed by valid batches in the active segment is reported with file and
    position, and no file changes."""
    path = _build(tmp_path)
    active = _active_log(path)
    size = active.stat().st_size
    first = size // 2  # two equal one-record batches
    data = bytearray(active.read_bytes())
    data[first - 3] ^= 0x20
    active.write_bytes(bytes(data))
    before = _files(path)
    plog = _open(path)
    assert isinstance(plog.corrupt, CorruptRecordError)
    assert plog.corrupt.path == str(active)
    assert plog.corrupt.position == 0
    assert "CRC mismatch" in str(plog.corrupt)
    assert _files(path) == before


@pytest.mark.parametrize(
    ("batch", "value", "reason"),
    [
        (-1, 18, "base offset 18 is not above the previous batch's last offset 18"),
        (-1, -1, "negative base offset -1"),
        (0, 17, "last offset 17 is below the segment's base offset 18"),
    ],
)
def test_a_damaged_base_offset_in_the_active_segment_is_reported_not_cut(
    tmp_path: Path, batch: int, value: int, reason: str
) -> None:
    """A whole batch whose offsets are out of place is damage no CRC sees, never a torn
    append, even as the segment's last: reported with its file and position, and
    nothing cut. (The last batch was cut as if its CRC had failed.)"""
    path = _build(tmp_path)
    active = _active_log(path)
    position = set_base_offset(active, batch, value)
    before = _files(path)
    plog = _open(path)
    assert str(plog.corrupt) == f"corrupt record batch in {active} at position {position}: {reason}"
    assert not plog.recovery_report.truncated
    assert _files(path) == before


def test_a_batch_reaching_the_next_segment_is_reported(tmp_path: Path) -> None:
    """A segment walked by recovery holds offsets below the next segment's base only."""
    path = _build(tmp_path)
    segment = log_file(path, 4)
    position = set_base_offset(segment, -1, 6)
    before = _files(path)
    plog = _open(path, full_check=True)
    assert str(plog.corrupt) == (
        f"corrupt record batch in {segment} at position {position}: "
        "last offset 6 is not below the next segment's base offset 6"
    )
    assert _files(path) == before


def test_bad_length_in_the_middle_of_active_segment_is_not_a_torn_tail(tmp_path: Path) -> None:
    """A batch length pointing past the end, with valid batches after it, is corruption:
    reported, nothing cut."""
    path = _build(tmp_path)
    plog = _open(path)
    for n in range(5):
        plog.append([kv(f"a{n}", "v")])
    active = _active_log(path)
    data = bytearray(active.read_bytes())
    data[8:12] = (10_000).to_bytes(4, "big")
    active.write_bytes(bytes(data))
    before = _files(path)
    reopened = _open(path)
    assert isinstance(reopened.corrupt, CorruptRecordError)
    assert reopened.corrupt.position == 0
    assert "runs past the end" in str(reopened.corrupt)
    assert _files(path) == before


def test_corrupt_inactive_segment_reported_and_unchanged(tmp_path: Path) -> None:
    """A damaged non-active segment (even a truncated one) is reported with its file and
    position, and left byte for byte as it was."""
    path = _build(tmp_path)
    segment = log_file(path, 4)
    data = segment.read_bytes()
    segment.write_bytes(data[:-5])
    os.truncate(offset_index_file(path, 4), 0)
    before = _files(path)
    plog = _open(path, full_check=True)
    assert isinstance(plog.corrupt, CorruptRecordError)
    assert plog.corrupt.path == str(segment)
    assert plog.corrupt.position == len(data) // 2
    assert _files(path) == before


def test_index_past_log_reported_and_unchanged(tmp_path: Path) -> None:
    """An offset index pointing past the end of its log is reported; no file changes."""
    config = LogConfig(index_interval_bytes=0)
    plog = build_log(
        tmp_path / "logs",
        [[[kv(f"k{i}", "v")] for i in range(6)], [[kv("z", "1")]]],
        state_dir=tmp_path / "state",
        config=config,
    )
    first = plog.segments[0]
    sizes = [info.size for info in first.batches()]
    os.truncate(first.log_path, sum(sizes[:3]))
    before = _files(plog.dir)
    reopened = PartitionLog.open(plog.dir, state_dir=tmp_path / "state", config=config)
    assert isinstance(reopened.corrupt, IndexPastLogError)
    assert reopened.corrupt.path == str(first.offset_index_path)
    assert "past the end of the log" in str(reopened.corrupt)
    assert _files(plog.dir) == before


def test_missing_indexes_rebuilt(tmp_path: Path) -> None:
    """Missing index files are rebuilt from the log, identical to the originals."""
    path = _build(tmp_path)
    originals = {p: p.read_bytes() for p in path.glob("*.index")}
    for p in originals:
        p.unlink()
    plog = _open(path)
    assert len(plog.recovery_report.rebuilt_indexes) == 10
    assert {p: p.read_bytes() for p in originals} == originals


def test_read_only_open_changes_nothing(tmp_path: Path) -> None:
    """Opening read-only (observe mode) never touches leftovers or tails."""
    path = _build(tmp_path)
    _stage3(path)
    with open(_active_log(path), "ab") as f:
        f.write(b"\x00" * 10)
    before = _files(path)
    plog = PartitionLog.open(path, read_only=True, config=CONFIG)
    assert plog.read_only
    assert _files(path) == before


def test_real_kafka_partition_loads(kafka_real: Path) -> None:
    """The broker-written partition (no index files) loads and validates."""
    path = kafka_real / "kraft-combined-logs" / "foo-0"
    plog = PartitionLog.open(path, state_dir=kafka_real / "state", full_check=True)
    assert plog.corrupt is None
    assert [r.value for r in plog.records()] == [b"Hello World!"]
    assert plog.meta().segments[0].first_batch_timestamp_ms == 1726045973899


@pytest.mark.parametrize("damage", ["entry off a batch boundary", "timestamp past the log's"])
def test_indexes_that_disagree_with_the_log_are_rebuilt(tmp_path: Path, damage: str) -> None:
    """The walk that checks the CRCs checks each index entry against the batches too: a
    disagreeing index is rebuilt, byte for byte what the log says."""
    batches = [[kv(f"k{i}", "v" * 40)] for i in range(30)]
    plog = build_log(
        tmp_path / "logs", [batches, [[kv("z", "1")]]], state_dir=tmp_path / "state", config=CONFIG
    )
    first = plog.segments[0]
    originals = {p: p.read_bytes() for p in (first.offset_index_path, first.time_index_path)}
    assert len(originals[first.offset_index_path]) >= 16  # entries to damage
    if damage == "entry off a batch boundary":
        path, data = first.offset_index_path, bytearray(originals[first.offset_index_path])
        data[12:16] = (int.from_bytes(data[12:16], "big") + 1).to_bytes(4, "big")
    else:
        path, data = first.time_index_path, bytearray(originals[first.time_index_path])
        data[-12:-4] = (2**62).to_bytes(8, "big")
    path.write_bytes(bytes(data))
    reopened = _open(plog.dir, full_check=True)
    assert reopened.corrupt is None
    assert reopened.recovery_report.rebuilt_indexes == [str(first.log_path)]
    assert {p: p.read_bytes() for p in originals} == originals


@pytest.mark.parametrize("damage", ["emptied", "cut short"])
def test_a_time_index_behind_its_log_is_rebuilt(tmp_path: Path, damage: str) -> None:
    """A time index whose last timestamp is below the batches' before the last offset
    entry (each offset entry was written with the largest timestamp so far): emptied,
    or cut short by entries. The check after a crash took it as sound, and the segment
    was dated hours too old by retention; it is rebuilt, byte for byte what the log
    says."""
    batches = [[kv(f"k{i}", "v" * 40, timestamp=1000 + i)] for i in range(30)]
    plog = build_log(
        tmp_path / "logs", [batches, [[kv("z", "1")]]], state_dir=tmp_path / "state", config=CONFIG
    )
    first = plog.segments[0]
    original = first.time_index_path.read_bytes()
    assert len(original) >= 3 * 12  # entries to cut
    first.time_index_path.write_bytes(b"" if damage == "emptied" else original[:-24])
    reopened = _open(plog.dir, full_check=True)
    assert reopened.corrupt is None
    assert reopened.recovery_report.rebuilt_indexes == [str(first.log_path)]
    assert first.time_index_path.read_bytes() == original


@pytest.mark.parametrize(("recovery_point", "damage"), [(0, False), (11, False), (15, True)])
def test_active_index_entries_a_crash_left_past_the_log_end(
    tmp_path: Path, recovery_point: int, damage: bool
) -> None:
    """A broker's truncation (`truncateTo`: the `.log` cut at a batch, the entries past
    the cut left in the preallocated index, their count in memory only), then a crash:
    entries past the active segment's end that name offsets at or above the recovery
    point index batches never flushed, and the indexes are rebuilt, as Kafka's recovery
    rebuilds them; the partition was uncleanable. With the recovery point past the
    log's end, flushed batches are missing: damage, and nothing changes."""
    batches = [[kv(f"k{i}", "v" * 40)] for i in range(20)]
    plog = build_log(
        tmp_path / "logs", [[[kv("a", "1")]], batches], state_dir=tmp_path / "state", config=CONFIG
    )
    active = plog.segments[-1]
    assert active.offset_index.entries >= 4
    sizes = [info.size for info in active.batches()]
    os.truncate(active.log_path, sum(sizes[:10]))  # offsets 1..10 stay, 11..20 are cut
    OffsetCheckpointFile(plog.dir.parent / RECOVERY_POINT_OFFSET_CHECKPOINT).write(
        {TopicPartition("topic", 0): recovery_point}
    )
    before = _files(plog.dir)
    reopened = _open(plog.dir)
    if damage:
        assert isinstance(reopened.corrupt, IndexPastLogError)
        assert _files(plog.dir) == before
        return
    assert reopened.corrupt is None
    assert reopened.recovery_report.rebuilt_indexes == [str(active.log_path)]
    assert reopened.active_segment.next_offset == 11
    assert [r.offset for r in reopened.records(5)][:2] == [5, 6]


@pytest.mark.parametrize("which", [0, -1], ids=["old", "active"])
def test_an_index_of_garbage_is_rebuilt_after_a_crash(tmp_path: Path, which: int) -> None:
    """An offset index out of order whose last entry points past the log's end (garbage
    written over it): the full check after a crash rebuilds it, as the cheap check does
    (its order is checked first). It was damage, the partition uncleanable, while a
    clean stop's open rebuilt the same file."""
    batches = [[kv(f"k{i}", "v" * 40)] for i in range(20)]
    plog = build_log(
        tmp_path / "logs", [batches, batches], state_dir=tmp_path / "state", config=CONFIG
    )
    segment = plog.segments[which]
    entries = ((5, 300), (3, 100), (19, 10**9))  # relative offset, position
    segment.offset_index_path.write_bytes(b"".join(struct.pack(">ii", *e) for e in entries))
    reopened = _open(plog.dir)
    assert reopened.corrupt is None
    assert reopened.recovery_report.rebuilt_indexes == [str(segment.log_path)]
    assert [r.offset for r in reopened.records()] == list(range(40))


def test_a_quarantine_that_fails_names_its_file_and_cuts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk under the state dir while a torn tail is copied there fails the open
    with an error naming the quarantine file, the segment and the step, and the tail is
    not cut (it said only "[Errno 28] No space left on device")."""
    path = _build(tmp_path)
    active = _active_log(path)
    with open(active, "ab") as f:
        f.write(encode_records([kv("x", "partial")], 20)[:40])
    before = active.read_bytes()

    def full(target: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(recovery, "atomic_write", full)
    with pytest.raises(FileStepError) as caught:
        _open(path)
    text = str(caught.value)
    assert text.startswith("No space left on device (ENOSPC) while quarantining the torn tail")
    assert str(active) in text
    assert str(tmp_path / "state" / "quarantine") in text
    assert caught.value.no_space
    assert active.read_bytes() == before


def _batches_of_three(tmp_path: Path) -> tuple[PartitionLog, list[tuple[int, int, int]]]:
    """A closed segment of ten 3-record batches (and an active one); its batches as
    (position, base offset, last offset)."""
    batches = [[kv(f"k{3 * i + j}", "v" * 30) for j in range(3)] for i in range(10)]
    plog = build_log(
        tmp_path / "logs", [batches, [[kv("z", "1")]]], state_dir=tmp_path / "state", config=CONFIG
    )
    t = walk(plog.segments[0].log_path.read_bytes()).table
    found = zip(t.position.tolist(), t.base_offset.tolist(), t.last_offset.tolist(), strict=True)
    return plog, list(found)


def _write_index(plog: PartitionLog, entries: list[tuple[int, int]]) -> bytes:
    index = OffsetIndex(plog.segments[0].offset_index_path, 0)
    for offset, position in entries:
        index.append(offset, position)
    index.write()
    return plog.segments[0].offset_index_path.read_bytes()


@pytest.mark.parametrize("broker", ["0.11 to 1.1: first offset", "2.0 on, follower: last offset"])
def test_index_entries_a_broker_wrote_are_not_damage(tmp_path: Path, broker: str) -> None:
    """Brokers before 2.0 indexed the first offset of what one append wrote, so an entry's
    offset is the base offset of the batch at its position; a follower's append holds
    many batches, so an entry's offset is the last offset of a later batch than the one
    at its position. A lookup by either is right (it scans forward from the position):
    the segment is read, read-only (a plan beside a broker), and its index is kept by
    a full check. The first was taken for damage (the partition was unreadable); the
    second, accepted before too, is kept here as the rule's other side."""
    plog, batches = _batches_of_three(tmp_path)
    if broker.startswith("0.11"):
        entries = [(base, position) for position, base, _ in batches[2::3]]
    else:
        entries = [(batches[i + 2][2], batches[i][0]) for i in (2, 5)]
    index = _write_index(plog, entries)
    read_only = PartitionLog.open(plog.dir, read_only=True, config=CONFIG)
    assert read_only.meta().segments[0].next_offset == 30
    reopened = _open(plog.dir, full_check=True)
    assert reopened.corrupt is None
    assert reopened.recovery_report.rebuilt_indexes == []
    assert plog.segments[0].offset_index_path.read_bytes() == index
    assert [r.offset for r in reopened.records(13)][:2] == [13, 14]


@pytest.mark.parametrize("wrong", ["below its batch", "past the log"])
def test_an_index_entry_off_its_batch_is_still_damage(tmp_path: Path, wrong: str) -> None:
    """An entry whose offset is below the base offset of the batch at its position (a
    lookup would skip offsets), or past the log's last, is rebuilt by a full check."""
    plog, batches = _batches_of_three(tmp_path)
    position = batches[4][0]
    offset = batches[4][1] - 1 if wrong == "below its batch" else 30
    _write_index(plog, [(offset, position)])
    reopened = _open(plog.dir, full_check=True)
    assert reopened.corrupt is None
    assert reopened.recovery_report.rebuilt_indexes == [str(plog.segments[0].log_path)]


@pytest.mark.parametrize("lost", ["file", "entry"])
@pytest.mark.parametrize(
    "recovery_point", [None, 2, 3], ids=["no-snapshot", "snapshot", "recovery-point-inside"]
)
def test_a_txnindex_a_crash_left_short_is_rebuilt_from_the_log(
    tmp_path: Path, lost: str, recovery_point: int | None
) -> None:
    """The owner's open after a crash rebuilds the `.txnindex` of the segments it
    recovers from their markers, as Kafka's recovery does (an abort's entry is appended
    after its marker: a crash between the two loses it, or the whole file): the aborted
    transaction of producer 7, open since the segment before (its state from a snapshot
    at that segment's base, or from the log's start), is indexed again, with the LSO of
    producer 8's transaction still open then; so too when the recovery point lies inside
    the segment, before its markers. A read-only open changes nothing."""
    b = LogBuilder(tmp_path / "logs")
    b.append([(b"k", b"good")])
    b.append([(b"k", b"ABORTED")], pid=7, txn=True)  # 1
    b.roll()
    b.append([(b"j", b"open")], pid=8, txn=True)  # 2
    b.append([(b"k", b"more")], pid=7, txn=True)  # 3
    b.marker(7, ControlRecordType.ABORT)  # 4
    b.append([(b"j", b"x")], pid=9, txn=True)  # 5
    b.marker(9, ControlRecordType.ABORT)  # 6
    path = b.write()
    index = path / "00000000000000000002.txnindex"
    expected = [AbortedTxn(1, 7, 4, 2), AbortedTxn(5, 9, 6, 2)]
    assert len(TransactionIndex.load(index, 2).entries) == 2
    if lost == "file":
        index.unlink()
    else:
        os.truncate(index, index.stat().st_size - TXN_ENTRY.size)
    if recovery_point is not None:  # only the second segment is recovered (or its end)
        at_two = ProducerState(2, {7: ProducerEntry(7, epoch=0, txn_first_offset=1)})
        write_snapshot(path, at_two, log_start_offset=0)
        OffsetCheckpointFile(path.parent / RECOVERY_POINT_OFFSET_CHECKPOINT).write(
            {TopicPartition("t", 0): recovery_point}
        )
    before = index.read_bytes() if index.exists() else None
    PartitionLog.open(path, config=CONFIG, read_only=True)
    assert (index.read_bytes() if index.exists() else None) == before
    with capture_logs() as logs:
        plog = _open(path)
    assert plog.corrupt is None
    assert TransactionIndex.load(index, 2).entries == expected
    assert plog.collect_aborted_transactions(0, 7) == expected
    (rebuilt,) = [e for e in logs if e["event"] == "segment.txn_index_rebuilt"]
    assert rebuilt["path"] == str(index)
