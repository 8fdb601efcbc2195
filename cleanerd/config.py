"""cleanerd's configuration: one YAML file, validated whole into a frozen snapshot.

File format (YAML, read with a safe loader that also rejects duplicate keys)::

    log.dirs: [/var/lib/kafka/data]     # broker-level settings: Kafka's server.properties
    log.cleaner.threads: 2              #   names and defaults, at the top level
    topics:                             # per-topic overrides: Kafka's topic-config names,
      orders: {cleanup.policy: compact} #   keyed by exact topic name or fnmatch glob
      "metrics.*": {retention.ms: 3600000}
    mode: owner                         # cleanerd's own settings: nested snake_case
    metrics: {listen: "127.0.0.1:9644"} #   sections (mode, state_dir, metrics, mqtt,
                                        #   logging, engine, disk_usage)

A topic's effective settings (`TopicConfig`) are the broker defaults, mapped to topic
names the way Kafka's ServerTopicConfigSynonyms does (`log.cleaner.min.cleanable.ratio`
-> `min.cleanable.dirty.ratio`, `log.roll.hours` -> `segment.ms`, ...), with the keys of
exactly one `topics:` entry merged over them key by key: the entry named exactly like the
topic if there is one, else the one glob that matches it. Two globs matching one topic
is an error, because no order between them would be obvious to the reader of the file.

Consistency: `load_config` either returns a complete, immutable `Config` or raises one
`ConfigError` that lists every problem (each naming the key path, the bad value and the
rule), field errors and cross-field checks together. A daemon can therefore swap
snapshots atomically on reload and keep the old one when the new file is refused.

Paths on this host: loading never requires the dirs a config names to exist (a file can
be checked, and tests can load one, anywhere). `check_paths` is the separate check of a
loaded config against this host's filesystem, as the current user, that `check-config`
and `run` make: every `log.dirs` entry must be an existing directory, readable, and in
`mode: owner` writable too (observe mode only reads). A missing log dir is an error, not
something cleanerd creates: `run` could not lock it, and a missing mount point or a typo
is likelier than a new dir, which would land on whatever filesystem holds its parent. A
configured `state_dir` must be a directory or creatable as one, and in owner mode
writable (cleanerd creates it on first use); in observe mode nothing is written there.
`check-config` reports every such problem; `run` starts on the usable log dirs and
leaves the others offline, and does not start when none is usable or the state dir is
not (`check_paths`).
"""

from __future__ import annotations

import copy
import difflib
import errno
import math
import os
import pwd
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from cleanerd.compaction.map_memory import (
    OFFSET_ENTRY_BYTES,
    VERSIONED_ENTRY_BYTES,
    memory_per_thread,
    too_small,
)
from cleanerd.errors import ConfigError, failure_text
from cleanerd.log.files import LOCK_FILE_NAME, parse_topic_partition
from cleanerd.log.ownership import lock_holder
from cleanerd.log.roll import DEFAULT_MIN_ROLL_INTERVAL_MS
from cleanerd.log.topic_config import CleanupPolicy, CompactionStrategyName, TopicConfig
from cleanerd.records.header import INT32_MAX
from cleanerd.wording import count

LONG_MAX: Final = 2**63 - 1  # Java's Long.MAX_VALUE, Kafka's "no limit" for longs


# Kafka's legal topic names (Topic.validate): at most 249 of these characters.
_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_GLOB_CHARS: Final = frozenset("*?[")
_MQTT_WILDCARDS: Final = frozenset("+#")


def is_glob(pattern: str) -> bool:
    """Whether a `topics:` key is an fnmatch pattern rather than an exact topic name.

    Kafka topic names cannot contain `*`, `?` or `[`, so the two never overlap.
    """
    return not _GLOB_CHARS.isdisjoint(pattern)


# ---------------------------------------------------------------------------
# Value types shared by the broker settings and the topic overrides


