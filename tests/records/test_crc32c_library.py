"""The `crc32c` package's extension loaded on its own: the same routine, no metadata read,
and the package still importable afterwards."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cleanerd.records.crc32c_library import HARDWARE_BASED, crc32c
from tests.tools import run_python


def test_known_vector() -> None:
    # RFC 3720, B.4: 32 bytes of zeros.
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"123456789") == 0xE3069283


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_continuing_a_crc_equals_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c(b, crc32c(a)) == crc32c(a + b)


def test_loaded_without_the_package_init_which_still_imports_after() -> None:
    probe = (
        "import sys\n"
        "from cleanerd.records.crc32c_library import EXTENSION, crc32c\n"
        "print('crc32c' in sys.modules, 'importlib.metadata' in sys.modules)\n"
        "import crc32c as package\n"
        "same = sys.modules['crc32c._crc32c'] is EXTENSION\n"
        "print(same, package.crc32c(b'abc') == crc32c(b'abc'))\n"
    )
    assert run_python(probe).split() == ["False", "False", "True", "True"]


def test_reports_the_package_s_own_choice_of_routine() -> None:
    import crc32c as package

    assert package.hardware_based == HARDWARE_BASED
