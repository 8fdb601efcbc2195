"""The one place cleanerd compiles hot loops with numba.

Hot loops (varint scans, key hashing, record filtering) never run per record in
interpreted Python; they are numba-compiled functions over numpy arrays. `jit` keeps the
compiled function's Python signature visible to mypy, and caches compiled code on disk
so a CLI run does not pay the compile time again.

Importing numba costs a few tenths of a second, more than a command such as
`check-config` or `plan` on an empty dir takes in all, so numba is imported when the
first kernel is first called, not when a module defining kernels is imported. A kernel
is a `Kernel` until then. The first call of any kernel (or numba typing a call to one
from another kernel, through `_numba_type_`, which numba's `typeof` asks every object
for) makes the dispatchers of all of them and rebinds every module-level name bound to a
`Kernel` to its dispatcher, so the calls after it carry no cost of their own; a kernel
kept elsewhere (in a tuple, say) still works, through one more Python call. Kernels
defined after that are compiled at once, as `numba.njit` does.

Where the cache lives: `NUMBA_CACHE_DIR` when set (the systemd unit and the container
image set it), else numba's own choice (`__pycache__` beside the module, else the user's
cache dir). When neither is writable (a root-owned install run by a user without a
writable home), numba would refuse to cache at all and fail; `_cache_dir` then points
`NUMBA_CACHE_DIR` at the first writable of `$CACHE_DIRECTORY/numba` (systemd's
`CacheDirectory=`), `$XDG_CACHE_HOME/cleanerd/numba` (`~/.cache` by default) and
`<tmp>/cleanerd-<uid>/numba`, and with none writable kernels are compiled uncached.
numba's runtime (NRT), which numba compiles with LLVM in every process, is cached
beside the first kernel loaded (`cleanerd-nrt.pkl`, see `_cache_runtime_library`).

Compiled ahead of time: once `cleanerd build-kernels` has built the kernels into an
extension module (`_aot.py`, under `cache_root()`), a kernel's first call loads that
module instead of numba, and each call whose argument types the module has a function
for runs it; any other call loads numba, as without the module (`CLEANERD_AOT=0` keeps
to numba), and so does the call after the first COMPILED_CALLS. The C functions kernels
call are named by symbol (`on_symbols`), which the JIT registers with LLVM and the
module binds its trampolines to.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from cleanerd.collector import long_lived_objects

F = TypeVar("F", bound=Callable[..., Any])

# Reentrant: loading the compiled module asks the symbol providers, which may register more.
_lock = threading.RLock()
_cache = True
"""Whether kernels are cached on disk (False only when no cache dir is writable)."""
_numba_loaded = False
"""Whether every kernel has its dispatcher; later kernels are compiled at once."""


def _writable(path: Path) -> bool:
    """Whether `path` is (or can be made) a dir this process may create files in."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def _cache_dir(
    env: Mapping[str, str], package: Path, writable: Callable[[Path], bool] = _writable
) -> str | None:
    """The `NUMBA_CACHE_DIR` to set before numba is imported: None when numba's own
    choice works (the variable is set, or `__pycache__` beside the package or the user's
    cache dir is writable), else the first writable fallback (see the module docstring),
    else the empty string (nowhere to cache)."""
    if env.get("NUMBA_CACHE_DIR"):
        return None
    home_cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    if writable(package / "__pycache__") or writable(home_cache / "numba"):
        return None
    candidates = [home_cache / "cleanerd" / "numba"]
    if systemd := env.get("CACHE_DIRECTORY"):
        candidates.insert(0, Path(systemd.split(":")[0]) / "numba")
    candidates.append(Path(tempfile.gettempdir()) / f"cleanerd-{os.getuid()}" / "numba")
    return next((str(c) for c in candidates if writable(c)), "")


def cache_root(env: Mapping[str, str] = os.environ) -> Path | None:
    """Where compiled kernels are cached: `NUMBA_CACHE_DIR`, else numba's own choice
    (`__pycache__` beside the package, else the user's cache dir), else the fallback of
    `_cache_dir`; None with none writable."""
    if env.get("NUMBA_CACHE_DIR"):
        return Path(env["NUMBA_CACHE_DIR"])
    package = Path(__file__).parent
    chosen = _cache_dir(env, package)
    if chosen == "":
        return None
    if chosen is not None:
        return Path(chosen)
    if _writable(package / "__pycache__"):
        return package / "__pycache__"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"