def _comma_list(value: object) -> object:
    """Accept server.properties' comma-separated form (`compact,delete`) for lists."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    if isinstance(value, list):
        return tuple(value)
    return value


def _canonical_policy(value: tuple[CleanupPolicy, ...]) -> tuple[CleanupPolicy, ...]:
    return tuple(p for p in ("compact", "delete") if p in value)


def _empty_strategy_is_offset(value: object) -> object:
    # KIP-280: an empty compaction.strategy means the default, offset.
    return "offset" if value == "" else value


def _path(value: object) -> object:
    if isinstance(value, str):
        if not value.strip():
            raise PydanticCustomError("path", "must be a non-empty path")
        if "\0" in value:  # no system call takes one: YAML's "\0" escape makes it
            raise PydanticCustomError("path", "must not contain a NUL character")
        return Path(value)
    return value


Ms = Annotated[int, Field(ge=0, le=LONG_MAX)]
PositiveMs = Annotated[int, Field(ge=1, le=LONG_MAX)]
RetentionMs = Annotated[int, Field(ge=-1, le=LONG_MAX)]  # -1: no time limit
RetentionBytes = Annotated[int, Field(ge=-1, le=LONG_MAX)]  # -1: no size limit
SegmentBytes = Annotated[int, Field(ge=14, le=INT32_MAX)]  # Kafka 3.x minimum; 4.x: 1 MiB
IndexBytes = Annotated[int, Field(ge=4, le=INT32_MAX)]
IntervalBytes = Annotated[int, Field(ge=0, le=INT32_MAX)]
MessageBytes = Annotated[int, Field(ge=0, le=INT32_MAX)]
Ratio = Annotated[float, Field(ge=0, le=1)]
CleanupPolicies = Annotated[
    tuple[CleanupPolicy, ...],
    BeforeValidator(_comma_list),
    Field(min_length=1),
    AfterValidator(_canonical_policy),
]
Strategy = Annotated[CompactionStrategyName, BeforeValidator(_empty_strategy_is_offset)]
FsPath = Annotated[Path, BeforeValidator(_path)]
Loc = tuple[str | int, ...]
"""Where a key is in the document: its keys and list indexes, as pydantic names it."""
LogDirs = Annotated[tuple[FsPath, ...], BeforeValidator(_comma_list)]


class _Section(BaseModel):
    """Every config model: strict types (so YAML's `no`/`off` never pass for a string or
    a number), unknown keys are errors, and snapshots are immutable."""

    # defer_build: each model's validator is built when first used, not when its class
    # is made; `Config` builds its sections' once, and `check-config` pays for no
    # validator twice (about a tenth of a second of every command's start).
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, defer_build=True)


def _dotted(name: str) -> str:
    return name.replace("_", ".")


class _KafkaKeys(_Section):
    """Models whose YAML keys are Kafka's dotted names (`log_segment_bytes` is read from
    `log.segment.bytes`)."""

    model_config = ConfigDict(alias_generator=_dotted)


# ---------------------------------------------------------------------------
# Per-topic settings


class TopicOverride(_KafkaKeys):
    """One `topics:` entry: only the keys it sets replace the broker defaults (an explicit
    null inherits too)."""

    cleanup_policy: CleanupPolicies | None = None
    segment_bytes: SegmentBytes | None = None
    segment_ms: PositiveMs | None = None
    segment_jitter_ms: Ms | None = None
    segment_index_bytes: IndexBytes | None = None
    index_interval_bytes: IntervalBytes | None = None
    retention_ms: RetentionMs | None = None
    retention_bytes: RetentionBytes | None = None
    min_compaction_lag_ms: Ms | None = None
    max_compaction_lag_ms: PositiveMs | None = None
    min_cleanable_dirty_ratio: Ratio | None = None
    delete_retention_ms: Ms | None = None
    file_delete_delay_ms: Ms | None = None
    max_message_bytes: MessageBytes | None = None
    compaction_strategy: Strategy | None = None
    compaction_strategy_header: str | None = None
    preallocate: bool | None = None

    def apply_to(self, defaults: TopicConfig) -> TopicConfig:
        """`defaults` with the keys this entry sets replaced."""
        return replace(defaults, **self.model_dump(exclude_none=True))


# Topic-config name -> the broker setting that supplies its default (Kafka's
# ServerTopicConfigSynonyms; where Kafka has several, the first listed wins).
TOPIC_CONFIG_SYNONYMS: Final[dict[str, tuple[str, ...]]] = {
    "cleanup.policy": ("log.cleanup.policy",),
    "segment.bytes": ("log.segment.bytes",),
    "segment.ms": ("log.roll.ms", "log.roll.hours"),
    "segment.jitter.ms": ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    "segment.index.bytes": ("log.index.size.max.bytes",),
    "index.interval.bytes": ("log.index.interval.bytes",),
    "retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "retention.bytes": ("log.retention.bytes",),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms",),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms",),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio",),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms",),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms",),
    "max.message.bytes": ("message.max.bytes",),
    "compaction.strategy": ("log.cleaner.compaction.strategy",),
    "compaction.strategy.header": ("log.cleaner.compaction.strategy.header",),
    "preallocate": ("log.preallocate",),
}


# ---------------------------------------------------------------------------
# Broker-level settings (server.properties names and defaults)


def max_cleaner_threads(cpus: int | None = None) -> int:
    """The most `log.cleaner.threads` accepted: max(8, 4 x CPUs), with `os.cpu_count()`
    CPUs unless `cpus` is given."""
    return max(8, 4 * (cpus if cpus is not None else os.cpu_count() or 1))


def _check_threads(value: int) -> int:
    bound = max_cleaner_threads()
    if value > bound:
        raise PydanticCustomError(
            "threads_bound",
            "must be <= {bound}: at most max(8, 4 x CPUs) workers ({cpus} CPUs here)",
            {"bound": bound, "cpus": os.cpu_count() or 1},
        )
    return value


class BrokerConfig(_KafkaKeys):
    """The broker-level settings cleanerd honours, with Kafka's defaults."""

    log_dirs: LogDirs = ()
    log_cleaner_enable: bool = True
    log_cleaner_threads: Annotated[int, Field(ge=1), AfterValidator(_check_threads)] = 1
    """Cleaning worker processes, 1 to `max_cleaner_threads()` = max(8, 4 x CPUs). Each is
    a process with its own share of the offset-map memory, so more workers than the
    host's CPUs can keep busy only divide that memory into smaller maps and make the
    passes contend; a larger value is more likely a typo than a plan. (Kafka has no
    fixed bound: its LogCleaner only refuses a dynamic update that would more than double
    the running thread count, or cut it below half.)"""
    log_cleaner_dedupe_buffer_size: int = Field(default=134217728, ge=1, le=LONG_MAX)
    log_cleaner_io_buffer_load_factor: float = Field(default=0.9, gt=0, le=1)
    log_cleaner_io_buffer_size: int = Field(default=524288, ge=1, le=INT32_MAX)
    log_cleaner_io_max_bytes_per_second: float = Field(default=math.inf, gt=0)
    log_cleaner_backoff_ms: Ms = 15000
    log_cleaner_min_cleanable_ratio: Ratio = 0.5
    log_cleaner_delete_retention_ms: Ms = 86400000
    log_cleaner_min_compaction_lag_ms: Ms = 0
    log_cleaner_max_compaction_lag_ms: PositiveMs = LONG_MAX
    log_cleaner_compaction_strategy: Strategy = "offset"
    log_cleaner_compaction_strategy_header: str = ""
    log_cleanup_policy: CleanupPolicies = ("delete",)
    log_roll_ms: PositiveMs | None = None
    log_roll_hours: int = Field(default=168, ge=1, le=INT32_MAX)
    log_roll_jitter_ms: Ms | None = None
    log_roll_jitter_hours: int = Field(default=0, ge=0, le=INT32_MAX)
    log_segment_bytes: SegmentBytes = 1073741824
    log_index_size_max_bytes: IndexBytes = 10485760
    log_index_interval_bytes: IntervalBytes = 4096
    log_segment_delete_delay_ms: Ms = 60000
    log_retention_ms: RetentionMs | None = None
    log_retention_minutes: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    log_retention_hours: int = Field(default=168, ge=-1, le=INT32_MAX)
    log_retention_bytes: RetentionBytes = -1
    log_retention_check_interval_ms: PositiveMs = 300000
    log_retention_disk_usage_percent: int = Field(default=100, ge=1, le=100)
    message_max_bytes: MessageBytes = 1048588
    producer_id_expiration_ms: int = Field(default=86400000, ge=1, le=INT32_MAX)
    log_preallocate: bool = False

    @property
    def retention_ms(self) -> int:
        """Kafka's precedence: log.retention.ms, then .minutes, then .hours; -1 unlimited."""
        if self.log_retention_ms is not None:
            return self.log_retention_ms
        if self.log_retention_minutes is not None:
            return -1 if self.log_retention_minutes < 0 else self.log_retention_minutes * 60_000
        return -1 if self.log_retention_hours < 0 else self.log_retention_hours * 3_600_000

    @property
    def roll_ms(self) -> int:
        """log.roll.ms, else log.roll.hours."""
        if self.log_roll_ms is not None:
            return self.log_roll_ms
        return self.log_roll_hours * 3_600_000

    @property
    def roll_jitter_ms(self) -> int:
        """log.roll.jitter.ms, else log.roll.jitter.hours."""
        if self.log_roll_jitter_ms is not None:
            return self.log_roll_jitter_ms
        return self.log_roll_jitter_hours * 3_600_000

    def topic_defaults(self) -> TopicConfig:
        """The settings of a topic that no `topics:` entry matches."""
        return TopicConfig(
            cleanup_policy=self.log_cleanup_policy,
            segment_bytes=self.log_segment_bytes,
            segment_ms=self.roll_ms,
            segment_jitter_ms=self.roll_jitter_ms,
            segment_index_bytes=self.log_index_size_max_bytes,
            index_interval_bytes=self.log_index_interval_bytes,
            retention_ms=self.retention_ms,
            retention_bytes=self.log_retention_bytes,
            min_compaction_lag_ms=self.log_cleaner_min_compaction_lag_ms,
            max_compaction_lag_ms=self.log_cleaner_max_compaction_lag_ms,
            min_cleanable_dirty_ratio=self.log_cleaner_min_cleanable_ratio,
            delete_retention_ms=self.log_cleaner_delete_retention_ms,
            file_delete_delay_ms=self.log_segment_delete_delay_ms,
            max_message_bytes=self.message_max_bytes,
            compaction_strategy=self.log_cleaner_compaction_strategy,
            compaction_strategy_header=self.log_cleaner_compaction_strategy_header,
            preallocate=self.log_preallocate,
        )


