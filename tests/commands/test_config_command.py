"""`cleanerd config --default` prints the embedded demo config as a file that loads back
to the same config and passes check-config."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanerd.cli import main
from cleanerd.config import load_config


def test_the_default_config_as_a_file_loads_back_to_the_embedded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--default"]) == 0
    path = tmp_path / "cleanerd.yaml"
    path.write_text(capsys.readouterr().out)
    assert load_config(path) == load_config(None)
    (tmp_path / "data").mkdir()
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: OK\n"
