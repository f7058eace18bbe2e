"""Pickle and copy for frozen dataclasses, in both builds: rebuilt through `__init__`.

Python's own route for a frozen slots dataclass sets each field after `object.__new__`; a class
the compiled build compiled (proxy/compiled.py) refuses both, so pickle, `copy` and `deepcopy`
raise `FrozenInstanceError` there. Such a class says

    def __reduce__(self) -> Reduced:
        return reduce_frozen(self)

and is rebuilt from its fields by name, whatever fields it gains later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["Reduced", "rebuild", "reduce_frozen"]

Reduced = tuple[Callable[..., Any], tuple[type, dict[str, Any]]]


def rebuild(cls: type, fields: dict[str, Any]) -> Any:
    """The instance of `cls` with these fields (pickle calls this by name: keep it here)."""
    return cls(**fields)


def reduce_frozen(obj: Any) -> Reduced:
    """`__reduce__` of a frozen dataclass: its class and its fields by name, for `rebuild`."""
    return rebuild, (type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