# ---------------------------------------------------------------------------
# cleanerd's own sections


def _check_listen(value: str) -> str:
    _split_listen(value)
    return value


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise PydanticCustomError(
            "listen", "must be HOST:PORT with a port in 0..65535 (IPv6 as [::1]:9644)"
        )
    return host, int(port)


_SPARK_HOST_PORT: Final = r"(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})"
_SPARK_MASTER: Final = re.compile(
    # SparkContext's master patterns: local[N] and local[N, failures] with N a positive
    # count or *, local-cluster[workers, cores, MB], spark:// with comma-separated
    # HOST:PORT masters (standby masters), k8s://, yarn.
    r"local(?:\[(?:\*|[1-9][0-9]*)(?:\s*,\s*[0-9]+)?\])?"
    r"|local-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*\]"
    rf"|spark://{_SPARK_HOST_PORT}(?:,{_SPARK_HOST_PORT})*"
    r"|k8s://\S+|yarn"
)


def _check_spark_master(value: str) -> str:
    # Spark refuses any other master when the job starts, a pass later (SparkSubmit:
    # "Master must either be yarn or start with spark, k8s, or local"; "Could not parse
    # Master URL"; "Asked to run locally with 0 threads"; "Invalid master URL").
    match = _SPARK_MASTER.fullmatch(value)
    ports = re.findall(_SPARK_HOST_PORT, value) if value.startswith("spark://") else []
    if match is None or not all(0 < int(port) < 65536 for port in ports):
        raise PydanticCustomError(
            "spark_master",
            "must be local, local[N] or local[*] (N at least 1), local-cluster[N, C, M], "
            "spark://HOST:PORT[,HOST:PORT...], k8s://URL or yarn (Spark's masters)",
        )
    return value


def _check_topic_prefix(value: str) -> str:
    if (
        not value
        or value.startswith("/")
        or value.endswith("/")
        or not _MQTT_WILDCARDS.isdisjoint(value)
    ):
        raise PydanticCustomError(
            "topic_prefix", "must be a non-empty MQTT topic without +, # or a leading/trailing /"
        )
    return value


class MetricsConfig(_Section):
    """The Prometheus endpoint."""

    listen: Annotated[str, AfterValidator(_check_listen)] = "127.0.0.1:9644"
    per_partition: bool = False
    kafka_names: bool = True
    # At most an hour: the gauges exist to follow the clock (an infinite one froze them).
    refresh_interval_s: float = Field(default=10.0, gt=0, le=3600, allow_inf_nan=False)

    @property
    def host(self) -> str:
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return _split_listen(self.listen)[1]


class TlsConfig(_Section):
    """TLS towards the MQTT broker."""

    enabled: bool = False
    ca_file: FsPath | None = None
    cert_file: FsPath | None = None
    key_file: FsPath | None = None
    insecure: bool = False


class MqttConfig(_Section):
    """Optional MQTT events; `client_id` null means `cleanerd-<hostname>`."""

    enabled: bool = False
    host: str = Field(default="localhost", min_length=1)
    port: int = Field(default=1883, ge=1, le=65535)
    username: str | None = None
    password_file: FsPath | None = None
    tls: TlsConfig = TlsConfig()
    client_id: str | None = Field(default=None, min_length=1)
    topic_prefix: Annotated[str, AfterValidator(_check_topic_prefix)] = "cleanerd"
    queue_size: int = Field(default=1000, ge=1)
    keepalive_s: int = Field(default=60, ge=1, le=65535)


class LoggingConfig(_Section):
    """structlog output: `auto` is console on a terminal and JSON lines otherwise."""

    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error", "critical"] = "info"


class SparkConfig(_Section):
    """The Spark engine's master URL, extra Spark settings, and the `auto` engine's
    threshold: a pass goes to Spark when its dirty range's estimated distinct keys exceed
    `min_keys_over_capacity` times the local offset map's capacity."""

    master: Annotated[str, AfterValidator(_check_spark_master)] = "local[*]"
    conf: dict[str, str] = {}
    min_keys_over_capacity: float = Field(default=1.0, ge=1.0, allow_inf_nan=False)


