"""Shared checks for config dataclasses: errors name the field as the user writes it."""

from __future__ import annotations


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
