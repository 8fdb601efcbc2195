from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from cleanerd.config import (
    LONG_MAX,
    TOPIC_CONFIG_SYNONYMS,
    BrokerConfig,
    Config,
    PathState,
    TopicOverride,
    ambiguous_on_disk,
    check_paths,
    config_from_data,
    load_config,
    log_dir_problem,
    max_cleaner_threads,
    path_problems,
    probe_path,
    state_dir_problem,
)
from cleanerd.errors import ConfigError
from cleanerd.log.topic_config import TopicConfig
from tests.paths import REPO
from tests.tools import tmpfs

SAMPLE = REPO / "config" / "cleanerd.yaml"

KAFKA_TOPIC_DEFAULTS = TopicConfig(
    cleanup_policy=("delete",),
    segment_bytes=1073741824,
    segment_ms=604800000,
    segment_jitter_ms=0,
    segment_index_bytes=10485760,
    index_interval_bytes=4096,
    retention_ms=604800000,
    retention_bytes=-1,
    min_compaction_lag_ms=0,
    max_compaction_lag_ms=9223372036854775807,
    min_cleanable_dirty_ratio=0.5,
    delete_retention_ms=86400000,
    file_delete_delay_ms=60000,
    max_message_bytes=1048588,
    compaction_strategy="offset",
    compaction_strategy_header="",
    preallocate=False,
)


def make(**topics: dict[str, Any]) -> dict[str, Any]:
    return {"log.dirs": ["/nonexistent/kafka"], "topics": topics}


