"""The kernels compiled ahead of time: one extension module that spares a process numba.

A process that runs a kernel through numba imports numba and llvmlite's LLVM and loads
each kernel's machine code from numba's cache, about a third of a second before the
first byte is read, more than the work of a small command. `cleanerd build-kernels`
compiles the same kernels (the same Python source, by numba's `pycc`) into an ordinary
CPython extension module, for the signatures this host's numba cache holds, that is,
the argument types the kernels were called with here. A later process imports that
module (a few milliseconds, no numba) and calls its functions; a call whose argument
types it has no function for goes to numba as before (`_jit.Kernel`).

Files, in the kernel cache root (`_jit.cache_root`), under `cleanerd-kernels/`:

- `<module>.<suffix>`: the extension module, its name (`cleanerd_kernels_<digest>`)
  unique to what it was built from;
- `manifest.json`: what it was built from and holds: the stamp (modification time in
  ns, size) of every module defining kernels (`KERNEL_MODULES`: a kernel's machine code
  holds the callees it inlines, so any of them changing makes the module stale), numpy's
  version (its array layout is read by the unboxing code), the machine and its CPU
  flags (the code is compiled for this host's CPU), the extension suffix (the Python
  ABI), the external symbols in trampoline order, for each kernel the type key of each
  signature with the module function compiled for it, and whether the build followed a
  warm-up (`warmed_up`: a build for the same sources, as at a daemon's restart, then
  runs none).

A manifest that disagrees with any of these is ignored (every kernel goes to numba).
The build writes the module and the manifest beside their final names and renames them
in, the manifest last: a process loading meanwhile reads the old manifest and its
module or the new ones, never half of either (old modules are removed by the next build).

Scratch: the warm-up's dir (under the cache root), the build's dir and the manifest
being written (under `cleanerd-kernels/`) are named `<kind>-<pid>-<random>` after the
process that makes them (`scratch_prefix`). A build killed mid-way (a daemon stopped
during its build, whose whole process group goes) cannot remove its own; the next
`build-kernels` removes those whose process is gone (`remove_leftovers`), and leaves
those of a build still running beside it.

Type keys. The module's functions unbox their arguments as declared and check nothing,
so a call reaches a function only when the key of its arguments (`value_key`) equals
the key of the signature it was compiled for (`numba_key`): for an array its dtype,
dimensions, layout (`C`, `F` or `A`, as numba's typing says) and whether it is read-only;
for a scalar its numba type (a Python int is int64, a bool boolean, a float float64);
for a tuple its items'. A call whose key no signature has goes to a signature that
`accepts` it, if one does: where the signature says `A` (any strides) an array of any
layout, where it says read-only a writable array (the code reads what it is given by
its strides and writes nothing through a read-only argument). So a call typed as the
warm-up's were not (numpy calls an array of one element contiguous, whatever its
strides) is served without loading numba. Anything else goes to numba.

External functions. Kernels call C functions by symbol (`crc.py`'s CRC-32C routine,
`native.py`'s libraries), which the JIT registers with LLVM at their addresses in this
process. The module defines each such symbol as a trampoline that jumps through a table
the loader fills from the same providers (`_jit.on_symbols`); a table entry no provider
filled points at a routine that aborts with a message naming no address, instead of a
jump to null.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

KERNEL_MODULES: Final = (
    "compaction.assemble",
    "compaction.audit",
    "compaction.batch_retention",
    "compaction.cleaner",
    "compaction.horizon",
    "compaction.keyhash",
    "compaction.offset_map",
    "compaction.producers",
    "compaction.strategy",
    "compaction.transactions",
    "compaction.writer",
    "log.index",
    "log.producer_state",
    "records.address",
    "records.columns",
    "records.compiled_codecs",
    "records.compiled_encoders",
    "records.control",
    "records.crc",
    "records.prefetch",
    "records.walker",
    "records.zlib_streams",
)
"""Every module (under `cleanerd.`) that defines kernels."""

DIR_NAME: Final = "cleanerd-kernels"
MANIFEST: Final = "manifest.json"
MANIFEST_VERSION: Final = 1
PACKAGE: Final = Path(__file__).parent

_TRAMPOLINE: Final = {
    "x86_64": "    jmp *cleanerd_aot_targets+{offset}(%rip)\n",
    "aarch64": (
        "    adrp x16, cleanerd_aot_targets+{offset}\n"
        "    ldr x16, [x16, #:lo12:cleanerd_aot_targets+{offset}]\n"
        "    br x16\n"
    ),
}
"""How a trampoline jumps through its table entry, on the machines it is written for."""


# -- type keys ------------------------------------------------------------------------------

_BOOL: Final = ("s", "|b1")
_INT64: Final = ("s", np.dtype(np.int64).str)
_UINT64: Final = ("s", np.dtype(np.uint64).str)
_FLOAT64: Final = ("s", np.dtype(np.float64).str)


_DTYPE_KEYS: dict[np.dtype[Any], str] = {}
_C_CONTIGUOUS, _F_CONTIGUOUS, _WRITEABLE = 0x1, 0x2, 0x400  # numpy's array flag bits
_LAYOUTS: Final = ("A", "C", "F", "C")  # by the two contiguity bits (1-D: both)


def _dtype_key(dtype: np.dtype[Any]) -> str:
    key = _DTYPE_KEYS.get(dtype)
    if key is None:
        key = dtype.str if dtype.fields is None else repr((dtype.descr, dtype.itemsize))
        _DTYPE_KEYS[dtype] = key
    return key


def value_key(value: object) -> object:
    """The type key of an argument (see the module docstring), or None."""
    kind = type(value)
    if kind is np.ndarray:
        array: np.ndarray[Any, Any] = value  # type: ignore[assignment]
        flags: int = array.flags.num
        layout = _LAYOUTS[flags & (_C_CONTIGUOUS | _F_CONTIGUOUS)]
        return ("a", _dtype_key(array.dtype), array.ndim, layout, not flags & _WRITEABLE)
    if kind is bool or kind is np.bool_:
        return _BOOL
    if kind is int:
        number: int = value  # type: ignore[assignment]
        if -(2**63) <= number < 2**63:
            return _INT64
        return _UINT64 if 0 <= number < 2**64 else None
    if kind is float:
        return _FLOAT64
    if isinstance(value, (np.integer, np.floating)):
        return ("s", value.dtype.str)
    if kind is tuple:
        items = tuple(value_key(item) for item in value)  # type: ignore[attr-defined]
        return None if None in items else ("t", *items)
    return None


def numba_key(numba_type: Any) -> object:
    """The type key of a numba type in a kernel's signature, or None where no Python
    value types as it (a literal, an object the keys do not cover)."""
    from numba.core import types
    from numba.np.numpy_support import as_dtype

    if isinstance(numba_type, types.Literal):
        return None
    if isinstance(numba_type, types.Array):
        layout = numba_type.layout
        dtype = _dtype_key(as_dtype(numba_type.dtype))
        return ("a", dtype, numba_type.ndim, layout, not numba_type.mutable)
    if isinstance(numba_type, types.Boolean):
        return _BOOL
    if isinstance(numba_type, (types.Integer, types.Float)):
        return ("s", as_dtype(numba_type).str)
    if isinstance(numba_type, types.BaseTuple):
        items = tuple(numba_key(item) for item in numba_type.types)  # type: ignore[attr-defined]
        return None if None in items else ("t", *items)
    return None


def accepts(signature: tuple[object, ...], keys: tuple[object, ...]) -> bool:
    """Whether a function compiled for the argument type keys `signature` may be called
    with arguments of the keys `keys` (see the module docstring)."""
    return len(signature) == len(keys) and all(map(_accepts, signature, keys))


def _accepts(signature: object, key: object) -> bool:
    if signature == key:
        return True
    if not (isinstance(signature, tuple) and isinstance(key, tuple)):
        return False
    if len(signature) != len(key) or signature[0] != key[0]:
        return False
    if signature[0] == "a":
        _, dtype, ndim, layout, readonly = signature
        return (dtype, ndim) == key[1:3] and layout in ("A", key[3]) and (readonly or not key[4])
    return signature[0] == "t" and all(map(_accepts, signature[1:], key[1:]))


def _frozen(key: object) -> object:
    """A key read back from JSON (lists) as the tuples `value_key` makes."""
    return tuple(_frozen(k) for k in key) if isinstance(key, list) else key


# -- what a module is built from ------------------------------------------------------------


def _stamps() -> dict[str, list[int]]:
    """(modification time in ns, size) of every module defining kernels."""
    out: dict[str, list[int]] = {}
    for name in KERNEL_MODULES:
        st = (PACKAGE / (name.replace(".", "/") + ".py")).stat()
        out[name] = [st.st_mtime_ns, st.st_size]
    return out


def _cpu() -> str:
    """The machine and its CPU flags (the first processor's, from /proc/cpuinfo)."""
    flags = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    return f"{os.uname().machine} {zlib.crc32(flags.encode()):08x} {len(flags)}"


def _suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def _built_for() -> dict[str, object]:
    """What a manifest must say for its module to be used in this process."""
    return {
        "version": MANIFEST_VERSION,
        "sources": _stamps(),
        "numpy": np.__version__,
        "cpu": _cpu(),
        "suffix": _suffix(),
    }


# -- loading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """A loaded module: each kernel's functions by type key, and how to bind symbols."""

    functions: Mapping[str, Mapping[object, Callable[..., Any]]]
    symbols: tuple[str, ...]
    library: ctypes.CDLL

    def bind(self, addresses: Mapping[str, int]) -> None:
        """Point the trampolines of `addresses`' symbols at those addresses."""
        for index, symbol in enumerate(self.symbols):
            if symbol in addresses:
                self.library.cleanerd_aot_bind(
                    ctypes.c_size_t(index), ctypes.c_void_p(addresses[symbol])
                )


def load(root: Path) -> Loaded | None:
    """The module built under `root` for this process, or None (none built, or stale,
    or it does not load: the kernels then go to numba)."""
    where = root / DIR_NAME
    try:
        manifest = json.loads((where / MANIFEST).read_text())
        if not isinstance(manifest, dict) or manifest.get("built_for") != _built_for():
            return None
        name = manifest["module"]
        path = where / f"{name}{_suffix()}"
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is None:
            return None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        library = ctypes.CDLL(str(path))
        functions = {
            kernel: {_frozen(key): getattr(module, export) for export, key in entries}
            for kernel, entries in manifest["kernels"].items()
        }
        return Loaded(functions, tuple(manifest["symbols"]), library)
    except (OSError, ImportError, ValueError, KeyError, TypeError, AttributeError):
        return None  # absent, unreadable or not the shape a build writes: numba it is


# -- building ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """What a build made: the module, its kernels and their signatures, and the time."""

    path: Path
    kernels: int
    signatures: int
    skipped: int
    seconds: float
    up_to_date: bool = False
    """Whether the module there was built from the same sources and signatures (and
    was kept, not built again)."""


def _trampolines(symbols: Iterable[str], machine: str) -> str:
    """C source of the symbol table, its binder and one trampoline per symbol."""
    names = list(symbols)
    jump = _TRAMPOLINE[machine]
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "static void cleanerd_aot_unbound(void) {",
        '    fputs("cleanerd: a compiled kernel called an external function that was '
        'never bound\\n", stderr);',
        "    abort();",
        "}",
        '__attribute__((visibility("hidden")))',
        f"void *cleanerd_aot_targets[{max(1, len(names))}] = {{",
        *("    (void *)cleanerd_aot_unbound," for _ in names),
        "};",
        '__attribute__((visibility("default"))) void cleanerd_aot_bind(size_t i, void *p) {',
        f"    if (i < {len(names)}) cleanerd_aot_targets[i] = p;",
        "}",
        "__asm__(",
        '    ".text\\n"',
    ]
    for index, symbol in enumerate(names):
        body = jump.format(offset=8 * index).replace("\n", "\\n")
        lines += [
            f'    ".globl {symbol}\\n"',
            f'    ".type {symbol}, @function\\n"',
            f'    "{symbol}:\\n"',
            f'    "{body}"',
            f'    ".size {symbol}, .-{symbol}\\n"',
        ]
    lines.append(");")
    return "\n".join(lines) + "\n"


