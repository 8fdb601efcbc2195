from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from cleanerd import __version__
from cleanerd.cli import main
from cleanerd.commands import COMMANDS
from tests.paths import REPO
from tests.tools import run_python

SAMPLE = REPO / "config" / "cleanerd.yaml"
FOO_LOG = Path("kraft-combined-logs") / "foo-0" / "00000000000000000000.log"


def run(
    capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None
) -> tuple[int, str, str]:
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        status = main(list(argv))
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return status, out, err


def usage_exit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int | str | None, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return info.value.code, out + err


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "cleanerd.yaml"
    path.write_text(f"log.dirs: [{tmp_path / 'data'}]\nstate_dir: {tmp_path / 'state'}\n{extra}")
    return path


def _passes_check(capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: str = "") -> str:
    """`check-config` of `write_config(tmp_path, extra)` with its log dir made: asserts
    it exits 0 saying OK; returns what it wrote on stderr (its warnings)."""
    path = write_config(tmp_path, extra)
    (tmp_path / "data").mkdir()
    status, out, err = run(capsys, "check-config", str(path))
    assert (status, out) == (0, f"{path}: OK\n")
    return err


class TestHelp:
    def test_help_lists_every_command(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`cleanerd --help` names each registered command."""
        code, text = usage_exit(capsys, "--help")
        assert code == 0
        assert {"check-config", "produce", "dump"} <= {c.name for c in COMMANDS}
        for command in COMMANDS:
            assert re.search(rf"^ +{command.name}\b", text, re.MULTILINE)
            assert command.help.split(";")[0] in " ".join(text.split())

    @pytest.mark.parametrize("name", [c.name for c in COMMANDS])
    def test_each_command_has_help(self, capsys: pytest.CaptureFixture[str], name: str) -> None:
        """`cleanerd COMMAND --help` prints that command's usage."""
        code, text = usage_exit(capsys, name, "--help")
        assert code == 0
        assert text.startswith(f"usage: cleanerd {name}")

    @pytest.mark.parametrize(
        "argv",
        [
            ("plan", "--now-ms", "-5"),
            ("clean", "--now-ms", "-5"),
            ("audit", "--now-ms", "-5"),
            ("audit", "--slack-ms", "-1"),
            ("audit", "--max-listed", "-1"),
        ],
    )
    def test_a_negative_instant_or_duration_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
    ) -> None:
        """An instant before the epoch or a negative duration or count is refused,
        naming the option (they were taken, and every age measured from them)."""
        code, text = usage_exit(capsys, *argv)
        assert code == 2
        assert f"argument {argv[1]}: {argv[2]} is negative" in text

    @pytest.mark.parametrize("command", ["plan", "clean", "audit"])
    @pytest.mark.parametrize(
        ("given", "said"),
        [
            ("1800000000", "seconds? In milliseconds that is 1800000000000"),
            ("1800000000000000", "microseconds? In milliseconds that is 1800000000000"),
        ],
    )
    def test_an_instant_in_seconds_or_microseconds_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str], command: str, given: str, said: str
    ) -> None:
        """Taken as milliseconds, seconds put every rule in 1970 (nothing is due) and
        microseconds far in the future (every segment past its retention, deleted)."""
        code, text = usage_exit(capsys, command, "--now-ms", given)
        assert code == 2
        assert f"argument --now-ms: {given} is" in text
        assert said in " ".join(text.split())

    def test_version(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--version prints the package version."""
        assert usage_exit(capsys, "--version") == (0, f"cleanerd {__version__}\n")

    def test_a_command_is_required(self, capsys: pytest.CaptureFixture[str]) -> None:
        """No command is a usage error (exit 2)."""
        code, text = usage_exit(capsys)
        assert code == 2
        assert "required: COMMAND" in text


class TestCheckConfig:
    def test_valid_file(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """A valid file whose log dir exists exits 0 and says so. (The sample's own
        /var/lib/kafka/data need not exist here: test_config loads the sample.)"""
        assert _passes_check(capsys, tmp_path) == ""

    def test_a_header_strategy_without_a_header_name_is_warned_about(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A compacted topic with `compaction.strategy: header` and no header name is
        valid (Kafka compacts it by offset) but said, by key, on stderr; one that names
        its header, or a delete topic, is not (it passed in silence)."""
        err = _passes_check(
            capsys,
            tmp_path,
            "topics:\n"
            "  a: {cleanup.policy: compact, compaction.strategy: header}\n"
            "  b: {cleanup.policy: compact, compaction.strategy: header,"
            " compaction.strategy.header: v}\n"
            "  c: {cleanup.policy: delete, compaction.strategy: header}\n",
        )
        assert err == (
            "cleanerd check-config: warning: topics.a.compaction.strategy: header, but no "
            "compaction.strategy.header names the header: compacted by offset (Kafka's "
            "fallback)\n"
        )

    def test_tls_files_without_tls_enabled_are_warned_about(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A CA file named with `mqtt.tls.enabled: false` would be silently unused: the
        connection would go out in plain text."""
        err = _passes_check(
            capsys, tmp_path, f"mqtt: {{enabled: true, tls: {{ca_file: {tmp_path / 'ca.pem'}}}}}\n"
        )
        assert err == (
            "cleanerd check-config: warning: mqtt.tls.ca_file set, but mqtt.tls.enabled is "
            "false: the connection is plain\n"
        )

    def test_a_brokers_leftover_dirs_print_no_debug_lines(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """The dirs a broker leaves beside its partitions (`-delete`, `-future`, not
        partitions) are skipped at debug level; check-config logs at the config's level
        (info) to stderr, as the other commands do, so none of those lines comes out.
        (Before, it printed one `[debug] log_dir.entry_skipped` line per dir.)"""
        structlog.reset_defaults()  # a process's start: no logging configured yet
        path = write_config(tmp_path)
        (tmp_path / "data" / "t-0").mkdir(parents=True)
        (tmp_path / "data" / "t-1.0123456789abcdef0123456789abcdef-delete").mkdir()
        (tmp_path / "data" / "t-2.0123456789abcdef0123456789abcdef-future").mkdir()
        assert run(capsys, "check-config", str(path)) == (0, f"{path}: OK\n", "")

    def test_the_file_as_c_too(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """`-c FILE`, as every other command takes its config, works too; none, or two
        different files, is a usage error that says how to give it."""
        path = write_config(tmp_path)
        (tmp_path / "data").mkdir()
        assert run(capsys, "check-config", "-c", str(path)) == (0, f"{path}: OK\n", "")
        assert run(capsys, "check-config", str(path), "-c", str(path))[0] == 0
        usage = "cleanerd check-config: give the config file once: FILE or -c FILE\n"
        assert run(capsys, "check-config") == (2, "", usage)
        assert run(capsys, "check-config", str(path), "-c", str(tmp_path / "x.yaml")) == (
            2,
            "",
            usage,
        )

    def test_unusable_dirs_are_reported_by_key(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A valid file naming a log dir that is a file, one that is missing and a state
        dir that cannot be created exits 1 listing each, by key and path."""
        (tmp_path / "a-file").write_text("x")
        (tmp_path / "b-file").write_text("x")
        path = tmp_path / "cleanerd.yaml"
        path.write_text(
            f"log.dirs: [{tmp_path / 'a-file'}, {tmp_path / 'gone'}]\n"
            f"state_dir: {tmp_path / 'b-file' / 'state'}\n"
        )
        status, out, err = run(capsys, "check-config", str(path))
        assert (status, out) == (1, "")
        assert err.splitlines() == [
            f"cleanerd check-config: invalid configuration {path}:",
            f"  log.dirs[0]: {str(tmp_path / 'a-file')!r} is a file, not a directory",
            f"  log.dirs[1]: {str(tmp_path / 'gone')!r} does not exist (cleanerd does not "
            "create log dirs: a missing one is usually an unmounted disk or a typo)",
            f"  state_dir: {str(tmp_path / 'b-file' / 'state')!r} does not exist and cannot "
            f"be created: {str(tmp_path / 'b-file')!r} is a file, not a directory",
        ]

    def test_invalid_file_lists_every_error(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """An invalid file exits 1 with every problem on stderr, each on its own line
        and with the line of the key it names in the file."""
        path = write_config(
            tmp_path, "mode: off\ntopics:\n  orders: {max.compaction.lag.ms: 0, retention.msx: 1}\n"
        )
        status, out, err = run(capsys, "check-config", str(path))
        assert (status, out) == (1, "")
        assert err.splitlines() == [
            f"cleanerd check-config: invalid configuration {path}:",
            "  line 3: mode: false must be 'owner' or 'observe' "
            "(YAML reads yes/no/on/off as booleans: quote the value)",
            "  line 5: topics.orders.max.compaction.lag.ms: 0 must be >= 1",
            "  line 5: topics.orders.retention.msx: unknown key (value 1) "
            "(did you mean retention.ms?)",
        ]

    def test_missing_file(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """A missing file exits 1 naming it."""
        status, _, err = run(capsys, "check-config", str(tmp_path / "nope.yaml"))
        assert status == 1
        assert str(tmp_path / "nope.yaml") in err


class TestDump:
    def test_real_segment(self, capsys: pytest.CaptureFixture[str], kafka_real: Path) -> None:
        """dump prints Kafka's lines for a broker-written segment."""
        path = kafka_real / FOO_LOG
        status, out, err = run(capsys, "dump", str(path), "--print-data-log")
        assert (status, err) == (0, "")
        assert out == (
            f"Dumping {path}\n"
            "Log starting offset: 0\n"
            "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: 0 lastSequence: 0 producerId: 0 "
            "producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
            "deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1726045973899 size: 80 "
            "magic: 2 compresscodec: none crc: 2565609683 isvalid: true\n"
            "| offset: 0 CreateTime: 1726045973899 keySize: -1 valueSize: 12 sequence: 0 "
            "headerKeys: [] payload: Hello World!\n"
        )

    def test_corrupt_copy(self, capsys: pytest.CaptureFixture[str], kafka_real: Path) -> None:
        """A corrupted segment exits 1 and names the file and the batch position."""
        path = kafka_real / "logdir-b" / "__cluster_metadata-0" / "00000000000000000000.log"
        data = bytearray(path.read_bytes())
        data[91 + 100] ^= 0x01
        path.write_bytes(data)
        status, out, err = run(capsys, "dump", str(path))
        assert status == 1
        assert out.splitlines()[-1].endswith("crc: 618336989 isvalid: false")
        assert err.startswith(f"cleanerd dump: corrupt record batch in {path} at position 91:")

    def test_bad_file_does_not_stop_the_others(
        self, capsys: pytest.CaptureFixture[str], kafka_real: Path, tmp_path: Path
    ) -> None:
        """Each file is dumped; an unreadable one is reported and the exit status is 1."""
        missing = tmp_path / "00000000000000000000.log"
        status, out, err = run(capsys, "dump", str(missing), str(kafka_real / FOO_LOG))
        assert status == 1
        assert err == f"cleanerd dump: {missing}: No such file or directory\n"
        assert out.splitlines()[-1].endswith("isvalid: true")


class TestProduce:
    def test_produce_then_dump(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """Records produced from stdin read back with dump, batch by batch."""
        config = write_config(tmp_path)
        (tmp_path / "data").mkdir()
        lines = [
            {"key": "a", "value": "1", "timestamp": 1000},
            {"key": "a", "value": None, "timestamp": 1001, "headers": {"why": "gone"}},
            {"key": "b", "value": "2", "timestamp": 1002},
        ]
        stdin = "".join(json.dumps(line) + "\n" for line in lines)
        argv = ["produce", "-c", str(config), "orders-0", "--batch-size", "2"]
        status, out, err = run(capsys, *argv, "--compression", "zstd", stdin=stdin)
        assert (status, out, err) == (0, "orders-0: offsets 0..1\norders-0: offsets 2..2\n", "")
        segment = tmp_path / "data" / "orders-0" / "00000000000000000000.log"
        status, out, _ = run(capsys, "dump", str(segment), "--print-data-log")
        assert status == 0
        dumped = out.splitlines()
        assert "compresscodec: zstd" in dumped[2]
        assert [line for line in dumped if line.startswith("|")] == [
            "| offset: 0 CreateTime: 1000 keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] "
            "key: a payload: 1",
            "| offset: 1 CreateTime: 1001 keySize: 1 valueSize: -1 sequence: -1 headerKeys: [why] "
            "key: a",
            "| offset: 2 CreateTime: 1002 keySize: 1 valueSize: 1 sequence: -1 headerKeys: [] "
            "key: b payload: 2",
        ]

    def test_bad_line_is_named(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """A bad JSON line exits 1 naming its line number and what was appended."""
        config = write_config(tmp_path)
        (tmp_path / "data").mkdir()
        stdin = '{"value": "a"}\n{"value": "b"}\n{"value": \n{"value": "c"}\n'
        status, out, err = run(capsys, "produce", "-c", str(config), "t-0", stdin=stdin)
        assert status == 1
        assert out == "t-0: offsets 0..1\n"
        assert err == (
            "cleanerd produce: line 3: invalid JSON: Expecting value (column 11); the 2 "
            "records before it were appended (offsets 0..1), nothing from line 3 on\n"
        )

    def test_log_dir_option(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """--log-dir writes to that dir instead of the first of log.dirs, and says when
        the config does not maintain it."""
        config = write_config(tmp_path)
        (tmp_path / "other").mkdir()
        argv = ["produce", "-c", str(config), "--log-dir", str(tmp_path / "other"), "t-3"]
        status, _, err = run(capsys, *argv, stdin='{"value": "x"}\n')
        assert status == 0
        assert err == (
            f"cleanerd produce: --log-dir {tmp_path / 'other'} is not one of log.dirs: "
            "cleanerd does not maintain what is written there under this config\n"
        )
        assert (tmp_path / "other" / "t-3" / "00000000000000000000.log").stat().st_size > 0
        assert not (tmp_path / "data").exists()

    @pytest.mark.parametrize("option", [(), ("--log-dir", "elsewhere")])
    def test_a_missing_log_dir_is_not_created(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, option: tuple[str, ...]
    ) -> None:
        """A missing log dir is refused, in check-config's words, and nothing is written:
        it is usually an unmounted disk or a typo, and the records would land on its
        parent's file system, where the daemon would then take the dir. It was created."""
        config = write_config(tmp_path)
        where = [str(tmp_path / o) if o == "elsewhere" else o for o in option]
        argv = ["produce", "-c", str(config), *where, "t-0"]
        status, out, err = run(capsys, *argv, stdin='{"value": "x"}\n')
        key, missing = ("--log-dir", "elsewhere") if option else ("log.dirs[0]", "data")
        assert (status, out) == (1, "")
        assert err.endswith(
            f"cleanerd produce: {key}: {str(tmp_path / missing)!r} does not exist (cleanerd "
            "does not create log dirs: a missing one is usually an unmounted disk or a typo)\n"
        )
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cleanerd.yaml"]


def test_module_entry_point_runs(kafka_real: Path) -> None:
    """`python -m cleanerd` runs the same command line in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "cleanerd", "dump", str(kafka_real / FOO_LOG)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines()[2].startswith("baseOffset: 0 lastOffset: 0 count: 1")


def test_only_the_process_entry_freezes_the_imports_out_of_the_collector(
    tmp_path: Path,
) -> None:
    """`main()` for the process's own arguments freezes what the command imported; a call
    with an explicit argv (as tests make, many per process) freezes nothing."""
    config = tmp_path / "c.yaml"
    (tmp_path / "data").mkdir()
    config.write_text(f"log.dirs: [{tmp_path / 'data'}]\nstate_dir: {tmp_path / 'state'}\n")
    probe = (
        "import gc, sys\n"
        "from cleanerd.cli import main\n"
        "explicit = sys.argv.pop() == 'explicit'\n"
        "status = main(sys.argv[1:]) if explicit else main()\n"
        "print(status, gc.get_freeze_count(), gc.isenabled())\n"
    )
    counts = {}
    for how in ("explicit", "process"):
        out = run_python(probe, "check-config", str(config), how)
        status, frozen, enabled = out.splitlines()[-1].split()
        assert (status, enabled) == ("0", "True")
        counts[how] = int(frozen)
    assert counts["explicit"] == 0
    assert counts["process"] > 10_000


_NUMPY_PROBE = """
import os, sys
from cleanerd.cli import main
try:
    main()
except SystemExit:
    pass
{report}
"""


def _numpy_probe(report: str, variable: str, value: str | None) -> list[str]:
    """The last two words `report` prints after `cleanerd --version` ran in a fresh
    process whose environment has `variable` set to `value` (unset for None)."""
    env = {k: v for k, v in os.environ.items() if k != variable}
    if value is not None:
        env[variable] = value
    run = [sys.executable, "-c", _NUMPY_PROBE.format(report=report), "--version"]
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
    return out.split()[-2:]


_BLAS_THREADS = """
import numpy
print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def test_a_process_starts_no_blas_threads() -> None:
    """cleanerd calls no BLAS routine: a command line run keeps OpenBLAS from starting
    its thread pool, whose threads spin when started; an operator's setting wins."""
    assert _numpy_probe(_BLAS_THREADS, "OPENBLAS_NUM_THREADS", None) == ["1", "1"]
    assert _numpy_probe(_BLAS_THREADS, "OPENBLAS_NUM_THREADS", "2")[0] == "2"


_ENTRY_PROBE = """
import atexit, sys, threading, time
from pathlib import Path
from cleanerd.cli import entry

marks = Path(sys.argv.pop(1))


def late():
    time.sleep(0.3)
    with marks.open("a") as f:
        f.write("thread done\\n")


atexit.register(lambda: marks.open("a").write("atexit\\n"))
if sys.argv.pop(1) == "thread":
    threading.Thread(target=late).start()
print("x" * 200_000, end="")  # still in stdout's buffer when the command returns
sys.exit(entry())
"""


@pytest.mark.parametrize("thread", ["none", "thread"])
def test_the_process_entry_ends_without_tearing_the_interpreter_down(
    tmp_path: Path, thread: str
) -> None:
    """`cleanerd` and `python -m cleanerd` end the process once the command returns,
    skipping the interpreter's teardown (about 35 ms of a command that ran a kernel):
    with the command's status, after the atexit handlers, stdout flushed whole. A
    non-daemon thread still running is waited for, as the interpreter would."""
    config = write_config(tmp_path)
    (tmp_path / "data").mkdir()
    marks = tmp_path / "marks"
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY_PROBE, str(marks), thread, "check-config", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x" * 200_000 + f"{config}: OK\n"
    expected = ["thread done", "atexit"] if thread == "thread" else ["atexit"]
    assert marks.read_text().splitlines() == expected


def test_the_process_entry_exits_with_the_commands_status(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "cleanerd", "check-config", str(missing)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 1
    assert str(missing) in done.stderr


_HUGE_PAGES = """
from numpy._core.multiarray import _get_madvise_hugepage
print(os.environ.get("NUMPY_MADVISE_HUGEPAGE"), _get_madvise_hugepage())
"""


def test_a_process_asks_for_no_huge_pages_for_numpys_arrays() -> None:
    """A command line run keeps numpy from madvising its large arrays into transparent
    huge pages (zeroed 2 MiB at a time where cleanerd touches only what it fills); an
    operator's setting wins."""
    assert _numpy_probe(_HUGE_PAGES, "NUMPY_MADVISE_HUGEPAGE", None) == ["0", "False"]
    assert _numpy_probe(_HUGE_PAGES, "NUMPY_MADVISE_HUGEPAGE", "1") == ["1", "True"]