def errors_of(data: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_data(data)
    return info.value.errors


def yaml_errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "cleanerd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == str(path)
    return info.value.errors


def model_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every YAML key path of `model`, as its keys from the top (`("mqtt", "tls", "enabled")`)."""
    for name, field in model.model_fields.items():
        path = (*prefix, field.alias or name)
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from model_keys(kind, path)
        else:
            yield path


class TestDefaults:
    def test_topic_defaults_are_kafkas(self) -> None:
        """A topic without overrides gets Kafka's topic-config defaults."""
        cfg = config_from_data(make())
        assert cfg.topic_config("any-topic") == KAFKA_TOPIC_DEFAULTS

    def test_broker_defaults_are_kafkas(self) -> None:
        """Broker-only settings default to Kafka's values (io rate unlimited)."""
        cfg = config_from_data(make())
        assert cfg.log_cleaner_enable is True
        assert cfg.log_cleaner_threads == 1
        assert cfg.log_cleaner_dedupe_buffer_size == 134217728
        assert cfg.log_cleaner_io_buffer_load_factor == 0.9
        assert cfg.log_cleaner_io_buffer_size == 524288
        assert math.isinf(cfg.log_cleaner_io_max_bytes_per_second)
        assert cfg.log_cleaner_backoff_ms == 15000
        assert cfg.log_retention_check_interval_ms == 300000
        assert cfg.log_retention_disk_usage_percent == 100
        assert cfg.producer_id_expiration_ms == 86400000
        assert cfg.mode == "owner"
        assert cfg.state_dir == Path("state")
        assert (cfg.metrics.host, cfg.metrics.port) == ("127.0.0.1", 9644)
        assert cfg.mqtt.enabled is False
        assert cfg.engine.spark.master == "local[*]"

    def test_embedded_default_has_the_demo_topics(self) -> None:
        """load_config(None) gives ./data, ./state and the three demo topics."""
        cfg = load_config(None)
        assert cfg.log_dirs == (Path("data"),)
        assert cfg.state_dir == Path("state")
        users = cfg.topic_config("demo-users")
        assert users.compact
        assert users.max_segment_ms == users.max_compaction_lag_ms < users.segment_ms
        events = cfg.topic_config("demo-events")
        assert events.delete
        assert not events.compact
        assert events.retention_ms < KAFKA_TOPIC_DEFAULTS.retention_ms
        assert cfg.topic_config("demo-prices").compaction_strategy == "timestamp"

    def test_sample_config_validates_and_sets_no_topic(self) -> None:
        """config/cleanerd.yaml is a valid config that leaves every topic at the
        broker-level settings (installed as it is, it must not compact or shorten the
        retention of an operator's topics that happen to share an example's name), and
        its commented examples are a valid `topics` block once uncommented."""
        cfg = load_config(SAMPLE)
        assert cfg.topics == {}
        assert cfg.topic_config("orders") == cfg.topic_config("logs-app")
        assert not cfg.topic_config("orders").compact
        text = SAMPLE.read_text()
        examples = text[text.index("topics: {}") :].split("\n\n")[0].splitlines()[2:]
        block = "topics:\n" + "\n".join(line.removeprefix("#") for line in examples)
        data = yaml.safe_load(text)
        data["topics"] = yaml.safe_load(block)["topics"]
        with_examples = config_from_data(data)
        assert with_examples.topic_config("logs-app").retention_ms == 259200000
        assert with_examples.topic_config("prices").compaction_strategy_header == "version"

    def test_sample_config_leaves_the_hours_keys_in_force(self, tmp_path: Path) -> None:
        """The sample sets no `.ms` key that would shadow the `.hours` one an operator
        uncomments beside it (Kafka reads `.hours` only when `.ms` is absent)."""
        text = SAMPLE.read_text().replace("# log.retention.hours: 168", "log.retention.hours: 24")
        text = text.replace("# log.roll.hours: 168", "log.roll.hours: 2")
        path = tmp_path / "cleanerd.yaml"
        path.write_text(text)
        topic = load_config(path).topic_config("any")
        assert (topic.retention_ms, topic.segment_ms) == (24 * 3_600_000, 2 * 3_600_000)

    def test_sample_config_shows_every_key(self) -> None:
        """The sample sets or shows (commented out) every key, nested ones by their name."""
        text = SAMPLE.read_text()
        paths = [*model_keys(Config), *model_keys(TopicOverride)]
        missing = [
            path
            for path in paths
            if not re.search(rf"^[ #]*{re.escape(path[-1])}:", text, re.MULTILINE)
        ]
        assert missing == []

    def test_readme_documents_every_key(self) -> None:
        """README.md names every config key path in backticks."""
        text = (REPO / "README.md").read_text()
        paths = [*model_keys(Config), *model_keys(TopicOverride)]
        assert [path for path in paths if f"`{'.'.join(path)}`" not in text] == []


class TestBrokerSynonyms:
    CASES = (
        ("log.cleanup.policy", "compact,delete", "cleanup_policy", ("compact", "delete")),
        ("log.segment.bytes", 1048576, "segment_bytes", 1048576),
        ("log.roll.ms", 1000, "segment_ms", 1000),
        ("log.roll.hours", 2, "segment_ms", 7_200_000),
        ("log.roll.jitter.ms", 5, "segment_jitter_ms", 5),
        ("log.roll.jitter.hours", 1, "segment_jitter_ms", 3_600_000),
        ("log.index.size.max.bytes", 4096, "segment_index_bytes", 4096),
        ("log.index.interval.bytes", 100, "index_interval_bytes", 100),
        ("log.retention.ms", 5, "retention_ms", 5),
        ("log.retention.minutes", 2, "retention_ms", 120_000),
        ("log.retention.hours", 3, "retention_ms", 10_800_000),
        ("log.retention.hours", -1, "retention_ms", -1),
        ("log.retention.bytes", 10, "retention_bytes", 10),
        ("log.cleaner.min.compaction.lag.ms", 7, "min_compaction_lag_ms", 7),
        ("log.cleaner.max.compaction.lag.ms", 8, "max_compaction_lag_ms", 8),
        ("log.cleaner.min.cleanable.ratio", 0.25, "min_cleanable_dirty_ratio", 0.25),
        ("log.cleaner.delete.retention.ms", 9, "delete_retention_ms", 9),
        ("log.segment.delete.delay.ms", 11, "file_delete_delay_ms", 11),
        ("message.max.bytes", 12, "max_message_bytes", 12),
        ("log.cleaner.compaction.strategy", "timestamp", "compaction_strategy", "timestamp"),
        ("log.cleaner.compaction.strategy.header", "v", "compaction_strategy_header", "v"),
        ("log.preallocate", True, "preallocate", True),
    )

    @pytest.mark.parametrize(("broker_key", "value", "attribute", "expected"), CASES)
    def test_broker_key_sets_topic_default(
        self, broker_key: str, value: object, attribute: str, expected: object
    ) -> None:
        """Each broker key supplies its topic-config synonym's default."""
        cfg = config_from_data({**make(), broker_key: value})
        assert getattr(cfg.topic_config("t"), attribute) == expected

    def test_cases_cover_the_synonym_table(self) -> None:
        """Every synonym pair Kafka defines is tested above, and every topic key has one."""
        covered = {(broker, attr) for broker, _, attr, _ in self.CASES}
        table = {
            (broker, topic_key.replace(".", "_"))
            for topic_key, brokers in TOPIC_CONFIG_SYNONYMS.items()
            for broker in brokers
        }
        assert covered == table
        assert {f.name for f in fields(TopicConfig)} == {a for _, a in table}
        assert set(TopicOverride.model_fields) == {f.name for f in fields(TopicConfig)}

    def test_retention_ms_beats_minutes_beats_hours(self) -> None:
        """log.retention.ms wins over .minutes, which wins over .hours, as in Kafka."""
        data = {**make(), "log.retention.hours": 1, "log.retention.minutes": 2}
        assert config_from_data(data).retention_ms == 120_000
        assert config_from_data({**data, "log.retention.ms": 3}).retention_ms == 3

    def test_log_dirs_accept_a_comma_string(self) -> None:
        """log.dirs may be server.properties' comma-separated string."""
        cfg = config_from_data({"log.dirs": "/a, /b"})
        assert cfg.log_dirs == (Path("/a"), Path("/b"))


class TestTopicOverrides:
    def test_override_merges_key_by_key(self) -> None:
        """An entry replaces only the keys it sets; the rest stay broker defaults."""
        data = {
            **make(orders={"retention.ms": 1000}),
            "log.cleaner.min.cleanable.ratio": 0.1,
        }
        cfg = config_from_data(data)
        expected = replace(KAFKA_TOPIC_DEFAULTS, retention_ms=1000, min_cleanable_dirty_ratio=0.1)
        assert cfg.topic_config("orders") == expected

    def test_null_inherits(self) -> None:
        """An explicit null in an entry keeps the broker default."""
        cfg = config_from_data(make(orders={"retention.ms": None}))
        assert cfg.topic_config("orders") == KAFKA_TOPIC_DEFAULTS

    def test_exact_name_beats_glob(self) -> None:
        """A topic with an exact entry ignores the globs that also match it."""
        cfg = config_from_data(
            make(
                **{"orders.*": {"retention.ms": 1}, "*.v1": {"retention.ms": 2}},
                **{"orders.v1": {"retention.bytes": 3}},
            )
        )
        assert cfg.topic_entry("orders.v1") == "orders.v1"
        assert cfg.topic_config("orders.v1") == replace(KAFKA_TOPIC_DEFAULTS, retention_bytes=3)
        assert cfg.topic_config("orders.v2").retention_ms == 1
        assert cfg.topic_config("payments") == KAFKA_TOPIC_DEFAULTS

    def test_two_globs_matching_a_topic_is_an_error(self) -> None:
        """topic_config raises a ConfigError naming the topic and both globs."""
        cfg = config_from_data(make(**{"orders.*": {}, "*.v1": {}}))
        with pytest.raises(ConfigError) as info:
            cfg.topic_config("orders.v1")
        (message,) = info.value.errors
        assert "'orders.v1'" in message
        assert "'orders.*'" in message
        assert "'*.v1'" in message
        assert cfg.ambiguous_topics(["orders.v2", "orders.v1"]) == [message]

    def test_an_ambiguous_topic_on_disk_is_listed_not_a_load_error(self, tmp_path: Path) -> None:
        """A topic in a log dir that two globs match does not fail the load (a restart or
        reload refused for one topic stopped every topic's maintenance): it is listed
        for `check-config`, naming the globs and the partition dir, and the cycle leaves
        only its partitions alone."""
        (tmp_path / "data" / "orders.v1-0").mkdir(parents=True)
        (tmp_path / "data" / "payments-3").mkdir()
        data = {
            "log.dirs": [str(tmp_path / "data")],
            "topics": {"orders.*": {}, "*.v1": {}, "pay*": {}, "*ments": {}},
        }
        problems = ambiguous_on_disk(config_from_data(data))
        assert len(problems) == 2
        assert "'orders.v1'" in problems[0]
        assert "'orders.*' and '*.v1'" in problems[0]
        assert str(tmp_path / "data" / "orders.v1-0") in problems[0]
        assert "'payments'" in problems[1]

    def test_ambiguous_globs_without_such_topic_on_disk_load(self, tmp_path: Path) -> None:
        """Overlapping globs are fine until a topic that both match exists."""
        (tmp_path / "data" / "orders.v2-0").mkdir(parents=True)
        data = {"log.dirs": [str(tmp_path / "data")], "topics": {"orders.*": {}, "*.v1": {}}}
        assert ambiguous_on_disk(config_from_data(data)) == []

    def test_max_segment_ms_is_kip_354s(self) -> None:
        """max_segment_ms is min(segment.ms, max.compaction.lag.ms) for compacted topics only."""
        compact = replace(
            KAFKA_TOPIC_DEFAULTS, cleanup_policy=("compact",), max_compaction_lag_ms=5
        )
        assert compact.max_segment_ms == 5
        assert replace(compact, cleanup_policy=("delete",)).max_segment_ms == 604800000


class TestValidation:
    @pytest.mark.parametrize(
        "master",
        [
            "local",
            "local[4]",
            "local[*, 2]",
            "local-cluster[2, 1, 1024]",
            "spark://a:7077,b.example:7077",
            "spark://[::1]:7077",
            "k8s://https://k:443",
            "yarn",
        ],
    )
    def test_every_master_spark_takes_is_taken(self, master: str) -> None:
        cfg = config_from_data({"log.dirs": ["/k"], "engine": {"spark": {"master": master}}})
        assert cfg.engine.spark.master == master

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            (
                {"log.cleaner.min.cleanable.ratio": 1.5},
                "log.cleaner.min.cleanable.ratio: 1.5 must be <= 1",
            ),
            (
                {
                    "topics": {
                        "orders": {"max.compaction.lag.ms": 500, "min.compaction.lag.ms": 1000}
                    }
                },
                "topics.orders.max.compaction.lag.ms: 500 must be >= min.compaction.lag.ms (1000)",
            ),
            (
                {
                    "topics": {"orders": {"max.compaction.lag.ms": 500}},
                    "log.cleaner.min.compaction.lag.ms": 1000,
                },
                "topics.orders.max.compaction.lag.ms: 500 must be >= min.compaction.lag.ms "
                "(1000, from log.cleaner.min.compaction.lag.ms)",
            ),
            (
                {
                    "topics": {"orders": {"min.compaction.lag.ms": 1000}},
                    "log.cleaner.max.compaction.lag.ms": 500,
                },
                "topics.orders.min.compaction.lag.ms: 1000 must be <= max.compaction.lag.ms "
                "(500, from log.cleaner.max.compaction.lag.ms)",
            ),
            (
                {"log.cleaner.min.compaction.lag.ms": 2, "log.cleaner.max.compaction.lag.ms": 1},
                "log.cleaner.max.compaction.lag.ms: 1 must be >= "
                "log.cleaner.min.compaction.lag.ms (2)",
            ),
            (
                {"topics": {"t": {"max.compaction.lag.ms": 0}}},
                "topics.t.max.compaction.lag.ms: 0 must be >= 1",
            ),
            (
                {"topics": {"t": {"compaction.strategy": "latest"}}},
                "topics.t.compaction.strategy: 'latest' must be 'offset', 'timestamp' or 'header'",
            ),
            (
                {"topics": {"t": {"cleanup.policy": "compact,remove"}}},
                "topics.t.cleanup.policy[1]: 'remove' must be 'delete' or 'compact'",
            ),
            (
                {"topics": {"t": {"cleanup.policy": []}}},
                "topics.t.cleanup.policy: [] must have at least 1 item",
            ),
            (
                {"topics": {"t": {"retention.msx": 3}}},
                "topics.t.retention.msx: unknown key (value 3)",
            ),
            ({"topics": {"t": {"retention.ms": -2}}}, "topics.t.retention.ms: -2 must be >= -1"),
            ({"log.segment.bytes": "1GB"}, "log.segment.bytes: '1GB' must be an integer"),
            ({"state_dir": 5}, "state_dir: 5 must be a path (a string)"),
            ({"log.dirs": [7]}, "log.dirs[0]: 7 must be a path (a string)"),
            ({"log.segment.bytes": 13}, "log.segment.bytes: 13 must be >= 14"),
            (
                {"log.retention.disk.usage.percent": 0},
                "log.retention.disk.usage.percent: 0 must be >= 1",
            ),
            ({"metrics": {"listen": "9644"}}, "metrics.listen: '9644' must be HOST:PORT"),
            ({"metrics": {"lisen": "x"}}, "metrics.lisen: unknown key (value 'x')"),
            ({"log.dirs": []}, "log.dirs: required: list at least one log directory"),
            ({"log.dirs": ["/a", "/a"]}, "log.dirs: '/a' is listed twice"),
            (
                {"log.dirs": ["/a"], "state_dir": "/a/state"},
                "state_dir: '/a/state' must not be inside log dir '/a'",
            ),
            (
                {"log.dirs": ["/a", "/a/orders-0"]},
                "log.dirs: '/a/orders-0' is inside log dir '/a': a Kafka broker would refuse",
            ),
            (
                {"log.dirs": ["/a/sub", "/a"]},
                "log.dirs: '/a/sub' is inside log dir '/a'",
            ),
            (
                {"topics": {"bad topic!": {}}},
                "topics.bad topic!: 'bad topic!' is neither a Kafka topic name",
            ),
            (
                {"mqtt": {"tls": {"cert_file": "/c.pem"}}},
                "mqtt.tls.cert_file: '/c.pem' needs mqtt.tls.key_file",
            ),
            ({"mqtt": {"password_file": "/p"}}, "mqtt.password_file: '/p' needs mqtt.username"),
            ({"mqtt": {"topic_prefix": "a/#"}}, "mqtt.topic_prefix: 'a/#' must be a non-empty"),
            ({"engine": {"spark": {"conf": {"a": 1}}}}, "engine.spark.conf.a: 1 must be a string"),
            (
                {"engine": {"spark": {"master": "sprak://h:7077"}}},
                "engine.spark.master: 'sprak://h:7077' must be local, local[N] or local[*]",
            ),
            ({"engine": {"spark": {"master": ""}}}, "engine.spark.master: '' must be local"),
        ]
        + [  # each refused by Spark only when a pass starts it
            ({"engine": {"spark": {"master": m}}}, f"engine.spark.master: {m!r} must be local")
            for m in (
                "local[abc]",
                "local[0]",
                "local[ 2 ]",
                "spark://host",
                "spark://:7077",
                "spark://h:99999",
                "spark://a:1,",
            )
        ],
    )
    def test_error_names_key_value_and_rule(self, data: dict[str, Any], expected: str) -> None:
        """Each invalid value gives one line naming its key path, the value and the rule."""
        errors = errors_of({"log.dirs": ["/nonexistent/kafka"], **data})
        assert [e for e in errors if e.startswith(expected)] != [], errors

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            ({"topics": {"t": {"retention.msx": 3}}}, "(did you mean retention.ms?)"),
            ({"topics": {"t": {"log.retention.ms": 3}}}, "(did you mean retention.ms?)"),
            ({"retention.ms": 3}, "(did you mean log.retention.ms?)"),
            ({"log.retentoin.hours": 3}, "(did you mean log.retention.hours?)"),
            ({"metrics": {"lisen": "x"}}, "(did you mean listen?)"),
            ({"mqtt": {"tls": {"ca_fle": "/c"}}}, "(did you mean ca_file?)"),
            ({"log": {"level": "debug"}}, "(did you mean logging?)"),
            ({"engine": {"spark": {"masterr": "x"}}}, "(did you mean master?)"),
        ],
    )
    def test_an_unknown_key_near_a_known_one_is_named(
        self, data: dict[str, Any], expected: str
    ) -> None:
        """A typo, or a broker-level name in a topic entry (and the other way round), is
        answered with the key the mapping takes."""
        errors = errors_of({"log.dirs": ["/nonexistent/kafka"], **data})
        (unknown,) = [e for e in errors if "unknown key" in e]
        assert unknown.endswith(expected), errors

    @pytest.mark.parametrize("key", ["colour", "s", "m"])
    def test_an_unknown_key_near_nothing_gets_no_guess(self, key: str) -> None:
        """Nothing is close, or the key is too short to be a prefix worth naming (`s`
        is no `state_dir`)."""
        errors = errors_of({"log.dirs": ["/nonexistent/kafka"], key: "blue"})
        assert f"{key}: unknown key (value 'blue')" in errors

    def test_all_errors_are_collected_at_once(self) -> None:
        """Field errors and cross-field errors of the same file come in one ConfigError."""
        errors = errors_of(
            {
                "log.dirs": ["/nonexistent/kafka"],
                "log.cleaner.threads": 0,
                "mode": "watch",
                "log.cleaner.min.compaction.lag.ms": 10,
                "log.cleaner.max.compaction.lag.ms": 5,
                "topics": {
                    "orders": {
                        "retention.msx": 1,
                        "min.compaction.lag.ms": 9,
                        "max.compaction.lag.ms": 8,
                    },
                    "users": {"min.cleanable.dirty.ratio": 2},
                },
            }
        )
        assert [e.split(":")[0] for e in errors] == [
            "log.cleaner.threads",
            "mode",
            "topics.orders.retention.msx",
            "topics.users.min.cleanable.dirty.ratio",
            "log.cleaner.max.compaction.lag.ms",
            "topics.orders.max.compaction.lag.ms",
        ]

    def test_cross_check_on_a_bad_value_is_skipped(self) -> None:
        """A bad lag value gets its own error, not a second one from the lag comparison."""
        errors = errors_of(
            make(orders={"min.compaction.lag.ms": "soon", "max.compaction.lag.ms": 5})
        )
        assert errors == ["topics.orders.min.compaction.lag.ms: 'soon' must be an integer"]

    @settings(deadline=None, max_examples=50)
    @given(
        min_lag=st.integers(min_value=0, max_value=LONG_MAX),
        max_lag=st.integers(min_value=1, max_value=LONG_MAX),
    )
    def test_lag_order_is_the_only_lag_rule(self, min_lag: int, max_lag: int) -> None:
        """Valid lags are accepted exactly when min.compaction.lag.ms <= max.compaction.lag.ms."""
        data = make(t={"min.compaction.lag.ms": min_lag, "max.compaction.lag.ms": max_lag})
        if min_lag <= max_lag:
            assert config_from_data(data).topic_config("t").max_compaction_lag_ms == max_lag
        else:
            assert len(errors_of(data)) == 1