def _load_numba() -> None:
    """Import numba with a writable cache dir (see the module docstring)."""
    global _cache
    chosen = _cache_dir(os.environ, Path(__file__).parent)
    if chosen == "":
        _cache = False
    elif chosen is not None:
        os.environ["NUMBA_CACHE_DIR"] = chosen
    import numba.core.config

    if chosen:
        # numba reads its environment when first imported, which a module using numba's
        # extension API directly may have done already.
        vars(numba.core.config)["CACHE_DIR"] = chosen


_on_load: list[Callable[[], None]] = []
"""What to run once numba is imported (before any kernel is compiled)."""


def on_numba_load(fn: Callable[[], None]) -> None:
    """Run `fn` once numba is imported, or at once if it is: for a module that declares
    numba objects its kernels use (an external function, say) without importing numba
    itself at import time."""
    with _lock:
        if not _numba_loaded:
            _on_load.append(fn)
            return
    fn()


_symbol_providers: list[Callable[[], Mapping[str, int]]] = []
"""What gives the addresses of the C functions kernels call, by symbol."""


def on_symbols(provider: Callable[[], Mapping[str, int]]) -> None:
    """Register `provider`, which gives {symbol: address} of C functions kernels call
    (loading their library when first called, and the same addresses every call): the
    JIT registers them with LLVM when numba is loaded, the compiled module binds its
    trampolines to them when it is; at once when either already is."""
    with _lock:
        _symbol_providers.append(provider)
        numba_loaded, compiled = _numba_loaded, _compiled
    if numba_loaded or compiled:
        addresses = provider()
        if numba_loaded:
            _add_llvm_symbols(addresses)
        if compiled:
            compiled.bind(addresses)


def symbol_addresses() -> dict[str, int]:
    """Every registered provider's symbols and addresses."""
    out: dict[str, int] = {}
    for provider in _symbol_providers:
        out.update(provider())
    return out


def _add_llvm_symbols(addresses: Mapping[str, int]) -> None:
    import llvmlite.binding as llvm

    for symbol, address in addresses.items():
        llvm.add_symbol(symbol, address)


def _compile(fn: Callable[..., Any]) -> Any:
    import numba

    if getattr(fn, "_cleanerd_inline", False):
        return numba.njit(cache=_cache, nogil=True, inline="always")(fn)
    return numba.njit(cache=_cache, nogil=True)(fn)


def _load_all() -> None:
    """Import numba, make the dispatcher of every kernel so far, and rebind each name
    bound to a kernel in a loaded module to its dispatcher: calls through those names
    then go straight to numba, without a Python call in between. numba's modules live as
    long as the process: they are made with the collector paused, and frozen
    (`collector.long_lived_objects`), which spares every process a full collection."""
    global _numba_loaded
    with _lock, long_lived_objects():
        if _numba_loaded:
            return
        _load_numba()
        _load_cached_kernels_without_registries()
        _drop_llvm_lock_events()
        _type_arrays_without_numpy_ma()
        _add_llvm_symbols(symbol_addresses())
        for fn in _on_load:
            fn()
        for kernel in _kernels:
            kernel._dispatcher = _compile(kernel.py_func)
        for module in list(sys.modules.values()):
            names = getattr(module, "__dict__", None)
            if not isinstance(names, dict):
                continue
            for name, value in list(names.items()):
                if type(value) is Kernel:
                    names[name] = value._dispatcher
        _kernels.clear()
        _numba_loaded = True


def load_numba() -> None:
    """Load numba and make every kernel's dispatcher now (`_load_all`)."""
    _load_all()


COMPILED_CALLS = 10_000
"""Kernel calls a process makes through the compiled module before it loads numba after
all. numba's dispatcher types a call's arguments in C, a microsecond or more per call
faster than the module's type keys in Python (`_aot.value_key`, about 0.4 us an array),
so its load (about a quarter of a second) pays for itself over some 100,000 calls: a
one-shot command on a few partitions makes hundreds, a `clean` of 1,000 small
partitions 170,000, a daemon's cycles without end."""
_compiled_calls = 0


