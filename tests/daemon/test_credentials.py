"""Tests of `cleanerd.daemon.credentials`: the MQTT password and TLS files, read by the
daemon's start and by `check-config` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanerd.config import MqttConfig, TlsConfig
from cleanerd.daemon.credentials import problems, read_password, tls_context
from cleanerd.errors import ConfigError


def test_read_password_strips_the_newline(tmp_path: Path) -> None:
    """The password file's trailing newline is not part of the password."""
    path = tmp_path / "pw"
    path.write_text("s3cret \n")
    assert read_password(path) == "s3cret "


@pytest.mark.parametrize("content", [None, ""], ids=["missing", "empty"])
def test_read_password_errors_name_the_file(tmp_path: Path, content: str | None) -> None:
    """A missing or empty password file is a config error naming the file."""
    path = tmp_path / "pw"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=r"mqtt\.password_file") as info:
        read_password(path)
    assert str(path) in str(info.value)


def test_tls_context_off_and_insecure(tmp_path: Path) -> None:
    """TLS off gives no context; `insecure` turns off only the host name check."""
    assert tls_context(TlsConfig()) is None
    context = tls_context(TlsConfig(enabled=True, insecure=True))
    assert context is not None
    assert context.check_hostname is False
    assert context.verify_mode.name == "CERT_REQUIRED"


def test_tls_context_bad_ca_is_a_config_error(tmp_path: Path) -> None:
    """An unreadable CA file is a config error naming it."""
    ca = tmp_path / "missing-ca.pem"
    with pytest.raises(ConfigError, match=r"missing-ca\.pem"):
        tls_context(TlsConfig.model_validate({"enabled": True, "ca_file": str(ca)}))


def test_problems_are_those_of_the_daemons_start_while_mqtt_is_on(tmp_path: Path) -> None:
    """A missing password file and an unreadable CA are both listed, naming their key and
    file; nothing is read while MQTT is off."""
    settings = {
        "username": "u",
        "password_file": str(tmp_path / "missing-pw"),
        "tls": {"enabled": True, "ca_file": str(tmp_path / "missing-ca.pem")},
    }
    assert problems(MqttConfig.model_validate(settings)) == []
    found = problems(MqttConfig.model_validate({**settings, "enabled": True}))
    assert [line.split(":")[0] for line in found] == ["mqtt.password_file", "mqtt.tls"]
    assert str(tmp_path / "missing-pw") in found[0]
    assert str(tmp_path / "missing-ca.pem") in found[1]
