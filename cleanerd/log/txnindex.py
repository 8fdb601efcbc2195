"""Kafka's transaction index (`.txnindex`): the aborted transactions of a segment.

On-disk format (Kafka's AbortedTxn), big-endian, 34-byte entries back to back::

    version           int16   0
    producerId        int64
    firstOffset       int64   first data offset of the transaction
    lastOffset        int64   offset of its ABORT marker
    lastStableOffset  int64   the partition's LSO when the abort completed

An entry is stored in the segment that holds the ABORT marker, appended in marker order,
so last offsets strictly increase within a file. Kafka creates the file only when its
first entry is appended; a segment without aborted transactions has no `.txnindex`.

Lookup for a fetch range `[from, to)` (Kafka's collectAbortedTxns) returns every entry
whose transaction overlaps the range (`lastOffset >= from` and `firstOffset < to`). A
caller walks segments from the one holding `from` onward and may stop as soon as one
entry has `lastStableOffset >= to`: no later abort can reach back into the range, since
every transaction still open when it completed began at or after that LSO.

Appends go to the end of the file right after the marker batch is in the log, so a
crash leaves at most an entry missing, which Kafka rebuilds from the log on recovery.

Which transactions are still open is the other half of a partition's transaction state
(it bounds the last stable offset): `producer_state.py` keeps it, with Kafka's producer
snapshots.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cleanerd.errors import CorruptIndexError
from cleanerd.log.fsutil import adopt_owner, atomic_write, fsync_file

TXN_ENTRY: Final = struct.Struct(
    ">h"  # version
    "q"  # producerId
    "q"  # firstOffset
    "q"  # lastOffset
    "q"  # lastStableOffset
)
assert TXN_ENTRY.size == 34
TXN_ENTRY_VERSION: Final = 0


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    """One aborted transaction; orders by first offset (then producer id)."""

    first_offset: int
    producer_id: int
    last_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        """The 34-byte entry."""
        return TXN_ENTRY.pack(
            TXN_ENTRY_VERSION,
            self.producer_id,
            self.first_offset,
            self.last_offset,
            self.last_stable_offset,
        )


@dataclass(frozen=True, slots=True)
class TxnIndexSearchResult:
    """Aborted transactions overlapping a range; `is_complete` when no later segment can
    add more (an entry's LSO reached the range end)."""

    aborted: list[AbortedTxn]
    is_complete: bool


def parse_txn_index(data: bytes, path: Path | str) -> list[AbortedTxn]:
    """Decode a whole `.txnindex` file's bytes."""
    if len(data) % TXN_ENTRY.size:
        raise CorruptIndexError(
            f"size {len(data)} is not a multiple of the entry size {TXN_ENTRY.size}: "
            f"truncated entry at position {len(data) - len(data) % TXN_ENTRY.size}",
            path=path,
        )
    entries = []
    for position in range(0, len(data), TXN_ENTRY.size):
        version, pid, first, last, lso = TXN_ENTRY.unpack_from(data, position)
        if version != TXN_ENTRY_VERSION:
            raise CorruptIndexError(
                f"unexpected entry version {version} at position {position}", path=path
            )
        entries.append(AbortedTxn(first, pid, last, lso))
    return entries


class TransactionIndex:
    """A segment's `.txnindex`, held in memory; appends also go to the file."""

    def __init__(
        self, path: Path | str, base_offset: int, entries: Iterable[AbortedTxn] = ()
    ) -> None:
        self._os_path = os.fspath(path)  # a `Path` is built only when asked for
        self.base_offset = base_offset
        self._entries = list(entries)

    @functools.cached_property
    def path(self) -> Path:
        """The `.txnindex` file."""
        return Path(self._os_path)

    @classmethod
    def load(cls, path: Path | str, base_offset: int) -> TransactionIndex:
        """Read `path`; an absent file holds no entries."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # the usual case: one failed open, no stat first
            return cls(path, base_offset)
        return cls(path, base_offset, parse_txn_index(data, path))

    @property
    def entries(self) -> list[AbortedTxn]:
        """All entries, in file order."""
        return list(self._entries)

    def append(self, txn: AbortedTxn, *, write: bool = True) -> None:
        """Add `txn` (its last offset must exceed the previous one); with `write`,
        append it to the file, creating the file on the first entry."""
        if self._entries and txn.last_offset <= self._entries[-1].last_offset:
            raise ValueError(
                f"last offset {txn.last_offset} of an appended aborted transaction is not "
                f"above the current last offset {self._entries[-1].last_offset} in {self.path}"
            )
        self._entries.append(txn)
        if write:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            with open(os.open(self.path, flags, 0o644), "ab") as f:
                if os.fstat(f.fileno()).st_size == 0:  # created here: as its segment is
                    adopt_owner(f.fileno(), self._segment)
                f.write(txn.to_bytes())

    def rebuild(self, entries: list[AbortedTxn]) -> bool:
        """Make `entries` (rebuilt from the log) the index, replacing the file atomically
        (none when there are none) if they differ from what it holds; whether they did."""
        if entries == self._entries:
            return False
        self._entries = list(entries)
        self.write()
        return True

    def write(self) -> None:
        """Replace the file atomically with the entries (no file when there are none)."""
        if self._entries:
            data = b"".join(t.to_bytes() for t in self._entries)
            atomic_write(self.path, data, like=self._segment)
        else:
            self.path.unlink(missing_ok=True)

    @property
    def _segment(self) -> Path:
        """The segment file the index belongs to: what a new index takes its bits and
        group from, so that whoever may open the segment may open its index."""
        return self.path.with_suffix(".log")

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Entries overlapping `[fetch_offset, upper_bound_offset)` (Kafka's rule)."""
        found = []
        for txn in self._entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(found, is_complete=True)
        return TxnIndexSearchResult(found, is_complete=False)

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose marker is at or after `offset`, in memory and in the file."""
        kept = [t for t in self._entries if t.last_offset < offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            if self.path.exists():
                os.truncate(self.path, len(kept) * TXN_ENTRY.size)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError if an entry's marker lies below the segment's base."""
        for n, txn in enumerate(self._entries):
            if txn.last_offset < self.base_offset:
                raise CorruptIndexError(
                    f"entry {n} at position {n * TXN_ENTRY.size}: last offset "
                    f"{txn.last_offset} of an aborted transaction is below the base offset "
                    f"{self.base_offset}",
                    path=self.path,
                )

    def fsync(self) -> None:
        """fsync the file if it exists."""
        if self.path.exists():
            fsync_file(self.path)