class EngineConfig(_Section):
    """Which engine runs the clean passes, by the names `--engine` takes too: `local`
    (worker processes on this host), `spark` (every pass on Spark) or `auto` (a pass on
    Spark only when its keys outgrow the local offset map, see `spark`)."""

    name: Literal["local", "spark", "auto"] = "local"
    spark: SparkConfig = SparkConfig()


class RollsConfig(_Section):
    """cleanerd's own roll settings (Kafka rolls only on append and has none of them)."""

    min_interval_ms: int = Field(default=DEFAULT_MIN_ROLL_INTERVAL_MS, ge=0)
    """A segment rolls by time (`segment.ms`, `max.compaction.lag.ms`) only this long
    after the partition's last roll, and never later than `maxSegmentMs` after it (so a
    deadline is kept): a guard against a roll per batch when producer timestamps lie in
    the past (linkedin/kafka#521). 15 minutes by default; 0 turns it off."""


class DiskUsageConfig(_Section):
    """KIP-61 disk-usage retention (`log.retention.disk.usage.percent`)."""

    protected_topics: Annotated[tuple[str, ...], BeforeValidator(_comma_list)] = ()
    dry_run: bool = False

    def protects(self, topic: str) -> bool:
        """Whether disk-usage retention must never delete segments of `topic`."""
        return any(fnmatchcase(topic, pattern) for pattern in self.protected_topics)


# ---------------------------------------------------------------------------
# The whole file


class Config(BrokerConfig):
    """The whole file: broker settings, topic overrides and cleanerd's own sections."""

    mode: Literal["owner", "observe"] = "owner"
    """What this process asks of its log dirs: the values of `log_dir.Mode` a config may
    choose (shared mode is never configured: it is how an appender meets an owner)."""
    state_dir: FsPath = Field(default=Path("state"), alias="state_dir")
    metrics: MetricsConfig = MetricsConfig()
    mqtt: MqttConfig = MqttConfig()
    logging: LoggingConfig = LoggingConfig()
    engine: EngineConfig = EngineConfig()
    disk_usage: DiskUsageConfig = Field(default=DiskUsageConfig(), alias="disk_usage")
    rolls: RollsConfig = RollsConfig()
    topics: dict[str, TopicOverride] = {}

    _defaults: TopicConfig = PrivateAttr()
    _entries: dict[str, TopicConfig] = PrivateAttr()
    _globs: tuple[str, ...] = PrivateAttr()

    @property
    def observe(self) -> bool:
        """`mode: observe`: every log dir is only read."""
        return self.mode == "observe"

    def model_post_init(self, context: Any, /) -> None:
        # Resolve every entry once: the daemon asks for topic configs every cycle.
        self._defaults = self.topic_defaults()
        self._entries = {key: o.apply_to(self._defaults) for key, o in self.topics.items()}
        self._globs = tuple(key for key in self.topics if is_glob(key))

    def topic_entry(self, topic: str) -> str | None:
        """The `topics:` key that applies to `topic`: its exact name, else the one glob
        matching it, else None. Raises ConfigError when two or more globs match."""
        if topic in self.topics:
            return topic
        matches = [glob for glob in self._globs if fnmatchcase(topic, glob)]
        if len(matches) > 1:
            raise ConfigError([_ambiguous(topic, matches)])
        return matches[0] if matches else None

    def topic_config(self, topic: str) -> TopicConfig:
        """The effective settings of `topic`. Raises ConfigError when two globs match it."""
        entry = self.topic_entry(topic)
        return self._defaults if entry is None else self._entries[entry]

    def entry_config(self, key: str) -> TopicConfig:
        """The effective settings of a topic that the `topics:` entry `key` applies to."""
        return self._entries[key]

    def ambiguous_topics(self, topics: Iterable[str]) -> list[str]:
        """One error line for each of `topics` that two or more globs match."""
        errors = []
        for topic in topics:
            try:
                self.topic_entry(topic)
            except ConfigError as e:
                errors.extend(e.errors)
        return errors


def _ambiguous(topic: str, globs: list[str]) -> str:
    listed = ", ".join(repr(g) for g in globs[:-1]) + f" and {globs[-1]!r}"
    return (
        f"topics: topic {topic!r} matches more than one glob: {listed}; "
        "add an exact entry for it or make the globs disjoint"
    )


# ---------------------------------------------------------------------------
# Loading


def load_config(path: Path | None) -> Config:
    """Read and validate the YAML file at `path`; None gives the embedded default.

    Raises ConfigError listing every problem: an unreadable file, a YAML syntax error
    (with line and column), a document that is not a mapping, every invalid key and
    value, every failed cross-field check. A topic in the log dirs that two globs match
    is no load error (`ambiguous_on_disk`): the daemon leaves only its partitions alone,
    as it does with one created while it runs, rather than refusing to start or reload
    because of one topic; `check-config` reports it.
    """
    if path is None:
        return config_from_data(default_config_data())
    data, lines = _read_yaml(path)
    return config_from_data(data, path=path, lines=lines)


def config_from_data(
    data: object, *, path: Path | None = None, lines: Mapping[Loc, int] | None = None
) -> Config:
    """Validate an already parsed document (`path` only names it in errors; `lines`, the
    line of each key in it, begins each error with the line of the key it names)."""
    if data is None:  # an empty file: every key at its default
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"the document must be a mapping of keys to values, not a {_yaml_kind(data)}"],
            path=path,
        )
    errors, broken, cfg = _validate_fields(data)
    errors = [_at_line(lines, loc, e) for loc, e in zip(broken, errors, strict=True)]
    if cfg is not None:
        problems = list(_cross_field_problems(cfg))
        errors += [
            _at_line(lines, _named(keys, message), message)
            for keys, message in problems
            if not _touches(keys, broken)
        ]
    if errors:
        raise ConfigError(errors, path=path)
    assert cfg is not None
    return cfg


def _named(keys: list[Loc], message: str) -> Loc:
    """The key of a cross-field problem's `keys` that its `message` begins with."""
    return next((k for k in keys if message.startswith(_key_path(k))), keys[0] if keys else ())