def compiled_kernels_on(env: Mapping[str, str] = os.environ) -> bool:
    """Whether compiled kernels are used and built (`CLEANERD_AOT=0` turns both off)."""
    return env.get("CLEANERD_AOT") != "0"


_compiled: Any = None
"""The compiled module (`_aot.Loaded`) once loaded."""
_compiled_tried = False
_type_key: Callable[[object], object] = repr
"""`_aot.value_key` once the compiled module is loaded (imported with it)."""


def _accepting(
    compiled: Mapping[object, Callable[..., Any] | None], key: tuple[object, ...]
) -> Callable[..., Any] | None:
    """The compiled function whose signature accepts arguments of the keys `key` (a call
    typed as no signature is), or None: numba then serves the call."""
    from cleanerd._aot import accepts

    for signature, fn in list(compiled.items()):
        if fn is not None and isinstance(signature, tuple) and accepts(signature, key):
            return fn
    return None


def _compiled_functions(kernel: Kernel) -> dict[object, Callable[..., Any] | None]:
    """The compiled module's functions of `kernel` by type key (loading the module on
    first use), or none: no module, or numba already loaded (whose dispatchers then
    serve every kernel), or `CLEANERD_AOT=0`."""
    global _compiled, _compiled_tried, _type_key
    with _lock:
        if not _compiled_tried and not _numba_loaded:
            _compiled_tried = True
            root = cache_root() if compiled_kernels_on() else None
            if root is not None:
                from cleanerd import _aot

                loaded = _aot.load(root)
                if loaded is not None:
                    loaded.bind(symbol_addresses())
                    _compiled, _type_key = loaded, _aot.value_key
        if _compiled is None or _numba_loaded:
            return {}
        name = f"{kernel.py_func.__module__}:{kernel.py_func.__qualname__}"
        functions: dict[object, Callable[..., Any] | None] = _compiled.functions.get(name, {})
        return functions


def _load_cached_kernels_without_registries() -> None:
    """Make numba load a cached kernel without first loading every typing and lowering
    registry it has (`BaseContext.refresh`: about 90 ms, most of a process's first
    kernel call). Code loaded from the cache is already compiled: it needs numba's
    runtime (NRT), whose functions it calls, but no registry; numba's compiler refreshes
    the registries itself before it compiles anything (a cache miss, a new signature).
    Where this numba's cache lacks the methods replaced here, it is left as it is."""
    from numba.core import caching
    from numba.core.runtime.nrt import rtsys

    cache = caching.Cache
    if not all(
        hasattr(cache, name) for name in ("_load_overload", "_guard_against_spurious_io_errors")
    ) or not hasattr(rtsys, "initialize"):
        return

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        global _nrt_cache_path
        if _nrt_cache_path is None:
            _nrt_cache_path = Path(self._cache_path)  # numba's runtime is cached beside
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    cache.load_overload = load_overload  # type: ignore[method-assign]
    _cache_runtime_library()


_nrt_cache_path: Path | None = None
"""Where the kernels being loaded are cached: numba's runtime is cached there too."""


def _cache_runtime_library() -> None:
    """Load numba's runtime (NRT: the reference counting every kernel calls) from the
    kernels' cache instead of compiling it with LLVM in every process (about 20 ms of
    the first kernel call; numba caches kernels but not its runtime). The file is keyed
    by what numba keys a kernel's cache by (its and llvmlite's versions, the CPU and its
    features); a file that is absent, for another key, or unreadable is replaced by a
    fresh compile, as numba does with a stale kernel cache."""
    import pickle

    import llvmlite
    import numba
    from numba.core.runtime import nrtdynmod

    def compile_nrt_functions(ctx: Any) -> Any:
        codegen = ctx.codegen()
        key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple()))
        path = None if _nrt_cache_path is None else _nrt_cache_path / "cleanerd-nrt.pkl"
        if path is not None:
            try:
                # A pickle, as numba's own cache of the kernels beside it: the same trust.
                stored_key, state = pickle.loads(path.read_bytes())  # noqa: S301
            except (OSError, pickle.UnpicklingError, ValueError, EOFError):
                stored_key = state = None
            if stored_key == key:
                return codegen.unserialize_library(state)
        create: Callable[[Any], tuple[Any, Any]] = nrtdynmod.create_nrt_module
        ir_module, library = create(ctx)
        library.enable_object_caching()
        library.add_ir_module(ir_module)
        library.finalize()
        if path is not None:
            with contextlib.suppress(OSError):
                _write_atomically(path, pickle.dumps((key, library.serialize_using_object_code())))
        return library

    nrtdynmod.compile_nrt_functions = compile_nrt_functions


