from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.retention.disk_usage import (
    DeviceUsage,
    DiskUsagePlan,
    PartitionOnDevice,
    freed_bytes,
    plan_disk_usage_deletions,
)
from cleanerd.retention.policy import DeletionReason

NOW = 1_700_000_000_000
HOUR = 3_600_000
DEV_A, DEV_B = 2049, 2065


def seg(base: int, *, ts: int, size: int = 100, mtime: int | None = None) -> SegmentMeta:
    return SegmentMeta(
        base_offset=base,
        next_offset=base + 10,
        size_bytes=size,
        largest_timestamp_ms=ts,
        first_batch_timestamp_ms=ts,
        offset_index_bytes=0,
        time_index_bytes=0,
        last_modified_ms=ts if mtime is None else mtime,
    )


def partition(
    topic: str,
    ages_h: list[int],
    *,
    device: int = DEV_A,
    hw: int | None = None,
    sizes: list[int] | None = None,
) -> PartitionOnDevice:
    """Segments of 10 offsets aged `ages_h` hours; the last one is active."""
    sizes = sizes or [100] * len(ages_h)
    segments = tuple(
        seg(10 * i, ts=NOW - age * HOUR, size=size)
        for i, (age, size) in enumerate(zip(ages_h, sizes, strict=True))
    )
    meta = PartitionMeta(
        topic=topic,
        partition=0,
        log_dir=f"/disk{device}",
        segments=segments,
        log_start_offset=0,
        log_end_offset=segments[-1].next_offset,
        high_watermark=hw,
        first_unstable_offset=None,
    )
    return PartitionOnDevice(device, meta)


def device(used: int, *, dev: int = DEV_A, total: int = 1000, percent: float = 50) -> DeviceUsage:
    return DeviceUsage(device=dev, total_bytes=total, used_bytes=used, threshold_percent=percent)


def run(
    devices: list[DeviceUsage],
    parts: list[PartitionOnDevice],
    *,
    protected: frozenset[str] = frozenset(),
    hysteresis_percent: float = 0.0,
) -> DiskUsagePlan:
    return plan_disk_usage_deletions(
        devices,
        parts,
        protected_topics=protected,
        now_ms=NOW,
        hysteresis_percent=hysteresis_percent,
    )


def deleted(p: DiskUsagePlan) -> list[tuple[str, int]]:
    return [(d.topic_partition.topic, d.base_offset) for d in p.deletions]


def test_oldest_segments_across_topics_go_first():
    """Deletion takes the globally oldest segments on the device, whatever their topic."""
    parts = [partition("a", [30, 10, 0]), partition("b", [40, 20, 0])]
    p = run([device(700)], parts)
    assert deleted(p) == [("b", 0), ("a", 0)]
    assert all(d.reason is DeletionReason.DISK_USAGE for d in p.deletions)
    assert p.devices[0].used_bytes_after == 500
    assert p.still_above == ()


def test_stops_once_at_or_below_threshold():
    """Deleting stops as soon as projected usage is back at the threshold."""
    parts = [partition("a", [50, 40, 30, 20, 0])]
    p = run([device(620)], parts)
    assert deleted(p) == [("a", 0), ("a", 10)]
    assert p.devices[0].used_bytes_after == 420


def test_device_below_threshold_is_left_alone():
    """A device at or under its threshold plans no deletion and no outcome."""
    p = run([device(500)], [partition("a", [50, 0])])
    assert p.deletions == ()
    assert p.devices == ()


def test_other_device_untouched():
    """Only partitions on the full device lose segments."""
    parts = [partition("a", [10, 0], device=DEV_A), partition("b", [90, 0], device=DEV_B)]
    p = run([device(600, dev=DEV_A), device(100, dev=DEV_B)], parts)
    assert deleted(p) == [("a", 0)]
    assert {d.device for d in p.deletions} == {DEV_A}


def test_active_metadata_and_protected_never_deleted():
    """Active segments, `__cluster_metadata` and protected topics stay; the device is reported."""
    parts = [
        partition("__cluster_metadata", [90, 0]),
        partition("__consumer_offsets", [80, 0]),
        partition("a", [70, 0]),
    ]
    p = run([device(900)], parts, protected=frozenset({"__consumer_offsets"}))
    assert deleted(p) == [("a", 0)]
    assert p.still_above == (DEV_A,)
    assert p.devices[0].used_bytes_after == 800


def test_partition_order_respected():
    """A newer first segment shields an older second one: log start only moves forward."""
    parts = [partition("a", [10, 90, 0]), partition("b", [50, 40, 0])]
    p = run([device(700)], parts)
    assert deleted(p) == [("b", 0), ("b", 10)]
    p = run([device(800)], parts)
    assert deleted(p) == [("b", 0), ("b", 10), ("a", 0)]
    a_deletions = [d for d in p.deletions if d.topic_partition.topic == "a"]
    assert a_deletions[0].log_start_offset == 10


def test_high_watermark_bounds_deletion():
    """A segment the HW has not passed is not deleted under disk pressure either."""
    parts = [partition("a", [50, 40, 0], hw=15)]
    p = run([device(900)], parts)
    assert deleted(p) == [("a", 0)]
    assert p.still_above == (DEV_A,)


