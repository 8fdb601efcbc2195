"""What passes between the Spark engine and a job process: the files of a staging dir.

The engine (`engine.py`, in the daemon's or a command's process) writes a spec into a
fresh staging dir and starts a job process on it; the job writes its results there and
exits; the engine reads them once the job has ended, then removes the dir. Files:

    spec.json                  a clean job's `JobSpec` or an audit job's `AuditSpec`
    manifest.json              the clean job's `Manifest`: per pass its `.cleaned` output
                               or why it failed
    report.json                the audit job's `AuditReport`
    errors/<group>-<seg>.txt   why segment <seg> of pass or partition <group> could not be
                               decoded (the first of a group is the group's error)
    pass-<i>/<base>.superseded the clean job's own bitmaps (`clean_job`)
    progress/<group>-<seg>-<bytes>
                               empty: segment <seg> of partition <group>, of <bytes>
                               bytes, was decoded (or found unreadable) by an executor;
                               the caller counts them while the job runs (progress)

The JSON documents are these pydantic dataclasses as pydantic serializes them (tuples as
lists, paths as strings, header names as hex), validated when read back, so a value read
is a value written; each is written whole (a tmp file renamed) and carries `version`, so
a document of another version is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Final, Literal, Self

from pydantic import ConfigDict, TypeAdapter
from pydantic.dataclasses import dataclass

from cleanerd.compaction.audit import PartitionAudit, audit_scope
from cleanerd.compaction.cleaner import CleanedGroup, CleanerConfig
from cleanerd.compaction.stats import CleanerStats
from cleanerd.compaction.strategy import ResolvedStrategy, resolve_strategy
from cleanerd.errors import CleanerdError, file_step
from cleanerd.log.files import TopicPartition
from cleanerd.log.meta import SegmentMeta
from cleanerd.log.partition_log import PartitionLog
from cleanerd.log.topic_config import TopicConfig
from cleanerd.log.txnindex import AbortedTxn

SPEC: Final = "spec.json"
MANIFEST: Final = "manifest.json"
REPORT: Final = "report.json"
SPEC_VERSION: Final = 1

_CONFIG: Final = ConfigDict(extra="forbid", ser_json_bytes="hex", val_json_bytes="hex")


class _Document:
    """A spec, manifest or report: one JSON file of the staging dir."""

    __slots__ = ()

    def write(self, path: Path) -> None:
        """Write the document (tmp file and rename: a reader never sees half)."""
        tmp = path.with_name(path.name + ".tmp")
        with file_step(f"staging the Spark job's {path.name}", path):
            tmp.write_bytes(TypeAdapter(type(self)).dump_json(self))
            tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> Self:
        """The document `write` wrote; a pydantic ValidationError (a ValueError) for
        anything else, a document of another version included."""
        document: Self = TypeAdapter(cls).validate_json(path.read_bytes())
        return document


# ---------------------------------------------------------------------------------------
# The clean job


@dataclass(frozen=True, slots=True, config=_CONFIG)
class PassSpec:
    """One partition's pass, as a local pass would be given it."""

    log_dir: Path
    tp: TopicPartition
    segments: tuple[SegmentMeta, ...]
    first_dirty: int
    first_uncleanable: int
    now_ms: int
    config: CleanerConfig
    read_root: str | None = None
    """The partition dir as the executors reach it (a Hadoop filesystem URI), when they
    cannot read `log_dir` directly."""

    @property
    def dir_path(self) -> Path:
        """The partition dir."""
        return self.log_dir / str(self.tp)

    def segment(self, base: int) -> SegmentMeta:
        """The segment based at `base`."""
        return next(s for s in self.segments if s.base_offset == base)


@dataclass(frozen=True, slots=True, config=_CONFIG)
class JobSpec(_Document):
    """What one clean job does: `passes`, staged under `staging`, on `master`."""

    passes: tuple[PassSpec, ...]
    staging: Path
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    version: Literal[1] = SPEC_VERSION


@dataclass(frozen=True, slots=True, config=_CONFIG)
class PassOutcome:
    """What the job did for one pass: its `.cleaned` output, or why it failed."""

    end_offset: int
    cleaned: tuple[CleanedGroup, ...] = ()
    stats: CleanerStats | None = None
    error: str | None = None
    errno: int | None = None
    """The errno of the file operation behind `error`, when one failed (a full disk)."""