def _at_line(lines: Mapping[Loc, int] | None, loc: Loc, error: str) -> str:
    """`error`, begun with the line of the key at `loc` (or of the nearest key above it
    that the file names) when `lines` has it."""
    for n in range(len(loc), 0, -1):
        line = (lines or {}).get(loc[:n])
        if line is not None:
            return f"line {line}: {error}"
    return error


def default_config_data() -> dict[str, Any]:
    """The embedded default: log dir ./data, state dir ./state, and three demo topics."""
    small_segments = 16 * 1024  # so a few hundred demo records span several segments
    return {
        "log.dirs": ["./data"],
        "state_dir": "./state",
        "topics": {
            "demo-users": {
                "cleanup.policy": "compact",
                "segment.bytes": small_segments,
                "max.compaction.lag.ms": 60_000,
                "delete.retention.ms": 60_000,
            },
            "demo-events": {
                "cleanup.policy": "delete",
                # Several small segments and a one-minute roll, so time retention has whole
                # segments to delete in the demo (it never deletes the active segment).
                "segment.bytes": 4096,
                "segment.ms": 60_000,
                "retention.ms": 600_000,
            },
            "demo-prices": {
                "cleanup.policy": "compact",
                "segment.bytes": small_segments,
                "max.compaction.lag.ms": 300_000,
                "compaction.strategy": "timestamp",
            },
        },
    }


def topics_on_disk(log_dirs: Iterable[Path]) -> dict[str, Path]:
    """Each topic with a partition dir in `log_dirs`, mapped to one such dir.

    A missing or unreadable log dir is skipped: reporting it is the daemon's job, and a
    config may be checked on a machine without the data.
    """
    found: dict[str, Path] = {}
    for log_dir in log_dirs:
        try:
            entries = sorted(log_dir.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                topic = parse_topic_partition(entry.name).topic
            except ValueError:
                continue
            if entry.is_dir():
                found.setdefault(topic, entry)
    return found


# ---------------------------------------------------------------------------
# The paths of a loaded config, on this host (not part of validation: see the docstring)

PathKind = Literal["dir", "file", "other", "missing", "unreachable"]


@dataclass(frozen=True, slots=True)
class PathState:
    """What a path is on this host, and what the current user may do with it."""

    kind: PathKind
    readable: bool = False
    """A dir whose entries this user may list and open (r and x)."""
    writable: bool = False
    """A dir in which this user may create, rename and delete entries (w and x)."""
    lock_writable: bool = True
    """A dir whose `.lock` (a log dir's lock file) this user may open to write, or that
    has none (a POSIX lock needs its file open to write)."""
    error: str = ""
    """Why the path could not be looked at (`unreachable`: no search permission on a
    parent, a link loop)."""
    read_only_fs: bool = False
    """A dir on a file system mounted read-only (nobody may write it, root neither)."""
    held: bool = False
    """A log dir whose `.lock` another process holds now (a broker): owner mode only
    observes it while it is held, so only reading it matters."""


def probe_path(path: Path) -> PathState:
    """Look at `path` as this process's effective user (the service user under systemd)."""
    try:
        st = path.stat()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):  # ENOTDIR: a parent is a file
            return PathState("missing")
        return PathState("unreachable", error=e.strerror or str(e))
    if not stat.S_ISDIR(st.st_mode):
        return PathState("file" if stat.S_ISREG(st.st_mode) else "other")
    lock = path / LOCK_FILE_NAME
    try:
        read_only_fs = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    readable = may(path, os.R_OK | os.X_OK)
    writable = may(path, os.W_OK | os.X_OK)
    if not readable:  # nothing in it can be looked at: its `.lock` neither
        return PathState("dir", readable=False, writable=writable, read_only_fs=read_only_fs)
    return PathState(
        "dir",
        readable=True,
        writable=writable,
        lock_writable=not lock.exists() or may(lock, os.W_OK),
        read_only_fs=read_only_fs,
        held=lock_holder(path) not in (None, os.getpid()),
    )