def test_future_timestamp_orders_by_mtime():
    """A segment stamped in the future is ordered by its file mtime, not as newest forever."""
    future = PartitionOnDevice(
        DEV_A,
        PartitionMeta(
            topic="skewed",
            partition=0,
            log_dir="/d",
            segments=(
                seg(0, ts=NOW + 100 * HOUR, mtime=NOW - 60 * HOUR),
                seg(10, ts=NOW),
            ),
            log_start_offset=0,
            log_end_offset=20,
            high_watermark=None,
            first_unstable_offset=None,
        ),
    )
    p = run([device(600)], [future, partition("a", [50, 0])])
    assert deleted(p) == [("skewed", 0)]


def test_hysteresis_deletes_below_threshold():
    """With hysteresis, deletion continues down to threshold - hysteresis."""
    parts = [partition("a", [50, 40, 30, 20, 0])]
    p = run([device(620)], parts, hysteresis_percent=20.0)
    assert deleted(p) == [("a", 0), ("a", 10), ("a", 20), ("a", 30)]
    assert p.devices[0].target_bytes == 300


def test_disabled_at_one_hundred_percent():
    """log.retention.disk.usage.percent = 100 (KIP-61's default) turns the rule off."""
    p = run([device(1000, percent=100)], [partition("a", [50, 0])])
    assert p.deletions == ()


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[PartitionOnDevice], DeviceUsage]:
    parts = []
    for i in range(draw(st.integers(min_value=1, max_value=5))):
        n = draw(st.integers(min_value=1, max_value=6))
        ages = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
        sizes = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
        dev = draw(st.sampled_from([DEV_A, DEV_B]))
        parts.append(partition(f"t{i}", ages, device=dev, sizes=sizes))
    total = 10_000
    on_a = sum(p.meta.size_bytes for p in parts if p.device == DEV_A)
    used = on_a + draw(st.integers(0, 3000))
    percent = draw(st.floats(min_value=1, max_value=99))
    return parts, DeviceUsage(DEV_A, total, used, percent)


@settings(deadline=None, max_examples=150)
@given(layouts())
def test_plan_never_takes_active_and_reaches_threshold(
    case: tuple[list[PartitionOnDevice], DeviceUsage],
):
    """No active segment is ever chosen, and usage ends at the threshold if enough is deletable."""
    parts, usage = case
    p = run([usage], parts)
    actives = {(pd.meta.topic_partition, pd.meta.active.base_offset) for pd in parts}
    assert all((d.topic_partition, d.base_offset) not in actives for d in p.deletions)
    assert all(d.device == DEV_A for d in p.deletions)
    limit = usage.limit_bytes(usage.threshold_percent)
    deletable = sum(s.total_bytes for pd in parts if pd.device == DEV_A for s in pd.meta.inactive)
    if p.devices:
        outcome = p.devices[0]
        assert outcome.used_bytes_after == usage.used_bytes - sum(
            d.freed_bytes for d in p.deletions
        )
        if usage.used_bytes - deletable <= limit:
            assert not outcome.above_threshold
        else:
            assert len(p.deletions) == sum(
                len(pd.meta.inactive) for pd in parts if pd.device == DEV_A
            )
    for pd in parts:
        taken = [d.base_offset for d in p.deletions if d.topic_partition == pd.meta.topic_partition]
        assert taken == [s.base_offset for s in pd.meta.segments[: len(taken)]]


def test_a_partition_offers_nothing_from_its_first_damaged_segment_on():
    """Disk usage takes a damaged partition's segments older than its damage, oldest
    first among every partition's, and never the damaged segment or any after it, even
    when the device stays above its threshold."""
    a, b = partition("a", [50, 40, 30, 0]), partition("b", [45, 35, 0])
    s = a.meta.segments[1]
    stand_in = SegmentMeta.damaged(
        s.base_offset,
        "corrupt record batch",
        size_bytes=s.size_bytes,
        index_bytes=(0, 0),
        last_modified_ms=NOW - 60 * HOUR,
        inode=None,
    )
    segments = (a.meta.segments[0], stand_in, *a.meta.segments[2:])
    a = PartitionOnDevice(DEV_A, dataclasses.replace(a.meta, segments=segments))
    p = run([device(900)], [a, b])
    assert deleted(p) == [("a", 0), ("b", 0), ("b", 10)]
    assert p.still_above == (DEV_A,)


def test_a_deletion_frees_whole_blocks_of_each_file():
    """A file takes its size rounded up to the device's block: a 100-byte segment with
    two small indexes gives back three 4 KiB blocks, so a device 24 KiB above its
    threshold needs two such deletions, not hundreds."""
    parts = [partition("a", [9, 8, 7, 6, 0], sizes=[100] * 5)]
    tiny = dataclasses.replace(
        parts[0].meta,
        segments=tuple(
            dataclasses.replace(s, offset_index_bytes=8, time_index_bytes=12)
            for s in parts[0].meta.segments
        ),
    )
    usage = DeviceUsage(DEV_A, total_bytes=1_000_000, used_bytes=524_576, threshold_percent=50)
    blocks = dataclasses.replace(usage, block_bytes=4096)
    p = run([blocks], [PartitionOnDevice(DEV_A, tiny)])
    assert deleted(p) == [("a", 0), ("a", 10)]
    assert [d.freed_bytes for d in p.deletions] == [3 * 4096, 3 * 4096]
    assert freed_bytes(tiny.segments[0], 1) == 120
    unrounded = run([usage], [PartitionOnDevice(DEV_A, tiny)])
    assert len(unrounded.deletions) == 4  # every inactive segment, and still above
    assert unrounded.still_above == (DEV_A,)
