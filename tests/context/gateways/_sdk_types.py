"""A strict structural check of a JSON value against an SDK's TypedDict request types.

The ``openai`` and ``anthropic`` SDKs describe request bodies with TypedDicts
(``Iterable`` fields, ``Required``/``NotRequired`` keys, ``Literal`` tags).
Pydantic validates ``Iterable`` lazily and ignores unknown TypedDict keys, so
this walks the type hints itself: every key must be declared, every required
key present, every value of a declared type, recursively.
"""

from __future__ import annotations

__all__ = ("type_errors",)

import collections.abc
import types
import typing
from functools import cache
from typing import Any

import typing_extensions


@cache
def _hints(cls: type) -> tuple[dict[str, Any], frozenset[str], dict[str, str]]:
    hints = typing_extensions.get_type_hints(cls, include_extras=True)
    required: set[str] = set()
    aliases: dict[str, str] = {}
    for key, hint in list(hints.items()):
        base = hint
        is_required: bool | None = None
        while True:
            origin: Any = typing_extensions.get_origin(base)
            if origin in (typing_extensions.Required, typing.Required):
                is_required = True
                base = typing_extensions.get_args(base)[0]
            elif origin in (typing_extensions.NotRequired, typing.NotRequired):
                is_required = False
                base = typing_extensions.get_args(base)[0]
            elif origin is typing_extensions.Annotated or origin is typing.Annotated:
                for meta in getattr(base, "__metadata__", ()):
                    alias = getattr(meta, "alias", None)
                    if isinstance(alias, str):
                        aliases[alias] = key
                base = typing_extensions.get_args(base)[0]
            else:
                break
        hints[key] = base
        if is_required is None:
            is_required = bool(getattr(cls, "__total__", True))
        if is_required:
            required.add(key)
    return hints, frozenset(required), aliases


def type_errors(value: Any, hint: Any, path: str = "$") -> list[str]:
    """Every place where ``value`` does not match ``hint`` (empty when it matches)."""
    if hint is Any or hint is object:
        return []
    origin: Any = typing_extensions.get_origin(hint)
    args = typing_extensions.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        best: list[str] | None = None
        for option in args:
            errors = type_errors(value, option, path)
            if not errors:
                return []
            if best is None or len(errors) < len(best):
                best = errors
        return best or [f"{path}: no union member matches"]
    if origin is typing.Literal or origin is typing_extensions.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args!r}"]
    if origin is typing_extensions.Annotated or origin is typing.Annotated:
        return type_errors(value, args[0], path)
    if hint is type(None):
        return [] if value is None else [f"{path}: expected null"]
    if hint is str:
        return [] if isinstance(value, str) else [f"{path}: expected a string"]
    if hint is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected a boolean"]
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer"]
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected a number"]
    if origin in (
        collections.abc.Iterable,
        collections.abc.Sequence,
        list,
        typing.Iterable,
        typing.List,  # noqa: UP006
        typing.Sequence,
    ):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        (item,) = args or (Any,)
        return [e for i, v in enumerate(value) for e in type_errors(v, item, f"{path}[{i}]")]
    if origin in (dict, collections.abc.Mapping, typing.Dict):  # noqa: UP006
        if not isinstance(value, dict):
            return [f"{path}: expected an object"]
        value_hint = args[1] if len(args) == 2 else Any
        return [e for k, v in value.items() for e in type_errors(v, value_hint, f"{path}.{k}")]
    if isinstance(hint, type) and typing_extensions.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({hint.__name__})"]
        hints, required, aliases = _hints(hint)
        found: list[str] = []
        for key, sub in value.items():
            name = aliases.get(key, key)
            if name not in hints:
                found.append(f"{path}: {hint.__name__} has no key {key!r}")
                continue
            found.extend(type_errors(sub, hints[name], f"{path}.{key}"))
        for key in required:
            if key not in value and not any(aliases.get(a) == key for a in value):
                found.append(f"{path}: {hint.__name__} requires key {key!r}")
        return found
    if isinstance(hint, type):
        return [] if isinstance(value, hint) else [f"{path}: expected {hint.__name__}"]
    return []