def may(path: Path, mode: int) -> bool:
    """Whether this process's effective user may access `path` in `mode` (`os.access`'s
    bits): the service user under systemd, not the one that started it."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, mode, effective_ids=effective)


def current_user() -> str:
    """`name (uid N)` of the effective user, for messages."""
    uid = os.geteuid()
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _not_a_dir(path: Path, state: PathState) -> str | None:
    """What is wrong with an existing path that should be a directory, or None."""
    shown = repr(str(path))
    if state.kind == "file":
        return f"{shown} is a file, not a directory"
    if state.kind == "other":
        return f"{shown} is not a directory"
    if state.kind == "unreachable":
        return f"{shown} cannot be looked at: {state.error}"
    return None


def log_dir_problem(
    key: str, path: Path, state: PathState, *, observe: bool, user: str
) -> str | None:
    """Why a log dir in `state` cannot be used (None: it can). Owner mode needs to read
    and write it; observe mode only to read it, and so does owner mode while another
    process holds it (`LogDir.open` observes it then: a broker's dir is often read-only
    to cleanerd, as the unit's observe drop-in makes it)."""
    observe = observe or state.held
    shown = repr(str(path))
    if state.kind == "missing":
        return (
            f"{key}: {shown} does not exist (cleanerd does not create log dirs: a missing "
            "one is usually an unmounted disk or a typo)"
        )
    wrong = _not_a_dir(path, state)
    if wrong is not None:
        return f"{key}: {wrong}"
    if not state.readable:
        return f"{key}: {shown} is not readable by user {user}"
    if not observe and state.read_only_fs:
        return (
            f"{key}: {shown} is on a read-only file system, and mode: owner writes to it "
            "(mode: observe only reads)"
        )
    if not observe and not state.writable:
        return (
            f"{key}: {shown} is not writable by user {user}, and mode: owner writes "
            "to it (mode: observe only reads)"
        )
    if not observe and not state.lock_writable:
        return (
            f"{key}: {str(path / '.lock')!r} is not writable by user {user}, and mode: owner "
            "locks it (a lock needs its file open to write: make it writable by this user "
            "or its group, or remove it while no broker runs)"
        )
    return None


def log_dir_failure(cfg: Config, path: Path, exc: BaseException) -> str:
    """Why the log dir `path` of `cfg` could not be opened: in `log_dir_problem`'s words,
    naming its key as `check-config` and `run` do, when the path shows why (missing, not
    a dir, unreadable), else the error's (`failure_text`)."""
    for i, configured in enumerate(cfg.log_dirs):
        if Path(configured) == path:
            user = current_user()
            why = log_dir_problem(
                f"log.dirs[{i}]", path, probe_path(path), observe=cfg.observe, user=user
            )
            if why is not None:
                return why
    return failure_text(exc)


def state_dir_problem(
    path: Path,
    state: PathState,
    ancestor: tuple[Path, PathState] | None,
    *,
    observe: bool,
    user: str,
    key: str = "state_dir",
) -> str | None:
    """Why `state_dir` cannot be used (None: it can), named as `key`. `ancestor` is its
    nearest existing ancestor, where a missing state dir would be created (needed only
    then). Observe mode writes nothing there, so only something other than a dir in its
    place is a problem."""
    shown = repr(str(path))
    if state.kind != "missing":
        wrong = _not_a_dir(path, state)
        if wrong is not None:
            return f"{key}: {wrong}"
        if observe or state.writable:
            return None
        return f"{key}: {shown} is not writable by user {user}"
    if observe or ancestor is None:
        return None
    parent, parent_state = ancestor
    cannot = f"{key}: {shown} does not exist and cannot be created"
    wrong = _not_a_dir(parent, parent_state)
    if wrong is not None:
        return f"{cannot}: {wrong}"
    if not parent_state.writable:
        return f"{cannot}: {str(parent)!r} is not writable by user {user}"
    return None


def _nearest_existing(path: Path, probe: Callable[[Path], PathState]) -> tuple[Path, PathState]:
    """The closest ancestor of `path` that exists (the root, at worst), and its state."""
    for parent in path.absolute().parents:
        state = probe(parent)
        if state.kind != "missing":
            return parent, state
    root = Path(path.absolute().anchor)
    return root, probe(root)


def config_warnings(cfg: Config) -> list[str]:
    """What a valid config does that its author may not expect, by key: a compacted
    topic's `header` strategy with no header name compacts by offset (KIP-280's fallback,
    as Kafka's cleaner does; the daemon warns at its cycles, `check-config` before); TLS
    files named while `mqtt.tls.enabled` is false are not used."""
    settings = [("log.cleaner.compaction.strategy", cfg.topic_defaults())]
    settings += [(f"topics.{key}.compaction.strategy", cfg.entry_config(key)) for key in cfg.topics]
    warnings = [
        f"{key}: header, but no compaction.strategy.header names the header: "
        "compacted by offset (Kafka's fallback)"
        for key, topic in settings
        if topic.compact
        and topic.compaction_strategy == "header"
        and not topic.compaction_strategy_header.strip()
    ]
    tls = cfg.mqtt.tls
    named = [f for f in ("ca_file", "cert_file", "key_file") if getattr(tls, f) is not None]
    if cfg.mqtt.enabled and named and not tls.enabled:
        files = ", ".join(f"mqtt.tls.{f}" for f in named)
        warnings.append(f"{files} set, but mqtt.tls.enabled is false: the connection is plain")
    return warnings


_LOG_DIRS_KEY: Final = "log.dirs"


def path_problems(
    cfg: Config,
    *,
    probe: Callable[[Path], PathState] = probe_path,
    user: str | None = None,
) -> list[str]:
    """One line per `log.dirs` entry, and for `state_dir` (the default `./state` too,
    relative to this process's working directory, where `run` would make it), that
    cannot be used as `cfg.mode` needs (see the module docstring), each naming the key."""
    user = current_user() if user is None else user
    observe = cfg.observe
    problems = [
        log_dir_problem(f"{_LOG_DIRS_KEY}[{i}]", path, probe(path), observe=observe, user=user)
        for i, path in enumerate(cfg.log_dirs)
    ]
    state = probe(cfg.state_dir)
    ancestor = _nearest_existing(cfg.state_dir, probe) if state.kind == "missing" else None
    # Not in the file: say where the default landed, which depends on the directory the
    # command runs in.
    key = "state_dir"
    if key not in cfg.model_fields_set:
        key += f" (not set: the default {str(cfg.state_dir)!r} in {Path.cwd()})"
    problems.append(
        state_dir_problem(cfg.state_dir, state, ancestor, observe=observe, user=user, key=key)
    )
    return [p for p in problems if p is not None]


def check_paths(cfg: Config, *, path: Path | None = None) -> list[str]:
    """The check a daemon makes at its start: raise ConfigError listing
    `path_problems(cfg)` (`path` names the file) when they leave nothing to start on, the
    state dir unusable or no log dir usable; else return the problems of the log dirs
    that cannot be used, which go offline while the others are maintained (as a broker
    starts with the log dirs it can use: a disk that failed at boot or was not mounted
    yet must not keep the daemon from protecting the others)."""
    problems = path_problems(cfg)
    unusable = [p for p in problems if p.startswith(_LOG_DIRS_KEY)]
    if len(unusable) < len(problems) or len(unusable) == len(cfg.log_dirs):
        raise ConfigError(problems, path=path)
    return unusable


_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing duplicate keys (plain PyYAML keeps the last silently)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node)
        try:
            seen = first_line.get(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            continue
        if seen is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen})", key_node.start_mark
            )
        first_line[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _key_lines(node: yaml.Node, at: Loc = ()) -> Iterator[tuple[Loc, int]]:
    """The line of every key (and list item) in the document under `node`, by its
    location, as a validation error names it (a merged key has none)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                loc = (*at, key_node.value)
                yield loc, key_node.start_mark.line + 1
                yield from _key_lines(value_node, loc)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield (*at, i), item.start_mark.line + 1
            yield from _key_lines(item, (*at, i))


def _read_yaml(path: Path) -> tuple[object, dict[Loc, int]]:
    """The document in the file at `path`, and the line of each of its keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"cannot read the file: {e.strerror or e}"], path=path) from e
    except UnicodeDecodeError as e:
        raise ConfigError([f"not UTF-8 text: byte {e.start} ({e.reason})"], path=path) from e
    try:
        loader = _Loader(text)  # its reader refuses control characters here
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        column = e.position - text.rfind("\n", 0, e.position)
        where = f"line {line}, column {column}: "
        raise ConfigError(
            [f"{where}character U+{e.character:04X} is not allowed in YAML"], path=path
        ) from e
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        return loader.construct_document(node), dict(_key_lines(node))
    except yaml.MarkedYAMLError as e:
        raise ConfigError([_yaml_error(e)], path=path) from e
    except yaml.YAMLError as e:
        raise ConfigError([f"YAML error: {e}"], path=path) from e
    except RecursionError as e:  # PyYAML's parser recurses once per nesting level
        raise ConfigError(["YAML nested too deeply"], path=path) from e
    finally:
        loader.dispose()


