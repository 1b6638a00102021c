"""Settings plumbing every gpushare program uses: reading a variable, parsing it with an error that names it, and the
shared log settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from common.cli import Variable
from common.logsetup import LOG_FORMATS

T = TypeVar("T")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_VARIABLES = (
    Variable("GPUSHARE_LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR"),
    Variable("GPUSHARE_LOG_FORMAT", "text", "text, or json for one JSON object per line"),
)


class SettingsError(ValueError):
    """A bad environment variable; the text names the variable and the accepted values."""


def env_value(env: Mapping[str, str], name: str, default: str) -> str:
    return env.get(name, default).strip()


def env_parsed(env: Mapping[str, str], name: str, default: str, parse: Callable[[str], T], accepted: str) -> T:
    raw = env_value(env, name, default)
    try:
        return parse(raw)
    except ValueError as exc:  # a ProtocolError is a ValueError too
        raise SettingsError(f"{name}={raw!r} is not valid: {exc}; expected {accepted}") from exc


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be greater than zero")
    return value


def metrics_address(text: str) -> tuple[str, int] | None:
    """`host:port` (`[::]:port` for IPv6) of a plain-HTTP /metrics listener; empty turns it off."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError("give host:port, such as 0.0.0.0:9102")
    return host.strip("[]") or "0.0.0.0", int(port)


def log_settings(env: Mapping[str, str]) -> tuple[str, str]:
    """(GPUSHARE_LOG_LEVEL, GPUSHARE_LOG_FORMAT), shared by every program."""
    log_level = env_value(env, "GPUSHARE_LOG_LEVEL", "INFO").upper()
    if log_level not in LOG_LEVELS:
        raise SettingsError(f"GPUSHARE_LOG_LEVEL={log_level!r} is not valid; expected DEBUG, INFO, WARNING or ERROR")
    log_format = env_value(env, "GPUSHARE_LOG_FORMAT", "text").lower()
    if log_format not in LOG_FORMATS:
        raise SettingsError(f"GPUSHARE_LOG_FORMAT={log_format!r} is not valid; expected text or json")
    return log_level, log_format