@pytest.mark.parametrize(("cpus", "bound"), [(None, 8), (1, 8), (2, 8), (4, 16), (16, 64)])
def test_cleaner_threads_are_bounded_by_the_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, bound: int
) -> None:
    """log.cleaner.threads is at most max(8, 4 x os.cpu_count()); one more is an error
    naming the key, the value and the bound."""
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert max_cleaner_threads() == bound
    ok = config_from_data({"log.dirs": ["/nonexistent/kafka"], "log.cleaner.threads": bound})
    assert ok.log_cleaner_threads == bound
    errors = errors_of({"log.dirs": ["/nonexistent/kafka"], "log.cleaner.threads": bound + 1})
    assert errors == [
        f"log.cleaner.threads: {bound + 1} must be <= {bound}: at most max(8, 4 x CPUs) "
        f"workers ({cpus or 1} CPUs here)"
    ]


class TestYaml:
    def test_yaml_booleans_do_not_pass_for_strings(self, tmp_path: Path) -> None:
        """YAML 1.1's off/no become booleans, which strict types reject with a hint."""
        errors = yaml_errors(
            tmp_path,
            "log.dirs: [/nonexistent]\n"
            "mode: off\n"
            "log.cleaner.compaction.strategy.header: no\n"
            "log.cleaner.threads: yes\n",
        )
        hint = "(YAML reads yes/no/on/off as booleans: quote the value)"
        assert errors == [
            f"line 4: log.cleaner.threads: true must be an integer {hint}",
            f"line 3: log.cleaner.compaction.strategy.header: false must be a string {hint}",
            f"line 2: mode: false must be 'owner' or 'observe' {hint}",
        ]

    def test_each_error_names_the_line_of_its_key(self, tmp_path: Path) -> None:
        """A problem in a file begins with the line of the key it names: nested keys,
        list items, and a cross-field check by the key its message names first. Only
        a YAML syntax error had a line; a long config had to be searched by key."""
        errors = yaml_errors(
            tmp_path,
            "log.dirs:\n"
            "  - /nonexistent/a\n"
            "  - 7\n"
            "log.cleaner.min.compaction.lag.ms: 5000\n"
            "log.cleaner.max.compaction.lag.ms: 100\n"
            "topics:\n"
            "  orders:\n"
            "    cleanup.policy: compact\n"
            "    retention.ms: soon\n",
        )
        assert errors == [
            "line 3: log.dirs[1]: 7 must be a path (a string)",
            "line 9: topics.orders.retention.ms: 'soon' must be an integer",
            "line 5: log.cleaner.max.compaction.lag.ms: 100 must be >= "
            "log.cleaner.min.compaction.lag.ms (5000)",
        ]

    def test_keys_must_be_strings(self, tmp_path: Path) -> None:
        """A key YAML reads as a boolean or number is named where it sits; a boolean one
        (a topic named `off`) with the hint to quote it."""
        errors = yaml_errors(
            tmp_path, "log.dirs: [/nonexistent]\nyes: 1\ntopics: {7: {}, off: {}}\n"
        )
        hint = "(YAML reads yes/no/on/off as booleans: quote the key)"
        assert errors == [
            "line 3: topics: key 7 must be a string",
            f"line 3: topics: key false must be a string {hint}",
            f"top level: key true must be a string {hint}",
        ]

    def test_missing_file(self, tmp_path: Path) -> None:
        """A file that does not exist is a ConfigError naming it."""
        with pytest.raises(ConfigError) as info:
            load_config(tmp_path / "nope.yaml")
        assert info.value.errors == ["cannot read the file: No such file or directory"]
        assert str(tmp_path / "nope.yaml") in str(info.value)

    def test_syntax_error_has_line_and_column(self, tmp_path: Path) -> None:
        """A YAML syntax error names its line and column."""
        (error,) = yaml_errors(tmp_path, "log.dirs: [/a\nmode: owner\n")
        assert error.startswith("line 2, column 5: YAML syntax error:")

    def test_duplicate_key_is_an_error(self, tmp_path: Path) -> None:
        """A key given twice in one mapping is refused instead of silently overwritten."""
        (error,) = yaml_errors(
            tmp_path, "log.dirs: [/a]\ntopics:\n  t: {retention.ms: 1}\n  t: {retention.ms: 2}\n"
        )
        assert error == ("line 4, column 3: YAML syntax error: duplicate key 't' (first at line 3)")

    def test_a_control_character_is_named_by_line_and_column(self, tmp_path: Path) -> None:
        assert yaml_errors(tmp_path, "log.dirs: [/a]\nmode: ow\x00ner\n") == [
            "line 2, column 9: character U+0000 is not allowed in YAML"
        ]

    def test_nesting_too_deep_for_the_parser_is_an_error(self, tmp_path: Path) -> None:
        depth = 5000
        text = "log.dirs: [/a]\nmqtt: " + "[" * depth + "]" * depth + "\n"
        assert yaml_errors(tmp_path, text) == ["YAML nested too deeply"]

    def test_a_path_with_a_nul_is_refused(self) -> None:
        (error,) = errors_of({"log.dirs": ["/a\x00b"]})
        assert error == "log.dirs[0]: '/a\\x00b' must not contain a NUL character"

    @pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just text\n", "string")])
    def test_document_must_be_a_mapping(self, tmp_path: Path, text: str, kind: str) -> None:
        """A document that is not a mapping is refused as a whole."""
        assert yaml_errors(tmp_path, text) == [
            f"the document must be a mapping of keys to values, not a {kind}"
        ]

    def test_empty_file_only_lacks_log_dirs(self, tmp_path: Path) -> None:
        """An empty file means all defaults, and log.dirs is then the one thing missing."""
        assert yaml_errors(tmp_path, "") == ["log.dirs: required: list at least one log directory"]

    def test_infinity_and_listen_forms(self, tmp_path: Path) -> None:
        """`.inf` is an unlimited rate; metrics.listen accepts bracketed IPv6."""
        path = tmp_path / "c.yaml"
        path.write_text(
            "log.dirs: /nonexistent\n"
            "log.cleaner.io.max.bytes.per.second: .inf\n"
            "metrics: {listen: '[::1]:9000'}\n"
        )
        cfg = load_config(path)
        assert math.isinf(cfg.log_cleaner_io_max_bytes_per_second)
        assert (cfg.metrics.host, cfg.metrics.port) == ("::1", 9000)

    def test_config_is_immutable(self) -> None:
        """A loaded config cannot be changed in place (reload swaps whole snapshots)."""
        cfg = load_config(None)
        with pytest.raises(ValueError, match="frozen"):
            cfg.log_cleaner_threads = 4


