"""Frozen dataclasses as plain tuples, and back: the compact form records cross the channel in.

`Plain(cls)` reads `cls`'s fields once and builds two functions: `encode(obj)` gives a tuple of
the field values in field order, a dataclass field (`D`, `D | None`, `tuple[D, ...]`) as its own
tuple, in a field of a dataclass or another type (`X | D`: exactly two, X never a list, nor
None, nor a type that may hold one) as a list, which tells it from an X; every other value as it is (they are `marshal`'s types: str, int, float, bool,
None, tuples, lists, dicts); `decode(values)` builds the object again, setting its slots
directly without running `__init__` (every class must be a slots dataclass).

Why not pickle: unpickling a frozen slots dataclass runs `dataclasses._dataclass_setstate`, Python
code that looks up the fields and calls `object.__setattr__` once per field, for every object;
here the slot descriptors are set directly and `marshal` reads the tuples in C
(`tests/bench/supervisor_records.py`). Both ends run the same code (the Hello checks), so a
tuple's positions mean the same fields on both.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Plain", "copy_with"]

T = TypeVar("T")
_Convert = Callable[[Any], Any]


def _is_dataclass(hint: object) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _dataclass_of(hint: object) -> tuple[str, type] | None:
    """("one" | "optional" | "either" | "many", D) when `hint` holds dataclass D in a shape we
    encode, else None."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return "one", hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            return "optional", inner
    if (
        origin in (typing.Union, types.UnionType)
        and len(args) == 2
        and _is_dataclass(args[0]) != _is_dataclass(args[1])
    ):
        inner, other = (args[0], args[1]) if _is_dataclass(args[0]) else (args[1], args[0])
        if typing.get_origin(other) is not list and other is not list:
            return "either", inner
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner = args[0]
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            return "many", inner
    return None


def _each(convert: _Convert, values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(map(convert, values))


def _as_list(inner: Plain[Any], value: Any) -> Any:
    return list(inner.encode(value)) if isinstance(value, inner.cls) else value


def _from_list(inner: Plain[Any], value: Any) -> Any:
    return inner.decode(value) if type(value) is list else value


class Plain(Generic[T]):
    """The tuple form of dataclass `cls` (and of the dataclasses its fields hold)."""

    def __init__(self, cls: type[T], localns: dict[str, Any] | None = None) -> None:
        """`localns`: names of classes its annotations use but its module imports only for type checking."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        hints = typing.get_type_hints(cls, localns=localns)
        self.cls = cls
        self._get = operator.attrgetter(*(f.name for f in fields)) if len(fields) > 1 else None
        self._names = tuple(f.name for f in fields)
        if not all(isinstance(getattr(cls, f.name, None), types.MemberDescriptorType) for f in fields):
            raise TypeError(f"{cls.__name__} is not a slots dataclass: its fields cannot be set directly")
        self._setters = tuple(getattr(cls, f.name).__set__ for f in fields)
        self._encoders: list[tuple[int, _Convert]] = []
        self._decoders: list[tuple[int, _Convert]] = []
        for i, f in enumerate(fields):
            found = _dataclass_of(hints[f.name])
            if found is None:
                continue
            shape, inner_cls = found
            inner: Plain[Any] = Plain(inner_cls, localns)
            if shape == "many":
                self._encoders.append((i, functools.partial(_each, inner.encode)))
                self._decoders.append((i, functools.partial(_each, inner.decode)))
            elif shape == "either":
                self._encoders.append((i, functools.partial(_as_list, inner)))
                self._decoders.append((i, functools.partial(_from_list, inner)))
            else:  # "one" or "optional": None stays None
                self._encoders.append((i, inner.encode))
                self._decoders.append((i, inner.decode))

    def encode(self, obj: T) -> tuple[Any, ...]:
        values = self._get(obj) if self._get is not None else tuple(getattr(obj, n) for n in self._names)
        if not self._encoders:
            return values
        out = list(values)
        for i, convert in self._encoders:
            if out[i] is not None:
                out[i] = convert(out[i])
        return tuple(out)

    def decode(self, values: tuple[Any, ...] | list[Any]) -> T:
        """The object `encode` gave `values` for; a `ValueError` when they cannot be one."""
        if len(values) != len(self._names):
            raise ValueError(f"{len(values)} values for the {len(self._names)} fields of {self.cls.__name__}")
        if self._decoders:
            values = list(values)
            for i, convert in self._decoders:
                if values[i] is not None:
                    values[i] = convert(values[i])
        return self._build(values)

    def _build(self, values: tuple[Any, ...] | list[Any]) -> T:
        obj = object.__new__(self.cls)
        for set_field, value in zip(self._setters, values, strict=True):
            set_field(obj, value)
        return obj


def copy_with(plain: Plain[T], obj: T, **changes: Any) -> T:
    """`dataclasses.replace(obj, **changes)` without `__init__` (a third of its cost for a record)."""
    values = list(plain._get(obj) if plain._get is not None else (getattr(obj, n) for n in plain._names))
    for name, value in changes.items():
        values[plain._names.index(name)] = value
    return plain._build(values)
