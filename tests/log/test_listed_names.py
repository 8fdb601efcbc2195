"""`recovery.sort_names` (and `snapshot_offsets_in`): a partition dir's listing read in one
pass gives what the per-name tests give (the well-formed `.log` offsets, the malformed
names and why, whether leftover recovery has anything to do, the segments with a
`.txnindex`), on listings of every shape."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cleanerd.log.files import (
    INDEX_SUFFIXES,
    LOG_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    SEGMENT_FILE_KINDS,
    STATE_SUFFIXES,
    TXN_INDEX_FILE_SUFFIX,
    is_log_file,
    is_segment_file_name,
    malformed_segment_file_name,
    offset_from_filename,
)
from cleanerd.log.producer_state import snapshot_offsets_in
from cleanerd.log.recovery import ListedNames, Listing, list_partition_dir, sort_names

STEMS = st.sampled_from(
    ["00000000000000000000", "00000000000000000015", "00000000000000000030", "15", "abc", "x"]
)
NAMES = st.one_of(
    st.builds(
        lambda stem, kind, state: stem + kind + state,
        STEMS,
        st.sampled_from([*SEGMENT_FILE_KINDS, ".json"]),
        st.sampled_from(["", *STATE_SUFFIXES]),
    ),
    st.sampled_from(["leader-epoch-checkpoint", "partition.metadata", ".log", "a.b.log"]),
)


def reference(
    listing: Listing,
) -> tuple[list[int], list[tuple[str, str]], bool, frozenset[int]]:
    """The same four answers, one question and one test per name at a time."""
    offsets = sorted(offset_from_filename(e.name) for e in listing if is_log_file(e.name))
    malformed = [
        (e.path, reason)
        for e in listing
        if (reason := malformed_segment_file_name(e.name)) is not None
    ]
    files = {e.name for e in listing if e.is_file()}
    leftovers = any(
        is_segment_file_name(name)
        and (
            name.endswith(STATE_SUFFIXES)
            or (name.endswith(INDEX_SUFFIXES) and name.split(".")[0] + LOG_FILE_SUFFIX not in files)
        )
        for name in files
    )
    txn_indexed = frozenset(
        offset_from_filename(name)
        for name in files
        if is_segment_file_name(name) and name.endswith(TXN_INDEX_FILE_SUFFIX)
    )
    return offsets, malformed, leftovers, txn_indexed


def answers(names: ListedNames) -> tuple[list[int], list[tuple[str, str]], bool, frozenset[int]]:
    """What `sort_names` answered, as `reference` answers."""
    return names.log_offsets, names.malformed, names.leftovers, names.txn_indexed


@contextlib.contextmanager
def listed(files: set[str], dirs: set[str]) -> Iterator[Listing]:
    """The listing of a fresh dir holding `files` (empty) and `dirs` (not also files)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name in files:
            (d / name).write_bytes(b"")
        for name in dirs - files:
            (d / name).mkdir()
        yield list_partition_dir(d)


@settings(max_examples=150, deadline=None)
@given(st.sets(NAMES, max_size=14), st.sets(NAMES, max_size=3))
def test_one_pass_answers_as_the_per_name_tests(files: set[str], dirs: set[str]) -> None:
    with listed(files, dirs) as listing:
        assert answers(sort_names(listing)) == reference(listing)


WELL_FORMED = st.one_of(
    st.builds(
        lambda stem, kind, state: stem + kind + state,
        st.sampled_from(["00000000000000000000", "00000000000000000015", "00000000000000000030"]),
        st.sampled_from(SEGMENT_FILE_KINDS),
        st.sampled_from(["", "", "", *STATE_SUFFIXES]),
    ),
    st.sampled_from(["leader-epoch-checkpoint", "partition.metadata", "a.b.log", "x\n"]),
)


@settings(max_examples=150, deadline=None)
@given(st.sets(WELL_FORMED, max_size=14), st.sets(WELL_FORMED, max_size=2))
def test_a_dir_of_well_formed_files_answers_as_the_per_name_tests(
    files: set[str], dirs: set[str]
) -> None:
    """Dirs without a malformed name (what Kafka and cleanerd leave), where the names are
    read as one text; a subdir named like a segment file is answered entry by entry."""
    with listed(files, dirs) as listing:
        assert answers(sort_names(listing)) == reference(listing)
        expected = sorted(
            offset_from_filename(e.name)
            for e in listing
            if e.name.endswith(PRODUCER_SNAPSHOT_FILE_SUFFIX) and is_segment_file_name(e.name)
        )
        assert snapshot_offsets_in(e.name for e in listing) == expected


def test_a_quiet_partition_needs_nothing_and_lists_its_segments(tmp_path: Path) -> None:
    for base in (0, 15, 30):
        for kind in (".log", ".index", ".timeindex"):
            (tmp_path / f"{base:020d}{kind}").write_bytes(b"")
    (tmp_path / "00000000000000000030.snapshot").write_bytes(b"")
    (tmp_path / "leader-epoch-checkpoint").write_bytes(b"")
    names = sort_names(list_partition_dir(tmp_path))
    assert (names.log_offsets, names.malformed, names.leftovers) == ([0, 15, 30], [], False)


def test_an_orphan_index_or_a_state_suffix_needs_leftover_recovery(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "00000000000000000015.timeindex").write_bytes(b"")
    assert sort_names(list_partition_dir(tmp_path)).leftovers
    (tmp_path / "00000000000000000015.timeindex").unlink()
    (tmp_path / "00000000000000000000.log.deleted").write_bytes(b"")
    assert sort_names(list_partition_dir(tmp_path)).leftovers
