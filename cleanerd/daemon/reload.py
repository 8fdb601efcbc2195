"""SIGHUP reload: what a new config file changes, and which of the changes apply live.

The shape is Kafka's BrokerReconfigurable: the whole new file is parsed and validated
first (`load_config`; an invalid file raises one ConfigError listing every problem and
nothing changes); then `plan_reload` diffs it against the running config key by key and
splits the changes into those the running daemon applies and those it refuses with
"restart required", keeping the old value. The result is one frozen `Config` to swap in
atomically, so every reader sees either the old settings or the new ones.

What applies live, and how (the daemon does the applying):

- every topic policy and broker default of one (`topics`, `log.cleanup.policy`,
  `log.segment.bytes`, `log.roll.*`, `log.retention.*`, `log.cleaner.*.lag.ms`, ...),
  the intervals and thresholds (`log.retention.check.interval.ms`,
  `log.cleaner.backoff.ms`, `log.retention.disk.usage.percent`, `disk_usage`): the next
  cycle reads the new snapshot;
- `log.cleaner.threads` and the other settings a worker pool is built with: a new pool
  takes the next passes, the old one finishes the passes it runs;
- `metrics`: the opt-ins at the next scrape; a new `listen` address is bound before the
  old one is released (if it cannot be bound, the old endpoint and value stay, and
  the opt-ins beside it apply);
- `mqtt`: a new connection with the new settings; `logging`: the new format and level.

What needs a restart, and why: `log.dirs`, `state_dir` and `mode` decide which `.lock`
files this process holds and where its partition locks live, and changing them under
running passes would break the ownership rules (DESIGN section 2); `engine` picks the
engine implementation and its cluster, which passes in flight belong to.

Keys are paths of YAML keys, as the file spells them: `("log.dirs",)`,
`("metrics", "listen")`, `("topics", "orders", "retention.ms")`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from cleanerd.config import Config

KeyPath = tuple[str, ...]

RESTART_REQUIRED: Final[tuple[KeyPath, ...]] = (
    ("log.dirs",),
    ("state_dir",),
    ("mode",),
    ("engine",),
)


class _Absent:
    """The value of a key that one of the two files does not have (a `topics:` entry)."""

    def __repr__(self) -> str:
        return "<unset>"


ABSENT: Final = _Absent()


def key_name(key: KeyPath) -> str:
    """The dotted name an operator reads: `metrics.listen`, `topics.orders.retention.ms`."""
    return ".".join(key)


def is_under(key: KeyPath, prefix: KeyPath) -> bool:
    """Whether `key` is `prefix` or a key inside it."""
    return key[: len(prefix)] == prefix


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One key whose value differs between the running config and the new file."""

    key: KeyPath
    old: object
    new: object

    @property
    def name(self) -> str:
        return key_name(self.key)

    def describe(self) -> dict[str, object]:
        """The change as plain values for a log line or an event."""
        return {"key": self.name, "old": plain(self.old), "new": plain(self.new)}


def plain(value: object) -> object:
    """`value` as JSON-ready data (paths as strings, tuples as lists)."""
    if isinstance(value, Path | _Absent):
        return str(value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def _leaves(data: Mapping[str, Any], prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, object]]:
    for key, value in data.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


def _settings(cfg: Config) -> dict[str, Any]:
    """Every setting under its YAML key; a `topics:` entry holds only the keys it sets (an
    unset key there inherits the broker default, which is diffed on its own)."""
    data = cfg.model_dump(by_alias=True, exclude={"topics"})
    data["topics"] = {
        key: entry.model_dump(by_alias=True, exclude_none=True) for key, entry in cfg.topics.items()
    }
    return data


def diff_configs(old: Config, new: Config) -> tuple[ConfigChange, ...]:
    """Every key whose effective value differs, in key order (defaults included, so a key
    removed from the file that changes its value back to the default is a change)."""
    before = dict(_leaves(_settings(old)))
    after = dict(_leaves(_settings(new)))
    changes = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key, ABSENT), after.get(key, ABSENT)
        if was != now:
            changes.append(ConfigChange(key, was, now))
    return tuple(changes)


def restart_required(key: KeyPath) -> bool:
    """Whether a change of `key` needs a restart (see the module docstring)."""
    return any(is_under(key, prefix) for prefix in RESTART_REQUIRED)


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """The outcome of comparing the running config with a valid new one."""

    config: Config
    """The config to run from now on: the new one, with refused keys at their old values."""
    applied: tuple[ConfigChange, ...]
    refused: tuple[ConfigChange, ...]
    """Changes that need a restart; their old values stay in `config`."""

    @property
    def changed(self) -> bool:
        """Whether anything applies (refused changes alone leave the config as it was)."""
        return bool(self.applied)

    def touches(self, prefix: KeyPath) -> bool:
        """Whether an applied change is `prefix` or inside it."""
        return any(is_under(c.key, prefix) for c in self.applied)


def plan_reload(old: Config, new: Config) -> ReloadPlan:
    """Split the changes from `old` to `new` into applied and refused, and build the config
    to run. Pure: both configs are already validated."""
    changes = diff_configs(old, new)
    refused = tuple(c for c in changes if restart_required(c.key))
    applied = tuple(c for c in changes if not restart_required(c.key))
    # The refused keys are whole top-level fields that the per-topic resolution cached in
    # Config never reads, so a copy without re-validation keeps that cache right; both
    # values were validated in their own files.
    names = _field_names(new)
    keep = {names[c.key[0]] for c in refused}
    effective = new.model_copy(update={name: getattr(old, name) for name in keep})
    return ReloadPlan(effective, applied, refused)


def _field_names(model: BaseModel) -> dict[str, str]:
    """YAML key (alias) -> attribute name."""
    return {(f.alias or name): name for name, f in type(model).model_fields.items()}
