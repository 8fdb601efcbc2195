"""The `crc32c` package's C extension, loaded without running the package's `__init__`.

That `__init__` sets `__version__` from the installed distribution's metadata, which
imports `importlib.metadata` (and `email`, `zipfile`, ...) and reads the metadata files:
about 40 ms of every command's start, for a version string cleanerd never reads. The
extension module `crc32c._crc32c` holds everything cleanerd calls (`crc32c`,
`hardware_based`), so it is loaded on its own from the package's directory, found with
`importlib.util.find_spec` (which does not run the package), and registered under its
own name, so that a later `import crc32c` (by aiokafka, say) reuses it. When the package
is already imported, or its layout is not the expected one, the package is imported as
usual.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final

_NAME: Final = "crc32c._crc32c"


def _load() -> ModuleType:
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("crc32c")
    locations = () if package is None else package.submodule_search_locations or ()
    if "crc32c" not in sys.modules:
        for location in locations:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = Path(location, "_crc32c" + suffix)
                if path.exists():
                    spec = importlib.util.spec_from_file_location(_NAME, path)
                    if spec is None or spec.loader is None:
                        continue
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    sys.modules[_NAME] = module
                    return module
    return importlib.import_module(_NAME)


EXTENSION: Final = _load()
"""The extension module (its `__file__` is the shared library the kernels call into)."""

crc32c: Final[Callable[..., int]] = EXTENSION.crc32c
"""``crc32c(data, value=0)``: the CRC-32C of a bytes-like `data`, continuing `value`."""

HARDWARE_BASED: Final[bool] = bool(EXTENSION.hardware_based)
"""Whether the package chose its hardware routine on this CPU."""
