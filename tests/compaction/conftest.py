"""Builders for the cleaner's tests: partition dirs written batch by batch, read back,
and cleaned with a small real OffsetMap.

`LogBuilder` mirrors Kafka's LogCleanerTest helpers: one record per batch unless told,
producers with sequences, transactions closed by COMMIT/ABORT markers (an ABORT adds the
aborted transaction to the segment's `.txnindex`), explicit rolls. Offsets and the
indexes are Kafka's (index interval rule from `cleanerd.log.index`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cleanerd.compaction.cleaner import Cleaner, CleanerConfig, CleanResult
from cleanerd.compaction.offset_map import OffsetMap
from cleanerd.compaction.swap import FileOps
from cleanerd.log.files import (
    TopicPartition,
    log_file,
    offset_index_file,
    time_index_file,
    txn_index_file,
)
from cleanerd.log.index import IndexBuilder, OffsetIndex, TimeIndex
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.txnindex import AbortedTxn, TransactionIndex
from cleanerd.records.batch import RecordBatch, decode_batch, encode_batch
from cleanerd.records.control import ControlRecordType, encode_end_txn_marker
from cleanerd.records.header import Compression, unpack_header
from cleanerd.records.record import Record, RecordHeader
from cleanerd.records.walker import scan_batches, walk

TP = TopicPartition("t", 0)
DAY = 86_400_000
LONG_MAX = 2**63 - 1
T = LONG_MAX - DAY - 1  # Kafka's "large cleaning time"
T2 = T + DAY + 1  # after the horizon T stamps

KV = tuple[bytes | None, bytes | None]


def k(n: int | str) -> bytes:
    return str(n).encode()


@dataclass
class _Segment:
    base: int
    batches: list[bytes] = field(default_factory=list)
    aborted: list[AbortedTxn] = field(default_factory=list)


class LogBuilder:
    """Writes one partition dir `<root>/t-0`; `write()` puts the files on disk."""

    def __init__(self, root: Path, *, index_interval: int = 4096) -> None:
        self.root = root
        self.dir = root / str(TP)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index_interval = index_interval
        self.segments = [_Segment(0)]
        self.next_offset = 0
        self.sequences: dict[int, int] = {}
        self.open_txn: dict[int, int] = {}
        self.timestamp = 1000

    def append(
        self,
        kvs: Sequence[KV],
        *,
        pid: int = -1,
        epoch: int = 0,
        txn: bool = False,
        codec: Compression = Compression.NONE,
        timestamps: Sequence[int] | None = None,
        headers: Sequence[tuple[RecordHeader, ...]] | None = None,
        offset: int | None = None,
        sequence: int | None = None,
        leader_epoch: int = -1,
    ) -> tuple[int, int]:
        """Append one batch of `kvs`; returns (base offset, last offset)."""
        base = self.next_offset if offset is None else offset
        records = []
        for i, (key, value) in enumerate(kvs):
            ts = self.timestamp if timestamps is None else timestamps[i]
            hdrs = () if headers is None else headers[i]
            records.append(Record(base + i, ts, key, value, hdrs))
            self.timestamp += 1
        seq = -1
        if pid >= 0:
            seq = self.sequences.get(pid, 0) if sequence is None else sequence
            self.sequences[pid] = seq + len(kvs)
        if txn and pid not in self.open_txn:
            self.open_txn[pid] = base
        self.segments[-1].batches.append(
            encode_batch(
                records,
                base_offset=base,
                compression=codec,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                is_transactional=txn,
                partition_leader_epoch=leader_epoch,
            )
        )
        self.next_offset = base + len(kvs)
        return base, self.next_offset - 1

    def records(self, kvs: Sequence[KV], **kw: object) -> list[int]:
        """Append each of `kvs` as its own batch; returns the offsets."""
        return [self.append([kv], **kw)[0] for kv in kvs]  # type: ignore[arg-type]

    def marker(self, pid: int, kind: ControlRecordType, *, epoch: int = 0) -> int:
        """Append a COMMIT or ABORT marker for `pid`; returns its offset."""
        offset = self.next_offset
        record = encode_end_txn_marker(kind, 0, offset=offset, timestamp=self.timestamp)
        self.timestamp += 1
        self.segments[-1].batches.append(
            encode_batch(
                [record],
                base_offset=offset,
                producer_id=pid,
                producer_epoch=epoch,
                is_transactional=True,
                is_control=True,
            )
        )
        first = self.open_txn.pop(pid, None)
        if kind is ControlRecordType.ABORT and first is not None:
            self.segments[-1].aborted.append(AbortedTxn(first, pid, offset, offset + 1))
        self.next_offset = offset + 1
        return offset

    def commit(self, pid: int, *, epoch: int = 0) -> int:
        return self.marker(pid, ControlRecordType.COMMIT, epoch=epoch)

    def abort(self, pid: int, *, epoch: int = 0) -> int:
        return self.marker(pid, ControlRecordType.ABORT, epoch=epoch)

    def roll(self, base: int | None = None) -> None:
        """Start a new segment at `base` (default: the log end offset)."""
        new_base = self.next_offset if base is None else base
        self.segments.append(_Segment(new_base))
        self.next_offset = new_base

    def write(self) -> Path:
        """Write every segment's files; returns the partition dir."""
        for seg in self.segments:
            data = b"".join(seg.batches)
            log_file(self.dir, seg.base).write_bytes(data)
            oi = OffsetIndex(offset_index_file(self.dir, seg.base), seg.base)
            ti = TimeIndex(time_index_file(self.dir, seg.base), seg.base)
            builder = IndexBuilder(oi, ti, self.index_interval)
            for info in scan_batches(data):
                builder.add_batch(info.position, info.size, info.last_offset, info.max_timestamp)
            if seg is not self.segments[-1]:
                builder.finish()
            offset_index_file(self.dir, seg.base).write_bytes(oi.to_bytes())
            time_index_file(self.dir, seg.base).write_bytes(ti.to_bytes())
            if seg.aborted:
                txn_index_file(self.dir, seg.base).write_bytes(
                    b"".join(t.to_bytes() for t in seg.aborted)
                )
        return self.dir


