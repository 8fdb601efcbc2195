"""`cleanerd dump --json`: one JSON object per line for each batch, record and index entry.

Every object has `type` and `file` (the path as given). Types and fields:

- `batch` (a v2 batch or a legacy magic 0/1 entry): `position`, `size`, `magic`,
  `base_offset`, `last_offset`, `count`, `partition_leader_epoch`, `crc`, `crc_valid`,
  `codec` (`none`, `gzip`, `snappy`, `lz4`, `zstd`, `unknown(<id>)`),
  `timestamp_type` (`CreateTime`, `LogAppendTime`, `NoTimestampType`),
  `base_timestamp`, `max_timestamp`, `producer_id`, `producer_epoch`, `base_sequence`,
  `last_sequence`, `transactional`, `control`, `control_type` (the control record's
  type: `COMMIT`, `ABORT`, `LeaderChange`, ..., `UNKNOWN(<n>)`; null for a data batch or
  an emptied control batch), `delete_horizon_ms` (null when unset) and `error` (null, or
  why the batch is invalid). Fields a legacy entry does not have (the producer fields,
  `base_timestamp`, `partition_leader_epoch`) are null, and so is its `count` when its
  messages could not be decoded.
- `record`, with `--deep-iteration` or `--print-data-log`, after its batch: `offset`,
  `timestamp`, `size`, `key_size` and `value_size` (-1 for null), `sequence` (-1 when
  the batch has none or is legacy), `header_keys`, `control_type` (as on the batch), and
  for a transaction marker `coordinator_epoch`. With `--print-data-log` also the key,
  the value and the headers, each in a field whose name says its encoding: `key_b64`,
  `value_b64` and `headers_b64` (a list of `[key, value]` pairs, values base64) by
  default; with `--utf8`, `key`, `value` and `headers` as UTF-8 text wherever the bytes
  are valid UTF-8, and the `_b64` field for any that are not. null is null in both. A
  record printed with `--utf8` thus uses `cleanerd produce`'s input field names.
- `invalid_bytes`: the incomplete batch a crash mid-append leaves at the end of a
  segment, or the zeros after the last batch of a preallocated one: `position` and
  `size` (Kafka's "Found N invalid bytes at the end").
- `offset_index_entry` (`.index`): `offset`, `position`; `time_index_entry`
  (`.timeindex`): `timestamp`, `offset`; `txn_index_entry` (`.txnindex`): `version`,
  `producer_id`, `first_offset`, `last_offset`, `last_stable_offset`.

A batch whose framing is sound but whose CRC, codec or records are bad is printed with
`crc_valid`/`error` saying so and no records, and the listing goes on to the next batch;
the file then ends with a CorruptRecordError naming the first bad batch (so the command
exits 1 with the whole listing printed). Bytes that cannot be framed as a batch end the
listing with an error naming the position, as in the text output.

Records come from `segment_columns` (one decode per run of valid batches); the loop
here turns rows into JSON objects and is output formatting, not a hot path.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from cleanerd.commands.dump import (
    DumpOptions,
    InvalidBatches,
    batch_problem,
    closed_segment_cut_short,
    codec_name,
    cut_short,
    dumpable_base_offset,
    legacy_entry,
    legacy_timestamp_type,
    log_windows,
    offset_index_entries,
    segment_place,
    snapshot_entries,
    time_index_entries,
    txn_index_entries,
)
from cleanerd.errors import CorruptRecordError
from cleanerd.log.files import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
)
from cleanerd.log.segment_reader import map_file
from cleanerd.log.txnindex import TXN_ENTRY_VERSION
from cleanerd.records import legacy
from cleanerd.records.columns import SegmentColumns, segment_columns
from cleanerd.records.control import (
    NO_CONTROL_RECORD,
    ControlRecordType,
    control_type_column,
    decode_end_txn_marker,
)
from cleanerd.records.header import NO_SEQUENCE, Buffer, check_crc
from cleanerd.records.record import Record
from cleanerd.records.scan import BatchInfo
from cleanerd.records.walker import Walk

JsonObject = dict[str, Any]

_SEQUENCE_MODULUS: Final = 2**31


def dump_file_json(path: Path, options: DumpOptions, *, utf8: bool = False) -> Iterator[JsonObject]:
    """Yield the JSON objects of `path`, a `.log`, `.index`, `.timeindex`, `.txnindex` or
    `.snapshot`.

    Raises as `dump_file` does: UnsupportedFileError before any object, OSError, and
    CorruptRecordError or CorruptIndexError after the objects that precede the bad bytes
    (for a `.log`, after the whole listing when only whole batches are bad)."""
    base_offset = dumpable_base_offset(path)
    file = str(path)
    if path.suffix == LOG_FILE_SUFFIX:
        yield from _log_objects(path, options, utf8)
    elif path.suffix == INDEX_FILE_SUFFIX:
        for entry in offset_index_entries(path, base_offset):
            yield {
                "type": "offset_index_entry",
                "file": file,
                "offset": entry.offset,
                "position": entry.position,
            }
    elif path.suffix == TIME_INDEX_FILE_SUFFIX:
        for time_entry in time_index_entries(path, base_offset):
            yield {
                "type": "time_index_entry",
                "file": file,
                "timestamp": time_entry.timestamp,
                "offset": time_entry.offset,
            }
    elif path.suffix == PRODUCER_SNAPSHOT_FILE_SUFFIX:
        for e in snapshot_entries(path):
            yield {
                "type": "producer_snapshot_entry",
                "file": file,
                "producer_id": e.producer_id,
                "producer_epoch": e.epoch,
                "coordinator_epoch": e.coordinator_epoch,
                "current_txn_first_offset": e.txn_first_offset if e.txn_first_offset >= 0 else None,
                "last_timestamp": e.timestamp,
                "last_sequence": e.last_sequence,
                "last_offset": e.last_offset,
                "offset_delta": e.offset_delta,
            }
    else:
        for txn in txn_index_entries(path, base_offset):
            yield {
                "type": "txn_index_entry",
                "file": file,
                "version": TXN_ENTRY_VERSION,
                "producer_id": txn.producer_id,
                "first_offset": txn.first_offset,
                "last_offset": txn.last_offset,
                "last_stable_offset": txn.last_stable_offset,
            }


# ---------------------------------------------------------------------------
# .log


def _log_objects(path: Path, options: DumpOptions, utf8: bool) -> Iterator[JsonObject]:
    data = map_file(path)
    file = str(path)
    last: Walk | None = None
    invalid = InvalidBatches(path)
    place = segment_place(path, dumpable_base_offset(path))
    for infos, scan in log_windows(data, place.offsets):
        last = scan
        problems: dict[int, CorruptRecordError] = {}
        for i, info in enumerate(infos):
            problem = batch_problem(data, info)
            if problem is not None:
                problems[i] = problem
        decoded = _decode_runs(data, infos, problems)
        types: dict[int, NDArray[np.int64]] = {}  # per decoded run: its control types
        for i, info in enumerate(infos):
            cols, row = decoded.get(i, (None, -1))
            kind = None
            if cols is not None and info.header is not None and info.header.is_control:
                column = types.setdefault(id(cols), control_type_column(cols))
                kind = _known(int(column[row]))
            obj = _batch_object(data, info, kind, file)
            if obj["count"] is None and cols is not None:
                obj["count"] = int(cols.records_count[row])  # a legacy entry's, once decoded
            obj["error"] = None if i not in problems else problems[i].reason
            yield obj
            if i in problems:
                invalid.add(problems[i], info)
            if cols is not None and options.records:
                yield from _record_objects(cols, row, kind, file, options, utf8)
    if last is not None and last.error is not None:
        if not cut_short(data, last):
            raise invalid.stopped(last.error.located(path))
        yield {
            "type": "invalid_bytes",
            "file": file,
            "position": last.stop,
            "size": len(data) - last.stop,
        }
        if (damage := closed_segment_cut_short(path, place, last.stop, len(data))) is not None:
            raise invalid.stopped(damage)
    invalid.check()


def _decode_runs(
    data: Buffer, batches: list[BatchInfo], problems: dict[int, CorruptRecordError]
) -> dict[int, tuple[SegmentColumns, int]]:
    """Batch index -> (its run's columns, its row there), for every batch outside
    `problems`. A batch whose records do not decode joins `problems` (with the decoder's
    error) and the runs around it are decoded again."""
    while True:
        out: dict[int, tuple[SegmentColumns, int]] = {}
        for run in _runs(len(batches), problems):
            first, last = batches[run[0]], batches[run[-1]]
            try:
                cols = segment_columns(
                    data, start=first.position, end=last.position + last.size, verify_crc=False
                )
            except CorruptRecordError as e:
                position = first.position if e.position is None else e.position
                bad = _batch_at(batches, position)
                # A position outside the run cannot be placed: blame its first batch,
                # so that every round takes one batch out and the loop ends.
                problems[bad if bad in run else run[0]] = e
                break
            out.update((b, (cols, row)) for row, b in enumerate(run))
        else:
            return out


def _runs(count: int, problems: dict[int, CorruptRecordError]) -> Iterator[list[int]]:
    run: list[int] = []
    for i in range(count):
        if i in problems:
            if run:
                yield run
            run = []
        else:
            run.append(i)
    if run:
        yield run


def _batch_at(batches: list[BatchInfo], position: int) -> int:
    starts = np.fromiter((b.position for b in batches), np.int64, len(batches))
    return max(int(np.searchsorted(starts, position, side="right")) - 1, 0)


def _batch_object(
    data: Buffer, info: BatchInfo, kind: ControlRecordType | int | None, file: str
) -> JsonObject:
    h = info.header
    obj: JsonObject = {"type": "batch", "file": file, "position": info.position}
    obj["size"] = info.size
    obj["magic"] = info.magic
    obj["base_offset"] = info.base_offset
    obj["last_offset"] = info.last_offset
    if h is not None:
        obj.update(
            count=h.records_count,
            partition_leader_epoch=h.partition_leader_epoch,
            crc=h.crc,
            crc_valid=check_crc(data, h),
            codec=codec_name(h.attributes),
            timestamp_type=h.timestamp_type.kafka_name,
            base_timestamp=h.base_timestamp,
            max_timestamp=h.max_timestamp,
            producer_id=h.producer_id,
            producer_epoch=h.producer_epoch,
            base_sequence=h.base_sequence,
            last_sequence=h.last_sequence,
            transactional=h.is_transactional,
            control=h.is_control,
            control_type=_control_name(kind),
            delete_horizon_ms=h.delete_horizon_ms if h.has_delete_horizon else None,
        )
        return obj
    entry = legacy_entry(data, info)
    obj.update(
        count=None,
        partition_leader_epoch=None,
        crc=entry.crc,
        crc_valid=_legacy_crc_valid(data, info),
        codec=codec_name(entry.attributes),
        timestamp_type=legacy_timestamp_type(entry),
        base_timestamp=None,
        max_timestamp=info.max_timestamp,
        producer_id=None,
        producer_epoch=None,
        base_sequence=None,
        last_sequence=None,
        transactional=False,
        control=False,
        control_type=None,
        delete_horizon_ms=None,
    )
    return obj


def _legacy_crc_valid(data: Buffer, info: BatchInfo) -> bool:
    try:
        legacy.read_legacy_entry(data, info.position, info.position + info.size, verify_crc=True)
    except CorruptRecordError:
        return False
    return True


def _known(value: int) -> ControlRecordType | int | None:
    """A value of `control_type_column` as `control_type` gives it (None: no record)."""
    if value == NO_CONTROL_RECORD:
        return None
    try:
        return ControlRecordType(value)
    except ValueError:
        return value


def _control_name(kind: ControlRecordType | int | None) -> str | None:
    if kind is None:
        return None
    if isinstance(kind, ControlRecordType):
        return kind.kafka_name
    return f"UNKNOWN({kind})"


def _record_objects(
    cols: SegmentColumns,
    row: int,
    kind: ControlRecordType | int | None,
    file: str,
    options: DumpOptions,
    utf8: bool,
) -> Iterator[JsonObject]:
    first = int(cols.batch_first_record[row])
    stop = first + int(cols.records_count[row])
    offsets = cols.offset[first:stop]
    base_sequence = int(cols.base_sequence[row])
    if int(cols.batch_magic[row]) != 2 or base_sequence == NO_SEQUENCE:
        sequences = np.full(len(offsets), NO_SEQUENCE, np.int64)
    else:
        deltas = offsets - int(cols.base_offset[row])
        sequences = (base_sequence + deltas) % _SEQUENCE_MODULUS
    control = _control_name(kind)
    marker = kind in (ControlRecordType.ABORT, ControlRecordType.COMMIT)
    for i, offset, timestamp, size, key_len, value_len, sequence in zip(
        range(first, stop),
        offsets.tolist(),
        cols.timestamp[first:stop].tolist(),
        cols.record_size[first:stop].tolist(),
        cols.key_len[first:stop].tolist(),
        cols.value_len[first:stop].tolist(),
        sequences.tolist(),
        strict=True,
    ):
        headers = cols.headers(i)
        obj: JsonObject = {
            "type": "record",
            "file": file,
            "offset": offset,
            "timestamp": timestamp,
            "size": size,
            "key_size": key_len,
            "value_size": value_len,
            "sequence": sequence,
            "header_keys": [header.key for header in headers],
            "control_type": control,
        }
        key, value = cols.key(i), cols.value(i)
        if marker:
            record = Record(offset, timestamp, key, value)
            obj["coordinator_epoch"] = decode_end_txn_marker(record).coordinator_epoch
        if options.print_data_log:
            _put_bytes(obj, "key", key, utf8)
            _put_bytes(obj, "value", value, utf8)
            pairs = [(header.key, header.value) for header in headers]
            if utf8 and all(_text(v) is not None or v is None for _, v in pairs):
                obj["headers"] = [[k, None if v is None else _text(v)] for k, v in pairs]
            else:
                obj["headers_b64"] = [[k, _b64(v)] for k, v in pairs]
        yield obj


def _put_bytes(obj: JsonObject, name: str, field: bytes | None, utf8: bool) -> None:
    """`obj[name]` = the UTF-8 text of `field` when asked for and valid, else
    `obj[name_b64]` = its base64 (null stays null, under the requested name)."""
    text = _text(field) if utf8 else None
    if field is None:
        obj[name if utf8 else f"{name}_b64"] = None
    elif text is not None:
        obj[name] = text
    else:
        obj[f"{name}_b64"] = _b64(field)


def _text(field: bytes | None) -> str | None:
    if field is None:
        return None
    try:
        return field.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _b64(field: bytes | None) -> str | None:
    return None if field is None else base64.b64encode(field).decode("ascii")
