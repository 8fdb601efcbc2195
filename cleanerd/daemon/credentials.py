"""The files the `mqtt` settings name, which the daemon reads when it starts: the
password file and the TLS certificate files. `cleanerd check-config` reads them the same
way (`problems`), so a config it passes does not stop the daemon's start on one of them.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from cleanerd.config import MqttConfig, TlsConfig
from cleanerd.errors import ConfigError


def read_password(path: Path) -> str:
    """The password in `path`, without its trailing newline. Raises ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else f"not UTF-8 ({e.reason})"
        raise ConfigError([f"mqtt.password_file: cannot read {str(path)!r}: {reason}"]) from e
    password = text.rstrip("\r\n")
    if not password:
        raise ConfigError([f"mqtt.password_file: {str(path)!r} is empty"])
    return password


def tls_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The client TLS context, or None when TLS is off. Raises ConfigError naming the file.

    `insecure` skips only the host name check (as paho's tls_insecure does); the broker's
    certificate must still chain to `ca_file` (or the system's CAs).
    """
    if not tls.enabled:
        return None
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as e:
        files = ", ".join(str(p) for p in (tls.ca_file, tls.cert_file, tls.key_file) if p)
        raise ConfigError([f"mqtt.tls: cannot load {files or 'the system CAs'}: {e}"]) from e
    if tls.insecure:
        context.check_hostname = False
    return context


def problems(mqtt: MqttConfig) -> list[str]:
    """What the daemon's start would refuse in the files `mqtt` names (nothing while
    MQTT is off), one line per problem, each naming the key and the file."""
    if not mqtt.enabled:
        return []
    found: list[str] = []
    try:
        if mqtt.password_file is not None:
            read_password(mqtt.password_file)
    except ConfigError as e:
        found += e.errors
    try:
        tls_context(mqtt.tls)
    except ConfigError as e:
        found += e.errors
    return found
