"""Tests of cleanerd.log.properties: meta.properties and partition.metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanerd.log.properties import (
    PropertiesError,
    parse_java_properties,
    read_meta_properties,
    read_partition_metadata,
)


def test_real_kraft_meta_properties(kafka_real: Path) -> None:
    """The broker-written KRaft meta.properties reads as version 1 with its ids."""
    meta = read_meta_properties(kafka_real / "kraft-combined-logs" / "meta.properties")
    assert meta.version == 1
    assert meta.node_id == 1
    assert meta.cluster_id == "rwd2jqiwRaCycLq7mKVHXA"
    assert meta.directory_id == "AiSXPLrdRM-HREWplhnaNA"


def test_real_partition_metadata(kafka_real: Path) -> None:
    """The broker-written partition.metadata gives version 0 and the topic id."""
    meta = read_partition_metadata(
        kafka_real / "kraft-combined-logs" / "foo-0" / "partition.metadata"
    )
    assert meta.version == 0
    assert meta.topic_id == "v9meXjI1RVKB-NSvF0GXDA"


def test_zookeeper_era_meta_properties(tmp_path: Path) -> None:
    """Version 0 uses broker.id."""
    path = tmp_path / "meta.properties"
    path.write_text("#comment\nversion=0\nbroker.id=3\ncluster.id=abc\n")
    meta = read_meta_properties(path)
    assert (meta.version, meta.node_id, meta.cluster_id, meta.directory_id) == (0, 3, "abc", None)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("version=2\nnode.id=1\n", "unsupported version '2'"),
        ("node.id=1\n", "unsupported version None"),
        ("version=1\ncluster.id=x\n", "version 1 requires node.id"),
        ("version=1\nnode.id=one\n", "node.id='one' is not an integer"),
    ],
)
def test_bad_meta_properties(tmp_path: Path, text: str, reason: str) -> None:
    """Invalid meta.properties raise PropertiesError naming the file."""
    path = tmp_path / "meta.properties"
    path.write_text(text)
    with pytest.raises(PropertiesError, match=reason) as info:
        read_meta_properties(path)
    assert str(path) in str(info.value)


def test_java_properties_syntax() -> None:
    """Separators, comments, escapes and continuation lines follow java.util.Properties."""
    text = "! c\n  # c\na=1\nb : 2\nc 3\nd\\=e = 4\nf = multi \\\n    line\ng=\\u0041\\t\nh\n"
    assert parse_java_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d=e": "4",
        "f": "multi line",
        "g": "A\t",
        "h": "",
    }


@pytest.mark.parametrize(
    "text",
    ["version: 1\ntopic_id: v9meXjI1RVKB-NSvF0GXDA\n", "version: 0\ntopic_id: nope\n", "junk\n"],
)
def test_bad_partition_metadata(tmp_path: Path, text: str) -> None:
    """A wrong version, an invalid topic id or a line without a colon is refused."""
    path = tmp_path / "partition.metadata"
    path.write_text(text)
    with pytest.raises(PropertiesError):
        read_partition_metadata(path)
