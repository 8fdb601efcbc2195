"""`cleanerd dump`: the lines Kafka's `kafka-dump-log` (DumpLogSegments) prints.

Output per file, in Kafka's words and order, so the two tools' output can be diffed:

- `Dumping <path>`, then for a `.log` file `Log starting offset: <base offset>` and one
  line per batch::

      baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1
      producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false
      isControl: false deleteHorizonMs: OptionalLong.empty position: 0
      CreateTime: 1726045973899 size: 80 magic: 2 compresscodec: none crc: 3356283127
      isvalid: true

  (one line; a legacy magic 0/1 entry starts `offset: <last offset>` instead of the
  v2 fields). With deep iteration, one `| offset: ...` line per record (v2: `sequence`
  and `headerKeys`; legacy: `isValid` and `crc`), control records followed by
  `endTxnMarker: COMMIT coordinatorEpoch: N` or the KRaft control type's name (Kafka
  also prints the KRaft record as JSON; cleanerd prints the name only). Printing the
  data adds ` key: ...` and ` payload: ...` (UTF-8, malformed bytes replaced) to data
  records. A truncated last batch, as a crash mid-append leaves, ends the listing with
  `Found <n> invalid bytes at the end of <file name>` (then an exception naming the
  position when a later segment follows the file: `closed_segment_cut_short`).
- `.index`: `offset: N position: P` per entry (`<path> is empty.` when none);
  `.timeindex`: `timestamp: T offset: O`; `.txnindex`: `version: 0 producerId: P
  firstOffset: F lastOffset: L lastStableOffset: S`.

With `--json`, `dump_json` prints the same files as one JSON object per batch, record or
index entry instead (its docstring lists the fields), built on the readers here.

A batch whose framing is sound but whose CRC or codec is bad gets its line, with
`isvalid: false` (and no record lines), and the listing goes on to the next batch, as
Kafka's does; with deep iteration, a batch whose records do not decode ends its record
lines there and counts as bad too (without it, records are not decoded: `--json` decodes
every batch's). The file then ends with an exception naming the first bad batch and how
many there were (`InvalidBatches`), so the command exits 1 with the whole listing
printed. Bytes that cannot be framed as a batch (a length past the file, offsets out of
order or out of the segment's place among its dir's segments, `segment_place`, an index
whose size is not whole entries) end the file's listing with an exception naming the
file and the byte position. The listing is one line per batch or
record by nature, so it is produced per record in Python; this is a diagnostic tool, not
a hot path. Its memory is bounded all the same: a `.log` is mapped, not read, and walked
a window of whole batches (`DECODE_WINDOW_BYTES`) at a time (`log_windows`), so only one
window's batches are ever Python objects (a 1 GiB segment holds 5.6 million 1-record
batches).
"""

from __future__ import annotations

import argparse
import errno
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cleanerd.commands import Arg, print_error
from cleanerd.errors import CleanerdError, CorruptRecordError
from cleanerd.log.files import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    log_file_offsets,
    offset_from_filename,
    parse_topic_partition,
)
from cleanerd.log.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset
from cleanerd.log.producer_state import ProducerEntry, read_snapshot
from cleanerd.log.segment_reader import map_file
from cleanerd.log.tail import ZERO_TAIL, torn_tail_reason
from cleanerd.log.txnindex import TXN_ENTRY_VERSION, AbortedTxn, TransactionIndex
from cleanerd.records import legacy
from cleanerd.records.batch import iter_records
from cleanerd.records.control import ControlRecordType, control_type, decode_end_txn_marker
from cleanerd.records.header import (
    COMPRESSION_MASK,
    NO_SEQUENCE,
    BatchHeader,
    Buffer,
    Compression,
    validate_v2_header,
)
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo
from cleanerd.records.walker import DECODE_WINDOW_BYTES, OffsetRange, Walk, batch_windows, walk

_SEQUENCE_MODULUS: Final = 2**31  # sequences wrap from Int.MAX to 0, as in Kafka


class UnsupportedFileError(CleanerdError):
    """A file `dump` cannot list: not a segment or index file of a partition dir."""


@dataclass(frozen=True, slots=True)
class DumpOptions:
    """kafka-dump-log's `--deep-iteration` and `--print-data-log` (which implies it)."""

    deep_iteration: bool = False
    print_data_log: bool = False

    @property
    def records(self) -> bool:
        """Whether record lines are printed."""
        return self.deep_iteration or self.print_data_log


