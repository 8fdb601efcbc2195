"""`cleanerd config --default` prints the embedded demo config as a file that loads back
to the same config and passes check-config."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanerd.cli import main
from cleanerd.commands import check_config
from cleanerd.config import load_config
from tests.holders import HOLD_BROKER_LOCK, held_by_other_process


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


def test_check_config_refuses_what_the_daemons_start_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An MQTT password file that cannot be read fails check-config, naming the key and
    the file (it printed OK, and `run` then failed at its start)."""
    (tmp_path / "logs").mkdir()
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
        f"mqtt: {{enabled: true, username: u, password_file: {tmp_path / 'nope'}}}\n"
    )
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert f"mqtt.password_file: cannot read '{tmp_path / 'nope'}'" in out.err


def test_check_config_names_a_topic_on_disk_two_globs_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Which the daemon would leave alone: an error of check-config, not of the load."""
    (tmp_path / "logs" / "demo-x-0").mkdir(parents=True)
    config = tmp_path / "cleanerd.yaml"
    config.write_text(
        f"log.dirs: [{tmp_path / 'logs'}]\nstate_dir: {tmp_path / 'state'}\n"
        "topics: {'demo-*': {}, '*-x': {}}\n"
    )
    load_config(config)
    assert main(["check-config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "topic 'demo-x' matches more than one glob: 'demo-*' and '*-x'" in err
    assert str(tmp_path / "logs" / "demo-x-0") in err


@pytest.mark.parametrize("mode", ["owner", "observe"])
def test_check_config_warns_of_an_owned_log_dir_a_broker_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """A log dir whose `.lock` another process holds now (as a running broker does) in a
    config that owns its dirs: OK, with a warning that the daemon would only observe it
    and that beside a broker `mode: observe` is what is meant (the file was OK, and the
    default mode then took the dir when the broker stopped). Observe mode: no warning."""
    logs = tmp_path / "logs"
    logs.mkdir()
    config = tmp_path / "cleanerd.yaml"
    config.write_text(f"log.dirs: [{logs}]\nstate_dir: {tmp_path / 'state'}\nmode: {mode}\n")
    with held_by_other_process(HOLD_BROKER_LOCK, logs):
        assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr()
    assert out.out == f"{config}: OK\n"
    if mode == "observe":
        assert out.err == ""
        return
    (warning,) = out.err.splitlines()
    assert warning.startswith(
        f"cleanerd check-config: warning: log.dirs[0]: '{logs / '.lock'}' is held by pid "
    )
    assert warning.endswith("beside a live broker set mode: observe")
    assert not (tmp_path / "state").exists()  # a look at the owner's marker made none


def test_check_config_leaves_the_partitions_of_a_held_log_dir_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's log dir held now, its partition dirs not writable by this user: only the
    warning that it is held, not advice to give a live broker's partitions to this user
    (which hid the warning, and exited 1)."""
    logs = tmp_path / "logs"
    (logs / "orders-0").mkdir(parents=True)
    config = tmp_path / "cleanerd.yaml"
    config.write_text(f"log.dirs: [{logs}]\nstate_dir: {tmp_path / 'state'}\n")
    monkeypatch.setattr(check_config, "may", lambda path, mode: path != logs / "orders-0")
    with held_by_other_process(HOLD_BROKER_LOCK, logs):
        assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr()
    assert "is held by pid" in out.err
    assert "partition dirs" not in out.err
