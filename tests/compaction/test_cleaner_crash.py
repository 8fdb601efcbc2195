"""Crash injection (borg style): a pass dies at every single file operation in turn; B's
recovery then leaves the partition holding exactly the records before or after the pass,
with consistent indexes, and the next pass completes. Plus SIGKILL of a real process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cleanerd.compaction.cleaner import CleanerConfig
from cleanerd.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from cleanerd.log.log_dir import LogDir
from cleanerd.log.meta import PartitionMeta
from cleanerd.log.partition_log import LogConfig
from cleanerd.log.recovery import SegmentOptions, recover_partition
from tests.compaction.conftest import LONG_MAX, TP, LogBuilder, clean, k, read_batches
from tests.compaction.crashing_ops import CrashingOps, SimulatedCrash
from tests.paths import REPO

OPTIONS = SegmentOptions(index_interval_bytes=64, max_index_size=10 * 1024 * 1024)
LOG_CONFIG = LogConfig(index_interval_bytes=64)

Records = frozenset[tuple[int, bytes | None, bytes | None]]


def build(root: Path) -> Path:
    """Four segments of duplicates, tombstones and an aborted transaction, plus an active one."""
    log = LogBuilder(root, index_interval=64)
    for i in range(12):
        log.append([(k(i % 5), k(i))])
    log.roll()
    log.append([(k(1), None)])
    log.append([(k(7), b"a"), (k(8), b"b")], pid=3, txn=True)
    log.abort(3)
    log.roll()
    for i in range(6):
        log.append([(k(i % 3), k(100 + i))])
    log.roll()
    log.append([(k(9), b"z")])
    log.roll()
    log.append([(k(0), b"active")])
    return log.write()


def records(d: Path) -> Records:
    out = set()
    last = -1
    for b in read_batches(d):
        assert b.header.base_offset > last, "offsets must increase across the log"
        last = b.header.last_offset
        out |= {(r.offset, r.key, r.value) for r in b.records}
    return frozenset(out)


def recover(d: Path) -> None:
    _, report = recover_partition(d, OPTIONS, recover=True, full_check=True)
    assert report.errors == []
    assert report.rebuilt_indexes == []
    leftovers = [p.name for p in d.iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    assert leftovers == []


def checkpoint(root: Path) -> int:
    path = root / CLEANER_OFFSET_CHECKPOINT
    return OffsetCheckpointFile(path).read().get(TP, 0) if path.exists() else 0


def cfg(segment_bytes: int, offset_range: int = 2**31 - 1) -> CleanerConfig:
    return CleanerConfig(
        segment_bytes=segment_bytes,
        index_interval_bytes=64,
        producer_id_expiration_ms=LONG_MAX,
        max_cleaned_offset_range=offset_range,
    )


@pytest.mark.parametrize(
    ("segment_bytes", "offset_range"),
    [(1 << 20, 2**31 - 1), (400, 2**31 - 1), (1 << 20, 6)],
    ids=["one-group", "several-groups", "one-group-several-outputs"],
)
def test_crash_at_every_file_operation(
    tmp_path: Path, segment_bytes: int, offset_range: int
) -> None:
    """Dying at any file operation leaves pre- or post-pass records, never a mix; a group
    whose output continued in several segments is swapped as one."""
    template = build(tmp_path / "template").parent
    ref = tmp_path / "reference"
    shutil.copytree(template, ref)
    pre = records(ref / "t-0")
    ops = CrashingOps()
    clean(ref / "t-0", ops=ops, config=cfg(segment_bytes, offset_range))
    post = records(ref / "t-0")
    assert post < pre
    assert ops.count > 20
    if offset_range < 2**31 - 1:
        assert sum(t.startswith("create") and ".log.cleaned" in t for t in ops.trace) > 1
    seen = set()
    for at in range(ops.count):
        root = tmp_path / f"crash-{at}"
        shutil.copytree(template, root)
        crashing = CrashingOps(at)
        with pytest.raises(SimulatedCrash):
            clean(root / "t-0", ops=crashing, config=cfg(segment_bytes, offset_range))
        crashing.die()
        recover(root / "t-0")
        state = records(root / "t-0")
        if segment_bytes == 1 << 20:  # one group: swapped as a whole
            assert state in (pre, post), f"mixed state after a crash at {ops.trace[at]}"
        else:  # groups swap one at a time: each group is before or after
            assert post <= state <= pre, f"lost or resurrected records at {ops.trace[at]}"
        seen.add(state == post)
        clean(root / "t-0", first_dirty=checkpoint(root), config=cfg(segment_bytes, offset_range))
        recover(root / "t-0")
        assert records(root / "t-0") == post
        shutil.rmtree(root)
    assert seen == {False, True}


def _kept(root: Path, state: Path) -> None:
    """What the daemon keeps after a cycle (`Maintenance.keep_known`), with the recovery
    point at the active segment (`PartitionLog.flush_rolled`)."""
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=LOG_CONFIG)
        plog.meta()
        plog.flush_rolled()
        log_dir.checkpoint_logs([plog])
        assert log_dir.keep_known_segments([plog])


def _metas(root: Path, state: Path) -> tuple[PartitionMeta, list[int], PartitionMeta]:
    """An owner's open after a crash (what it takes as kept, its metadata), then the
    metadata read from the files alone by an observer that keeps nothing."""
    with LogDir.open(root, state_dir=state) as log_dir:
        plog = log_dir.open_partition(TP, config=LOG_CONFIG)
        opened, as_kept = plog.meta(), plog.recovery_report.as_kept
    with LogDir.open(root, observe=True, state_dir=root.parent / "elsewhere") as observer:
        return opened, as_kept, observer.open_partition(TP, config=LOG_CONFIG).meta()


def test_a_start_after_a_crash_at_every_file_operation_takes_only_what_is_still_so(
    tmp_path: Path,
) -> None:
    """What was kept before a pass is taken, after a crash at any file operation of that
    pass, only for files still as kept: the owner's open ends up with the metadata a
    full read gives, whatever the pass had swapped."""
    template = build(tmp_path / "template").parent
    ops = CrashingOps()
    reference = tmp_path / "reference"
    shutil.copytree(template, reference)
    clean(reference / "t-0", ops=ops, config=cfg(400))
    taken = set()
    for at in range(ops.count):
        root, state = tmp_path / f"crash-{at}", tmp_path / f"state-{at}"
        shutil.copytree(template, root)
        _kept(root, state)
        crashing = CrashingOps(at)
        with pytest.raises(SimulatedCrash):
            clean(root / "t-0", ops=crashing, config=cfg(400))
        crashing.die()
        opened, as_kept, fresh = _metas(root, state)
        assert opened == fresh, f"after a crash at {ops.trace[at]}"
        taken.add(len(as_kept))
        shutil.rmtree(root)
    assert max(taken) >= 3  # the segments no swap had reached were taken as kept
    assert min(taken) < max(taken)  # and those swapped were not


@pytest.mark.parametrize("fraction", [0.3, 0.7, 0.95])
def test_sigkill_mid_pass(tmp_path: Path, fraction: float) -> None:
    """A real process killed with SIGKILL mid-pass recovers to pre- or post-pass records."""
    template = build(tmp_path / "template").parent
    ref = tmp_path / "reference"
    shutil.copytree(template, ref)
    pre = records(ref / "t-0")
    ops = CrashingOps()
    clean(ref / "t-0", ops=ops)
    post = records(ref / "t-0")
    root = tmp_path / "killed"
    shutil.copytree(template, root)
    at = int(ops.count * fraction)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.compaction.crash_child", str(root), str(at)],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    recover(root / "t-0")
    assert records(root / "t-0") in (pre, post)
    clean(root / "t-0", first_dirty=checkpoint(root))
    assert records(root / "t-0") == post
