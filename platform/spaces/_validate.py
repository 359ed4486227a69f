"""Small checks of a space's values shared by the schema (``--set``), the plans and the loader:
allowed keys, known config keys, grid value lists, booleans and positive integers. Each raises
UsageError (or ConfigError for a grid value) naming where the value came from."""

from __future__ import annotations

from typing import Any

from platform.errors import UsageError
from trainables.config import ConfigError, check_known_key, coerce_value

__all__ = ["as_bool", "grid_values", "known_key", "only_keys", "positive_int"]


def only_keys(
    mapping: dict[str, Any], allowed: tuple[str, ...], prefix: str, where: str = ""
) -> None:
    """Refuse the first key of ``mapping`` that is not in ``allowed``, naming the allowed ones."""
    for key in mapping:
        if key not in allowed:
            at = f" {where}" if where else ""
            raise UsageError(f"{prefix} {key!r}{at}; allowed: {', '.join(allowed)}")


def known_key(key: str, where: str) -> None:
    """Refuse a key that is not a TrialConfig key (with the config's hint)."""
    try:
        check_known_key(key, where=where)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def grid_values(key: str, values: list[Any], where: str) -> list[Any]:
    """A grid's value list for ``key``: not empty, every value valid, none twice."""
    if not values:
        raise UsageError(f"{where}: grid.{key} is an empty list; give at least one value")
    for value in values:
        try:
            coerce_value(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if len(set(map(repr, values))) != len(values):
        raise UsageError(f"{where}: grid.{key} lists a value twice: {values}")
    return values


def as_bool(key: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def positive_int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    return value
