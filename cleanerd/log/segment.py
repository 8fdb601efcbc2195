"""One log segment: a `.log` file of record batches and its three indexes (Kafka's
LogSegment).

Files (see `files.py` for names; `suffix` is "" or a rewrite state such as `.cleaned`)::

    <base>.log<suffix>        record batches back to back, offsets >= base
    <base>.index<suffix>      offset index, trimmed (see index.py)
    <base>.timeindex<suffix>  time index, trimmed
    <base>.txnindex<suffix>   aborted transactions, only when there are some

Nothing is loaded eagerly: the size comes from `stat`, the next offset and max
timestamp from the indexes' last entries plus a scan of the bytes after the last
offset-index entry (at most about `index.interval.bytes` plus one batch), and reads map
the file (`mmap`) for the duration of one iteration. A 1 GiB segment costs a few
kilobytes of reads to open. A small segment with no offset-index entry (a quiet topic's)
is read whole instead, once, for all of its metadata, with no index read. Appends after
a reopen continue the interval count from the last entry's position, so the index of a
segment written across reopens (or by several processes) equals a rebuild from its log;
Kafka restarts the count at zero on reopen, which gives a different but equally valid
index.

Crash consistency of an append: the batch bytes are written at the end of the `.log`
first, then the index entries they earned are appended to the index files. A crash in
between leaves an index without its newest entry (still correct: lookups scan forward);
a failed write is cut back off the `.log` so no partial batch stays behind. `flush`
fsyncs all files; `close_for_roll` writes the final time-index entry first, so a rolled
segment's files are exactly what Kafka leaves when it rolls.

`sanity_check` is the cheap load-time check (Kafka checks nothing more on a clean start):
index entries ordered, the last offset-index entry on a batch boundary inside the log,
the bytes after it a whole number of valid batches. An index that points past the end
of the log means the log lost bytes: that is reported (`IndexPastLogError`), never
papered over by a rebuild. Any other index problem, or a missing index, is rebuilt from
the log. Full CRC validation of every batch is `recovery.py`'s job.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from cleanerd.errors import (
    CorruptIndexError,
    CorruptRecordError,
    FileChangedError,
    failure_text,
    file_step,
)
from cleanerd.log.files import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    filename_prefix_from_offset,
    segment_file,
)
from cleanerd.log.fsutil import adopt_owner, fsync_dir, fsync_file, safe_unlink
from cleanerd.log.index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    DEFAULT_MAX_INDEX_SIZE,
    IndexBuilder,
    IndexPastLogError,
    OffsetIndex,
    OffsetPosition,
    TimeIndex,
    TimestampOffset,
)
from cleanerd.log.known_segments import KnownSegment
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.tail import torn_tail_reason
from cleanerd.log.txnindex import AbortedTxn, TransactionIndex, TxnIndexSearchResult
from cleanerd.logger import get_logger
from cleanerd.records.batch import iter_records
from cleanerd.records.header import INT32_MAX, NO_TIMESTAMP, Buffer
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo
from cleanerd.records.walker import (
    BatchTable,
    OffsetRange,
    Summary,
    Walk,
    Walker,
    as_uint8,
    scan_batches,
    summarize,
    walk,
    walk_prefix,
)

log = get_logger(__name__)

_PREAD_SPAN = 1 << 18
"""Spans of a `.log` up to this size are read with `pread` rather than mapped. The
crossover, measured on a page-cached file (read, then every page touched): 2 us against
11 us at 2 KiB, 11 against 16 at 256 KiB, 101 against 39 at 1 MiB, where `pread`'s fresh
buffer costs a page fault per 4 KiB and a copy that a mapping's fault-around avoids."""

_HEAD_READ = 1 << 16
"""The read that finds a segment's first batch: a whole producer batch, usually."""


def _close(it: Iterator[BatchInfo]) -> None:
    """Finish a scan generator now, so no view of a buffer outlives its mmap."""
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _close_mapping(buf: mmap.mmap, *, failing: bool = False) -> None:
    """Close `buf`. A view of it that only a reference cycle still holds (numba keeps
    the arguments of a call that compiled a kernel in one: the first call after an
    install, with an empty cache) is collected first, instead of failing the read. When
    the read is `failing` (an exception on its way out, whose traceback holds the frames
    that decoded the bytes, a bad batch's), a view still alive after that is the
    exception's: the mapping is left to close when it goes, rather than the error that
    explains the read being replaced by this one."""
    try:
        buf.close()
    except BufferError:
        gc.collect()
        with contextlib.suppress(BufferError) if failing else contextlib.nullcontext():
            buf.close()


