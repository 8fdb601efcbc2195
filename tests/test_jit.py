"""Tests of `cleanerd._jit`: kernels compiled on first call, from a cache that works."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cleanerd._jit import Kernel, _cache_dir, jit
from tests.tools import run_python


@jit
def _double(x: int) -> int:
    return 2 * x


def _triple(x: int) -> int:
    return 3 * x


@jit
def _sum_doubled(values: npt.NDArray[np.int64]) -> int:
    total = 0
    for v in values:
        total += _double(v)  # a kernel calling a kernel that may not be compiled yet
    return total


_FIRST_CALL = """
import json, sys
import numpy as np
import tests.test_jit as t
from tests.test_jit import _sum_doubled as kept
before = [type(f).__name__ for f in (t._sum_doubled, t._double, kept)]
total = int(t._sum_doubled(np.arange(5, dtype=np.int64)))
after = [type(f).__name__ for f in (t._sum_doubled, t._double, kept)]
later = type(t.jit(t._triple)).__name__
print(json.dumps([before, total, after, int(kept(np.arange(3, dtype=np.int64))), later]))
"""


def test_first_call_compiles_and_rebinds_every_kernel() -> None:
    """Kernels are `Kernel`s until one is called; that call compiles the kernel and the
    kernel it calls (which nothing had called before), and every module-level name bound
    to a kernel then names numba's dispatcher (this module's, and those imported by
    name elsewhere); a kernel made later is a dispatcher at once."""
    # A timeout for compiling every kernel the call reaches, cold.
    before, total, after, kept, later = json.loads(run_python(_FIRST_CALL, timeout_s=300))
    assert before == ["Kernel", "Kernel", "Kernel"]
    assert total == 20
    assert after == ["CPUDispatcher", "CPUDispatcher", "CPUDispatcher"]
    assert kept == 6
    assert later == "CPUDispatcher"


def test_kernel_passes_the_dispatchers_attributes_through() -> None:
    """A `Kernel` still held somewhere answers as its dispatcher does."""
    kernel = Kernel(_triple)
    assert kernel(14) == 42
    assert kernel.signatures


_PROBE = """
import json, sys
import numpy as np
import cleanerd.records.columns as columns
kernels = [v for v in vars(columns).values() if type(v).__name__ == "Kernel"]
imported = "numba" in sys.modules
columns.segment_columns  # noqa: B018 - a plain attribute: still no numba
print(json.dumps({"numba": imported, "kernels": len(kernels)}))
"""


def test_importing_kernels_does_not_import_numba() -> None:
    """A module defining kernels loads without numba; numba comes with the first call."""
    report = json.loads(run_python(_PROBE))
    assert report["kernels"] > 0
    assert report["numba"] is False


def test_the_daemon_and_the_cleaner_import_without_numba() -> None:
    """Every module with kernels (the cleaner's output assembly declares a numba
    intrinsic too) loads without numba: a start whose first cycle runs no kernel (all
    known from a clean stop) never imports it."""
    probe = (
        "import sys\n"
        "import cleanerd.commands.run, cleanerd.compaction.assemble, cleanerd.engine.local\n"
        "print('numba' in sys.modules)\n"
    )
    assert run_python(probe).split() == ["False"]


def test_cache_dir_is_numbas_own_choice_when_that_works(tmp_path: Path) -> None:
    """NUMBA_CACHE_DIR set, or `__pycache__` beside the package writable, or the user's
    cache dir writable: numba's own choice stands."""
    package = tmp_path / "site-packages" / "cleanerd"
    package.mkdir(parents=True)
    env = {"XDG_CACHE_HOME": str(tmp_path / "home-cache")}
    assert _cache_dir({**env, "NUMBA_CACHE_DIR": "/x"}, package, lambda _: False) is None
    assert _cache_dir(env, package, lambda p: p == package / "__pycache__") is None
    assert _cache_dir(env, package, lambda p: p == tmp_path / "home-cache" / "numba") is None


def test_cache_dir_falls_back_when_install_and_home_are_read_only(tmp_path: Path) -> None:
    """A root-owned install run without a writable home: the systemd cache dir, else
    cleanerd's dir under the XDG cache, else the per-user temp folder, else nowhere."""
    package = tmp_path / "cleanerd"
    home = tmp_path / "home-cache"
    env = {"XDG_CACHE_HOME": str(home), "CACHE_DIRECTORY": str(tmp_path / "var-cache")}
    only = {
        tmp_path / "var-cache" / "numba",
        home / "cleanerd" / "numba",
    }
    assert _cache_dir(env, package, only.__contains__) == str(tmp_path / "var-cache" / "numba")
    del env["CACHE_DIRECTORY"]
    assert _cache_dir(env, package, only.__contains__) == str(home / "cleanerd" / "numba")
    temp = _cache_dir(env, package, lambda p: p.name == "numba" and "cleanerd-" in p.parent.name)
    assert temp == str(Path(tempfile.gettempdir()) / f"cleanerd-{os.getuid()}" / "numba")
    assert _cache_dir(env, package, lambda _: False) == ""


def test_second_process_loads_kernels_from_the_cache(tmp_path: Path) -> None:
    """A kernel compiled by one process is loaded from the on-disk cache by the next
    (NUMBA_DEBUG_CACHE reports each load), not compiled again."""
    code = (
        "import numpy as np\n"
        "from tests.test_jit import _sum_doubled\n"
        "print(_sum_doubled(np.arange(3, dtype=np.int64)))\n"
    )
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_DEBUG_CACHE": "1"}
    first, second = (run_python(code, timeout_s=300, env=env) for _ in range(2))
    assert "data saved" in first
    assert "data saved" not in second
    assert "data loaded" in second
    assert second.strip().endswith("6")