def test_broker_config_fields_all_have_kafka_names() -> None:
    """Every broker-level key is a dotted server.properties name."""
    keys = [f.alias for f in BrokerConfig.model_fields.values()]
    assert all(k is not None and re.fullmatch(r"[a-z]+(\.[a-z]+)+", k) for k in keys)
    assert yaml.safe_load(SAMPLE.read_text())["log.dirs"]


class TestPaths:
    """`check_paths`: the dirs of a loaded config, on this host (loading needs none)."""

    USER = "svc (uid 999)"
    DIR = PathState("dir", readable=True, writable=True)
    READ_ONLY = PathState("dir", readable=True, writable=False)

    @pytest.mark.parametrize(
        ("state", "observe", "expected"),
        [
            (DIR, False, None),
            (DIR, True, None),
            (READ_ONLY, True, None),
            (
                READ_ONLY,
                False,
                "log.dirs[1]: '/d' is not writable by user svc (uid 999), and mode: owner "
                "writes to it (mode: observe only reads)",
            ),
            (
                PathState("dir", readable=False, writable=True),
                True,
                "log.dirs[1]: '/d' is not readable by user svc (uid 999)",
            ),
            (PathState("file"), True, "log.dirs[1]: '/d' is a file, not a directory"),
            (PathState("other"), False, "log.dirs[1]: '/d' is not a directory"),
            (
                PathState("missing"),
                True,
                "log.dirs[1]: '/d' does not exist (cleanerd does not create log dirs: a "
                "missing one is usually an unmounted disk or a typo)",
            ),
            (
                PathState("unreachable", error="Permission denied"),
                False,
                "log.dirs[1]: '/d' cannot be looked at: Permission denied",
            ),
            (PathState("dir", readable=True, writable=True, lock_writable=False), True, None),
            (
                PathState("dir", readable=True, writable=True, lock_writable=False),
                False,
                "log.dirs[1]: '/d/.lock' is not writable by user svc (uid 999), and mode: "
                "owner locks it (a lock needs its file open to write: make it writable by "
                "this user or its group, or remove it while no broker runs)",
            ),
        ],
    )
    def test_log_dir_rules(self, state: PathState, observe: bool, expected: str | None) -> None:
        """A log dir must be a readable dir, and writable in owner mode; each problem
        names the key, the path and what is wrong."""
        problem = log_dir_problem("log.dirs[1]", Path("/d"), state, observe=observe, user=self.USER)
        assert problem == expected

    @pytest.mark.parametrize(
        ("state", "ancestor", "observe", "expected"),
        [
            (DIR, None, False, None),
            (READ_ONLY, None, True, None),
            (READ_ONLY, None, False, "state_dir: '/s/t' is not writable by user svc (uid 999)"),
            (PathState("file"), None, True, "state_dir: '/s/t' is a file, not a directory"),
            (PathState("missing"), (Path("/s"), DIR), False, None),
            (PathState("missing"), (Path("/s"), READ_ONLY), True, None),
            (
                PathState("missing"),
                (Path("/s"), READ_ONLY),
                False,
                "state_dir: '/s/t' does not exist and cannot be created: '/s' is not "
                "writable by user svc (uid 999)",
            ),
            (
                PathState("missing"),
                (Path("/s"), PathState("file")),
                False,
                "state_dir: '/s/t' does not exist and cannot be created: '/s' is a file, "
                "not a directory",
            ),
        ],
    )
    def test_state_dir_rules(
        self,
        state: PathState,
        ancestor: tuple[Path, PathState] | None,
        observe: bool,
        expected: str | None,
    ) -> None:
        """The state dir must be a dir or creatable as one under its nearest existing
        ancestor, and writable, in owner mode; observe mode writes nothing there."""
        problem = state_dir_problem(Path("/s/t"), state, ancestor, observe=observe, user=self.USER)
        assert problem == expected

    def test_probe_and_problems_on_real_paths(self, tmp_path: Path) -> None:
        """Each entry of log.dirs is looked at on disk; a configured state dir whose
        nearest existing ancestor is a file cannot be created; all problems at once."""
        good = tmp_path / "good"
        good.mkdir()
        a_file = tmp_path / "a-file"
        a_file.write_text("x")
        other_file = tmp_path / "other-file"
        other_file.write_text("x")
        cfg = config_from_data(
            {
                "log.dirs": [str(good), str(a_file), str(tmp_path / "missing")],
                "state_dir": str(other_file / "state" / "deeper"),
            }
        )
        assert probe_path(good) == PathState("dir", readable=True, writable=True)
        assert probe_path(a_file) == PathState("file")
        assert probe_path(a_file / "below") == PathState("missing")
        assert path_problems(cfg, user=self.USER) == [
            f"log.dirs[1]: {str(a_file)!r} is a file, not a directory",
            f"log.dirs[2]: {str(tmp_path / 'missing')!r} does not exist (cleanerd does not "
            "create log dirs: a missing one is usually an unmounted disk or a typo)",
            f"state_dir: {str(other_file / 'state' / 'deeper')!r} does not exist and cannot "
            f"be created: {str(other_file)!r} is a file, not a directory",
        ]
        with pytest.raises(ConfigError) as info:
            check_paths(cfg, path=Path("c.yaml"))
        assert str(info.value).startswith("invalid configuration c.yaml:\n  log.dirs[1]: ")

    def test_the_daemon_starts_on_the_usable_log_dirs(self, tmp_path: Path) -> None:
        """`check_paths` (the daemon's start) refuses a config only when no log dir or
        not the state dir can be used; an unusable log dir beside usable ones is returned,
        to go offline."""
        (tmp_path / "good").mkdir()
        missing = [str(tmp_path / "gone"), str(tmp_path / "unmounted")]
        cfg = config_from_data({"log.dirs": [str(tmp_path / "good"), missing[0]]})
        (problem,) = check_paths(cfg)
        assert problem.startswith(f"log.dirs[1]: {missing[0]!r} does not exist")
        with pytest.raises(ConfigError, match=r"log.dirs\[0\]: .*\n  log.dirs\[1\]: "):
            check_paths(config_from_data({"log.dirs": missing}))
        state = tmp_path / "afile"
        state.write_text("x")
        cfg = config_from_data({"log.dirs": [str(tmp_path / "good")], "state_dir": str(state)})
        with pytest.raises(ConfigError, match="state_dir: "):
            check_paths(cfg)

    def test_the_default_state_dir_is_checked_where_the_command_runs(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The default state dir, `./state`, is relative to the working directory: it is
        checked there, and a problem says it is the default and where it landed (a unit
        without a working directory put it in the read-only `/`, and `run` then failed
        with "no log dir could be opened: state: Permission denied")."""
        (tmp_path / "logs").mkdir()
        cfg = config_from_data({"log.dirs": [str(tmp_path / "logs")]})
        looked_at: list[Path] = []

        def probe(path: Path) -> PathState:
            looked_at.append(path)
            return probe_path(path)

        monkeypatch.chdir(tmp_path)
        assert path_problems(cfg, probe=probe) == []
        assert looked_at[:2] == [tmp_path / "logs", Path("state")]
        (tmp_path / "state").write_text("not a dir")
        (problem,) = path_problems(cfg)
        assert problem.startswith(f"state_dir (not set: the default 'state' in {tmp_path}): ")
        with pytest.raises(ConfigError, match="the default 'state'"):
            check_paths(cfg)

    @pytest.mark.parametrize("command", ["check-config", "plan"])
    def test_a_log_dir_the_user_may_not_read_is_named_and_the_others_go_on(
        self, tmp_path: Path, command: str
    ) -> None:
        """A log dir without read and search permission for the user (root without its
        DAC capabilities, as a hardened unit runs it): its key is named, and `plan` plans
        the other log dir. Looking for its `.lock` raised, so every command printed only
        '<dir>/.lock: Permission denied' and did nothing else."""
        locked, ok = tmp_path / "locked", tmp_path / "ok"
        (ok / "t-0").mkdir(parents=True)
        locked.mkdir(mode=0)
        config = tmp_path / "c.yaml"
        config.write_text(
            f"log.dirs: [{locked}, {ok}]\nstate_dir: {tmp_path / 'state'}\nmode: observe\n"
        )
        caps = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", "--"]
        argv += [sys.executable, "-m", "cleanerd", command]
        argv += [str(config)] if command == "check-config" else ["-c", str(config)]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)
        assert done.returncode == 1, done.stderr
        named = f"log.dirs[0]: {str(locked)!r} is not readable by user root (uid 0)"
        assert named in done.stdout + done.stderr
        assert "Permission denied" not in done.stdout + done.stderr
        if command == "plan":
            assert f"{ok}: only observed (mode: observe)" in done.stdout

    @pytest.mark.parametrize(("mode", "problems"), [("owner", 2), ("observe", 0)])
    def test_read_only_filesystem(self, tmp_path: Path, mode: str, problems: int) -> None:
        """On a read-only mount (not writable even for root) the log dir and the state
        dir are errors in owner mode and fine in observe mode."""
        with tmpfs(tmp_path / "mnt", "64k") as mnt:
            (mnt / "logs").mkdir()
            (mnt / "state").mkdir()
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            cfg = config_from_data(
                {"log.dirs": [str(mnt / "logs")], "state_dir": str(mnt / "state"), "mode": mode}
            )
            found = path_problems(cfg)
        assert len(found) == problems
        if found:  # the log dir said as what it is: nobody may write there, root neither
            log_dir, state_dir = found
            read_only = f"log.dirs[0]: {str(mnt / 'logs')!r} is on a read-only file system"
            assert log_dir.startswith(read_only)
            assert "is not writable by user" in state_dir


def test_an_offset_map_that_cannot_hold_a_key_is_refused() -> None:
    """A dedupe buffer whose share per cleaner thread cannot hold one key is refused at
    load (every pass would fail, the partitions marked uncleanable one by one); the
    slots are the larger where a topic's strategy adds versions. It passed check-config."""
    small = {"log.dirs": ["/d"], "log.cleaner.dedupe.buffer.size": 96, "log.cleaner.threads": 2}
    assert config_from_data(small).log_cleaner_dedupe_buffer_size == 96  # 2 slots of 24
    by_time = {"cleanup.policy": "compact", "compaction.strategy": "timestamp"}
    versioned = {**small, "topics": {"prices": by_time}}
    assert errors_of(versioned) == [
        "log.cleaner.dedupe.buffer.size: offset map of 48 bytes (1 slot of 32 bytes at "
        "load factor 0.9) is too small to fit even a single key, so log cleaning would "
        "never make progress; increase log.cleaner.dedupe.buffer.size or decrease "
        "log.cleaner.threads"
    ]
    # No map is built where nothing is compacted by versions, the cleaner is off, or
    # nothing is written.
    deleted = {"compaction.strategy": "timestamp", "cleanup.policy": "delete"}
    assert config_from_data({**small, "topics": {"prices": deleted}})
    for where_none in ({"log.cleaner.enable": False}, {"mode": "observe"}):
        assert config_from_data({**versioned, **where_none, "log.cleaner.dedupe.buffer.size": 1})


@pytest.mark.parametrize(
    ("section", "error"),
    [
        (
            {"metrics": {"refresh_interval_s": math.inf}},
            "metrics.refresh_interval_s: .inf input should be a finite number",
        ),
        (
            {"metrics": {"refresh_interval_s": 86400}},
            "metrics.refresh_interval_s: 86400 must be <= 3600",
        ),
        (
            {"mqtt": {"client_id": ""}},
            "mqtt.client_id: '' must not be empty",
        ),
    ],
)
def test_values_that_only_look_valid_are_refused(section: dict[str, Any], error: str) -> None:
    """An infinite refresh interval froze every gauge, and an empty client id has the
    broker give each connection a new one: both passed check-config."""
    assert errors_of({"log.dirs": ["/d"], **section}) == [error]
