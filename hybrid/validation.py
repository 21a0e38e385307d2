"""Shared checks for config dataclasses: errors name the field as the user writes it."""

from __future__ import annotations

import math


def check_positive(owner: str, **values: float) -> None:
    """Raise ValueError naming `owner.field` for every value that is not > 0."""
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{owner}.{name} must be > 0, got {value}")


def check_choice(owner: str, name: str, value: object, allowed: tuple[object, ...]) -> None:
    """Raise ValueError naming `owner.name` and the allowed values when `value` is not one."""
    if value not in allowed:
        raise ValueError(f"{owner}.{name} must be one of {list(allowed)}, got {value!r}")


def check_range(owner: str, name: str, value: float, low: float, high: float) -> None:
    """Raise ValueError naming `owner.name` unless low < value <= high."""
    if not low < value <= high:
        raise ValueError(f"{owner}.{name} must be in ({low}, {high}], got {value}")


def check_timeout(field_name: str, seconds: float) -> None:
    """A deadline must be a positive, finite number of seconds: raise naming the field."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"{field_name} must be a number of seconds, got {seconds!r}")
    if not (seconds > 0 and math.isfinite(seconds)):  # also NaN
        raise ValueError(f"{field_name} must be a positive number of seconds, got {seconds}")