_COLLECTIONS = """
import gc, json
import numpy as np
full = []
def count(phase, info):
    if phase == "start" and info["generation"] == 2:
        full.append(1)
gc.callbacks.append(count)
import tests.test_jit as t
t._sum_doubled(np.arange(5, dtype=np.int64))
print(json.dumps({"full": len(full), "frozen": gc.get_freeze_count()}))
"""


def test_loading_numba_runs_no_full_collection() -> None:
    """numba's import makes some 100,000 objects that live as long as the process: it
    runs with the collector paused, and they are frozen, so no full collection walks
    them (one did, some 13 ms, in every process that ran a kernel)."""
    report = json.loads(run_python(_COLLECTIONS, timeout_s=300))
    assert report["full"] == 0
    assert report["frozen"] > 50_000


_REGISTRIES = """
import json, sys
import numpy as np
from tests.test_jit import _sum_doubled
total = int(_sum_doubled(np.arange(3, dtype=np.int64)))
loaded_registries = "numba.np.linalg" in sys.modules
import numba
late = int(numba.njit(lambda x: 4 * x)(5))  # compiled now: numba loads the registries
print(json.dumps([total, loaded_registries, late, "numba.np.linalg" in sys.modules]))
"""


def test_a_kernel_loaded_from_the_cache_loads_no_registry(tmp_path: Path) -> None:
    """A process whose kernels all come from the cache never loads numba's typing and
    lowering registries (about 90 ms of its first kernel call); one that compiles a
    kernel still does, and the kernel works."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> list[object]:
        out = run_python(_REGISTRIES, timeout_s=300, env=env)
        result: list[object] = json.loads(out.splitlines()[-1])
        return result

    first = run()  # compiles `_sum_doubled` (a cache miss): registries loaded
    assert first == [6, True, 20, True]
    assert run() == [6, False, 20, True]


_LOCK_HOOKS = """
import json
import numpy as np
from llvmlite.binding import ffi
from tests.test_jit import _sum_doubled
total = int(_sum_doubled(np.arange(3, dtype=np.int64)))
import numba
late = int(numba.njit(lambda x: 5 * x)(2))  # compiled now, through llvmlite's lock
hooks = [f.__module__ for pair in ffi.lib._lock._cblist for f in pair]
print(json.dumps([total, late, hooks]))
"""


def test_numba_times_no_call_into_llvm(tmp_path: Path) -> None:
    """Once numba is loaded, its callbacks on llvmlite's lock (an event pair on each
    call into LLVM, for statistics cleanerd never reads) are gone, and kernels still
    load and compile."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # compiled, then loaded from the cache
        out = run_python(_LOCK_HOOKS, timeout_s=300, env=env)
        assert json.loads(out.splitlines()[-1]) == [6, 10, []]


_MASKED = """
import json, sys
import numpy as np
from tests.test_jit import _sum_doubled
total = int(_sum_doubled(np.arange(3, dtype=np.int64)))
import numba
readonly = np.arange(4, dtype=np.int64)
readonly.flags.writeable = False
total += int(_sum_doubled(readonly))
types = [str(numba.typeof(a)) for a in (readonly, np.zeros((4, 2), np.int32)[:, 0])]
loaded = "numpy.ma" in sys.modules
import numpy.ma
try:
    numba.typeof(numpy.ma.masked_array(np.arange(3)))
    refused = ""
except Exception as exc:
    refused = str(exc)
print(json.dumps([total, types, loaded, refused]))
"""


def test_typing_arrays_does_not_import_numpy_ma(tmp_path: Path) -> None:
    """numba's `typeof` of an array imported `numpy.ma` (11 ms) to refuse a masked
    array; no process imports it now until something else does, arrays are typed as
    before (read-only, strided), and a masked array is refused once one can exist."""
    out = run_python(_MASKED, timeout_s=300, env={"NUMBA_CACHE_DIR": str(tmp_path / "cache")})
    total, types, loaded, refused = json.loads(out.splitlines()[-1])
    assert total == 6 + 12
    assert types == ["readonly array(int64, 1d, C)", "array(int32, 1d, A)"]
    assert loaded is False
    assert "numpy.ma.MaskedArray" in refused


_RUNTIME = """
import json
import numpy as np
from numba.core.runtime import nrtdynmod
made = []
create = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda ctx: made.append(1) or create(ctx)
from tests.test_jit import _sum_doubled
print(json.dumps([int(_sum_doubled(np.arange(4, dtype=np.int64))), len(made)]))
"""


def test_numbas_runtime_is_loaded_from_the_cache_not_compiled_again(tmp_path: Path) -> None:
    """numba's runtime (NRT) is compiled by the first process and cached beside the
    kernels; the next process loads it (about 20 ms less), and kernels work in both. A
    file for another numba, CPU or llvmlite is compiled again and replaced."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run() -> list[int]:
        result: list[int] = json.loads(
            run_python(_RUNTIME, timeout_s=300, env=env).splitlines()[-1]
        )
        return result

    assert run() == [12, 1]  # compiled (and the kernel too)
    (cached,) = (tmp_path / "cache").rglob("cleanerd-nrt.pkl")
    assert run() == [12, 0]
    cached.write_bytes(pickle.dumps(("another numba", None)))
    assert run() == [12, 1]
    assert run() == [12, 0]
    cached.write_bytes(b"torn")
    assert run() == [12, 1]
