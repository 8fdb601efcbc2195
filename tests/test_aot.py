"""Tests of the kernels compiled ahead of time (`cleanerd._aot`, `cleanerd build-kernels`).

The end-to-end tests build into a cache dir of their own (`NUMBA_CACHE_DIR`) in
processes of their own, as a new host does: `build-kernels` on an empty cache runs its
warm-up workload through numba, compiles what that cached, and later processes run on
the module."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from cleanerd import _aot, _jit
from cleanerd.commands import build_kernels as build_kernels_command
from cleanerd.engine.lifeline import OWNER_ENV
from cleanerd.log.ownership import start_ticks
from cleanerd.records.columns import SEGMENT_ROW
from cleanerd.records.header import Compression
from tests.compaction.conftest import LogBuilder, k
from tests.paths import REPO
from tests.tools import session_processes, wait_for_session_end

pytestmark = pytest.mark.slow


def sample_values() -> list[Any]:
    """Arguments of every kind a kernel takes, and some it never does."""
    readonly = np.zeros(8, np.uint8)
    readonly.flags.writeable = False
    records = np.zeros(3, SEGMENT_ROW)
    return [
        np.zeros(8, np.uint8),
        readonly,
        np.zeros(8, np.int64)[::2],
        np.zeros(1, np.int64)[::2],
        np.zeros((4, 2), np.uint64),
        np.zeros((4, 2), np.int32)[:, 0],
        np.asfortranarray(np.zeros((3, 2))),
        records,
        records["key_pos"],
        np.zeros(0, np.bool_),
        True,
        np.True_,
        7,
        -(2**63),
        2**63,
        1.5,
        np.int64(3),
        np.int32(3),
        np.uint64(3),
        np.float32(1.0),
        (1, 2),
        (1, np.zeros(3, np.int16), True),
    ]


def test_a_calls_key_is_the_key_of_the_type_numba_gives_it() -> None:
    """`value_key` of an argument equals `numba_key` of the type cleanerd's typing (numba's,
    with `_jit`'s array typing) gives it, for arrays of every layout, dtype and
    writability, structured record tables, scalars of Python and numpy, and tuples."""
    _jit.load_numba()
    import numba

    typeof: Any = numba.typeof
    for value in sample_values():
        assert _aot.value_key(value) == _aot.numba_key(typeof(value)), repr(value)
    values = sample_values()
    writable, readonly, strided = (_aot.value_key(v) for v in values[:3])
    assert len({writable, readonly, strided}) == 3  # dtype alike, types apart
    assert _aot.value_key(7) != _aot.value_key(np.int32(7))
    assert _aot.value_key(2**63) != _aot.value_key(2**63 - 1)


def test_what_has_no_key_goes_to_numba() -> None:
    """Arguments the keys do not cover (None, bytes, a list, an int past uint64, a tuple
    holding one) have no key, so no compiled function is ever called with them."""
    for value in (None, b"x", [1], 2**64, (1, None), "s"):
        assert _aot.value_key(value) is None


def test_the_module_list_names_every_module_with_kernels() -> None:
    """KERNEL_MODULES, whose stamps make a built module stale, names every module of the
    package that defines a kernel."""
    found = set()
    for path in (REPO / "cleanerd").rglob("*.py"):
        if re.search(r"^@jit(_inline)?\b", path.read_text(), re.MULTILINE):
            found.add(".".join(path.relative_to(REPO / "cleanerd").with_suffix("").parts))
    assert found == set(_aot.KERNEL_MODULES)


def small_log(root: Path) -> Path:
    """A compacted topic's partition of several shapes: 1-record batches, lz4 and zstd
    batches, an idempotent producer, tombstones; returns its log dir."""
    log = LogBuilder(root)
    log.records([(k(i % 7), b"v%d" % i) for i in range(40)])
    log.append([(k(i % 5), b"w%d" % i) for i in range(30)], codec=Compression.LZ4, pid=7)
    log.append([(k(i % 3), b"z%d" % i) for i in range(20)], codec=Compression.ZSTD, pid=7)
    log.roll()
    log.records([(k(1), None), (k(2), b"last")])
    log.roll()
    log.append([(k("active"), b"x")])
    log.write()
    return root


def clean(logs: Path, work: Path, env: dict[str, str], *, probe: bool = False) -> dict[str, Any]:
    """`cleanerd clean` of `logs` in its own process; with `probe`, through a wrapper that
    prints whether numba was imported (its last line of stderr)."""
    config = work / "c.yaml"
    config.write_text(
        f"log.dirs: [{logs}]\nstate_dir: {work / 'state'}\ntopics:\n"
        "  t: {cleanup.policy: compact, min.cleanable.dirty.ratio: 0.0}\n"
    )
    args = ["clean", "-c", str(config), "--json", "--now-ms", "1800000000000"]
    if probe:
        wrapper = (
            "import atexit, sys\n"
            "atexit.register(lambda: print('numba', 'numba' in sys.modules, file=sys.stderr))\n"
            "from cleanerd.cli import main\n"
            f"sys.exit(main({args!r}))\n"
        )
        command = [sys.executable, "-c", wrapper]
    else:
        command = [sys.executable, "-m", "cleanerd", *args]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout)
    report["stderr"] = proc.stderr
    return report


def log_bytes(logs: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((logs / "t-0").glob("*.log"))}


def run_python(script: str, env: dict[str, str]) -> str:
    """`script` in a Python process of its own; its stdout (it must exit 0)."""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def build_kernels(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cleanerd", "build-kernels", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


@pytest.fixture(name="built", scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """An empty cache dir compiled by `build-kernels` (its warm-up fills it; once for the
    module: the build takes tens of seconds); the environment that uses it. Tests that
    change its files put them back."""
    tmp_path = tmp_path_factory.mktemp("built")
    cache = tmp_path / "cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "CLEANERD_AOT": "1"}
    proc = build_kernels(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("warm-up: every command on every log shape")
    assert re.search(r"cleanerd_kernels_\w+\.\S+: \d+ kernels, \d+ signatures", proc.stdout)
    assert [p.name for p in cache.iterdir() if p.name.startswith("warm-up-")] == []
    return small_log(tmp_path / "template"), env


def test_a_clean_on_compiled_kernels_imports_no_numba_and_writes_the_same_bytes(
    built: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """After `build-kernels` on a new host (only its warm-up ran), a `clean` of a log
    it never saw, as a crash leaves it and then as that clean's stop left it, runs every
    kernel from the compiled module, never imports numba, and leaves byte for byte the
    segments a `clean` through numba (`CLEANERD_AOT=0`) leaves."""
    template, env = built
    runs = {}
    for name, aot in (("compiled", "1"), ("numba", "0")):
        work = tmp_path / name
        shutil.copytree(template, work / "logs")
        report = clean(work / "logs", work, {**env, "CLEANERD_AOT": aot}, probe=True)
        assert report["stderr"].rstrip().endswith(f"numba {aot == '0'}")
        assert report["cleaned"]
        assert (work / "logs" / ".kafka_cleanshutdown").exists()
        again = clean(work / "logs", work, {**env, "CLEANERD_AOT": aot}, probe=True)
        assert "log_dir.clean_shutdown_found" in again["stderr"]
        if aot == "1":
            assert again["stderr"].rstrip().endswith("numba False")
        runs[name] = log_bytes(work / "logs")
    assert runs["compiled"] == runs["numba"]
    assert len(runs["compiled"]) >= 2


def test_a_call_the_module_has_no_function_for_goes_to_numba(
    built: tuple[Path, dict[str, str]],
) -> None:
    """A call whose argument types the build did not see (a strided view where the
    cleaner passes a contiguous array) is not forced into a compiled function: it loads
    numba and is compiled there, with the same answer."""
    _, env = built
    script = (
        "import sys, numpy as np\n"
        "from cleanerd.compaction import offset_map\n"
        "whole = np.array([3, 1, -2, 5], np.int64)\n"
        "print(offset_map._first_negative(whole), 'numba' in sys.modules)\n"
        "strided = np.array([3, 0, 1, 0, -2, 0, 5, 0], np.int64)[::2]\n"
        "print(offset_map._first_negative(strided), 'numba' in sys.modules)\n"
    )
    assert run_python(script, env).split() == ["2", "False", "2", "True"]


def test_a_process_that_calls_kernels_without_end_loads_numba_after_all(
    built: tuple[Path, dict[str, str]],
) -> None:
    """After COMPILED_CALLS calls through the compiled module (whose type keys cost more
    per call than numba's dispatch), the next call loads numba, and every call after it
    goes there, with the same answers."""
    _, env = built
    script = (
        "import sys, numpy as np\n"
        "from cleanerd import _jit\n"
        "from cleanerd.compaction import offset_map\n"
        "_jit.COMPILED_CALLS = 3\n"
        "whole = np.array([3, 1, -2, 5], np.int64)\n"
        "for _ in range(5):\n"
        "    print(offset_map._first_negative(whole), 'numba' in sys.modules)\n"
    )
    assert run_python(script, env).splitlines() == ["2 False"] * 3 + ["2 True"] * 2


def test_a_stale_or_foreign_module_is_not_loaded(built: tuple[Path, dict[str, str]]) -> None:
    """A manifest built for other sources, another numpy or another CPU is ignored
    (`load` gives None: every kernel goes to numba); the one built here loads."""
    _, env = built
    root = Path(env["NUMBA_CACHE_DIR"])
    loaded = _aot.load(root)
    assert loaded is not None
    assert loaded.functions
    manifest_path = root / _aot.DIR_NAME / _aot.MANIFEST
    good = json.loads(manifest_path.read_text())
    for field, value in (("numpy", "0.0"), ("cpu", "x86_64 0"), ("suffix", ".so")):
        manifest = json.loads(json.dumps(good))
        manifest["built_for"][field] = value
        manifest_path.write_text(json.dumps(manifest))
        assert _aot.load(root) is None, field
    manifest = json.loads(json.dumps(good))
    manifest["built_for"]["sources"]["records.walker"][0] -= 1
    manifest_path.write_text(json.dumps(manifest))
    assert _aot.load(root) is None
    manifest_path.write_text("{")
    assert _aot.load(root) is None
    for broken in ({"built_for": good["built_for"]}, {**good, "kernels": {"k:f": [["x", 1]]}}):
        manifest_path.write_text(json.dumps(broken))
        assert _aot.load(root) is None
    manifest_path.write_text(json.dumps(good))
    assert _aot.load(root) is not None


def test_a_build_for_the_same_sources_runs_no_warm_up_again(
    built: tuple[Path, dict[str, str]],
) -> None:
    """The manifest says the module was built after a warm-up; a build for the same
    sources (each daemon start runs one) runs no warm-up again, and still adds what this
    host's runs cached since (here, the tests above that ran through numba). Any other
    sources, numpy or CPU warm up again."""
    _, env = built
    root = Path(env["NUMBA_CACHE_DIR"])
    manifest_path = root / _aot.DIR_NAME / _aot.MANIFEST
    assert json.loads(manifest_path.read_text())["warmed_up"] is True
    assert _aot.warmed_up(root)
    for _ in range(2):
        proc = build_kernels(env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("warm-up: already run for these sources")
    assert proc.stdout.rstrip().endswith("up to date")  # the second: nothing new
    good = json.loads(manifest_path.read_text())
    assert good["warmed_up"] is True
    try:
        stale = json.loads(json.dumps(good))
        stale["built_for"]["sources"]["records.walker"][0] -= 1
        manifest_path.write_text(json.dumps(stale))
        assert not _aot.warmed_up(root)
        # A module built without a warm-up (`--no-warm-up`): the next build runs one,
        # keeps the module, and its manifest then says so.
        manifest_path.write_text(json.dumps({**good, "warmed_up": False}))
        assert not _aot.warmed_up(root)
        proc = build_kernels(env)
        assert proc.stdout.startswith("warm-up: every command on every log shape")
        assert proc.stdout.rstrip().endswith("up to date")
        assert json.loads(manifest_path.read_text()) == good
    finally:
        manifest_path.write_text(json.dumps(good))
    assert not _aot.warmed_up(root / "elsewhere")


def test_build_kernels_says_what_stops_it(tmp_path: Path) -> None:
    """Without the warm-up, an empty kernel cache has nothing to build: exit 1 and say
    so; `--remove` removes a module."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "empty")}
    proc = build_kernels(env, "--no-warm-up")
    assert proc.returncode == 1
    assert "numba's cache holds no kernel signature yet" in proc.stdout
    (tmp_path / "empty" / _aot.DIR_NAME).mkdir(parents=True)
    proc = build_kernels(env, "--remove")
    assert proc.returncode == 0
    assert not (tmp_path / "empty" / _aot.DIR_NAME).exists()


def test_a_build_removes_the_scratch_of_builds_that_were_killed(tmp_path: Path) -> None:
    """Scratch named after a process that is gone or a zombie (a warm-up dir, a build
    dir, a staged manifest: a build killed mid-way) is removed by the next build, and
    said; that of a running process (a build beside it) stays, as does anything else in
    the cache (a link named like scratch too), and the scratch of an older build (no pid
    in its name) goes once an hour old."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not reaped yet
    while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    root = tmp_path / "cache"
    kernels = root / _aot.DIR_NAME
    kernels.mkdir(parents=True)
    gone = [
        root / f"warm-up-{dead.pid}-abc",
        kernels / f"build-{dead.pid}-def",
        kernels / f"manifest-{dead.pid}-ghi.tmp",
        root / f"warm-up-{zombie.pid}-jkl",
        root / "warm-up-old",
        kernels / "tmpold",
        kernels / f"{_aot.MANIFEST}.old.tmp",
    ]
    kept = [
        root / f"warm-up-{os.getpid()}-abc",
        kernels / f"build-{os.getpid()}-def",
        kernels / "tmpnew",
        root / "warm-up-new",
        root / "records_0123",
        kernels / _aot.MANIFEST,
    ]
    for path in gone + kept:
        if path.suffix in (".tmp", ".json"):
            path.write_text("{}")
        else:
            path.mkdir()
            (path / "trampolines.c").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("")
    link = kernels / f"build-{dead.pid}-lnk"  # named like scratch, but a link: not ours
    link.symlink_to(outside)
    hour_ago = time.time() - _aot.LEGACY_SCRATCH_AGE_S - 60
    for old in (root / "warm-up-old", kernels / "tmpold", kernels / f"{_aot.MANIFEST}.old.tmp"):
        os.utime(old, (hour_ago, hour_ago))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(root)}
    proc = build_kernels(env, "--no-warm-up")
    zombie.wait()
    for path in gone:
        assert not path.exists()
        assert f"removed {path}, left by a build that was killed" in proc.stdout
    assert all(path.exists() for path in kept)
    assert link.is_symlink()
    assert (outside / "kept").exists()
    assert str(link) not in proc.stdout
    assert _aot.remove_leftovers(root) == []


def test_another_users_build_hidden_from_proc_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the unit's `ProtectProc=invisible` another user's process is missing from
    /proc (psutil: no such process) while a signal to it is refused: it runs, and its
    scratch stays."""

    def refused(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    def hidden(pid: int) -> psutil.Process:
        raise psutil.NoSuchProcess(pid)

    monkeypatch.setattr(os, "kill", refused)
    monkeypatch.setattr(psutil, "Process", hidden)
    assert _aot._running(4242)
    monkeypatch.undo()
    assert not _aot._running(2**32)  # a name no pid of this system has: not running


def test_a_failed_warm_up_is_said_and_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A warm-up that fails is reported with what it printed, the module is built from
    the cache as it is, and the command exits 1."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build_kernels_command, "WARM_UP_MODULE", "cleanerd.no_such_module")
    built: list[Path] = []

    def build(root: Path, *, warmed_up: bool) -> _aot.Built:
        assert not warmed_up
        built.append(root)
        return _aot.Built(path=Path("m.so"), kernels=3, signatures=4, skipped=0, seconds=1.0)

    monkeypatch.setattr(_aot, "build", build)
    args = argparse.Namespace(remove=False, background=False, no_warm_up=False)
    assert build_kernels_command.run(args) == 1
    said = capsys.readouterr().out
    assert "the warm-up failed (exit status 1: " in said
    assert "No module named cleanerd.no_such_module" in said
    assert built == [tmp_path / "cache"]
    assert "m.so: 3 kernels, 4 signatures" in said


def test_no_c_compiler_fails_the_build_before_its_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host without the C compiler pycc links with (a slim container image) is told so
    at once: no warm-up runs (it costs seconds of CPU at each daemon start) and nothing
    is built."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "cleanerd-no-such-cc -pthread")
    ran: list[str] = []
    monkeypatch.setattr(build_kernels_command, "warm_up", lambda root: ran.append("warm-up"))
    args = argparse.Namespace(remove=False, background=False, no_warm_up=False)
    assert build_kernels_command.run(args) == 1
    said = capsys.readouterr().out
    assert "no C compiler: 'cleanerd-no-such-cc' is not on PATH" in said
    assert ran == []
    assert not (tmp_path / "cache" / _aot.DIR_NAME).exists()
    with pytest.raises(RuntimeError, match="no C compiler"):
        _aot.build(tmp_path / "cache")


def test_a_signature_accepts_the_arrays_its_code_reads_correctly() -> None:
    """A call whose argument keys no signature has goes to one that accepts them: an `A`
    (any strides) array takes any layout, a read-only one a writable array; dtypes,
    dimensions and scalars must be equal."""
    c = ("a", "<i8", 1, "C", False)
    a = ("a", "<i8", 1, "A", False)
    c_readonly = ("a", "<i8", 1, "C", True)
    i64 = ("s", "<i8")
    assert _aot.accepts((a, i64), (c, i64))
    assert _aot.accepts((c_readonly,), (c,))
    assert _aot.accepts((("t", a, c_readonly),), (("t", c, c),))
    assert not _aot.accepts((c,), (a,))
    assert not _aot.accepts((c,), (c_readonly,))
    assert not _aot.accepts((a,), (("a", "<i4", 1, "C", False),))
    assert not _aot.accepts((a,), (("a", "<i8", 2, "C", False),))
    assert not _aot.accepts((a, i64), (c, ("s", "<i4")))
    assert not _aot.accepts((a,), (c, i64))
    assert not _aot.accepts((a,), (None,))
    assert not _aot.accepts((("t", a),), (("t", a, a),))


def test_a_call_typed_as_no_signature_goes_to_one_that_accepts_it() -> None:
    """`_jit._accepting` picks the function whose signature accepts the call (and none
    where none does: numba then serves it)."""
    strided, contiguous = ("a", "<i8", 1, "A", False), ("a", "<i8", 1, "C", False)

    def for_any(*args: object) -> str:
        return "any"

    def for_contiguous(*args: object) -> str:
        return "contiguous"

    compiled: dict[object, Callable[..., Any] | None] = {
        (contiguous, ("s", "|b1")): for_contiguous,
        (strided,): for_any,
    }
    assert _jit._accepting(compiled, (contiguous,)) is for_any
    assert _jit._accepting(compiled, (strided, ("s", "|b1"))) is None


def test_a_background_build_refused_a_lower_priority_runs_at_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--background` lowers the build's priority; where a filter refuses that (the
    unit's SystemCallFilter, with SystemCallErrorNumber=EPERM) the build goes on as it
    is: an uncaught error killed it at every daemon start."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))

    def refused(increment: int) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "nice", refused)
    args = argparse.Namespace(remove=True, background=True, no_warm_up=True)
    assert build_kernels_command.run(args) == 0
    assert "removed the compiled kernels" in capsys.readouterr().out


def test_a_daemons_build_dies_with_the_daemon(tmp_path: Path) -> None:
    """A build the daemon started (its owner named in the environment, as the daemon
    does) ends, with its warm-up, when the daemon is killed: a SIGKILLed daemon's build
    ran on for a minute."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    build: subprocess.Popen[bytes] | None = None
    try:
        env = {
            **os.environ,
            "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
            OWNER_ENV: f"{owner.pid}:{start_ticks(owner.pid)}",
        }
        build = subprocess.Popen(
            [sys.executable, "-m", "cleanerd", "build-kernels", "--background"],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while len(session_processes(build.pid)) < 2:  # the build and its warm-up
            assert build.poll() is None, "the build ended before its warm-up started"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        owner.kill()
        owner.wait()
        wait_for_session_end(build.pid, 10)
        assert build.wait(10) == -9
    finally:
        owner.kill()
        for pid in session_processes(build.pid) if build is not None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