def dump_file(path: Path, options: DumpOptions) -> Iterator[str]:
    """Yield the dump lines of `path`, a `.log`, `.index`, `.timeindex`, `.txnindex` or
    `.snapshot`.

    Raises UnsupportedFileError before any line for a file of another kind or a name
    that does not start with a base offset; OSError if it cannot be read;
    CorruptRecordError or CorruptIndexError after the lines that precede the bad bytes.
    """
    base_offset = dumpable_base_offset(path)
    yield f"Dumping {path}"
    yield from _DUMPERS[path.suffix](path, base_offset, options)


def dumpable_base_offset(path: Path) -> int:
    """The base offset in the name of `path`, a file `dump` reads; UnsupportedFileError
    for another kind of file or a name that does not start with one, FileNotFoundError
    for a file that is not there."""
    if path.suffix not in _DUMPERS:
        raise UnsupportedFileError(f"cannot dump {path}: not a {', '.join(_DUMPERS)} file")
    if not path.exists():  # said before what its name would need
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
    try:
        return offset_from_filename(path.name)
    except ValueError:
        raise UnsupportedFileError(
            f"cannot dump {path}: its name must start with the segment's base offset"
        ) from None


# ---------------------------------------------------------------------------
# .log


@dataclass(frozen=True, slots=True)
class SegmentPlace:
    """Where a `.log` stands among its dir's segments: the offsets its batches may hold,
    as the owner's open judges them, and whether a later segment follows it."""

    offsets: OffsetRange
    later: bool


def segment_place(path: Path, base_offset: int) -> SegmentPlace:
    """Below the next `.log`'s base offset when one follows `path` in its dir; within
    2^31 - 1 of its own base when it is the last of a partition dir (the active
    segment); only ascending from its base otherwise (a file alone elsewhere, or a dir
    that cannot be listed: its place is not known)."""
    unknown = SegmentPlace(OffsetRange(0, max(0, base_offset)), later=False)
    try:
        names = [p.name for p in path.parent.iterdir()]
    except OSError:
        return unknown
    following = [o for o in log_file_offsets(names) if o > base_offset]
    if following:
        return SegmentPlace(OffsetRange.of_segment(base_offset, min(following)), later=True)
    try:
        parse_topic_partition(path.parent.name)
    except ValueError:
        return unknown
    return SegmentPlace(OffsetRange.of_segment(base_offset), later=False)


def log_windows(data: Buffer, ranges: OffsetRange) -> Iterator[tuple[list[BatchInfo], Walk]]:
    """The batches of `data` (a segment whose batches may hold `ranges`) a window of
    whole batches (`DECODE_WINDOW_BYTES`) at a time, as `BatchInfo`s, each with the walk
    of its window (CRCs not checked: a batch with a bad one is listed too). A walk that
    stopped before its window's end (bad or partial bytes, offsets out of order or out
    of the segment's place) is the last; its `stop` and `error` are the file's."""
    for start, end, offsets in batch_windows(data, DECODE_WINDOW_BYTES, ranges):
        scan = walk(data, start=start, end=end, verify_crc=False, offsets=offsets)
        yield scan.table.infos(), scan
        if scan.error is not None:
            return


def _log_lines(path: Path, base_offset: int, options: DumpOptions) -> Iterator[str]:
    yield f"Log starting offset: {base_offset}"
    data = map_file(path)
    last: Walk | None = None
    invalid = InvalidBatches(path)
    place = segment_place(path, base_offset)
    for infos, scan in log_windows(data, place.offsets):
        last = scan
        for info in infos:
            # CRCs are checked here, so a bad one still gets its line as in Kafka.
            problem = batch_problem(data, info)
            yield _batch_line(data, info, valid=problem is None)
            if problem is not None:
                invalid.add(problem, info)
            elif options.records:
                records: list[str] = []
                try:
                    records.extend(_record_lines(data, info, options))
                except CorruptRecordError as e:
                    invalid.add(e, info)
                yield from records
    if last is not None and last.error is not None:
        if not cut_short(data, last):
            raise invalid.stopped(last.error.located(path))
        yield f"Found {len(data) - last.stop} invalid bytes at the end of {path.name}"
        if (damage := closed_segment_cut_short(path, place, last.stop, len(data))) is not None:
            raise invalid.stopped(damage)
    invalid.check()


