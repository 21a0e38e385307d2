"""Building the typed config tree from a plain dict (what Hydra composes), strictly.

OmegaConf's structured configs cannot hold `Literal` choices or frozen dataclasses, which
our config classes use; so Hydra composes the YAML in configs/, the entry point converts it
once to a dict, and `from_dict` builds the frozen dataclasses: unknown keys and wrong types
raise ValueError naming the dotted path, and each class validates itself in __post_init__.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    if not isinstance(data, dict):
        raise ValueError(
            f"{path or 'config'} must be a mapping of fields, got {type(data).__name__}"
        )
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown config keys {[_join(path, k) for k in unknown]}; {path or 'config'} has {sorted(fields)}"
        )
    values = {name: _convert(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        return cls(**values)
    except TypeError as error:  # a required field is missing
        raise ValueError(f"{path or 'config'}: {error}") from None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)  # type: ignore[arg-type]
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path)
            except ValueError:
                continue
        raise ValueError(f"{path}: {value!r} is not a {hint}")
    if origin is typing.Literal:
        return value  # the dataclass names the field and the allowed values
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{path} must be a list, got {value!r}")
        (item,) = get_args(hint)[:1] or (Any,)
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and not isinstance(value, hint):
        raise ValueError(f"{path} must be a {hint.__name__}, got {value!r}")
    return value
