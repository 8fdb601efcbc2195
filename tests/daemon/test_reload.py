"""Reload planning: diff the running config against a valid new file, apply or refuse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from cleanerd.config import Config, config_from_data, default_config_data
from cleanerd.daemon.reload import (
    ABSENT,
    ConfigChange,
    diff_configs,
    plan_reload,
    restart_required,
)


def _data(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(default_config_data())
    data.update(changes)
    return data


def _config(data: dict[str, Any]) -> Config:
    return config_from_data(data)


def test_identical_configs_have_no_changes() -> None:
    """Reloading an unchanged file changes nothing."""
    plan = plan_reload(_config(_data()), _config(_data()))
    assert plan.applied == ()
    assert plan.refused == ()
    assert not plan.changed


def test_topic_policy_change_is_applied() -> None:
    """A changed per-topic setting is applied, and the new config resolves it."""
    new = _data()
    new["topics"]["demo-users"]["max.compaction.lag.ms"] = 5_000
    plan = plan_reload(_config(_data()), _config(new))
    assert plan.applied == (
        ConfigChange(("topics", "demo-users", "max.compaction.lag.ms"), 60_000, 5_000),
    )
    assert plan.config.topic_config("demo-users").max_compaction_lag_ms == 5_000
    assert plan.touches(("topics",))
    assert not plan.touches(("metrics",))


def test_broker_default_change_reaches_topics_without_an_override() -> None:
    """A broker default (`log.cleaner.min.cleanable.ratio`) is live for every topic that
    does not override it."""
    plan = plan_reload(_config(_data()), _config(_data(**{"log.cleaner.min.cleanable.ratio": 0.9})))
    assert [c.name for c in plan.applied] == ["log.cleaner.min.cleanable.ratio"]
    assert plan.config.topic_config("demo-users").min_cleanable_dirty_ratio == 0.9


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("log.dirs", ["./elsewhere"]),
        ("state_dir", "./other-state"),
        ("mode", "observe"),
        ("engine", {"name": "spark"}),
    ],
)
def test_restart_required_keys_keep_their_old_value(key: str, value: object) -> None:
    """`log.dirs`, `state_dir`, `mode` and `engine` are refused; the rest still applies."""
    old = _config(_data())
    new = _config(_data(**{key: value, "log.cleaner.backoff.ms": 1_000}))
    plan = plan_reload(old, new)
    assert [c.key[0] for c in plan.refused] == [key]
    assert [c.name for c in plan.applied] == ["log.cleaner.backoff.ms"]
    assert plan.config.log_dirs == old.log_dirs
    assert plan.config.state_dir == old.state_dir
    assert plan.config.mode == old.mode
    assert plan.config.engine == old.engine
    assert plan.config.log_cleaner_backoff_ms == 1_000


def test_refused_keys_leave_topic_resolution_intact() -> None:
    """The config built with old values for refused keys still resolves new topic entries."""
    new = _data(**{"log.dirs": ["./elsewhere"]})
    new["topics"]["orders-*"] = {"retention.ms": 1234}
    plan = plan_reload(_config(_data()), _config(new))
    assert plan.config.topic_config("orders-eu").retention_ms == 1234
    assert plan.config.log_dirs == (Path("data"),)


def test_removed_topic_entry_lists_the_keys_it_had_set() -> None:
    """Dropping a `topics:` entry reports each key it set, now unset (inherited)."""
    new = _data()
    del new["topics"]["demo-events"]
    plan = plan_reload(_config(_data()), _config(new))
    assert {c.name: c.new for c in plan.applied} == {
        "topics.demo-events.cleanup.policy": ABSENT,
        "topics.demo-events.retention.ms": ABSENT,
        "topics.demo-events.segment.bytes": ABSENT,
        "topics.demo-events.segment.ms": ABSENT,
    }
    assert plan.config.topic_config("demo-events").retention_ms == 7 * 24 * 3_600_000


def test_key_dropped_from_the_file_is_a_change_back_to_the_default() -> None:
    """A broker key removed from the file reverts to Kafka's default, and that is a change."""
    old = _config(_data(**{"log.retention.check.interval.ms": 1_000}))
    changes = diff_configs(old, _config(_data()))
    assert changes == (ConfigChange(("log.retention.check.interval.ms",), 1_000, 300_000),)


def test_nested_sections_are_diffed_per_key() -> None:
    """`metrics.listen` and `mqtt.port` are reported as their own keys, and applied."""
    new = _config(_data(metrics={"listen": "127.0.0.1:9999"}, mqtt={"port": 1884}))
    plan = plan_reload(_config(_data()), new)
    assert [c.name for c in plan.applied] == ["metrics.listen", "mqtt.port"]
    assert plan.touches(("metrics",))
    assert plan.touches(("mqtt",))
    assert plan.config.metrics.listen == "127.0.0.1:9999"


def test_describe_gives_plain_values() -> None:
    """A change renders paths as strings and tuples as lists for logs and events."""
    change = ConfigChange(("log.dirs",), (Path("/a"),), (Path("/b"), Path("/c")))
    assert change.describe() == {"key": "log.dirs", "old": ["/a"], "new": ["/b", "/c"]}


def test_restart_required_covers_whole_sections() -> None:
    """Every key inside `engine` needs a restart; `metrics` keys do not."""
    assert restart_required(("engine", "spark", "master"))
    assert restart_required(("log.dirs",))
    assert not restart_required(("metrics", "listen"))
    assert not restart_required(("log.cleaner.threads",))