def segment_metas(dir_path: Path) -> list[SegmentMeta]:
    """The partition's segments as the cleaner needs them (ascending)."""
    bases = sorted(int(p.name.split(".")[0]) for p in dir_path.glob("*.log"))
    metas = []
    for base in bases:
        path = log_file(dir_path, base)
        data = path.read_bytes()
        infos = walk(data, verify_crc=False).table.infos()
        st = path.stat()
        oi = offset_index_file(dir_path, base)
        ti = time_index_file(dir_path, base)
        metas.append(
            SegmentMeta(
                base_offset=base,
                next_offset=infos[-1].next_offset if infos else base,
                size_bytes=len(data),
                largest_timestamp_ms=max((i.max_timestamp for i in infos), default=-1),
                first_batch_timestamp_ms=infos[0].max_timestamp if infos else None,
                offset_index_bytes=oi.stat().st_size if oi.exists() else 0,
                time_index_bytes=ti.stat().st_size if ti.exists() else 0,
                last_modified_ms=st.st_mtime_ns // 1_000_000,
                inode=st.st_ino,
            )
        )
    return metas


def read_batches(dir_path: Path) -> list[RecordBatch]:
    """Every batch of the partition, decoded with CRC checks, in segment order."""
    out = []
    for meta in segment_metas(dir_path):
        data = log_file(dir_path, meta.base_offset).read_bytes()
        out += [decode_batch(data, info.position) for info in scan_batches(data)]
    return out


@dataclass(frozen=True)
class LogView:
    """What Kafka's LogCleanerTest asserts on."""

    keys: list[bytes]
    """Keys of data records with a value."""
    offsets: list[int]
    """Offsets of records with a key and a value (control records included)."""
    last_offsets: list[int]
    """Every batch's last offset."""
    bases: list[int]
    """Every batch's base offset."""


def view(dir_path: Path) -> LogView:
    keys, offsets, lasts, bases = [], [], [], []
    for b in read_batches(dir_path):
        lasts.append(b.header.last_offset)
        bases.append(b.header.base_offset)
        for r in b.records:
            if r.key is not None and r.value is not None:
                offsets.append(r.offset)
                if not b.header.is_control:
                    keys.append(r.key)
    return LogView(keys, offsets, lasts, bases)


def active_base(dir_path: Path) -> int:
    return segment_metas(dir_path)[-1].base_offset


def clean(
    dir_path: Path,
    *,
    first_dirty: int = 0,
    first_uncleanable: int | None = None,
    now_ms: int = T,
    slots: int = 1024,
    load_factor: float = 0.75,
    config: CleanerConfig | None = None,
    ops: FileOps | None = None,
    offset_map: OffsetMap | None = None,
) -> CleanResult:
    """One pass with a map of `slots` entries (Kafka's fake map: load factor 0.75)."""
    # Kafka's tests clean at a far-future time T with producer state from a mock clock, so
    # no producer expires there: the default here never expires producers either.
    cfg = (
        config
        if config is not None
        else CleanerConfig(segment_bytes=1024 * 1024, producer_id_expiration_ms=LONG_MAX)
    )
    m = offset_map
    if m is None:
        m = OffsetMap(
            slots * 24 if not cfg.strategy.versioned else slots * 32,
            load_factor=load_factor,
            strategy=cfg.strategy.strategy,
        )
    cleaner = Cleaner(m, ops=ops)
    return cleaner.clean(
        log_dir=dir_path.parent,
        tp=TP,
        segments=segment_metas(dir_path),
        first_dirty=first_dirty,
        first_uncleanable=active_base(dir_path) if first_uncleanable is None else first_uncleanable,
        now_ms=now_ms,
        config=cfg,
    )


def aborted_txns(dir_path: Path) -> list[AbortedTxn]:
    """Every `.txnindex` entry of the partition, in segment order."""
    out: list[AbortedTxn] = []
    for meta in segment_metas(dir_path):
        path = txn_index_file(dir_path, meta.base_offset)
        if path.exists():
            out += TransactionIndex.load(path, meta.base_offset).entries
    return out


def last_sequences(dir_path: Path) -> dict[int, int]:
    """Each producer's last sequence as the batch headers left it."""
    out: dict[int, int] = {}
    for meta in segment_metas(dir_path):
        data = log_file(dir_path, meta.base_offset).read_bytes()
        for info in scan_batches(data):
            h = unpack_header(data, info.position)
            if h.producer_id >= 0 and not h.is_control:
                out[h.producer_id] = h.last_sequence
    return out


@pytest.fixture(name="log")
def _log(tmp_path: Path) -> LogBuilder:
    return LogBuilder(tmp_path / "logs")


def touch_all(dir_path: Path, ns: int) -> None:
    for p in dir_path.iterdir():
        os.utime(p, ns=(ns, ns))