def cut_short(data: Buffer, scan: Walk) -> bool:
    """Whether the walk of a whole `.log` stopped at a batch cut short, Kafka's `Found N
    invalid bytes`: an incomplete batch with no valid batch after it, or only zeros after
    the last batch (a broker's preallocated active segment: `preallocate`), as the
    owner's open judges them (`torn_tail_reason`). A length past the file followed by
    whole valid batches is a damaged length, reported at its position as the owner
    reports it."""
    reason = torn_tail_reason(data, scan)
    return reason is not None and (scan.incomplete_tail or reason == ZERO_TAIL)


def closed_segment_cut_short(
    path: Path, place: SegmentPlace, stop: int, size: int
) -> CorruptRecordError | None:
    """The bytes from `stop` to `size` at the end of the `.log` `path`, which hold no
    whole batch, as damage when a later `.log` sits beside it: that segment is not the
    active one, so no append can be in flight at its end, and the owner's open calls
    them damage too (a length past the file there is a damaged length, not a batch cut
    short). Kafka's tool and this one print `Found N invalid bytes` either way; the
    command then exits 1 for such a segment. None for the last segment of its dir."""
    if not place.later:
        return None
    return CorruptRecordError(
        f"the {size - stop} bytes at its end hold no whole batch, and a later segment "
        "follows it: damage, not an append cut short",
        path=path,
        position=stop,
    )


class InvalidBatches:
    """The framed batches of one file that are invalid (a bad CRC or codec, or records
    that do not decode where they are decoded): the listing goes on past them, as
    Kafka's goes on past a bad CRC, and the file then ends with one CorruptRecordError
    that counts them and names the first, so the command exits 1 with the whole listing
    printed; bytes that stop the listing are said with them (`stopped`)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._count = 0
        self._first: CorruptRecordError | None = None

    def add(self, problem: CorruptRecordError, info: BatchInfo) -> None:
        self._count += 1
        if self._first is None:
            self._first = _at_batch(problem, self._path, info)

    def check(self) -> None:
        """Raise the file's error if any batch was invalid."""
        first = self._first
        if first is None:
            return
        if self._count == 1:
            raise first
        raise CorruptRecordError(
            f"{self._count} batches are invalid, the first: {first.reason}",
            path=self._path,
            position=first.position,
        )

    def stopped(self, error: CorruptRecordError) -> CorruptRecordError:
        """`error`, the bytes the listing stopped at, with the invalid batches before them
        said too (they would otherwise go unsaid: the listing ends there)."""
        first = self._first
        if first is None:
            return error
        before = (
            f"a batch before them is invalid, at position {first.position}"
            if self._count == 1
            else f"{self._count} batches before them are invalid, the first at position "
            f"{first.position}"
        )
        return CorruptRecordError(
            f"{error.reason}; {before}: {first.reason}", path=error.path, position=error.position
        )


def batch_problem(data: Buffer, info: BatchInfo) -> CorruptRecordError | None:
    """What makes a structurally sound batch invalid: its CRC, or an unknown codec."""
    try:
        if info.header is not None:
            validate_v2_header(data, info.header, check=True)
            attributes = info.header.attributes
        else:
            end = info.position + info.size
            attributes = legacy.read_legacy_entry(
                data, info.position, end, verify_crc=True
            ).attributes
        _codec(attributes)
    except CorruptRecordError as e:
        return e
    return None


def _at_batch(e: CorruptRecordError, path: Path, info: BatchInfo) -> CorruptRecordError:
    """`e` naming `path`, and the batch's position when `e` has none of its own."""
    if e.position is None:
        return CorruptRecordError(e.reason, path=path, position=info.position)
    return e.located(path)


def _batch_line(data: Buffer, info: BatchInfo, *, valid: bool) -> str:
    h = info.header
    if h is not None:
        head = _v2_fields(h)
        timestamp_type = h.timestamp_type.kafka_name
        attributes, crc = h.attributes, h.crc
    else:
        entry = legacy_entry(data, info)
        head = f"offset: {info.last_offset}"
        timestamp_type = legacy_timestamp_type(entry)
        attributes, crc = entry.attributes, entry.crc
    return (
        f"{head} position: {info.position} {timestamp_type}: {info.max_timestamp} "
        f"size: {info.size} magic: {info.magic} compresscodec: {codec_name(attributes)} "
        f"crc: {crc} isvalid: {_bool(valid)}"
    )


def _v2_fields(h: BatchHeader) -> str:
    horizon = (
        f"OptionalLong[{h.delete_horizon_ms}]" if h.has_delete_horizon else "OptionalLong.empty"
    )
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} "
        f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
        f"partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {_bool(h.is_transactional)} isControl: {_bool(h.is_control)} "
        f"deleteHorizonMs: {horizon}"
    )


