"""The one place cleanerd compiles hot loops with numba.

Hot loops (varint scans, key hashing, record filtering) never run per record in
interpreted Python; they are numba-compiled functions over numpy arrays. `jit` keeps the
compiled function's Python signature visible to mypy, and caches compiled code on disk
(NUMBA_CACHE_DIR, or `__pycache__` beside the module) so a CLI run does not pay the
compile time again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba

F = TypeVar("F", bound=Callable[..., Any])


def jit(fn: F) -> F:
    """Compile `fn` in nopython mode, releasing the GIL, with an on-disk cache."""
    return cast(F, numba.njit(cache=True, nogil=True)(fn))
