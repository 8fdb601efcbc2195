"""The daemon's parts: service lifecycle, systemd notify, logging, MQTT events and commands."""