def _record_lines(data: Buffer, info: BatchInfo, options: DumpOptions) -> Iterator[str]:
    h = info.header
    if h is None:
        yield from _legacy_record_lines(data, info, options)
        return
    timestamp_type = h.timestamp_type.kafka_name
    for record in iter_records(data, info):
        line = (
            f"| offset: {record.offset} {timestamp_type}: {record.timestamp} "
            f"keySize: {_size(record.key)} valueSize: {_size(record.value)} "
            f"sequence: {_sequence(h, record)} "
            f"headerKeys: [{','.join(header.key for header in record.headers)}]"
        )
        if h.is_control:
            yield line + _control_text(record)
        else:
            yield line + (_contents(record.key, record.value) if options.print_data_log else "")


def _legacy_record_lines(data: Buffer, info: BatchInfo, options: DumpOptions) -> Iterator[str]:
    wrapper = legacy_entry(data, info)
    timestamp_type = legacy_timestamp_type(wrapper)
    if wrapper.compression is Compression.NONE:
        entries, offsets, timestamps = [wrapper], [wrapper.offset], [wrapper.timestamp]
    else:
        # Inner messages carry their own CRCs, which Kafka prints per record.
        _, entries = legacy.decompress_wrapper(wrapper, verify_crc=True)
        offsets = legacy.inner_offsets(wrapper, entries)
        timestamps = legacy.inner_timestamps(wrapper, entries)
    for entry, offset, timestamp in zip(entries, offsets, timestamps, strict=True):
        line = (
            f"| offset: {offset} {timestamp_type}: {timestamp} "
            f"keySize: {_size(entry.key)} valueSize: {_size(entry.value)} "
            f"isValid: true crc: {entry.crc}"
        )
        yield line + (_contents(entry.key, entry.value) if options.print_data_log else "")


def legacy_entry(data: Buffer, info: BatchInfo) -> legacy.LegacyEntry:
    end = info.position + info.size
    return legacy.read_legacy_entry(data, info.position, end, verify_crc=False)


def legacy_timestamp_type(entry: legacy.LegacyEntry) -> str:
    kind = entry.timestamp_type
    return "NoTimestampType" if kind is None else kind.kafka_name


def _control_text(record: Record) -> str:
    kind = control_type(record)
    if kind in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        marker = decode_end_txn_marker(record)
        return (
            f" endTxnMarker: {marker.type.kafka_name} coordinatorEpoch: {marker.coordinator_epoch}"
        )
    if isinstance(kind, ControlRecordType):
        return f" {kind.kafka_name}"
    return f" controlType: UNKNOWN({kind})"


def _contents(key: bytes | None, value: bytes | None) -> str:
    text = ""
    if key is not None:
        text += f" key: {key.decode('utf-8', 'replace')}"
    if value is not None:
        text += f" payload: {value.decode('utf-8', 'replace')}"
    return text


def _sequence(h: BatchHeader, record: Record) -> int:
    if h.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return (h.base_sequence + record.offset - h.base_offset) % _SEQUENCE_MODULUS


def _size(field: bytes | None) -> int:
    return -1 if field is None else len(field)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _codec(attributes: int) -> Compression:
    codec_id = attributes & COMPRESSION_MASK
    try:
        return Compression(codec_id)
    except ValueError:
        raise CorruptRecordError(f"unknown compression codec id {codec_id}") from None


def codec_name(attributes: int) -> str:
    """Kafka's CompressionType name (none, gzip, snappy, lz4, zstd)."""
    try:
        return _codec(attributes).name.lower()
    except CorruptRecordError:
        return f"unknown({attributes & COMPRESSION_MASK})"


# ---------------------------------------------------------------------------
# Indexes


def offset_index_entries(path: Path, base_offset: int) -> Iterator[OffsetPosition]:
    """The entries of the `.index` at `path`, up to a zero-filled preallocated tail."""
    index = OffsetIndex.load(path, base_offset)
    for n in range(index.entries):
        entry = index.entry_at(n)
        if n > 0 and entry.offset == base_offset:
            return  # the zero-filled tail of a preallocated index, as Kafka stops there
        yield entry


def time_index_entries(path: Path, base_offset: int) -> Iterator[TimestampOffset]:
    """The entries of the `.timeindex` at `path`, up to a zero-filled preallocated tail."""
    index = TimeIndex.load(path, base_offset)
    for n in range(index.entries):
        entry = index.entry_at(n)
        if n > 0 and entry.offset == base_offset:
            return
        yield entry