def _compile_with_njit_flags() -> None:
    """Make pycc compile as the kernels' dispatchers do: without the GIL, with numba's
    runtime, and typing the return value instead of checking it against a declared one
    (numba fails to unify an inlined callee's literal constants against a declared
    return type that its own JIT infers without complaint); the inferred type is then
    checked to be the one the cache holds."""
    pycc_compiler: Any = importlib.import_module("numba.pycc.compiler")
    flags_type: Any = importlib.import_module("numba.core.compiler").Flags
    cpu_target: Any = importlib.import_module("numba.core.registry").cpu_target

    original = pycc_compiler.compile_extra
    if getattr(original, "_cleanerd", False):
        return

    def compile_extra(
        typingctx: Any,
        targetctx: Any,
        func: Any,
        args: Any,
        return_type: Any,
        flags: Any,
        locals: Any,
        library: Any = None,
    ) -> Any:
        njit = cpu_target.options.parse_as_flags(flags_type(), {"nopython": True, "nogil": True})
        njit.no_compile = flags.no_compile
        njit.no_cpython_wrapper = flags.no_cpython_wrapper
        njit.no_cfunc_wrapper = flags.no_cfunc_wrapper
        result = original(typingctx, targetctx, func, args, None, njit, locals, library=library)
        if result.signature.return_type != return_type:
            raise TypeError(
                f"{func.__qualname__}{args}: returns {result.signature.return_type}, "
                f"numba's cache says {return_type}"
            )
        return result

    compile_extra._cleanerd = True  # type: ignore[attr-defined]
    pycc_compiler.compile_extra = compile_extra