def _yaml_error(e: yaml.MarkedYAMLError) -> str:
    mark = e.problem_mark or e.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    context = f" ({e.context})" if e.context else ""
    return f"{where}YAML syntax error: {e.problem}{context}"


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


# ---------------------------------------------------------------------------
# Validation: field errors first, then cross-field checks on what validated


def _validate_fields(data: dict[Any, Any]) -> tuple[list[str], list[Loc], Config | None]:
    """(error lines, error locations, a Config to run cross-field checks on).

    With field errors, the Config is built from the document minus the bad keys (which
    fall back to their defaults), so the cross-field checks still run; `_touches` then
    skips the checks that involve a bad key. None only if even that fails.
    """
    try:
        return [], [], Config.model_validate(data)
    except ValidationError as e:
        details = e.errors()
    broken = [tuple(d["loc"]) for d in details]
    salvaged = copy.deepcopy(data)
    for loc in broken:
        _drop(salvaged, loc)
    try:
        cfg: Config | None = Config.model_validate(salvaged)
    except ValidationError:
        cfg = None
    return [_field_error(d) for d in details], broken, cfg


def _drop(data: dict[Any, Any], loc: Loc) -> None:
    """Remove the mapping entry that holds the bad value at `loc` (a whole list, if the
    bad value is one of its items)."""
    holder: tuple[dict[Any, Any], Any] | None = None
    node: Any = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            holder = (node, part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
    if holder is not None:
        holder[0].pop(holder[1], None)


def _touches(keys: list[Loc], broken: list[Loc]) -> bool:
    return any(b[: len(k)] == k or k[: len(b)] == b for k in keys for b in broken)


_BOUNDS: Final = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}
_TYPE_RULES: Final = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "path_type": "must be a path",
}