def _write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename, so that a process
    reading it concurrently sees the old file or the new one, never a torn one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _drop_llvm_lock_events() -> None:
    """Stop numba timing every call into LLVM. numba hooks llvmlite's lock to send a
    start and an end event of its own on each of them, for compile statistics cleanerd
    never reads; loading one cached kernel makes some 150 such calls, and the events
    were about a seventh of the load (10 of 75 ms for the kernels of a pass). llvmlite
    keeps its lock: only the callbacks numba added to it go."""
    from llvmlite.binding import ffi

    hooks = getattr(ffi.lib._lock, "_cblist", ())
    for acquire, release in list(hooks):
        if getattr(acquire, "__module__", "") == "numba.core.base":
            ffi.unregister_lock_callback(acquire, release)


def _type_arrays_without_numpy_ma() -> None:
    """Spare every process the import of `numpy.ma` (11 ms) that numba's `typeof` of
    the first array makes, only to refuse a masked array: none can exist before that
    module is imported. numba's own typing of arrays is kept, and runs once it is."""
    import numpy as np
    from numba.core.typing.typeof import typeof_impl

    numbas = typeof_impl.dispatch(np.ndarray)

    def typeof_ndarray(val: Any, c: Any) -> Any:
        if "numpy.ma" in sys.modules:
            return numbas(val, c)
        from numba.core import types
        from numba.np import numpy_support

        dtype = numpy_support.from_dtype(val.dtype)
        layout = numpy_support.map_layout(val)
        return types.Array(dtype, val.ndim, layout, readonly=not val.flags.writeable)

    typeof_impl.register(np.ndarray)(typeof_ndarray)


class Kernel:
    """A function compiled by numba when first called (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.py_func = fn
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self._dispatcher: Any = None
        self._compiled: dict[object, Callable[..., Any] | None] | None = None

    def dispatcher(self) -> Any:
        """numba's dispatcher of this kernel, made on first use (of any kernel)."""
        if self._dispatcher is None:
            _load_all()
            with _lock:
                if self._dispatcher is None:  # made directly, after numba was loaded
                    self._dispatcher = _compile(self.py_func)
        return self._dispatcher

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._dispatcher is None and not kwargs:
            compiled = self._compiled
            if compiled is None:
                compiled = self._compiled = _compiled_functions(self)
            global _compiled_calls
            if compiled and _compiled_calls < COMPILED_CALLS:
                _compiled_calls += 1  # a race between threads miscounts a call or two
                key = tuple(map(_type_key, args))
                fn = compiled.get(key)
                if fn is None and key not in compiled:
                    fn = compiled[key] = _accepting(compiled, key)
                if fn is not None:
                    return fn(*args)
        return self.dispatcher()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # numba's typeof asks for `_numba_type_` when a kernel calls this one; the rest
        # of the dispatcher's attributes (signatures, stats) are passed through too.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dispatcher(), name)

    def __repr__(self) -> str:
        return f"<kernel {self.__qualname__}>"


_kernels: list[Kernel] = []
"""The kernels made before numba was loaded."""
_registry: list[Kernel] = []
"""Every kernel made before numba was loaded, kept (the compiled module is built of them)."""


def kernels() -> list[Kernel]:
    """Every kernel made before numba was loaded."""
    return list(_registry)


def jit_inline(fn: F) -> F:
    """`jit`, and inlined into the kernels that call it (numba's `inline="always"`): for
    a small check that runs once per batch, where a call costs as much as the check."""
    fn._cleanerd_inline = True  # type: ignore[attr-defined]
    return jit(fn)


def jit(fn: F) -> F:
    """Compile `fn` in nopython mode, releasing the GIL, with an on-disk cache: when any
    kernel is first called, or at once once one has been."""
    with _lock:
        if _numba_loaded:
            return cast(F, _compile(fn))
        kernel = Kernel(fn)
        _kernels.append(kernel)
        _registry.append(kernel)
    return cast(F, kernel)
