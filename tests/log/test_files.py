"""Tests of cleanerd.log.files: Kafka's file and directory names."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from cleanerd.log.files import (
    MisnamedPartitionDir,
    TopicPartition,
    filename_prefix_from_offset,
    is_index_file,
    is_log_file,
    is_segment_file_name,
    list_partitions,
    log_file,
    log_file_offsets,
    looks_like_segment_file,
    malformed_segment_file_name,
    offset_from_filename,
    offset_index_file,
    parse_topic_partition,
    special_dir_suffix,
    time_index_file,
    txn_index_file,
)


def test_prefix_is_twenty_digits_zero_padded() -> None:
    """Segment names are the base offset padded to 20 digits, no grouping."""
    assert filename_prefix_from_offset(0) == "00000000000000000000"
    assert filename_prefix_from_offset(1234) == "00000000000000001234"
    assert filename_prefix_from_offset(2**63 - 1) == "09223372036854775807"


def test_negative_offset_cannot_name_a_segment() -> None:
    """A negative base offset is rejected."""
    with pytest.raises(ValueError, match="negative"):
        filename_prefix_from_offset(-1)


@pytest.mark.parametrize(
    ("name", "offset"),
    [
        ("00000000000000000042.log", 42),
        ("00000000000000000042.index.swap", 42),
        ("00000000000000000042.timeindex.deleted", 42),
        ("00000000000000000007.snapshot", 7),
        ("00000000000000000042.log.cleaned", 42),
    ],
)
def test_offset_is_text_before_first_dot(name: str, offset: int) -> None:
    """The offset of any segment file is the text before its first dot."""
    assert offset_from_filename(name) == offset


@pytest.mark.parametrize("name", ["leader-epoch-checkpoint", "partition.metadata", ".lock", ""])
def test_names_without_an_offset_are_rejected(name: str) -> None:
    """Files whose name does not start with an offset raise ValueError."""
    with pytest.raises(ValueError, match="does not start with an offset"):
        offset_from_filename(name)


@pytest.mark.parametrize(
    ("dirname", "topic", "partition"),
    [
        ("my-topic-with-dashes-12", "my-topic-with-dashes", 12),
        ("orders-0", "orders", 0),
        ("a.b_c-3", "a.b_c", 3),
        ("__cluster_metadata-0", "__cluster_metadata", 0),
        ("topic--1", "topic-", 1),
    ],
)
def test_partition_dir_splits_at_last_dash(dirname: str, topic: str, partition: int) -> None:
    """`<topic>-<partition>` is split at the last dash; topics keep their dashes and dots."""
    assert parse_topic_partition(dirname) == TopicPartition(topic, partition)


@pytest.mark.parametrize(
    "dirname",
    [
        "orders-0.0123456789abcdef0123456789abcdef-delete",
        "orders-0.0123456789abcdef0123456789abcdef-future",
        "orders-0.0123456789abcdef0123456789abcdef-stray",
        "orders-delete",
    ],
)
def test_special_dirs_are_not_partitions(dirname: str) -> None:
    """`-delete`, `-future` and `-stray` dirs (well-formed or not) are rejected."""
    with pytest.raises(ValueError, match=r"dir, not a live partition dir"):
        parse_topic_partition(dirname)
    assert special_dir_suffix(dirname) is not None


@pytest.mark.parametrize("dirname", ["orders", "-3", "orders-", "orders-x", "orders-1a", "o-٣"])
def test_malformed_partition_dirs_are_rejected(dirname: str) -> None:
    """No dash, an empty topic or a non-decimal partition is not a partition dir."""
    with pytest.raises(ValueError, match="is not a <topic>-<partition> dir name"):
        parse_topic_partition(dirname)


def test_a_partition_above_kafkas_int_range_is_no_partition_dir() -> None:
    """Kafka's partition ids are Java ints: `orders-2147483647` is the last partition dir,
    one above it is no partition (cleanerd neither opens it nor writes it into a root
    checkpoint, where Kafka could not parse the line)."""
    assert parse_topic_partition("orders-2147483647") == TopicPartition("orders", 2**31 - 1)
    for dirname in ("orders-2147483648", "orders-99999999999"):
        with pytest.raises(ValueError, match="is above Kafka's 2147483647"):
            parse_topic_partition(dirname)


@pytest.mark.parametrize(("dirname", "canonical"), [("orders-07", "orders-7"), ("a-00", "a-0")])
def test_a_partition_number_with_a_leading_zero_is_a_misnamed_dir(
    dirname: str, canonical: str
) -> None:
    """Kafka never writes `orders-07`: it is refused (its partition's dir is
    `orders-7`, and a path built from the partition would name that one)."""
    with pytest.raises(
        MisnamedPartitionDir, match=f"Kafka names this partition's dir {canonical}$"
    ):
        parse_topic_partition(dirname)


@pytest.mark.parametrize(
    "dirname",
    ["bad topic-0", "x:y-0", "\u00fc-0", "a/b-0", "new\nline-0", ".-0", "..-0", "a" * 250 + "-0"],
)
def test_a_topic_name_kafka_does_not_allow_is_a_misnamed_dir(dirname: str) -> None:
    """Kafka's topic names: at most 249 ASCII letters, digits, '.', '_' and '-', not '.'
    nor '..'. Another one was listed as a partition, and its checkpoint line ('bad topic 0
    1') then failed every later open of the log dir."""
    with pytest.raises(MisnamedPartitionDir, match="is no legal Kafka topic name"):
        parse_topic_partition(dirname)
    long = "a" * 249
    assert parse_topic_partition(f"{long}-0") == TopicPartition(long, 0)
    assert parse_topic_partition("A.b_c-d-0") == TopicPartition("A.b_c-d", 0)


def test_a_listing_warns_once_of_a_misnamed_partition_dir(tmp_path: Path) -> None:
    """A misnamed partition dir is not listed, and is named in a warning, once per
    process (the daemon lists its dirs every cycle); the partition's own dir is listed."""
    for name in ("orders-7", "orders-07", "orders-x", "bad topic-0"):
        (tmp_path / name).mkdir()
    with capture_logs() as logs:
        first = list_partitions(tmp_path)
        again = list_partitions(tmp_path)
    assert first == again == {TopicPartition("orders", 7): tmp_path / "orders-7"}
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert {e["event"] for e in warned} == {"log_dir.partition_dir_misnamed"}
    assert [e["path"] for e in warned] == [str(tmp_path / n) for n in ("bad topic-0", "orders-07")]


def test_topic_partition_str_is_the_dir_name() -> None:
    """str(TopicPartition) is Kafka's dir name and parses back to itself."""
    tp = TopicPartition("a-b.c", 7)
    assert str(tp) == "a-b.c-7"
    assert parse_topic_partition(str(tp)) == tp


def test_segment_paths() -> None:
    """The four files of a segment share the 20-digit stem; suffixes go after the kind."""
    d = Path("/data/t-0")
    assert log_file(d, 5).name == "00000000000000000005.log"
    assert offset_index_file(d, 5, ".swap").name == "00000000000000000005.index.swap"
    assert time_index_file(d, 5).name == "00000000000000000005.timeindex"
    assert txn_index_file(d, 5, ".cleaned").name == "00000000000000000005.txnindex.cleaned"


def test_kinds_and_state_suffixes() -> None:
    """Log and index files are recognised only without a state suffix."""
    assert is_log_file("00000000000000000005.log")
    assert not is_log_file("00000000000000000005.log.swap")
    assert not is_log_file("leader-epoch.log")
    assert is_index_file("00000000000000000005.timeindex")
    assert is_index_file("00000000000000000005.txnindex")
    assert not is_index_file("00000000000000000005.index.deleted")


@pytest.mark.parametrize(
    "name",
    [
        "00000000000000000005.log",
        "00000000000000000005.index.swap",
        "00000000000000000005.timeindex.cleaned",
        "00000000000000000005.txnindex.deleted",
        "00000000000000000005.snapshot",
        "09223372036854775807.log",
    ],
)
def test_well_formed_segment_file_names(name: str) -> None:
    """Twenty ASCII digits, a kind and at most one state suffix: a segment file name."""
    assert is_segment_file_name(name)
    assert looks_like_segment_file(name)
    assert malformed_segment_file_name(name) is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("00000000000000000abc.log", "'00000000000000000abc' before the first '.' is not"),
        ("123.log", "'123' has 3 digits, not 20"),
        ("000000000000000000005.index", "has 21 digits, not 20"),
        ("0000000000000000005.log.deleted", "has 19 digits, not 20"),
        ("orders.index.swap", "'orders' before the first '.' is not a 20-digit offset"),
        ("\u0661\u0662.log", "is not a 20-digit offset"),  # Arabic-Indic digits
        (".log", "'' before the first '.' is not"),
    ],
)
def test_malformed_segment_file_names_say_why(name: str, reason: str) -> None:
    """A name that ends like a segment file but lacks the 20-digit stem is malformed,
    and is neither a log nor an index file (nothing will rename or delete it)."""
    assert looks_like_segment_file(name)
    assert not is_segment_file_name(name)
    message = malformed_segment_file_name(name)
    assert message is not None
    assert reason in message
    assert not is_log_file(name)
    assert not is_index_file(name)