def missing_compiler() -> str | None:
    """Why no module can be built here, if the C compiler pycc links it with (`CC`, else
    the one Python was built with, as distutils picks it) is not on PATH; else None."""
    import shlex
    import shutil
    import sysconfig

    configured = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(configured)
    compiler = words[0] if words else "cc"
    if shutil.which(compiler) is None:
        return (
            f"no C compiler: {compiler!r} is not on PATH (numba's pycc links the module "
            "with it: install gcc, or set CC)"
        )
    return None


def warmed_up(root: Path) -> bool:
    """Whether the module under `root` is this process's (the same sources, numpy and
    CPU) and was built after a warm-up: numba's cache there then holds the warm-up's
    signatures, and a build need not run it again."""
    try:
        manifest = json.loads((root / DIR_NAME / MANIFEST).read_text())
        return manifest.get("warmed_up") is True and manifest.get("built_for") == _built_for()
    except (OSError, ValueError, AttributeError):
        return False


def build(
    root: Path, *, select: Callable[[str], bool] = lambda _: True, warmed_up: bool = False
) -> Built:
    """Compile every kernel of `KERNEL_MODULES` that `select` (given its name) keeps,
    for each signature numba's cache holds for it, into the module under `root` (see the
    module docstring). Needs numba and a C compiler; raises RuntimeError saying what is
    missing, or that the cache holds no signature yet. `warmed_up`: numba's cache holds
    the warm-up's signatures (see `warmed_up`), which the manifest then says."""
    import hashlib
    import tempfile
    import warnings

    started = time.perf_counter()
    machine = os.uname().machine
    if machine not in _TRAMPOLINE or not sys.platform.startswith("linux"):
        raise RuntimeError(f"compiled kernels are built on Linux x86_64 and aarch64, not {machine}")
    if (missing := missing_compiler()) is not None:
        raise RuntimeError(missing)
    from cleanerd import _jit

    for name in KERNEL_MODULES:
        importlib.import_module(f"cleanerd.{name}")
    _jit.load_numba()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation
        cc_type: Any = importlib.import_module("numba.pycc").CC
    _compile_with_njit_flags()

    built_for = _built_for()
    digest = hashlib.sha256(json.dumps(built_for, sort_keys=True).encode())
    exports: list[tuple[str, Any, Any]] = []  # (export name, python function, signature)
    kernels: dict[str, list[tuple[str, object]]] = {}
    skipped = 0
    for kernel in _jit.kernels():
        name = f"{kernel.py_func.__module__}:{kernel.py_func.__qualname__}"
        if getattr(kernel.py_func, "_cleanerd_inline", False) or not select(name):
            continue
        dispatcher = kernel.dispatcher()
        for args in _cached_signatures(dispatcher):
            key = tuple(numba_key(a) for a in args)
            if None in key:
                skipped += 1  # a literal argument: only ever called from kernels
                continue
            dispatcher.compile(args)  # loaded from the cache, with its return type
            signature = dispatcher.overloads[args].signature
            export = f"k{len(exports)}"
            exports.append((export, kernel.py_func, signature))
            kernels.setdefault(name, []).append((export, key))
            digest.update(f"{name}{args}".encode())
    if not exports:
        raise RuntimeError("numba's cache holds no kernel signature yet: run cleanerd first")
    symbols = sorted(_jit.symbol_addresses())
    digest.update(repr(symbols).encode())
    module = f"cleanerd_kernels_{digest.hexdigest()[:16]}"
    where = root / DIR_NAME
    current = where / f"{module}{_suffix()}"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        manifest = json.loads((where / MANIFEST).read_text())
        if manifest["module"] == module and current.exists():
            if warmed_up and manifest.get("warmed_up") is not True:
                _write_manifest(where, {**manifest, "warmed_up": True})
            return Built(current, len(kernels), len(exports), skipped, 0.0, up_to_date=True)
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("build"), dir=where) as tmp:
        source = Path(tmp) / "trampolines.c"
        source.write_text(_trampolines(symbols, machine))
        cc = cc_type(module)
        cc.output_dir = tmp
        cc.verbose = False
        cc.target_cpu = "host"
        cc._mixin_sources = [*cc._mixin_sources, str(source)]
        for export, fn, signature in exports:
            cc.export(export, signature)(fn)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cc.compile()
        (Path(tmp) / current.name).replace(current)
        _write_manifest(
            where,
            {
                "built_for": built_for,
                "module": module,
                "symbols": symbols,
                "kernels": kernels,
                "warmed_up": warmed_up,
            },
        )
    for old in where.glob(f"cleanerd_kernels_*{_suffix()}"):
        if old != current:
            old.unlink(missing_ok=True)  # a process that loaded it keeps its mapping
    return Built(current, len(kernels), len(exports), skipped, time.perf_counter() - started)


