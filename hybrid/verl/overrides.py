"""Hydra override strings in and out: `[+|++|~]key=value`, parsed by Hydra's own grammar.

A translated override keeps the user's value text where the value is unchanged (so that
interpolations and quoting survive), and renders a converted value in the grammar's plain
form: true/false, null, numbers as Python writes them, strings quoted when they hold
anything but word characters, lists in brackets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.errors import OverrideParseException


@dataclass(frozen=True)
class Override:
    """One command-line override as the user typed it."""

    key: str
    value: Any
    """The parsed value (None for a deletion `~key`)."""
    text: str
    """The value as typed (after `=`)."""
    kind: str
    """'' (change), '+' (add), '++' (force add) or '~' (delete)."""
    line: str


_KINDS = {
    OverrideType.CHANGE: "",
    OverrideType.ADD: "+",
    OverrideType.FORCE_ADD: "++",
    OverrideType.DEL: "~",
}


def parse_overrides(lines: list[str]) -> list[Override]:
    """Each line parsed by Hydra's grammar; a malformed one raises ValueError naming it."""
    parser = OverridesParser.create()
    parsed = []
    for line in lines:
        try:
            (override,) = parser.parse_overrides([line])
        except OverrideParseException as error:
            raise ValueError(f"cannot parse the override {line!r}: {error}") from None
        text = line.split("=", 1)[1] if "=" in line else ""
        value = override.value() if override.type != OverrideType.DEL else None
        parsed.append(Override(override.key_or_group, value, text, _KINDS[override.type], line))
    return parsed


_PLAIN = re.compile(r"[A-Za-z0-9_./\-]+")


def render(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(render(item) for item in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and not _reads_as_other_type(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _reads_as_other_type(text: str) -> bool:
    """A string the grammar would read as a bool, null or number unless quoted."""
    if text.lower() in ("true", "false", "null"):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True
