"""Planning-cycle time: every decision of one maintenance cycle over many partitions.

One cycle is what `cleanerd plan` computes after reading the log dirs, and what the
daemon recomputes on its timer from its cached snapshots: per partition the roll check,
retention (with the simulated roll and deletions), the cleanable range, both compaction
delays, horizon and eligibility; then the cleaning order of the eligible partitions and
a KIP-61 plan for an over-full device. Inputs are generated, small, in memory
(`PartitionMeta` snapshots with 10 segments each by default, a mix of compact, delete
and compact+delete topics, some overdue, some with passed delete horizons, half the
partitions on a device above its threshold); reading them from disk is the watcher's
job and is not timed. The time is the best of `--repeat` runs.

    python -m bench.plan [--partitions 1000,10000,50000] [--segments 10] [--repeat 3]

Target (DESIGN section 8): 10,000 partitions and 100,000 segments in under a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

from cleanerd.compaction.horizon import SegmentHorizon
from cleanerd.config import BrokerConfig
from cleanerd.log.meta import PartitionMeta, SegmentMeta
from cleanerd.log.roll import SegmentAge
from cleanerd.log.topic_config import TopicConfig
from cleanerd.maintenance.plan import PlanInput, plan_cycle
from cleanerd.retention.disk_usage import DeviceUsage

NOW = 1_700_000_000_000
HOUR = 3_600_000
SEGMENT_BYTES = 1 << 20


def topics() -> list[TopicConfig]:
    base = BrokerConfig().topic_defaults()
    return [
        dataclasses.replace(base, cleanup_policy=("compact",), max_compaction_lag_ms=6 * HOUR),
        dataclasses.replace(base, cleanup_policy=("compact",), min_compaction_lag_ms=HOUR),
        dataclasses.replace(base, cleanup_policy=("delete",), retention_ms=48 * HOUR),
        dataclasses.replace(
            base,
            cleanup_policy=("compact", "delete"),
            retention_ms=72 * HOUR,
            retention_bytes=8 * SEGMENT_BYTES,
        ),
    ]


def generate(partitions: int, segments: int, seed: int = 1) -> list[PlanInput]:
    """`partitions` snapshots of `segments` segments, oldest up to four days old."""
    rng = random.Random(seed)
    configs = topics()
    out = []
    for p in range(partitions):
        age = rng.randrange(HOUR, 96 * HOUR)
        step = age // segments
        metas = []
        offset = 0
        for s in range(segments):
            ts = NOW - age + s * step
            count = rng.randrange(100, 1000)
            size = SEGMENT_BYTES if s + 1 < segments else rng.randrange(1, SEGMENT_BYTES)
            metas.append(SegmentMeta(offset, offset + count, size, ts + step, ts, 4096, 6144, ts))
            offset += count
        meta = PartitionMeta(
            topic=f"topic-{p % 97}",
            partition=p,
            log_dir=f"/data/{p % 2}",
            segments=tuple(metas),
            log_start_offset=0,
            log_end_offset=offset,
            high_watermark=None,
            first_unstable_offset=None,
        )
        dirty_from = metas[rng.randrange(segments)].base_offset
        horizons = tuple(
            SegmentHorizon(m.base_offset, NOW - HOUR if rng.random() < 0.05 else None, 1)
            for m in metas[:-1]
        )
        out.append(
            PlanInput(
                meta=meta,
                topic=configs[p % len(configs)],
                checkpoint=dirty_from,
                age=SegmentAge(
                    metas[-1].first_batch_timestamp_ms or NOW,
                    metas[-2].last_modified_ms if len(metas) > 1 else None,
                ),
                horizons=horizons,
            )
        )
    return out


def devices(inputs: list[PlanInput]) -> list[DeviceUsage]:
    """Device 0 above a 50% threshold by a tenth of its data, device 1 well below."""
    data = sum(i.meta.size_bytes for i in inputs if i.meta.log_dir == "/data/0")
    return [DeviceUsage(0, data, int(data * 0.55), 50), DeviceUsage(1, 10 * data, data, 50)]


def time_cycle(inputs: list[PlanInput], repeat: int) -> tuple[float, int, int]:
    """Best time of `repeat` cycles; the eligible count and the KIP-61 deletions."""
    devs = devices(inputs)
    where = {"/data/0": 0, "/data/1": 1}
    best = float("inf")
    eligible = deletions = 0
    for _ in range(repeat):
        start = time.perf_counter()
        cycle = plan_cycle(inputs, now_ms=NOW, devices=devs, device_of_dir=where)
        best = min(best, time.perf_counter() - start)
        eligible = sum(1 for p in cycle.partitions if p.order is not None)
        deletions = len(cycle.disk_deletions)
    return best, eligible, deletions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="1000,10000,50000")
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'partitions':>10} {'segments':>9} {'cycle s':>8} {'us/partition':>13} "
        f"{'eligible':>9} {'KIP-61 deletions':>17}"
    )
    for n in (int(x) for x in args.partitions.split(",")):
        inputs = generate(n, args.segments)
        seconds, eligible, deletions = time_cycle(inputs, args.repeat)
        print(
            f"{n:>10,} {n * args.segments:>9,} {seconds:>8.3f} {seconds / n * 1e6:>13.1f} "
            f"{eligible:>9,} {deletions:>17,}"
        )


if __name__ == "__main__":
    main()