def _write_manifest(where: Path, manifest: Mapping[str, object]) -> None:
    """Replace the manifest in `where` whole: a process loading meanwhile reads the old
    one or the new one."""
    import tempfile

    fd, staged = tempfile.mkstemp(dir=where, prefix=scratch_prefix("manifest"), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(manifest))
        Path(staged).replace(where / MANIFEST)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise


def _cached_signatures(dispatcher: Any) -> list[tuple[Any, ...]]:
    """The argument types numba's cache holds machine code for, for `dispatcher`."""
    cache = getattr(dispatcher, "_cache", None)
    index_file = getattr(cache, "_cache_file", None)
    if index_file is None:
        return []
    found: list[tuple[Any, ...]] = []
    for key in index_file._load_index():
        args = tuple(key[0])
        if args not in found:
            found.append(args)
    return found


def scratch_prefix(kind: str) -> str:
    """The name prefix of a scratch dir or file of `kind` made by this process under the
    kernel cache root (see Scratch in the module docstring)."""
    return f"{kind}-{os.getpid()}-"


_SCRATCH: Final = re.compile(r"(?:warm-up|build|manifest)-(\d+)-")
LEGACY_SCRATCH_AGE_S: Final = 3600
"""Scratch of builds from before `scratch_prefix` (no pid in its name: `warm-up-<random>`,
`tmp<random>`, `manifest.json.<random>.tmp`) is removed once this old: a build takes a
minute at most."""


