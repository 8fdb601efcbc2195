"""A log dir's `meta.properties` and a partition dir's `partition.metadata`.

`meta.properties` is a Java properties file (comments `#`/`!`, `key=value`, `key: value`
or `key value`, backslash escapes and line continuations) written by the broker. Two
versions exist::

    version=0            ZooKeeper era: broker.id, cluster.id
    version=1            KRaft: node.id, cluster.id, directory.id (base64 UUID)

`partition.metadata` is Kafka's own two-line text file::

    version: 0
    topic_id: <base64url UUID>

Both are only read: they identify the dir and the topic; cleanerd never rewrites them.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cleanerd.errors import CleanerdError

META_PROPERTIES: Final = "meta.properties"
PARTITION_METADATA: Final = "partition.metadata"

_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_KEY_END = re.compile(r"(?<!\\)(?:\\\\)*[=: \t\f]")


class PropertiesError(CleanerdError):
    """A `meta.properties` or `partition.metadata` file that Kafka would refuse."""

    def __init__(self, reason: str, *, path: Path | str) -> None:
        self.reason = reason
        self.path = str(path)
        super().__init__(f"invalid {self.path}: {reason}")


@dataclass(frozen=True, slots=True)
class MetaProperties:
    """The identity of a log dir."""

    version: int
    node_id: int | None
    """`node.id` (version 1) or `broker.id` (version 0)."""
    cluster_id: str | None
    directory_id: str | None
    properties: dict[str, str]
    """Every key as read, including ones cleanerd does not interpret."""


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """The topic id a partition dir belongs to."""

    version: int
    topic_id: str


def _unescape(text: str) -> str:
    out = []
    chars = iter(text)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, "")
        if nxt == "u":
            code = "".join(next(chars, "") for _ in range(4))
            if not re.fullmatch(r"[0-9a-fA-F]{4}", code):
                raise ValueError(f"malformed \\u escape '\\u{code}'")
            out.append(chr(int(code, 16)))
        else:
            out.append(_ESCAPES.get(nxt, nxt))
    return "".join(out)


def _logical_lines(text: str) -> list[str]:
    """Join continuation lines (odd trailing backslashes) and drop comments and blanks."""
    lines: list[str] = []
    pending: str | None = None
    for raw in re.split(r"\r\n|\r|\n", text):
        line = raw.lstrip(" \t\f")
        if pending is None and (not line or line[0] in "#!"):
            continue
        current = line if pending is None else pending + line
        if (len(current) - len(current.rstrip("\\"))) % 2:
            pending = current[:-1]
            continue
        lines.append(current)
        pending = None
    if pending is not None:
        lines.append(pending)
    return lines


def parse_java_properties(text: str) -> dict[str, str]:
    """Parse Java properties text into a dict (later keys win, as in Java)."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        match = _KEY_END.search(line)
        if match is None:
            key, rest = line, ""
        else:
            key, rest = line[: match.end() - 1], line[match.end() - 1 :]
        rest = rest.lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        props[_unescape(key)] = _unescape(rest)
    return props


def _optional_int(props: dict[str, str], key: str, path: Path) -> int | None:
    if key not in props:
        return None
    try:
        return int(props[key])
    except ValueError:
        raise PropertiesError(f"{key}={props[key]!r} is not an integer", path=path) from None


def read_meta_properties(path: Path) -> MetaProperties:
    """Read and validate `meta.properties`."""
    try:
        props = parse_java_properties(path.read_text(encoding="latin-1"))
    except ValueError as exc:
        raise PropertiesError(str(exc), path=path) from exc
    version = _optional_int(props, "version", path)
    if version not in (0, 1):
        raise PropertiesError(f"unsupported version {props.get('version')!r}", path=path)
    node_key = "node.id" if version == 1 else "broker.id"
    node_id = _optional_int(props, node_key, path)
    if version == 1 and node_id is None:
        raise PropertiesError("version 1 requires node.id", path=path)
    return MetaProperties(
        version=version,
        node_id=node_id,
        cluster_id=props.get("cluster.id"),
        directory_id=props.get("directory.id"),
        properties=props,
    )


def _is_uuid(text: str) -> bool:
    if len(text) > 24:
        return False
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return False
    return len(raw) == 16 and any(raw)


def read_partition_metadata(path: Path) -> PartitionMetadata:
    """Read and validate `partition.metadata`."""
    fields: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        key, sep, value = line.partition(":")
        if not sep:
            raise PropertiesError(f"malformed line {number}: {line!r}", path=path)
        fields[key.strip()] = value.strip()
    if fields.get("version") != "0":
        raise PropertiesError(f"unsupported version {fields.get('version')!r}", path=path)
    topic_id = fields.get("topic_id", "")
    if not _is_uuid(topic_id):
        raise PropertiesError(f"topic_id {topic_id!r} is not a non-zero base64 UUID", path=path)
    return PartitionMetadata(version=0, topic_id=topic_id)