class LogSegment:
    """A segment of a partition log, opened lazily; see the module docstring."""

    def __init__(
        self,
        dir_path: Path,
        base_offset: int,
        *,
        suffix: str = "",
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        max_index_size: int = DEFAULT_MAX_INDEX_SIZE,
        read_only: bool = False,
    ) -> None:
        self.dir = dir_path
        self.base_offset = base_offset
        self.offsets = OffsetRange(0, max(0, base_offset))
        """The offsets its batches may have, as far as a segment knows: from its base
        offset up (below the next segment's base offset too, and within 2^31 - 1 of its
        own while it is the active one, which its log checks)."""
        self.suffix = suffix
        self.index_interval_bytes = index_interval_bytes
        self.max_index_size = max_index_size
        self.read_only = read_only
        self.growing = False
        """Another writer may be appending to it now: the active segment of a partition
        open read-only beside a live broker. Only then is a torn tail an append in
        flight that ends the segment for now; in any other segment it is corruption."""
        self.flushed_to = 0
        """A growing segment's: the recovery point its partition's checkpoint names (see
        `tail.torn_tail_reason`)."""
        self._paths: dict[str, Path] = {}
        # Strs, not Paths, for this object's own syscalls: building Paths for 100,000
        # segments costs more than the syscalls (a Path comes when a caller asks).
        self._stem = os.path.join(dir_path, filename_prefix_from_offset(base_offset))  # noqa: PTH118
        st = self._stat(LOG_FILE_SUFFIX)
        self._size, self.inode = st.st_size, st.st_ino
        self._mtime_ns: int | None = st.st_mtime_ns
        self._reset_caches()

    @property
    def live(self) -> bool:
        """Read-only and `growing`: a broker may be writing it now (appending, or cutting
        it with `truncateTo`), so what was read of it may no longer be so."""
        return self.read_only and self.growing

    def _reset_caches(self) -> None:
        self._meta: SegmentMeta | None = None
        self.delete_horizon: tuple[int, int] | None = None
        """(earliest KIP-534 delete horizon, batches carrying one) once known: from a walk
        of the whole file for its metadata, for the producer state or by the open's
        validation (`recovery.ProducerFold`), a scan by the compaction layer
        (`compaction/horizon.py`) or a clean stop's `known_segments`; None until then."""
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._txn_index: TransactionIndex | None = None
        self._builder: IndexBuilder | None = None
        self._stale_index = False  # a live segment's index disagrees with it: not used
        self._next_offset: int | None = None
        self._first: tuple[int | None] | None = None  # (first batch's max timestamp,)
        self._index_bytes: tuple[int, int] | None = None  # known without loading them
        self._summary: tuple[int, int, int] | None = None  # end, without a builder
        self._appended_from: tuple[int, tuple[int, int, int]] | None = None

    @classmethod
    def create(
        cls,
        dir_path: Path,
        base_offset: int,
        *,
        suffix: str = "",
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
        max_index_size: int = DEFAULT_MAX_INDEX_SIZE,
        like: Path | None = None,
    ) -> LogSegment:
        """Create an empty segment: empty index files first, then the `.log` (a crash in
        between leaves orphan indexes, which recovery deletes as Kafka does, and which a
        retried create empties). An existing `.log` is never overwritten. Each file takes
        the bits and group of `like` (the segment before), else of the partition dir
        (`fsutil.adopt_owner`)."""
        log_path = segment_file(dir_path, base_offset, LOG_FILE_SUFFIX, suffix)
        if log_path.exists():
            raise FileExistsError(f"segment {log_path} already exists")
        for kind in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
            _create_empty(segment_file(dir_path, base_offset, kind, suffix), like, os.O_TRUNC)
        _create_empty(log_path, like, os.O_EXCL)
        return cls(
            dir_path,
            base_offset,
            suffix=suffix,
            index_interval_bytes=index_interval_bytes,
            max_index_size=max_index_size,
        )

    # -- paths and plain properties ------------------------------------------------

    def _os_path(self, kind: str) -> str:
        return self._stem + kind + self.suffix

    def _stat(self, kind: str) -> os.stat_result:
        return os.stat(self._os_path(kind))  # noqa: PTH116

    def _file(self, kind: str) -> Path:
        # Paths are built once per kind and suffix: a cycle over 100,000 segments asks
        # for them millions of times.
        path = self._paths.get(kind)
        if path is None:
            path = self._paths[kind] = Path(self._os_path(kind))
        return path

    @property
    def log_path(self) -> Path:
        """The `.log` file."""
        return self._file(LOG_FILE_SUFFIX)

    @property
    def offset_index_path(self) -> Path:
        """The `.index` file."""
        return self._file(INDEX_FILE_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        """The `.timeindex` file."""
        return self._file(TIME_INDEX_FILE_SUFFIX)

    @property
    def txn_index_path(self) -> Path:
        """The `.txnindex` file (may not exist)."""
        return self._file(TXN_INDEX_FILE_SUFFIX)

    @property
    def paths(self) -> tuple[Path, Path, Path, Path]:
        """The four files of the segment (some may not exist)."""
        return (self.log_path, self.offset_index_path, self.time_index_path, self.txn_index_path)

    @property
    def size(self) -> int:
        """Bytes in the `.log` file."""
        return self._size

    @property
    def last_modified_ms(self) -> int:
        """mtime of the `.log` file, in milliseconds: as of the last `stat` (at open and
        at each `refresh`), or read again after this process wrote the file."""
        if self._mtime_ns is None:
            self._mtime_ns = self._stat(LOG_FILE_SUFFIX).st_mtime_ns
        return self._mtime_ns // 1_000_000

    @property
    def identity(self) -> tuple[int, int, int]:
        """(inode, size, mtime in ns) of the `.log` as last seen: which file, and whether
        it changed (a cache key for what is derived from its bytes)."""
        self.last_modified_ms  # noqa: B018 - reads the mtime if it is not known
        assert self._mtime_ns is not None
        return (self.inode, self._size, self._mtime_ns)

    def known(self) -> KnownSegment | None:
        """What is known of the file without reading it again (its metadata once read),
        for `known_segments.py`; None before it was read."""
        summary = self._end_summary()
        if self._meta is None or summary is None or self._appended_from is not None:
            return None
        meta = self._meta
        return KnownSegment(
            self.base_offset,
            self.identity,
            *summary,
            meta.first_batch_timestamp_ms,
            meta.offset_index_bytes,
            meta.time_index_bytes,
            self.delete_horizon,
        )

    def indexes_as_known(self, known: KnownSegment) -> bool:
        """Whether `known` describes this very `.log` (inode, size, mtime) and both index
        files still have the sizes it recorded (two `stat`s, nothing read): the segment
        as cleanerd kept it (at its clean stop or between cycles), when it had opened and
        checked it, or trusted it as Kafka's loader does."""
        if known.base_offset != self.base_offset or known.identity != self.identity:
            return False
        return self._index_sizes() == (known.offset_index_bytes, known.time_index_bytes)

    def _index_sizes(self) -> tuple[int, int] | None:
        """(offset index, time index) file sizes from two `stat`s; None if one is missing."""
        try:
            return (
                self._stat(INDEX_FILE_SUFFIX).st_size,
                self._stat(TIME_INDEX_FILE_SUFFIX).st_size,
            )
        except FileNotFoundError:
            return None

    @property
    def unread(self) -> bool:
        """Nothing is known of the bytes yet (not read, seeded, written or appended to)."""
        return (
            self._meta is None
            and self._summary is None
            and self._builder is None
            and self._appended_from is None
        )

    def seed(self, known: KnownSegment) -> bool:
        """Take `known` as this segment's metadata if it describes this very file (same
        inode, size and mtime); whether it did. Nothing is read."""
        if known.base_offset != self.base_offset or known.identity != self.identity:
            return False
        self._summary = (known.next_offset, known.max_timestamp, known.offset_of_max_timestamp)
        self._next_offset = known.next_offset
        self._first = (known.first_batch_timestamp,)
        self.delete_horizon = known.delete_horizon
        last_modified_ms = self.last_modified_ms
        self._meta = SegmentMeta(
            base_offset=self.base_offset,
            next_offset=known.next_offset,
            size_bytes=self._size,
            largest_timestamp_ms=(
                known.max_timestamp if known.max_timestamp >= 0 else last_modified_ms
            ),
            first_batch_timestamp_ms=known.first_batch_timestamp,
            offset_index_bytes=known.offset_index_bytes,
            time_index_bytes=known.time_index_bytes,
            last_modified_ms=last_modified_ms,
            inode=self.inode,
        )
        return True

    def _written(self) -> None:
        """This process changed the files: what was derived from them is stale (its
        head too, when it had no batch)."""
        self._meta = None
        self._mtime_ns = None
        self.delete_horizon = None
        self._index_bytes = None
        if self._first == (None,):
            self._first = None

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path}, size={self._size})"

    def stat_identity(self) -> tuple[int, int, int]:
        """The `.log`'s (inode, size, mtime in ns) as the file is now (one `stat`; what
        is known of the segment is left as it is)."""
        st = self._stat(LOG_FILE_SUFFIX)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def refresh(self) -> bool:
        """Re-stat the `.log`; if another process changed it, drop cached state. Returns
        whether it changed. A file that only grew (same inode, more bytes: appends) keeps
        what is known of its head, and only the appended bytes are walked when its end
        is next asked for."""
        st = self._stat(LOG_FILE_SUFFIX)
        if st.st_size == self._size and st.st_ino == self.inode:
            if st.st_mtime_ns != self._mtime_ns:  # written in place: derived state is stale
                self._mtime_ns, self._meta, self.delete_horizon = st.st_mtime_ns, None, None
            return False
        grown = st.st_ino == self.inode and st.st_size > self._size
        known = None
        if grown:
            # Grown again before the last growth was read: walk from where that began.
            pending = self._appended_from
            known = pending if pending is not None else (self._size, self._end_summary())
        first = self._first
        self._size, self.inode, self._mtime_ns = st.st_size, st.st_ino, st.st_mtime_ns
        self._reset_caches()
        if known is not None and known[1] is not None:
            self._first = None if first == (None,) else first  # empty then: read again
            self._appended_from = (known[0], known[1])
        return True

    def known_next_offset(self) -> int | None:
        """`next_offset` if known without reading anything."""
        summary = self._end_summary()
        return None if summary is None else summary[0]

    def _end_summary(self) -> tuple[int, int, int] | None:
        """(next offset, max timestamp, its offset) if known without reading anything."""
        if self._builder is not None and self._next_offset is not None:
            b = self._builder
            return self._next_offset, b.max_timestamp, b.offset_of_max_timestamp
        return self._summary

    def _summarize_appended(self) -> None:
        """The end of a file that grew since it was last read: walk only what was
        appended (a torn tail of a growing segment ends it for now, as in
        `_whole_batches_from`)."""
        assert self._appended_from is not None
        position, (next_offset, max_ts, max_ts_offset) = self._appended_from
        try:
            tail = self._whole_batches_from(position, after=next_offset)
        except CorruptRecordError:
            if not self.live:
                raise
            # Not appends only: the broker cut the segment (Kafka's `truncateTo`) and
            # wrote past its old end since it was last read, so the old end may lie
            # inside a batch. Read it again from its start, where damage still raises.
            self._first = None
            next_offset, max_ts, max_ts_offset = self.base_offset, NO_TIMESTAMP, -1
            tail = self._whole_batches_from(0)
        if tail.batches:
            if tail.max_timestamp > max_ts:
                max_ts, max_ts_offset = tail.max_timestamp, tail.offset_of_max_timestamp
            next_offset = tail.last_offset + 1
        self._summary = (next_offset, max_ts, max_ts_offset)
        self._next_offset = next_offset
        self._appended_from = None

    # -- indexes -------------------------------------------------------------------

    @property
    def offset_index(self) -> OffsetIndex:
        """The offset index (read on first use)."""
        if self._offset_index is None:
            self._offset_index = OffsetIndex.load(
                self._os_path(INDEX_FILE_SUFFIX),
                self.base_offset,
                max_index_size=self.max_index_size,
            )
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        """The time index (read on first use)."""
        if self._time_index is None:
            self._time_index = TimeIndex.load(
                self._os_path(TIME_INDEX_FILE_SUFFIX),
                self.base_offset,
                max_index_size=self.max_index_size,
            )
        return self._time_index

    @property
    def txn_index(self) -> TransactionIndex:
        """The transaction index (read on first use; empty when the file is absent)."""
        if self._txn_index is None:
            self._txn_index = TransactionIndex.load(
                self._os_path(TXN_INDEX_FILE_SUFFIX), self.base_offset
            )
        return self._txn_index

    def _tail(self, *, heal: bool = True) -> IndexBuilder:
        """Index-maintenance state, recovered from the last index entries and a walk of
        the batches after the last offset-index entry.

        Indexes the log can repair are rebuilt with `heal`, as the owner's open rebuilds
        them (`sanity_check`): an offset index whose last entry is damaged (before the
        log's start, or on no batch), a time index without entries beside offset
        entries while the batches have timestamps. Written by an owner, in memory when
        read-only, so that `plan` reads the partition as the cycle that follows it does.
        A time index whose last timestamp exceeds what is known of the whole log is
        rebuilt too. Not an entry past the log's end (IndexPastLogError: the log may be
        the file that is short), nor a `live` segment's stale entries, which a broker's
        truncation leaves (read past as they are, below)."""
        if self._builder is None:
            try:
                self._builder = self._tail_from_indexes()
            except (CorruptIndexError, CorruptRecordError) as exc:
                if not heal:
                    raise
                if isinstance(exc, IndexPastLogError):
                    exc = _garbage(self) or exc  # its entries out of order say nothing
                    if isinstance(exc, IndexPastLogError):
                        raise
                if self.live and not isinstance(exc, CorruptIndexError):
                    raise  # damage in the log itself (its stale entries are no error)
                self.rebuild_indexes(reason=_rebuild_reason(exc))
                assert self._builder is not None
        return self._builder

    def _tail_from_indexes(self) -> IndexBuilder:
        # Only the last entries and the bytes after them are read: a whole index is
        # 0.2% of its log, 20 GB on a 10 TB host, too much for every first `plan`.
        oi, ti = self.offset_index, self.time_index
        last, ts = oi.last_entry, ti.last_entry
        try:
            oi.check_within(self._size, self._os_path(LOG_FILE_SUFFIX))
            tail = self._whole_batches_from(last.position)
            torn = oi.entries > 0 and not tail.batches and self._torn_at(last.position)
            if oi.entries and not torn:
                _check_last_entry(oi.os_path, self._os_path(LOG_FILE_SUFFIX), last, tail)
        except (IndexPastLogError, _LastEntryMismatch, CorruptRecordError):
            if not self.live:
                raise
            # The active segment of a dir a broker writes: a truncation (Kafka's
            # `truncateTo`) moves its index's entry count back in the broker's
            # memory only, leaving the entries past the new end in the preallocated
            # file until appends overwrite them. Such a stale entry (past the end, or
            # into the middle of later batches) is not damage: the segment is read
            # from its start, as a torn one is, where real damage still raises, and
            # a lookup by offset reads it from its start too (`position_for`).
            torn = self._stale_index = True
        if torn or (oi.entries and not ti.entries):
            # A torn batch at the last entry, which an owner's recovery cuts with the
            # index entries into it (a crash that wrote the entry but not the whole
            # batch): read the segment as that leaves it, from its start, and not by
            # the time index, whose last entry may be the torn batch's. So too when the
            # time index has no entry (missing, or emptied) beside offset entries: it
            # holds no largest timestamp for the batches before the last offset entry,
            # and retention would date the segment by the batches after it alone.
            last, ts = OffsetPosition(self.base_offset, 0), TimestampOffset(-1, -1)
            tail = self._whole_batches_from(0)
            if not torn and tail.max_timestamp >= 0 and not self.live:
                raise CorruptIndexError(
                    "missing"
                    if not ti.file_exists
                    else _time_index_behind(None, tail.max_timestamp),
                    path=ti.path,
                )
        # A last time entry above any timestamp of the log is damaged: once a roll took
        # it, it would date the segment in the future for good (compaction and retention
        # held back). What was known of the whole log (kept at a clean stop, or read)
        # tells, and so do the batches walked when the entry names one of theirs (one
        # past the log's end is IndexPastLogError's, `check_time_index_within`).
        known = self._summary if self._appended_from is None else None
        largest = known[1] if known is not None else None
        if tail.batches and tail.first_base_offset <= ts.offset <= tail.last_offset:
            largest = max(NO_TIMESTAMP if largest is None else largest, tail.max_timestamp)
        if not self.live and largest is not None and ts.timestamp > largest:
            raise CorruptIndexError(_time_index_ahead(ts.timestamp, largest), path=ti.path)
        builder = IndexBuilder(
            oi,
            ti,
            self.index_interval_bytes,
            bytes_since_last_entry=self._size - last.position,
            max_timestamp=ts.timestamp,
            offset_of_max_timestamp=ts.offset,
        )
        if tail.batches and tail.max_timestamp > builder.max_timestamp:
            builder.max_timestamp = tail.max_timestamp
            builder.offset_of_max_timestamp = tail.offset_of_max_timestamp
        self._next_offset = tail.last_offset + 1 if tail.batches else self.base_offset
        if last.position == 0 and tail.stop == self._size:
            self._learn_from_whole(tail)
        return builder

    def _torn_at(self, position: int) -> bool:
        """Whether a read-only growing segment (whose torn tail its owner's open would
        cut) was found to end, torn, at `position` (`_whole_batches_from` keeps its size
        at the end of its last whole batch)."""
        return self.live and self._size == position

    def offsets_from(self, position: int, after: int | None) -> OffsetRange:
        """The offsets the batches from `position` may have: the segment's, from `after`
        on when that is known of the bytes before `position` (what a walk of the whole
        segment would have reached there)."""
        if after is None or position == 0:
            return self.offsets
        return self.offsets.after(after, self.offsets.high, True)

    def _whole_batches_from(self, position: int, *, after: int | None = None) -> Summary:
        """The totals of the batches from `position` to the end. A `growing` read-only
        segment belongs to another writer (observe mode: a live broker), which may be in
        the middle of an append: such a tail (`tail.torn_tail_reason`) ends the segment for
        now, and its size is the end of its last whole batch; any other bad bytes raise.

        A short span (an index interval and a batch, the usual case) is read with one
        `pread`, which costs less than mapping the file; a long one, or one that does not
        walk clean, is walked in the mapped file, whose positions the errors name. No
        walk keeps a table (72 bytes a batch: 425 MB for a 1 GiB segment of 1-record
        batches, read whole when its indexes are missing) unless it meets legacy
        entries, which only a table walk reads.
        `after`: the offset the batches from `position` start at, when the bytes before
        it were read (an append), which they are judged by, as a walk of the whole
        segment judges them."""
        offsets = self.offsets_from(position, after)
        span = self._size - position
        if 0 < span <= _PREAD_SPAN:
            data = self._pread_checked(position, span)
            summary = None if data is None else summarize(data, offsets=offsets)
            if summary is not None:
                return summary
        with self.open_buffer() as buf:
            summary = summarize(buf, start=position, offsets=offsets)
            if summary is not None:
                return summary
            scan = walk_prefix(buf, start=position, offsets=offsets)
            if scan.error is None:  # legacy entries stopped the summary
                return Summary.of_table(walk(buf, start=position, offsets=offsets).table, scan.stop)
            if not self.live or torn_tail_reason(buf, scan, flushed_to=self.flushed_to) is None:
                raise scan.error.located(self.log_path)
            self._size = scan.stop
            whole = as_uint8(buf)[: scan.stop]
            summary = summarize(whole, start=position, offsets=offsets) or Summary.of_table(
                walk(whole, start=position, offsets=offsets).table, scan.stop
            )
            del whole  # the mapping closes at the end of the block: no view may outlive it
            return summary

    def _end(self) -> tuple[int, int, int]:
        """(next offset, max timestamp, its offset): from what was known before the
        file grew plus its appended bytes, else from the index-maintenance state."""
        if self._appended_from is not None:
            self._summarize_appended()
        if self._builder is None and self._summary is not None:
            return self._summary
        b = self._tail()
        assert self._next_offset is not None
        return self._next_offset, b.max_timestamp, b.offset_of_max_timestamp

    @property
    def next_offset(self) -> int:
        """The offset after the last batch; the base offset when empty (readNextOffset)."""
        return self._end()[0]

    @property
    def max_timestamp_so_far(self) -> int:
        """The largest batch max timestamp in the segment, or -1."""
        return self._end()[1]

    @property
    def offset_of_max_timestamp(self) -> int:
        """Last offset of the earliest batch holding the max timestamp."""
        return self._end()[2]

    @property
    def largest_timestamp(self) -> int:
        """Kafka's largestTimestamp: the max timestamp, or the `.log` mtime without one."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified_ms

    @property
    def first_batch_timestamp(self) -> int | None:
        """maxTimestamp of the first batch (KIP-354's rolling clock), None when the segment
        is empty (or, read-only, holds only an append in flight)."""
        if self._first is None:
            self._first = (self._read_first_timestamp(),)
        return self._first[0]

    def _read_first_timestamp(self) -> int | None:
        if not self._size:
            return None
        head = self._pread_checked(0, min(self._size, _HEAD_READ))
        first = None if head is None else summarize(head, limit=1, offsets=self.offsets)
        if first is not None and first.batches:
            return first.first_max_timestamp
        # A first batch longer than the read, or no whole valid batch: the mapped file
        # answers (and names the position of any damage).
        with self.open_buffer() as buf:
            walker = Walker(buf, rows=1, offsets=self.offsets)
            chunk = next(iter(walker), None)
            error = walker.error
            if error is not None and not self.live:
                raise error.located(self.log_path)
            found = None if chunk is None else int(chunk.max_timestamp[0])
            del walker, chunk
        if found is None and error is not None:
            self._whole_batches_from(0)  # raises unless it is a torn tail
        return found

    def meta(self) -> SegmentMeta:
        """The plain snapshot pure decisions take; kept until the file is seen to change
        (`refresh`) or this process writes it."""
        if self._meta is None:
            if self._end_summary() is None and self._appended_from is None:
                self._read_small_whole()
            next_offset = self.next_offset  # first: a torn tail in flight ends the size
            index_bytes = self._index_bytes
            if index_bytes is None:
                index_bytes = (self.offset_index.size_in_bytes, self.time_index.size_in_bytes)
            self._meta = SegmentMeta(
                base_offset=self.base_offset,
                next_offset=next_offset,
                size_bytes=self._size,
                largest_timestamp_ms=self.largest_timestamp,
                first_batch_timestamp_ms=self.first_batch_timestamp,
                offset_index_bytes=index_bytes[0],
                time_index_bytes=index_bytes[1],
                last_modified_ms=self.last_modified_ms,
                inode=self.inode,
            )
        return self._meta

    def damaged_meta(self, damage: str) -> SegmentMeta:
        """The snapshot of a segment whose batches could not be read (`damage`, the
        error naming the file and position): only what its files' `stat`s give."""
        return SegmentMeta.damaged(
            self.base_offset,
            damage,
            size_bytes=self._size,
            index_bytes=self._index_sizes() or (0, 0),
            last_modified_ms=self.last_modified_ms,
            inode=self.inode,
        )

    def prefetch(self, *, indexes: bool = False) -> None:
        """Ask the kernel to start reading a small `.log` whose metadata is not known yet
        (`POSIX_FADV_WILLNEED`, a hint: nothing is written, and a failure only loses the
        hint); with `indexes`, its small index files too (the open's cheap check reads
        them). Reads of many segments not in the page cache then overlap, where waiting
        for each in turn costs a disk round trip per segment (measured: 171 us per cold
        2 KB segment read one by one, 48 us when advised first)."""
        if self._meta is None and 0 < self._size <= _PREAD_SPAN:
            advise_small(self._os_path(LOG_FILE_SUFFIX), self._size)
        if indexes:
            advise_small(self._os_path(INDEX_FILE_SUFFIX), None)
            advise_small(self._os_path(TIME_INDEX_FILE_SUFFIX), None)

    def _read_small_whole(self) -> None:
        """The end, head and delete horizons of a small segment with an empty offset index
        (a quiet topic's rolled segment) from one read of the whole `.log`, its index
        sizes from two `stat`s: none of its index entries could start the walk later. A
        segment this does not fit, or whose bytes do not walk clean, is read the usual
        way (`_tail`), which names any damage."""
        if self.growing or not 0 < self._size <= _PREAD_SPAN or self._offset_index is not None:
            return
        sizes = self._index_sizes()
        if sizes is None:
            return  # a missing index: the usual way reports or rebuilds it
        offset_index_bytes, time_index_bytes = sizes
        # A trimmed time index of at most one entry (Kafka's final entry at roll) holds no
        # timestamp the walk misses; a longer or preallocated one is read the usual way.
        if offset_index_bytes or time_index_bytes not in (0, TimeIndex.entry.size):
            return
        data = self._pread_checked(0, self._size)
        whole = None if data is None else summarize(data, offsets=self.offsets)
        if whole is None or not whole.batches or whole.stop != self._size:
            return
        next_offset = whole.last_offset + 1
        self._summary = (next_offset, whole.max_timestamp, whole.offset_of_max_timestamp)
        self._next_offset = next_offset
        self._learn_from_whole(whole)
        self._index_bytes = (offset_index_bytes, time_index_bytes)

    def _learn_from_whole(self, whole: Summary) -> None:
        """What a walk of the whole file also tells, kept unless already known: the first
        batch's timestamp and the delete horizons."""
        if whole.batches and self._first is None:
            self._first = (whole.first_max_timestamp,)
        if self.delete_horizon is None:
            self.delete_horizon = whole.delete_horizon

    # -- reading -------------------------------------------------------------------

    @contextmanager
    def open_buffer(self) -> Iterator[Buffer]:
        """Map the `.log` read-only for the duration of the `with` block (b"" if empty;
        a file of at most `_PREAD_SPAN` bytes is read instead).

        Do not keep memoryviews of the buffer past the block."""
        size = self._size
        if size == 0:
            yield b""
            return
        with open(self._os_path(LOG_FILE_SUFFIX), "rb") as f:
            st = os.fstat(f.fileno())
            now = self._not_as_listed(st)
            if now is not None:
                raise FileChangedError(f"{size} bytes when listed, now {now}", path=self.log_path)
            mapped = min(size, st.st_size)
            if mapped == 0:
                yield b""
                return
            if mapped <= _PREAD_SPAN:
                yield os.pread(f.fileno(), mapped, 0)  # cheaper than a mapping
                return
            buf = mmap.mmap(f.fileno(), mapped, access=mmap.ACCESS_READ)
            try:
                yield buf
            except BaseException:
                _close_mapping(buf, failing=True)
                raise
            _close_mapping(buf)

    def _not_as_listed(self, st: os.stat_result) -> str | None:
        """What the open `.log` (its `fstat`) is now, if it is not the segment whose size
        and indexes were read: read-only, another writer (a live broker) may have renamed
        a new file over this segment's name or cut it since it was listed."""
        if not self.read_only:
            return None
        if st.st_ino != self.inode:
            return "another file"
        return f"{st.st_size} bytes" if st.st_size < self._size else None

    def _pread_checked(self, position: int, size: int) -> bytes | None:
        """`size` bytes of the `.log` from `position`, or None when the file no longer
        has them or (read-only) is no longer the file that was listed."""
        fd = os.open(self._os_path(LOG_FILE_SUFFIX), os.O_RDONLY)
        try:
            if self.read_only and self._not_as_listed(os.fstat(fd)) is not None:
                return None  # `open_buffer` reports it
            data = os.pread(fd, size, position)
        finally:
            os.close(fd)
        return data if len(data) == size else None

    def read(self, position: int, size: int) -> bytes:
        """Up to `size` bytes of the `.log` from `position`."""
        fd = os.open(self.log_path, os.O_RDONLY)
        try:
            return os.pread(fd, size, position)
        finally:
            os.close(fd)

    def read_batch(self, info: BatchInfo) -> bytes:
        """The bytes of one batch found by a scan of this segment."""
        return self.read(info.position, info.size)

    def batches(
        self,
        start_offset: int | None = None,
        *,
        start_position: int | None = None,
        verify_crc: bool = True,
    ) -> Iterator[BatchInfo]:
        """Batches in file order, positions relative to the file.

        With `start_offset`, start at the batch holding it (index lookup, then a forward
        scan; batches ending before it are skipped). CorruptRecordError names the file.
        """
        if start_position is None:
            start_position = 0 if start_offset is None else self.position_for(start_offset)
        with self.open_buffer() as buf:
            it = scan_batches(
                buf, start=start_position, verify_crc=verify_crc, offsets=self.offsets
            )
            try:
                for info in it:
                    if start_offset is None or info.last_offset >= start_offset:
                        yield info
            except CorruptRecordError as exc:
                raise exc.located(self.log_path) from None
            finally:
                _close(it)

    def records(self, start_offset: int | None = None) -> Iterator[Record]:
        """Records in offset order from `start_offset` (all when None)."""
        with self.open_buffer() as buf:
            start = 0 if start_offset is None else self.position_for(start_offset)
            it = scan_batches(buf, start=start, offsets=self.offsets)
            try:
                for info in it:
                    for record in iter_records(buf, info):
                        if start_offset is None or record.offset >= start_offset:
                            yield record
            except CorruptRecordError as exc:
                raise exc.located(self.log_path) from None
            finally:
                _close(it)

    def position_for(self, offset: int) -> int:
        """Where to start scanning for `offset`: the offset-index lookup's position (an
        entry outside the log, which only damage makes, is a CorruptIndexError); the
        start of a live segment whose index was found stale (`_tail`)."""
        if self.live:
            self._tail()  # checks the index against the log, once
        if self._stale_index:
            return 0
        entry = self.offset_index.lookup(offset)
        if not 0 <= entry.position <= self._size:
            raise CorruptIndexError(
                f"entry (offset {entry.offset}, position {entry.position}) is outside the "
                f"log {self.log_path} ({self._size} bytes)",
                path=self.offset_index_path,
            )
        return entry.position

    def translate_offset(self, offset: int) -> BatchInfo | None:
        """The first batch whose last offset is >= `offset`, or None (Kafka's
        translateOffset)."""
        return next(self.batches(offset), None)

    def scan(self, *, verify_crc: bool = True) -> Walk:
        """Walk the whole `.log`, stopping at the first bad batch instead of raising."""
        with self.open_buffer() as buf:
            return walk(buf, verify_crc=verify_crc, offsets=self.offsets)

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions of this segment overlapping the range (Kafka's rule)."""
        return self.txn_index.collect_aborted(fetch_offset, upper_bound_offset)

    # -- writing -------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.read_only:
            raise PermissionError(f"segment {self.log_path} is open read-only")

    def append(self, data: bytes, infos: BatchInfo | Sequence[BatchInfo]) -> None:
        """Append whole batches (`infos` from a scan of `data`, positions relative to it)
        and the index entries they earn."""
        self._check_writable()
        batch_infos = [infos] if isinstance(infos, BatchInfo) else list(infos)
        if not batch_infos:
            return
        self._check_offsets(batch_infos[0].base_offset, batch_infos[-1].last_offset)
        builder = self._tail()
        start = self._size
        with file_step("appending a batch", self.log_path):
            self._write_log(data, start)
        for info in batch_infos:
            builder.add_batch(
                start + info.position, info.size, info.last_offset, info.max_timestamp
            )
        self._size = start + len(data)
        self._next_offset = batch_infos[-1].next_offset
        for index in (builder.offset_index, builder.time_index):
            try:
                index.flush_entries()
            except OSError as exc:
                # The batches are in the log, which is what the append promised; their
                # entries wait in memory for the next append's flush or the roll's, and
                # an index short of them only makes a lookup read further.
                log.warning(
                    "segment.index_write_deferred", path=str(index.path), error=failure_text(exc)
                )
        self._written()

    def _check_offsets(self, first: int, last: int) -> None:
        if first < self.next_offset or not 0 <= last - self.base_offset <= INT32_MAX:
            raise ValueError(
                f"cannot append offsets {first}..{last} to {self.log_path}: they must be at "
                f"or after {self.next_offset} and within int32 range of the base offset "
                f"{self.base_offset}"
            )

    def _write_log(self, data: bytes, position: int) -> None:
        fd = os.open(self.log_path, os.O_WRONLY)
        try:
            view = memoryview(data)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], position + done)
        except BaseException:
            os.ftruncate(fd, position)  # never leave a partial batch behind
            raise
        finally:
            os.close(fd)

    def roll_before_append(self, size: int, last_offset: int, segment_bytes: int) -> str | None:
        """Why a batch of `size` bytes ending at `last_offset` needs a roll first, named
        after the setting or limit (Kafka's maybeRoll rules on size, index fullness and
        relative offsets); None if it fits."""
        if self._size == 0:
            return None
        if self._size > segment_bytes - size:
            return "segment.bytes"
        if self.offset_index.is_full or self.time_index.is_full:
            return "segment.index.bytes"
        if last_offset - self.base_offset > INT32_MAX:
            return "relative offset overflow"
        return None

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        """Record an aborted transaction whose marker is in this segment."""
        self._check_writable()
        self.txn_index.append(txn)

    def flush(self) -> None:
        """fsync the `.log` and its indexes."""
        fsync_file(self.log_path)
        self.offset_index.fsync()
        self.time_index.fsync()
        self.txn_index.fsync()

    def close_for_roll(self) -> None:
        """Make the segment inactive: add the final time-index entry, write and fsync."""
        self._check_writable()
        builder = self._tail()
        builder.finish()
        # Each write names its file: on a full disk the time index's final entry is
        # the write that fails. A retry writes the same entries at the same places.
        for index in (builder.offset_index, builder.time_index):
            with file_step("writing the rolled segment's last index entries", index.path):
                index.flush_entries()
        with file_step("syncing the rolled segment", self.log_path):
            self.flush()
        self._written()

    # -- checks and rebuilds ----------------------------------------------------------

    def sanity_check(self) -> bool:
        """The cheap load-time check; rebuild indexes that are missing or inconsistent.
        Returns whether the indexes were rebuilt.

        Raises IndexPastLogError (nothing changed) when an index refers to bytes or offsets
        past the end of the log, CorruptIndexError for a damaged `.txnindex` (it cannot be
        rebuilt from the log alone), CorruptRecordError when the log itself is unreadable.
        """
        try:
            self.check()
        except IndexPastLogError:
            raise
        except CorruptIndexError as exc:
            if exc.path == str(self.txn_index_path):
                raise
            problem: CorruptIndexError | CorruptRecordError = exc
        except CorruptRecordError as exc:
            problem = exc
        else:
            return False
        self.rebuild_indexes(reason=_rebuild_reason(problem))
        return True

    def check(self) -> None:
        """`sanity_check` without its repair, for a process that may not write (and the
        check that one repairs after): raises what that would report, or rebuild
        (CorruptIndexError, reason "missing" for a missing index)."""
        self.txn_index.sanity_check()
        if not (self.offset_index.file_exists and self.time_index.file_exists):
            raise CorruptIndexError("missing", path=self.offset_index_path)
        self._check_indexes()

    def _check_indexes(self) -> None:
        self.check_index_order()
        self._tail(heal=False)
        self.check_time_index_within(self.next_offset)

    def check_index_order(self) -> None:
        """Raise CorruptIndexError unless the entries of both indexes are in order (the
        cheap check's first test: an index out of order is garbage, wherever it points)."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()

    def check_time_index_within(self, next_offset: int) -> None:
        """Raise IndexPastLogError if the time index names an offset the log lacks."""
        last = self.time_index.last_entry
        if self.time_index.entries and last.offset >= next_offset:
            raise IndexPastLogError(
                f"last entry (timestamp {last.timestamp}) names offset {last.offset}, past the "
                f"log's last offset {next_offset - 1}",
                path=self.time_index_path,
            )

    def walked(self, *, verify_crc: bool = True) -> Iterator[BatchTable]:
        """The batches as the walker's tables (each valid until the next is taken); the
        file stays mapped until the iteration ends. CorruptRecordError names the file."""
        with self.open_buffer() as buf:
            walker = Walker(buf, verify_crc=verify_crc, offsets=self.offsets)
            yield from walker
            error = walker.error
            del walker  # its view of `buf` must go before the mmap closes
        if error is not None:
            raise error.located(self.log_path)

    def rebuild_indexes(self, *, reason: str = "rebuild") -> None:
        """Rebuild both indexes from the log (Kafka's recover): the interval rule over
        every batch (a walk of the file), then the final time-index entry; see
        `IndexRebuild`."""
        rebuild = IndexRebuild(self)
        for table in self.walked():
            rebuild.add(table)
        rebuild.finish(reason=reason)

    def _install_indexes(
        self, oi: OffsetIndex, ti: TimeIndex, builder: IndexBuilder, next_offset: int
    ) -> None:
        self._offset_index, self._time_index, self._builder = oi, ti, builder
        self._next_offset = next_offset
        self._written()

    def truncate_to_position(self, size: int) -> None:
        """Cut the `.log` to `size` bytes (recovery of a torn tail), then rebuild the
        indexes of what remains."""
        self._check_writable()
        os.truncate(self.log_path, size)
        self._size = size
        self._reset_caches()
        self._mtime_ns = None
        self.rebuild_indexes(reason=f"log truncated to {size} bytes")
        self.txn_index.truncate_to(self.next_offset)

    # -- renames and deletion ----------------------------------------------------------

    def change_suffix(self, new_suffix: str) -> None:
        """Rename every existing file of the segment from its suffix to `new_suffix`
        (Kafka's changeFileSuffixes), then fsync the dir."""
        self._check_writable()
        old_paths = self.paths
        self.suffix, self._paths = new_suffix, {}
        for old, new in zip(old_paths, self.paths, strict=True):
            if old.exists():
                old.replace(new)
        fsync_dir(self.dir)
        self._reset_caches()

    def delete_files(self) -> None:
        """Unlink every file of the segment (ENOSPC-safe)."""
        self._check_writable()
        for path in self.paths:
            if path.exists():
                safe_unlink(path)


def _garbage(segment: LogSegment) -> CorruptIndexError | None:
    """The error of an index of `segment` whose entries are out of order, or None: such
    an index is rebuilt, as the owner's cheap check rebuilds it before it looks where
    the entries point (an entry past the log's end in an index in order is damage)."""
    try:
        segment.check_index_order()
    except CorruptIndexError as exc:
        return exc
    return None


def _time_index_ahead(last: int, largest: int) -> str:
    return f"last timestamp {last} exceeds the log's max {largest}"


def _time_index_behind(last: int | None, largest: int) -> str:
    """Why a time index is behind its log: its `last` timestamp (None: no entry) below
    the `largest` of the batches it must cover."""
    if last is None:
        return f"no entries, where the log's batches have timestamps up to {largest}"
    return f"last timestamp {last} is below {largest}, the largest of the batches it covers"


def _rebuild_reason(problem: CorruptIndexError | CorruptRecordError) -> str:
    """What a rebuild of the indexes repairs, said in its log line (whose `path` is the
    `.log`): the index's own damage, naming the index, or a last entry that a walk from
    its position found on no batch (damage in the log itself fails the rebuild's walk of
    the whole segment instead)."""
    if isinstance(problem, CorruptIndexError):
        return str(problem)
    return "the last offset-index entry is not on a batch boundary"


class _LastEntryMismatch(CorruptIndexError):
    """The last offset-index entry disagrees with the batch at its position."""


def _check_last_entry(
    index_path: Path | str, log_path: Path | str, last: OffsetPosition, tail: Summary
) -> None:
    """Raise _LastEntryMismatch when the last offset-index entry `last` is not on the
    batch `tail` starts with: which file is wrong is not known (a damaged batch there,
    or an entry past what was written), so both are named. An entry is on a batch when
    its offset is at least the batch's base offset and at most the log's last: brokers
    since 2.0 index the last offset of what one append wrote (a follower's append holds
    many batches), brokers before it the first (`IndexCheck`)."""
    if not tail.batches:
        raise _LastEntryMismatch(
            f"last entry (offset {last.offset}, position {last.position}) points to no "
            f"whole batch of {log_path}: the batch at that position is damaged or the "
            "entry is",
            path=index_path,
        )
    if not tail.first_base_offset <= last.offset <= tail.last_offset:
        raise _LastEntryMismatch(
            f"last entry (offset {last.offset}, position {last.position}) does not match "
            "the batch there",
            path=index_path,
        )


class IndexCheck:
    """A segment's two indexes checked entry by entry against its batches, fed as walked
    tables in file order (`add`), so that the walk recovery makes for the CRCs checks
    the indexes too. The indexes are read and sanity-checked at construction, which
    raises as `finish` does: IndexPastLogError for entries beyond the log,
    CorruptIndexError for entries that are not on batch boundaries or out of order."""

    def __init__(self, segment: LogSegment) -> None:
        self._segment = segment
        oi = segment.offset_index
        segment.check_index_order()  # first, as the cheap check
        oi.check_within(segment.size, segment.log_path)
        self._offsets, self._positions = oi.entry_arrays()
        self._found = np.zeros(len(self._positions), bool)
        self._next_offset, self._max_ts = segment.base_offset, NO_TIMESTAMP
        self._last_position = int(self._positions[-1]) if len(self._positions) else 0
        self._max_ts_before = NO_TIMESTAMP
        """The largest timestamp of the batches before the last offset entry's, which
        the time index's last entry is at least (it was written with that entry, with
        the largest timestamp so far: Kafka's append)."""

    def add(self, table: BatchTable) -> None:
        """The next batches (a walker's table may be overwritten once this returns)."""
        if not len(table):
            return
        positions, offsets = self._positions, self._offsets
        mine = np.flatnonzero((positions >= table.position[0]) & (positions < table.end[-1]))
        row = np.searchsorted(table.position, positions[mine])
        row = np.minimum(row, len(table) - 1)
        # On the batch at its position, by its base offset or past it (see
        # `_check_last_entry`); `finish` checks that no entry is past the log's end.
        self._found[mine] = (table.position[row] == positions[mine]) & (
            table.base_offset[row] <= offsets[mine]
        )
        self._next_offset = table.final_offset + 1
        self._max_ts = max(self._max_ts, int(table.max_timestamp.max()))
        before = table.max_timestamp[table.position < self._last_position]
        if len(before):
            self._max_ts_before = max(self._max_ts_before, int(before.max()))

    def finish(self) -> None:
        """Raise what the batches added disagree with."""
        segment, found, offsets, positions = (
            self._segment,
            self._found,
            self._offsets,
            self._positions,
        )
        segment.check_time_index_within(self._next_offset)
        found &= offsets < self._next_offset
        if not found.all():
            n = int(np.flatnonzero(~found)[0])
            raise CorruptIndexError(
                f"entry {n} (offset {int(offsets[n])}, position {int(positions[n])}) is not at "
                "the start of a batch at or before that offset",
                path=segment.offset_index.path,
            )
        ti = segment.time_index
        if ti.entries and ti.last_entry.timestamp > self._max_ts:
            raise CorruptIndexError(
                _time_index_ahead(ti.last_entry.timestamp, self._max_ts), path=ti.path
            )
        last = ti.last_entry.timestamp if ti.entries else None
        if self._max_ts_before >= 0 and (last is None or last < self._max_ts_before):
            raise CorruptIndexError(_time_index_behind(last, self._max_ts_before), path=ti.path)


class IndexRebuild:
    """A segment's two indexes rebuilt from its batches, fed as walked tables in file
    order (`add`), held in memory until `finish` replaces the files (atomically; not at
    all when the segment is read-only: then the rebuilt indexes live in memory). A
    rebuild dropped before `finish` changes nothing."""

    def __init__(self, segment: LogSegment) -> None:
        self._segment = segment
        base, limit = segment.base_offset, segment.max_index_size
        self._oi = OffsetIndex(segment.offset_index_path, base, max_index_size=limit)
        self._ti = TimeIndex(segment.time_index_path, base, max_index_size=limit)
        self._builder = IndexBuilder(self._oi, self._ti, segment.index_interval_bytes)
        self._next_offset = base

    def add(self, table: BatchTable) -> None:
        """The next batches (a walker's table may be overwritten once this returns)."""
        if len(table):
            self._builder.add_batches(
                table.position, table.size, table.last_offset, table.max_timestamp
            )
            self._next_offset = table.final_offset + 1

    def finish(self, *, reason: str) -> None:
        """Add the final time-index entry, write both files and make them the segment's."""
        segment, oi, ti = self._segment, self._oi, self._ti
        self._builder.finish()
        if not segment.read_only:
            oi.write()
            ti.write()
        log.warning(
            "segment.index_rebuilt",
            path=str(segment.log_path),
            reason=reason,
            written=not segment.read_only,
            offset_index_entries=oi.entries,
            time_index_entries=ti.entries,
        )
        segment._install_indexes(oi, ti, self._builder, self._next_offset)


def advise_small(path: str, size: int | None) -> None:
    """`POSIX_FADV_WILLNEED` on the file at `path` when it is small (`size`, else its
    own); a file that is gone, or a failure, only loses the hint. A preallocated index
    (tens of MB of holes) is not small."""
    try:
        # Never through a link, nor waiting on a FIFO put where a segment file was.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        length = os.fstat(fd).st_size if size is None else size
        if 0 < length <= _PREAD_SPAN:
            os.posix_fadvise(fd, 0, length, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _create_empty(path: Path, like: Path | None, flags: int) -> None:
    """Create `path` empty (`flags`: O_TRUNC, or O_EXCL to refuse an existing one), with
    the bits and group of `like`, else of its dir."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | flags, 0o644)
    try:
        adopt_owner(fd, path.parent if like is None else like)
    finally:
        os.close(fd)