def remove_leftovers(root: Path) -> list[Path]:
    """Remove the scratch dirs and files under the kernel cache `root` whose process is
    gone (see Scratch in the module docstring); returns them."""
    import shutil

    removed = []
    now = time.time()
    for where in (root, root / DIR_NAME):
        try:
            entries = list(where.iterdir())
        except OSError:
            continue
        for path in entries:
            # Scratch is never a link: one named like it is not ours to follow.
            if path.is_symlink() or not _left_over(path, in_root=where == root, now=now):
                continue
            try:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:  # gone meanwhile, or not ours to remove: not said as removed
                continue
            removed.append(path)
    return removed


def _left_over(path: Path, *, in_root: bool, now: float) -> bool:
    """Whether `path` is scratch whose process is gone (or, without a pid, is old)."""
    found = _SCRATCH.match(path.name)
    if found is not None:
        return not _running(int(found.group(1)))
    legacy = ("warm-up-",) if in_root else ("tmp", f"{MANIFEST}.")
    return path.name.startswith(legacy) and _age_s(path, now) > LEGACY_SCRATCH_AGE_S


def _running(pid: int) -> bool:
    """Whether process `pid` runs. A zombie does not: a build killed with its warm-up
    leaves the warm-up a zombie until init reaps it, which can be after the next build
    looked. The signal check comes first: under `ProtectProc=invisible` (the systemd
    unit) another user's process is missing from /proc, and psutil would call it gone."""
    import psutil

    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or no pid of this system
        return False
    except PermissionError:
        return True  # another user's process
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False  # ended since
    except psutil.AccessDenied:
        return True


def _age_s(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def remove(root: Path) -> None:
    """Remove the built module (the kernels go to numba again)."""
    import shutil

    shutil.rmtree(root / DIR_NAME, ignore_errors=True)