def _field_error(d: ErrorDetails) -> str:
    where = _key_path(d["loc"])
    kind = d["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key (value {_show(d['input'])}){_suggestion(d['loc'])}"
    if kind == "missing":
        return f"{where}: required key is missing"
    if kind == "invalid_key" or d["loc"][-1:] == ("[key]",):  # a key that is not a string
        parent = d["loc"][:-1] if kind == "invalid_key" else d["loc"][:-2]
        rule = "must be a string"
        if isinstance(d["input"], bool):  # a topic named `off` or `no`, say
            rule += " (YAML reads yes/no/on/off as booleans: quote the key)"
        return f"{_key_path(parent) or 'top level'}: key {_show(d['input'])} {rule}"
    ctx = d.get("ctx", {})
    if kind in _BOUNDS:
        op, name = _BOUNDS[kind]
        rule = f"must be {op} {_show(ctx[name])}"
    elif kind == "literal_error":
        rule = f"must be {ctx['expected']}"
    elif kind == "too_short":
        rule = f"must have at least {count(ctx['min_length'], 'item')}"
    elif kind in _TYPE_RULES:
        rule = _TYPE_RULES[kind]
    elif kind == "is_instance_of" and ctx.get("class") == "Path":  # strict: not from a number
        rule = "must be a path (a string)"
    else:  # our own PydanticCustomErrors and anything unforeseen: pydantic's text
        rule = d["msg"][:1].lower() + d["msg"][1:]
    if isinstance(d["input"], bool) and kind != "bool_type":
        rule += " (YAML reads yes/no/on/off as booleans: quote the value)"
    return f"{where}: {_show(d['input'])} {rule}"


def _suggestion(loc: Loc) -> str:
    """` (did you mean X?)` for an unknown key at `loc` that is a near miss of a key its
    mapping takes: a typo, or a broker-level name in a topic entry (`log.retention.ms`
    for `retention.ms`) and the other way round; empty when nothing is close."""
    key = str(loc[-1])
    known = _keys_at(loc[:-1])
    near = [k for k in (f"log.{key}", key.removeprefix("log.")) if k != key and k in known]
    near += [k for k in known if len(key) >= 3 and "." not in k and k.startswith(key) and k != key]
    near += difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return f" (did you mean {near[0]}?)" if near else ""


def _keys_at(loc: Loc) -> list[str]:
    """The keys the mapping at `loc` in the config file takes (empty where its keys are
    free, as under `topics:`)."""
    model: type[BaseModel] = Config
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return []
        annotation = field.annotation
        if get_origin(annotation) is dict:
            if not parts:
                return []
            parts.pop(0)  # a `topics:` entry's name
            annotation = get_args(annotation)[1]
        inner = _model_in(annotation)
        if inner is None:
            return []
        model = inner
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model `annotation` names, itself or as `X | None`."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _key_path(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        # YAML keys need not be strings (`yes:` is True, `1.5:` a float): show them all.
        text += f"[{part}]" if isinstance(part, int) else ("." if text else "") + str(part)
    return text


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return f"{value:g}" if value.is_integer() else repr(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _cross_field_problems(cfg: Config) -> Iterator[tuple[list[Loc], str]]:
    """(the keys a problem involves, its error line) for every failed cross-field check."""
    yield from _log_dir_problems(cfg)
    min_lag = cfg.log_cleaner_min_compaction_lag_ms
    max_lag = cfg.log_cleaner_max_compaction_lag_ms
    if max_lag < min_lag:
        yield (
            list(_BROKER_LAG_KEYS),
            (
                f"log.cleaner.max.compaction.lag.ms: {max_lag} must be >= "
                f"log.cleaner.min.compaction.lag.ms ({min_lag})"
            ),
        )
    yield from _offset_map_problems(cfg)
    for key, override in cfg.topics.items():
        if not is_glob(key) and not _TOPIC_NAME.fullmatch(key):
            yield (
                [("topics", key)],
                (
                    f"topics.{key}: {key!r} is neither a Kafka topic name (at most 249 of "
                    "a-z A-Z 0-9 . _ -) nor a glob (with * ? or [)"
                ),
            )
        problem = _topic_lag_problem(key, override, cfg.entry_config(key))
        if problem:
            lag_keys = [("topics", key, name) for name in _LAG_NAMES]
            yield [*lag_keys, *_BROKER_LAG_KEYS], problem
    yield from _mqtt_problems(cfg.mqtt)


def _offset_map_problems(cfg: Config) -> Iterator[tuple[list[Loc], str]]:
    """A cleaner thread's offset map that cannot hold one key (its slots the larger
    where a compacted topic's strategy adds versions): every pass would fail, and Kafka
    would not start its cleaner. Not asked where no map is ever built: the cleaner off,
    or `mode: observe`."""
    if cfg.observe or not cfg.log_cleaner_enable:
        return
    settings = [cfg.entry_config(key) for key in cfg.topics] + [cfg.topic_defaults()]
    strategies = {t.compaction_strategy for t in settings if t.compact}
    entry = OFFSET_ENTRY_BYTES if strategies <= {"offset"} else VERSIONED_ENTRY_BYTES
    memory = memory_per_thread(cfg.log_cleaner_dedupe_buffer_size, cfg.log_cleaner_threads)
    why = too_small(memory, entry, cfg.log_cleaner_io_buffer_load_factor)
    if why is not None:
        keys: list[Loc] = [("log.cleaner.dedupe.buffer.size",), ("log.cleaner.threads",)]
        yield keys, f"log.cleaner.dedupe.buffer.size: {why}"


_LAG_NAMES: Final = ("min.compaction.lag.ms", "max.compaction.lag.ms")
_BROKER_LAG_KEYS: Final[tuple[Loc, ...]] = tuple((f"log.cleaner.{name}",) for name in _LAG_NAMES)


def _topic_lag_problem(key: str, override: TopicOverride, resolved: TopicConfig) -> str | None:
    """Kafka's LogConfig check min.compaction.lag.ms <= max.compaction.lag.ms, blamed on
    the key the entry sets (a conflict between two broker defaults is reported once, at
    the broker keys)."""
    min_lag, max_lag = resolved.min_compaction_lag_ms, resolved.max_compaction_lag_ms
    if max_lag >= min_lag:
        return None
    if override.max_compaction_lag_ms is not None:
        source = "" if override.min_compaction_lag_ms is not None else _FROM_BROKER_MIN
        return (
            f"topics.{key}.max.compaction.lag.ms: {max_lag} must be >= "
            f"min.compaction.lag.ms ({min_lag}{source})"
        )
    if override.min_compaction_lag_ms is not None:
        return (
            f"topics.{key}.min.compaction.lag.ms: {min_lag} must be <= "
            f"max.compaction.lag.ms ({max_lag}{_FROM_BROKER_MAX})"
        )
    return None


_FROM_BROKER_MIN: Final = ", from log.cleaner.min.compaction.lag.ms"
_FROM_BROKER_MAX: Final = ", from log.cleaner.max.compaction.lag.ms"


def _log_dir_problems(cfg: Config) -> Iterator[tuple[list[Loc], str]]:
    if not cfg.log_dirs:
        yield [("log.dirs",)], "log.dirs: required: list at least one log directory"
    state = cfg.state_dir.resolve()
    seen: dict[Path, Path] = {}
    for log_dir in cfg.log_dirs:
        absolute = log_dir.resolve()
        if absolute in seen:
            yield [("log.dirs",)], f"log.dirs: {str(log_dir)!r} is listed twice"
            continue
        for other_absolute, other in seen.items():
            if absolute.is_relative_to(other_absolute):
                inner, outer = log_dir, other
            elif other_absolute.is_relative_to(absolute):
                inner, outer = other, log_dir
            else:
                continue
            # The outer one would hold a dir that is no partition of it, or that is one
            # (`<topic>-<n>`) and a log dir with its own `.lock` too.
            yield (
                [("log.dirs",)],
                (
                    f"log.dirs: {str(inner)!r} is inside log dir {str(outer)!r}: "
                    "a Kafka broker would refuse to load that log dir"
                ),
            )
        seen[absolute] = log_dir
        if state.is_relative_to(absolute):
            # A broker refuses a log dir holding a dir that is not <topic>-<partition>.
            yield (
                [("log.dirs",), ("state_dir",)],
                (
                    f"state_dir: {str(cfg.state_dir)!r} must not be inside log dir "
                    f"{str(log_dir)!r}: a Kafka broker would refuse to load that log dir"
                ),
            )


def _mqtt_problems(mqtt: MqttConfig) -> Iterator[tuple[list[Loc], str]]:
    tls = mqtt.tls
    if (tls.cert_file is None) != (tls.key_file is None):
        given, missing = (
            ("cert_file", "key_file") if tls.key_file is None else ("key_file", "cert_file")
        )
        value = tls.cert_file if tls.key_file is None else tls.key_file
        yield (
            [("mqtt", "tls")],
            (
                f"mqtt.tls.{given}: {str(value)!r} needs mqtt.tls.{missing}: a client "
                "certificate and its key go together"
            ),
        )
    if mqtt.password_file is not None and mqtt.username is None:
        yield (
            [("mqtt", "password_file"), ("mqtt", "username")],
            (f"mqtt.password_file: {str(mqtt.password_file)!r} needs mqtt.username"),
        )


def ambiguous_on_disk(cfg: Config) -> list[str]:
    """One line for each topic in the log dirs today that two globs match (its
    partitions are left alone until the config says which entry applies)."""
    on_disk = topics_on_disk(cfg.log_dirs)
    return [
        f"{error} (found in {partition_dir})"
        for topic, partition_dir in on_disk.items()
        for error in cfg.ambiguous_topics([topic])
    ]