@dataclass(frozen=True, slots=True, config=_CONFIG)
class Manifest(_Document):
    """The clean job's result: one outcome per pass of the spec, in order, and its
    timings."""

    outcomes: tuple[PassOutcome, ...]
    startup_ms: int = 0
    """Starting Spark (JVM, session)."""
    reduce_ms: int = 0
    """Decode, shuffle and bitmaps."""
    copy_ms: int = 0
    """Writing the `.cleaned` output."""
    version: Literal[1] = SPEC_VERSION


# ---------------------------------------------------------------------------------------
# The audit job


@dataclass(frozen=True, slots=True, config=_CONFIG)
class AuditPartition:
    """One partition to audit, with what needs the whole partition already computed
    (`audit.AuditScope`)."""

    log_dir: Path
    tp: TopicPartition
    segments: tuple[int, ...]
    """Base offsets of the segments to read, ascending."""
    strategy: ResolvedStrategy
    stable_offset: int
    aborted: tuple[AbortedTxn, ...]
    max_compaction_lag_ms: int
    error: str | None = None
    """Why the partition could not be opened (nothing is read then)."""

    @property
    def dir_path(self) -> Path:
        """The partition dir."""
        return self.log_dir / str(self.tp)


def audit_partition_spec(plog: PartitionLog, topic: TopicConfig) -> AuditPartition:
    """What the audit job needs of one partition, computed as `audit.audit_partition`
    does (a partition whose metadata cannot be read carries the error)."""
    entry = AuditPartition(
        log_dir=plog.log_dir,
        tp=plog.topic_partition,
        segments=(),
        strategy=resolve_strategy(topic.compaction_strategy, topic.compaction_strategy_header),
        stable_offset=0,
        aborted=(),
        max_compaction_lag_ms=topic.max_compaction_lag_ms,
    )
    try:
        scope = audit_scope(plog)
    except CleanerdError as exc:
        return dataclasses.replace(entry, error=str(exc))
    return dataclasses.replace(
        entry,
        segments=tuple(s.base_offset for s in scope.segments),
        stable_offset=scope.stable_offset,
        aborted=scope.aborted,
    )


@dataclass(frozen=True, slots=True, config=_CONFIG)
class AuditSpec(_Document):
    """One audit job: the partitions, when and how strictly, and where the output goes."""

    partitions: tuple[AuditPartition, ...]
    now_ms: int
    slack_ms: int
    max_listed: int
    staging: Path
    parquet: str | None = None
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    version: Literal[1] = SPEC_VERSION


@dataclass(frozen=True, slots=True, config=_CONFIG)
class AuditReport(_Document):
    """The audit job's result: the partitions' audits in spec order."""

    audits: tuple[PartitionAudit, ...]
    elapsed_ms: int
    version: Literal[1] = SPEC_VERSION


# ---------------------------------------------------------------------------------------
# Segments that could not be decoded


def record_error(staging: Path, group: int, segment: int, exc: BaseException) -> None:
    """Record why segment `segment` of pass or partition `group` could not be decoded."""
    errors = staging / "errors"
    path = errors / f"{group:08d}-{segment:020d}.txt"
    with file_step("recording why a segment could not be decoded", path):
        errors.mkdir(parents=True, exist_ok=True)
        path.write_text(str(exc))


def recorded_errors(staging: Path) -> dict[int, str]:
    """Per pass or partition with a recorded error: that of its first such segment."""
    errors = staging / "errors"
    found: dict[int, str] = {}
    if errors.is_dir():
        for path in sorted(errors.iterdir()):
            found.setdefault(int(path.name.split("-")[0]), path.read_text())
    return found


# ---------------------------------------------------------------------------------------
# Progress: the segments executors are done with


def record_progress(staging: Path, group: int, segment: int, size: int) -> None:
    """Mark segment `segment` (of `size` bytes) of pass or partition `group` as decoded.
    One empty file per segment: a retried Spark task marks the same name again, and a
    reader lists the dir without reading any file."""
    done = staging / "progress"
    mark = done / f"{group:08d}-{segment:020d}-{size}"
    with file_step("marking a segment decoded", mark):
        done.mkdir(parents=True, exist_ok=True)
        mark.touch()


def progress_marks(staging: Path) -> dict[str, int]:
    """The segments marked so far: mark name -> its bytes."""
    try:
        names = [entry.name for entry in (staging / "progress").iterdir()]
    except FileNotFoundError:
        return {}
    return {name: int(name.rsplit("-", 1)[1]) for name in names}