def txn_index_entries(path: Path, base_offset: int) -> list[AbortedTxn]:
    """The aborted transactions of the `.txnindex` at `path`."""
    return TransactionIndex.load(path, base_offset).entries


def _offset_index_lines(path: Path, base_offset: int, options: DumpOptions) -> Iterator[str]:
    empty = True
    for entry in offset_index_entries(path, base_offset):
        empty = False
        yield f"offset: {entry.offset} position: {entry.position}"
    if empty:
        yield f"{path} is empty."


def _time_index_lines(path: Path, base_offset: int, options: DumpOptions) -> Iterator[str]:
    for entry in time_index_entries(path, base_offset):
        yield f"timestamp: {entry.timestamp} offset: {entry.offset}"


def _txn_index_lines(path: Path, base_offset: int, options: DumpOptions) -> Iterator[str]:
    for txn in txn_index_entries(path, base_offset):
        yield (
            f"version: {TXN_ENTRY_VERSION} producerId: {txn.producer_id} "
            f"firstOffset: {txn.first_offset} lastOffset: {txn.last_offset} "
            f"lastStableOffset: {txn.last_stable_offset}"
        )


def snapshot_entries(path: Path) -> list[ProducerEntry]:
    """The producer entries of the `.snapshot` at `path`, by producer id."""
    state = read_snapshot(path)
    return [state.entries[pid] for pid in sorted(state.entries)]


def _snapshot_lines(path: Path, base_offset: int, options: DumpOptions) -> Iterator[str]:
    for e in snapshot_entries(path):
        yield (
            f"producerId: {e.producer_id} producerEpoch: {e.epoch} "
            f"coordinatorEpoch: {e.coordinator_epoch} "
            f"currentTxnFirstOffset: {e.txn_first_offset if e.txn_first_offset >= 0 else None} "
            f"lastTimestamp: {e.timestamp} lastSequence: {e.last_sequence} "
            f"lastOffset: {e.last_offset} offsetDelta: {e.offset_delta}"
        )


_Dumper = Callable[[Path, int, DumpOptions], Iterator[str]]

_DUMPERS: Final[dict[str, _Dumper]] = {
    LOG_FILE_SUFFIX: _log_lines,
    INDEX_FILE_SUFFIX: _offset_index_lines,
    TIME_INDEX_FILE_SUFFIX: _time_index_lines,
    TXN_INDEX_FILE_SUFFIX: _txn_index_lines,
    PRODUCER_SNAPSHOT_FILE_SUFFIX: _snapshot_lines,
}


ARGS: Final[tuple[Arg, ...]] = (
    (
        ("files",),
        {
            "type": Path,
            "nargs": "+",
            "metavar": "FILE",
            "help": ".log, .index, .timeindex, .txnindex or .snapshot files",
        },
    ),
    (("--deep-iteration",), {"action": "store_true", "help": "also print every record"}),
    (
        ("--print-data-log",),
        {
            "action": "store_true",
            "help": "also print every record's key and value (implies --deep-iteration)",
        },
    ),
    (
        ("--json",),
        {
            "action": "store_true",
            "help": "print one JSON object per line for each batch, record and index entry "
            "(fields: see the README's `dump --json`)",
        },
    ),
    (
        ("--utf8",),
        {
            "action": "store_true",
            "help": "with --json --print-data-log: keys, values and header values as UTF-8 "
            "text (key, value, headers) where valid, base64 (key_b64, ...) where not; "
            "default: always base64",
        },
    ),
)


def run(args: argparse.Namespace) -> int:
    """The `dump` command: every file in turn; exit 1 if any could not be read whole."""
    options = DumpOptions(deep_iteration=args.deep_iteration, print_data_log=args.print_data_log)
    if args.utf8 and not args.json:
        print_error("dump", CleanerdError("--utf8 applies to --json output only"))
        return 2
    status = 0
    for path in args.files:
        try:
            if args.json:
                # dump_json builds on this module's readers, so it is imported here
                from cleanerd.commands.dump_json import dump_file_json

                for obj in dump_file_json(path, options, utf8=args.utf8):
                    print(json.dumps(obj, ensure_ascii=False))
            else:
                for line in dump_file(path, options):
                    print(line)
        except BrokenPipeError:
            raise  # the reader is gone: stop (the CLI exits as SIGPIPE would)
        except (CleanerdError, OSError) as e:
            print_error("dump", e)
            status = 1
    return status