@pytest.mark.parametrize(
    "name",
    [
        "leader-epoch-checkpoint",
        "partition.metadata",
        ".lock",
        "00000000000000000005.log.swap.deleted",
        "00000000000000000005.log.bak",
        "00000000000000000005",
    ],
)
def test_other_names_are_not_segment_like(name: str) -> None:
    """Kafka's other files, and names not ending in a kind and one state, are neither
    segment files nor malformed ones."""
    assert not is_segment_file_name(name)
    assert malformed_segment_file_name(name) is None


_NAME_PARTS = st.sampled_from(
    [
        "00000000000000000042",
        "0000000000000000004",
        "000000000000000000042",
        "12",
        "x",
        ".log",
        ".index",
        ".log.swap",
        ".deleted",
        "\n",
        "-",
        "\u0663" * 20,
    ]
)


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.lists(_NAME_PARTS, min_size=1, max_size=4).map("".join), max_size=12))
def test_log_file_offsets_are_those_of_the_well_formed_log_names(names: list[str]) -> None:
    """The one-pass listing reader agrees with the per-name predicate, whatever the
    other names in the dir hold (newlines, non-ASCII digits, near-miss stems)."""
    expected = sorted(offset_from_filename(n) for n in names if is_log_file(n))
    assert log_file_offsets(names) == expected
