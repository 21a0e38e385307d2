"""Shared checks for config dataclasses: errors name the field as the user writes it."""

from __future__ import annotations


def check_positive(owner: str, **values: float) -> None:
    """Raise ValueError naming `owner.field` for every value that is not > 0."""
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{owner}.{name} must be > 0, got {value}")
